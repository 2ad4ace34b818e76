"""Speculative decoding on llama.cpp's engine, measured: the three workloads, a
streaming client that times each answer from its first token to its last, a sweep of
the draft-free kinds and sizes on llama.cpp alone, and vramgate against llama.cpp.

    python bench/speculative.py --sweep [--streams 1,8,32] [--threads 1]
    python bench/generation.py --speculative [--rounds 2] [--threads 0] [--write-readme]

`--sweep` serves the GGUF with llama.cpp alone (bench/llama_server_alone.py) once per
candidate (no speculation, and each draft-free kind with several draft sizes), all
started at once and asked in turns, so the machine's noise falls on every candidate
alike; it prints each one's decode rate (best and median round), its tokens per CPU
second of the server (the work, which a shared machine's other programs disturb far
less than the time), their ratios to no speculation's, and the drafts accepted, on each
workload. `bench/generation.py --speculative` (`compare`) runs vramgate with no
per-model settings against llama.cpp's own server at its defaults and with the same
speculative settings by hand, the three up at once and asked in turns.

Workloads, each request a prompt none asked before (so that no prefix cache counts; the
n-gram pool of a speculating server does learn from earlier requests, as it would
serving an agent): a code edit that copies most of its input (a function of this
repository renamed), a JSON extraction from a given record (its answer constrained to a
schema), and a free story.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.gguf_model import GGUF_MODEL, ensure_gguf, llama_alone  # noqa: E402

WORKLOADS = ("code edit", "json extraction", "story")
MAX_TOKENS = {"code edit": 128, "json extraction": 96, "story": 128}
FUNCTION_LINES = (8, 22)  # a code edit's input: ~150-300 tokens, 32 of them prefill in seconds


def _code_chunks() -> list[tuple[str, str]]:
    """(code, its name): this repository's top-level functions of 8 to 22 lines, in a
    fixed order. A whole function is what SmolLM2 copies best (0.70 of its drafts
    accepted, against 0.47-0.67 for blocks cut at any line)."""
    found = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for start, line in enumerate(lines):
            if not line.startswith("def ") or "(" not in line:
                continue
            end = start + 1
            while end < len(lines) and (not lines[end] or lines[end][0] in " )"):
                end += 1
            body = "\n".join(lines[start:end]).rstrip()
            if FUNCTION_LINES[0] <= body.count("\n") + 1 <= FUNCTION_LINES[1]:
                found.append((body, line[4:].split("(")[0]))
    random.Random(7).shuffle(found)
    return found


_CHUNKS: list[tuple[str, str]] = []


def code_edit(i: int) -> dict[str, Any]:
    if not _CHUNKS:
        _CHUNKS.extend(_code_chunks())
    code, name = _CHUNKS[i % len(_CHUNKS)]
    text = (
        f"Rename the function `{name}` to `{name}_v2` in this Python code. Reply with the "
        f"whole code, changed, and nothing else.\n\n```python\n{code}\n```"
    )
    return {"messages": [{"role": "user", "content": text}]}


FIRST = ("Ada", "Bruno", "Chen", "Dalia", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun")
LAST = ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Silva", "Novak", "Haddad", "Kowalski")
CITIES = ("Lisbon", "Osaka", "Tampere", "Quito", "Leeds", "Graz", "Accra", "Perth")
PRODUCTS = ("oak desk", "desk lamp", "office chair", "bookshelf", "monitor arm", "rug")
EXTRACTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "email": {"type": "string"},
        "phone": {"type": "string"},
        "city": {"type": "string"},
        "order_id": {"type": "string"},
        "product": {"type": "string"},
        "quantity": {"type": "integer"},
        "total": {"type": "string"},
    },
    "required": ["name", "email", "phone", "city", "order_id", "product", "quantity", "total"],
}


def json_extraction(i: int) -> dict[str, Any]:
    rng = random.Random(i)
    first, last = rng.choice(FIRST), rng.choice(LAST)
    city, product = rng.choice(CITIES), rng.choice(PRODUCTS)
    quantity, price = rng.randint(1, 9), rng.randint(20, 900)
    order = f"ORD-{rng.randint(10000, 99999)}-{i}"
    record = (
        f"Customer record {i}\nName: {first} {last}\n"
        f"Email: {first.lower()}.{last.lower()}{i}@example.org\n"
        f"Phone: +1-555-{rng.randint(1000, 9999)}\n"
        f"Address: {rng.randint(1, 400)} Harbour Street, {city}\n"
        f"Order {order} placed on 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}: "
        f"{quantity} x {product} at ${price} each, total ${quantity * price}.\n"
        "Notes: deliver to the back door; call before arriving."
    )
    text = (
        "Extract the customer's name, email, phone, city, order id, product, quantity "
        f"and total from this record as JSON.\n\n{record}"
    )
    schema = {"type": "json_schema", "json_schema": {"name": "order", "schema": EXTRACTED}}
    return {"messages": [{"role": "user", "content": text}], "response_format": schema}


SUBJECTS = ("a dragon", "a robot", "an old sailor", "a small fox", "a baker", "a queen",
            "a lighthouse keeper", "a cat", "a painter", "a beekeeper", "a clockmaker",
            "a river otter")  # fmt: skip
SKILLS = ("bake bread", "paint the sea", "play the violin", "build a boat", "read the stars",
          "grow roses", "speak to birds", "sail alone")  # fmt: skip


def story(i: int) -> dict[str, Any]:
    subject = SUBJECTS[i % len(SUBJECTS)]
    skill = SKILLS[i // len(SUBJECTS) % len(SKILLS)]
    text = f"Write a long story about {subject} who learns to {skill} (tale {i})."
    return {"messages": [{"role": "user", "content": text}]}


REQUESTS: dict[str, Callable[[int], dict[str, Any]]] = {
    "code edit": code_edit,
    "json extraction": json_extraction,
    "story": story,
}


@dataclass(frozen=True)
class Answer:
    first: float  # perf_counter of its first content
    last: float  # ... and of its last
    tokens: int
    drafted: int  # draft tokens, as the server said (0: none said)
    accepted: int
    cpu_first: float  # the server's CPU seconds at its first content (0: not measured)
    cpu_last: float  # ... and at its last


@dataclass(frozen=True)
class Round:
    """Streams asked at once: their decode rate from the first token of any to the last
    of any, and the drafts their servers reported."""

    tokens_per_s: float
    tokens: int
    drafted: int
    accepted: int
    tokens_per_cpu_s: float  # the same tokens per CPU second of the server (0: unmeasured)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def no_cpu() -> float:
    return 0.0


async def ask(
    port: int, model: str, body: dict[str, Any], cpu: Callable[[], float] = no_cpu
) -> Answer:
    """One streamed chat over raw HTTP/1.1 (the client of bench/generation.py): its
    content's first and last arrival, its tokens (usage), its drafts (vramgate's usage;
    llama.cpp's own `timings` on the last chunk), and `cpu()` (the server's CPU seconds)
    read at its first and its last content."""
    payload = json.dumps(
        {
            "model": model,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **body,
        }
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(payload)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + payload
    )
    await writer.drain()
    first = last = None
    cpu_first = cpu_last = 0.0
    tokens = chunks = drafted = accepted = 0
    while line := await reader.readline():
        if line.startswith(b"data: [DONE]"):
            break
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[len(b"data: ") :])
        choices = chunk.get("choices") or []
        if choices and choices[0].get("delta", {}).get("content"):
            chunks += 1
            last, cpu_last = time.perf_counter(), cpu()
            first, cpu_first = first or last, cpu_first or cpu_last
        timings = chunk.get("timings") or {}
        drafted = int(timings.get("draft_n", drafted) or 0)
        accepted = int(timings.get("draft_n_accepted", accepted) or 0)
        usage = chunk.get("usage") or {}
        if usage:
            tokens = int(usage.get("completion_tokens", 0))
            drafted = int(usage.get("draft_tokens", drafted) or 0)
            accepted = int(usage.get("accepted_tokens", accepted) or 0)
    writer.close()
    now = time.perf_counter()
    tokens = tokens or chunks
    return Answer(first or now, last or now, tokens, drafted, accepted, cpu_first, cpu_last)


async def round_of(
    port: int, model: str, bodies: list[dict[str, Any]], cpu: Callable[[], float] = no_cpu
) -> Round:
    answers = await asyncio.gather(*(ask(port, model, body, cpu) for body in bodies))
    start = min(a.first for a in answers)
    end = max(a.last for a in answers)
    decoded = sum(max(a.tokens - 1, 0) for a in answers)
    spent = max(a.cpu_last for a in answers) - min(a.cpu_first for a in answers)
    return Round(
        decoded / max(end - start, 1e-6),
        sum(a.tokens for a in answers),
        sum(a.drafted for a in answers),
        sum(a.accepted for a in answers),
        decoded / spent if spent > 0 else 0.0,
    )


def cpu_of(pid: int) -> Callable[[], float]:
    """A process's CPU seconds (user and system), read as often as asked."""
    import psutil

    process = psutil.Process(pid)

    def read() -> float:
        times = process.cpu_times()
        return times.user + times.system

    return read


