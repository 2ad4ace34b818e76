"""A reasoning model's thinking kept apart, switched and budgeted, and each family's tool
calls read as calls, through the official `openai`, `ollama` and `anthropic` clients, on
both engines: tiny models with the real chat templates of Qwen3 (its model writes
`<think>`; `enable_thinking` switches it), a DeepSeek-R1 distill (its prompt opens the
block; no switch), gpt-oss (harmony's channels; `reasoning_effort` in its system
message), Llama 3.3 and Mistral Nemo, taught their answers on the spot
(tests/support/families.py), served on the torch engine (safetensors) and on llama.cpp
(the same model as a GGUF) by one server.

Each answer's thinking comes back apart from its text, streamed in order (all of the
thinking before the first word of the answer); thinking off gives none; a budget of 4
ends the thinking by its 4th token and the answer follows (the model was taught what it
says after a thought closed there); a tool call in the family's own format (after
thinking, for Qwen3, the R1 distill and gpt-oss) comes back as a call, whole and streamed, and the
call-like text inside the thinking does not. gpt-oss cannot be switched off: its effort
reaches its template (taught a thought of each length), and off is its lowest effort with
its analysis closed as soon as it opens (a budget of 0), so that none comes back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import ollama
import pytest
from openai import OpenAI

from app.config.settings import ModelSpec
from app.models.chat.reasoning import ThinkingAsk, template_switches
from tests.support.families import (
    GPT_OSS,
    LLAMA3,
    MISTRAL_NEMO,
    QWEN3,
    R1_DISTILL,
    Lesson,
    save_family_model,
    tokens_of,
)

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
THOUGHT = "Oslo is wet. So: rain, as every day there."
ANSWER = "It rains in Oslo."
BUDGET = 4
AFTER_BUDGET = "Rain, I guess."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time now",
            # llama.cpp renders a tool without parameters with `"parameters": {}`,
            # transformers without: given, the prompt is the same on both engines
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
# the call-like text in the thinking names the other tool: it must not become a call
CALL_THOUGHT = 'A <tool_call>{"name": "get_time", "arguments": {}}</tool_call> is not it.'
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
# harmony's messages: the analysis (thinking), then the final answer or a call
ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|end|><|start|>assistant<|channel|>final<|message|>"
HARMONY_CALL = (
    "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Oslo"}<|call|>'
)
# gpt-oss's thought at each effort (off: its lowest, the analysis closed at once)
LOW_THOUGHT, HIGH_THOUGHT = "Rain.", "Oslo is wet; rain, surely, as it is every day."
# each family's call, as its model writes it: Llama 3.1+'s JSON with `parameters`,
# Mistral's list after its [TOOL_CALLS] control token (left out of the decoded text)
CALLS = {
    "qwen3": f"<think>\n{CALL_THOUGHT}\n</think>\n\n{CALL}",
    "gptoss": f"{ANALYSIS}{CALL_THOUGHT}{HARMONY_CALL}",
    # R1's own block, after the thinking its prompt opened (tools in the system message:
    # its template lists none)
    "r1": f"{CALL_THOUGHT}\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
    '<｜tool▁sep｜>get_weather\n```json\n{"city": "Oslo"}\n```<｜tool▁call▁end｜>'
    "<｜tool▁calls▁end｜>",
    "llama3": '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, '
    '"id": "c4ll0sl0a"}]',
}
MODELS = ("qwen3-torch", "qwen3-llama.cpp", "r1-torch", "r1-llama.cpp")  # thinking turns off
GPT_OSS_MODELS = ("gptoss-torch", "gptoss-llama.cpp")
THINKING = MODELS + GPT_OSS_MODELS
TOOL_MODELS = tuple(f"{family}-{engine}" for family in CALLS for engine in ("torch", "llama.cpp"))


def qwen3_lessons() -> list[Lesson]:
    return [
        Lesson(
            ASK,
            f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}",
            budget=BUDGET,
            after_budget=f"\n\n{AFTER_BUDGET}",
        ),
        Lesson(ASK, ANSWER, switches={"enable_thinking": False}),
        Lesson(ASK, CALLS["qwen3"], tools=TOOLS),
    ]


def r1_lessons() -> list[Lesson]:
    return [
        Lesson(
            ASK,
            f"{THOUGHT}\n</think>\n\n{ANSWER}",
            budget=BUDGET,
            after_budget=f"\n\n{AFTER_BUDGET}",
        ),
        Lesson(ASK, ANSWER, closed=True),  # thinking off: the server closes the block
        Lesson(ASK, CALLS["r1"], tools=TOOLS),
    ]


def gpt_oss_lessons() -> list[Lesson]:
    return [
        Lesson(
            ASK, f"{ANALYSIS}{THOUGHT}{FINAL}{ANSWER}", budget=BUDGET, after_budget=AFTER_BUDGET
        ),
        Lesson(  # and thinking off: its lowest effort, the analysis closed at once
            ASK,
            f"{ANALYSIS}{LOW_THOUGHT}{FINAL}{ANSWER}",
            switches={"reasoning_effort": "low"},
            budget=0,
            after_budget=ANSWER,
        ),
        Lesson(
            ASK, f"{ANALYSIS}{HIGH_THOUGHT}{FINAL}{ANSWER}", switches={"reasoning_effort": "high"}
        ),
        Lesson(ASK, CALLS["gptoss"], tools=TOOLS),
    ]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("families")
    return {
        "qwen3": save_family_model(tmp / "qwen3", QWEN3, qwen3_lessons()),
        "r1": save_family_model(tmp / "r1", R1_DISTILL, r1_lessons()),
        "gptoss": save_family_model(tmp / "gptoss", GPT_OSS, gpt_oss_lessons()),
        "llama3": save_family_model(tmp / "llama3", LLAMA3, [Lesson(ASK, CALLS["llama3"], TOOLS)]),
        "mistral": save_family_model(
            tmp / "mistral", MISTRAL_NEMO, [Lesson(ASK, CALLS["mistral"], TOOLS)]
        ),
    }


@pytest.fixture(scope="module")
def live(models, tmp_path_factory):
    from tests.support.live import live_server, make_settings

    specs = []
    for family, folder in models.items():
        specs.append(
            ModelSpec(
                name=f"{family}-torch",
                kind="generation",
                path=folder,
                dtype="float32",
                load="startup",
            )
        )
        specs.append(
            ModelSpec(
                name=f"{family}-llama.cpp",
                kind="generation",
                path=folder.with_suffix(".gguf"),
                context_length=1024,
                parallel=2,
                load="startup",
            )
        )
    tmp = tmp_path_factory.mktemp("thinking")
    settings = make_settings(tmp, device="cpu", models=tuple(specs), queue_timeout=300)
    with live_server(settings) as server:
        yield server


def openai_client(live) -> OpenAI:
    return OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


def chat(live, model: str, **extra: Any) -> Any:
    """A greedy chat's whole answer (`extra`: the request's fields past the client's)."""
    return openai_client(live).chat.completions.create(
        model=model, messages=ASK, max_tokens=40, temperature=0, **extra
    )


