"""A runner's failures are the server's, never the caller's: the real SmolLM2 GGUF in a
real runner whose KV pool another program overfills (requests sent straight to the
runner's own listener, beside vramgate's gate), so that llama.cpp itself answers
"Context size has been exceeded." (its server's words, to every running task) as a
500 before a stream starts and as an error event in the middle of one. Through the
`openai` client: a 503 with `Retry-After` and `model_runner_failed`, where the code
before answered 400 `invalid_request`; the same requests served once the pool is ours
again (the positive control)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import openai
import pytest
from openai import OpenAI

from app.engines.llama_cpp.client import RunnerAnswer, RunnerClient
from tests.engines.llama_cpp.pools import STORY, pool_of
from tests.support.live import live_server, make_settings, wait_until

pytestmark = pytest.mark.slow

CELLS = 1024
LONG = "A cat walked along the old river and looked around. " * 40  # ~440 tokens


@pytest.fixture(scope="module")
def smol(smollm2_gguf, tmp_path_factory):
    spec = pool_of(smollm2_gguf, CELLS)
    settings = make_settings(tmp_path_factory.mktemp("failures"), device="cpu", models=(spec,))
    with live_server(settings) as live:
        yield live


def runner(live) -> RunnerClient:
    client = live.service.registry.entries["smol"].handler._client
    assert client is not None
    return client


def model_row(live) -> dict:
    return next(m for m in live.status()["models"] if m["name"] == "smol")


def others(live, count: int, n_predict: int) -> list[threading.Thread]:
    """`count` long requests sent straight to the runner, as another program would."""

    def send(n: int) -> None:
        body = {"prompt": f"Other {n}. {LONG}", "n_predict": n_predict, "temperature": 0.8}
        with contextlib.suppress(RunnerAnswer):  # the overflow fails them too
            asyncio.run(runner(live).call("POST", "/completion", body))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    return threads


def decoding(live, count: int) -> bool:
    slots = asyncio.run(runner(live).call("GET", "/slots"))
    busy = [s for s in slots if s.get("is_processing")]
    return len(busy) >= count and all(s["next_token"][0]["n_decoded"] > 0 for s in busy)


def test_a_runner_500_before_the_stream_is_a_503_with_retry_after(smol):
    client = OpenAI(base_url=smol.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    failures = model_row(smol).get("runner_failures", 0)
    threads = others(smol, 2, 300)  # 2 x ~740 cells of the 1,024, once they decode
    wait_until(lambda: decoding(smol, 2), 120, "the others decoding")
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model="smol", prompt=LONG, max_tokens=8)
    for thread in threads:
        thread.join(300)
    assert refused.value.status_code == 503, refused.value.response.text
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.body["code"] == "model_runner_failed"
    assert model_row(smol)["runner_failures"] > failures
    served = client.completions.create(model="smol", prompt=LONG, max_tokens=8)
    assert served.usage.completion_tokens > 0  # the same request, the pool ours again


def test_an_error_event_mid_stream_is_a_503_event(smol):
    client = OpenAI(base_url=smol.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    failures = model_row(smol).get("runner_failures", 0)
    stream = client.chat.completions.create(
        model="smol",
        messages=STORY,
        max_tokens=900,
        stream=True,
    )
    pieces, threads = 0, []
    with pytest.raises(openai.APIError) as failed:
        for _ in stream:
            pieces += 1
            if pieces == 3:
                threads = others(smol, 3, 300)  # the pool overflows under the stream
    for thread in threads:
        thread.join(300)
    assert pieces > 3
    assert failed.value.body["code"] == "model_runner_failed", failed.value.body
    assert "Context size has been exceeded" in failed.value.message
    assert model_row(smol)["runner_failures"] > failures
    started = time.monotonic()
    whole = client.chat.completions.create(
        model="smol",
        messages=STORY,
        max_tokens=16,
    )
    assert whole.choices[0].message.content and time.monotonic() - started < 120
