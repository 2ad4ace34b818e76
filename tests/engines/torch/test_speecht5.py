"""The text-to-speech handler on a tiny random SpeechT5 built here (save_pretrained, a
SentencePiece model trained on the spot, a random HiFi-GAN vocoder), on the CPU: one row
at speed 1 is transformers' own `generate_speech` with the vocoder after
`torch.manual_seed(seed)`, sample for sample (its decoder prenet's dropout on, as
SpeechT5 runs); rows batched are each the speech they are alone, where each stops at its
own threshold and where each runs to its own length limit (transformers' own batch runs
every row to the longest's); voices come from a speakers file; a speed stretches the
length."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engines.torch.speech_synthesis import SpeechSynthesisHandler
from app.engines.torch.speecht5 import MAX_LENGTH_RATIO
from app.errors import InvalidRequest
from app.models.kinds import Utterance
from app.models.prepared import Bucket
from tests.support.random_speecht5 import save_random_speecht5
from tests.support.synthesis import loaded, spoken, spoken_together

TEXTS = ("Hello world.", "A much longer sentence, with more words in it!", "Hi")
HOP = 256  # the random vocoder's samples per frame (4 x 4 x 4 x 4)


@pytest.fixture(scope="module")
def early(tmp_path_factory) -> SpeechSynthesisHandler:
    torch.set_num_threads(1)  # a shared 2-core machine: one thread is the faster
    return loaded(save_random_speecht5(tmp_path_factory.mktemp("speecht5")))


@pytest.fixture(scope="module")
def endless(tmp_path_factory) -> SpeechSynthesisHandler:
    return loaded(save_random_speecht5(tmp_path_factory.mktemp("speecht5-n"), stops="never"))


@pytest.fixture(scope="module")
def three_voices(tmp_path_factory) -> SpeechSynthesisHandler:
    return loaded(save_random_speecht5(tmp_path_factory.mktemp("speecht5-3"), speakers=3))


def transformers_own(handler: SpeechSynthesisHandler, row: Utterance) -> np.ndarray:
    ids = handler._tokenizer(row.text, return_tensors="pt").input_ids
    voice = handler._voices[handler.speaker_of(row.voice)].unsqueeze(0)
    torch.manual_seed(row.seed)
    with torch.inference_mode():
        wave = handler._model.generate_speech(ids, voice, vocoder=handler._vocoder)
    return wave.numpy()


def assert_same_speech(together: np.ndarray, alone: np.ndarray) -> None:
    """A row batched is the row alone but for float sums in another order (1e-14 seen;
    a leaking pad or another dropout mask moves many samples by far more)."""
    assert together.shape == alone.shape
    np.testing.assert_allclose(together, alone, atol=1e-6, rtol=0)


def test_the_folder_loads_as_speecht5_with_its_vocoders_rate(early):
    described = early.describe()
    assert described["family"] == "speecht5" and described["speakers"] == 1
    assert early.rate == 16_000 and early.speakable("Hi!") and not early.speakable("!?")


@pytest.mark.parametrize("text", TEXTS)
def test_one_row_is_transformers_own_generate_speech_with_its_dropout(early, text):
    row = Utterance(text, seed=11)
    ours = spoken(early, [row])[0]
    theirs = transformers_own(early, row)
    assert ours.shape == theirs.shape and ours.size >= 10 * HOP
    np.testing.assert_array_equal(ours, theirs)
    other = spoken(early, [Utterance(text, seed=12)])[0]
    assert not np.array_equal(ours[: other.size], other[: ours.size])  # dropout is on


def test_rows_batched_are_each_the_speech_they_are_alone(early):
    rows = [Utterance(text, seed=i) for i, text in enumerate(TEXTS)]
    alone = [spoken(early, [row])[0] for row in rows]
    for a, t in zip(alone, spoken_together(early, rows), strict=True):
        assert_same_speech(t, a)


def test_each_row_runs_to_its_own_limit_as_it_would_alone(endless):
    """The stop never fires: each row decodes its own limit (twenty frames a token), as
    it would alone; transformers' batch decodes every row to the longest's."""
    rows = [Utterance(text, seed=3) for text in (TEXTS[2], TEXTS[0])]
    tokens = [len(endless._tokenizer(row.text).input_ids) for row in rows]
    alone = [spoken(endless, [row])[0] for row in rows]
    limits = [int(n * MAX_LENGTH_RATIO / 2) * 2 for n in tokens]  # steps of two frames
    assert [a.size for a in alone] == [frames * HOP for frames in limits]
    for a, t in zip(alone, spoken_together(endless, rows), strict=True):
        assert_same_speech(t, a)
    ids = endless._tokenizer([row.text for row in rows], padding=True, return_tensors="pt")
    voices = endless._voices[[0, 0]]
    with torch.inference_mode():
        _, lengths = endless._model.generate_speech(
            ids.input_ids,
            voices,
            attention_mask=ids.attention_mask,
            vocoder=endless._vocoder,
            return_output_lengths=True,
        )
    assert lengths[0] == lengths[1] > alone[0].size  # theirs: the short row runs long


def test_voices_come_from_the_speakers_file_and_batch_as_alone(three_voices):
    assert three_voices.speakers == 3
    rows = [Utterance(TEXTS[0], voice=v, seed=5) for v in ("alloy", "ash", "2")]
    alone = [spoken(three_voices, [row])[0] for row in rows]
    for row, ours in zip(rows, alone, strict=True):
        np.testing.assert_array_equal(ours, transformers_own(three_voices, row))
    assert not np.array_equal(alone[0][: alone[1].size], alone[1][: alone[0].size])
    for a, t in zip(alone, spoken_together(three_voices, rows), strict=True):
        assert_same_speech(t, a)
    refused = three_voices.voice_refused("coral")  # OpenAI's fourth name: no fourth voice
    assert isinstance(refused, InvalidRequest) and refused.param == "voice"


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_a_speed_stretches_the_spectrogram_and_batches_as_alone(early, speed):
    normal = spoken(early, [Utterance(TEXTS[1], seed=2)])[0]
    changed = spoken(early, [Utterance(TEXTS[1], speed=speed, seed=2)])[0]
    assert changed.size == round(normal.size / HOP / speed) * HOP
    rows = [Utterance(TEXTS[1], speed=speed, seed=2), Utterance(TEXTS[0], seed=4)]
    together = spoken_together(early, rows)
    assert_same_speech(together[0], changed)


def test_prices_grow_with_tokens_and_rows(early):
    small = early.prior_bytes(Bucket("s64xb1", 64))
    assert 0 < small < early.prior_bytes(Bucket("s128xb1", 128))
    assert early.prior_bytes(Bucket("s64xb2", 128)) == 2 * small


def test_a_folder_without_its_vocoder_is_refused_at_load_saying_where(tmp_path):
    import shutil

    folder = save_random_speecht5(tmp_path / "speecht5")
    shutil.rmtree(folder / "vocoder")
    with pytest.raises(FileNotFoundError, match=r"HiFi-GAN vocoder: put one .* at .*vocoder"):
        loaded(folder)


def test_a_speakers_file_of_the_wrong_width_is_refused_at_load(tmp_path):
    from safetensors.torch import save_file

    folder = save_random_speecht5(tmp_path / "speecht5")
    save_file({"speakers": torch.zeros((2, 7))}, str(folder / "speakers.safetensors"))
    with pytest.raises(ValueError, match=r"must be \(voices, 16\).*it is \(2, 7\)"):
        loaded(folder)
    save_file({"speakers": torch.zeros((2, 16))}, str(folder / "speakers.safetensors"))
    assert loaded(folder).speakers == 2  # its valid twin loads
