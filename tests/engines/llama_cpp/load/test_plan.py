"""A load's plan for a model whose layers attend to a sliding window (Gemma 3's: five of
each six): its KV counts those layers at llama.cpp's window cells
(app.engines.llama_cpp.kv_pool.window_cells), in the pool's bytes, a budget's cells and a
split's host and device shares alike."""

from __future__ import annotations

from dataclasses import replace

from app.engines.gguf_facts import GgufFacts
from app.engines.llama_cpp.layer_split import kv_bytes
from app.engines.llama_cpp.load.plan import LoadSettings, host_bytes, plan_kv_pool, plan_load

MiB = 2**20
KV_WIDTH = 2048  # 4 KV heads of 256, keys and values: 4 KiB a cell a layer at f16
GEMMA = GgufFacts(
    architecture="gemma3",
    layers=6,
    context_length=8192,
    width=256,
    kv_width=KV_WIDTH,
    layer_bytes=(MiB,) * 6,
    other_bytes=MiB,
    chat_template=None,
    file_bytes=7 * MiB,
    sliding_window=64,
    sliding=(True,) * 5 + (False,),
)
EVERY_LAYER = replace(GEMMA, sliding_window=0, sliding=())


def test_the_sliding_layers_hold_a_window_a_slot_in_the_pools_bytes():
    """8,192 tokens a request: 32,768 cells in 32 slots; the sliding layers 2,560 each."""
    plan = plan_load(GEMMA, LoadSettings(context=8192), accelerator=False, free_bytes=None)
    assert (plan.pool.cells, plan.pool.slots) == (32768, 32)
    assert kv_bytes(GEMMA, "f16", 32768, 32) == 4 * 1024 * (32768 + 5 * 2560)
    whole = plan_load(EVERY_LAYER, LoadSettings(context=8192), accelerator=False, free_bytes=None)
    saved = 4 * 1024 * 5 * (32768 - 2560)
    window_mask = 512 * 2560 * 2  # the sliding cache's own, in the compute buffer
    assert whole.split.device_bytes - plan.split.device_bytes == saved - window_mask


def test_a_kv_budget_buys_more_cells_where_layers_slide():
    budget = 100 * MiB
    settings = LoadSettings(kv_budget=budget)
    pool = plan_kv_pool(GEMMA, settings, accelerator=False, free_bytes=None)
    bought = kv_bytes(GEMMA, "f16", pool.cells, pool.slots)
    assert bought <= budget < kv_bytes(GEMMA, "f16", pool.cells + 1, pool.slots)
    every = plan_kv_pool(EVERY_LAYER, settings, accelerator=False, free_bytes=None)
    assert every.cells == budget // (6 * 4 * 1024) < pool.cells


def test_the_layers_left_on_the_cpu_hold_their_own_cells():
    """llama.cpp keeps the first layers on the CPU: here the first three, all sliding."""
    held = host_bytes(GEMMA, "f16", 32768, 3, slots=32)
    assert held == 3 * MiB + MiB + 3 * 4 * 1024 * 2560
    assert host_bytes(EVERY_LAYER, "f16", 32768, 3, slots=32) == 4 * MiB + 3 * 4 * 1024 * 32768
