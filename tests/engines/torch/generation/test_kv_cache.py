"""The batch footprint rule, with tables: rows × length must stay within what the rows
were admitted for (their tokens × the measured margin) until each has ended."""

from __future__ import annotations

import pytest

from app.engines.torch.generation.kv_cache import MIN_SHARED, common_prefix, find_donor, fits


# rows: (tokens held now, the most they will hold, tokens admitted); the margin is 1.1
@pytest.mark.parametrize(
    ("rows", "length", "expected"),
    [
        pytest.param([(50, 114, 128)] * 8, 50, True, id="eight alike, joined together"),
        pytest.param([(51, 114, 128)] + [(50, 114, 128)] * 7, 51, True, id="one step apart"),
        pytest.param([(70, 114, 128), (50, 114, 128)], 70, True, id="20 steps apart"),
        pytest.param([(80, 114, 128), (50, 114, 128)], 80, False, id="30 steps apart"),
        pytest.param(
            [(500, 1000, 1024), (20, 60, 64)], 500, False, id="a short one beside a long one"
        ),
        pytest.param([(64, 64, 64), (20, 64, 64)], 64, False, id="a full bucket: no slack"),
    ],
)
def test_fits_table(rows, length, expected):
    assert fits(rows, length) is expected


def test_a_donor_shares_at_least_min_shared_tokens_and_leaves_one_of_its_own():
    system = list(range(100, 100 + MIN_SHARED))
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert find_donor([*system, 7], [[1, 2], [*system, 7, 8]]) == (1, MIN_SHARED)
    assert find_donor([*system[:-1], 0], [system]) == (-1, 0)  # one short of MIN_SHARED
    same = [*system, 5, 6]
    assert find_donor(same, [same]) == (0, len(same) - 1)  # its last token is its own
