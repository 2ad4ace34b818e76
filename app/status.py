"""The /status snapshot: the one JSON document the tray, the dashboard and `vramgate
status` read."""

from __future__ import annotations

import time
from typing import Any

from app import __version__
from app.service import InferenceService


def build_status(service: InferenceService) -> dict[str, Any]:
    snap = service.snapshot()
    gate = service.gate
    metrics = service.metrics
    prices = service.book.snapshot()
    models = []
    for model in service.registry.describe():
        own = [p for p in prices if p["model"] == model["name"]]
        models.append({**model, "prices": own})
    return {
        "version": __version__,
        "time": time.time(),
        "state": service.state,
        "paused": service.paused,
        "ready": service.ready,
        "device": {
            **service.device.describe(),
            "total_bytes": snap.total,
            "used_bytes": snap.total - snap.free,
            "used_by_others_bytes": snap.used_by_others,
            "used_by_us_bytes": snap.ours,
            "free_bytes": snap.free,
            "reserve_bytes": service.reserve,
            "weights_bytes": service.baseline,
        },
        "pool": {
            "pool_bytes": service.pool_bytes(),
            "capacity_bytes": service.capacity_bytes(),
            "admitted_bytes": gate.held_bytes,
            "slots": gate.slots,
            "stream_slots": gate.stream_slots,
        },
        "queue": {
            "depth": gate.depth,
            "max": gate.max_queue,
            "oldest_wait_s": round(gate.oldest_wait_s(), 3),
            "running": gate.running,
            "running_streams": gate.running_streams,
            "estimated_wait_s": round(gate.estimated_wait_s(), 3),
        },
        "models": models,
        "counters": {
            "served": sum(metrics.served.values()),
            "served_by_model": dict(metrics.served),
            "rejected": dict(metrics.rejected),
            "ooms": metrics.oom_count,
        },
        "latency": metrics.latency_summary(),
    }
