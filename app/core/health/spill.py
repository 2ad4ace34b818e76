"""A GPU that spills into system memory instead of running out of it.

NVIDIA's Windows drivers since 536.40 have a "CUDA - Sysmem Fallback Policy" that is on
by default: an allocation past the card's memory is served from system RAM over PCIe
instead of failing. torch then never raises out-of-memory, the price-raising loop never
runs, and jobs run many times slower (10-50x reported) into the watchdog. What can be
seen of it: runs far slower than the time learned for the same bucket while the card is
nearly full. Three such runs in a row read as a spill; a run at its learned speed ends
it. Pure: numbers in, a verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass

SPILL_WARNING = (
    "the GPU driver is putting memory in system RAM (jobs run many times slower than "
    "learned while VRAM is full): in the NVIDIA Control Panel, Manage 3D settings, set "
    '"CUDA - Sysmem Fallback Policy" to "Prefer No Sysmem Fallback" so that running out '
    "of memory is an error vramgate learns from"
)


@dataclass
class SpillWatch:
    slow_factor: float = 4.0  # a run this many times its learned time is suspect
    full_share: float = 0.05  # with less than this share of the card free
    needed: int = 3  # suspect runs in a row before it is said
    spilling: bool = False
    _streak: int = 0

    def warnings(self, current: tuple[str, ...]) -> tuple[str, ...]:
        """A device's warnings with this one said while spilling, and only then."""
        others = tuple(w for w in current if w != SPILL_WARNING)
        return (*others, SPILL_WARNING) if self.spilling else others

    def observe(self, run_s: float, expected_s: float, free: int, total: int) -> bool:
        """One finished run; whether the device reads as spilling now."""
        slow = expected_s > 0 and run_s > self.slow_factor * expected_s
        full = total > 0 and free < self.full_share * total
        if slow and full:
            self._streak += 1
            self.spilling = self.spilling or self._streak >= self.needed
        elif not slow:
            self._streak = 0
            self.spilling = False
        return self.spilling
