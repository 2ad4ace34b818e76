"""The cluster router's ranking: pure tables of what replicas reported."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve", reason="the cluster extra (Linux only)")

from app.cluster.router import free_for, rank

MiB = 2**20


def stats(free_mib: int, price_mib: int = 100, model: str = "m") -> dict:
    return {
        "free_bytes": free_mib * MiB,
        "models": {model: {"free_bytes": free_mib * MiB, "price_bytes": price_mib * MiB}},
    }


@pytest.mark.parametrize(
    ("replicas", "model", "avoid", "expected"),
    [
        # the most free bytes for the model first
        ([("a", stats(500), 0), ("b", stats(900), 0)], "m", (), ["b", "a"]),
        # what is in flight there counts at the model's typical price: 900 - 5 x 100 < 500
        ([("a", stats(500), 0), ("b", stats(900), 5)], "m", (), ["a", "b"]),
        # a replica that does not serve the model comes last, whatever its room
        ([("a", stats(9000, model="other"), 0), ("b", stats(10), 0)], "m", (), ["b", "a"]),
        # one that refused the request already comes after every other
        ([("a", stats(500), 0), ("b", stats(900), 0)], "m", ("b",), ["a", "b"]),
        # a replica that reported nothing yet ranks as having nothing free
        ([("new", {}, 0), ("a", stats(1), 0)], "m", (), ["a", "new"]),
        # not inference (no model): its own free bytes, then fewer in flight
        ([("a", stats(500), 3), ("b", stats(500), 1)], None, (), ["b", "a"]),
    ],
)
def test_rank(replicas, model, avoid, expected):
    assert rank(replicas, model, avoid) == expected


def test_free_for_a_model_it_lacks_is_below_any_free():
    assert free_for(stats(5, model="x"), "m", 0) == -1
    assert free_for(stats(5), "m", 0) == 5 * MiB
    assert free_for(stats(5, price_mib=1), "m", 2) == 3 * MiB
