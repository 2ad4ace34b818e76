"""The background reserve on a llama.cpp runner's KV pool (app.sched.gate): background
streams fill the SmolLM2 GGUF's pool only up to the cells of a typical interactive
request, so a person's chat that arrives then is admitted at once, beside them (nothing
running is stopped for it). Before the reserve, four background streams took the whole
pool and the chat waited for one of them to end."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.engines.llama_cpp.pools import STORY, pool_of
from tests.support.live import live_server, make_settings, wait_until

pytestmark = pytest.mark.slow

CELLS = 1200
INTERACTIVE = 240  # cells of the chats a person sends (prompt and answer bound)
BACKGROUND = 300  # cells of each background stream: four would fill the pool


def chat(tokens: int, **extra) -> dict:
    return {"model": "smol", "messages": STORY, "max_tokens": tokens, "temperature": 0, **extra}


@pytest.mark.timeout(900)
def test_a_person_s_chat_is_admitted_at_once_while_background_streams_fill_the_rest(
    smollm2_gguf, tmp_path
):
    settings = make_settings(
        tmp_path,
        device="cpu",
        models=(pool_of(smollm2_gguf, CELLS),),
        queue_timeout=600,
        # as on a GPU: on a CPU, background work runs one at a time for 30 s after a
        # person's (tests/sched/test_gate.py), which would leave no flood to reserve from
        background_single_after_s=0,
    )
    with live_server(settings) as live:
        warm = httpx.post(live.url + "/v1/chat/completions", json=chat(8), timeout=600)
        prompt = warm.json()["usage"]["prompt_tokens"]
        # a person's chat teaches the reserve its size: INTERACTIVE cells
        taught = httpx.post(
            live.url + "/v1/chat/completions", json=chat(INTERACTIVE - prompt), timeout=600
        )
        assert taught.headers["x-vramgate-priority"] == "interactive"

        async def scenario() -> tuple[float, list[float], dict]:
            ended: list[float] = []
            async with httpx.AsyncClient(base_url=live.url, timeout=600) as client:

                async def background() -> None:
                    body = chat(BACKGROUND - prompt, service_tier="flex", stream=True)
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        assert r.headers["x-vramgate-priority"] == "background"
                        async for _ in r.aiter_lines():
                            pass
                    ended.append(time.monotonic())

                flood = [asyncio.ensure_future(background()) for _ in range(4)]

                def started() -> bool:
                    return httpx.get(live.url + "/status").json()["queue"]["running"] >= 3

                await asyncio.to_thread(wait_until, started, 300, "the background streams")
                body = chat(INTERACTIVE - prompt, stream=True)
                async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                    admitted = time.monotonic()  # its headers: it holds its cells
                    status = (await client.get("/status")).json()
                    async for _ in reply.aiter_lines():
                        pass
                await asyncio.gather(*flood)
            return admitted, ended, status

        admitted, ended, status = asyncio.run(scenario())
    # the moment the chat held its cells: three background streams ran beside it and the
    # fourth waited (with the reserve removed, the four took the pool and all ended, at
    # the same step, before the chat was admitted: /status read 1 running)
    queue = status["queue"]
    assert queue["running"] == 4 and queue["by_class"]["background"]["waiting"] == 1
    assert all(end > admitted for end in ended)
