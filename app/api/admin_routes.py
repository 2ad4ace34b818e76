"""Admin routes for the tray, the dashboard and the CLI: pause/resume, load/unload, pull,
reread the model list. Loopback callers only."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from app.core.service import InferenceService
from app.errors import Conflict, Forbidden, InvalidRequest
from app.pull import EventProgress, PullError, parse_source, pull
from app.settings import MODEL_NAME_PATTERN, ConfigSource


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
    source = _config_source(request)
    try:
        settings = await asyncio.to_thread(source.settings)
    except (ValueError, OSError) as exc:
        raise InvalidRequest(f"the config does not read: {exc}") from exc
    service = _service(request)
    changes = service.lifecycle.apply(settings.models)
    served = [e["name"] for e in service.registry.describe() if not e["retired"]]
    return {**changes, "models": served}


class PullBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(
        min_length=1, max_length=4096, description="as `vramgate pull`'s SOURCE, on this machine"
    )
    name: str | None = Field(None, max_length=64, pattern=MODEL_NAME_PATTERN)
    kind: Literal["embedding", "generation"] | None = None
    force: bool = False


@router.post("/models/pull", response_class=StreamingResponse)
async def pull_model(request: Request, body: PullBody) -> StreamingResponse:
    """Pull a model as `vramgate pull` does (into the server's models folder and config)
    and serve it. The answer streams progress as NDJSON, in the shape of Ollama's pull:
    `{"status": ...}` for steps, with `total` and `completed` bytes while copying, then
    `{"status": "success", "model": NAME}` or `{"error": ...}`. One pull at a time."""
    source = _config_source(request)
    try:
        parse_source(body.source)
    except PullError as exc:
        raise InvalidRequest(str(exc), param="source") from exc
    if request.app.state.pulling is not None:
        raise Conflict("a pull is under way; wait for it to end")
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def emit(event: dict[str, Any]) -> None:  # on the pulling thread
        loop.call_soon_threadsafe(events.put_nowait, event)

    progress = EventProgress(emit)
    service = _service(request)

    async def work() -> None:
        try:
            settings = await asyncio.to_thread(source.settings)
            spec = await asyncio.to_thread(
                pull, body.source, settings, source.file, name=body.name, kind=body.kind,
                force=body.force, progress=progress,
            )  # fmt: skip
            service.lifecycle.apply((await asyncio.to_thread(source.settings)).models)
            events.put_nowait({"status": "success", "model": spec.name, "kind": spec.kind})
        except (PullError, ValueError, OSError) as exc:
            events.put_nowait({"error": str(exc)})
        finally:
            events.put_nowait(None)
            request.app.state.pulling = None

    request.app.state.pulling = asyncio.create_task(
        work(), name="pull"
    )  # runs on if the caller goes

    async def stream() -> AsyncIterator[str]:
        while (event := await events.get()) is not None:
            yield json.dumps(event) + "\n"

    return StreamingResponse(stream(), media_type="application/x-ndjson")


def _config_source(request: Request) -> ConfigSource:
    source: ConfigSource | None = request.app.state.models_source
    if source is None:
        raise Conflict("this server's models were not read from a config file; restart it")
    return source
