"""A simulated GPU: a fixed capacity with exact accounting, for tests and demos without a
GPU (`device = "simulated:8GiB"`). It raises torch's own out-of-memory error when what
is really held would exceed it, counts memory "other programs" take (`set_external`)
and what our runner processes reported (`adopt`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from app.devices.base import GiB, MemorySnapshot
from app.devices.torch_backed import TorchBacked


class SimulatedDevice(TorchBacked):
    """A fixed capacity with exact accounting; for tests and demos without a GPU."""

    kind = "simulated"
    default_reserve = 0
    default_slots = 8

    def __init__(self, capacity: int, index: int = 0) -> None:
        self.capacity = capacity
        self.id = f"simulated:{index}"
        self.name = f"Simulated {capacity / GiB:.1f} GiB"
        self.torch_device = torch.device("cpu")
        self._lock = threading.Lock()  # guards every counter below
        self._allocated = 0
        self._external = 0
        self._peak = 0
        self.high_water = 0  # all-time high of our allocations plus others'
        self.oom_count = 0

    def set_external(self, nbytes: int) -> None:
        """Memory taken by another program (a game, a browser)."""
        with self._lock:
            self._external = max(0, nbytes)

    def snapshot(self) -> MemorySnapshot:
        runners = sum(self.runners.values())  # our runners' processes hold what they said
        with self._lock:
            free = max(0, self.capacity - self._allocated - self._external - runners)
            return MemorySnapshot(
                total=self.capacity,
                free=free,
                used_by_others=self._external,
                ours=self._allocated + runners,
                ours_allocated=self._allocated + runners,
                free_for_us=free,
            )

    def allocated(self) -> int:
        with self._lock:
            return self._allocated

    def begin_peak(self) -> None:
        with self._lock:
            self._peak = self._allocated

    def peak(self) -> int:
        with self._lock:
            return self._peak

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        runners = sum(self.runners.values())
        with self._lock:
            if self._allocated + self._external + runners + nbytes > self.capacity:
                self.oom_count += 1
                free = self.capacity - self._allocated - self._external - runners
                raise torch.OutOfMemoryError(
                    f"simulated device out of memory: tried to allocate {nbytes} bytes "
                    f"with {free} bytes free of {self.capacity}"
                )
            self._allocated += nbytes
            self._peak = max(self._peak, self._allocated)
            self.high_water = max(self.high_water, self._allocated + self._external)
        try:
            with self._held_here(nbytes):
                yield
        finally:
            with self._lock:
                self._allocated -= nbytes

    def keep(self, nbytes: int) -> Callable[[], None] | None:
        """`nbytes` held until the returned function is called, counted to no thread (a
        simulated model's prefix cache entry, let go from any thread); None when they do
        not fit now (nothing is kept, and that is no out-of-memory)."""
        with self._lock:
            if self._allocated + self._external + sum(self.runners.values()) + nbytes > (
                self.capacity
            ):
                return None
            self._allocated += nbytes
            self._peak = max(self._peak, self._allocated)
            self.high_water = max(self.high_water, self._allocated + self._external)
        held = [nbytes]

        def release() -> None:
            with self._lock:
                self._allocated -= held.pop() if held else 0

        return release

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "high_water": self.high_water, "ooms": self.oom_count}
