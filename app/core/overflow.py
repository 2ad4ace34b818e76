"""What a chat past its model's context gets (a model's `context_overflow`): refused in
its API's own words (`error`), or answered with whole turns dropped from its middle
(`truncate_middle`): its system prompt, its tools and its latest turn stay, its oldest
turns after the system prompt go, one at a time, until the prompt and the room its
answer asks for fit. A turn is a user message and all that follows it up to the next
(the answers, tool calls and their results), so a tool call never loses its result. The
dropped messages and tokens are said in the `X-Vramgate-Truncated` header and in usage
(`truncated`) every time: never silently, as Ollama does (ollama#3839).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.errors import ContextLengthExceeded
from app.models.decoding import Chat, DecodeResult, Prompt, SamplingParams
from app.models.prepared import Prepared

Overflow = Literal["error", "truncate_middle"]
HEADER = "X-Vramgate-Truncated"
KEPT_FIRST = ("system", "developer")  # leading messages of these roles are always kept


class Preparer(Protocol):
    async def prepare_prompt(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int, pools: Any
    ) -> Prepared: ...


@dataclass(frozen=True)
class Truncation:
    """What was dropped from a chat's middle: messages, and the prompt tokens they took."""

    messages: int
    tokens: int

    def header(self) -> str:
        return f"messages={self.messages}; tokens={self.tokens}"

    def usage(self) -> dict[str, Any]:
        return {"truncated": {"messages": self.messages, "tokens": self.tokens}}


def said(outcome: DecodeResult) -> dict[str, Any]:
    """What usage says of an answer whose chat lost turns to fit (nothing otherwise)."""
    if not outcome.dropped_messages:
        return {}
    return Truncation(outcome.dropped_messages, outcome.dropped_tokens).usage()


def middle_turns(messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The turns that may go, oldest first, as [start, end) spans of `messages`: every
    turn after the leading system messages but the latest (from the last user message
    on)."""
    start = 0
    while start < len(messages) and messages[start].get("role") in KEPT_FIRST:
        start += 1
    users = [i for i in range(start, len(messages)) if messages[i].get("role") == "user"]
    if not users:
        return []
    last = users[-1]
    # messages before the first user message (an assistant's greeting) go with it
    bounds = [start, *users[1:]] if users[0] > start else users
    spans = list(zip(bounds, [*bounds[1:], last], strict=True))
    return [(a, b) for a, b in spans if a < b <= last]


def without(messages: list[dict[str, Any]], spans: list[tuple[int, int]]) -> list[Any]:
    gone = {i for a, b in spans for i in range(a, b)}
    return [m for i, m in enumerate(messages) if i not in gone]


async def prepare_within(
    handler: Preparer,
    prompt: Prompt,
    params: SamplingParams,
    default_max_tokens: int,
    pools: Any,
    overflow: Overflow,
) -> tuple[Prepared, Truncation | None]:
    """The prompt prepared as it is, or, past the context under `truncate_middle`, with
    the fewest oldest middle turns dropped that make it fit. Where dropping every one of
    them is not enough, the refusal is the whole prompt's."""
    try:
        return await handler.prepare_prompt(prompt, params, default_max_tokens, pools), None
    except ContextLengthExceeded as refused:
        if overflow != "truncate_middle" or not isinstance(prompt, Chat):
            raise
        spans = middle_turns(prompt.messages)
        for dropped in range(1, len(spans) + 1):
            kept = Chat(without(prompt.messages, spans[:dropped]), prompt.tools)
            try:
                prepared = await handler.prepare_prompt(kept, params, default_max_tokens, pools)
            except ContextLengthExceeded:
                continue
            gone = sum(b - a for a, b in spans[:dropped])
            return prepared, Truncation(gone, refused.prompt - prepared.tokens)
        raise
