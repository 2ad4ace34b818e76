"""The forward cost model: a line fitted from (tokens, seconds) points."""

from __future__ import annotations

import pytest

from app.engines.torch.generation.forward_cost import ForwardCost


def test_the_fit_recovers_a_line_from_forwards_of_different_sizes():
    cost = ForwardCost()
    for tokens in (1, 8, 43, 105, 1, 8):
        cost.record(tokens, 0.035 + 0.0015 * tokens)
    fit = cost.fit()
    assert fit is not None
    assert fit[0] == pytest.approx(0.035, rel=1e-6)
    assert fit[1] == pytest.approx(0.0015, rel=1e-6)


def test_nothing_is_known_from_forwards_of_one_size():
    cost = ForwardCost()
    for _ in range(5):
        cost.record(1, 0.04)
    assert cost.fit() is None
    assert not cost.worth_splitting(1000)


@pytest.mark.parametrize(
    ("fixed", "per_token", "saved", "worth"),
    [
        (0.035, 0.0015, 30, True),  # a CPU: 45 ms of prefix against a 35 ms forward
        (0.035, 0.0015, 16, False),  # 24 ms saved, 35 ms spent
        (0.010, 0.00001, 30, False),  # a GPU: the tokens cost nothing next to a forward
        (0.010, 0.00001, 2000, True),  # ... unless the shared prefix is long
    ],
)
def test_splitting_pays_when_the_saved_tokens_cost_more_than_a_forward(
    fixed, per_token, saved, worth
):
    cost = ForwardCost()
    for tokens in (1, 4, 64, 200):
        cost.record(tokens, fixed + per_token * tokens)
    assert cost.worth_splitting(saved) is worth


def test_older_forwards_weigh_less_as_the_device_changes():
    cost = ForwardCost(decay=0.5)
    for tokens in (1, 100) * 5:
        cost.record(tokens, 1.0 + 0.1 * tokens)
    for tokens in (1, 100) * 20:
        cost.record(tokens, 0.01 + 0.001 * tokens)
    fit = cost.fit()
    assert fit is not None
    assert fit[1] == pytest.approx(0.001, rel=1e-3)