class Prompts:
    """Fresh prompts: every request of a run takes the next index of its workload."""

    def __init__(self, start: int = 0) -> None:
        self._next = dict.fromkeys(WORKLOADS, start)

    def take(self, workload: str, count: int) -> list[dict[str, Any]]:
        first = self._next[workload]
        self._next[workload] = first + count
        limit = {"max_tokens": MAX_TOKENS[workload]}
        return [{**REQUESTS[workload](first + i), **limit} for i in range(count)]


# -- the sweep: llama.cpp alone, each candidate once --------------------------------------

CANDIDATES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "ngram-mod 24/48-64": {"kind": "ngram-mod", "match": 24, "draft_min": 48, "draft_max": 64},
    "ngram-mod 12/8-32": {"kind": "ngram-mod", "match": 12, "draft_min": 8, "draft_max": 32},
    "ngram-mod 8/4-16": {"kind": "ngram-mod", "match": 8, "draft_min": 4, "draft_max": 16},
    "ngram-mod 6/2-8": {"kind": "ngram-mod", "match": 6, "draft_min": 2, "draft_max": 8},
    "ngram-mod 12/4-16": {"kind": "ngram-mod", "match": 12, "draft_min": 4, "draft_max": 16},
    "ngram-mod 16/8-24": {"kind": "ngram-mod", "match": 16, "draft_min": 8, "draft_max": 24},
    "ngram-simple 12/48": {"kind": "ngram-simple", "match": 12, "draft_min": 0, "draft_max": 48},
    "ngram-simple 8/16": {"kind": "ngram-simple", "match": 8, "draft_min": 0, "draft_max": 16},
    "ngram-simple 4/16": {"kind": "ngram-simple", "match": 4, "draft_min": 0, "draft_max": 16},
    "ngram-map-k 12/48": {"kind": "ngram-map-k", "match": 12, "draft_min": 0, "draft_max": 48},
    "ngram-map-k 4/16": {"kind": "ngram-map-k", "match": 4, "draft_min": 0, "draft_max": 16},
    "ngram-map-k 8/16": {"kind": "ngram-map-k", "match": 8, "draft_min": 0, "draft_max": 16},
}