def streamed(live, model: str, **extra: Any) -> list[tuple[str, str]]:
    """A greedy chat's stream as (kind, text) deltas: `reasoning` or `content`."""
    deltas = []
    chunks = openai_client(live).chat.completions.create(
        model=model, messages=ASK, max_tokens=40, temperature=0, stream=True, **extra
    )
    for chunk in chunks:
        for choice in chunk.choices:
            reasoning = (choice.delta.model_extra or {}).get("reasoning_content")
            if reasoning:
                deltas.append(("reasoning", reasoning))
            if choice.delta.content:
                deltas.append(("content", choice.delta.content))
    return deltas


def joined(deltas: list[tuple[str, str]], kind: str) -> str:
    return "".join(text for each, text in deltas if each == kind)


def thought_tokens(models: dict[str, Path], model: str, thought: str) -> int:
    return len(tokens_of(models[model.split("-")[0]], thought))


@pytest.mark.parametrize("model", THINKING)
def test_openai_chat_gives_the_thinking_apart_whole_and_streamed_in_order(live, model):
    message = chat(live, model).choices[0].message
    assert message.model_extra["reasoning_content"] == THOUGHT
    assert message.content == ANSWER
    deltas = streamed(live, model)
    assert joined(deltas, "reasoning") == THOUGHT and joined(deltas, "content") == ANSWER
    kinds = [kind for kind, _ in deltas]
    assert kinds == sorted(kinds, reverse=True)  # every reasoning delta before the answer's
    assert kinds.count("reasoning") > 1  # streamed as it came, not held to the end


