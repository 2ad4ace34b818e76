"""Placement of models on devices, and the choice of a request's device: pure tables."""

from __future__ import annotations

import pytest

from app.core.fleet.placement import Load, Room, Wanted, place, soonest
from app.errors import DeviceUnavailable

GiB = 2**30
ROOMS = [Room("simulated:0", 4 * GiB), Room("simulated:1", 8 * GiB)]


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        # a model that fits only on the larger device goes there, though it is listed second
        ([Wanted("big", 5 * GiB)], {"big": ("simulated:1",)}),
        # small ones go where the most room is left after the ones placed before them
        (
            [Wanted("a", 3 * GiB), Wanted("b", 2 * GiB), Wanted("c", 2 * GiB)],
            {"a": ("simulated:1",), "b": ("simulated:1",), "c": ("simulated:0",)},
        ),
        # largest first: the 5 GiB model is not crowded out by a small one listed first
        (
            [Wanted("small", 3 * GiB), Wanted("big", 5 * GiB)],
            {"small": ("simulated:0",), "big": ("simulated:1",)},
        ),
        # replicas: a copy on each device where it fits, the roomiest first
        ([Wanted("r", GiB, replicas=2)], {"r": ("simulated:1", "simulated:0")}),
        # more replicas than devices: one copy per device
        ([Wanted("r", GiB, replicas=5)], {"r": ("simulated:1", "simulated:0")}),
        # a replica goes only where it fits
        (
            [Wanted("big", 5 * GiB), Wanted("r", 2 * GiB, replicas=2)],
            {"big": ("simulated:1",), "r": ("simulated:0", "simulated:1")},
        ),
        # a model that fits nowhere goes where there is most room (its load says why)
        ([Wanted("huge", 20 * GiB)], {"huge": ("simulated:1",)}),
        # a model's own device wins over room
        ([Wanted("pinned", GiB, device="simulated:0")], {"pinned": ("simulated:0",)}),
    ],
)
def test_place(wanted, expected):
    assert place(wanted, ROOMS) == expected


def test_place_keeps_what_is_placed_and_counts_its_bytes():
    kept = {"a": ("simulated:0",)}
    placed = place([Wanted("a", 3 * GiB), Wanted("b", 6 * GiB)], ROOMS, kept)
    assert placed == {"a": ("simulated:0",), "b": ("simulated:1",)}
    # a kept model on a device this server no longer has is placed again
    placed = place([Wanted("a", GiB)], ROOMS, {"a": ("cuda:3",)})
    assert placed == {"a": ("simulated:1",)}


def test_a_device_that_does_not_exist_is_refused_with_the_ones_that_do():
    with pytest.raises(DeviceUnavailable, match=r"'cuda:1'.*simulated:0, simulated:1"):
        place([Wanted("m", GiB, device="cuda:1")], ROOMS)


def load(device, serving=True, wait_s=0.0, queued=0, pool=GiB):
    return Load(device, serving, wait_s, queued, pool)


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ([load("a"), load("b", pool=2 * GiB)], "b"),  # idle both: the most free bytes
        ([load("a", queued=3), load("b", queued=1)], "b"),  # the fewer tickets
        ([load("a", wait_s=0.5, queued=1), load("b", wait_s=0.1, queued=9)], "b"),  # wait first
        ([load("a", serving=False), load("b", wait_s=5.0, queued=30)], "b"),  # loaded first
        ([load("a", serving=False), load("b", serving=False, pool=0)], "a"),  # both away
        ([load("a"), load("b")], "a"),  # a tie: the first listed
    ],
)
def test_soonest(loads, expected):
    assert soonest(loads) == expected
