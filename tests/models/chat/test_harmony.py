"""gpt-oss's harmony answers read as they stream (app.models.chat.harmony, through the
ThinkSplitter every API uses): the analysis channel is the thinking, the final channel
the answer, a message to `functions.NAME` a call in either of the two header forms
llama.cpp's parser reads (common/chat.cpp, gpt-oss), however the stream cuts the
markers; what gpt-oss's template is given; what a spent budget writes."""

from __future__ import annotations

import json

import pytest

from app.models.chat.reasoning import (
    HARMONY,
    Frame,
    ThinkingAsk,
    ThinkSplitter,
    answer_frame,
    split,
    template_switches,
    thinks,
)
from app.models.tools import read_calls
from tests.models.chat.pieces import cut, pieces_of

THOUGHT = "Oslo is wet. <b>Rain</b>, as every day."
ANSWER = "It rains in Oslo."
WHOLE = (
    f"<|channel|>analysis<|message|>{THOUGHT}<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{ANSWER}"
)
# a call after the thought: its recipient after the channel (as models write it) or in
# the role (as the template renders earlier calls); JSON that looks like a call in the
# thought is no call
QUOTED = 'A <tool_call>{"name": "get_time", "arguments": {}}</tool_call> is not it.'
CALL_AFTER = (
    f"<|channel|>analysis<|message|>{QUOTED}<|end|><|start|>assistant<|channel|>commentary"
    ' to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}'
)
CALL_BEFORE = (
    f"<|channel|>analysis<|message|>{QUOTED}<|end|><|start|>assistant to=functions.get_weather"
    '<|channel|>commentary json<|message|>{"city": "Oslo"}'
)
TEMPLATE = '{{- "Reasoning: " + reasoning_effort }}<|start|>assistant<|channel|>analysis<|message|>'


@pytest.mark.parametrize("size", [1, 2, 5, 11, len(WHOLE)])
def test_the_analysis_is_the_thinking_and_the_final_message_the_answer(size):
    assert pieces_of(cut(WHOLE, size), HARMONY) == [("thinking", THOUGHT), ("text", ANSWER)]
    assert split(WHOLE, HARMONY) == (THOUGHT, ANSWER)


def test_the_thinking_streams_before_its_message_ends():
    splitter = ThinkSplitter(HARMONY)
    assert splitter.push("<|channel|>analysis<|message|>Oslo is") == [("thinking", "Oslo is")]
    assert splitter.push(" wet.<|e") == [("thinking", " wet.")]  # `<|e` may be `<|end|>`
    assert splitter.push("nd|>") == []


@pytest.mark.parametrize("text", [CALL_AFTER, CALL_BEFORE])
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_message_to_a_function_is_a_call_and_the_thought_quoting_one_is_not(text, size):
    pieces = pieces_of(cut(text, size), HARMONY)
    assert pieces[0] == ("thinking", QUOTED)
    ((kind, said),) = pieces[1:]
    rest, calls = read_calls(said, {"get_weather", "get_time"})
    assert kind == "text" and rest is None and [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments) == {"city": "Oslo"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<|channel|>analysis<|message|>cut off", [("thinking", "cut off")]),  # max_tokens
        ("<|channel|>final<|message|>At once.<|return|>", [("text", "At once.")]),
        ("<|channel|>commentary<|message|>Looking.<|end|>", [("text", "Looking.")]),  # preamble
        ("<|channel|>final <|constrain|>json<|message|>{}", [("text", "{}")]),
        ("no harmony at all", [("text", "no harmony at all")]),
        (  # an unknown header is skipped to the next message, as llama.cpp does
            "<|channel|>nowhere<|message|>lost<|end|><|start|>assistant<|channel|>final"
            "<|message|>Found.",
            [("text", "Found.")],
        ),
    ],
)
def test_each_channel_and_what_is_no_harmony(text, expected):
    assert pieces_of([text], HARMONY) == expected


def test_gpt_oss_thinks_its_effort_is_its_switch_and_off_is_its_lowest_effort():
    assert thinks(TEMPLATE)
    assert template_switches(TEMPLATE, ThinkingAsk.from_effort("high")) == {
        "reasoning_effort": "high"
    }
    assert template_switches(TEMPLATE, ThinkingAsk(on=False)) == {"reasoning_effort": "low"}
    assert template_switches(TEMPLATE, ThinkingAsk()) == {}  # its own default
    other = "{{ reasoning_effort }}"  # another template's effort: off is not ours to map
    assert template_switches(other, ThinkingAsk(on=False)) == {}


def test_the_frame_is_harmonys_and_a_spent_budget_writes_the_final_header():
    prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    same, frame = answer_frame(TEMPLATE, prompt, ThinkingAsk(on=True, budget=8))
    assert same == prompt and frame is not None and frame.harmony and frame.budget == 8
    # off: it cannot be switched off, so its analysis gets nothing (closed at once)
    off = answer_frame(TEMPLATE, prompt, ThinkingAsk(on=False, budget=8))[1]
    assert off is not None and off.harmony and off.budget == 0
    assert frame.open == "<|channel|>analysis<|message|>"
    assert frame.budget_close == "<|end|><|start|>assistant<|channel|>final<|message|>"
    assert Frame().budget_close == "</think>"
