"""A GPU card for tests on machines without one: torch's caching allocator as
c10/cuda/CUDACachingAllocator.cpp sizes its segments, and a driver (NVML) whose free
memory is what the card's total leaves after other programs, our CUDA context and the
segments the allocator reserved.

What is copied from torch (c10/cuda/CUDACachingAllocator.cpp, torch 2.x):
- every request is rounded up to a multiple of kMinBlockSize (512 bytes): `round_size`;
- a request of at most kSmallSize (1 MiB) comes from the small pool, whose segments are
  kSmallBuffer (2 MiB); up to kMinLargeAlloc (10 MiB) a new segment is kLargeBuffer
  (20 MiB); larger ones are rounded up to kRoundLarge (2 MiB): `get_allocation_size`;
- a request is served from a cached segment of its pool when one has room, else a new
  segment is cudaMalloc'd (reserved grows);
- with `set_per_process_memory_fraction`, a segment that would take the reserved bytes
  past fraction × total fails as out of memory (`alloc_block`'s `set_fraction` check);
- `empty_cache` gives back (cudaFree) the segments with no live block in them;
- `memory_allocated` counts the rounded blocks, `memory_reserved` the segments, and
  `reset_peak_memory_stats` sets both high-water marks to the current values.
Simplified: a segment's free bytes are one count (no block splitting or fragmentation
inside it), which only makes reserved growth smaller than torch's.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import torch

from tests.devices.test_devices import FakeCudaStats, FakeNvml

MiB = 2**20
K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
K_LARGE_BUFFER = 20 * MiB


def round_size(size: int) -> int:
    return max(K_MIN_BLOCK, -(-size // K_MIN_BLOCK) * K_MIN_BLOCK)


def allocation_size(size: int) -> int:
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass
class Segment:
    size: int
    small: bool
    used: int = 0


@dataclass
class CachingCuda(FakeCudaStats):
    """torch.cuda with a caching allocator on one card of `total` bytes."""

    total: int = 24 * 2**30
    others: int = 0  # other programs' memory on the card (a game, the desktop)
    context: int = 300 * MiB  # our CUDA context: the driver counts it, torch does not
    segments: list[Segment] = field(default_factory=list)
    blocks: dict[int, tuple[Segment, int]] = field(default_factory=dict)
    emptied: int = 0
    fraction: float = 1.0

    def __post_init__(self) -> None:
        super().__init__(0, 0)
        self.max_reserved = 0
        self._ids = itertools.count()

    # the allocator ---------------------------------------------------------------
    def alloc(self, size: int) -> int:
        """A tensor of `size` bytes; returns its handle."""
        rounded, small = round_size(size), size <= K_SMALL_SIZE
        segment = next(
            (s for s in self.segments if s.small == small and s.size - s.used >= rounded), None
        )
        if segment is None:
            grow = allocation_size(rounded)
            allowed = int(self.fraction * self.total)
            if self.free_on_card() < grow or self.reserved + grow > allowed:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size}")
            segment = Segment(grow, small)
            self.segments.append(segment)
        segment.used += rounded
        handle = next(self._ids)
        self.blocks[handle] = (segment, rounded)
        self.allocated += rounded
        self.reserved = sum(s.size for s in self.segments)
        self.peak = max(self.peak, self.allocated)
        self.max_reserved = max(self.max_reserved, self.reserved)
        return handle

    def free(self, handle: int) -> None:
        segment, rounded = self.blocks.pop(handle)
        segment.used -= rounded
        self.allocated -= rounded

    def free_on_card(self) -> int:
        return self.total - self.others - self.context - self.reserved

    # torch.cuda's functions -------------------------------------------------------
    def empty_cache(self) -> None:
        self.emptied += 1
        self.segments = [s for s in self.segments if s.used]
        self.reserved = sum(s.size for s in self.segments)

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        self.fraction = fraction

    def get_per_process_memory_fraction(self, device: int) -> float:
        return self.fraction

    def max_memory_reserved(self, index: int) -> int:
        return self.max_reserved

    def reset_peak_memory_stats(self, index: int) -> None:
        self.peak, self.max_reserved = self.allocated, self.reserved


class CardNvml(FakeNvml):
    """The driver's view of the same card: free is what the card has left; our process
    holds its CUDA context and the allocator's segments."""

    def __init__(self, card: CachingCuda) -> None:
        super().__init__(card.total, 0, None)
        self.card = card

    def nvmlDeviceGetMemoryInfo(self, handle: str):
        return type("Info", (), {"total": self.card.total, "free": self.card.free_on_card()})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str):
        ours = self.card.context + self.card.reserved
        return [type("Proc", (), {"pid": os.getpid(), "usedGpuMemory": ours})()]
