"""A chat past its model's context (app.core.overflow): which turns may go, and on a live
server with a small random Llama of a 256-token context, both policies through the
official clients: refused in OpenAI's words on OpenAI's route by default, answered with
its oldest middle turns dropped on Ollama's (as Ollama answers) or where the model says
`truncate_middle`, said in the header and in usage each time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ollama import Client
from openai import BadRequestError, OpenAI

from app.config.settings import ModelSpec
from app.core.overflow import middle_turns, without
from tests.support.live import Live, live_server, make_settings
from tests.support.random_models import save_random_llama

CONTEXT = 256
WORDS = "cats and dogs and birds " * 8  # a long turn


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def said(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "Be brief."}
# three long turns and a short last one: about 4 x 80 tokens, past 256
CHAT = [SYSTEM, user("1 " + WORDS), said("one"), user("2 " + WORDS), said("two")]
CHAT += [user("3 " + WORDS), said("three"), user("And now?")]


def test_the_turns_that_may_go_are_whole_and_never_the_system_prompt_or_the_last():
    assert middle_turns(CHAT) == [(1, 3), (3, 5), (5, 7)]
    assert without(CHAT, [(1, 3)]) == [SYSTEM, *CHAT[3:]]
    calls = [user("time?"), {"role": "assistant", "tool_calls": []}, {"role": "tool"}]
    assert middle_turns([SYSTEM, *calls, user("and?")]) == [(1, 4)]  # a call with its result
    assert middle_turns([said("hello"), user("a"), said("b"), user("c")]) == [(0, 3)]
    assert middle_turns([SYSTEM, user("only")]) == []
    assert middle_turns([SYSTEM, SYSTEM]) == []


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("overflow")
    tiny = save_random_llama(root / "tiny", context=CONTEXT)
    models = (
        ModelSpec(name="tiny", kind="generation", path=tiny),
        ModelSpec(name="cut", kind="generation", path=tiny, context_overflow="truncate_middle"),
    )
    with live_server(make_settings(root, device="cpu", models=models)) as served:
        yield served


def ollama_chat(live: Live, model: str, messages: list[Any]) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "stream": False}
    body["options"] = {"temperature": 0, "num_predict": 4}
    answer = httpx.post(live.url + "/api/chat", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_ollamas_route_drops_the_oldest_turns_and_says_so(live):
    """The answer's prompt is exactly the chat without its oldest turns (the same count
    as that shorter chat sent whole); Ollama's client reads the answer unchanged."""
    whole = ollama_chat(live, "tiny", CHAT)
    dropped = whole["truncated"]["messages"]
    assert dropped in (2, 4), whole  # whole turns, two messages each; not every one
    kept = [SYSTEM, *CHAT[1 + dropped :]]
    alone = ollama_chat(live, "tiny", kept)
    assert alone.get("truncated") is None  # it fits as it is
    assert whole["prompt_eval_count"] == alone["prompt_eval_count"]
    # the fewest: one turn fewer dropped would not have fitted (refused where not cut)
    fewer = [SYSTEM, *CHAT[1 + dropped - 2 :]]
    client = OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(BadRequestError):
        client.chat.completions.create(model="tiny", messages=fewer, max_tokens=4)  # type: ignore[arg-type]
    assert whole["truncated"]["tokens"] > 0
    answer = Client(host=live.url).chat(model="tiny", messages=CHAT, options={"num_predict": 2})
    assert answer.message.content is not None and answer.done


def test_openais_route_refuses_by_default_and_truncates_where_the_model_says(live):
    client = OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4)  # type: ignore[arg-type]
    assert refused.value.code == "context_length_exceeded"
    short = client.chat.completions.create(model="tiny", messages=CHAT[-1:], max_tokens=2)  # type: ignore[arg-type]
    assert short.usage is not None and short.usage.model_extra.get("truncated") is None  # the twin
    raw = client.chat.completions.with_raw_response.create(
        model="cut",
        messages=CHAT,
        max_tokens=4,
        temperature=0,  # type: ignore[arg-type]
    )
    answer = raw.parse()
    assert answer.usage is not None
    truncated = answer.usage.model_extra["truncated"]
    assert raw.headers["x-vramgate-truncated"] == (
        f"messages={truncated['messages']}; tokens={truncated['tokens']}"
    )
    kept = [SYSTEM, *CHAT[1 + truncated["messages"] :]]
    alone = client.chat.completions.create(model="cut", messages=kept, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert alone.usage is not None and answer.usage.prompt_tokens == alone.usage.prompt_tokens
    assert answer.choices[0].message.content == alone.choices[0].message.content
    # streamed: the header at once, usage in the last chunk
    with client.chat.completions.with_streaming_response.create(
        model="cut",
        messages=CHAT,
        max_tokens=4,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    ) as streamed:
        assert streamed.headers["x-vramgate-truncated"] == raw.headers["x-vramgate-truncated"]
        chunks = list(streamed.parse())
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.model_extra["truncated"] == truncated


def test_a_last_turn_past_the_context_alone_is_refused_even_so(live):
    client = OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    past = [SYSTEM, user("1"), said("one"), user(WORDS * 4)]
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="cut", messages=past, max_tokens=4)  # type: ignore[arg-type]
    assert refused.value.code == "context_length_exceeded"
