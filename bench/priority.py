"""A person's chats while a batch job runs, side by side in one run, with and without
priority classes:

    python bench/priority.py [--chats 6] [--write-readme]

One vramgate on the CPU serves the embedded all-MiniLM-L6-v2 and SmolLM2-135M-Instruct's
GGUF (the llama.cpp engine), on its defaults. The flood is a fixed amount of work: a
document of 2,000 chunks embedded 64 at a time (4 requests at once), as Open WebUI
indexes an upload, and 48 generations of 64 tokens, 8 at a time, as its title, tag and
follow-up requests. Measured, one phase after another:

1. idle: a person's chats alone, one every 4 s (a fresh ~300-token question, 32 tokens
   of answer, streamed): time to first token (TTFT) and to the last;
2. the flood alone, 31 s after the last chat (past `background_single_after_s`, which
   holds background work to one request at a time on a CPU after a person's): its time;
3. the flood marked `flex` (the generations through the `task` name the config maps to
   background, as an Open WebUI task model would be; the chunks background because
   each request holds at least `background_inputs`), with the chats beside it;
4. the same flood unmarked on a server with `background_inputs = 0` (today's first-come
   queue: everything interactive), with the chats beside it;
5. idle again, at the end: the machine's noise between the phases.

Printed: the chats' TTFT (median, worst) in each phase and its ratio to idle; the
flood's throughput beside the chats against the flood alone (its time alone over its
time beside them), and the same over the time the chats leave it (its time beside them
less the chats' own time on the idle server): a flood that wastes none of the gaps
scores 1.00 there. Figures vary between runs on this shared machine: read the ratios
within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.generation import MODEL, ensure_gguf  # noqa: E402
from bench.run import start_vramgate, write_readme  # noqa: E402

EMBEDDER = "all-MiniLM-L6-v2"
CHUNKS = 2000
CHUNK_BATCH = 64
EMBED_CLIENTS = 4
TASKS = 8  # generations at once in the flood
TASK_ROUNDS = 6  # generations of each of them: 48 in all
TASK_TOKENS = 64
CHAT_TOKENS = 32
CHAT_EVERY_S = 4.0


def config(gguf: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="bench-priority-"))
    path = folder / "config.toml"
    path.write_text(
        f'[[models]]\nname = "{EMBEDDER}"\nkind = "embedding"\n\n'
        f'[[models]]\nname = "{MODEL}"\nkind = "generation"\npath = {json.dumps(str(gguf))}\n'
        f'load = "startup"\n\n[model_aliases]\ntask = "{MODEL}"\n\n'
        '[priorities]\ntask = "background"\n'
    )
    return path


def chunk(i: int) -> str:
    return (
        f"Section {i} of the handbook explains how the team reviews a change: who reads it, "
        f"what they check first, and how a disagreement about part {i % 17} is settled."
    )


def question(i: int) -> str:
    """About 300 tokens, different from its first word on (no cached prefix)."""
    facts = " ".join(
        f"Fact {j}: the {['red', 'blue', 'green'][j % 3]} box {i} holds {j * 7 + i} marbles."
        for j in range(22)
    )
    return f"Question {i}. {facts} Which box holds the most marbles, and why?"


@dataclass
class Flood:
    chunks: int = 0
    generations: int = 0
    errors: int = 0
    seconds: float = 0.0


@dataclass
class Chats:
    ttft_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    classes: set[str] = field(default_factory=set)


async def one_chat(client: httpx.AsyncClient, i: int, chats: Chats) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question(i)}],
        "max_tokens": CHAT_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    sent = time.monotonic()
    first = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        chats.classes.add(reply.headers.get("x-vramgate-priority", "?"))
        async for line in reply.aiter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.monotonic() - sent
    chats.ttft_s.append(first if first is not None else time.monotonic() - sent)
    chats.total_s.append(time.monotonic() - sent)


async def chats_every(client: httpx.AsyncClient, count: int, offset: int) -> Chats:
    chats = Chats()
    for i in range(count):
        started = time.monotonic()
        await one_chat(client, offset + i, chats)
        await asyncio.sleep(max(0.0, CHAT_EVERY_S - (time.monotonic() - started)))
    return chats


async def flood(client: httpx.AsyncClient, marked: bool) -> Flood:
    """The document's chunks and the task generations, once each: the flood's time is
    until both are done."""
    result = Flood()
    pending = list(range(0, CHUNKS, CHUNK_BATCH))
    started = time.monotonic()

    async def embedder() -> None:
        while pending:
            start = pending.pop(0)
            inputs = [chunk(i) for i in range(start, min(start + CHUNK_BATCH, CHUNKS))]
            reply = await client.post("/v1/embeddings", json={"model": EMBEDDER, "input": inputs})
            if reply.status_code == 200:
                result.chunks += len(inputs)
            else:
                result.errors += 1

    async def tasker(k: int) -> None:
        for n in range(1, TASK_ROUNDS + 1):
            body = {
                "model": "task" if marked else MODEL,
                "messages": [{"role": "user", "content": f"Title {k}-{n}: {chunk(k * 100 + n)}"}],
                "max_tokens": TASK_TOKENS,
                "temperature": 0,
            }
            reply = await client.post("/v1/chat/completions", json=body)
            if reply.status_code == 200:
                result.generations += 1
            else:
                result.errors += 1

    tasks = [asyncio.ensure_future(tasker(k)) for k in range(TASKS)]
    await asyncio.gather(*(embedder() for _ in range(EMBED_CLIENTS)), *tasks)
    result.seconds = time.monotonic() - started
    return result


async def phase(
    url: str, chats: int, offset: int, with_flood: bool, marked: bool
) -> tuple[Chats | None, Flood | None]:
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:
        flooding = asyncio.ensure_future(flood(client, marked)) if with_flood else None
        chatted = await chats_every(client, chats, offset) if chats else None
        done = await flooding if flooding is not None else None
        return chatted, done


def figures(chats: Chats | None) -> str:
    if chats is None:
        return "-"
    return (
        f"TTFT median {statistics.median(chats.ttft_s):.2f} s, worst {max(chats.ttft_s):.2f} s; "
        f"answer median {statistics.median(chats.total_s):.2f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=6, help="a person's chats per phase")
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    gguf = ensure_gguf()
    rows: list[tuple[str, Chats | None, Flood | None]] = []

    def measure(name: str, *how: object) -> None:
        rows.append((name, *asyncio.run(phase(*how))))  # type: ignore[arg-type]
        print(f"{name}: {figures(rows[-1][1])}; flood {rows[-1][2]}", flush=True)

    wait = ("--queue-timeout", "900")
    server = start_vramgate(config(gguf), MODEL, "/v1/chat/completions", wait)
    try:
        asyncio.run(phase(server.url, 2, 900, False, False))  # warm-up: both models, caches
        measure("idle", server.url, args.chats, 0, False, False)
        time.sleep(31)  # a person gone for background_single_after_s: the flood alone
        measure("flood alone", server.url, 0, 0, True, True)
        measure("classes", server.url, args.chats, 100, True, True)
    finally:
        server.stop()
    first_come = (*wait, "--background-inputs", "0")
    server = start_vramgate(config(gguf), MODEL, "/v1/chat/completions", first_come)
    try:
        asyncio.run(phase(server.url, 2, 950, False, False))
        measure("first-come", server.url, args.chats, 200, True, False)
        measure("idle, at the end", server.url, args.chats, 300, False, False)
    finally:
        server.stop()
    table = render(rows)
    print(table)
    if args.write_readme:
        write_readme(table, "priority", "bench/priority.py")
    return 0


def render(rows: list[tuple[str, Chats | None, Flood | None]]) -> str:
    """The table: each phase's chats against the first idle phase, its flood against
    the flood alone (over its whole time, and over the time the chats leave it)."""
    idle = rows[0][1]
    alone = next(done for _, chats, done in rows if done is not None and chats is None)
    assert idle is not None
    idle_ttft = statistics.median(idle.ttft_s)
    chat_s = statistics.median(idle.total_s)  # one chat's own time on the idle server
    lines = [
        "| phase | chats' TTFT median (s) | worst (s) | TTFT / idle | chat classes | "
        "flood (s) | flood / alone | in the chats' gaps | flood errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, chats, done in rows:
        ttft = statistics.median(chats.ttft_s) if chats else None
        worst = max(chats.ttft_s) if chats else None
        share = alone.seconds / done.seconds if done else None
        gaps = None
        if done and chats:
            gaps = alone.seconds / max(done.seconds - chat_s * len(chats.ttft_s), 1e-9)
        lines.append(
            f"| {name} | {_f(ttft)} | {_f(worst)} | {_f(ttft / idle_ttft if ttft else None)} | "
            f"{','.join(sorted(chats.classes)) if chats else '-'} | "
            f"{_f(done.seconds if done else None, 1)} | {_f(share)} | {_f(gaps)} | "
            f"{done.errors if done else '-'} |"
        )
    return "\n".join(lines)


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    raise SystemExit(main())
