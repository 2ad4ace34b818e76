"""The config read again (after a `pull`, an `rm`, or an edit): which models a device
serves from now. New ones are served at once (loaded on demand, or now with `load =
"startup"`); a model taken out of the list serves nothing more and is unloaded once
idle; a changed one is replaced by its new entry once the old one is idle."""

from __future__ import annotations

import logging

from app.config.settings import ModelSpec
from app.core.lifecycle.keep_alive import InFlight
from app.core.lifecycle.loads import ModelLoads

log = logging.getLogger("vramgate.lifecycle")


class Reconcile:
    def __init__(self, loads: ModelLoads, in_flight: InFlight) -> None:
        self._loads = loads
        self.registry = loads.registry
        self._in_flight = in_flight
        self.retiring: dict[str, ModelSpec | None] = {}  # going once idle (None: for good)

    def apply(self, specs: tuple[ModelSpec, ...]) -> dict[str, list[str]]:
        """Serve the models `specs` lists from now; returns the names added, removed and
        changed, and of the changed ones those that take their new entry only once their
        requests (running or queued) have ended (the others: at once, the next request
        is served by the new entry)."""
        wanted = {spec.name: spec for spec in specs}
        added, removed, changed = [], [], []
        for name, spec in wanted.items():
            entry = self.registry.entries.get(name)
            if entry is None:
                self.registry.add(spec)
                added.append(name)
                if spec.load == "startup":
                    self._loads.ensure_loaded(name)
            elif entry.handler.spec != spec:
                self.retiring[name] = spec
                changed.append(name)
            elif entry.retired:  # listed again before it went
                entry.retired = False
                self.retiring.pop(name, None)
                added.append(name)
        for name, entry in self.registry.entries.items():
            if name not in wanted and not entry.retired:
                entry.retired = True
                self.retiring[name] = None
                removed.append(name)
        self.retire()
        busy = [name for name in changed if self._in_flight[name]]
        return {"added": added, "removed": removed, "changed": changed, "changed_when_idle": busy}

    def retire(self) -> None:
        """Models out of the config (or changed in it) go once idle (housekeeping)."""
        loads = self._loads
        for name, spec in list(self.retiring.items()):
            entry = self.registry.entries[name]
            if entry.state in ("unloaded", "failed") and name not in loads.loading:
                del self.retiring[name]
                if spec is None:
                    self.registry.remove(name)
                else:
                    self.registry.add(spec)
                    log.info("model %s: its new config entry serves from now", name)
            elif entry.state == "ready" and not self._in_flight[name] and name not in loads.freeing:
                loads.evict(name, "request")
