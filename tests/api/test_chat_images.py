"""Images in chat (app.api.chat_images, app.engines.torch.generation.vision_language) on a
live server, through the official clients unchanged: a tiny random LLaVA built on the
spot ("vl") and a text-only random Llama ("tiny"). Each answer is checked against the model called
directly in the test: transformers' own processor (its chat template with the image in
the message) and `model.generate`, greedy."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from anthropic import Anthropic, BadRequestError
from ollama import Client, ResponseError
from openai import OpenAI
from PIL import Image

from app.config.settings import ModelSpec
from tests.api.vision.test_routes import png_header_only
from tests.support.live import Live, live_server, make_settings
from tests.support.random_models import llava_answers, save_random_llama, save_random_llava

QUESTION = "What is this?"
TOKENS = 8


def png(seed: int, width: int = 40, height: int = 30) -> bytes:
    """A noise image: each seed its own pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def openai_chat(image: bytes) -> list[dict[str, Any]]:
    parts = [
        {"type": "text", "text": QUESTION},
        {"type": "image_url", "image_url": {"url": data_url(image)}},
    ]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, Path]]:
    root = tmp_path_factory.mktemp("chat-images")
    vl = save_random_llava(root / "vl")
    tiny = save_random_llama(root / "tiny")
    models = (
        ModelSpec(name="vl", kind="generation", path=vl, dtype="float32"),
        ModelSpec(name="tiny", kind="generation", path=tiny, dtype="float32"),
    )
    settings = make_settings(root, device="cpu", models=models)
    with live_server(settings) as live:
        yield live, vl


@pytest.fixture(scope="module")
def direct(served: tuple[Live, Path]) -> Any:
    """The answer of the model called directly, for an encoded image (transformers'
    processor renders the chat with the image in it; `generate` greedy)."""
    return llava_answers(served[1], QUESTION, TOKENS)


def test_the_card_says_vision_where_the_model_sees(served):
    live, _ = served
    listed = {m["id"]: m for m in httpx.get(live.url + "/v1/models").json()["data"]}
    assert "vision" in listed["vl"]["capabilities"]
    assert "vision" not in listed["tiny"]["capabilities"]
    rows = {m["name"]: m for m in live.status()["models"]}
    assert "vision" in rows["vl"]["capabilities"] and "vision" not in rows["tiny"]["capabilities"]
    client = Client(host=live.url)
    assert client.show("vl").capabilities == ["completion", "tools", "vision"]
    assert client.show("tiny").capabilities == ["completion", "tools"]
    tags = {m["name"]: m for m in httpx.get(live.url + "/api/tags").json()["models"]}
    assert "vision" in tags["vl"]["capabilities"] and "vision" not in tags["tiny"]["capabilities"]


def test_openai_chat_with_an_image_is_the_model_called_directly(served, direct):
    live, _ = served
    client = OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    answers = []
    for seed in (1, 2):
        image = png(seed)
        want = direct(image)
        got = client.chat.completions.create(
            model="vl", messages=openai_chat(image), max_tokens=TOKENS, temperature=0
        )
        assert got.choices[0].message.content == want
        assert got.usage.prompt_tokens > 16  # the image's 16 tokens are in the prompt
        stream = client.chat.completions.create(
            model="vl", messages=openai_chat(image), max_tokens=TOKENS, temperature=0, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
        answers.append(want)
    # the pixels matter: another image, another answer (and no prefix of the first reused)
    assert answers[0] != answers[1]
    (row,) = [m for m in live.status()["models"] if m["name"] == "vl"]
    assert any("+images" in json.dumps(p) for p in row["prices"])  # apart from text prompts


def test_ollama_images_in_chat_and_generate(served, direct):
    live, _ = served
    client = Client(host=live.url)
    image = png(3)
    want = direct(image)
    options = {"temperature": 0, "num_predict": TOKENS}
    ask = [{"role": "user", "content": QUESTION, "images": [image]}]
    assert client.chat(model="vl", messages=ask, options=options).message.content == want
    parts = client.chat(model="vl", messages=ask, options=options, stream=True)
    assert "".join(p.message.content for p in parts) == want
    generated = client.generate(model="vl", prompt=QUESTION, images=[image], options=options)
    assert generated.response == want


def test_anthropic_image_block(served, direct):
    live, _ = served
    client = Anthropic(base_url=live.url, api_key="anything", max_retries=0)
    image = png(4)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
    message = client.messages.create(
        model="vl",
        max_tokens=TOKENS,
        messages=[{"role": "user", "content": content}],
        extra_body={"temperature": 0},  # this SDK version has no temperature argument
    )
    assert message.content[0].text == direct(image)
    with pytest.raises(BadRequestError) as refused:
        client.messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": content}]
        )
    assert "'tiny'" in str(refused.value) and "cannot see images" in str(refused.value)


BAD = [
    pytest.param(data_url(png_header_only(100_000, 100_000)), "too large", id="bomb"),
    pytest.param(data_url(b"%PDF-1.4 not an image at all"), "not an image", id="pdf"),
    pytest.param("data:image/png;base64,@@@not base64@@@", "base64", id="not base64"),
    pytest.param("https://example.com/cat.png", "not fetched", id="http url"),
]


@pytest.mark.parametrize(("url", "says"), BAD)
def test_a_bad_image_is_a_400_and_nothing_runs(served, url, says):
    live, _ = served
    handler = live.service.registry.get("vl")
    calls, before = handler.forward_calls, live.status()["counters"]["served"]
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    answer = httpx.post(
        live.url + "/v1/chat/completions",
        json={"model": "vl", "messages": messages, "max_tokens": 2},
        timeout=60,
    )
    assert answer.status_code == 400, answer.text
    assert says in answer.json()["error"]["message"]
    status = live.status()
    assert status["queue"]["depth"] == 0 and status["pool"]["admitted_bytes"] == 0
    assert status["counters"]["served"] == before and handler.forward_calls == calls
    # the server keeps serving (greedy: a sampled random model may draw its end token at once)
    client = OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    ok = client.chat.completions.create(
        model="vl", messages=openai_chat(png(5)), max_tokens=2, temperature=0
    )
    assert ok.choices[0].finish_reason == "length"


def test_an_image_to_a_text_only_model_is_a_400_naming_it(served):
    live, _ = served
    answer = httpx.post(
        live.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": openai_chat(png(6)), "max_tokens": 2},
        timeout=60,
    )
    assert answer.status_code == 400
    assert "'tiny'" in answer.json()["error"]["message"]
    with pytest.raises(ResponseError) as refused:
        Client(host=live.url).chat(
            model="tiny", messages=[{"role": "user", "content": "hi", "images": [png(6)]}]
        )
    assert refused.value.status_code == 400 and "'tiny'" in refused.value.error
    assert live.status()["queue"]["depth"] == 0
