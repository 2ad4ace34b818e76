"""Soak: mixed load at about 80 % of capacity against the simulated device and simulated
model in a real server process, with 5 % cancelled and 5 % invalid requests. The server's
memory and thread count must not grow and its p99 latency must hold; a deliberately
leaking model (the negative control) must trip the same detector.

60 s in CI; `VRAMGATE_SOAK_S=600 pytest tests/scenarios/test_soak_simulated.py -s` for ten minutes.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.live import ServerProcess, clean_env

SOAK_S = float(os.environ.get("VRAMGATE_SOAK_S", "60"))
CONTROL_S = 20.0
# One bucket: 200 MiB for 100 ms per forward (a chat step takes as long). The 2 GiB pool
# holds 10 and 8 slots run at once: capacity is 8 / 0.1 s = 80 forwards/s.
CAPACITY_PER_S = 80.0
RATE_PER_S = 0.8 * CAPACITY_PER_S / 1.2  # a request is 1.2 forwards on average (see MIX)
MAX_RSS_MIB_PER_MIN = 8.0
MAX_THREAD_GROWTH = 2


def config(tmp_path: Path, leak: str = "0") -> Path:
    path = tmp_path / "soak.toml"
    path.write_text(
        'device = "simulated:2GiB"\nhealth_interval = 5\nmax_queue = 1024\n'
        '[[models]]\nname = "sim"\nkind = "simulated"\nmax_batch = 1\n'
        'buckets = [{size = 64, bytes = "200MiB", run_ms = 100}]\n'
        f'inject = {{leak_bytes_per_call = "{leak}"}}\n'
    )
    return path


@dataclass
class Soak:
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # t, RSS MiB, threads
    latencies: list[tuple[float, float]] = field(default_factory=list)  # t, seconds (ok only)
    statuses: dict[str, int] = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.statuses[what] = self.statuses.get(what, 0) + 1


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per minute."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    var = sum((t - mean_t) ** 2 for t, _ in points) or 1.0
    return 60.0 * cov / var


@dataclass(frozen=True)
class Verdict:
    rss_slope: float  # MiB per minute, over the run's second half
    thread_growth: int
    p99_first: float
    p99_last: float

    @property
    def grows(self) -> bool:
        return self.rss_slope > MAX_RSS_MIB_PER_MIN or self.thread_growth > MAX_THREAD_GROWTH

    @property
    def p99_stable(self) -> bool:
        return self.p99_last <= 2 * self.p99_first + 0.05


def judge(soak: Soak) -> Verdict:
    """The detector: after the first half (warm-up, allocator growth), memory and threads
    must be flat; the last third's p99 within twice the first third's."""
    start, end = soak.samples[0][0], soak.samples[-1][0]
    half = [s for s in soak.samples if s[0] >= (start + end) / 2]
    rss = slope_per_min([(t, mib) for t, mib, _ in half])
    threads = max(s[2] for s in half) - min(s[2] for s in half)

    def p99(lo: float, hi: float) -> float:
        window = sorted(d for t, d in soak.latencies if lo <= t < hi)
        return window[int(0.99 * (len(window) - 1))] if window else 0.0

    third = (end - start) / 3
    return Verdict(rss, threads, p99(start, start + third), p99(end - third, end + 1))


async def drive(url: str, pid: int, seconds: float, seed: int) -> Soak:
    rng = random.Random(seed)
    soak = Soak()
    process = psutil.Process(pid)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(kind: str) -> None:
            started = time.monotonic()
            if kind == "invalid":
                r = await client.post("/v1/embeddings", json={"model": "sim", "input": 5})
                soak.count(f"invalid {r.status_code}")
                return
            if kind == "chat":
                body = {
                    "model": "sim",
                    "messages": [{"role": "user", "content": "hello there"}],
                    "max_tokens": 3,
                    "stream": True,
                }
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    text = "".join([line async for line in r.aiter_lines()])
                    ok = r.status_code == 200 and "[DONE]" in text
            else:
                r = await client.post("/v1/embeddings", json={"model": "sim", "input": "hi"})
                ok = r.status_code == 200
            soak.count("ok" if ok else f"failed {r.status_code}")
            if ok:
                soak.latencies.append((started, time.monotonic() - started))

        async def cancelled() -> None:
            task = asyncio.create_task(one("embedding"))
            await asyncio.sleep(rng.uniform(0.0, 0.15))
            task.cancel()
            soak.count("cancelled")

        async def sampler() -> None:
            while True:
                soak.samples.append(
                    (time.monotonic(), process.memory_info().rss / 2**20, process.num_threads())
                )
                await asyncio.sleep(1.0)

        watcher = asyncio.create_task(sampler())
        tasks = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            roll = rng.random()
            if roll < 0.05:
                tasks.append(asyncio.create_task(one("invalid")))
            elif roll < 0.10:
                tasks.append(asyncio.create_task(cancelled()))
            else:
                kind = "chat" if rng.random() < 0.1 else "embedding"  # 3 steps each
                tasks.append(asyncio.create_task(one(kind)))
            await asyncio.sleep(rng.expovariate(RATE_PER_S))
        await asyncio.gather(*tasks, return_exceptions=True)
        watcher.cancel()
    return soak


def run_soak(tmp_path: Path, seconds: float, leak: str = "0") -> tuple[Soak, Verdict, dict]:
    server = ServerProcess(
        [sys.executable, "-m", "app", "serve", "--config", str(config(tmp_path, leak)),
         "--log-level", "warning",
         "--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l")],
        clean_env(),
    )  # fmt: skip
    try:
        server.wait_ready(120)
        soak = asyncio.run(drive(server.url, server.process.pid, seconds, seed=7))
        status = httpx.get(server.url + "/status", timeout=10).json()
    finally:
        assert server.stop() == 0
    return soak, judge(soak), status


def report(name: str, soak: Soak, verdict: Verdict) -> None:
    print(
        f"\n{name}: {soak.statuses}; RSS slope {verdict.rss_slope:+.2f} MiB/min over the "
        f"second half, threads +{verdict.thread_growth}; p99 first third "
        f"{verdict.p99_first * 1000:.0f} ms, last third {verdict.p99_last * 1000:.0f} ms"
    )


@pytest.mark.slow
@pytest.mark.timeout(int(SOAK_S) + 180)
def test_simulated_soak_memory_threads_and_p99_hold(tmp_path):
    soak, verdict, status = run_soak(tmp_path, SOAK_S)
    report("soak", soak, verdict)
    assert not verdict.grows, verdict
    assert verdict.p99_stable, verdict
    assert set(soak.statuses) <= {"ok", "cancelled", "invalid 400"}, soak.statuses
    assert soak.statuses["ok"] > 0.8 * SOAK_S * RATE_PER_S * 0.9 * 0.8
    assert status["queue"]["depth"] == 0 and status["pool"]["admitted_bytes"] == 0
    assert status["counters"]["ooms"] == 0


@pytest.mark.slow
@pytest.mark.timeout(int(CONTROL_S) + 180)
def test_simulated_soak_detector_catches_a_leaking_model(tmp_path):
    soak, verdict, _ = run_soak(tmp_path, CONTROL_S, leak="256KiB")
    report("leaking control", soak, verdict)
    assert verdict.grows, verdict
    assert verdict.rss_slope > 10 * MAX_RSS_MIB_PER_MIN
