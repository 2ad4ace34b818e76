"""Speculative decoding for a GGUF model, planned from its spec: the kind llama.cpp
drafts with and the draft sizes. Pure: a spec's fields in, a frozen plan out.

llama.cpp verifies a draft of several tokens in one step and keeps the ones its own
sampling agrees with (greedy: the same text; sampled: rejection sampling keeps the
distribution). Draft-free, it drafts from n-grams: `ngram-mod` keeps one pool of the
n-grams of every prompt and answer the runner saw (a hash of `match` tokens to the one
that followed, 4,194,304 entries, 16 MiB) and drafts the chain that follows the answer's
last `match` tokens, when it is at least `draft_min` tokens long, up to `draft_max`. A
code edit that copies its input, or an answer that repeats what came before, drafts
long chains that are accepted; free text rarely finds a chain, and then nothing is
drafted and nothing is spent.

The kind and sizes by default are what `bench/speculative.py --sweep` measured on
llama.cpp alone (bench/README.md has the table), one stream, SmolLM2-135M Q4_1 on this
repository's 2-core CPU, as tokens per CPU second of the server against no speculation
(code edit / JSON extraction / story): ngram-mod 16/8-24 (match / draft sizes)
1.15 / 0.88 / 1.01, the best on the code edit (0.85 of its drafts accepted);
ngram-simple 8/16 1.11 / 0.84 / 0.99; ngram-mod 8/4-16 1.08 / 0.78 / 0.94; the map
kinds drafted rarely (0.96-1.02 on the code edit); llama.cpp's own 24/48-64 waits for
chains longer than a short function's copy (0.99 in an earlier sweep on blocks of code
cut at any line, where 16/8-24 gave 1.09). No draft-free kind
paid on the JSON extraction: its answers' keys recur from request to request with other
values after them, and on a CPU a rejected draft costs about what a decoded token does,
so the meter (app.engines.llama_cpp.draft_meter) turns speculation off for a model
whose drafts are rarely accepted.

A model whose config names a draft model (`draft`) drafts with it instead (llama.cpp's
`draft-simple`): the draft model, loaded in the same runner beside it, proposes each
slot's next tokens one by one and the model verifies them in one step. It needs the
model's own vocabulary (llama.cpp refuses any other: app.engines.llama_cpp.generation
then refuses the load), and costs its own weights, a KV cache of the pool's cells (a
sequence a slot) and compute buffers (`draft_model_bytes`), placed where the model's
layers are. Its sizes where the spec sets none are llama.cpp's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.config.settings import ModelSpec
from app.engines.gguf_facts import GgufFacts
from app.engines.llama_cpp.layer_split import LayerSplit, compute_bytes, kv_bytes

KIND = "ngram-mod"  # llama.cpp's --spec-type
MATCH = 16  # tokens of the answer a draft's n-gram matches
DRAFT_MIN = 8  # a chain shorter than this is not drafted
DRAFT_MAX = 24  # the most tokens one draft proposes
NGRAM_MOD_POOL = 4_194_304 * 4  # ngram-mod's pool, host memory: its log's "16.000 MB"
DRAFT_MODEL_KIND = "draft-simple"  # llama.cpp's --spec-type with a draft model
# a draft model's sizes where the spec sets none: llama.cpp's own (xllamacpp 2026.10's
# CommonParams().speculative.draft: n_min 0, n_max 3, p_min 0.0)
DRAFT_MODEL_MIN, DRAFT_MODEL_MAX = 0, 3
LOGIT_BYTES = 4  # a row of logits: the vocabulary's size in float32


@dataclass(frozen=True)
class Speculation:
    """How a runner drafts: llama.cpp's `kind` and its sizes."""

    kind: str
    match: int
    draft_min: int
    draft_max: int
    model: Path | None = None  # the draft model's file (draft-simple)
    paired: str | None = None  # which draft model, and why, as /status and the log say

    def runner_settings(self) -> dict[str, Any]:
        """Its part of the runner's settings (app.engines.llama_cpp.runner_main.speculate;
        bench/llama_server_alone.py --speculative takes the same); a draft model's layers
        on the GPU are the load's to say (`draft_gpu_layers`)."""
        model = {"model": str(self.model)} if self.model is not None else {}
        return {
            "kind": self.kind,
            "match": self.match,
            "draft_min": self.draft_min,
            "draft_max": self.draft_max,
            **model,
        }

    def describe(self) -> str:
        sizes = f"drafts of {self.draft_min}-{self.draft_max}"
        if self.paired is not None:
            return f"{self.kind} with the draft model {self.paired} ({sizes})"
        return f"{self.kind} (match {self.match}, {sizes})"

    @property
    def pool_bytes(self) -> int:
        """Its drafts' pool in host memory (the other kinds' small maps: not counted)."""
        return NGRAM_MOD_POOL if self.kind == "ngram-mod" else 0

    @property
    def sizes(self) -> tuple[int, int]:
        return self.draft_min, self.draft_max

    def load_fields(self) -> dict[str, int]:
        """What it adds to a load's plan (app.engines.llama_cpp.load.plan.LoadSettings)."""
        return {"draft_max": self.draft_max, "draft_pool": self.pool_bytes}


