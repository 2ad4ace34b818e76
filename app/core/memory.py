"""What jobs may hold: the device's memory as the pool and the capacity the gate admits
against, above the weights (`baseline`) and the reserve left to other programs."""

from __future__ import annotations

from collections.abc import Callable

from app.devices.base import Device, MemorySnapshot

SNAPSHOT_TTL_S = 0.05


class MemoryView:
    def __init__(self, device: Device, reserve: int, clock: Callable[[], float]) -> None:
        self.device = device
        self.reserve = reserve
        self.baseline = 0  # our memory after the weights loaded; jobs are priced above it
        self.reclaimable: Callable[[], int] = lambda: 0  # bytes idle models could give up
        self._clock = clock
        self._snap: tuple[float, MemorySnapshot] | None = None

    def snapshot(self, fresh: bool = False) -> MemorySnapshot:
        now = self._clock()
        if fresh or self._snap is None or now - self._snap[0] > SNAPSHOT_TTL_S:
            self._snap = (now, self.device.snapshot())
        return self._snap[1]

    def pool_bytes(self) -> int:
        """What jobs may hold in total now: follows memory other programs take or free,
        and what our runners hold past their load figures (theirs, not the jobs')."""
        snap = self.snapshot()
        held = self.baseline + self.reserve + snap.runners_beyond
        return max(0, snap.free_for_us + snap.ours_allocated - held)

    def capacity_bytes(self) -> int:
        """The most the pool could be, if every other program let go and the idle models
        were unloaded (`reclaimable`). A device's total never changes: any reading serves
        (this is asked at every admission)."""
        return max(0, self.device_bytes() - self.baseline + self.reclaimable())

    def device_bytes(self) -> int:
        """What models and jobs may ever hold together: the device less the reserve and
        what we hold outside the allocator (the CUDA context)."""
        snap = self._snap[1] if self._snap is not None else self.snapshot()
        return max(0, snap.total - snap.outside - self.reserve)
