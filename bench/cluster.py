"""What the Ray Serve path costs, side by side in one run:

    python bench/cluster.py [--seconds 10] [--warmup 2] [--write-readme]

`vramgate serve` and `vramgate cluster serve --replicas 1` (a local Ray instance, the
ingress and one replica of the same server) serve the same model on this machine's CPU,
both up at once and measured in turns (single, cluster, single, cluster), so drift in the
machine's load falls on both alike; each figure is the mean of its turns. Two models:
the trivial one (the simulated kind, no torch work: the path's own cost) and the
embedded all-MiniLM-L6-v2 (a real forward per batch), at 1 and 32 clients. Then, in the
same run, Ray Serve alone in the same shape (`bench/ray_floor.py`: proxy, ingress, a
deployment that answers at once): the floor the path cannot go under on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.loadgen import LoadResult, run_load  # noqa: E402
from bench.run import SHORT, TRIVIAL_CONFIG, Server, free_port, write_readme  # noqa: E402

MODELS = {"trivial": TRIVIAL_CONFIG, "all-MiniLM-L6-v2": ""}
CLIENTS = (1, 32)


class Cluster(Server):
    """`vramgate cluster serve`, stopped as a person stops it (Ctrl+C), so that the Ray
    instance it started goes with it."""

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(90)
        except subprocess.TimeoutExpired:
            super().stop()


def config_for(model: str) -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    config = scratch / "config.toml"
    config.write_text(
        f'device = "cpu"\nlog_level = "warning"\ndata_dir = "{scratch}/data"\n'
        f'log_dir = "{scratch}/log"\n{MODELS[model]}'
    )
    return config


def start(kind: str, model: str) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "app", *kind.split(), "--config", str(config_for(model))]
    argv += ["--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMGATE_", "RAY_"))}
    if kind == "serve":
        return Server("single", argv, port, "/health", "/v1/embeddings", model, env)
    argv += ["--replicas", "1", "--gpus-per-replica", "0"]
    return Cluster("ray", argv, port, "/health", "/v1/embeddings", model, env)


def measure(model: str, warmup: float, seconds: float, rounds: int) -> list[str]:
    """Table rows for one model: each server's mean rate and p50 at each client count."""
    servers = {"single": start("serve", model), "ray": start("cluster serve", model)}
    rows = []
    try:
        for clients in CLIENTS:
            results: dict[str, list[LoadResult]] = {name: [] for name in servers}
            for _ in range(rounds):
                for name, server in servers.items():
                    body = {"model": model, "input": SHORT}
                    load = run_load(
                        server.url,
                        server.path,
                        body,
                        clients=clients,
                        warmup_s=warmup,
                        seconds=seconds,
                    )
                    results[name].append(asyncio.run(load))
            single, ray = (_mean(results[name]) for name in ("single", "ray"))
            rows.append(
                f"| {model} | {clients} | {single[0]:.1f} | {ray[0]:.1f} | {ray[0] / single[0]:.2f}"
                f" | {single[1]:.1f} | {ray[1]:.1f} | {single[2] + ray[2]} |"
            )
            print(rows[-1], flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return rows


def measure_floor(warmup: float, seconds: float) -> list[str]:
    """Ray Serve alone: the rate and p50 of its plain and streamed calls."""
    port = free_port()
    argv = [sys.executable, "bench/ray_floor.py", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    floor = Cluster("ray-floor", argv, port, "/health", "/plain", "-", env)
    rows = []
    try:
        for path, call in (("/plain", "plain call"), ("/stream", "streamed call")):
            for clients in CLIENTS:
                load = run_load(
                    floor.url, path, {}, clients=clients, warmup_s=warmup, seconds=seconds
                )
                result = asyncio.run(load)
                rows.append(
                    f"| Ray Serve alone, {call} | {clients} | {result.rps:.1f} "
                    f"| {result.percentile(0.5) * 1000:.1f} | {result.errors} |"
                )
                print(rows[-1], flush=True)
    finally:
        floor.stop()
    return rows


def _mean(results: list[LoadResult]) -> tuple[float, float, int]:
    """Mean requests/s, mean p50 ms, errors."""
    rate = sum(r.rps for r in results) / len(results)
    p50 = sum(r.percentile(0.5) for r in results) / len(results) * 1000
    return rate, p50, sum(r.errors for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    lines = [
        "One short sentence per request; both servers on this machine's 2 cores, one replica.",
        "",
        "| model | clients | single requests/s | Ray requests/s | ratio | single p50 ms "
        "| Ray p50 ms | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        lines += measure(model, args.warmup, args.seconds, args.rounds)
    lines += [
        "",
        "Ray Serve alone in the same shape (proxy, ingress, a deployment that answers at once):",
        "",
        "| path | clients | requests/s | p50 ms | errors |",
        "|---|---|---|---|---|",
        *measure_floor(args.warmup, args.seconds),
    ]
    text = "\n".join(lines)
    print(text)
    if args.write_readme:
        write_readme(text, "cluster", "bench/cluster.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
