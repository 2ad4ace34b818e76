"""A model's sampling defaults from the config (app.api.intake.with_model_defaults),
taken by a request that leaves them out on every API, through the official clients, on a
small random Llama built here: its free text is noise, so an answer sampled at
temperature 1 differs from the greedy one, and the greedy one is the same each time.
The model's config says `temperature = 0` and a `system` prompt."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest
from ollama import Client
from openai import OpenAI

from app.api.intake import with_model_defaults
from app.api.openai.schemas import ChatRequest, validate_generation_request
from app.config.model_spec import SAMPLING_DEFAULTS
from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings
from tests.support.random_models import save_random_llama

SYSTEM = "You answer in one short line."
ASK = "Tell me about cats."
TOKENS = 8


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    """A Message's whole prompt: the tokens it read from the cache, wrote to it and neither."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("defaults")
    folder = save_random_llama(root / "tiny", context=512)
    spec = ModelSpec(
        name="tiny", kind="generation", path=folder, temperature=0.0, top_k=40, stop=("\n\n",),
        system=SYSTEM, repeat_penalty=1.1,
    )  # fmt: skip
    # the same weights sampled at temperature 1 from the one likeliest token: greedy
    narrow = ModelSpec(name="narrow", kind="generation", path=folder, temperature=1.0, top_k=1)
    with live_server(make_settings(root, device="cpu", models=(spec, narrow))) as served:
        yield served


def test_openai_chat_and_completions_take_the_models_defaults(live):
    client = OpenAI(base_url=live.url + "/v1", api_key="x")
    ask = [{"role": "user", "content": ASK}]

    def chat(messages: list[dict[str, str]], **sampling: float):
        return client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=TOKENS, **sampling
        )

    left_out = chat(ask)
    greedy = chat([{"role": "system", "content": SYSTEM}, *ask], temperature=0)
    assert left_out.choices[0].message.content == greedy.choices[0].message.content
    assert left_out.usage.prompt_tokens == greedy.usage.prompt_tokens  # the system prompt
    own_system = chat([{"role": "system", "content": "Be brief."}, *ask], temperature=0)
    assert own_system.usage.prompt_tokens < greedy.usage.prompt_tokens  # its own, not ours
    hot = chat(ask, temperature=1.0, seed=7)  # the caller's own value wins
    assert hot.choices[0].message.content != greedy.choices[0].message.content
    legacy = client.completions.create(model="tiny", prompt="Once upon", max_tokens=TOKENS)
    again = client.completions.create(
        model="tiny", prompt="Once upon", max_tokens=TOKENS, temperature=0
    )
    assert legacy.choices[0].text == again.choices[0].text
    assert legacy.usage.prompt_tokens == again.usage.prompt_tokens  # no system in a raw prompt


def test_responses_and_anthropic_take_the_models_defaults(live):
    responses = OpenAI(base_url=live.url + "/v1", api_key="x").responses
    left_out = responses.create(model="tiny", input=ASK, max_output_tokens=TOKENS)
    greedy = responses.create(
        model="tiny", input=ASK, instructions=SYSTEM, max_output_tokens=TOKENS, temperature=0
    )
    assert left_out.output_text == greedy.output_text
    assert left_out.usage.input_tokens == greedy.usage.input_tokens
    messages = anthropic.Anthropic(base_url=live.url, api_key="x").messages
    ask = [{"role": "user", "content": ASK}]
    left_out_a = messages.create(model="tiny", max_tokens=TOKENS, messages=ask)
    greedy_a = messages.create(
        model="tiny", max_tokens=TOKENS, messages=ask, system=SYSTEM,
        extra_body={"temperature": 0},  # this client version takes no temperature argument
    )  # fmt: skip
    assert left_out_a.content[0].text == greedy_a.content[0].text == greedy.output_text
    # Anthropic counts the prompt's cached part apart: the second, the same prompt, reads
    # the first's prefix from the cache
    assert prompt_tokens(left_out_a.usage) == prompt_tokens(greedy_a.usage)
    hot = messages.create(
        model="tiny", max_tokens=TOKENS, messages=ask, extra_body={"temperature": 1.0}
    )
    assert hot.content[0].text != greedy_a.content[0].text


