"""The OpenAI embeddings route with the real embedded all-MiniLM-L6-v2 on the CPU."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from openai import OpenAI

MODEL = "all-MiniLM-L6-v2"


def cosine(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_openai_client_gets_384_dimensional_vectors_that_know_paraphrases(minilm):
    client = OpenAI(base_url=minilm.url + "/v1", api_key="unused")
    sentences = [
        "The cat sat on the mat.",
        "A cat was sitting on a rug.",
        "Quarterly tax filings are due in April.",
    ]
    response = client.embeddings.create(model=MODEL, input=sentences)
    vectors = [item.embedding for item in response.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3
    assert response.usage.prompt_tokens > 0


def test_float_and_base64_agree_and_costs_are_reported(minilm):
    text = {"model": MODEL, "input": "vramgate measures what each request costs"}
    plain = httpx.post(minilm.url + "/v1/embeddings", json=text, timeout=30)
    packed = httpx.post(
        minilm.url + "/v1/embeddings", json={**text, "encoding_format": "base64"}, timeout=30
    )
    assert plain.status_code == packed.status_code == 200
    floats = np.asarray(plain.json()["data"][0]["embedding"], dtype=np.float32)
    decoded = np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(floats, decoded, rtol=1e-5, atol=1e-6)
    for header in (
        "X-Vramgate-Bucket",
        "X-Vramgate-Price-Bytes",
        "X-Vramgate-Queue-Ms",
        "X-Vramgate-Run-Ms",
    ):
        assert header in plain.headers
    usage = plain.json()["usage"]
    assert usage["vram_bytes"] == int(plain.headers["X-Vramgate-Price-Bytes"]) > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] > 0


def test_order_is_kept_when_inputs_are_batched_in_chunks(minilm):
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(70)]
    together = httpx.post(
        minilm.url + "/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=60
    ).json()
    assert [d["index"] for d in together["data"]] == list(range(70))
    alone = httpx.post(
        minilm.url + "/v1/embeddings", json={"model": MODEL, "input": texts[42]}, timeout=30
    ).json()
    np.testing.assert_allclose(
        together["data"][42]["embedding"], alone["data"][0]["embedding"], atol=1e-4
    )


def test_models_are_listed(minilm):
    data = httpx.get(minilm.url + "/v1/models").json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == [MODEL]


BAD_INPUTS = [
    pytest.param(b'{"model": "all-MiniLM-L6-v2", "input": ', 400, "invalid_json", id="malformed"),
    pytest.param({"model": MODEL, "input": ""}, 400, "invalid_request", id="empty string"),
    pytest.param({"model": MODEL, "input": []}, 400, "invalid_request", id="empty list"),
    pytest.param({"model": MODEL}, 400, "invalid_request", id="no input"),
    pytest.param(
        {"model": MODEL, "input": ["a"] * 100_000}, 400, "invalid_request", id="100k strings"
    ),
    pytest.param(
        {"model": MODEL, "input": "x" * 40_000_000}, 413, "request_too_large", id="40 MB string"
    ),
    pytest.param(
        {"model": "no-such-model", "input": "x"}, 404, "model_not_found", id="unknown model"
    ),
    pytest.param(
        {"model": "../../etc/passwd", "input": "x"}, 400, "invalid_request", id="path as model name"
    ),
    pytest.param(
        {"model": MODEL, "input": [[101, 10**6]]}, 400, "invalid_request", id="unknown token id"
    ),
    pytest.param(
        {"model": MODEL, "input": "x", "encoding_format": "int8"},
        400,
        "invalid_request",
        id="bad encoding",
    ),
    pytest.param(
        {"model": MODEL, "input": "x", "dimensions": 10**9},
        400,
        "invalid_request",
        id="absurd dimensions",
    ),
    pytest.param(
        {"model": MODEL, "input": "x", "surprise": 1}, 400, "invalid_request", id="unknown field"
    ),
]


@pytest.mark.parametrize(("payload", "status", "code"), BAD_INPUTS)
def test_bad_input_gets_an_openai_error_and_changes_nothing(minilm, payload, status, code):
    before = minilm.status()
    if isinstance(payload, bytes):
        response = httpx.post(
            minilm.url + "/v1/embeddings",
            content=payload,
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
    else:
        response = httpx.post(minilm.url + "/v1/embeddings", json=payload, timeout=60)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]
    after = minilm.status()
    assert after["counters"]["served"] == before["counters"]["served"]
    assert after["queue"]["depth"] == 0 and after["pool"]["admitted_bytes"] == 0
    assert after["models"][0]["prices"] == before["models"][0]["prices"]


def test_chunked_body_over_the_limit_is_refused_while_streaming(minilm):
    def chunks():
        yield b'{"model": "all-MiniLM-L6-v2", "input": "'
        for _ in range(40):  # past the default max_body_bytes (32 MiB)
            yield b"x" * 1_000_000
        yield b'"}'

    response = httpx.post(
        minilm.url + "/v1/embeddings",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_token_ids_embed_as_the_text_they_tokenise_to(minilm):
    """OpenAI's other input form (LangChain's OpenAIEmbeddings sends it by default): ids
    of the model's own tokenizer. "hello" is [CLS] hello [SEP] = [101, 7592, 102] in
    all-MiniLM-L6-v2's vocabulary."""
    client = OpenAI(base_url=minilm.url + "/v1", api_key="unused", max_retries=0)
    text = client.embeddings.create(model=MODEL, input="hello").data[0].embedding
    one = client.embeddings.create(model=MODEL, input=[101, 7592, 102]).data
    many = client.embeddings.create(model=MODEL, input=[[101, 7592, 102], [101, 102]]).data
    assert len(one) == 1 and len(many) == 2
    assert cosine(one[0].embedding, text) > 0.9999
    assert cosine(many[0].embedding, text) > 0.9999
    assert cosine(many[1].embedding, text) < 0.99


