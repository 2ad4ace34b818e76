"""A stream's state while it is generated in a batch (app.engines.torch.generation.step_batch)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from app.engines.torch.generation.constrained import Constraint
from app.engines.torch.generation.thinking_budget import ThinkingBudget
from app.models.decoding import (
    DecodeResult,
    GenerationInput,
    IncrementalText,
    StopScanner,
    TokenLogprob,
    TokenStream,
)


@dataclass(eq=False)
class Row:
    """One stream in the batch."""

    task: GenerationInput
    stream: TokenStream
    sampler: torch.Generator
    scanner: StopScanner
    produced: list[int] = field(default_factory=list)
    steps: int = 0  # forwards that computed this row (prefill chunks included)
    position: int = 0  # tokens in its cache: the prompt and the tokens fed back
    next_token: int = 0  # sampled, to be fed at the next step
    cache: Any = None  # its own cache while a long prompt is prefilled in chunks
    finish: str | None = None
    result: DecodeResult | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    bound: int = 0  # the tokens its stream was admitted for (its bucket's token bound)
    constraint: Constraint | None = None  # the grammar its tokens follow (JSON output)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # if its request asks
    text: IncrementalText | None = None  # its answer's text, decoded step by step
    cached: int = 0  # prompt tokens whose KV was copied (a running or kept row's), not computed
    thinking: ThinkingBudget | None = None  # where its thinking is budgeted: closed when spent

    @property
    def plain_greedy(self) -> bool:
        """Whether its next token is its logits' argmax and nothing else: sampled for
        every such row of a step at once, on the device."""
        p = self.task.params
        return (
            p.temperature <= 0
            and not p.logit_bias
            and p.repetition_penalty == 1.0
            and not p.frequency_penalty
            and not p.presence_penalty
            and p.logprobs is None
            and self.constraint is None
        )

    @property
    def own_kv(self) -> bool:
        """Whether its KV depends on more than its token ids (its prefill saw images):
        it is prefilled alone and in one forward, and no other prompt copies it."""
        return self.task.prefill_inputs is not None

    @property
    def shared_ids(self) -> list[int]:
        """The prompt ids another prompt may copy its KV under (none where `own_kv`)."""
        return [] if self.own_kv else self.task.prompt_ids

    @property
    def scope(self) -> str:
        """Whose cached and running prefixes it may copy (app.models.prefix_cache)."""
        return self.task.params.cache_scope

    @property
    def most(self) -> int:  # the most tokens its cache will hold: prompt + max_tokens
        return len(self.task.prompt_ids) + self.task.max_tokens

    @property
    def admitted(self) -> int:  # the tokens its admission covered (at least `most`)
        return max(self.bound, self.most)

    @classmethod
    def start(
        cls,
        task: GenerationInput,
        stream: TokenStream,
        bound: int = 0,
        constrain: Callable[[str], Constraint] | None = None,
        tokens: Callable[[str], list[int]] | None = None,
    ) -> Row:
        """A row with its own sampler (seeded where the request names a seed), its own
        grammar state where its answer is constrained and its thinking budget where it
        has one (`tokens` spells the tags)."""
        constraint = None
        if task.grammar is not None:
            if constrain is None:
                raise RuntimeError("this model cannot constrain its output")
            constraint = constrain(task.grammar)
        sampler = torch.Generator()
        if task.params.seed is not None:
            sampler.manual_seed(task.params.seed)
        else:
            sampler.seed()
        scanner = StopScanner(task.params.stop)
        thinking = None
        if task.thinking is not None and tokens is not None:
            thinking = ThinkingBudget.of(task.thinking, tokens)
        return cls(
            task, stream, sampler, scanner, bound=bound, constraint=constraint, thinking=thinking
        )

    def end(
        self,
        decode: Callable[[list[int]], str],
        *,
        finish: str = "cancelled",
        kv_bytes: int = 0,
        error: BaseException | None = None,
    ) -> None:
        """The stream ends: its last text is sent and its caller wakes with the result
        (or `error`)."""
        if error is None:
            if not self.scanner.stopped:
                self.stream.emit(self.scanner.push(decode(self.produced), final=True))
            self.result = DecodeResult(
                self.scanner.text,
                len(self.task.prompt_ids),
                len(self.produced),
                finish,
                self.steps,
                kv_tokens=self.position,
                kv_bytes=kv_bytes,
                logprobs=tuple(self.logprobs) if self.task.params.logprobs is not None else None,
                cached_tokens=self.cached,
                stop_sequence=self.scanner.matched,
            )
        self.error = error
        self.done.set()