def alone(
    gguf: Path, name: str, speculative: dict[str, Any] | None, slots: int, threads: int = 0
) -> Any:
    """llama.cpp's own server on `gguf`: `slots` slots of one unified pool of 1,024
    cells each (32,768 at 32 slots: the pool vramgate's runner gets), speculating as
    `speculative` says (None: not, llama.cpp's default), on `threads` CPU threads (0:
    llama.cpp's default)."""
    args = ["--context", str(max(1024, 4096 // slots)), "--parallel", str(slots), "--unified"]
    args += ["--threads", str(threads)]
    if speculative is not None:
        args += ["--speculative", json.dumps(speculative)]
    return llama_alone(gguf, name, *args)


def sweep(
    gguf: Path, names: list[str], streams: list[int], rounds: int, threads: int
) -> dict[str, Any]:
    """Each candidate's rounds, asked in turns: {(streams, workload): {name: [Round]}}."""
    slots = max(streams)
    servers = {
        name: alone(gguf, f"sweep-{i}", CANDIDATES[name], slots, threads)
        for i, name in enumerate(names)
    }
    found: dict[Any, dict[str, list[Round]]] = {}
    try:
        for port in (s.port for s in servers.values()):  # warm-up
            asyncio.run(round_of(port, GGUF_MODEL, Prompts(10_000).take("story", 1)))
        for count in streams:
            for workload in WORKLOADS:
                prompts = {name: Prompts() for name in names}  # the same prompts for each
                for _ in range(rounds):
                    for name, server in servers.items():
                        bodies = prompts[name].take(workload, count)
                        cpu = cpu_of(server.process.pid)
                        done = asyncio.run(round_of(server.port, GGUF_MODEL, bodies, cpu))
                        found.setdefault((count, workload), {}).setdefault(name, []).append(done)
                print_point(count, workload, found[(count, workload)])
    finally:
        for server in servers.values():
            server.stop()
    return found


def print_point(
    streams: int, workload: str, runs: dict[str, list[Round]], baseline: str = "none"
) -> None:
    """Each candidate's best and median round (the best is the least disturbed by the
    machine's other work) and its tokens per CPU second of the server (the work it
    took, which other programs on the machine disturb far less than the time), their
    ratios to no speculation's, and the drafts accepted."""

    def rates(name: str) -> tuple[float, float, float]:
        found = [r.tokens_per_s for r in runs[name]]
        per_cpu = statistics.median(r.tokens_per_cpu_s for r in runs[name])
        return max(found), statistics.median(found), per_cpu

    base = rates(baseline) if baseline in runs else None
    for name, rounds in runs.items():
        best, median, per_cpu = rates(name)
        drafted = sum(r.drafted for r in rounds)
        accepted = sum(r.accepted for r in rounds)
        ratios = "-"
        if base and base[2]:
            ratios = f"{best / base[0]:.2f} {median / base[1]:.2f} {per_cpu / base[2]:.2f}"
        share = f"{accepted / drafted:.2f}" if drafted else "-"
        print(
            f"{streams:>2} | {workload:<15} | {name:<20} | best {best:6.1f} median "
            f"{median:6.1f} tok/s, {per_cpu:6.1f} tok/cpu-s | ratios {ratios} | "
            f"drafted {drafted:5d} accepted {share}",
            flush=True,
        )


# -- the comparison: vramgate against llama.cpp alone, with and without ---------------

PEERS = ("vramgate", "llama.cpp defaults", "llama.cpp + same speculation")
STREAMS = (1, 8, 32)


def cpu_of_tree(pid: int) -> Callable[[], float]:
    """The CPU seconds of a process and of its children (vramgate and its runner), read
    as often as asked; the children are looked up again when one has ended (a runner
    reloaded)."""
    import psutil

    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]

    def read() -> float:
        try:
            return sum(sum(p.cpu_times()[:2]) for p in processes)
        except psutil.NoSuchProcess:
            processes[:] = [root, *root.children(recursive=True)]
            return sum(sum(p.cpu_times()[:2]) for p in processes)

    return read


def start_peers(gguf: Path, threads: int) -> dict[str, Any]:
    """vramgate with no per-model settings (but `threads`, where set), llama.cpp's own
    server at its defaults (no speculation) and with vramgate's speculative settings by
    hand, each with 32 slots of one unified pool of 32,768 cells (vramgate's runner's)."""
    from app.config.settings import ModelSpec
    from app.engines.llama_cpp.speculation import plan_speculation
    from bench.run import start_vramgate

    config = Path(tempfile.mkdtemp(prefix="bench-config-")) / "config.toml"
    own = f"threads = {threads}\n" if threads else ""
    config.write_text(
        f'[[models]]\nname = "{GGUF_MODEL}"\nkind = "generation"\n'
        f"path = {json.dumps(str(gguf))}\n{own}"
    )
    plan = plan_speculation(ModelSpec(name="x", kind="generation", path=gguf))
    assert plan is not None
    # a model idle while the others are asked (minutes at 32 streams) stays loaded
    extra = ("--queue-timeout", "900", "--keep-alive", "-1")
    return {
        "vramgate": start_vramgate(config, GGUF_MODEL, "/v1/chat/completions", extra),
        "llama.cpp defaults": alone(gguf, "alone-defaults", None, 32, threads),
        "llama.cpp + same speculation": alone(
            gguf, "alone-speculating", plan.runner_settings(), 32, threads
        ),
    }


def rounds_at(streams: int, rounds: int) -> int:
    """Rounds of a point: one more at 1 stream (seconds each, and the most disturbed by
    the machine's other work), one fewer at 32 (each near a minute on two cores)."""
    if streams == 1:
        return rounds + 1
    return max(1, rounds - 1) if streams >= 32 else rounds


def compare(
    gguf: Path, streams: tuple[int, ...], rounds: int, threads: int
) -> dict[tuple[int, str], dict[str, list[Round]]]:
    """The three peers up at once, asked in turns the same fresh prompts (each its own
    sequence of them): {(streams, workload): {peer: [Round]}}."""
    servers = start_peers(gguf, threads)
    found: dict[tuple[int, str], dict[str, list[Round]]] = {}
    try:
        for server in servers.values():  # warm-up; vramgate's runner is up after it
            asyncio.run(round_of(server.port, GGUF_MODEL, Prompts(10_000).take("story", 1)))
        cpus = {name: cpu_of_tree(server.process.pid) for name, server in servers.items()}
        prompts = {name: Prompts() for name in servers}
        for count in streams:
            for workload in WORKLOADS:
                for _ in range(rounds_at(count, rounds)):
                    for name, server in servers.items():
                        bodies = prompts[name].take(workload, count)
                        done = asyncio.run(round_of(server.port, GGUF_MODEL, bodies, cpus[name]))
                        found.setdefault((count, workload), {}).setdefault(name, []).append(done)
                print_point(count, workload, found[(count, workload)], "llama.cpp defaults")
    finally:
        for server in servers.values():
            server.stop()
    return found


def render(found: dict[tuple[int, str], dict[str, list[Round]]], rounds: int, threads: int) -> str:
    """The comparison as a table: decode rates (first token to last, all streams), the
    best of the rounds and their median, the ratio of each to llama.cpp at its defaults,
    the ratio of tokens per CPU second, and the drafts accepted."""
    cores = f"{threads} thread" + ("s" if threads != 1 else "") if threads else "its default"
    lines = [
        f"SmolLM2-135M-Instruct Q4_1 GGUF, greedy, on this machine's CPU (llama.cpp threads: "
        f"{cores}); each request a prompt none was asked before; {rounds} rounds per point "
        f"({rounds_at(1, rounds)} at 1 stream, {rounds_at(32, rounds)} at 32 streams), "
        "the three servers up at once and asked in turns. Decode rate: tokens after each "
        "stream's first, from the first token of any stream to the last of any. Ratios to "
        "llama.cpp's own server at its defaults: of the best rounds, of the medians, and of "
        "tokens per CPU second of the server's processes (the work; other programs on a "
        "shared machine disturb it least).",
        "",
        "| streams | workload | server | best tok/s | median tok/s | ratio best | "
        "ratio median | ratio per CPU s | drafts accepted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (count, workload), runs in found.items():
        base = _figures(runs["llama.cpp defaults"])
        for name in PEERS:
            best, median, per_cpu = _figures(runs[name])
            drafted = sum(r.drafted for r in runs[name])
            accepted = sum(r.accepted for r in runs[name])
            share = f"{accepted / drafted:.2f} of {drafted}" if drafted else "-"
            cpu_ratio = f"{per_cpu / base[2]:.2f}" if base[2] and per_cpu else "-"
            lines.append(
                f"| {count} | {workload} | {name} | {best:.1f} | {median:.1f} | "
                f"{best / base[0]:.2f} | {median / base[1]:.2f} | {cpu_ratio} | {share} |"
            )
    return "\n".join(lines)


def _figures(rounds: list[Round]) -> tuple[float, float, float]:
    rates = [r.tokens_per_s for r in rounds]
    return (
        max(rates),
        statistics.median(rates),
        statistics.median(r.tokens_per_cpu_s for r in rounds),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="llama.cpp alone, each candidate")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--streams", default="1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llama.cpp's CPU threads (0: its default; 1 keeps a busy shared machine's "
        "noise from stalling both threads at every step)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # its servers stop with it
    names = args.candidates.split(",")
    streams = [int(s) for s in args.streams.split(",")]
    sweep(ensure_gguf(), names, streams, args.rounds, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
