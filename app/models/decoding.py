"""What text generation shares across handlers: sampling parameters, the price bucket of a
generation, and the token stream from the inference thread to the event loop.

A generation holds its permit for the whole stream. It is priced for its worst case: the
bucket is (prompt tokens, prompt + `max_tokens`), each rounded up, so the admitted bytes
cover the KV cache of the longest answer it may produce (app.sched.budget prices it as
fixed + per-token bytes × that bound).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.errors import ContextLengthExceeded, InvalidRequest
from app.models.chat.reasoning import Frame, ThinkingAsk
from app.models.prepared import Bucket, Prepared, next_pow2

ANY_OBJECT = json.dumps({"type": "object"})  # OpenAI's `json_object` mode: any JSON object
MIN_TOKEN_BUCKET = 16


@dataclass(frozen=True)
class Chat:
    """Chat messages (OpenAI's, as dicts) and the tools (OpenAI's) the model may call. A
    message may carry `images`: encoded images (bytes, checked by the route), shown to a
    model that sees before the message's text, as Ollama's messages carry them. `thinking`:
    what it asks of a reasoning model's thinking (app.models.chat.reasoning)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    thinking: ThinkingAsk = field(default_factory=ThinkingAsk)

    @property
    def images(self) -> int:
        """How many images its messages carry."""
        return sum(len(m.get("images") or ()) for m in self.messages)


Prompt = str | Chat  # a completion's text, or a chat


@dataclass(frozen=True)
class SamplingParams:
    """Bounded by the request schema; `max_tokens` None means up to the default cap."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    frequency_penalty: float = 0.0  # OpenAI's: minus count × this, on generated tokens
    presence_penalty: float = 0.0  # OpenAI's: minus this once a token was generated
    repetition_penalty: float = 1.0  # vLLM's/HF's: prompt and generated tokens' logits ÷ this
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    json_schema: str | None = None  # the answer must be JSON valid against this (JSON text)
    logprobs: int | None = None  # None: off; k: each token's log-probability, the k likeliest
    prefix_cache: bool = True  # False: no cached prefix used or kept (warm-up, the probe)
    # whose cached prefixes it may reuse, and under whose name its own are kept: one
    # caller's (app.api.callers.cache_scope); "" for the server's own requests
    cache_scope: str = ""
    # True: a max_tokens past the context is cut to it (Ollama's num_predict: Ollama stops
    # at the context); False: a 400 naming both numbers (OpenAI's and Anthropic's APIs)
    fit_context: bool = False


@dataclass(frozen=True)
class GenerationInput:
    """`forward`'s payload for a generation: prompt token ids and the capped parameters."""

    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    # params.json_schema compiled (app.engines.torch.generation.constrained)
    grammar: str | None = None
    # the model inputs its prefill takes beside the ids (a vision-language prompt's
    # pixel_values); its KV then depends on more than its ids: never shared or kept
    prefill_inputs: dict[str, Any] | None = None
    # how its answer thinks, as its chat was rendered (None: not in tags; app.models.chat.reasoning)
    thinking: Frame | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's text and log-probability (the model's own distribution, before
    temperature and penalties), and the most likely tokens at its step, best first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class DecodeResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "cancelled"
    steps: int  # forward passes run (prefill included)
    kv_tokens: int = 0  # tokens its KV cache held at the end
    kv_bytes: int = 0  # that cache's own bytes, measured on its tensors (0: unknown)
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per generated token, if asked
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (not prefilled)
    stop_sequence: str | None = None  # the stop string that ended it (finish "stop"), if one did
    # what was dropped from a chat's middle to fit its context (app.core.overflow)
    dropped_messages: int = 0
    dropped_tokens: int = 0
    # speculative decoding: tokens drafted for it and accepted (None: it did not speculate)
    draft_tokens: int | None = None
    accepted_tokens: int | None = None


