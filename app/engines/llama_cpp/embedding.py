"""Embeddings on llama.cpp's engine: a GGUF embedding model (nomic-embed, bge, gte,
e5 as GGUF files) in a runner process of its own (app.engines.llama_cpp.runner_model). Inputs
are tokenised by the runner before they are queued (a text longer than the context is a
400 at once), bucketed and merged across requests like the torch engine's embedders,
and sent as token ids to the runner's `/v1/embeddings`, which pools them as the file says
(mean where it says nothing) and normalises them."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.engines.gguf_facts import GgufFacts
from app.engines.llama_cpp.kv_pool import KvPool
from app.engines.llama_cpp.runner_main import PROMPT_BATCH
from app.engines.llama_cpp.runner_model import SLOT_CONTEXT, LlamaRunnerModel
from app.errors import ContextLengthExceeded
from app.models.decoding import TokenStream
from app.models.kinds import Embedder, TextOrIds
from app.models.prepared import Prepared, length_bucketed, merged_rows
from app.models.stages import Launched, Pools, elsewhere

EMBEDDING_SLOTS = 4


class LlamaCppEmbedder(LlamaRunnerModel, Embedder):
    """Tokenised by the runner and embedded by it, both awaited on the event loop: the
    work is the runner's, so none of it waits for our CPU pool or device threads."""

    kind = "embedding"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.dimensions = 0

    def _context_for(self, facts: GgufFacts) -> int:
        """An input's tokens at most: the file's, up to 4096 (or the setting's)."""
        return min(facts.context_length or SLOT_CONTEXT, self.spec.max_context or SLOT_CONTEXT)

    def planned_pool(self, device: Device, free_bytes: int | None = None) -> KvPool:
        """`parallel` inputs at once (4 by default), each of at most `context` tokens:
        each input whole in one micro-batch of a unified KV."""
        context = self._context_for(self.facts())
        slots = self.spec.parallel or EMBEDDING_SLOTS
        return KvPool(context * slots, context, slots)

    def prompt_cache_ram(self) -> int:
        return 0  # an embedding keeps no prompt for a next request

    @property
    def cell_capacity(self) -> int | None:
        """Its slots: a request takes one while its inputs are embedded."""
        return self.pool.slots if self.pool is not None else None

    def cells_for(self, prepared: Prepared) -> int:
        return 1

    def runner_settings(self) -> dict[str, Any]:
        return {"embedding": True, "pooling": self.facts().pooling or "mean"}

    def loaded(self, props: dict[str, Any]) -> None:
        self.dimensions = self.facts().width

    async def prepare_inputs(self, inputs: list[TextOrIds], pools: Pools) -> Prepared:
        """Token ids for every input (texts through the runner's tokenizer), bucketed."""
        ids = [await self._ids(item) for item in inputs]
        for row in ids:
            if len(row) > self.context:
                raise ContextLengthExceeded(
                    context=self.context,
                    prompt=len(row),
                    advice=f"(model {self.name!r} embeds at most {self.context} per input)",
                    what="input",
                    param="input",
                )
        return self._prepared(ids)

    async def _ids(self, item: TextOrIds) -> list[int]:
        if not isinstance(item, str):
            return list(item)
        body = {"content": item, "add_special": True, "parse_special": False}
        found = await self._call("/tokenize", body)
        return [int(t) for t in found["tokens"]]

    def _prepared(self, ids: list[list[int]]) -> Prepared:
        return length_bucketed(ids, [len(row) for row in ids], self.spec.max_batch)

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        return merged_rows(parts, self.spec.max_batch, self._prepared)

    def start(self, prepared: Prepared, stream: TokenStream | None, pools: Pools) -> Launched:
        return asyncio.ensure_future(elsewhere(self._embed(prepared)))

    async def _embed(self, prepared: Prepared) -> np.ndarray:
        """One call for the whole batch; the runner spreads it over its slots. An input
        is one decode, which reports no progress: the runner is waited for while it
        answers its /health, up to four `run_timeout`s for each 512 tokens of the batch (a
        prefill's progress events bound each 512 tokens by one; an embedding's attention
        spans its whole input, and one busy machine measured 3,000 tokens at over 12
        times the 6 s a 512-token batch took alone). The bound is for a runner whose HTTP
        threads live while its computation hangs."""
        self.forward_calls += 1
        rows: list[list[int]] = prepared.payload
        batches = math.ceil(sum(len(row) for row in rows) / PROMPT_BATCH)
        budget_s = 4 * self.run_timeout * max(1, batches)
        found = await self._call("/v1/embeddings", {"input": rows}, budget_s=budget_s)
        out = np.empty((len(rows), self.dimensions), dtype=np.float32)
        for item in found["data"]:
            out[int(item["index"])] = item["embedding"]
        return out