@pytest.mark.parametrize("model", MODELS)
def test_thinking_off_gives_no_thinking(live, model):
    message = chat(live, model, reasoning_effort="none").choices[0].message
    assert message.content == ANSWER
    assert not (message.model_extra or {}).get("reasoning_content")
    deltas = streamed(live, model, reasoning_effort="none")
    assert joined(deltas, "content") == ANSWER and not joined(deltas, "reasoning")


@pytest.mark.parametrize("model", THINKING)
def test_a_budget_ends_the_thinking_by_its_last_token_and_the_answer_follows(live, models, model):
    budget = {"reasoning_budget_tokens": BUDGET}
    message = chat(live, model, extra_body=budget).choices[0].message
    thought = message.model_extra["reasoning_content"]
    assert 0 < thought_tokens(models, model, thought) <= BUDGET
    assert THOUGHT.startswith(thought) and message.content == AFTER_BUDGET
    deltas = streamed(live, model, extra_body=budget)
    assert joined(deltas, "reasoning") == thought and joined(deltas, "content") == AFTER_BUDGET


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_a_tool_call_in_the_familys_format_is_a_call_and_none_from_the_thinking(live, model):
    client = openai_client(live)
    asked = {"model": model, "messages": ASK, "tools": TOOLS, "max_tokens": 80, "temperature": 0}
    choice = client.chat.completions.create(**asked).choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    thought = CALL_THOUGHT if model.startswith(("qwen3", "gptoss", "r1")) else None
    assert (choice.message.model_extra or {}).get("reasoning_content") == thought
    names, arguments, reasoning = [], "", ""
    for chunk in client.chat.completions.create(**asked, stream=True):
        for each in chunk.choices:
            reasoning += (each.delta.model_extra or {}).get("reasoning_content") or ""
            for part in each.delta.tool_calls or []:
                names += [part.function.name] if part.function.name else []
                arguments += part.function.arguments or ""
    assert names == ["get_weather"] and json.loads(arguments) == {"city": "Oslo"}
    assert reasoning == (thought or "")


@pytest.mark.parametrize("model", GPT_OSS_MODELS)
def test_a_budget_leaves_a_call_after_a_shorter_analysis_whole(live, models, model):
    """The analysis ended itself within the budget (`<|end|>`, then the call's header):
    the budget forces nothing into the call after it."""
    budget = thought_tokens(models, model, CALL_THOUGHT) + 2
    asked = {"model": model, "messages": ASK, "tools": TOOLS, "max_tokens": 80, "temperature": 0}
    extra = {"reasoning_budget_tokens": budget}
    choice = openai_client(live).chat.completions.create(**asked, extra_body=extra).choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert choice.message.model_extra["reasoning_content"] == CALL_THOUGHT


@pytest.mark.parametrize("model", THINKING)
def test_ollama_gives_message_thinking_and_think_false_turns_it_off(live, model):
    client = ollama.Client(host=live.url)
    greedy = {"temperature": 0, "num_predict": 40}
    answer = client.chat(model=model, messages=ASK, options=greedy)
    assert answer.message.thinking == THOUGHT and answer.message.content == ANSWER
    chunks = list(client.chat(model=model, messages=ASK, options=greedy, stream=True))
    thinking = [c.message.thinking for c in chunks if c.message.thinking]
    content = [c.message.content for c in chunks if c.message.content]
    assert "".join(thinking) == THOUGHT and "".join(content) == ANSWER
    first_word = next(i for i, c in enumerate(chunks) if c.message.content)
    assert all(not c.message.thinking for c in chunks[first_word:])
    off = client.chat(model=model, messages=ASK, options=greedy, think=False)
    assert not off.message.thinking and off.message.content == ANSWER
    generated = client.generate(model=model, prompt=ASK[0]["content"], options=greedy)
    assert generated.thinking == THOUGHT and generated.response == ANSWER


