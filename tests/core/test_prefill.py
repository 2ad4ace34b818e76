"""The running prefills in the wait a request is told: the clock's arithmetic on its own,
then a live server with the simulated model (its prefill a config choice: 5 ms a prompt
token) over real HTTP."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from app.config.settings import ModelSpec, SimulatedGeneration
from app.core.prefill import MIN_TOKENS, PrefillClock, Prefilling

PREFILL_MS = 5.0


def test_a_model_with_no_prefill_measured_is_told_as_long_again_as_it_has_run():
    clock = PrefillClock()
    assert clock.per_token_s("chat") is None
    assert clock.remaining_s([Prefilling("chat", 8000, 30.0)]) == 30.0
    assert clock.remaining_s([]) == 0.0


def test_a_learned_rate_gives_the_prompt_s_time_less_what_it_has_had():
    clock = PrefillClock()
    for seconds in (0.9, 1.0, 1.1):  # 100 tokens: 10 ms a token (the median)
        clock.record("chat", 100, seconds)
    assert clock.per_token_s("chat") == pytest.approx(0.010)
    assert clock.remaining_s([Prefilling("chat", 8000, 20.0)]) == pytest.approx(60.0)
    # two running at once share the device: their times add up
    two = [Prefilling("chat", 8000, 20.0), Prefilling("chat", 1000, 0.0)]
    assert clock.remaining_s(two) == pytest.approx(70.0)
    # past its estimate (a long prompt costs more than linearly): half what it has had
    assert clock.remaining_s([Prefilling("chat", 8000, 100.0)]) == pytest.approx(50.0)
    # another model's rate is its own
    assert clock.remaining_s([Prefilling("other", 8000, 4.0)]) == 4.0


def test_a_prefill_of_a_few_tokens_teaches_nothing():
    clock = PrefillClock()
    clock.record("chat", MIN_TOKENS - 1, 5.0)  # mostly the step's fixed cost
    clock.record("chat", 500, 0.0)
    assert clock.per_token_s("chat") is None
    clock.record("chat", MIN_TOKENS, 0.32)
    assert clock.per_token_s("chat") == pytest.approx(0.01)


def chat(words: int, word: str, **extra) -> dict:
    content = " ".join(f"{word}{i}" for i in range(words))
    return {"model": "sim", "messages": [{"role": "user", "content": content}], **extra}


def test_simulated_the_wait_told_while_a_long_prompt_prefills_includes_its_time(server_factory):
    generation = SimulatedGeneration(step_ms=5, prefill_ms_per_token=PREFILL_MS)
    model = ModelSpec(name="sim", kind="simulated", generation=generation)
    live = server_factory(device="simulated:8GiB", models=(model,))
    with live.client() as client:  # teaches the rate: a prompt of ~200 tokens, ~1 s
        taught = client.post("/v1/chat/completions", json=chat(200, "a", max_tokens=2))
        assert taught.status_code == 200, taught.text
        prompt = taught.json()["usage"]["prompt_tokens"]
        assert prompt >= 200
    idle = live.status()["queue"]["estimated_wait_s"]

    async def during_a_long_prefill() -> tuple[float, int, float]:
        """/status' wait while a prompt of ~800 tokens (~4 s) prefills; its first token's
        time from the request."""
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            body = chat(800, "b", max_tokens=2, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                sent = asyncio.get_running_loop().time()
                assert reply.status_code == 200
                status = (await client.get("/status")).json()
                lines = reply.aiter_lines()
                while not re.search(r'"content":"[^"]', await anext(lines)):  # a token
                    pass
                first = asyncio.get_running_loop().time() - sent
                return status["queue"]["estimated_wait_s"], status["queue"]["running"], first

    told, running, first_token_s = asyncio.run(during_a_long_prefill())
    assert idle < 0.5
    assert running == 1
    # ~4 s of prefill ahead (at least 5 ms a token, 800 tokens, less the moment it ran);
    # the gate's estimate alone told 0.025 s (an unseen bucket's run, halved)
    assert told > 1.5, f"told {told} s while a {first_token_s:.1f} s prefill ran"
    assert told < 3 * first_token_s  # and of its order
    assert live.status()["queue"]["estimated_wait_s"] < 0.5  # ended: nothing ahead
