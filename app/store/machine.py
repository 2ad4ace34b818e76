"""This machine's rooms for a model, measured as the server measures them: what its
device has for a model now, the most it has, and the host's RAM beside it (where a GGUF
split between GPU and CPU keeps its CPU layers). Read from a running server's /status
(its device, as its gate sees it), or measured here when no server runs
(app.store.fits plans against them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.config.settings import Settings


@dataclass(frozen=True)
class Machine:
    """This machine's rooms for a model, measured: `free_bytes`, what a load is admitted
    against on the device now; `most_bytes`, the device less its reserve with nothing
    else on it; the host's RAM available now and in all (a split's CPU layers)."""

    device: str
    accelerator: bool  # a GPU (a simulated one too); else the device is the CPU
    free_bytes: int
    most_bytes: int
    host_free_bytes: int
    host_total_bytes: int


def machine_from_status(status: dict[str, Any]) -> Machine:
    """This machine's rooms for a model from a running server's /status document: the
    device with the most free for a model now (what the gate would admit a load against:
    its pool less what running work holds), the most it has (less its reserve), and the
    host's RAM."""
    row = max(status["devices"], key=lambda d: d["pool_bytes"] - d["admitted_bytes"])
    available, total = host_memory()
    return Machine(
        device=row["name"],
        accelerator=row["kind"] != "cpu",
        free_bytes=max(0, row["pool_bytes"] - row["admitted_bytes"]),
        most_bytes=max(0, row["total_bytes"] - row["reserve_bytes"]),
        host_free_bytes=available,
        host_total_bytes=total,
    )


def host_memory() -> tuple[int, int]:
    """The host's RAM: available now, and in all."""
    import psutil

    ram = psutil.virtual_memory()
    return int(ram.available), int(ram.total)


def machine_here(settings: Settings) -> Machine:
    """This machine measured as the server measures it (its first device, and the
    reserve the settings leave there), for `vramgate fits` and `pull` with no server
    running."""
    from app.devices.choose import make_device

    device = make_device(settings)
    reserve = int(settings.reserve if settings.reserve is not None else device.default_reserve)
    snap = device.snapshot()
    available, total = host_memory()
    return Machine(
        device=device.name,
        accelerator=device.kind != "cpu",
        free_bytes=max(0, snap.free_for_us - reserve),
        most_bytes=max(0, snap.total - snap.outside - reserve),
        host_free_bytes=available,
        host_total_bytes=total,
    )
