"""How many of a GGUF model's layers go to the GPU: all when they fit, else the layers
that fit beside the KV cells and compute buffers, the rest on the CPU (as Ollama and LM
Studio split a model larger than VRAM). Pure: numbers in, a split out.

llama.cpp offloads the last `n` repeating layers (`n_gpu_layers`), and with all of them
the output head (`n_gpu_layers` = layers + 1); each offloaded layer also holds its KV
cells on the GPU. The compute buffer is priced from the model's width and the pool's
cells before it is measured: llama.cpp sizes it for one micro-batch (512 tokens) of
activations and the attention's mask, a row a token and a column a cell of each KV
cache. A layer that attends to a sliding window holds its window's cells, not the
pool's (`kv_bytes`), in a cache with a mask of its own.

A runner that speculates verifies each slot's draft in one batch, every drafted token an
output: llama.cpp then reserves its compute buffer for a micro-batch of that many rows
of logits (up to the whole micro-batch), and its output buffer grows to hold them
(`speculation_bytes`); the n-gram pool is apart, in host memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.engines.gguf_facts import GgufFacts
from app.engines.llama_cpp.kv_pool import window_cells

UBATCH = 512  # llama.cpp's default micro-batch (n_ubatch), what its compute buffer holds
ACTIVATION_FLOATS = 16  # float32 activations per width element per token, a margin on it
MASK_BYTES = 2  # the attention mask's element (f16, as flash attention takes it)


@dataclass(frozen=True)
class LayerSplit:
    layers: int  # the model's repeating layers
    on_device: int  # of those, on the GPU
    device_bytes: int  # what the split holds on the device (CPU: all of it, in RAM)
    accelerator: bool

    @property
    def gpu_layers_arg(self) -> int:
        """llama.cpp's n_gpu_layers for this split (layers + 1 also takes the head)."""
        if not self.accelerator:
            return 0
        return self.layers + 1 if self.on_device >= self.layers else self.on_device

    @property
    def gpu_share(self) -> float:
        return self.on_device / self.layers if self.layers else 1.0

    def describe(self) -> str:
        """As Ollama's `ps` says it: "100% GPU", "100% CPU" or "48%/52% CPU/GPU"."""
        if not self.accelerator or self.on_device == 0:
            return "100% CPU"
        if self.on_device >= self.layers:
            return "100% GPU"
        gpu = round(100 * self.gpu_share)
        return f"{100 - gpu}%/{gpu}% CPU/GPU"


def compute_bytes(facts: GgufFacts, cells: int = 0, slots: int = 1) -> int:
    """A prior for the compute buffer beside a pool of `cells` cells in `slots` slots: a
    micro-batch's activations, from the width, and the attention's masks, a micro-batch
    of rows over each KV cache's cells (the sliding layers' `window_cells` too). The
    masks as llama.cpp's CPU log shows them, 1 KiB a cell: SmolLM2-135M 22.64 / 30.64 MiB
    at 8,192 / 16,384 cells; a random Gemma 3 (width 64, a window cache of 2,560 cells
    beside) 13.15 / 21.15 / 37.15 MiB at 8,192 / 16,384 / 32,768. Priced: SmolLM2 26.0
    MiB at 8,192 cells (18.0 of activations), that Gemma 3 36.5 MiB at 32,768."""
    ubatch = min(UBATCH, cells) if cells > 0 else UBATCH
    window = window_cells(cells, slots, facts.sliding_window, ubatch) if facts.sliding else 0
    masks = ubatch * (max(cells, 0) + window) * MASK_BYTES
    return UBATCH * max(facts.width, 1) * 4 * ACTIVATION_FLOATS + masks


