"""The speech handler on a tiny random Whisper built here (save_pretrained), on the CPU:
audio decoded from every container we claim, cut into 30-second windows whose text and
segments are transformers' own for the same window (its pipeline for a short clip, its
`generate` per window for a long one), windows of several requests batched into one
call, and what is no audio or too long refused before anything runs."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from app.engine.device import CpuDevice
from app.errors import AudioTooLong, InvalidAudio
from app.models.audio import SAMPLE_RATE, AudioClip, SpeechOptions, decode_audio
from app.models.speech import SpeechHandler, speech_bytes
from app.models.transcript import Transcript
from app.settings import ModelSpec
from tests.random_whisper import (
    CODECS,
    not_audio,
    save_random_whisper,
    tone,
    write_encoded,
    write_wav,
)

EN = SpeechOptions(language="en")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_random_whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def loaded(folder) -> SpeechHandler:
    torch.set_num_threads(1)  # a shared 2-core machine: one thread is the faster
    handler = SpeechHandler(ModelSpec(name="whisper", kind="speech", path=folder, max_batch=4))
    handler.load(CpuDevice())
    return handler


def read_wav(path: Path) -> np.ndarray:
    """A 16-bit WAV's samples as float32, read with the stdlib (not the server's decoder)."""
    with wave.open(str(path), "rb") as reader:
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768


def transcribe(handler: SpeechHandler, data: bytes, options: SpeechOptions = EN) -> Transcript:
    prepared = handler.preprocess([AudioClip(data, 7200.0, options)])
    return Transcript.of(handler.postprocess(handler.forward(prepared)))


def pipeline_transcript(handler: SpeechHandler, samples: np.ndarray, **chunking) -> dict:
    """transformers' own ASR pipeline on the same weights, greedy, in 30-second chunks."""
    from transformers import pipeline

    asr = pipeline(
        "automatic-speech-recognition",
        model=handler._model,
        tokenizer=handler._processor.tokenizer,
        feature_extractor=handler._processor.feature_extractor,
        chunk_length_s=30,
        **chunking,
    )
    kwargs = {"language": "en", "task": "transcribe", "num_beams": 1}
    return asr(samples, return_timestamps=True, generate_kwargs=kwargs)


def within(theirs: dict, duration: float) -> list[tuple[float, float, str]]:
    """The pipeline's chunks of one window kept within its audio, as ours are."""
    found = []
    for chunk in theirs["chunks"]:
        start, end = chunk["timestamp"]
        first = min(max(start, 0.0), duration)
        found.append((round(first, 3), round(min(max(end, first), duration), 3), chunk["text"]))
    return found


def test_a_short_clip_is_the_pipelines_own_transcript(loaded, tmp_path):
    path = write_wav(tmp_path / "short.wav", tone(12.0, seed=3))
    ours = transcribe(loaded, path.read_bytes())
    theirs = pipeline_transcript(loaded, read_wav(path))
    assert ours.text == theirs["text"] and ours.text
    assert [(s.start, s.end, s.text) for s in ours.segments] == within(theirs, 12.0)
    assert all(0 <= s.start <= s.end <= 12.0 for s in ours.segments)
    assert ours.duration == 12.0 and ours.windows == 1


def test_a_long_clip_is_the_pipelines_own_transcript_in_30_second_windows(loaded, tmp_path):
    path = write_wav(tmp_path / "long.wav", tone(65.0, seed=4))
    prepared = loaded.preprocess([AudioClip(path.read_bytes(), 7200.0, EN)])
    assert prepared.count == 3 and prepared.bucket.label == "w30xb4"
    rows = loaded.postprocess(loaded.forward(prepared))
    ours = Transcript.of(rows)
    theirs = pipeline_transcript(loaded, read_wav(path), stride_length_s=0)
    assert ours.text == theirs["text"]  # the pipeline's own text over the whole clip
    heard, expected = read_wav(path), []
    for start in (0, 30, 60):  # its chunks, a window at a time, placed in the clip
        window = heard[start * SAMPLE_RATE : (start + 30) * SAMPLE_RATE]
        alone = within(pipeline_transcript(loaded, window), window.size / SAMPLE_RATE)
        expected += [(round(a + start, 3), round(b + start, 3), t) for a, b, t in alone]
    assert [(s.start, s.end, s.text) for s in ours.segments] == expected
    assert [row.start_s for row in rows] == [0, 30, 60] and ours.duration == 65.0
    assert all(row.start_s <= s.start <= s.end <= row.end_s for row in rows for s in row.segments)
    assert len({row.text for row in rows}) == 3  # each window heard its own audio


def test_requests_merge_into_one_call_and_keep_their_own_windows(loaded, tmp_path):
    one = loaded.preprocess(
        [AudioClip(write_wav(tmp_path / "a.wav", tone(40, seed=5)).read_bytes(), 60, EN)]
    )
    two = loaded.preprocess(
        [AudioClip(write_wav(tmp_path / "b.wav", tone(20, seed=6)).read_bytes(), 60, EN)]
    )
    merged = loaded.merge([one, two])
    assert merged is not None and merged.count == 3 and merged.bucket.label == "w30xb4"
    alone = [loaded.postprocess(loaded.forward(p)) for p in (one, two)]
    together = loaded.postprocess(loaded.forward(merged))
    assert [r.text for r in together] == [r.text for rows in alone for r in rows]
    other = loaded.preprocess(
        [
            AudioClip(
                write_wav(tmp_path / "c.wav", tone(5)).read_bytes(),
                60,
                SpeechOptions(language="fr"),
            )
        ]
    )
    assert loaded.merge([one, other]) is None  # another language: another generate call
    assert loaded.batch_group(one) != loaded.batch_group(other)


def test_the_first_quote_grows_with_the_windows_in_a_call(loaded):
    from app.models.base import Bucket

    one, four = (loaded.prior_bytes(Bucket(f"w30xb{n}", n)) for n in (1, 4))
    assert 0 < one < four == 4 * speech_bytes(loaded._model.config, 1, 4) * 4 // 4


@pytest.mark.parametrize("suffix", sorted(CODECS))
def test_every_container_decodes_to_16k_mono_of_its_length(tmp_path, suffix):
    path = write_encoded(tmp_path / f"clip.{suffix}", tone(3.0))
    samples = decode_audio(path.read_bytes(), 60)
    assert samples.dtype == np.float32
    assert abs(samples.size / SAMPLE_RATE - 3.0) < 0.1  # encoders pad a frame or two


def test_a_wav_decodes_to_its_own_samples(tmp_path):
    path = write_wav(tmp_path / "exact.wav", tone(2.0))
    assert np.array_equal(decode_audio(path.read_bytes(), 60), read_wav(path))


def test_what_is_no_audio_is_refused(tmp_path):
    with pytest.raises(InvalidAudio):
        decode_audio(not_audio(tmp_path / "doc.pdf").read_bytes(), 60)
    with pytest.raises(InvalidAudio):
        decode_audio(b"", 60)


def test_too_long_audio_is_refused_naming_both_numbers(tmp_path):
    path = write_encoded(tmp_path / "long.ogg", tone(8.0))
    with pytest.raises(AudioTooLong, match=r"8\.\d s; at most 5 s"):
        decode_audio(path.read_bytes(), 5)


def test_a_language_the_model_does_not_know_is_refused(loaded):
    assert loaded.language_refused("en", "transcribe") is None
    refused = loaded.language_refused("xx", "transcribe")
    assert refused is not None and "de, en, es, fr" in refused.message