def generation_prepared(
    model: str,
    prompt_ids: list[int],
    params: SamplingParams,
    context: int,
    default_cap: int,
    grammar: str | None = None,
    thinking: Frame | None = None,
) -> Prepared:
    """The bucket of a generation; a prompt the context cannot hold is a 400 that says so.
    A thinking budget is priced with the answer: without a `max_tokens` of its own, the
    answer's default cap comes on top of its thinking."""
    prompt = len(prompt_ids)
    if prompt == 0:
        raise InvalidRequest("the prompt is empty", param="prompt")
    if prompt >= context:
        raise ContextLengthExceeded(
            context=context,
            prompt=prompt,
            advice=f"(model {model!r} needs room for at least one token to answer)",
            param="messages",
        )
    room = context - prompt
    if params.max_tokens is not None and params.max_tokens > room and not params.fit_context:
        raise ContextLengthExceeded(
            context=context,
            prompt=prompt,
            max_tokens=params.max_tokens,
            advice=f"(model {model!r}: ask for at most {room}, or set its context_length)",
            param="max_tokens",
        )
    budget = thinking.budget if thinking is not None and thinking.budget is not None else 0
    wanted = params.max_tokens if params.max_tokens is not None else default_cap + budget
    max_tokens = max(1, min(wanted, room))
    p = next_pow2(prompt, MIN_TOKEN_BUCKET)
    t = min(next_pow2(prompt + max_tokens, MIN_TOKEN_BUCKET), next_pow2(context))
    return Prepared(
        Bucket(f"p{p}t{t}", 4 * t + p),  # bytes grow with the total, then with the prompt
        GenerationInput(list(prompt_ids), params, max_tokens, grammar, thinking=thinking),
        prompt,
        count=1,
        longest=prompt,
        kv_bound=(p, t),
    )


class TokenStream:
    """Text from the inference thread to the event loop, and a cancel flag the generating
    thread checks before every step. The runner closes it when generation has returned."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.deltas: asyncio.Queue[str | None] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.progress_at = 0.0  # monotonic time of the latest step, for the watchdog
        self.first_step_at = 0.0  # monotonic time of the first step: its prefill's end
        self.cancel_reason: Exception | None = None  # why the server ended it, if it did

    def emit(self, text: str) -> None:
        """Called on the inference thread after every step (text may be empty)."""
        self.progress_at = time.monotonic()
        self.first_step_at = self.first_step_at or self.progress_at
        if text:
            self._loop.call_soon_threadsafe(self.deltas.put_nowait, text)

    def beat(self) -> None:
        """The generation goes on with no token yet (a prefill's progress); from any
        thread (one float written)."""
        self.progress_at = time.monotonic()

    def push(self, text: str) -> None:
        """`emit`, called on the loop itself (a generation streamed on the loop)."""
        self.progress_at = time.monotonic()
        self.first_step_at = self.first_step_at or self.progress_at
        if text:
            self.deltas.put_nowait(text)

    def close(self) -> None:
        """Called on the loop, after every emit of the run has been delivered."""
        self.deltas.put_nowait(None)

    def cancel(self, reason: Exception | None = None) -> None:
        """Stop before the next step; `reason` is what the caller is told, when it is
        the server (a shutdown, an unload) and not the caller that ends the stream."""
        if reason is not None and not self.cancelled.is_set():
            self.cancel_reason = reason
        self.cancelled.set()


class IncrementalText:
    """The text of a growing answer, decoding only its last few tokens at each step, not
    the whole answer again (TGI's and vLLM's prefix and read offsets): `extend` decodes
    the tokens from the last complete piece on, with the piece before it as context (a
    tokenizer may spell a token differently at the start of a text), and appends what
    they add once it is whole (no half UTF-8 sequence)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._prefix = 0  # where the context window starts
        self._read = 0  # where the tokens not yet turned into text start
        self.text = ""

    def extend(self, ids: list[int]) -> str:
        """The answer's text so far, `ids` being every token it has (a longer list each
        call); the tail of a character still being spelt waits for its next token."""
        before = self._decode(ids[self._prefix : self._read])
        now = self._decode(ids[self._prefix :])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self.text += now[len(before) :]
            self._prefix, self._read = self._read, len(ids)
        return self.text


class StopScanner:
    """Incremental detokenised text with stop strings: `push` takes the full text decoded
    so far and returns what may be sent now, holding back a possible stop-string prefix
    and an incomplete UTF-8 sequence."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = tuple(s for s in stop if s)
        self.sent = 0
        self.stopped = False
        self.matched: str | None = None  # the stop string found, the earliest in the text
        self.text = ""

    def push(self, text: str, final: bool = False) -> str:
        for s in self.stop:
            at = text.find(s)
            if at != -1:  # a later match is earlier in the text: the one cut here
                self.stopped = True
                self.matched = s
                text = text[:at]
                final = True
        self.text = text
        safe = len(text)
        if not final:
            if text.endswith("\ufffd"):
                safe = len(text.rstrip("\ufffd"))
            for s in self.stop:
                for k in range(min(len(s) - 1, safe), 0, -1):
                    if text[:safe].endswith(s[:k]):
                        safe -= k
                        break
        safe = max(safe, self.sent)
        delta = text[self.sent : safe]
        self.sent = safe
        return delta