def test_a_token_id_outside_the_vocabulary_is_a_400(minilm):
    with httpx.Client(base_url=minilm.url) as client:
        response = client.post("/v1/embeddings", json={"model": MODEL, "input": [[101, 10**6]]})
        negative = client.post("/v1/embeddings", json={"model": MODEL, "input": [101, -1]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"
    assert "vocabulary" in response.json()["error"]["message"]
    assert negative.status_code == 400


def test_dimensions_cut_a_matryoshka_models_vectors_and_normalise_them(server_factory, tmp_path):
    """A model whose config.json declares `matryoshka_dimensions` (Jina's convention; a
    small random BERT saved here): `dimensions` may ask for one of them; the vector is
    the full one cut and normalised again. Any other width is a 400 before queueing."""
    import json

    from app.config.settings import ModelSpec
    from tests.support.random_models import save_random_bert

    folder = save_random_bert(tmp_path / "bert", hidden=64, layers=2, heads=2, max_seq=64)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"matryoshka_dimensions": [16, 32]}))
    live = server_factory(models=(ModelSpec(name="m", kind="embedding", path=folder),))
    client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    full = np.asarray(client.embeddings.create(model="m", input="abc abd").data[0].embedding)
    cut = np.asarray(
        client.embeddings.create(model="m", input="abc abd", dimensions=16).data[0].embedding
    )
    assert full.shape == (64,) and cut.shape == (16,)
    assert np.allclose(cut, full[:16] / np.linalg.norm(full[:16]), atol=1e-5)
    assert np.linalg.norm(cut) == pytest.approx(1.0, abs=1e-5)
    served = live.status()["counters"]["served"]
    refused = httpx.post(
        live.url + "/v1/embeddings", json={"model": "m", "input": "abc", "dimensions": 8}
    )
    assert refused.status_code == 400 and "[16, 32, 64]" in refused.json()["error"]["message"]
    assert live.status()["counters"]["served"] == served
