"""The server's devices: one InferenceService per device, and where each request goes.

Each device is a lane of its own: its pool, gate, queue, executor, learned-price key and
the models placed on it (app.core.fleet.placement), so one GPU's queue never waits for
another's memory. A model placed on several devices (`replicas`) is a copy on each; a
request goes to the copy whose device admits it soonest. The routes talk to the fleet
only; /status and /metrics show every device, and their sums.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from app.config.settings import DEFAULT_MAX_STREAMS, ModelSpec, Settings
from app.core import priority
from app.core.fleet.names import (
    aliased,
    hub_target,
    ollama_spelling,
    standard_names_of,
    standard_target,
)
from app.core.fleet.placement import Load, Placement, Room, Wanted, place, soonest
from app.core.fleet.status import ModelStatus
from app.core.lifecycle.registry import ModelRegistry
from app.core.requests import OneShotRequest, ValidGenerationRequest
from app.core.service import DRAIN_S, InferenceService
from app.core.snapshot import (
    CoreSnapshot,
    combined_cache_view,
    least_advanced,
    set_cache_gauges,
    set_price_gauges,
    status_document,
)
from app.core.watch import ClientWatch
from app.core.work import AdmittedGeneration, InferenceResult
from app.devices.base import Device
from app.devices.executor import Executor
from app.engines.table import make_handler
from app.errors import ModelNotFound
from app.models.base import ModelHandler
from app.models.card import ModelCard
from app.models.decoding import SamplingParams
from app.models.kinds import Generator, ImageGenerator
from app.observe.history import History
from app.observe.metrics import Metrics
from app.sched.budget import BudgetBook, LoadLedger
from app.sched.host_bytes import HostBytes

log = logging.getLogger("vramgate.fleet")

PRICES_FILE = "prices.json"
H = TypeVar("H", bound=ModelHandler)
T = TypeVar("T")
# a model's state across its copies: the first of these that one of them is in
_STATE_ORDER = ["ready", "warming", "loading", "unloading", "unloaded", "waiting", "failed"]


class Fleet:
    def __init__(
        self,
        settings: Settings,
        lanes: list[InferenceService],
        placement: Placement,
    ) -> None:
        """`lanes`: one service per device, sharing `settings`, the price book, the
        metrics and the history; `placement`: the devices each model was put on."""
        self.settings = settings
        self.lanes = lanes
        self.placement = placement
        self.metrics = lanes[0].metrics
        self.book = lanes[0].book
        self.history = lanes[0].history
        # uploads and decoded audio of transcriptions waiting or running (max_audio_bytes)
        self.audio_bytes = HostBytes(settings.max_audio_bytes)
        self._by_id = {lane.device.id: lane for lane in lanes}
        self._tasks: list[asyncio.Task[None]] = []

    # -- where a request goes -----------------------------------------------------------
    def lane_for(self, model: str) -> InferenceService:
        """The device that admits a request for `model` soonest, of those serving it (an
        unknown model: the first device, whose registry answers 404)."""
        lanes = [lane for lane in self.lanes if _serves(lane, model)]
        if len(lanes) <= 1:
            return lanes[0] if lanes else self.lanes[0]
        loads = [_load_of(lane, model) for lane in lanes]
        return self._by_id[soonest(loads)]

    def resolve(self, model: str) -> str:
        """The served model a request's name means: itself (or with Ollama's `:latest`),
        or the model of the first `model_aliases` pattern it matches (Claude Code asks
        for claude-..., Codex for gpt-...), or of a standard name (app.core.fleet.names:
        `dall-e-2`, an empty name for speech to text), or the model pulled from the Hub
        source it spells (`hf.co/ORG/NAME:QUANT`); a name none of these serve stays as is
        (its lane answers 404). The name's class in `priorities`, if any, is the
        request's (app.core.priority)."""
        priority.name(model, self.settings.priorities)
        if any(_serves(lane, model) for lane in self.lanes):
            return model
        base = model.removesuffix(":latest")  # Ollama's tag for a name without one
        if base != model and any(_serves(lane, base) for lane in self.lanes):
            return base
        served = aliased(model, self.settings.model_aliases)
        if served is None:
            served = standard_target(model, self._capabilities())
        if served is None:
            served = hub_target(model, [(s.name, s.pulled_from) for s in self._specs()])
        return model if served is None else served

    def _served(self) -> list[ModelHandler]:
        """Each served model's handler (of its first copy), in config order."""
        found = []
        for name in self.placement:
            lane = next((lane for lane in self.lanes if _serves(lane, name)), None)
            if lane is not None:
                found.append(lane.registry.entries[name].handler)
        return found

    def _specs(self) -> list[ModelSpec]:
        """Each served model's config entry, in config order."""
        return [handler.spec for handler in self._served()]

    def _capabilities(self) -> list[tuple[str, tuple[str, ...]]]:
        """Each served model's capabilities, in config order."""
        return [(handler.spec.name, handler.capabilities()) for handler in self._served()]

    async def run_cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """CPU work a route must not do on the event loop (encoding audio), on the first
        device's CPU pool."""
        return await self.lanes[0].executor.run_cpu(fn, *args)

    async def run(self, request: OneShotRequest, watch: ClientWatch) -> InferenceResult:
        """Any one-shot request, on the device that admits it soonest."""
        served = self.resolve(request.model)
        if served != request.model:
            request = replace(request, model=served)  # type: ignore[type-var]  # dataclasses
        return await self.lane_for(served).run(request, watch)

    async def generate(
        self, request: ValidGenerationRequest, watch: ClientWatch | None
    ) -> AdmittedGeneration:
        served = self.resolve(request.model)
        if served != request.model:
            request = replace(request, model=served)
        return await self.lane_for(served).generate(request, watch)

    async def count_tokens(self, request: ValidGenerationRequest) -> int:
        """The prompt's tokens as its model's chat template and tokenizer make them (on
        the CPU pool, or the runner's tokenizer): nothing is admitted to the gate, no
        model runs. A model that is away loads first, as for any request."""
        served = self.resolve(request.model)
        lane = self.lane_for(served)
        handler = await lane.serving(served, Generator, probe=False, keep_alive=request.keep_alive)
        params = SamplingParams(max_tokens=1)  # the prompt only; no grammar compiled
        lane.in_flight[served] += 1  # from here (no await between): no unload takes it away
        try:
            prepared = await handler.prepare_prompt(request.prompt, params, 1, lane.executor)
        finally:
            lane.in_flight[served] -= 1
        return prepared.tokens

    def loading(self, model: str) -> dict[str, Any] | None:
        """How far the load of the model a request's name means has come (its /status
        row's `load`) while it loads; None when it is not loading."""
        served = self.resolve(model)
        return self.lane_for(served).registry.loading(served)

    def card(self, model: str) -> ModelCard:
        """What `model` is (app.models.card), loaded or not; 404 for one not served."""
        model = self.resolve(model)
        return self.lane_for(model).registry.entry(model).handler.card()

    def preview(self, model: str) -> np.ndarray | None:
        """The latest preview of an image model's running batch (RGB), or None."""
        model = self.resolve(model)
        return self.lane_for(model).registry.serving(model, ImageGenerator).preview()

    # -- start and stop -----------------------------------------------------------------
    async def start(self) -> None:
        for lane in self.lanes:
            await lane.start()
        self._tasks.append(asyncio.create_task(self._sample(), name="history"))

    def begin_stop(self, drain_s: float = DRAIN_S) -> None:
        for lane in self.lanes:
            lane.begin_stop(drain_s)

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*(lane.stop(drain_s) for lane in self.lanes))

    async def _sample(self) -> None:
        """The dashboard history's once-a-second samples, of every device together."""
        while True:
            await asyncio.sleep(1.0)
            self.history.add_sample(self.view().sample())

    # -- what it looks like -------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return all(lane.ready for lane in self.lanes)

    @property
    def phase(self) -> str:
        return least_advanced([lane.state.phase for lane in self.lanes])

    @property
    def exit_code(self) -> int:
        return max(lane.state.exit_code for lane in self.lanes)

    @property
    def paused(self) -> bool:
        return any(lane.state.paused for lane in self.lanes)

    def set_paused(self, paused: bool) -> None:
        for lane in self.lanes:
            lane.state.paused = paused

    def view(self) -> CoreSnapshot:
        """Every device's picture added up (one device: its own)."""
        return CoreSnapshot.combined([lane.view() for lane in self.lanes])

    def memory_line(self) -> str:
        """A compact snapshot of every device for log lines."""
        if len(self.lanes) == 1:
            return self.lanes[0].memory_line()
        return " | ".join(f"{lane.device.id} {lane.memory_line()}" for lane in self.lanes)

    def aliases_of(self, model: str) -> list[str]:
        """The `model_aliases` patterns that name `model`, the standard names that reach
        it, and the Hub source it was pulled from in Ollama's spelling."""
        aliases = self.settings.model_aliases
        own = [p for p, served in aliases.items() if served == model]
        own += standard_names_of(model, self._capabilities(), aliases)
        pulled_from = next((s.pulled_from for s in self._specs() if s.name == model), None)
        hub = ollama_spelling(pulled_from) if pulled_from else None
        return own + ([hub] if hub else [])

    def status(self) -> dict[str, Any]:
        """The /status document: the sums on top, each device under `devices`."""
        views = [lane.view() for lane in self.lanes]
        document = status_document(
            CoreSnapshot.combined(views),
            self._describe_devices(),
            [status.row for status in self.models()],
            self.book.snapshot(),
            self.metrics,
            self.gave_back_view(),
            [self._device_row(lane, view) for lane, view in zip(self.lanes, views, strict=True)],
        )
        document["model_aliases"] = dict(self.settings.model_aliases)
        document["prefix_cache"] = combined_cache_view([lane.store_view() for lane in self.lanes])
        return document

    def set_gauges(self) -> None:
        """/metrics' gauges: each device's, with a `device` label."""
        for lane in self.lanes:
            lane.view().set_gauges(self.metrics, lane.device.id)
            set_cache_gauges(self.metrics, lane.device.id, lane.store_view())
        self.metrics.ready.set(1 if self.ready else 0)
        set_price_gauges(self.metrics, self.book.snapshot())
        self.metrics.set_speculation([status.row for status in self.models()])

    def _describe_devices(self) -> dict[str, Any]:
        if len(self.lanes) == 1:
            return self.lanes[0].device.describe()
        first = self.lanes[0].device
        return {
            "id": ",".join(lane.device.id for lane in self.lanes),
            "kind": first.kind,
            "name": f"{len(self.lanes)} devices: " + ", ".join(d.name for d in self._devices()),
            "torch_device": first.describe()["torch_device"],
            "warnings": [w for d in self._devices() for w in d.warnings],
        }

    def _device_row(self, lane: InferenceService, view: CoreSnapshot) -> dict[str, Any]:
        served = self.metrics.served_by_device.get(lane.device.id, 0)
        models = [name for name, devices in self.placement.items() if lane.device.id in devices]
        return {
            **lane.device.describe(),
            **view.device_view(),
            "models": models,
            "served": served,
            "prefix_cache": lane.store_view(),
        }

    def _devices(self) -> list[Device]:
        return [lane.device for lane in self.lanes]

    def models(self) -> list[ModelStatus]:
        """Each model once, in config order: its best state over its copies, the bytes
        they hold together, and (in its /status row) each copy's own figures under
        `replicas`."""
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in self.placement}
        for lane in self.lanes:
            for row in lane.lifecycle.describe():
                rows.setdefault(row["name"], []).append({**row, "device": lane.device.id})
        return [ModelStatus.of(_merged(copies)) for copies in rows.values() if copies]

    def listed(self) -> list[ModelStatus]:
        """The models a list shows (not retired): those that chat first, then the rest,
        each group in config order. A chat app picks the first one it is given (Open
        WebUI's new chat), and an embedding model there answers no chat."""
        shown = [status for status in self.models() if not status.retired]
        return sorted(shown, key=lambda s: "completion" not in self.card(s.name).capabilities)

    def model(self, name: str) -> ModelStatus:
        """One served model, by its name or an alias (404 for a model not served)."""
        name = self.resolve(name)
        self.lane_for(name).registry.entry(name)  # raises ModelNotFound
        return next(status for status in self.models() if status.name == name)

    def spec(self, name: str) -> ModelSpec:
        name = self.resolve(name)
        return self.lane_for(name).registry.entry(name).handler.spec

    def gave_back_view(self) -> dict[str, Any] | None:
        given = [view for lane in self.lanes if (view := lane.lifecycle.gave_back_view())]
        return max(given, key=lambda view: view["at"]) if given else None

    # -- managing models ----------------------------------------------------------------
    def _copies(self, name: str) -> list[InferenceService]:
        lanes = [lane for lane in self.lanes if _serves(lane, name)]
        if not lanes:
            raise ModelNotFound(f"model {name!r} does not exist", param="model")
        return lanes

    async def load(self, name: str) -> None:
        await asyncio.gather(*(lane.lifecycle.load(name) for lane in self._copies(name)))

    async def ready_for(self, model: str, keep_alive: float | None) -> str:
        """Ollama's load idiom (a generation with nothing to answer): the model that
        `model` names loaded (or waited for, as any request waits) and its keep-alive set
        as a request's, answered once its warm-up is done; nothing is queued. Returns the
        served name."""
        served = self.resolve(model)
        lane = self.lane_for(served)
        await lane.serving(served, Generator, probe=False, keep_alive=keep_alive)
        await lane.lifecycle.wait_warmed(served, lane.clock() + self.settings.queue_timeout)
        return served

    async def expire(self, model: str) -> None:
        """Ollama's unload idiom (`keep_alive: 0`, nothing to answer): each copy goes once
        its running requests end, at once where it is idle."""
        served = self.resolve(model)
        await asyncio.gather(*(lane.lifecycle.expire(served) for lane in self._copies(served)))

    async def unload(self, name: str, wait_s: float) -> int:
        copies = self._copies(name)
        freed = await asyncio.gather(*(lane.lifecycle.unload(name, wait_s) for lane in copies))
        return sum(freed)

    def apply(self, specs: tuple[ModelSpec, ...]) -> dict[str, list[str]]:
        """Serve the models `specs` lists from now (a reread config): models already
        placed stay on their devices, new ones go where they fit (see `place`)."""
        self.placement = place_models(self.settings, specs, self._devices(), self.placement)
        keys = ("added", "removed", "changed", "changed_when_idle")
        changes: dict[str, list[str]] = {key: [] for key in keys}
        for lane in self.lanes:
            mine = lane_specs(specs, self.placement, lane.device.id)
            for key, names in lane.lifecycle.apply(mine).items():
                changes[key] += [name for name in names if name not in changes[key]]
        moved = set(changes["added"]) & set(changes["removed"])  # to another device
        changes["removed"] = [name for name in changes["removed"] if name not in moved]
        order = [spec.name for spec in specs]  # the config's order, as on one device
        for key in ("added", "changed", "changed_when_idle"):
            changes[key].sort(key=order.index)
        # busy on any device: the change waits for its requests there
        busy = changes["changed_when_idle"]
        changes["changed_now"] = [name for name in changes["changed"] if name not in busy]
        return changes


