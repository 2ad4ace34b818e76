"""Admin routes for the tray, the dashboard and the CLI: pause/resume, load/unload, reread
the model list. Loopback callers only."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request

from app.core.service import InferenceService
from app.errors import Conflict, Forbidden, InvalidRequest
from app.settings import MODEL_NAME_PATTERN


def loopback_only(request: Request) -> None:
    host = request.client.host if request.client else ""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local:
        raise Forbidden("admin routes answer loopback callers only")


router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(loopback_only)])
ModelName = Path(max_length=64, pattern=MODEL_NAME_PATTERN)


def _service(request: Request) -> InferenceService:
    return request.app.state.service


@router.post("/pause")
async def pause(request: Request) -> dict[str, Any]:
    """New inference requests get 503 `paused` until resumed; running ones finish."""
    _service(request).state.paused = True
    return {"paused": True}


@router.post("/resume")
async def resume(request: Request) -> dict[str, Any]:
    _service(request).state.paused = False
    return {"paused": False}


@router.post("/shutdown")
async def shutdown(request: Request) -> dict[str, Any]:
    """Stop the server as Ctrl+C does: stop accepting, drain, exit 0. The tray's Quit
    uses this, since a windowed Windows process receives no console signals."""
    request.app.state.request_shutdown()
    return {"stopping": True}


@router.post("/models/{name}/unload")
async def unload(
    request: Request,
    name: str = ModelName,
    wait_s: float = Query(30.0, ge=0, le=3600, description="time running jobs get to finish"),
) -> dict[str, Any]:
    """Let the model's running jobs finish for `wait_s`, end the rest (streams get an
    error event, waiting requests 503), then free its weights."""
    freed = await _service(request).lifecycle.unload(name, wait_s)
    return {
        "model": name,
        "state": _service(request).registry.entry(name).state,
        "freed_bytes": freed,
    }


@router.post("/models/{name}/load")
async def load(request: Request, name: str = ModelName) -> dict[str, Any]:
    service = _service(request)
    await service.lifecycle.load(name)
    entry = service.registry.entry(name)
    return {
        "model": name,
        "state": entry.state,
        "weights_bytes": entry.weights_bytes,
        "error": entry.error,
    }


@router.post("/models/reread")
async def reread(request: Request) -> dict[str, Any]:
    """Read the model list again from the config the server started with (`vramgate
    pull` and `rm` ask for this): new models are served at once (loaded on their first
    request), removed ones go once idle, changed ones are replaced once idle."""
    source = request.app.state.models_source
    if source is None:
        raise Conflict("this server's models were not read from a config file; restart it")
    service = _service(request)
    try:
        specs = await asyncio.to_thread(source)
    except (ValueError, OSError) as exc:
        raise InvalidRequest(f"the config does not read: {exc}") from exc
    changes = service.lifecycle.apply(specs)
    served = [e["name"] for e in service.registry.describe() if not e["retired"]]
    return {**changes, "models": served}
