"""Errors as each API's own clients recognise them (app.api.errors): a prompt past the
model's context, through litellm (which aider uses: it maps a provider's 400 to its
ContextWindowExceededError by the words or code), the `anthropic` client and the `ollama`
client, against a live server with a small random Llama of a short context. Each
refusal has its valid twin served beside it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import anthropic
import pytest
from ollama import Client, ResponseError

from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings
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
