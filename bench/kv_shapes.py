"""Where the llama.cpp engine's 32-stream time goes, shape by shape, in one run:

    python bench/kv_shapes.py [--streams 32] [--tokens 64] [--write-readme]

The same GGUF (SmolLM2-135M-Instruct Q4_1) and streaming client as bench/generation.py's
engines table, one server at a time: llama.cpp alone with a split KV (32 slots, n_ctx
8,192: each slot's attention spans its own 256 cells), alone with one unified pool of
vramgate's size (every slot draws from it; attention spans every cell in use), alone
with exactly the settings vramgate's runner gets by default (the unified pool, a request
up to the trained context, idle slots' prompts moved to a host cache), the same without
that host cache, and vramgate itself. Each: a warm-up, then the best of three rounds of
`--streams` concurrent streams; ratios to the split KV.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.generation import Figures, measure_streams  # noqa: E402
from bench.gguf_model import GGUF_MODEL, ensure_gguf, llama_alone  # noqa: E402
from bench.run import start_vramgate, write_readme  # noqa: E402

SPLIT_CTX = 8192  # llama.cpp alone: n_ctx 8,192 split between its slots (the engines table)


def vramgate_runner_settings(gguf: Path) -> dict:
    """The runner settings vramgate's defaults give this file on this machine's CPU."""
    from app.config.settings import ModelSpec
    from app.devices.cpu import CpuDevice
    from app.engines.llama_cpp.generation import LlamaCppHandler

    device = CpuDevice()
    model = LlamaCppHandler(ModelSpec(name=GGUF_MODEL, kind="generation", path=gguf))
    pool = model.planned_pool(device)
    settings = model.runner_config(pool, model.planned_split(device))
    settings.pop("model")
    return settings


def rounds(port: int, streams: int, tokens: int) -> Figures:
    asyncio.run(measure_streams(port, streams, tokens, model=GGUF_MODEL))  # warm-up
    runs = [asyncio.run(measure_streams(port, streams, tokens, model=GGUF_MODEL)) for _ in "123"]
    best = max(runs, key=lambda f: f.tokens_per_s)
    return Figures(min(r.ttft_ms for r in runs), best.ttft_max_ms, best.tokens_per_s, best.tokens)


def measure(gguf: Path, streams: int, tokens: int) -> tuple[dict[str, Figures], dict]:
    runner = vramgate_runner_settings(gguf)
    pool, slots = int(runner["n_ctx"]), int(runner["parallel"])
    no_host_cache = {**runner, "cache_idle_slots": False, "cache_ram_mib": 0}
    shapes = {
        f"llama.cpp alone, split KV ({slots} slots of {SPLIT_CTX // slots} cells)": (
            "--context", str(SPLIT_CTX // slots), "--parallel", str(slots)),
        f"llama.cpp alone, one unified pool of {pool:,} cells": (
            "--context", str(pool // slots), "--parallel", str(slots), "--unified"),
        "llama.cpp alone, vramgate's runner settings": ("--runner", json.dumps(runner)),
        "llama.cpp alone, the same without the host prompt cache": (
            "--runner", json.dumps(no_host_cache)),
    }  # fmt: skip
    found = {}
    for i, (name, args) in enumerate(shapes.items()):
        server = llama_alone(gguf, f"kv-shape-{i}", *args)
        try:
            found[name] = rounds(server.port, streams, tokens)
        finally:
            server.stop()
    config = Path(tempfile.mkdtemp(prefix="bench-config-")) / "config.toml"
    config.write_text(
        f'[[models]]\nname = "{GGUF_MODEL}"\nkind = "generation"\n'
        f'path = {json.dumps(str(gguf))}\nengine = "llama.cpp"\n'
    )
    server = start_vramgate(config, GGUF_MODEL, "/v1/chat/completions", ("--queue-timeout", "600"))
    try:
        found["vramgate, llama.cpp engine (no per-model settings)"] = rounds(
            server.port, streams, tokens
        )
    finally:
        server.stop()
    return found, runner


def render(found: dict[str, Figures], runner: dict, streams: int, tokens: int) -> str:
    base = next(iter(found.values())).tokens_per_s
    shown = {k: runner[k] for k in ("n_ctx", "parallel", "per_slot", "cache_idle_slots")}
    lines = [
        f"{streams} streams of {tokens} tokens, greedy; best of three rounds after a warm-up. "
        f"vramgate's runner settings: `{json.dumps(shown)}`.",
        "",
        "| server | TTFT p50 ms | last first token ms | tokens/s | ratio to split |",
        "|---|---|---|---|---|",
    ]
    for name, f in found.items():
        lines.append(
            f"| {name} | {f.ttft_ms:.0f} | {f.ttft_max_ms:.0f} | {f.tokens_per_s:.1f} "
            f"| {f.tokens_per_s / base:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    text = render(*measure(ensure_gguf(), args.streams, args.tokens), args.streams, args.tokens)
    print(text)
    if args.write_readme:
        write_readme(text, "kv-shapes", "bench/kv_shapes.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
