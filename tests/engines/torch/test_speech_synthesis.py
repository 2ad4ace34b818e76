"""The text-to-speech handler on a tiny random VITS built here (save_pretrained), on the
CPU: one row is transformers' own `VitsModel.forward` after `torch.manual_seed(seed)`,
sample for sample, with its noise on (the stochastic duration predictor's and the
prior's); rows batched together are each the speech they are alone; a many-speaker
model maps OpenAI's voice names to its speakers; buckets by tokens over speed × rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engines.torch.speech_synthesis import SpeechSynthesisHandler
from app.errors import InvalidRequest
from app.models.kinds import Utterance
from app.models.prepared import Bucket
from tests.support.random_vits import save_random_vits
from tests.support.synthesis import loaded, spoken, spoken_together

TEXTS = ("Hello world.", "A much longer sentence, with more words in it.", "Hi")


@pytest.fixture(scope="module")
def one_voice(tmp_path_factory) -> SpeechSynthesisHandler:
    torch.set_num_threads(1)  # a shared 2-core machine: one thread is the faster
    return loaded(save_random_vits(tmp_path_factory.mktemp("vits")))


@pytest.fixture(scope="module")
def three_voices(tmp_path_factory) -> SpeechSynthesisHandler:
    return loaded(save_random_vits(tmp_path_factory.mktemp("vits3"), speakers=3))


def transformers_own(
    handler: SpeechSynthesisHandler, row: Utterance, speaker: int | None = None
) -> np.ndarray:
    model, tokenizer = handler._model, handler._tokenizer
    # the speed as the model's own attribute: transformers 5.0 (the lowest allowed) reads
    # only that (its forward swallows a `speaking_rate` argument unread); later ones read
    # the argument and, when it is left out, the attribute
    default, model.speaking_rate = model.speaking_rate, row.speed
    try:
        torch.manual_seed(row.seed)
        with torch.inference_mode():
            out = model(**tokenizer(row.text, return_tensors="pt"), speaker_id=speaker)
    finally:
        model.speaking_rate = default
    return out.waveform[0].numpy()


def assert_same_speech(together: np.ndarray, alone: np.ndarray) -> None:
    """A row batched is the row alone but for float sums in another order: a few samples
    off by up to 3e-4 (1.1e-4 seen under transformers 5.0; one 16-bit step is 3.1e-5),
    and no drift on average (padding leaking into a row shifts many samples, not a few)."""
    np.testing.assert_allclose(together, alone, atol=3e-4, rtol=0)
    assert float(np.mean(np.abs(together - alone))) < 1e-5  # a third of a 16-bit step


@pytest.mark.parametrize("speed", [1.0, 0.5, 2.0])
def test_one_row_is_transformers_own_forward_with_its_noise(one_voice, speed):
    row = Utterance(TEXTS[1], speed=speed, seed=11)
    ours = spoken(one_voice, [row])[0]
    theirs = transformers_own(one_voice, row)
    assert ours.shape == theirs.shape and ours.size > 1000
    np.testing.assert_array_equal(ours, theirs)
    other = spoken(one_voice, [Utterance(TEXTS[1], speed=speed, seed=12)])[0]
    assert not np.array_equal(ours, other)  # the noise is on: another seed, another voice


def test_rows_batched_are_each_the_speech_they_are_alone(one_voice):
    rows = [Utterance(text, speed=1.0 + 0.25 * i, seed=i) for i, text in enumerate(TEXTS)]
    alone = [spoken(one_voice, [row])[0] for row in rows]
    merged = one_voice.merge([one_voice.preprocess([row]) for row in rows])
    assert merged is not None and merged.bucket.label.endswith("xb4")
    together = spoken_together(one_voice, rows)
    assert [a.shape for a in alone] == [t.shape for t in together]
    for a, t in zip(alone, together, strict=True):
        assert_same_speech(t, a)


def test_voice_names_map_to_speakers_and_batch_as_alone(three_voices):
    assert three_voices.speakers == 3
    rows = [Utterance(TEXTS[0], voice=v, seed=5) for v in ("alloy", "ash", "2")]
    for row, speaker in zip(rows, (0, 1, 2), strict=True):
        theirs = transformers_own(three_voices, row, speaker)
        np.testing.assert_array_equal(spoken(three_voices, [row])[0], theirs)
    alone = [spoken(three_voices, [row])[0] for row in rows]
    assert not np.array_equal(alone[0][: alone[1].size], alone[1][: alone[0].size])
    together = spoken(three_voices, rows)
    for a, t in zip(alone, together, strict=True):
        assert_same_speech(t, a)
    refused = three_voices.voice_refused("coral")  # OpenAI's fourth name: no fourth speaker
    assert isinstance(refused, InvalidRequest) and refused.param == "voice"
    assert "alloy, ash, ballad" in refused.message
    assert three_voices.voice_refused("ballad") is None


def test_buckets_count_tokens_over_speed_and_rows(one_voice):
    normal = one_voice.preprocess([Utterance(TEXTS[1])])
    slow = one_voice.preprocess([Utterance(TEXTS[1], speed=0.25)])
    tokens = normal.tokens
    assert normal.bucket.label == f"s{_pow2(tokens)}xb1"
    assert slow.bucket.label == f"s{_pow2(tokens * 4)}xb1"  # four times as long to speak
    small = one_voice.prior_bytes(Bucket("s64xb1", 64))
    assert 0 < small < one_voice.prior_bytes(Bucket("s128xb1", 128))
    assert one_voice.prior_bytes(Bucket("s64xb2", 128)) == 2 * small


def _pow2(value: int) -> int:
    size = 16
    while size < value:
        size *= 2
    return size
