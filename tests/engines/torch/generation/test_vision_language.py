"""The vision-language handler on a tiny random LLaVA built on the spot (CPU, float32),
without HTTP: the registry picks it by the folder, image rows share the step batch with
text rows, and a prompt with images never reuses KV computed for other images (its token
ids are the same whatever the image: the image's tokens are placeholders)."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.table import make_handler
from app.engines.torch.families import sees_images
from app.engines.torch.generation.causal_lm import CausalLMHandler
from app.engines.torch.generation.vision_language import VisionLanguageHandler, processor_messages
from app.models.decoding import Chat, DecodeResult, SamplingParams, TokenStream
from app.models.prefix_cache import PrefixStore
from app.models.prepared import IMAGES_TAG
from tests.support.random_models import llava_answers, save_random_llama, save_random_llava

# long enough that two prompts share more than MIN_SHARED tokens besides the image's
QUESTION = "Hello! How are you today? I am fine, thank you. What is this?"
TOKENS = 6


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def chat(image: bytes | None, text: str = QUESTION) -> Chat:
    message: dict[str, Any] = {"role": "user", "content": text}
    if image is not None:
        message["images"] = [image]
    return Chat([message])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_llava(tmp_path_factory.mktemp("llava") / "vl")


@pytest.fixture(scope="module")
def handler(folder: Path) -> Iterator[VisionLanguageHandler]:
    spec = ModelSpec(name="vl", kind="generation", path=folder, dtype="float32")
    built = make_handler(spec)
    assert isinstance(built, VisionLanguageHandler)
    built.load(CpuDevice())
    yield built
    built.unload()


@pytest.fixture(scope="module")
def direct(folder: Path) -> Any:
    """The model called directly: transformers' processor and `generate`, greedy."""
    return llava_answers(folder, QUESTION, TOKENS)


def run_together(handler: VisionLanguageHandler, prompts: list[Chat]) -> list[DecodeResult]:
    """Each prompt as a stream on a thread of its own, all handed in at once (as the
    executor runs them), so they share the model's batch."""
    loop = asyncio.new_event_loop()  # never run: the deltas queue up unread
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    prepared = [handler.prepare_generation(p, params, TOKENS) for p in prompts]
    results: list[DecodeResult | None] = [None] * len(prompts)

    def run(index: int) -> None:
        results[index] = handler.generate(prepared[index], TokenStream(loop))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    loop.close()
    assert all(r is not None for r in results), "a stream never ended"
    return [r for r in results if r is not None]


def test_the_registry_picks_it_by_the_folder(folder, tmp_path):
    assert sees_images(folder)
    llama = save_random_llama(tmp_path / "llama")
    assert not sees_images(llama)
    plain = make_handler(ModelSpec(name="t", kind="generation", path=llama))
    assert type(plain) is CausalLMHandler and "vision" not in plain.card().capabilities


def test_its_card_says_vision(handler):
    card = handler.card()
    assert card.capabilities == ("completion", "tools", "vision")
    assert card.kind == "generation" and card.architecture == "llava"
    assert handler.describe()["capabilities"] == ["completion", "tools", "vision"]


def test_images_come_before_their_messages_text():
    shaped = processor_messages([{"role": "user", "content": "hi", "images": [b"a", b"b"]}])
    parts = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "hi"}]
    assert shaped == [{"role": "user", "content": parts}]


def test_image_rows_batch_with_text_rows_and_answer_as_the_model_alone(handler, direct):
    images = [png(1), png(2)]
    before = handler.forward_calls
    results = run_together(handler, [chat(images[0]), chat(None), chat(images[1])])
    assert [r.text for r in (results[0], results[2])] == [direct(image) for image in images]
    assert results[0].text != results[2].text  # the pixels matter
    # the image rows were prefilled alone, then stepped with the others: fewer forwards
    # than three streams one after another (TOKENS each)
    assert handler.forward_calls - before < 3 * TOKENS
    assert all(r.cached_tokens == 0 for r in results)


def test_a_prompt_with_images_never_reuses_kv_of_other_images(handler, direct):
    store = PrefixStore()
    store.set_limit(1 << 30)
    handler.prefix_store = store
    handler._batcher._store = store  # the batcher took the registry's (none) at load
    try:
        first = run_together(handler, [chat(png(3))])[0]
        second = run_together(handler, [chat(png(4))])[0]  # the same ids, another image
    finally:
        handler._batcher._store = None
        handler.prefix_store = None
    assert len(store) == 0 and store.stats.hits == 0  # an image row's KV is never kept
    assert (first.text, second.text) == (direct(png(3)), direct(png(4)))
    assert second.cached_tokens == 0


def test_it_is_priced_apart_with_the_vision_encoder(handler):
    params = SamplingParams(max_tokens=4, temperature=0.0)
    seen = handler.prepare_generation(chat(png(1)), params, 4)
    text = handler.prepare_generation(chat(None), params, 4)
    assert seen.price_tag == IMAGES_TAG and text.price_tag == ""
    assert seen.payload.prefill_inputs["pixel_values"].shape == (1, 3, 32, 32)
    assert seen.tokens == text.tokens + 16  # the image's 16 tokens are in its prompt
    words = CausalLMHandler.geometry(handler, 64)
    assert handler.geometry(64).fixed_bytes >= words.fixed_bytes + handler._vision_bytes > 0
