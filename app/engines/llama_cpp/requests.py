"""llama.cpp's `/completion` in our types: the request a validated generation becomes,
and what its server-sent events say (text, log-probabilities, why it stopped). Field
names as llama.cpp's server reads and writes them (tools/server/README.md)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from app.models.chat.reasoning import Frame
from app.models.decoding import DecodeResult, GenerationInput, TokenLogprob
from app.models.prepared import Prepared
from app.models.structured import lark_grammar

# llama.cpp's stop types (server-task.cpp): an end-of-generation token, a stop word, or
# n_predict reached
_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}


def completion_body(task: GenerationInput, cache: bool = True) -> dict[str, Any]:
    """llama.cpp's /completion request for a validated generation; `cache`: its slot
    keeps the prompt's KV for the next request that begins the same way."""
    p = task.params
    body: dict[str, Any] = {
        "prompt": task.prompt_ids,
        "n_predict": task.max_tokens,
        "stream": True,
        "return_progress": True,  # a prefill's progress, each batch: the run's beats
        "cache_prompt": cache and p.prefix_cache,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "min_p": p.min_p,
        "stop": list(p.stop),
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "repeat_penalty": p.repetition_penalty,
        "seed": p.seed if p.seed is not None else secrets.randbelow(2**31),
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
    }
    if p.logit_bias:
        body["logit_bias"] = [[token, bias] for token, bias in p.logit_bias]
    if p.logprobs is not None:
        body["n_probs"] = max(1, p.logprobs)
    if task.grammar is not None:  # a JSON schema: the same grammar as the torch engine's
        body["grammar"] = lark_grammar(task.grammar)
    frame = task.thinking
    if frame is not None and frame.budget is not None and not frame.opened:
        body |= thinking_budget(frame)
    return body


def thinking_budget(frame: Frame) -> dict[str, Any]:
    """llama.cpp's reasoning budget sampler for an answer whose model opens its thinking
    itself, as llama.cpp's chat route sets it (tried on xllamacpp 2026.10: the end tags
    and the message must be given, or nothing is forced): the close tag is forced once
    `budget` tokens followed the open tag. (A block the prompt opened is bounded by its
    handler: app.engines.llama_cpp.generation, `_read_thinking_first`.) The first end tag
    is the one forced; any ends the thinking: harmony's forced close is `<|end|>` and the
    final message's header, and an analysis that ends itself (`<|end|>`, a call after it)
    is left alone."""
    ends = [frame.budget_close] + ([frame.close] if frame.answer else [])
    return {
        "reasoning_budget_tokens": frame.budget,
        "reasoning_budget_start_tag": frame.open,
        "reasoning_budget_end_tags": ends,
        "reasoning_budget_message": "",
    }


def logprobs_of(chunk: dict[str, Any]) -> list[TokenLogprob]:
    found = []
    for item in chunk.get("completion_probabilities") or []:
        top = tuple(
            (str(t.get("token", "")), float(t.get("logprob", 0.0)))
            for t in item.get("top_logprobs") or []
        )
        found.append(TokenLogprob(str(item.get("token", "")), float(item["logprob"]), top))
    return found


def decode_result(
    final: dict[str, Any],
    text: list[str],
    logprobs: list[TokenLogprob],
    prepared: Prepared,
    speculating: bool = False,
) -> DecodeResult:
    """A finished (or cancelled: no `final` event) completion as our DecodeResult
    (`speculating`: its runner drafts, so no draft said is none drafted)."""
    task: GenerationInput = prepared.payload
    produced = int(final.get("tokens_predicted", 0))
    finish = _FINISH.get(str(final.get("stop_type")), "cancelled") if final else "cancelled"
    return DecodeResult(
        text="".join(text),
        prompt_tokens=prepared.tokens,
        completion_tokens=produced or len(logprobs) or sum(1 for t in text if t),
        finish_reason=finish,
        steps=produced + 1,
        logprobs=tuple(logprobs) if task.params.logprobs is not None else None,
        stop_sequence=str(final["stopping_word"]) if final.get("stop_type") == "word" else None,
        cached_tokens=cached_tokens(final),
        draft_tokens=drafts.drafted if (drafts := drafts_of(final, speculating)) else None,
        accepted_tokens=drafts.accepted if drafts else None,
    )


def cached_tokens(final: dict[str, Any]) -> int:
    """The prompt tokens llama.cpp took from its slot's cache (`timings.cache_n`)."""
    timings = final.get("timings")
    return int(timings.get("cache_n", 0) or 0) if isinstance(timings, dict) else 0


@dataclass(frozen=True)
class Drafts:
    """What a completion's speculative decoding did, as llama.cpp's timings say: tokens
    drafted and accepted, and the answer's tokens and milliseconds (first to last)."""

    drafted: int
    accepted: int
    tokens: int
    decode_ms: float


def drafts_of(final: dict[str, Any], speculating: bool = False) -> Drafts | None:
    """A finished completion's drafts (`timings.draft_n`, `draft_n_accepted`). llama.cpp
    says them only where it drafted at all (`if (draft_n > 0)`, result_timings::to_json
    in tools/server): a request of a `speculating` runner that says none drafted none (a
    free text that found no n-gram to follow); None where the runner does not speculate."""
    timings = final.get("timings")
    if not isinstance(timings, dict) or ("draft_n" not in timings and not speculating):
        return None
    return Drafts(
        int(timings.get("draft_n") or 0),
        int(timings.get("draft_n_accepted") or 0),
        int(timings.get("predicted_n") or 0),
        float(timings.get("predicted_ms") or 0.0),
    )
