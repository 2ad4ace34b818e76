"""Admin routes for the tray, the dashboard and the CLI: pause/resume, load/unload, pull,
which model fits, reread the model list. Loopback callers only."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from app.api.intake import (
    fleet_of,
)
from app.config.settings import MODEL_NAME_PATTERN, ConfigSource
from app.errors import (
    Conflict,
    ExceedsDevice,
    Forbidden,
    InvalidRequest,
    ModelNotFound,
    UnsafeSource,
)
from app.store.fits import fits, pull_refusal, said
from app.store.folders import remove_model
from app.store.machine import Machine, machine_from_status
from app.store.manage import model_folder
from app.store.progress import EventProgress
from app.store.pull import pull
from app.store.search import MOST_REPOS, SEARCH_LIMIT, search
from app.store.sources import PullError, Source, SourceRefused, UnknownName, parse_source

log = logging.getLogger("vramgate.admin")


def loopback_only(request: Request) -> None:
    """The rule of every route that changes what the server has on disk (the admin
    routes, Ollama's pull and delete): a caller on this machine only."""
    host = request.client.host if request.client else ""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local:
        raise Forbidden("admin routes, pull and delete answer loopback callers only")


router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(loopback_only)])
ModelName = Path(max_length=64, pattern=MODEL_NAME_PATTERN)


@router.post("/pause")
async def pause(request: Request) -> dict[str, Any]:
    """New inference requests get 503 `paused` until resumed; running ones finish."""
    fleet_of(request).set_paused(True)
    return {"paused": True}


@router.post("/resume")
async def resume(request: Request) -> dict[str, Any]:
    fleet_of(request).set_paused(False)
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
    fleet = fleet_of(request)
    freed = await fleet.unload(name, wait_s)
    return {"model": name, "state": fleet.model(name).state, "freed_bytes": freed}


@router.post("/models/{name}/load")
async def load(request: Request, name: str = ModelName) -> dict[str, Any]:
    fleet = fleet_of(request)
    await fleet.load(name)
    status = fleet.model(name)
    return {
        "model": name,
        "state": status.state,
        "weights_bytes": status.weights_bytes,
        "error": status.error,
    }


@router.post("/models/reread")
async def reread(request: Request) -> dict[str, Any]:
    """Read the model list again from the config the server started with (`vramgate
    pull` and `rm` ask for this): new models are served at once (loaded on their first
    request), removed ones go once idle, changed ones are replaced once idle: the answer
    lists which changed ones take their new entry now (`changed_now`: nothing of theirs
    runs or waits) and which once their running and queued requests have ended
    (`changed_when_idle`: those are answered with the old settings)."""
    source = _config_source(request)
    try:
        settings = await asyncio.to_thread(source.settings)
    except (ValueError, OSError) as exc:
        raise InvalidRequest(f"the config does not read: {exc}") from exc
    fleet = fleet_of(request)
    changes = fleet.apply(settings.models)
    served = [status.name for status in fleet.models() if not status.retired]
    return {**changes, "models": served}


class PullBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(
        min_length=1, max_length=4096, description="as `vramgate pull`'s SOURCE, on this machine"
    )
    name: str | None = Field(None, max_length=64, pattern=MODEL_NAME_PATTERN)
    kind: (
        Literal["embedding", "generation", "rerank", "diffusion", "speech", "speech_synthesis"]
        | None
    ) = None
    force: bool = False  # replace a model of that name; pull one that cannot fit here too


@router.post("/models/pull", response_class=StreamingResponse)
async def pull_model(request: Request, body: PullBody) -> StreamingResponse:
    """Pull a model as `vramgate pull` does (into the server's models folder and config)
    and serve it. The answer streams progress as NDJSON, in the shape of Ollama's pull:
    `{"status": ...}` for steps, with `total` and `completed` bytes while copying, then
    `{"status": "success", "model": NAME}` or `{"error": ...}`. One pull at a time."""
    events = await start_pull(request, body)
    return StreamingResponse(ndjson(events), media_type="application/x-ndjson")


@router.post("/models/pull/cancel")
async def cancel_pull(request: Request) -> dict[str, Any]:
    """Cancel the pull under way: it stops at its next step or chunk, its stream ends
    with an error that says so; what came is kept, and pulling it again resumes it. 409
    where no pull is under way."""
    if request.app.state.pulling is None:
        raise Conflict("no pull is under way")
    request.app.state.pull_cancel.set()
    return {"cancelled": True}


@router.get("/models/fits")
async def model_fits(
    request: Request,
    source: str = Query(min_length=1, max_length=4096, description="as `vramgate pull` takes it"),
    context: int | None = Query(None, ge=16, le=2**20, description="a request's tokens"),
) -> dict[str, Any]:
    """Which quantisation of a GGUF model fits here, before its download (app.store.fits):
    each one's bytes, planned as its load plans them, against this device's measured free
    memory now and the most it has; `chosen` is what a pull fetches, `refusal` why a pull
    of it would be refused."""
    _parsed(source)
    machine = _machine_now(request)
    try:
        found = await asyncio.to_thread(fits, source, machine, context)
    except PullError as exc:
        raise InvalidRequest(str(exc), param="source") from exc
    said_of = {q.label: {"now": said(q.now), "most": said(q.most)} for q in found.quants}
    return {**found.as_dict(), "said": said_of, "refusal": found.refusal()}