@pytest.mark.parametrize("model", THINKING)
def test_anthropic_thinking_blocks_their_budget_and_none_unasked(live, models, model):
    client = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0)
    greedy = {"temperature": 0}  # this client's create() has no such parameter
    asked = {"model": model, "max_tokens": 40, "messages": ASK, "extra_body": greedy}
    thinking = {"type": "enabled", "budget_tokens": BUDGET}
    message = client.messages.create(**asked, thinking=thinking)
    block, text = message.content
    assert block.type == "thinking" and 0 < thought_tokens(models, model, block.thinking) <= BUDGET
    assert text.type == "text" and text.text == AFTER_BUDGET
    with client.messages.stream(**asked, thinking=thinking) as stream:
        events = [e for e in stream if e.type == "content_block_delta"]
    kinds = [event.delta.type for event in events]
    assert kinds.index("text_delta") > max(i for i, k in enumerate(kinds) if k == "thinking_delta")
    unasked = client.messages.create(**asked)  # thinking as the model does, not shown
    assert [(b.type, b.text) for b in unasked.content] == [("text", ANSWER)]
    off = client.messages.create(**asked, thinking={"type": "disabled"})
    assert [(b.type, b.text) for b in off.content] == [("text", ANSWER)]


@pytest.mark.parametrize("model", THINKING)
def test_responses_give_a_reasoning_item_before_the_message(live, model):
    client = openai_client(live)
    answer = client.responses.create(model=model, input=ASK[0]["content"], temperature=0)
    reasoning, said = answer.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    assert said.type == "message" and answer.output_text == ANSWER
    events = list(
        client.responses.create(model=model, input=ASK[0]["content"], temperature=0, stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds.index("response.output_text.delta") > kinds.index("response.reasoning_text.done")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == THOUGHT
    off = client.responses.create(
        model=model, input=ASK[0]["content"], temperature=0, reasoning={"effort": "none"}
    )
    assert [item.type for item in off.output] == ["message"] and off.output_text == ANSWER


def test_gpt_oss_effort_is_its_templates_reasoning_line(models):
    """What the server gives gpt-oss's template: `Reasoning: high` for a high effort, its
    lowest where thinking is asked off, its own default (medium) where nothing is asked."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models["gptoss"])
    template = tokenizer.chat_template

    def rendered(ask: ThinkingAsk) -> str:
        switches = template_switches(template, ask)
        return tokenizer.apply_chat_template(ASK, tokenize=False, **switches)

    assert "Reasoning: high\n" in rendered(ThinkingAsk.from_effort("high"))
    assert "Reasoning: low\n" in rendered(ThinkingAsk.from_effort("none"))
    assert "Reasoning: medium\n" in rendered(ThinkingAsk())


@pytest.mark.parametrize("model", GPT_OSS_MODELS)
def test_gpt_oss_effort_reaches_its_template_on_every_api_and_off_gives_none(live, model):
    """Each API's effort field, as the thought the model was taught for that effort; off
    (`none`) gives no thinking, where `low` gives the low one."""
    high = chat(live, model, reasoning_effort="high").choices[0].message
    assert high.model_extra["reasoning_content"] == HIGH_THOUGHT and high.content == ANSWER
    off = chat(live, model, reasoning_effort="none").choices[0].message
    assert not off.model_extra.get("reasoning_content") and off.content == ANSWER
    low = chat(live, model, reasoning_effort="low").choices[0].message
    assert low.model_extra["reasoning_content"] == LOW_THOUGHT and low.content == ANSWER
    client = ollama.Client(host=live.url)
    greedy = {"temperature": 0, "num_predict": 40}
    assert client.chat(
        model=model, messages=ASK, options=greedy, think="high"
    ).message.thinking == (HIGH_THOUGHT)
    answer = openai_client(live).responses.create(
        model=model, input=ASK[0]["content"], temperature=0, reasoning={"effort": "high"}
    )
    assert answer.output[0].content[0].text == HIGH_THOUGHT and answer.output_text == ANSWER
    messages = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0).messages
    effort = {"temperature": 0, "output_config": {"effort": "high"}}
    thinking = {"type": "enabled", "budget_tokens": 1024}
    said = messages.create(
        model=model, max_tokens=40, messages=ASK, thinking=thinking, extra_body=effort
    )
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in said.content] == [
        ("thinking", HIGH_THOUGHT),
        ("text", ANSWER),
    ]
