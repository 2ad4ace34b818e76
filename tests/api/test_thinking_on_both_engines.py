"""A reasoning model's thinking kept apart, switched and budgeted, and each family's tool
calls read as calls, through the official `openai`, `ollama` and `anthropic` clients, on
both engines: tiny models with the real chat templates of Qwen3 (its model writes
`<think>`; `enable_thinking` switches it), a DeepSeek-R1 distill (its prompt opens the
block; no switch), Llama 3.3 and Mistral Nemo, taught their answers on the spot
(tests/support/families.py), served on the torch engine (safetensors) and on llama.cpp
(the same model as a GGUF) by one server.

Each answer's thinking comes back apart from its text, streamed in order (all of the
thinking before the first word of the answer); thinking off gives none; a budget of 4
ends the thinking by its 4th token and the answer follows (the model was taught what it
says after a thought closed there); a tool call in the family's own format (after
thinking, for Qwen3) comes back as a call, whole and streamed, and the call-like text
inside the thinking does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import ollama
import pytest
from openai import OpenAI

from app.config.settings import ModelSpec
from tests.support.families import (
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
# each family's call, as its model writes it: Llama 3.1+'s JSON with `parameters`,
# Mistral's list after its [TOOL_CALLS] control token (left out of the decoded text)
CALLS = {
    "qwen3": f"<think>\n{CALL_THOUGHT}\n</think>\n\n{CALL}",
    "llama3": '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, '
    '"id": "c4ll0sl0a"}]',
}
MODELS = ("qwen3-torch", "qwen3-llama.cpp", "r1-torch", "r1-llama.cpp")
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
    ]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("families")
    return {
        "qwen3": save_family_model(tmp / "qwen3", QWEN3, qwen3_lessons()),
        "r1": save_family_model(tmp / "r1", R1_DISTILL, r1_lessons()),
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


@pytest.mark.parametrize("model", MODELS)
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


@pytest.mark.parametrize("model", MODELS)
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
    thought = CALL_THOUGHT if model.startswith("qwen3") else None
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


@pytest.mark.parametrize("model", MODELS)
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


@pytest.mark.parametrize("model", MODELS)
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


@pytest.mark.parametrize("model", MODELS)
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
