"""A GGUF model's load planned from its facts: its KV pool (app.engines.llama_cpp.kv_pool)
and its layers' split between the device and the CPU (app.engines.llama_cpp.layer_split),
in the room the device has. Pure: facts and numbers in, a plan out.

The load itself (app.engines.llama_cpp.runner_model) and the answer to "does it fit"
before a model is downloaded (app.store.fits) both plan here, so that what is promised
before the download is what the load then does.

The pool is as big as the settings and the file want, shrunk to fit with every layer on
the device (down to the pool's floor) before any layer is left on the CPU; the layers'
bytes come from the file's geometry, corrected by what a load of the same settings
measured (`learned`: the bytes it measured for a number of cells and layers, or None).
A model that speculates (`draft_max`) also needs what its drafts add to the compute and
output buffers and its n-gram pool (app.engines.llama_cpp.layer_split.speculation_bytes),
and a draft model (`draft`) its own weights, KV and buffers beside its layers
(app.engines.llama_cpp.speculation.draft_model_bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.engines.gguf_facts import GgufFacts
from app.engines.llama_cpp.kv_pool import KvPool, plan_pool, slots_for
from app.engines.llama_cpp.layer_split import (
    LayerSplit,
    compute_bytes,
    kv_bytes,
    plan_split,
    speculation_bytes,
)
from app.engines.llama_cpp.speculation import draft_model_bytes

SLOT_CONTEXT = 4096  # a request's cells where neither the setting nor the file names any
Learned = Callable[[int, int], int | None]  # (cells, layers on the device) -> bytes


def nothing_learned(cells: int, layers: int) -> int | None:
    return None


@dataclass(frozen=True)
class LoadSettings:
    """What a model's config entry says about its load (ModelSpec's fields of the same
    meaning)."""

    kv_type: str = "f16"
    context: int | None = None  # a request's cells, at most (None: the file's context)
    parallel: int | None = None
    kv_budget: int | None = None  # the KV pool's bytes, at most
    gpu_layers: int | Literal["auto"] = "auto"
    draft_max: int = 0  # speculation's most tokens a draft proposes (0: it does not draft)
    draft_pool: int = 0  # its drafts' pool in host memory (ngram-mod's n-grams), bytes
    draft: GgufFacts | None = None  # its draft model's, where one drafts for it


@dataclass(frozen=True)
class LoadPlan:
    pool: KvPool
    split: LayerSplit


def plan_load(
    facts: GgufFacts,
    settings: LoadSettings,
    *,
    accelerator: bool,
    free_bytes: int | None,
    learned: Learned = nothing_learned,
) -> LoadPlan:
    """The pool and the split for a load on a device with `free_bytes` for it (None:
    room for anything); `accelerator`: a GPU (a simulated one too), else the CPU."""
    pool = plan_kv_pool(
        facts, settings, accelerator=accelerator, free_bytes=free_bytes, learned=learned
    )
    split = split_for(
        facts, settings, pool.cells, accelerator=accelerator, free_bytes=free_bytes, learned=learned
    )
    return LoadPlan(pool, split)


def plan_kv_pool(
    facts: GgufFacts,
    settings: LoadSettings,
    *,
    accelerator: bool,
    free_bytes: int | None,
    learned: Learned = nothing_learned,
) -> KvPool:
    """The KV pool: as big as the settings and the file want, shrunk to fit in
    `free_bytes` with every layer on the device (down to the pool's floor)."""
    budget = settings.kv_budget
    budget_cells = cells_bought(facts, settings, int(budget)) if budget is not None else None

    def fits(cells: int) -> bool:
        if free_bytes is None:
            return True
        split = split_for(
            facts, settings, cells, accelerator=accelerator, free_bytes=free_bytes, learned=learned
        )
        if split.accelerator and settings.gpu_layers == "auto":
            return split.on_device >= split.layers
        return split.device_bytes <= free_bytes

    return plan_pool(
        facts.context_length or SLOT_CONTEXT,
        context=settings.context,
        parallel=settings.parallel,
        budget_cells=budget_cells,
        fits=fits,
    )


def cells_bought(facts: GgufFacts, settings: LoadSettings, budget: int) -> int:
    """The most cells whose KV (`kv_bytes`, at the slots such a pool has) costs at most
    `budget` bytes: `budget` over a token's bytes in every layer, more where some layers
    hold only a sliding window's cells."""
    kv_type = settings.kv_type
    low = budget // max(facts.kv_bytes_per_token(kv_type), 1)
    if not facts.sliding:
        return low

    def costs(cells: int) -> int:
        return kv_bytes(facts, kv_type, cells, slots_for(cells, settings.parallel))

    whole = facts.layers - sum(facts.sliding)
    high = budget // max(facts.kv_bytes_per_token(kv_type, whole), 1) if whole else 2**24
    while low < high:  # costs grows with the cells: the last that fits
        middle = (low + high + 1) // 2
        low, high = (middle, high) if costs(middle) <= budget else (low, middle - 1)
    return low


def split_for(
    facts: GgufFacts,
    settings: LoadSettings,
    cells: int,
    *,
    accelerator: bool,
    free_bytes: int | None,
    learned: Learned = nothing_learned,
) -> LayerSplit:
    """The layers beside `cells` KV cells: from the GGUF's own geometry, scaled by what a
    load of the same settings measured once there is one."""

    slots = slots_for(cells, settings.parallel)
    drafts = speculation_bytes(facts, slots, settings.draft_max)
    # a draft model's bytes, where the model's layers are (draft_gpu_layers)
    draft = settings.draft
    model = draft_model_bytes(draft, settings.kv_type, cells, slots) if draft is not None else 0

    def plan(scale: float) -> LayerSplit:
        return plan_split(
            facts,
            kv_type=settings.kv_type,
            cells=cells,
            accelerator=accelerator,
            free_bytes=free_bytes,
            gpu_layers=settings.gpu_layers,
            scale=scale,
            drafting=drafts + model,
            drafting_host=drafts + settings.draft_pool if settings.draft_max > 0 else 0,
            slots=slots,
        )

    estimate = plan(1.0)
    measured = learned(cells, estimate.on_device)
    if measured is None or estimate.device_bytes <= 0:
        return estimate
    return plan(measured / estimate.device_bytes)


def host_bytes(facts: GgufFacts, kv_type: str, cells: int, on_device: int, slots: int = 1) -> int:
    """What a GPU split leaves in RAM: the first layers (those not on the device), their
    KV cells, the head unless every layer is on the device, and the compute buffer where
    none is (llama.cpp then computes on the CPU)."""
    on_cpu = facts.layers - max(0, min(on_device, facts.layers))
    if on_cpu <= 0:
        return 0
    blocks = sum(facts.layer_bytes[:on_cpu])
    kv = kv_bytes(facts, kv_type, cells, slots, range(on_cpu))
    compute = compute_bytes(facts, cells, slots) if on_device <= 0 else 0
    return blocks + facts.other_bytes + kv + compute
