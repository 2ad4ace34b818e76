"""One picture of the core at one moment: /status, /metrics and the dashboard's history
all read it, so they never disagree about what they show."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from app import __version__
from app.core.memory import MemoryView
from app.core.state import ServerState
from app.devices.base import MemorySnapshot
from app.observe.history import Sample
from app.observe.metrics import Metrics
from app.sched.gate import MemoryGate


@dataclass(frozen=True)
class CoreSnapshot:
    phase: str
    paused: bool
    ready: bool
    memory: MemorySnapshot
    reserve: int
    weights: int  # the baseline: our memory after the weights loaded
    pool: int
    capacity: int
    admitted: int
    slots: int
    stream_slots: int
    depth: int
    max_queue: int
    oldest_wait_s: float
    running: int
    running_streams: int
    estimated_wait_s: float
    # by class (app.sched.priority): (waiting, longest wait)
    classes: dict[str, tuple[int, float]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        state: ServerState,
        ready: bool,
        memory: MemoryView,
        gate: MemoryGate,
        wait_s: float,
    ) -> CoreSnapshot:
        """The picture now, from the parts that hold it (`wait_s`: the scheduler's
        estimated wait, the gate's with the running prefills)."""
        return cls(
            phase=state.phase,
            paused=state.paused,
            ready=ready,
            memory=memory.snapshot(),
            reserve=memory.reserve,
            weights=memory.baseline,
            pool=memory.pool_bytes(),
            capacity=memory.capacity_bytes(),
            admitted=gate.held_bytes,
            slots=gate.slots,
            stream_slots=gate.stream_slots,
            depth=gate.depth,
            max_queue=gate.max_queue,
            oldest_wait_s=gate.oldest_wait_s(),
            running=gate.running,
            running_streams=gate.running_streams,
            estimated_wait_s=wait_s,
            classes={
                label: (depth, gate.oldest_wait_by_class()[label])
                for label, depth in gate.depth_by_class().items()
            },
        )

    @classmethod
    def combined(cls, parts: list[CoreSnapshot]) -> CoreSnapshot:
        """Several devices' pictures as one: their bytes, slots and queues added up; the
        least advanced phase, ready when all are (`parts` is not empty)."""
        if len(parts) == 1:
            return parts[0]
        memory = MemorySnapshot(
            *(sum(getattr(p.memory, name) for p in parts) for name in MemorySnapshot.fields())
        )
        added = {name: sum(getattr(p, name) for p in parts) for name in _ADDED}
        return cls(
            phase=least_advanced([p.phase for p in parts]),
            paused=any(p.paused for p in parts),
            ready=all(p.ready for p in parts),
            memory=memory,
            oldest_wait_s=max(p.oldest_wait_s for p in parts),
            estimated_wait_s=min(p.estimated_wait_s for p in parts),
            classes={
                label: (
                    sum(p.classes[label][0] for p in parts),
                    max(p.classes[label][1] for p in parts),
                )
                for label in parts[0].classes
            },
            **added,
        )

    def sample(self) -> Sample:
        """The dashboard history's once-a-second sample."""
        snap = self.memory
        return Sample(
            t=time.time(),
            total=snap.total,
            used_by_others=snap.used_by_others,
            used_by_us=snap.ours,
            admitted=self.admitted,
            pool=self.pool,
            depth=self.depth,
            running=self.running,
        )

    def line(self) -> str:
        """A compact picture for log lines."""
        snap, mib = self.memory, 2**20
        return (
            f"total={snap.total // mib}MiB free={snap.free // mib}MiB ours={snap.ours // mib}MiB "
            f"others={snap.used_by_others // mib}MiB pool={self.pool // mib}MiB "
            f"admitted={self.admitted // mib}MiB running={self.running} queued={self.depth}"
        )

    def set_gauges(self, metrics: Metrics, device: str) -> None:
        """/metrics' gauges of one device as of this picture."""
        snap = self.memory
        metrics.queue_depth.labels(device).set(self.depth)
        for label, (depth, oldest) in self.classes.items():
            metrics.queue_depth_by_class.labels(device, label).set(depth)
            metrics.oldest_wait_by_class.labels(device, label).set(oldest)
        metrics.running.labels(device).set(self.running)
        metrics.pool.labels(device).set(self.pool)
        metrics.admitted.labels(device).set(self.admitted)
        metrics.device_total.labels(device).set(snap.total)
        metrics.device_used.labels(device).set(snap.total - snap.free)
        metrics.device_ours.labels(device).set(snap.ours)

    def device_view(self) -> dict[str, Any]:
        """One device's figures in /status `devices`."""
        snap = self.memory
        return {
            "total_bytes": snap.total,
            "used_bytes": snap.total - snap.free,
            "used_by_others_bytes": snap.used_by_others,
            "used_by_us_bytes": snap.ours,
            "free_bytes": snap.free,
            "reserve_bytes": self.reserve,
            "weights_bytes": self.weights,
            "pool_bytes": self.pool,
            "capacity_bytes": self.capacity,
            "admitted_bytes": self.admitted,
            "queue_depth": self.depth,
            "running": self.running,
            "running_streams": self.running_streams,
            "estimated_wait_s": round(self.estimated_wait_s, 3),
        }


# What several devices' pictures add up, and the phases from the least advanced on.
_ADDED = ["reserve", "weights", "pool", "capacity", "admitted", "slots", "stream_slots"]
_ADDED += ["depth", "max_queue", "running", "running_streams"]
_PHASE_ORDER = ["failed", "stopping", "starting", "loading", "warming", "degraded", "ready"]


def least_advanced(phases: list[str]) -> str:
    """Several devices' phases as one: failed or stopping if one is, else the least far
    along (ready only when all are)."""
    return min(phases, key=_PHASE_ORDER.index)


def set_price_gauges(metrics: Metrics, prices: list[dict[str, Any]]) -> None:
    """The learned prices in /metrics, by model, bucket and device (the book's key)."""
    for row in prices:
        if row["price_bytes"] is not None:
            labels = (row["model"], row["bucket"], row.get("device", ""))
            metrics.price.labels(*labels).set(row["price_bytes"])


def status_document(
    core: CoreSnapshot,
    device: dict[str, Any],
    models: list[dict[str, Any]],
    prices: list[dict[str, Any]],
    metrics: Metrics,
    gave_back: dict[str, Any] | None = None,
    devices: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The /status document: the one JSON the tray, the dashboard and `vramgate status`
    read. `device` is the device's own description, `models` the lifecycle's (the
    registry's, with keep-alive), `gave_back` the last memory given to other programs,
    `devices` each device's own figures (`core` adds them up)."""
    snap = core.memory
    return {
        "version": __version__,
        "time": time.time(),
        "state": core.phase,
        "paused": core.paused,
        "ready": core.ready,
        "device": {
            **device,
            "total_bytes": snap.total,
            "used_bytes": snap.total - snap.free,
            "used_by_others_bytes": snap.used_by_others,
            "used_by_us_bytes": snap.ours,
            "free_bytes": snap.free,
            "reserve_bytes": core.reserve,
            "weights_bytes": core.weights,
        },
        "pool": {
            "pool_bytes": core.pool,
            "capacity_bytes": core.capacity,
            "admitted_bytes": core.admitted,
            "slots": core.slots,
            "stream_slots": core.stream_slots,
        },
        "queue": {
            "depth": core.depth,
            "max": core.max_queue,
            "oldest_wait_s": round(core.oldest_wait_s, 3),
            "running": core.running,
            "running_streams": core.running_streams,
            "estimated_wait_s": round(core.estimated_wait_s, 3),
            "by_class": {
                label: {"waiting": depth, "oldest_wait_s": round(oldest, 3)}
                for label, (depth, oldest) in core.classes.items()
            },
        },
        "models": [
            {**model, "prices": [p for p in prices if p["model"] == model["name"]]}
            for model in models
        ],
        "devices": devices or [],
        "gave_back": gave_back,
        "counters": {
            "served": sum(metrics.served.values()),
            "served_by_model": dict(metrics.served),
            "served_by_device": dict(metrics.served_by_device),
            "rejected": dict(metrics.rejected),
            "ooms": metrics.oom_count,
        },
        "latency": metrics.latency_summary(),
    }


def combined_cache_view(views: list[dict[str, Any]]) -> dict[str, Any]:
    """The devices' prefix caches (app.models.prefix_cache) as one: sums, and the hit
    rate over every lookup."""
    keys = ("bytes", "entries", "tokens", "lookups", "hits", "tokens_reused", "evicted")
    total = {key: sum(view[key] for view in views) for key in keys}
    total["hit_rate"] = round(total["hits"] / total["lookups"], 3) if total["lookups"] else None
    return total


def set_cache_gauges(metrics: Metrics, device: str, view: dict[str, Any]) -> None:
    metrics.prefix_bytes.labels(device).set(view["bytes"])
    metrics.prefix_entries.labels(device).set(view["entries"])
    metrics.prefix_lookups.labels(device).set(view["lookups"])
    metrics.prefix_hits.labels(device).set(view["hits"])
    metrics.prefix_tokens.labels(device).set(view["tokens_reused"])
