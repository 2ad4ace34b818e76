"""What a failed run, a refused ticket or an expired wait tells the caller: an error with
a stable code, and for an out-of-memory run, a raised price and a pool re-read."""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.core.memory import MemoryView
from app.core.pricing import Pricer
from app.devices.base import Device
from app.devices.executor import drop_references
from app.errors import (
    DeviceFailed,
    ExceedsDevice,
    InternalError,
    OutOfMemory,
    QueueFull,
    QueueTimeout,
    VramgateError,
)
from app.models.prepared import Prepared
from app.observe.metrics import Metrics
from app.sched.budget import PriceKey
from app.sched.tickets import Permit, Reject

log = logging.getLogger("vramgate.service")


class FailureMapper:
    """Maps a run's exception to the caller's error. `on_fatal` is told of a fatal device
    error (the server then stops taking work and exits)."""

    def __init__(
        self,
        device: Device,
        metrics: Metrics,
        pricer: Pricer,
        memory: MemoryView,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._device = device
        self._metrics = metrics
        self._pricer = pricer
        self._memory = memory
        self._on_fatal = on_fatal

    def __call__(
        self, exc: BaseException, key: PriceKey, prepared: Prepared, permit: Permit, wait_s: float
    ) -> VramgateError:
        """`wait_s`: the queue's estimated wait now, the retry hint of an OOM."""
        if isinstance(exc, VramgateError):  # the model said what went wrong (a runner)
            return exc
        if self._device.is_oom(exc):
            self._metrics.observe_oom(self._device.id)
            log.warning("out of memory in %s/%s: %s", key.model, key.bucket, exc)
            drop_references(exc)  # the failed run's tensors, before the cache is emptied
            self._device.empty_cache()
            self._memory.snapshot(fresh=True)  # the pool as it is after the cache was emptied
            pool = self._memory.pool_bytes()
            self._pricer.penalize(key, prepared, alone=permit.exclusive, pool=pool)
            return OutOfMemory(
                "the device ran out of memory for this request; its price was raised, "
                "retry after the indicated time",
                retry_after=max(1.0, wait_s),
            )
        if self._device.is_fatal(exc):
            self._on_fatal(exc)
            return DeviceFailed("the device failed; the server is restarting", retry_after=10)
        log.error("model %s failed: %s: %s", key.model, type(exc).__name__, exc, exc_info=exc)
        return InternalError("the model failed on this request")


def rejection(decision: Reject) -> VramgateError:
    if decision.reason == "exceeds_device":
        return ExceedsDevice(
            f"this request needs {decision.needed} bytes of device memory; at most "
            f"{decision.available} can ever be available on this device",
            details={"needed_bytes": decision.needed, "available_bytes": decision.available},
        )
    wait = max(1.0, decision.estimated_wait_s)
    return QueueFull(
        f"the queue is full ({decision.queue_depth} waiting); retry in {wait:.0f}s",
        retry_after=wait,
        details={
            "reason": "queue_full",
            "queue_depth": decision.queue_depth,
            "estimated_wait_s": round(decision.estimated_wait_s, 3),
        },
    )


def queue_timeout(timeout_s: float, wait_s: float, depth: int) -> QueueTimeout:
    return QueueTimeout(
        f"waited {timeout_s:g}s in the queue without being admitted",
        retry_after=max(1.0, wait_s),
        details={"queue_depth": depth},
    )
