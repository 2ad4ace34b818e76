"""An agent's conversation, side by side in one run, with and without the prefix cache:

    python bench/agent_turns.py [--turns 10] [--write-readme]

A coding agent resends its whole conversation every turn: a ~2,000-token system prompt,
then the history, growing by a question and an answer a turn. SmolLM2-135M-Instruct
answers 10 such turns (streamed, greedy, 32 tokens), on vramgate's torch engine and on
its llama.cpp engine (the same model as a GGUF), each with its prefix cache on and off,
one server at a time so they never share the cores. Printed per server: turn 1's time
to first token (TTFT), the median of turns 2-10, their ratio, the prompt tokens the
last turn took from the cache, and what /status says the cache holds.

Then the cache gives way: on a simulated 2 GiB GPU a conversation fills the cache, and
48 clients send distinct 300-word prompts that need its bytes. Printed: answers by
status, out-of-memory errors, and the cache before and after.
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

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.generation import MODEL, ensure_gguf, ensure_model  # noqa: E402
from bench.run import start_vramgate, write_readme  # noqa: E402

TOPICS = ("naming", "errors", "tests", "types", "imports", "logging", "docs", "commits")


def system_prompt() -> str:
    """About 2,000 tokens of a coding agent's rules."""
    rules = []
    for i in range(72):
        topic = TOPICS[i % len(TOPICS)]
        rules.append(
            f"Rule {i + 1} ({topic}): when you change code about {topic}, read the file "
            f"first, keep the change small, and explain it in one sentence."
        )
    return "You are a careful coding assistant.\n" + "\n".join(rules)


@dataclass
class Turns:
    ttft_ms: list[float]
    cached: list[int]
    prompt: list[int]
    cache: dict


def config_for(path: Path, engine: str, cached: bool) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    config = folder / "config.toml"
    config.write_text(
        f'[[models]]\nname = "{MODEL}"\nkind = "generation"\npath = {json.dumps(str(path))}\n'
        f'engine = "{engine}"\ncontext_length = 8192\nparallel = 1\n'
        f"prefix_cache = {'true' if cached else 'false'}\n"
    )
    return config


async def turn(port: int, messages: list[dict], tokens: int) -> tuple[float, str, dict]:
    """One streamed turn: TTFT in ms, the answer, the usage."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first, text, usage = None, [], {}
    async with httpx.AsyncClient(timeout=600) as client:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with client.stream("POST", url, json=body) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: ") :])
                choices = chunk.get("choices") or []
                if choices and choices[0]["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(choices[0]["delta"]["content"])
                usage = chunk.get("usage") or usage
    return ((first or time.perf_counter()) - started) * 1000, "".join(text), usage


def conversation(path: Path, engine: str, cached: bool, turns: int, tokens: int) -> Turns:
    server = start_vramgate(
        config_for(path, engine, cached), MODEL, "/v1/chat/completions", ("--queue-timeout", "600")
    )
    try:
        messages = [{"role": "system", "content": system_prompt()}]
        found = Turns([], [], [], {})
        for index in range(turns):
            messages.append({"role": "user", "content": f"Question {index + 1}: what next?"})
            ttft, answer, usage = asyncio.run(turn(server.port, messages, tokens))
            messages.append({"role": "assistant", "content": answer})
            found.ttft_ms.append(ttft)
            found.prompt.append(int(usage.get("prompt_tokens", 0)))
            found.cached.append(int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)))
        status = httpx.get(f"http://127.0.0.1:{server.port}/status", timeout=30).json()
        found.cache = status["prefix_cache"]
        return found
    finally:
        server.stop()


def render_turns(rows: dict[str, Turns]) -> str:
    lines = [
        "| server | turn 1 TTFT ms | turns 2-10 TTFT ms (median) | ratio | last turn: prompt / cached tokens | cache in /status |",  # noqa: E501
        "|---|---|---|---|---|---|",
    ]
    for name, found in rows.items():
        later = statistics.median(found.ttft_ms[1:])
        cache = found.cache
        held = f"{cache['bytes'] / 2**20:.1f} MiB, {cache['entries']} entries, {cache['hits']} hits"
        lines.append(
            f"| {name} | {found.ttft_ms[0]:.0f} | {later:.0f} | {later / found.ttft_ms[0]:.2f} "
            f"| {found.prompt[-1]} / {found.cached[-1]} | {held} |"
        )
    return "\n".join(lines)


SIMULATED = """
device = "simulated:2GiB"
max_queue = 1000

[[models]]
name = "sim"
kind = "simulated"
buckets = [{size = 4096, bytes = "1MiB", run_ms = 1}]
generation = { kv_bytes_per_token = "1MiB", fixed_bytes = "32MiB", true_kv_bytes_per_token = "1MiB", true_fixed_bytes = "32MiB", step_ms = 2, answer_tokens = [8, 16] }
"""  # noqa: E501


def flood() -> str:
    """A conversation fills the cache on a simulated GPU; a flood of distinct prompts
    must take its bytes."""
    config = Path(tempfile.mkdtemp(prefix="bench-agent-sim-")) / "config.toml"
    config.write_text(SIMULATED)
    server = start_vramgate(config, "sim", "/v1/chat/completions", ("--device", "simulated:2GiB"))
    url = f"http://127.0.0.1:{server.port}"
    try:
        history = " ".join(f"w{i}" for i in range(400))
        for index in range(4):
            body = {"model": "sim", "messages": [{"role": "user", "content": history}]}
            answer = httpx.post(url + "/v1/chat/completions", json={**body, "max_tokens": 16})
            history += " " + answer.json()["choices"][0]["message"]["content"] + f" next{index}"
        before = httpx.get(url + "/status").json()["prefix_cache"]

        async def clients() -> list[int]:
            async with httpx.AsyncClient(base_url=url, timeout=300) as client:

                async def one(index: int) -> int:
                    words = " ".join(f"f{index}x{i}" for i in range(300))
                    body = {"model": "sim", "prompt": words, "max_tokens": 16}
                    return (await client.post("/v1/completions", json=body)).status_code

                return list(await asyncio.gather(*(one(i) for i in range(48))))

        codes = asyncio.run(clients())
        status = httpx.get(url + "/status").json()
    finally:
        server.stop()
    after = status["prefix_cache"]
    answered = {code: codes.count(code) for code in sorted(set(codes))}
    return (
        f"Simulated 2 GiB GPU: cache before the flood {before['bytes'] / 2**20:.0f} MiB "
        f"({before['entries']} entries); 48 distinct 300-word prompts answered {answered}; "
        f"out-of-memory errors {status['device']['ooms']}; entries evicted "
        f"{after['evicted']}; cache after {after['bytes'] / 2**20:.0f} MiB."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    folder, gguf = ensure_model(), ensure_gguf()
    rows = {}
    for engine, path in (("torch", folder), ("llama.cpp", gguf)):
        for cached in (True, False):
            name = f"vramgate {engine}, prefix cache {'on' if cached else 'off'}"
            rows[name] = conversation(path, engine, cached, args.turns, args.tokens)
            print(name, [round(t) for t in rows[name].ttft_ms], flush=True)
    text = render_turns(rows) + "\n\n" + flood()
    print(text)
    if args.write_readme:
        write_readme(text, "agent", "bench/agent_turns.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
