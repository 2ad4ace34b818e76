"""A reasoning model's thinking: split from its answer however the stream cuts the tags
(a block the model opens, or one its prompt opened), the same streamed as whole; each
template's own switch; thinking off where a template has none; what a request asks."""

from __future__ import annotations

import pytest

from app.models.chat.reasoning import (
    Frame,
    ThinkingAsk,
    answer_frame,
    split,
    template_switches,
    thinks,
)
from tests.models.chat.pieces import cut, pieces_of

ANSWER = "  <think>Oslo is wet.\nSo: rain.</think>\n\nIt rains in Oslo."
OPENED = "\nOslo is wet.\nSo: rain.\n</think>\n\nIt rains in Oslo."  # the prompt wrote <think>
QWEN3 = "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>"
R1 = "{{'<｜Assistant｜><think>\\n'}}"  # no switch: its prompt opens the block
HARMONY = "Reasoning: {{ reasoning_effort }}"


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(ANSWER)])
@pytest.mark.parametrize(("text", "frame"), [(ANSWER, Frame()), (OPENED, Frame(opened=True))])
def test_thinking_is_split_out_wherever_the_stream_cuts_the_tags(size, text, frame):
    expected = [("thinking", "Oslo is wet.\nSo: rain."), ("text", "It rains in Oslo.")]
    assert pieces_of(cut(text, size), frame) == expected
    assert split(text, frame) == ("Oslo is wet.\nSo: rain.", "It rains in Oslo.")


@pytest.mark.parametrize("size", [1, 3, 100])
def test_white_space_at_the_end_of_a_thought_is_held_and_dropped_as_in_a_whole_one(size):
    """Streamed piece by piece, the thought is what the whole answer's split gives: the
    white space before `</think>` never went out ahead of it."""
    text = "<think>\nA thought.\n\n</think>\n\nThe answer."
    streamed = [p for p in pieces_of(cut(text, size), Frame()) if p[0] == "thinking"]
    assert streamed == [("thinking", "A thought.")]


@pytest.mark.parametrize(
    ("pieces", "frame", "expected"),
    [
        (["<thi", "nk>unfinished"], Frame(), [("thinking", "unfinished")]),  # max_tokens
        (["cut off ", "mid-thought"], Frame(opened=True), [("thinking", "cut off mid-thought")]),
        (["<b>bold</b>"], Frame(), [("text", "<b>bold</b>")]),
        (["Hello <think>x</think>"], Frame(), [("text", "Hello <think>x</think>")]),  # not first
        (["<", "think>x</think>y"], None, [("text", "<think>x</think>y")]),  # not a thinker
        (["<"], Frame(), [("text", "<")]),
        (["</think>\n\nAt once."], Frame(opened=True), [("text", "At once.")]),  # budget 0
    ],
)
def test_only_a_leading_or_opened_block_is_thinking(pieces, frame, expected):
    assert pieces_of(pieces, frame) == expected


def test_a_model_thinks_in_tags_when_its_template_names_them():
    assert thinks(QWEN3) and thinks(R1) and not thinks("<|im_start|>") and not thinks(None)


def test_each_template_gets_its_own_switch_and_no_other():
    off, low = ThinkingAsk(on=False), ThinkingAsk(on=True, effort="low")
    assert template_switches(QWEN3, off) == {"enable_thinking": False}
    assert template_switches(QWEN3, low) == {"enable_thinking": True}
    assert template_switches(HARMONY, low) == {"reasoning_effort": "low"}
    assert template_switches(R1, off) == {} and template_switches(QWEN3, ThinkingAsk()) == {}


def test_the_frame_says_whether_the_prompt_opened_the_block_and_what_budget_it_has():
    opened = "<｜User｜>Hi<｜Assistant｜><think>\n"
    assert answer_frame(R1, opened, ThinkingAsk()) == (opened, Frame(opened=True))
    assert answer_frame(R1, opened, ThinkingAsk(budget=8))[1] == Frame(opened=True, budget=8)
    assert answer_frame(R1, opened, ThinkingAsk(), 64)[1] == Frame(opened=True, budget=64)
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3, enable_thinking false
    assert answer_frame(QWEN3, closed, ThinkingAsk(on=False)) == (closed, Frame())
    assert answer_frame("<|im_start|>", "x", ThinkingAsk()) == ("x", None)


def test_thinking_off_without_a_switch_closes_the_opened_block_or_budgets_it_to_zero():
    opened = "<｜Assistant｜><think>\n"
    prompt, frame = answer_frame(R1, opened, ThinkingAsk(on=False))
    assert prompt == opened + "</think>\n\n" and frame == Frame()
    own = "{{ '<think>' }} in its examples"  # the model writes its own <think>, no switch
    assert answer_frame(own, "a", ThinkingAsk(on=False))[1] == Frame(budget=0)


@pytest.mark.parametrize(
    ("effort", "expected"),
    [
        (None, ThinkingAsk()),
        ("none", ThinkingAsk(on=False)),
        ("minimal", ThinkingAsk(on=True, effort="low")),
        ("medium", ThinkingAsk(on=True, effort="medium")),
        ("xhigh", ThinkingAsk(on=True, effort="high")),
    ],
)
def test_openai_efforts_become_what_templates_know(effort, expected):
    assert ThinkingAsk.from_effort(effort) == expected
