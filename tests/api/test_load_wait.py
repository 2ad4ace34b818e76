"""A streamed chat whose model loads first is told how the load goes before its first
token (app.api.load_wait): over HTTP, a simulated model whose load takes 2 s; Ollama's
NDJSON carries chunks with an empty message and a `status`, OpenAI's events comment
lines (chat and Responses), Anthropic's a comment and a ping; the official `ollama`,
`openai` and `anthropic` clients read the streams as before. A model
already loaded streams no such line."""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import openai

from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings, wait_until

HELLO = [{"role": "user", "content": "hello"}]
SHORT = {"num_predict": 4}


def unload(live: Live) -> None:
    httpx.post(live.url + "/admin/models/slow/unload", timeout=60).raise_for_status()


def held(live: Live) -> tuple[int, int]:
    """What the gate holds now: admitted bytes and running jobs."""
    device = live.status()["devices"][0]
    return device["admitted_bytes"], device["running"]


def ollama_lines(live: Live) -> list[dict]:
    body = {"model": "slow", "messages": HELLO, "stream": True, "options": {"num_predict": 4}}
    with httpx.stream("POST", live.url + "/api/chat", json=body, timeout=60) as answer:
        assert answer.status_code == 200
        return [json.loads(line) for line in answer.iter_lines() if line]


def openai_lines(live: Live) -> list[str]:
    body = {"model": "slow", "messages": HELLO, "stream": True, "max_tokens": 4}
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def test_a_streamed_chat_that_loads_its_model_hears_the_load_before_its_first_token(tmp_path):
    slow = ModelSpec(name="slow", kind="simulated", load_ms=2000, load="demand")
    settings = make_settings(tmp_path, device="simulated:4GiB", models=(slow,))
    with live_server(settings) as live:
        lines = ollama_lines(live)
        told = [line for line in lines if "status" in line]
        first = next(i for i, line in enumerate(lines) if line["message"]["content"])
        assert told and all(i < first for i, line in enumerate(lines) if "status" in line)
        assert told[0]["status"].startswith("loading slow: loading")
        assert all(line["message"] == {"role": "assistant", "content": ""} for line in told)
        assert not told[0]["done"] and lines[-1]["done"]
        assert "status" not in ollama_lines(live)[0]  # loaded: no load to tell
        unload(live)
        said = ollama.Client(host=live.url).chat("slow", HELLO, stream=True, options=SHORT)
        chunks = list(said)
        assert chunks[-1].done and "".join(c.message.content or "" for c in chunks)

        unload(live)
        events = openai_lines(live)
        comments = [e for e in events if e.startswith(":")]
        assert comments and comments[0].startswith(": loading slow: loading")
        assert events.index(comments[-1]) < min(
            i for i, e in enumerate(events) if e.startswith("data: ")
        )
        assert events[-1] == "data: [DONE]"
        assert not any(e.startswith(":") for e in openai_lines(live))
        unload(live)
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="none")
        stream = client.chat.completions.create(
            model="slow", messages=HELLO, stream=True, max_tokens=4
        )
        texts = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(texts)

        unload(live)  # Anthropic's: a comment and a ping before message_start
        body = {"model": "slow", "messages": HELLO, "stream": True, "max_tokens": 4}
        with httpx.stream("POST", live.url + "/v1/messages", json=body, timeout=60) as r:
            events = [line for line in r.iter_lines() if line]
        start = events.index("event: message_start")
        assert events[0].startswith(": loading slow: loading") and "event: ping" in events[:start]
        assert events[-1] == 'data: {"type":"message_stop"}'
        unload(live)
        claude = anthropic.Anthropic(base_url=live.url, api_key="none")
        with claude.messages.stream(model="slow", messages=HELLO, max_tokens=4) as stream:
            assert "".join(stream.text_stream)

        unload(live)  # OpenAI's Responses: comment lines before response.created
        body = {"model": "slow", "input": "hello", "stream": True, "max_output_tokens": 4}
        with httpx.stream("POST", live.url + "/v1/responses", json=body, timeout=60) as r:
            events = [line for line in r.iter_lines() if line]
        created = events.index("event: response.created")
        assert events[0].startswith(": loading slow: loading")
        assert all(e.startswith(":") for e in events[:created]), events[:created]
        assert "event: response.incomplete" in events  # its 4 tokens' end: "length"
        with httpx.stream("POST", live.url + "/v1/responses", json=body, timeout=60) as r:
            assert next(r.iter_lines()) == "event: response.created"  # loaded: nothing to tell
        unload(live)
        streamed = client.responses.create(
            model="slow", input="hello", stream=True, max_output_tokens=4
        )
        kinds = [event.type for event in streamed]
        assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete", kinds
        assert "response.output_text.delta" in kinds

        unload(live)  # a caller that leaves during the load leaves nothing admitted behind
        long = {"num_predict": 4000}  # 20 s of steps: an answer left running would hold on
        body = {"model": "slow", "messages": HELLO, "stream": True, "options": long}
        with httpx.stream("POST", live.url + "/api/chat", json=body, timeout=60) as answer:
            assert "status" in json.loads(next(answer.iter_lines()))
        loaded = lambda: live.status()["models"][0]["state"] == "ready"  # noqa: E731
        wait_until(loaded, 30, "the load the leaving caller began, done")
        wait_until(lambda: not any(held(live)), 10, "its admission let go")
        assert ollama_lines(live)[-1]["done"]
        assert live.status()["queue"]["depth"] == 0


def test_a_responses_stream_whose_load_runs_out_of_memory_ends_with_the_refusal(tmp_path):
    """The load a streamed Responses answer waits for runs out of memory (another program
    took memory midway): the stream, begun with the load's progress, ends with the
    refusal as the Responses API's `error` event (503 model_loading: its status was
    sent) and holds nothing; the positive control: the same request once the memory is
    back is answered."""
    slow = ModelSpec(name="slow", kind="simulated", weights=600 * 2**20, load_ms=2000)
    models = (ModelSpec(name="first", kind="simulated"), slow.model_copy(update={"load": "demand"}))
    settings = make_settings(tmp_path, device="simulated:4GiB", models=models)
    body = {"model": "slow", "input": "hello", "stream": True, "max_output_tokens": 4}
    with live_server(settings) as live:
        device = live.service.device
        with httpx.stream("POST", live.url + "/v1/responses", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith(": loading slow: loading")
            device.set_external(3700 * 2**20)  # a game starts during the load
            events = [line for line in lines if line]
        assert not any(held(live))  # its next try waits for room, holding nothing
        error = events.index("event: error")
        refusal = json.loads(events[error + 1][len("data: ") :])
        assert refusal["type"] == "error" and refusal["code"] == "model_loading", refusal
        assert "ran out of memory" in refusal["message"]
        device.set_external(0)
        wait_until(lambda: live.status()["device"]["used_by_others_bytes"] == 0, 10, "seen")
        with httpx.stream("POST", live.url + "/v1/responses", json=body, timeout=60) as r:
            served = [line for line in r.iter_lines() if line]
        assert "event: error" not in served and "event: response.incomplete" in served, served
