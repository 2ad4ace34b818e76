"""Chat and completions over real HTTP: a small random Llama built here (real tokenizer
files, loaded like a user's model) on the CPU, and the simulated model on a simulated
pool for admission of many streams."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import httpx
import pytest
from openai import BadRequestError, OpenAI

from app.config.settings import ModelSpec, SimulatedBucket
from tests.support.live import wait_until
from tests.support.random_models import save_random_llama

MiB = 2**20
CONTEXT = 1024


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("tiny-llama"), context=CONTEXT)


@pytest.fixture
def tiny(server_factory, llama_folder):
    return server_factory(
        models=(ModelSpec(name="tiny", kind="generation", path=llama_folder),),
        health_interval=3600,
    )


def chat(content: str, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}]} | extra


def test_openai_client_streams_a_chat_with_usage_at_the_end(tiny):
    client = OpenAI(base_url=tiny.url + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens > 5
    assert all(c.usage is None for c in chunks[:-1])  # OpenAI: null on all but the last
    assert len({c.id for c in chunks}) == 1
    # The same request without streaming gives the same greedy text.
    whole = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert whole.choices[0].message.content == text
    assert whole.usage.completion_tokens == 12


def test_completions_are_seeded_and_stop_at_stop_strings(tiny):
    with tiny.client() as client:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 20, "seed": 7}
        first = client.post("/v1/completions", json=body).json()
        again = client.post("/v1/completions", json=body).json()
        assert first["choices"][0]["text"] == again["choices"][0]["text"]
        assert first["object"] == "text_completion" and first["usage"]["completion_tokens"] == 20
        text = first["choices"][0]["text"]
        stop = text[len(text) // 2 : len(text) // 2 + 2]
        cut = client.post("/v1/completions", json={**body, "stop": stop}).json()
        assert cut["choices"][0]["finish_reason"] == "stop"
        assert cut["choices"][0]["text"] == text[: text.index(stop)]
        assert int(client.post("/v1/completions", json=body).headers["X-Vramgate-Price-Bytes"]) > 0


def test_the_kv_bytes_per_token_are_measured_on_the_cache_and_shown(tiny):
    """The tiny Llama's geometry: 2 layers × 2 KV heads × head size 16 × K and V × the
    element size of the dtype it loaded in (on the CPU the faster of float32 and bfloat16,
    timed at load: 512 or 256 bytes per token). The server measures it on the real
    cache's tensors."""
    with tiny.client() as client:
        for max_tokens in (8, 40):
            r = client.post("/v1/chat/completions", json=chat("hi", max_tokens=max_tokens))
            assert r.status_code == 200
        price = int(r.headers["X-Vramgate-Price-Bytes"])
    model = next(m for m in tiny.status()["models"] if m["name"] == "tiny")
    lines = [p for p in model["prices"] if p["bucket"].startswith("p")]
    element = {"float32": 4, "bfloat16": 2}[model["dtype"]]
    assert {line["per_token_bytes"] for line in lines} == {2 * 2 * 16 * 2 * element}
    assert {line["source"] for line in lines} <= {"learned", "learned_rate"}
    assert sum(line["samples"] for line in lines) >= 3  # warm-up and both chats
    assert price >= 2 * 2 * 16 * 2 * element * 64  # the 40-token answer's bucket: 64 tokens
    assert model["kind"] == "generation" and model["context"] == CONTEXT


