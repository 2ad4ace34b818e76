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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.config.settings import ModelSpec

KIND = "ngram-mod"  # llama.cpp's --spec-type
MATCH = 16  # tokens of the answer a draft's n-gram matches
DRAFT_MIN = 8  # a chain shorter than this is not drafted
DRAFT_MAX = 24  # the most tokens one draft proposes
NGRAM_MOD_POOL = 4_194_304 * 4  # ngram-mod's pool, host memory: its log's "16.000 MB"


@dataclass(frozen=True)
class Speculation:
    """How a runner drafts: llama.cpp's `kind` and its sizes."""

    kind: str
    match: int
    draft_min: int
    draft_max: int

    def runner_settings(self) -> dict[str, Any]:
        """Its part of the runner's settings (app.engines.llama_cpp.runner_main.speculate;
        bench/llama_server_alone.py --speculative takes the same)."""
        return {
            "kind": self.kind,
            "match": self.match,
            "draft_min": self.draft_min,
            "draft_max": self.draft_max,
        }

    def describe(self) -> str:
        return f"{self.kind} (match {self.match}, drafts of {self.draft_min}-{self.draft_max})"

    @property
    def pool_bytes(self) -> int:
        """Its drafts' pool in host memory (the other kinds' small maps: not counted)."""
        return NGRAM_MOD_POOL if self.kind == "ngram-mod" else 0

    def load_fields(self) -> dict[str, int]:
        """What it adds to a load's plan (app.engines.llama_cpp.load.plan.LoadSettings)."""
        return {"draft_max": self.draft_max, "draft_pool": self.pool_bytes}


DEFAULT = Speculation(KIND, MATCH, DRAFT_MIN, DRAFT_MAX)  # a model with no settings


def plan_speculation(spec: ModelSpec) -> Speculation | None:
    """A generation model's speculation: on by default, off where `speculative = false`;
    its draft sizes where the spec sets them (a `draft_min` above `draft_max` takes it)."""
    if not spec.speculative or spec.kind != "generation":
        return None
    high = spec.draft_max if spec.draft_max is not None else DEFAULT.draft_max
    low = min(spec.draft_min if spec.draft_min is not None else DEFAULT.draft_min, high)
    return Speculation(DEFAULT.kind, DEFAULT.match, low, high)
