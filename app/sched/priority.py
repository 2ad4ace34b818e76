"""Priority classes: what a request is to the person at the machine.

`interactive` is a person waiting (a chat, a query's embedding): the default, and what
anything unknown is. `background` is work that may wait (an app's title and tag
requests, a document's chunks, a batch script): it runs in the gaps, steps aside while
interactive work runs or waits, never takes the pool's last bytes or a model's last
cells, and is promoted to interactive once it has waited `aging_s` (so it is never
starved). `priority` goes ahead of interactive work.

Clients already say it: OpenAI's `service_tier` (`flex` for work that may wait,
`priority` for work that may not), vLLM's `priority` number (lower first, 0 the
default), or a header for clients that can set neither (app.api.priority).
"""

from __future__ import annotations

from enum import IntEnum

from app.config.priorities import PRIORITY_NAMES


class Priority(IntEnum):
    """Lower first in the queue."""

    PRIORITY = 0
    INTERACTIVE = 1
    BACKGROUND = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def service_tier(self) -> str:
        """OpenAI's name of the tier a request ran in (`default` for interactive)."""
        return {Priority.PRIORITY: "priority", Priority.BACKGROUND: "flex"}.get(self, "default")


# the words each class answers to: ours, OpenAI's tiers, and what people write
_WORDS = {
    "priority": Priority.PRIORITY,
    "high": Priority.PRIORITY,
    "interactive": Priority.INTERACTIVE,
    "default": Priority.INTERACTIVE,
    "auto": Priority.INTERACTIVE,
    "normal": Priority.INTERACTIVE,
    "background": Priority.BACKGROUND,
    "flex": Priority.BACKGROUND,
    "batch": Priority.BACKGROUND,
    "low": Priority.BACKGROUND,
}
NAMES = PRIORITY_NAMES  # as each class's `label`


def parse(value: object) -> Priority | None:
    """A class from what a client sent: a word (any case), or vLLM's number (below 0
    goes first, 0 is the default, above 0 may wait); None for nothing sent or a value
    that names no class (such a request is interactive)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return Priority.PRIORITY if value < 0 else Priority.BACKGROUND if value > 0 else None
    if isinstance(value, str):
        word = value.strip().lower()
        if word.lstrip("+-").isdigit():
            return parse(int(word))
        return _WORDS.get(word)
    return None
