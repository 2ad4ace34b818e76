"""EmbeddingHandler: the embedded model, and any sentence-transformers folder by path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertModel

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.torch.embedding import EmbeddingHandler, embedded_model_path
from tests.support.random_models import save_random_bert


@pytest.fixture(scope="module")
def minilm_handler():
    handler = EmbeddingHandler(ModelSpec(name="minilm", max_batch=4))
    handler.load(CpuDevice())
    return handler


def test_embedded_model_is_found_offline():
    path = embedded_model_path()
    assert (path / "model.safetensors").is_file() and (path / "modules.json").is_file()


def test_buckets_round_tokens_and_batch_up_to_powers_of_two(minilm_handler):
    one = minilm_handler.preprocess(["hello there"])
    assert one.bucket.label == "s16xb1" and one.tokens == 4  # [CLS] hello there [SEP]
    many = minilm_handler.preprocess(["word " * 40] * 3)
    assert many.bucket.label == "s64xb4"
    capped = minilm_handler.preprocess(["a"] * 10)  # max_batch 4: forward runs chunks of 4
    assert capped.bucket.label == "s16xb4" and capped.count == 10


def test_long_inputs_are_truncated_to_the_models_limit(minilm_handler):
    prepared = minilm_handler.preprocess(["word " * 5000])
    assert prepared.bucket.label == "s256xb1" and prepared.tokens == 256


def test_vectors_come_back_in_the_callers_order_and_normalised(minilm_handler):
    texts = ["short", "a much longer sentence " * 5, "medium length text here", "x"]
    prepared = minilm_handler.preprocess(texts)
    vectors = minilm_handler.postprocess(minilm_handler.forward(prepared))
    assert vectors.shape == (4, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    single = minilm_handler.postprocess(
        minilm_handler.forward(minilm_handler.preprocess([texts[1]]))
    )
    np.testing.assert_allclose(vectors[1], single[0], atol=1e-4)


@pytest.fixture(scope="module")
def tiny_cls_folder(tmp_path_factory):
    """A small randomly initialised BERT saved as a sentence-transformers folder with CLS
    pooling and no Normalize module, through the real save code."""
    return save_random_bert(
        tmp_path_factory.mktemp("tiny-bert"),
        hidden=32,
        layers=2,
        heads=2,
        max_seq=32,
        pooling="cls",
    )


def test_any_sentence_transformers_folder_with_its_own_pooling(tiny_cls_folder):
    handler = EmbeddingHandler(ModelSpec(name="tiny", path=tiny_cls_folder))
    handler.load(CpuDevice())
    assert handler.dimensions == 32 and handler.describe()["pooling"] == "cls"
    prepared = handler.preprocess(["a b c", "z " * 100])
    assert prepared.bucket.label == "s32xb2"  # truncated at the folder's max_seq_length
    vectors = handler.postprocess(handler.forward(prepared))
    model = BertModel.from_pretrained(tiny_cls_folder).eval()
    ids = handler._tokenizer(["a b c"], return_tensors="pt")
    with torch.inference_mode():
        expected = model(**ids).last_hidden_state[0, 0].numpy()
    np.testing.assert_allclose(vectors[0], expected, atol=1e-5)
    assert not np.allclose(np.linalg.norm(vectors, axis=1), 1.0)  # no Normalize module


def test_missing_folder_fails_clearly(tmp_path):
    handler = EmbeddingHandler(ModelSpec(name="gone", path=tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        handler.load(CpuDevice())


def test_merged_requests_take_the_bucket_of_the_whole_batch(minilm_handler):
    short = minilm_handler.preprocess(["hi"])
    long = minilm_handler.preprocess(["word " * 40])
    merged = minilm_handler.merge([short, long, short])
    assert merged.bucket.label == "s64xb4" and merged.count == 3
    assert merged.tokens == 2 * short.tokens + long.tokens
    too_many = [minilm_handler.preprocess(["a", "b"])] * 3  # 6 inputs > max_batch 4
    assert minilm_handler.merge(too_many) is None


@pytest.fixture(scope="module")
def minilm_bf16():
    handler = EmbeddingHandler(ModelSpec(name="minilm", max_batch=4, dtype="bfloat16"))
    handler.load(CpuDevice())
    return handler


# Batched rows differ from unbatched ones only by padding and summation order. In float32
# that is rounding noise; bfloat16 keeps 8 bits of mantissa (about 2-3 decimal digits), as
# a GPU serving bf16 does, so its rows agree to a cosine of 0.999 (measured here: 0.99993).
TOLERANCE = {"float32": 0.99999, "bfloat16": 0.999}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_results_equal_unbatched_ones(dtype, request):
    minilm_handler = request.getfixturevalue(
        "minilm_handler" if dtype == "float32" else "minilm_bf16"
    )
    assert minilm_handler.dtype == dtype
    texts = [
        "short",
        "a rather longer sentence about batching " * 3,
        "medium text here",
        "x",
        "the last one, of middling length",
    ]
    alone = [minilm_handler.forward(minilm_handler.preprocess([t]))[0] for t in texts]
    merged = minilm_handler.merge([minilm_handler.preprocess([t]) for t in texts[:4]])
    together = list(minilm_handler.forward(merged))
    together += list(minilm_handler.forward(minilm_handler.preprocess(texts[4:])))
    cosines = []
    for a, b in zip(alone, together, strict=True):
        a, b = a.astype(np.float64), b.astype(np.float64)
        cosines.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    print(f"{dtype}: lowest cosine batched vs alone {min(cosines):.6f}")
    assert min(cosines) >= TOLERANCE[dtype]


def test_the_random_berts_tokenizer_spells_words_out(tmp_path):
    """The test models' tokenizer must see words (a vocabulary left at 5 tokens read every
    word as [UNK], and every text of one length embedded alike)."""
    from transformers import AutoTokenizer

    folder = save_random_bert(tmp_path / "b", hidden=16, layers=1, heads=2, max_seq=32)
    tokens = AutoTokenizer.from_pretrained(folder).tokenize("cats sleep")
    assert tokens == ["c", "##a", "##t", "##s", "s", "##l", "##e", "##e", "##p"]