def _serves(lane: InferenceService, model: str) -> bool:
    entry = lane.registry.entries.get(model)
    return entry is not None and not entry.retired


def _load_of(lane: InferenceService, model: str) -> Load:
    gate = lane.scheduler.gate
    return Load(
        device=lane.device.id,
        serving=not lane.lifecycle.away(model),
        wait_s=lane.scheduler.estimated_wait_s(),
        queued=gate.depth + gate.running + gate.running_streams,
        pool=gate.free_bytes(),
    )


def _merged(copies: list[dict[str, Any]]) -> dict[str, Any]:
    best = min(copies, key=lambda row: _STATE_ORDER.index(row["state"]))
    replicas = [
        {key: row[key] for key in ("device", "state", "weights_bytes", "unloads_in_s")}
        for row in copies
    ]
    merged = {**best, "replicas": replicas, "devices": [row["device"] for row in copies]}
    merged["weights_bytes"] = sum(row["weights_bytes"] for row in copies)
    merged["loaded"] = any(row["loaded"] for row in copies)
    del merged["device"]
    return merged


# -- building it ---------------------------------------------------------------------
def place_models(
    settings: Settings,
    specs: tuple[ModelSpec, ...],
    devices: list[Device],
    kept: Placement | None = None,
) -> Placement:
    """Where each model runs: its own `device`, or where its expected weights fit with
    the most room (app.core.fleet.placement): room free now, not the card's total (a display
    card half used by the desktop has half the room); what we hold ourselves counts as
    room, as the placement counts our models where they are."""
    rooms = [Room(device.id, _room(settings, device)) for device in devices]
    wanted = [
        Wanted(s.name, _expected_bytes(settings, s, devices[0]), s.device, s.replicas)
        for s in specs
    ]
    placement = place(wanted, rooms, kept)
    if len(devices) > 1:
        log.info("models placed: %s", {name: list(ids) for name, ids in placement.items()})
    return placement


