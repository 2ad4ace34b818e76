"""A runner's KV cells as the pool the gate admits from: the planning (pure tables), then
the real SmolLM2 GGUF on a small pool flooded by 64 clients of mixed lengths: every
request is answered whole or refused with Retry-After, and none fails or waits inside
llama.cpp (a unified KV that overflows fails every request running on it)."""

from __future__ import annotations

import asyncio
import random
import re

import httpx
import pytest

from app.config.settings import ModelSpec
from app.engines.llama_cpp.kv_pool import FLOOR_CELLS, MAX_CELLS, KvPool, plan_pool, window_cells


def test_by_default_a_request_may_use_the_whole_trained_context():
    pool = plan_pool(8192, context=None, parallel=None, budget_cells=None)
    assert (pool.cells, pool.per_request, pool.slots) == (4 * 8192, 8192, 32)
    huge = plan_pool(131_072, context=None, parallel=None, budget_cells=None)
    assert huge.cells == MAX_CELLS and huge.per_request == MAX_CELLS  # capped by the pool


def test_the_settings_are_caps_and_both_together_are_the_old_split():
    assert plan_pool(8192, context=2048, parallel=None, budget_cells=None).cells == 4 * 2048
    old = plan_pool(8192, context=2048, parallel=4, budget_cells=None)
    assert (old.cells, old.per_request, old.slots) == (8192, 2048, 4)
    budget = plan_pool(8192, context=None, parallel=None, budget_cells=4096)
    assert (budget.cells, budget.per_request, budget.slots) == (4096, 4096, 32)


def test_a_pool_shrinks_to_fit_the_device_before_the_layers_do():
    fits_12k = plan_pool(
        8192, context=None, parallel=None, budget_cells=None, fits=lambda c: c <= 12_000
    )
    assert 11_744 <= fits_12k.cells <= 12_000 and fits_12k.per_request == 8192
    nothing = plan_pool(8192, context=None, parallel=None, budget_cells=None, fits=lambda c: False)
    assert nothing.cells == FLOOR_CELLS and nothing.per_request == FLOOR_CELLS


@pytest.mark.parametrize(
    ("cells", "slots", "window", "ubatch", "held"),
    [
        (32768, 32, 64, 512, 2560),  # logged: "creating SWA KV cache, size = 2560 cells"
        (8192, 32, 512, 512, 8192),  # windows of 32 slots hold more than the pool: the pool's
        (1000, 1, 64, 512, 768),  # 576, padded to 256
        (32768, 32, 0, 512, 32768),  # no layer slides
    ],
)
def test_a_sliding_windows_cells_are_a_window_a_slot_and_a_micro_batch(
    cells, slots, window, ubatch, held
):
    assert window_cells(cells, slots, window, ubatch) == held


@pytest.mark.parametrize(
    ("prompt", "tokens", "cells"), [(30, 8, 128), (30, 500, 530), (4000, 96, 4096)]
)
def test_a_request_takes_its_bound_and_at_least_its_share_of_the_slots(prompt, tokens, cells):
    assert KvPool(4096, 4096, 32).cells_for(prompt, tokens) == cells


@pytest.mark.slow
@pytest.mark.timeout(900)  # 64 answers on 2 cores: minutes on a busy machine
def test_64_clients_of_mixed_lengths_on_a_small_pool_are_answered_whole_or_refused(
    server_factory, smollm2_gguf
):
    spec = ModelSpec(
        name="smol", kind="generation", path=smollm2_gguf, kv_budget="90MiB", load="startup"
    )
    # nobody times out in the queue, however slow the machine: each is served or refused
    live = server_factory(device="cpu", models=(spec,), queue_timeout=600, max_queue=256)
    row = next(m for m in live.status()["models"] if m["name"] == "smol")
    assert row["kv_cells"] <= 4096 and row["context"] == row["kv_cells"]  # a small pool
    rng = random.Random(7)
    lengths = [rng.choice([4, 16, 64, 160]) for _ in range(64)]

    async def one(client: httpx.AsyncClient, index: int, max_tokens: int) -> tuple:
        body = {
            "model": "smol",
            "messages": [{"role": "user", "content": f"Story {index}: once upon a time"}],
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "seed": index,
        }
        answer = await client.post("/v1/chat/completions", json=body)
        return max_tokens, answer

    async def flood() -> list[tuple]:
        async with httpx.AsyncClient(base_url=live.url, timeout=900) as client:
            return await asyncio.gather(*(one(client, i, n) for i, n in enumerate(lengths)))

    answers = asyncio.run(flood())
    served = 0
    for max_tokens, answer in answers:
        if answer.status_code == 503:  # refused, saying when to come back
            assert "retry-after" in answer.headers, answer.text
            continue
        assert answer.status_code == 200, answer.text
        choice, usage = answer.json()["choices"][0], answer.json()["usage"]
        # never cut short: it stopped by itself, or at its own bound
        assert choice["finish_reason"] == "stop" or usage["completion_tokens"] == max_tokens
        served += 1
    assert served >= 32
    handler = live.service.registry.entries["smol"].handler
    text = asyncio.run(handler._client.text("/metrics"))  # the runner's own figures
    deferred = re.search(r"^llamacpp:requests_deferred (\S+)$", text, re.MULTILINE)
    assert deferred is not None and float(deferred.group(1)) == 0  # none waited in llama.cpp