def kv_bytes(
    facts: GgufFacts, kv_type: str, cells: int, slots: int, layers: range | None = None
) -> int:
    """The KV cache's bytes in `layers` (all, by default) of a pool of `cells` cells and
    `slots` slots as the runner asks llama.cpp for it (a unified KV, micro-batches of
    `UBATCH` tokens at most the pool's): a sliding-window layer at its window's cells
    (`window_cells`). What the load plans, and what fits answers."""
    window = window_cells(cells, slots, facts.sliding_window, min(UBATCH, cells))
    return facts.kv_bytes(kv_type, cells, window, layers)


def speculation_bytes(facts: GgufFacts, slots: int, draft_max: int) -> int:
    """What drafts of up to `draft_max` tokens in each of `slots` slots add to the compute
    buffer, and again to the output buffer: the rows of logits (float32, a row of the
    vocabulary each) of a micro-batch in which every slot outputs its draft and the
    token before it, beyond the one row a slot a batch without drafts outputs. Measured
    on SmolLM2-135M (49,152 tokens; llama.cpp's log, n_ctx 8,192, drafts of 24): compute
    22.64 MiB without drafts; with them 22.64 / 32.39 / 51.14 / 88.64 / 109.64 MiB at
    1 / 4 / 8 / 16 / 32 slots (n_outputs_max 25 / 100 / 200 / 400 / 512), 0.1875 MiB a row
    beyond a constant; this plans 22.5 / 36.0 / 54.0 / 90.0 / 108.0 beside the 18.0
    priced without (8.0 more since the masks are priced). 0 where the GGUF does not say
    its vocabulary's size."""
    if draft_max <= 0 or slots <= 0:
        return 0
    rows = min(slots * (draft_max + 1), UBATCH) - min(slots, UBATCH)
    return max(rows, 0) * facts.vocab * 4


def bytes_on_device(
    facts: GgufFacts,
    on_device: int,
    kv_type: str,
    cells: int,
    drafting: int = 0,
    slots: int = 1,
) -> int:
    """The device bytes of `on_device` layers (the last ones), their KV cells (of a pool
    of `slots` slots), the head when every layer is there, and the compute buffer
    (`drafting`: what speculation adds to it, `speculation_bytes`)."""
    if on_device <= 0:
        return 0
    blocks = sum(facts.layer_bytes[facts.layers - on_device :])
    head = facts.other_bytes if on_device >= facts.layers else 0
    kv = kv_bytes(facts, kv_type, cells, slots, range(facts.layers - on_device, facts.layers))
    return blocks + head + kv + compute_bytes(facts, cells, slots) + drafting


def plan_split(
    facts: GgufFacts,
    *,
    kv_type: str,
    cells: int,
    accelerator: bool,
    free_bytes: int | None,
    gpu_layers: int | Literal["auto"] = "auto",
    scale: float = 1.0,
    drafting: int = 0,
    drafting_host: int = 0,
    slots: int = 1,
) -> LayerSplit:
    """The split for a load: on the CPU everything is in RAM; on a GPU the layers asked
    for, or (auto) as many as fit in `free_bytes` (None: all). `scale`: what loads of
    this model measured against this estimate (learned), applied to every layer count.
    Speculation's bytes: `drafting` beside the compute buffer (on the GPU where a layer
    is), `drafting_host` in host memory (the CPU's device: its output buffer's growth
    and its n-gram pool). `slots`: the pool's (a sliding window's cells are a window
    each)."""

    def held(count: int) -> int:
        return round(bytes_on_device(facts, count, kv_type, cells, drafting, slots) * scale)

    every = facts.layers
    if not accelerator:
        whole = sum(facts.layer_bytes) + facts.other_bytes
        kv = kv_bytes(facts, kv_type, cells, slots)
        total = whole + kv + compute_bytes(facts, cells, slots) + drafting + drafting_host
        return LayerSplit(every, 0, round(total * scale), accelerator=False)
    if gpu_layers != "auto":
        count = max(0, min(int(gpu_layers), every))
        return LayerSplit(every, count, held(count), True)
    count = every
    while count > 0 and free_bytes is not None and held(count) > free_bytes:
        count -= 1
    return LayerSplit(every, count, held(count), True)