def test_ollama_takes_and_shows_the_models_defaults(live):
    client = Client(host=live.url)
    ask = [{"role": "user", "content": ASK}]
    left_out = client.chat(model="tiny", messages=ask, options={"num_predict": TOKENS})
    greedy = client.generate(
        model="tiny", prompt=ASK, system=SYSTEM, options={"num_predict": TOKENS, "temperature": 0}
    )
    assert left_out.message.content == greedy.response
    assert left_out.prompt_eval_count == greedy.prompt_eval_count
    hot = client.chat(
        model="tiny", messages=ask, options={"num_predict": TOKENS, "temperature": 1, "seed": 3}
    )
    assert hot.message.content != greedy.response
    shown = client.show("tiny")  # its `system` too, which this client version does not read
    assert httpx.post(live.url + "/api/show", json={"model": "tiny"}).json()["system"] == SYSTEM
    assert (shown.parameters or "").splitlines() == [
        f"{'temperature':<30} 0.0",
        f"{'top_k':<30} 40",
        f"{'repeat_penalty':<30} 1.1",
        f"{'stop':<30} " + '"\\n\\n"',
    ]
    listed = OpenAI(base_url=live.url + "/v1", api_key="x").models.list().data
    assert listed[1].defaults == {"temperature": 1.0, "top_k": 1}  # type: ignore[attr-defined]
    assert listed[0].defaults == {  # type: ignore[attr-defined]
        "temperature": 0.0, "top_k": 40, "repeat_penalty": 1.1, "stop": ["\n\n"],
        "system": SYSTEM,
    }  # fmt: skip


def test_a_top_k_default_samples_as_the_model_says(live):
    """Beyond temperature: `narrow` samples at temperature 1 from its `top_k = 1`, so a
    request that leaves top_k out answers greedily, seed or not; its own top_k samples."""
    client = OpenAI(base_url=live.url + "/v1", api_key="x")
    ask = [{"role": "user", "content": ASK}]
    greedy = client.chat.completions.create(
        model="narrow", messages=ask, max_tokens=TOKENS, temperature=0
    ).choices[0]
    for seed in (1, 2):
        left_out = client.chat.completions.create(
            model="narrow", messages=ask, max_tokens=TOKENS, seed=seed
        ).choices[0]
        assert left_out.message.content == greedy.message.content, seed
    own = client.chat.completions.create(  # the positive control: its own top_k, sampled
        model="narrow", messages=ask, max_tokens=TOKENS, seed=1, extra_body={"top_k": 0}
    ).choices[0]
    assert own.message.content != greedy.message.content


def test_every_sampling_default_reaches_the_samplers_params_unless_the_request_sets_it(
    tmp_path,
):
    """Each of the config's sampling defaults (Ollama's names) lands in the parameters
    the sampler reads when a request leaves it out, and the request's own value wins."""
    assert set(SAMPLING_DEFAULTS) == {
        "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "stop"
    }  # fmt: skip
    spec = ModelSpec(
        name="m", kind="generation", path=tmp_path, temperature=0.3, top_p=0.8, top_k=7,
        min_p=0.05,
        repeat_penalty=1.2, stop=("END",),
    )  # fmt: skip
    settings = make_settings(tmp_path)
    ask = [{"role": "user", "content": ASK}]

    def params(**asked: object) -> tuple[object, ...]:
        body = with_model_defaults(ChatRequest(model="m", messages=ask, **asked), spec)
        p = validate_generation_request(body, settings).params
        return p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.stop

    assert params() == (0.3, 0.8, 7, 0.05, 1.2, ("END",))
    own = {"temperature": 0.9, "top_p": 0.5, "top_k": 3, "min_p": 0.1,
           "repetition_penalty": 1.0, "stop": ["x"]}  # fmt: skip
    assert params(**own) == (0.9, 0.5, 3, 0.1, 1.0, ("x",))
