"""/health, /status and /metrics on the real model; learned prices survive a restart."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.live import live_server, make_settings

METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics-logs.md"


def test_health_is_ready_after_warm_up(minilm):
    response = httpx.get(minilm.url + "/health")
    assert response.status_code == 200
    assert response.json() == {"live": True, "ready": True, "state": "ready"}


def test_status_snapshot_shows_device_pool_queue_and_learned_prices(minilm):
    status = minilm.status()
    device = status["device"]
    assert device["kind"] == "cpu" and device["total_bytes"] > device["free_bytes"] > 0
    assert status["pool"]["pool_bytes"] > 0 and status["pool"]["slots"] >= 1
    assert status["queue"]["depth"] == 0
    model = status["models"][0]
    assert model["loaded"] and model["weights_bytes"] > 0 and model["dimensions"] == 384
    learned = [p for p in model["prices"] if p["price_bytes"] is not None]
    assert len(learned) >= 3, "warm-up teaches several buckets"
    assert all(p["samples"] >= 1 and p["device"].startswith("cpu:") for p in learned)


def test_metrics_parse_with_prometheus_own_parser_and_are_documented(minilm):
    httpx.post(minilm.url + "/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"})
    text = httpx.get(minilm.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "vramgate_requests",
        "vramgate_queue_depth",
        "vramgate_pool_bytes",
        "vramgate_price_bytes",
        "vramgate_queue_wait_seconds",
        "vramgate_ready",
    ):
        assert name in families, name
    ok = [
        s
        for s in families["vramgate_requests"].samples
        if s.name == "vramgate_requests_total" and s.labels["outcome"] == "ok"
    ]
    assert ok and ok[0].value >= 1
    documented = set(re.findall(r"`(vramgate_[a-z_]+)`", METRICS_PAGE.read_text()))
    assert set(families) <= documented, set(families) - documented


@pytest.mark.slow
def test_learned_prices_survive_a_restart(tmp_path):
    settings = make_settings(tmp_path, device="cpu")
    with live_server(settings) as first:
        httpx.post(
            first.url + "/v1/embeddings",
            json={"model": "all-MiniLM-L6-v2", "input": ["one", "two", "three"]},
        )
        learned = first.status()["models"][0]["prices"]
    assert (tmp_path / "data" / "prices.json").is_file()
    with live_server(settings, ready=False) as second:
        # Before warm-up adds anything, the book already holds what the first run learned.
        restored = second.status()["models"][0]["prices"]
    samples = {p["bucket"]: p["samples"] for p in restored}
    assert learned and all(samples.get(p["bucket"], 0) >= p["samples"] for p in learned)


def test_root_answers_as_ollama_does_for_the_ollama_cli_heartbeat(tmp_path):
    """The `ollama` CLI checks that a server is up with `HEAD /` before each command;
    Ollama answers `GET /` with "Ollama is running". Open like /health (it tells nothing
    more), on every port that serves Ollama's API."""
    settings = make_settings(tmp_path, device="simulated:1GiB", token="root-test-token")
    with live_server(settings) as live:
        heartbeat = httpx.head(live.url + "/")
        assert heartbeat.status_code == 200 and heartbeat.content == b""
        page = httpx.get(live.url + "/")
        assert page.status_code == 200 and page.text == "Ollama is running"
        assert page.headers["content-type"].startswith("text/plain")
        rebinding = httpx.get(live.url + "/", headers={"Host": "evil.example"})
        assert rebinding.status_code == 403  # the guard still stands in front of it
        assert httpx.get(live.url + "/api/tags").status_code == 401  # the API needs the token