def test_prompt_longer_than_the_context_gets_a_400_that_says_so(tiny):
    long = "Hello! How are you today? " * 400
    r = httpx.post(tiny.url + "/v1/chat/completions", json=chat(long), timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith(f"This model's maximum context length is {CONTEXT} tokens")
    assert error["context_length"] == CONTEXT and error["prompt_tokens"] >= CONTEXT
    assert tiny.status()["queue"]["depth"] == 0


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 17}, "n"),
        ({"n": 0}, "n"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"keep_alive": "five minutes"}, "keep_alive"),
        ({"keep_alive": True}, "keep_alive"),
        ({"seed": -5}, "seed"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": "x" * 100}, "stop"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ],
)
def test_bad_generation_fields_get_400_and_nothing_runs(tiny, extra, param):
    handler = tiny.service.registry.get("tiny")
    steps = handler.forward_calls
    r = httpx.post(tiny.url + "/v1/chat/completions", json={**chat("hi"), **extra}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert handler.forward_calls == steps


def test_wrong_model_kind_is_a_400_both_ways(tiny, minilm):
    r = httpx.post(tiny.url + "/v1/embeddings", json={"model": "tiny", "input": "x"}, timeout=30)
    assert r.status_code == 400 and "has no embeddings" in r.json()["error"]["message"]
    body = {"model": "all-MiniLM-L6-v2", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(minilm.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_model"


def test_the_lists_start_with_what_chats_and_a_wrong_kind_loads_nothing(
    server_factory, llama_folder
):
    """The embedded MiniLM first in the config, as it is on the defaults: the lists give
    the chat model first (Open WebUI pre-selects the first), and a chat sent to MiniLM
    while neither is loaded is refused in plain words without loading it (before: loaded
    and warmed up, then refused as "a embedding model"); its valid twin, an embedding,
    loads it and is served."""
    from ollama import Client, ResponseError

    live = server_factory(
        models=(
            ModelSpec(name="all-MiniLM-L6-v2", load="demand"),
            ModelSpec(name="tiny", kind="generation", path=llama_folder, load="demand"),
        ),
        health_interval=3600,
    )
    client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny", "all-MiniLM-L6-v2"]
    tags = Client(host=live.url).list().models
    assert [m.model for m in tags] == ["tiny", "all-MiniLM-L6-v2"]

    def states() -> dict[str, str]:
        return {m["name"]: m["state"] for m in live.status()["models"]}

    assert states() == {"all-MiniLM-L6-v2": "unloaded", "tiny": "unloaded"}
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(
            model="all-MiniLM-L6-v2", messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.code == "unsupported_model"
    assert refused.value.body["message"] == (
        "model 'all-MiniLM-L6-v2' is an embedding model: it does not generate text"
    )
    with pytest.raises(ResponseError) as through_ollama:
        Client(host=live.url).chat(
            model="all-MiniLM-L6-v2", messages=[{"role": "user", "content": "hi"}]
        )
    assert through_ollama.value.status_code == 400
    assert states() == {"all-MiniLM-L6-v2": "unloaded", "tiny": "unloaded"}  # nothing loaded
    served = client.embeddings.create(model="all-MiniLM-L6-v2", input="hi")
    assert len(served.data[0].embedding) == 384
    assert states()["all-MiniLM-L6-v2"] in ("warming", "ready")  # loaded for it


def test_disconnect_mid_stream_stops_generation_and_frees_the_permit(tiny):
    handler = tiny.service.registry.get("tiny")
    before = handler.forward_calls
    body = chat("Tell me everything.", max_tokens=900, temperature=0, stream=True)
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", tiny.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        assert int(r.headers["X-Vramgate-Price-Bytes"]) > 0
        events = (line for line in r.iter_lines() if line)
        for _ in range(10):
            assert next(events).startswith("data: ")

        admitted = tiny.status()["pool"]["admitted_bytes"]
        assert admitted > 0
    # The connection is closed: the permit comes back and generation stops.
    wait_until(lambda: tiny.status()["pool"]["admitted_bytes"] == 0, 30, "permit back")
    steps = handler.forward_calls - before
    time.sleep(0.5)
    assert handler.forward_calls - before == steps, "generation kept running"
    assert steps < 300, f"{steps} steps for a stream dropped after 10 chunks"
    assert tiny.status()["queue"]["running"] == 0


# Left to other programs on the simulated 1 GiB device: its pool holds two 300 MiB streams,
# not the three the device would take; a gate that ignored the reserve would run three.
RESERVE = 200 * MiB


def test_simulated_16_streams_are_admitted_by_price_without_overcommit(server_factory):
    # Each stream's bucket costs 300 MiB; the 1 GiB device less its reserve holds two.
    model = ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(
            SimulatedBucket(size=16, bytes=100 * MiB, run_ms=5),
            SimulatedBucket(size=64, bytes=300 * MiB, run_ms=5),
        ),
    )
    live = server_factory(device="simulated:1GiB", reserve=RESERVE, models=(model,), max_queue=8)

    async def one(client: httpx.AsyncClient) -> tuple[int, str | None, list[str]]:
        body = {
            "model": "sim",
            "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": 40,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = [line async for line in r.aiter_lines() if line]
            return r.status_code, r.headers.get("Retry-After"), lines

    async def all_streams():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            return await asyncio.gather(*(one(client) for _ in range(16)))

    results = asyncio.run(all_streams())
    device = live.service.device
    assert device.oom_count == 0
    assert device.high_water <= 1024 * MiB - RESERVE, device.high_water / MiB
    served = [lines for status, _, lines in results if status == 200]
    refused = [(status, retry) for status, retry, _ in results if status != 200]
    assert len(served) + len(refused) == 16
    assert served, "no stream was served"
    for status, retry in refused:
        assert status == 503 and retry is not None and int(retry) >= 1
    for lines in served:
        assert lines[-1] == "data: [DONE]"
        last, tail = (json.loads(line[len("data: ") :]) for line in lines[-3:-1])
        assert last["choices"][0]["finish_reason"] == "length"
        assert tail["choices"] == [] and tail["usage"]["completion_tokens"] == 40
    status = live.status()
    assert status["pool"]["admitted_bytes"] == 0 and status["queue"]["depth"] == 0
    prices = {p["bucket"]: p["price_bytes"] for p in status["models"][0]["prices"]}
    # each priced on one sample (its warm-up), which shows no spread: 10% above it
    assert prices["w64"] == math.ceil(300 * MiB * 1.1)
    assert prices["w16"] == math.ceil(100 * MiB * 1.1)


def test_pickled_weights_are_never_loaded(server_factory, tmp_path, llama_folder):
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    pickled = tmp_path / "pickled"
    shutil.copytree(llama_folder, pickled)
    model = AutoModelForCausalLM.from_pretrained(pickled)
    (pickled / "model.safetensors").unlink()
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    live = server_factory(
        models=(ModelSpec(name="pickled", kind="generation", path=pickled),), ready=False
    )
    wait_until(lambda: live.service.registry.entries["pickled"].state == "failed", 60, "failed")
    assert "safetensors" in (live.service.registry.entries["pickled"].error or "")


def test_same_answer_under_load_for_seeded_sampling(tiny):
    body = chat("Hello! How are you?", max_tokens=24, temperature=1.0, top_p=0.9, seed=1234)
    alone = httpx.post(tiny.url + "/v1/chat/completions", json=body, timeout=60).json()
    expected = alone["choices"][0]["message"]["content"]

    async def many() -> list[dict]:
        async with httpx.AsyncClient(base_url=tiny.url, timeout=120) as client:
            streamed = {**body, "stream": True}
            plain = [client.post("/v1/chat/completions", json=body) for _ in range(6)]
            streams = [client.post("/v1/chat/completions", json=streamed) for _ in range(6)]
            return await asyncio.gather(*plain, *streams)

    answers = asyncio.run(many())
    for r in answers[:6]:
        assert r.json()["choices"][0]["message"]["content"] == expected
    for r in answers[6:]:
        chunks = [
            json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")
        ]
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        assert text == expected


def test_disconnect_during_a_non_streamed_chat_stops_generation(tiny):
    """The tiny model steps in well under a millisecond on a fast CPU (770 steps in the
    0.5 s this test once waited): the client leaves after 0.1 s of a 960-token answer
    and the generation must end far short of it."""
    handler = tiny.service.registry.get("tiny")
    before = handler.forward_calls
    body = chat("Tell me everything.", max_tokens=960, temperature=0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(tiny.url + "/v1/chat/completions", json=body, timeout=0.1)
    wait_until(lambda: tiny.status()["pool"]["admitted_bytes"] == 0, 30, "permit back")
    steps = handler.forward_calls - before
    time.sleep(0.5)
    assert handler.forward_calls - before == steps, "generation kept running"
    assert steps < 900, f"{steps} steps for a client that left after 0.1 s"


def test_a_stream_that_leaves_frees_its_row_and_bytes_and_the_other_goes_on(tiny):
    handler = tiny.service.registry.get("tiny")
    body = chat("Tell me a very long story.", max_tokens=960, temperature=0)
    url = tiny.url + "/v1/chat/completions"
    alone = httpx.post(url, json=body, timeout=120).json()["choices"][0]["message"]["content"]
    result: dict[str, str] = {}

    def run_a() -> None:
        answer = httpx.post(url, json=body, timeout=120).json()
        result["a"] = answer["choices"][0]["message"]["content"]

    a = threading.Thread(target=run_a)
    a.start()
    wait_until(lambda: handler.batch_rows == 1, 30, "A runs")
    price_a = tiny.status()["pool"]["admitted_bytes"]
    b_body = chat("Something else entirely.", max_tokens=960, temperature=0, stream=True)
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=b_body) as r:
        assert r.status_code == 200
        events = (line for line in r.iter_lines() if line)
        for _ in range(5):
            assert next(events).startswith("data: ")
        assert handler.batch_rows == 2
        assert tiny.status()["pool"]["admitted_bytes"] > price_a
    # B's client is gone: its row leaves at the next step, its bytes come back
    wait_until(lambda: tiny.status()["pool"]["admitted_bytes"] == price_a, 30, "B's bytes back")
    assert handler.batch_rows == 1 and a.is_alive(), "A ended before B left: make A longer"
    a.join(timeout=120)
    assert result["a"] == alone  # A's text is what it is alone


def test_simulated_streams_beyond_the_pool_wait_and_are_all_served(server_factory):
    # Each stream's bucket costs 300 MiB; the 1 GiB device less its reserve holds two.
    model = ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(SimulatedBucket(size=64, bytes=300 * MiB, run_ms=5),),
    )
    live = server_factory(device="simulated:1GiB", reserve=RESERVE, models=(model,), max_queue=64)

    async def one(client: httpx.AsyncClient) -> tuple[int, float, str]:
        body = chat("one two three", model="sim", max_tokens=40, stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = [line async for line in r.aiter_lines() if line]
            return r.status_code, float(r.headers.get("X-Vramgate-Queue-Ms", "0")), lines[-1]

    async def all_streams():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            return await asyncio.gather(*(one(client) for _ in range(12)))

    results = asyncio.run(all_streams())
    device = live.service.device
    assert device.oom_count == 0
    assert device.high_water <= 1024 * MiB - RESERVE, device.high_water / MiB
    assert [status for status, _, _ in results] == [200] * 12
    assert all(last == "data: [DONE]" for _, _, last in results)
    assert sum(1 for _, waited, _ in results if waited > 0) >= 10  # ten waited for room


def test_n_choices_are_streams_of_their_own_each_reproducible(tiny):
    """`n` choices: seeded choice i samples with seed + i, so the choices differ and each
    equals the lone request with that seed; usage counts the prompt once."""
    client = OpenAI(base_url=tiny.url + "/v1", api_key="unused", max_retries=0)
    asked = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story."}]}
    many = client.chat.completions.create(**asked, n=3, seed=11, max_tokens=10, temperature=1.0)
    texts = [choice.message.content for choice in sorted(many.choices, key=lambda c: c.index)]
    assert [c.index for c in many.choices] == [0, 1, 2] and len(set(texts)) == 3
    for i in range(3):
        one = client.chat.completions.create(**asked, seed=11 + i, max_tokens=10, temperature=1.0)
        assert one.choices[0].message.content == texts[i]
    assert many.usage.completion_tokens == 30
    assert many.usage.prompt_tokens == one.usage.prompt_tokens
    streamed = client.chat.completions.create(
        **asked, n=3, seed=11, max_tokens=10, temperature=1.0, stream=True
    )
    parts: dict[int, str] = {0: "", 1: "", 2: ""}
    finishes: dict[int, str] = {}
    for chunk in streamed:
        for choice in chunk.choices:
            parts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert [parts[i] for i in range(3)] == texts
    assert finishes == {0: "length", 1: "length", 2: "length"}


def test_logprobs_and_echo_in_openais_shapes(tiny):
    client = OpenAI(base_url=tiny.url + "/v1", api_key="unused", max_retries=0)
    chat_answer = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat_answer.choices[0].logprobs.content
    assert len(content) == chat_answer.usage.completion_tokens == 6
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.logprob == entry.top_logprobs[0].logprob  # greedy
        assert bytes(entry.bytes) == entry.token.encode()
    text = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=5, logprobs=2, temperature=0
    )
    logprobs = text.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == text.usage.completion_tokens
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0
    echoed = client.completions.create(model="tiny", prompt="Hello", max_tokens=5, echo=True)
    assert echoed.choices[0].text.startswith("Hello")
    streamed = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        stream=True,
    )
    entries = [e for c in streamed for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert [e.token for e in entries] == [e.token for e in content]


def test_echo_with_logprobs_is_a_400_naming_echo(tiny):
    body = {"model": "tiny", "prompt": "Hi", "echo": True, "logprobs": 1, "max_tokens": 2}
    r = httpx.post(tiny.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_without_include_usage_no_chunk_carries_a_usage_field(tiny):
    body = chat("Tell me a story.", max_tokens=5, stream=True, temperature=0)
    with httpx.stream("POST", tiny.url + "/v1/chat/completions", json=body, timeout=30) as r:
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks and all("usage" not in chunk for chunk in chunks)
    with_usage = chat(
        "Tell me a story.",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
    )
    with httpx.stream("POST", tiny.url + "/v1/chat/completions", json=with_usage, timeout=30) as r:
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(event) for event in events[:-1]]
    assert [chunk["usage"] is None for chunk in chunks] == [True] * (len(chunks) - 1) + [False]
    produced = sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= produced > 0


def test_a_client_that_leaves_stops_every_one_of_its_n_choices(tiny):
    """Three choices of a long answer, the client gone after 0.2 s: all three rows stop
    (one disconnect callback closes them all), and every permit comes back."""
    handler = tiny.service.registry.get("tiny")
    before = handler.forward_calls
    body = chat("Tell me everything.", max_tokens=960, temperature=1.0, n=3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(tiny.url + "/v1/chat/completions", json=body, timeout=0.2)
    wait_until(lambda: tiny.status()["pool"]["admitted_bytes"] == 0, 30, "permits back")
    assert handler.batch_rows == 0
    steps = handler.forward_calls - before
    time.sleep(0.5)
    assert handler.forward_calls - before == steps, "a choice kept generating"
    assert steps < 900, f"{steps} steps: a choice ran on after its client left"