@router.get("/models/search")
async def model_search(
    request: Request,
    q: str = Query(min_length=1, max_length=200, description="words of a model's name"),
    context: int | None = Query(None, ge=16, le=2**20, description="a request's tokens"),
    limit: int = Query(SEARCH_LIMIT, ge=1, le=MOST_REPOS, description="repos to plan"),
) -> dict[str, Any]:
    """The Hub's GGUF repos for `q`, each answered as `/admin/models/fits` answers one
    (app.store.search): its quantisations, their bytes and verdicts here; only headers
    are fetched."""
    machine = _machine_now(request)
    try:
        found = await asyncio.to_thread(search, q, machine, context, limit)
    except PullError as exc:
        raise InvalidRequest(str(exc), param="q") from exc
    return {"query": q, "machine": asdict(machine), "results": [f.as_dict() for f in found]}


def _machine_now(request: Request) -> Machine:
    """This machine's rooms for a model as the gate sees them now: each device read
    afresh (a reading kept for the admissions may be a moment old, from before another
    program took its memory)."""
    fleet = fleet_of(request)
    for lane in fleet.lanes:
        lane.memory.snapshot(fresh=True)
    return machine_from_status(fleet.status())


def _parsed(text: str) -> Source:
    """A pull's source as `vramgate pull` reads it; bad input is a 4xx that says why."""
    try:
        return parse_source(text)
    except SourceRefused as exc:
        raise UnsafeSource(str(exc), param="source") from exc
    except UnknownName as exc:  # as Ollama answers a name its library lacks
        raise ModelNotFound(
            str(exc), param="source", details={"suggestions": exc.suggestions}
        ) from exc
    except PullError as exc:
        raise InvalidRequest(str(exc), param="source") from exc


async def start_pull(request: Request, body: PullBody) -> asyncio.Queue[dict[str, Any] | None]:
    """Start a pull in the background (it goes on if the caller leaves); its events come
    through the queue, None last. Bad input is refused here, before anything starts, and
    a Hub GGUF that cannot fit on this machine at all (app.store.fits.pull_refusal: 413,
    with the bytes it needs and the most there is) unless `force`."""
    source = _config_source(request)
    machine = _machine_now(request)
    if _parsed(body.source).kind == "hub" and not body.force:
        refused = await asyncio.to_thread(pull_refusal, body.source, machine)
        if refused is not None:
            raise ExceedsDevice(refused, param="source")
    if request.app.state.pulling is not None:
        raise Conflict("a pull is under way; wait for it to end")
    cancel = request.app.state.pull_cancel = threading.Event()
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def emit(event: dict[str, Any]) -> None:  # on the pulling thread
        loop.call_soon_threadsafe(events.put_nowait, event)

    fleet = fleet_of(request)

    async def work() -> None:
        try:
            settings = await asyncio.to_thread(source.settings)
            spec = await asyncio.to_thread(
                pull, body.source, settings, source.file, name=body.name, kind=body.kind,
                force=body.force, progress=EventProgress(emit, cancel=cancel),
                machine=machine,
            )  # fmt: skip
            fleet.apply((await asyncio.to_thread(source.settings)).models)
            events.put_nowait({"status": "success", "model": spec.name, "kind": spec.kind})
        except (PullError, ValueError, OSError) as exc:
            events.put_nowait({"error": str(exc)})
        finally:
            events.put_nowait(None)
            request.app.state.pulling = None

    request.app.state.pulling = asyncio.create_task(work(), name="pull")
    return events


async def ndjson(events: asyncio.Queue[dict[str, Any] | None]) -> AsyncIterator[str]:
    while (event := await events.get()) is not None:
        yield json.dumps(event) + "\n"


def _config_source(request: Request) -> ConfigSource:
    source: ConfigSource | None = request.app.state.models_source
    if source is None:
        raise Conflict("this server's models were not read from a config file; restart it")
    return source


async def delete_model(request: Request, name: str) -> None:
    """Take a model out of the server's config and delete its folder if it is in the
    models folder (as `vramgate rm --force`); it serves nothing from now and is unloaded
    once idle. 404 when the config has no such model."""
    source = _config_source(request)
    settings = await asyncio.to_thread(source.settings)
    spec = next((m for m in settings.models if m.name == name), None)
    if spec is None:
        raise ModelNotFound(f"model {name!r} is not in {source.file}", param="model")
    models_dir = settings.resolved_models_dir
    folder = model_folder(spec) if spec.path is not None else None
    inside = folder is not None and folder.resolve().is_relative_to(models_dir.resolve())
    try:  # the folder set aside, the entry out, then the folder deleted (or said kept)
        left = await asyncio.to_thread(
            remove_model, source.file, name, models_dir, settings.models, folder if inside else None
        )
    except PullError as exc:
        raise Conflict(str(exc)) from exc
    if left:
        log.warning("delete %s: %s", name, left)
    fleet_of(request).apply((await asyncio.to_thread(source.settings)).models)
