"""Chats share the GPU: generations priced by their KV bytes, learned from chats that end
early. A simulated 8 GiB GPU with 4 slots (and 4 stream slots, the default); the
simulated model's config declares 768 KiB of KV per token and 64 MiB of prefill
activations, while it really holds 1 MiB per token and 100 MiB (the server must measure
that), and its answers end at random lengths."""

from __future__ import annotations

import asyncio
import time

import httpx

from app.config.settings import ModelSpec, SimulatedGeneration

MiB = 2**20
KiB = 2**10
GENERATION = SimulatedGeneration(
    kv_bytes_per_token=768 * KiB,
    fixed_bytes=64 * MiB,
    true_kv_bytes_per_token=1 * MiB,
    true_fixed_bytes=100 * MiB,
    step_ms=10,
    answer_tokens=(60, 200),
)


def chat(content: str, **extra) -> dict:
    return {"model": "sim", "messages": [{"role": "user", "content": content}], **extra}


async def stream_chat(client: httpx.AsyncClient, content: str) -> tuple[dict, float, str]:
    """One streamed chat: its response headers, when it ended, and its last data line."""
    async with client.stream("POST", "/v1/chat/completions", json=chat(content, stream=True)) as r:
        assert r.status_code == 200
        lines = [line async for line in r.aiter_lines() if line]
        return dict(r.headers), time.monotonic(), lines[-2]


def test_simulated_four_chats_run_together_and_an_embedding_is_not_held_behind_them(
    server_factory,
):
    model = ModelSpec(name="sim", kind="simulated", generation=GENERATION)
    live = server_factory(device="simulated:8GiB", max_concurrent=4, models=(model,))
    with live.client() as client:  # a short warm-up: two chats that end early
        for _ in range(2):
            warm = client.post("/v1/chat/completions", json=chat("warm up"))
            assert warm.json()["choices"][0]["finish_reason"] == "stop"

    running_seen: list[int] = []

    async def scenario() -> tuple[list[tuple[dict, float, str]], float, int]:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            chats = [
                asyncio.ensure_future(stream_chat(client, f"question {i} please")) for i in range(4)
            ]
            while len(running_seen) < 200 and not all(c.done() for c in chats):
                running_seen.append((await client.get("/status")).json()["queue"]["running"])
                if running_seen[-1] == 4:
                    break
                await asyncio.sleep(0.01)
            embedding = await client.post("/v1/embeddings", json={"model": "sim", "input": "hi"})
            embedded_at = time.monotonic()
            return await asyncio.gather(*chats), embedded_at, embedding.status_code

    chats, embedded_at, embedding_status = asyncio.run(scenario())

    assert max(running_seen) == 4, f"the chats never ran together: {running_seen}"
    assert embedding_status == 200
    # beside all four: the chats hold stream slots, the embedding takes a job slot
    assert embedded_at < min(ended for _, ended, _ in chats), "the embedding waited"
    prices = [int(headers["x-vramgate-price-bytes"]) for headers, _, _ in chats]
    assert all(4 * price <= 8 * 2**30 for price in prices)
    assert all(headers["x-vramgate-bucket"] == "p16t1024" for headers, _, _ in chats)
    status = live.status()
    (line,) = [p for p in status["models"][0]["prices"] if p["bucket"] == "p16"]
    # learned from chats that stopped early: the true bytes per token, not the declared
    assert line["per_token_bytes"] == 1 * MiB and line["source"] == "learned"
    assert line["fixed_bytes"] == 100 * MiB
    assert {headers["x-vramgate-price-source"] for headers, _, _ in chats} == {"learned"}
    assert live.service.device.oom_count == 0 and status["counters"]["ooms"] == 0
