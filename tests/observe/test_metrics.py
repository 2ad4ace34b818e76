"""The speculation gauges of /metrics, read as Prometheus' text shows them."""

from __future__ import annotations

from prometheus_client import generate_latest

from app.observe.metrics import Metrics


def shown(metrics: Metrics) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line.startswith("vramgate_speculative_on{")]


def test_a_model_whose_speculation_turned_off_shows_one_series_of_its_own_not_a_stale_one():
    metrics = Metrics()
    drafting = {"on": True, "kind": "ngram-mod", "drafted_tokens": 96, "accepted_tokens": 80}
    metrics.set_speculation([{"name": "smol", "speculative": drafting}])
    assert shown(metrics) == ['vramgate_speculative_on{kind="ngram-mod",model="smol"} 1.0']
    off = {"on": False, "kind": None, "drafted_tokens": 96, "accepted_tokens": 80}
    metrics.set_speculation([{"name": "smol", "speculative": off}])
    assert shown(metrics) == ['vramgate_speculative_on{kind="none",model="smol"} 0.0']
