"""Embeddings on llama.cpp's engine: a random Llama made here, written as a GGUF (float32,
as llama.cpp's converter writes one) and served as an embedding model, gives the vectors
transformers gives on the same weights and token ids (mean of the last hidden states,
normalised), through the official openai client."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from openai import OpenAI

from app.config.settings import ModelSpec
from app.engines.llama_cpp.embedding import LlamaCppEmbedder
from tests.support.random_models import save_random_llama, save_random_llama_gguf

pytestmark = pytest.mark.slow
TEXTS = ["a cat sat on the mat", "hello world", "the dragon learns to bake bread"]


@pytest.fixture(scope="module")
def gguf_llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed-gguf")
    folder = save_random_llama(root / "llama", context=256)
    return folder, save_random_llama_gguf(folder, root / "llama.gguf")


def reference(folder, ids: list[list[int]]) -> np.ndarray:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder).eval()
    rows = []
    with torch.inference_mode():
        for row in ids:
            mean = model(input_ids=torch.tensor([row])).last_hidden_state[0].mean(0)
            rows.append((mean / mean.norm()).numpy())
    return np.stack(rows)


def test_the_openai_client_gets_transformers_mean_pooled_vectors(server_factory, gguf_llama):
    folder, gguf = gguf_llama
    spec = ModelSpec(name="emb", kind="embedding", path=gguf, context_length=256, load="startup")
    live = server_factory(models=(spec,))
    handler = live.service.registry.entries["emb"].handler
    assert isinstance(handler, LlamaCppEmbedder)
    # the runner's own tokenizer, asked on a loop of this thread (it needs no pools)
    ids = asyncio.run(handler.prepare_inputs(TEXTS, None)).payload
    client = OpenAI(base_url=live.url + "/v1", api_key="unused")
    answer = client.embeddings.create(model="emb", input=TEXTS)
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert got.shape == (3, 64) == (3, handler.dimensions)
    assert np.abs(got - reference(folder, ids)).max() < 1e-3
    assert answer.usage.prompt_tokens == sum(len(row) for row in ids)
    by_ids = client.embeddings.create(model="emb", input=ids[1])  # token ids in, the same out
    assert np.abs(np.array(by_ids.data[0].embedding) - got[1]).max() < 1e-5
    row = next(m for m in live.status()["models"] if m["name"] == "emb")
    assert (row["engine"], row["kind"]) == ("llama.cpp", "embedding")


def test_a_text_longer_than_the_context_is_a_400_before_it_is_queued(server_factory, gguf_llama):
    _, gguf = gguf_llama
    spec = ModelSpec(name="emb", kind="embedding", path=gguf, context_length=32, load="startup")
    live = server_factory(models=(spec,))
    import httpx

    handler = live.service.registry.entries["emb"].handler
    forwards = handler.forward_calls
    long = " ".join(["dragon"] * 200)
    answer = httpx.post(live.url + "/v1/embeddings", json={"model": "emb", "input": long})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert handler.forward_calls == forwards  # refused before anything ran
