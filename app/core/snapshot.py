"""One picture of the core at one moment: /status, /metrics and the dashboard's history
all read it, so they never disagree about what they show."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from app import __version__
from app.core.memory import MemoryView
from app.core.state import ServerState
from app.engine.device import MemorySnapshot
from app.history import Sample
from app.metrics import Metrics
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

    @classmethod
    def of(
        cls, state: ServerState, ready: bool, memory: MemoryView, gate: MemoryGate
    ) -> CoreSnapshot:
        """The picture now, from the parts that hold it."""
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
            estimated_wait_s=gate.estimated_wait_s(),
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

    def set_gauges(self, metrics: Metrics, prices: list[dict[str, Any]]) -> None:
        """/metrics' gauges as of this picture."""
        snap = self.memory
        metrics.queue_depth.set(self.depth)
        metrics.running.set(self.running)
        metrics.pool.set(self.pool)
        metrics.admitted.set(self.admitted)
        metrics.device_total.set(snap.total)
        metrics.device_used.set(snap.total - snap.free)
        metrics.device_ours.set(snap.ours)
        metrics.ready.set(1 if self.ready else 0)
        for row in prices:
            if row["price_bytes"] is not None:
                metrics.price.labels(row["model"], row["bucket"]).set(row["price_bytes"])


def status_document(
    core: CoreSnapshot,
    device: dict[str, Any],
    models: list[dict[str, Any]],
    prices: list[dict[str, Any]],
    metrics: Metrics,
    gave_back: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The /status document: the one JSON the tray, the dashboard and `vramgate status`
    read. `device` is the device's own description, `models` the lifecycle's (the
    registry's, with keep-alive), `gave_back` the last memory given to other programs."""
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
        },
        "models": [
            {**model, "prices": [p for p in prices if p["model"] == model["name"]]}
            for model in models
        ],
        "gave_back": gave_back,
        "counters": {
            "served": sum(metrics.served.values()),
            "served_by_model": dict(metrics.served),
            "rejected": dict(metrics.rejected),
            "ooms": metrics.oom_count,
        },
        "latency": metrics.latency_summary(),
    }
