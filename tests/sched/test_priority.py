"""The classes clients name, as the gate reads them."""

from __future__ import annotations

import pytest

from app.sched.priority import NAMES, Priority, parse


@pytest.mark.parametrize(
    ("sent", "priority"),
    [
        ("flex", Priority.BACKGROUND),  # OpenAI's service_tier
        ("priority", Priority.PRIORITY),
        ("default", Priority.INTERACTIVE),
        ("auto", Priority.INTERACTIVE),
        (" Background ", Priority.BACKGROUND),
        ("interactive", Priority.INTERACTIVE),
        (10, Priority.BACKGROUND),  # vLLM's number: lower first, 0 the default
        (-1, Priority.PRIORITY),
        ("5", Priority.BACKGROUND),
        (0, None),
        (None, None),
        (True, None),
        ("scale", None),  # an OpenAI tier that names no class here: interactive
        (["flex"], None),
    ],
)
def test_what_clients_send_names_a_class_or_none(sent, priority):
    assert parse(sent) == priority


def test_each_class_answers_with_openai_s_tier_name():
    assert [p.service_tier for p in Priority] == ["priority", "default", "flex"]
    assert [p.label for p in Priority] == ["priority", "interactive", "background"]
    assert tuple(p.label for p in Priority) == NAMES  # the config's names (app.config)
