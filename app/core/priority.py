"""The class a request runs in (app.sched.priority), from what it said and the config.

The HTTP layer opens a request's `Asked` (app.api.priority: the header, the route) and
its route fills in the body's own field; the fleet adds the class the config gives the
name the client sent (`priorities`); the service settles it when it queues the work:
the request's own word first, then the config's for its name, its caller (a
`caller:` pattern against its User-Agent) or its route, then its model's
default (`priority` in its config entry), then a large embeddings request's
(`background_inputs`), else interactive.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from app.sched.priority import Priority, parse


@dataclass
class Asked:
    """What one request said of its class, and what the config says of its name."""

    own: Priority | None = None  # its body's field or its header
    named: Priority | None = None  # the config's, for the model name it sent
    caller: Priority | None = None  # the config's, for its User-Agent (`caller:` patterns)
    routed: Priority | None = None  # the config's, for its route


ASKED: ContextVar[Asked | None] = ContextVar("vramgate_asked_priority", default=None)


@contextmanager
def asking(asked: Asked) -> Iterator[Asked]:
    """The request's `Asked` for the work it queues (its task and what it awaits)."""
    token = ASKED.set(asked)
    try:
        yield asked
    finally:
        ASKED.reset(token)


def say(*values: object) -> None:
    """The request's own field (the first of `values` that names a class) wins over its
    header."""
    asked = ASKED.get()
    found = next((p for p in map(parse, values) if p is not None), None)
    if asked is not None and found is not None:
        asked.own = found


def configured(key: str, table: Mapping[str, str]) -> Priority | None:
    """The class the first pattern of `table` (glob: class) that matches `key` gives."""
    for pattern, name in table.items():
        if fnmatch.fnmatchcase(key, pattern):
            return parse(name)
    return None


def name(model: str, table: Mapping[str, str]) -> None:
    """The config's class for the model name the client sent, if it gives one."""
    asked = ASKED.get()
    if asked is not None and asked.named is None:
        asked.named = configured(model, table)


def settle(model_default: Priority, inputs: int, background_inputs: int) -> Priority:
    """The class a request's work queues in (see the module's words)."""
    asked = ASKED.get() or Asked()
    for found in (asked.own, asked.named, asked.caller, asked.routed):
        if found is not None:
            return found
    if model_default != Priority.INTERACTIVE:
        return model_default
    if background_inputs and inputs >= background_inputs:
        return Priority.BACKGROUND
    return Priority.INTERACTIVE
