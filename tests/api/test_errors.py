"""Errors as each API's own clients recognise them (app.api.errors): a prompt past the
model's context, through litellm (which aider uses: it maps a provider's 400 to its
ContextWindowExceededError by the words or code), the `anthropic` client and the `ollama`
client, against a live server with a small random Llama of a short context. Each
refusal has its valid twin served beside it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import anthropic
import httpx
import pytest
from ollama import Client, ResponseError

from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings, wait_until
from tests.support.random_models import save_random_llama

CONTEXT = 256
LONG = "Tell me about cats and dogs and birds. " * 120  # far past 256 tokens
SHORT = "Tell me about cats."


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("overflow")
    tiny = save_random_llama(root / "tiny", context=CONTEXT)
    spec = ModelSpec(name="tiny", kind="generation", path=tiny)
    with live_server(make_settings(root, device="cpu", models=(spec,))) as served:
        yield served


@pytest.fixture(scope="module")
def litellm():
    """litellm (the `apps` extra; the lowest-versions run leaves it out)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    return pytest.importorskip("litellm")


def _ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def test_litellm_raises_its_context_window_error_for_an_overlong_prompt(live, litellm):
    """Aider offers its advice for a context overflow only when litellm raises this."""
    common = {"model": "openai/tiny", "api_base": live.url + "/v1", "api_key": "x"}
    # greedy: a sampled random model may draw its end token within three
    served = litellm.completion(messages=_ask(SHORT), max_tokens=3, temperature=0, **common)
    assert served.choices[0].finish_reason == "length"
    with pytest.raises(litellm.ContextWindowExceededError) as refused:
        litellm.completion(messages=_ask(LONG), max_tokens=3, **common)
    assert f"maximum context length is {CONTEXT} tokens" in str(refused.value)
    with pytest.raises(litellm.ContextWindowExceededError) as asked_too_much:
        litellm.completion(messages=_ask(SHORT), max_tokens=CONTEXT, **common)
    assert f"{CONTEXT} in the completion" in str(asked_too_much.value)
    with pytest.raises(litellm.ContextWindowExceededError):  # its Anthropic provider too
        litellm.completion(
            model="anthropic/tiny", api_base=live.url, api_key="x", messages=_ask(LONG),
            max_tokens=3,
        )  # fmt: skip


def test_anthropic_routes_say_it_in_anthropics_words(live):
    client = anthropic.Anthropic(base_url=live.url, api_key="x")
    served = client.messages.create(model="tiny", max_tokens=3, messages=_ask(SHORT))
    assert served.stop_reason == "max_tokens"
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="tiny", max_tokens=3, messages=_ask(LONG))
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "context_length_exceeded"
    prompt = error["prompt_tokens"]
    assert prompt > CONTEXT
    assert error["message"].startswith(f"prompt is too long: {prompt} tokens > {CONTEXT} maximum")
    with pytest.raises(anthropic.BadRequestError) as asked_too_much:
        client.messages.create(model="tiny", max_tokens=CONTEXT, messages=_ask(SHORT))
    assert asked_too_much.value.body["error"]["message"].startswith(
        "input length and `max_tokens` exceed context limit: "
    )


def test_ollama_routes_say_it_in_ollamas_words(live):
    client = Client(host=live.url)
    assert client.chat(model="tiny", messages=_ask(SHORT), options={"num_predict": 2}).done
    with pytest.raises(ResponseError) as refused:
        client.chat(model="tiny", messages=_ask(LONG))
    assert refused.value.status_code == 400
    message = refused.value.error
    assert message.startswith("the input length exceeds the context length: ")
    assert f"the context holds {CONTEXT}" in message


def rejections(live: Live) -> dict[str, float]:
    """/metrics' vramgate_rejections_total, by reason (the Prometheus client's own text)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(live.url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "vramgate_rejections_total":
                found[sample.labels["reason"]] = sample.value
    return found


def test_every_refusal_and_every_client_that_left_is_counted_and_logged(live, caplog):
    """Refusals made before a request reaches a model (a body that is no JSON, a route
    that does not exist, a prompt past the context) and a stream whose client left
    mid-way: each counted by its code in /metrics and /status and logged with its route
    or as the client's, none counted as served. Before: none of them was counted, and
    the stream that was left was logged `outcome=ok` and counted as served. The twin,
    a whole answer, is served and counted."""
    from openai import OpenAI

    before, served = rejections(live), live.status()["counters"]["served"]
    with caplog.at_level("INFO", logger="vramgate"):
        bad = httpx.post(
            live.url + "/v1/chat/completions",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        assert httpx.get(live.url + "/v1/nowhere", timeout=30).status_code == 404
        long = {"model": "tiny", "messages": _ask(LONG), "max_tokens": 3}
        over = httpx.post(live.url + "/v1/chat/completions", json=long, timeout=30)
        assert over.status_code == 400, over.text
        client = OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model="tiny", messages=_ask(SHORT), max_tokens=200, temperature=0, stream=True
        )
        next(iter(stream))
        stream.close()  # the client leaves, as a Stop button does
        wait_until(
            lambda: (
                rejections(live).get("client_disconnected", 0)
                > before.get("client_disconnected", 0)
            ),
            60,
            "the stream that was left, counted",
        )
        whole = client.chat.completions.create(
            model="tiny", messages=_ask(SHORT), max_tokens=3, temperature=0
        )
        assert whole.choices[0].finish_reason == "length"
    after = rejections(live)
    grew = {code: after[code] - before.get(code, 0) for code in after}
    code = over.json()["error"]["code"]
    for reason in ("invalid_json", "not_found", code, "client_disconnected"):
        assert grew.get(reason) == 1, (reason, grew)
    status = live.status()
    assert status["counters"]["served"] == served + 1  # the whole answer alone
    assert all(status["counters"]["rejected"].get(r) for r in ("invalid_json", code))
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "refused POST /v1/chat/completions: 400 invalid_json" in logged
    assert "refused GET /v1/nowhere: 404 not_found" in logged
    assert "outcome=client_disconnected" in logged
    # and on the dashboard's list, as one that left while queued is
    shown = httpx.get(live.url + "/history", timeout=30).json()["rejections"]
    assert any(r["code"] == "client_disconnected" and r["model"] == "tiny" for r in shown)