def _room(settings: Settings, device: Device) -> int:
    snap = device.snapshot()
    return max(0, snap.free_for_us + snap.ours_allocated - _reserve(settings, device))


def _reserve(settings: Settings, device: Device) -> int:
    return int(settings.reserve if settings.reserve is not None else device.default_reserve)


def _expected_bytes(settings: Settings, spec: ModelSpec, device: Device) -> int:
    bounds = (settings.max_image_side, settings.max_image_pixels)
    try:
        return make_handler(spec, bounds).expected_weights_bytes(device)
    except Exception:  # a missing file: its load says what is wrong, on any device
        return 0


def lane_specs(
    specs: tuple[ModelSpec, ...], placement: Placement, device: str
) -> tuple[ModelSpec, ...]:
    """The models one device serves, in config order. Only the config's first model
    preloads unless a model says otherwise; a device's lifecycle preloads its own first,
    so a device whose first is another model is told it loads on demand (on one device
    the specs are the config's own, so a reread compares them as they are)."""
    first = specs[0].name if specs else None
    chosen = [spec for spec in specs if device in placement.get(spec.name, ())]
    if chosen and chosen[0].name != first and chosen[0].load is None:
        chosen[0] = chosen[0].model_copy(update={"load": "demand"})
    return tuple(chosen)


def build_fleet(
    settings: Settings,
    devices: list[Device],
    on_fatal: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
) -> Fleet:
    """One service per device over shared settings, prices, metrics and history."""
    book = BudgetBook(settings.resolved_data_dir / PRICES_FILE)
    metrics = Metrics()
    history = History()
    placement = place_models(settings, settings.models, devices)
    lanes = []
    for device in devices:
        slots = settings.max_concurrent or device.default_slots
        streams = settings.max_streams or DEFAULT_MAX_STREAMS
        executor = Executor(
            device, slots=slots, stream_slots=streams, cpu_threads=settings.cpu_threads
        )
        specs = lane_specs(settings.models, placement, device.id)
        bounds = (settings.max_image_side, settings.max_image_pixels)
        ledger = LoadLedger(book, device.key)
        registry = ModelRegistry(specs, device, bounds, ledger, run_timeout=settings.run_timeout)
        lanes.append(
            InferenceService(
                settings,
                device,
                registry,
                book,
                executor,
                metrics,
                on_fatal=on_fatal,
                clock=clock,
                history=history,
            )
        )
    return Fleet(settings, lanes, placement)
