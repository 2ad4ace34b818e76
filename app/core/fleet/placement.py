"""Which devices serve which models, and which of a model's devices takes a request.

Pure decisions on small typed values, no torch and no server: `place` puts each model
(and each of its replicas) on a device, `soonest` picks the replica whose device admits
a request soonest. app.core.fleet.fleet feeds them what the devices say now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import DeviceUnavailable


@dataclass(frozen=True)
class Wanted:
    """A model to place: its weights' expected bytes, the device its config names
    (None: any), and how many devices serve a copy of it."""

    name: str
    nbytes: int
    device: str | None = None
    replicas: int = 1


@dataclass(frozen=True)
class Room:
    """A device and the bytes models and jobs may ever hold on it (total less reserve)."""

    device: str
    nbytes: int


Placement = dict[str, tuple[str, ...]]  # model -> the devices that serve it


def place(
    wanted: Sequence[Wanted], rooms: Sequence[Room], kept: Placement | None = None
) -> Placement:
    """Each model on its named device, or else on the devices with the most room left
    where its weights fit (largest models first, so a big one is not crowded out by
    small ones placed before it); a replicated one on that many distinct devices (at
    most one copy per device). A model that fits nowhere goes where there is most room,
    so its load fails there with the bytes it needs. `kept`: models already placed stay
    where they are (a reread config never moves a loaded model)."""
    ids = [room.device for room in rooms]
    left = {room.device: room.nbytes for room in rooms}
    placed: Placement = {}
    for model in wanted:
        devices = (kept or {}).get(model.name)
        if devices is not None and set(devices) <= set(ids):
            placed[model.name] = devices
            for device in devices:
                left[device] -= model.nbytes
    for model in sorted(wanted, key=lambda m: -m.nbytes):
        if model.name in placed:
            continue
        if model.device is not None:
            if model.device not in left:
                raise DeviceUnavailable(
                    f"model {model.name!r} asks for device {model.device!r}; this server "
                    f"has {', '.join(ids)}"
                )
            chosen = [model.device]
        else:
            chosen = _most_room(left, model.nbytes, model.replicas)
        for device in chosen:
            left[device] -= model.nbytes
        placed[model.name] = tuple(chosen)
    return {model.name: placed[model.name] for model in wanted}


def _most_room(left: dict[str, int], nbytes: int, replicas: int) -> list[str]:
    """The `replicas` devices with the most room where `nbytes` fit (ties: the first
    listed), or the one with the most room when none fits."""
    by_room = sorted(left, key=lambda device: -left[device])  # stable: listed order on ties
    fits = [device for device in by_room if left[device] >= nbytes]
    return fits[:replicas] if fits else by_room[:1]


@dataclass(frozen=True)
class Load:
    """What one of a model's devices says now, for choosing where a request goes."""

    device: str
    serving: bool  # the model is loaded there (else the request would wait for a load)
    wait_s: float  # the device's estimated wait at the tail of its queue
    queued: int  # its tickets waiting and running
    pool: int  # the bytes jobs may hold there now, less what running jobs hold


def soonest(loads: Sequence[Load]) -> str:
    """The device that admits a request soonest: one where the model is loaded before
    one that would load it; then the shortest estimated wait, the fewest tickets, the
    most free bytes; the first listed on a tie."""
    best = min(
        range(len(loads)),
        key=lambda i: (not loads[i].serving, loads[i].wait_s, loads[i].queued, -loads[i].pool),
    )
    return loads[best].device
