"""The model registry: handlers by name, loaded in the background at start."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from app.config.settings import ModelSpec
from app.core.lifecycle.load_watch import LoadWatch, load_view
from app.devices.base import Device
from app.engines.table import make_handler
from app.errors import ModelLoading, ModelNotFound
from app.models.base import LoadOutOfMemory, ModelHandler
from app.models.kinds import required
from app.models.prefix_cache import PrefixStore
from app.sched.budget import LoadLedger

log = logging.getLogger("vramgate.registry")

State = Literal["waiting", "loading", "warming", "ready", "unloading", "unloaded", "failed"]


H = TypeVar("H", bound=ModelHandler)


@dataclass
class ModelEntry:
    handler: ModelHandler
    state: State = "waiting"
    weights_bytes: int = 0  # the handler's exact parameter and buffer bytes
    loaded_bytes: int = 0  # what our memory grew by while loading (weights + one-time costs)
    load_s: float = 0.0
    error: str | None = None
    retired: bool = False  # taken out of the config: serves nothing, goes once unloaded
    load_began: float | None = None  # monotonic, while its load runs
    loads_tried: int = 0  # loads begun in this process (those that failed too)


class ModelRegistry:
    def __init__(
        self,
        specs: tuple[ModelSpec, ...],
        device: Device,
        image_bounds: tuple[int, int] = (4096, 2**24),
        loads: LoadLedger | None = None,
        store: PrefixStore | None = None,
        run_timeout: float = 120.0,
    ) -> None:
        """`loads`: what loads measured, which handlers that size their loads read;
        `store`: the device's prefix cache, which generation models may keep KV in;
        `run_timeout`: how long a handler's engine may stay silent (the server's)."""
        self.device = device
        self._image_bounds = image_bounds
        self._loads = loads
        self._run_timeout = run_timeout
        self.store = store or PrefixStore()
        self.entries = {spec.name: ModelEntry(self._handler(spec)) for spec in specs}

    def _handler(self, spec: ModelSpec) -> ModelHandler:
        handler = make_handler(spec, self._image_bounds)
        handler.loads = self._loads
        handler.run_timeout = self._run_timeout
        handler.prefix_store = self.store if spec.prefix_cache else None
        return handler

    def add(self, spec: ModelSpec) -> None:
        """Serve a model from now (not loaded yet), or replace an unloaded one's entry."""
        current = self.entries.get(spec.name)
        assert current is None or current.state in ("unloaded", "failed"), "replace unloaded"
        self.entries[spec.name] = ModelEntry(self._handler(spec), state="unloaded")

    def remove(self, name: str) -> None:
        """Forget an unloaded model."""
        assert self.entries[name].state in ("unloaded", "failed"), "remove unloaded models"
        del self.entries[name]

    def get(self, name: str) -> ModelHandler:
        """The handler for `name` if it is ready to serve."""
        entry = self.entry(name)
        if entry.state not in ("warming", "ready"):
            if entry.state == "unloaded" and entry.error:  # its last load found no room
                raise ModelLoading(f"model {name!r} is not loaded: {entry.error}", retry_after=10)
            if entry.state in ("unloading", "unloaded"):
                raise ModelLoading(f"model {name!r} is not loaded yet; loading it", retry_after=2)
            if entry.state == "failed":
                raise ModelNotFound(f"model {name!r} failed to load: {entry.error}", param="model")
            raise ModelLoading(f"model {name!r} is still loading", retry_after=2)
        return entry.handler

    def serving(self, name: str, capability: type[H]) -> H:
        """The handler for `name` if it is ready and can do what `capability` is (an
        app.models.kinds contract); a model of another kind is a 400 that says so."""
        return required(self.get(name), capability, name)

    def entry(self, name: str) -> ModelEntry:
        """`name`'s entry, loaded or not; a 404 that lists the served models."""
        entry = self.entries.get(name)
        if entry is None or entry.retired:
            known = ", ".join(sorted(n for n, e in self.entries.items() if not e.retired))
            raise ModelNotFound(f"model {name!r} does not exist (served: {known})", param="model")
        return entry

    def load(self, name: str) -> bool:
        """Load one model (blocking). Its weights are what our allocations grew by."""
        entry = self.entries[name]
        entry.state, entry.error = "loading", None
        before = self.device.allocated()
        started = time.perf_counter()
        expected = entry.load_s or None  # its last load in this process
        last = f" (its last load took {expected:.1f} s)" if expected else ""
        log.info("model %s loading on %s%s", name, self.device.id, last)
        watch = LoadWatch(name, entry.handler.load_progress, expected)
        entry.load_began = watch.began
        try:
            entry.handler.fingerprint = entry.handler.identify()
            with watch:
                entry.handler.load(self.device)
            entry.handler.prime()
            self.device.settle()  # the weights are on the device before any job uses them
        except Exception as exc:  # a broken model must not stop the others
            self._give_back_part(name)
            if self.device.is_oom(exc) or isinstance(exc, LoadOutOfMemory):  # taken meanwhile
                entry.state = "unloaded"
                entry.error = f"its last load ran out of memory: {type(exc).__name__}: {exc}"
                log.warning("model %s: %s; its next request tries again", name, entry.error)
                return False
            entry.state, entry.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("model %s failed to load: %s", name, entry.error)
            return False
        finally:
            entry.load_began = None
        entry.load_s = time.perf_counter() - started
        own = entry.handler.measured_load_bytes()
        entry.loaded_bytes = own if own is not None else max(0, self.device.allocated() - before)
        entry.weights_bytes = entry.handler.weights_bytes()
        entry.state = "warming"
        log.info(
            "model %s loaded in %.1fs (%s, %.1f MiB)",
            name,
            entry.load_s,
            entry.handler.dtype,
            entry.weights_bytes / 2**20,
        )
        return True

    def _give_back_part(self, name: str) -> None:
        """What a load that failed midway had moved to the device, given back (it would
        stay held, out of every pool, until the model's next unload)."""
        try:
            self.entries[name].handler.unload()
            self.device.empty_cache()
        except Exception as exc:  # it failed already: say so and go on
            log.warning("model %s: what its failed load held was not given back: %r", name, exc)

    def unload(self, name: str) -> int:
        """Drop one model's weights (blocking; no job of it may be running). Returns the
        bytes our allocations shrank by."""
        entry = self.entries[name]
        self.store.drop_model(name)  # not weights: out of what this unload measures
        before = self.device.allocated()
        own = entry.handler.measured_load_bytes()  # a runner's: ended with its process
        entry.handler.unload()
        self.device.empty_cache()
        entry.state, entry.weights_bytes, entry.loaded_bytes = "unloaded", 0, 0
        freed = own if own is not None else max(0, before - self.device.allocated())
        log.info("model %s unloaded (%.1f MiB freed)", name, freed / 2**20)
        return freed

    @property
    def all_ready(self) -> bool:
        """Every model serves, or is unloaded by choice (it loads on demand)."""
        return all(e.state in ("ready", "unloaded") or e.retired for e in self.entries.values())

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "state": e.state,
                "loaded": e.state in ("warming", "ready"),
                "weights_bytes": e.weights_bytes,
                "load_s": round(e.load_s, 3),
                "error": e.error,
                "retired": e.retired,
                **e.handler.describe(),
                **({"load": self._load_view(e)} if e.state == "loading" else {}),
            }
            for name, e in self.entries.items()
        ]

    def loading(self, name: str) -> dict[str, Any] | None:
        """`name`'s load as its /status row says it while it loads; None otherwise."""
        entry = self.entries.get(name)
        if entry is None or entry.state != "loading":
            return None
        return self._load_view(entry)

    @staticmethod
    def _load_view(entry: ModelEntry) -> dict[str, Any]:
        """How far a loading model has come (app.core.lifecycle.load_watch)."""
        began = entry.load_began
        if began is None:  # admitted by the gate, not begun: waiting for memory
            return load_view(None, None, None)
        progress = entry.handler.load_progress()
        return load_view(progress, time.monotonic() - began, entry.load_s or None)
