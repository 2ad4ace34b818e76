"""What a runner's `/slots` says, in our types: which requests its slots still hold and
how far their work has gone. Pure: its JSON in, a frozen view out.

llama.cpp answers `/slots` from its main loop, between two batches (the HTTP thread
posts a task and waits for it), never from an HTTP thread alone: an answer is itself
evidence that the loop turns, and a loop that hangs mid-batch leaves it unanswered.
Its streamed chunks name no slot and no task (`id_slot` is -1 until the last chunk), so
each request carries a tag of ours that the slot's `params` echo: `dry_penalty_last_n`,
which sizes the DRY sampler alone, and our sampler chain has no DRY
(app.engines.llama_cpp.requests): the tag changes nothing the model writes (a greedy
answer with and without it, tried here, and tests/engines/llama_cpp/test_generation.py's
comparison with llama.cpp alone)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

TAG_FIELD = "dry_penalty_last_n"
FIRST_TAG = 1_000_000  # far above any value of the field a person would set


def tags() -> itertools.count[int]:
    """A runner's request tags: one each, never reused while it lives."""
    return itertools.count(FIRST_TAG)


@dataclass(frozen=True)
class SlotsView:
    """The runner's busy slots: each one's tag and its progress (prompt tokens
    processed, tokens decoded)."""

    busy: tuple[tuple[int, int | None, int, int], ...]  # (slot, tag, processed, decoded)

    @classmethod
    def of(cls, found: Any) -> SlotsView:
        """The view of a `/slots` answer (a list of slots; anything else: none busy)."""
        busy = []
        for slot in found if isinstance(found, list) else []:
            if not isinstance(slot, dict) or not slot.get("is_processing"):
                continue
            params = slot.get("params") if isinstance(slot.get("params"), dict) else {}
            tag = params.get(TAG_FIELD)
            decoded = sum(int(t.get("n_decoded", 0)) for t in slot.get("next_token") or [])
            processed = int(slot.get("n_prompt_tokens_processed", 0) or 0)
            busy.append(
                (int(slot.get("id", -1)), tag if isinstance(tag, int) else None, processed, decoded)
            )
        return cls(tuple(busy))

    def holds(self, tag: int) -> bool:
        """Whether a slot still works on the request tagged `tag`."""
        return any(found == tag for _, found, _, _ in self.busy)

    def moved_since(self, before: SlotsView | None) -> bool:
        """Whether any work moved between `before` and this view: a slot's prompt or
        answer grew, a request ended or began. Two views alike: nothing moved."""
        return before is None or before.busy != self.busy