DEFAULT = Speculation(KIND, MATCH, DRAFT_MIN, DRAFT_MAX)  # a model with no settings


def plan_speculation(spec: ModelSpec) -> Speculation | None:
    """A generation model's speculation: on by default, off where `speculative = false`;
    with the draft model its config names (`draft`), else draft-free; its draft sizes
    where the spec sets them (a `draft_min` above `draft_max` takes it)."""
    if not spec.speculative or spec.kind != "generation":
        return None
    model = spec.draft_file()
    default = (DRAFT_MODEL_MIN, DRAFT_MODEL_MAX) if spec.draft else DEFAULT.sizes
    high = spec.draft_max if spec.draft_max is not None else default[1]
    low = min(spec.draft_min if spec.draft_min is not None else default[0], high)
    if spec.draft is None:
        return Speculation(DEFAULT.kind, DEFAULT.match, low, high)
    named = spec.draft if model is None or str(model) == spec.draft else f"{spec.draft} ({model})"
    paired = f"{named}, named by its config's `draft`"
    return Speculation(DRAFT_MODEL_KIND, 0, low, high, model, paired)


def draft_model_bytes(draft: GgufFacts, kv_type: str, cells: int, slots: int) -> int:
    """What a draft model takes beside its target: its weights, a KV cache of the target
    pool's `cells` at `kv_type` (llama.cpp gives the draft's context the target's n_ctx
    and a sequence a slot), a compute buffer (the prior of its width) and an output
    buffer of a row of logits a slot; a sliding-window layer's KV and masks at its
    window's cells (`kv_bytes`, `compute_bytes`). Measured (llama.cpp's log,
    SmolLM2-135M Q4_1 as its own draft, 2,048 cells, 4 slots, f16): 92.10 MiB of
    weights, 45.00 MiB of KV, 16.64 MiB of compute, 0.75 MiB of output; this plans
    92.1 + 45.0 + 20.0 + 0.75."""
    weights = sum(draft.layer_bytes) + draft.other_bytes
    kv = kv_bytes(draft, kv_type, cells, slots)
    compute = compute_bytes(draft, cells, slots)
    return weights + kv + compute + slots * draft.vocab * LOGIT_BYTES


def draft_gpu_layers(draft: GgufFacts, split: LayerSplit) -> int:
    """A draft model's n_gpu_layers: all its layers and its head on the GPU where any of
    its target's layers are (its bytes were planned there: `draft_model_bytes`), else
    none."""
    return draft.layers + 1 if split.accelerator and split.on_device > 0 else 0
