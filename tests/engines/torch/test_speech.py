"""The speech handler on a tiny random Whisper built here (save_pretrained), on the CPU:
audio decoded from every container we claim, cut into 30-second windows whose text and
segments are transformers' own for the same window (its pipeline for a short clip, its
`generate` per window for a long one), windows of several requests batched into one
call, and what is no audio or too long refused before anything runs."""

from __future__ import annotations

import threading
import time
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.torch.speech import SpeechHandler, speech_bytes, word_bytes
from app.errors import AudioTooLong, InvalidAudio
from app.models.audio import SAMPLE_RATE, AudioClip, SpeechOptions, decode_audio
from app.models.transcript import Transcript
from tests.support.random_whisper import (
    CODECS,
    not_audio,
    save_random_whisper,
    save_scripted_whisper,
    text_tokens,
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


def pipeline_transcript(
    handler: SpeechHandler, samples: np.ndarray, beams: int | None = 1, **chunking
) -> dict:
    """transformers' own ASR pipeline on the same weights, in 30-second chunks, greedy
    (`beams=1`); `beams=None` leaves the beams to the pipeline (the model's generation
    config, else its own default, 5)."""
    from transformers import pipeline

    asr = pipeline(
        "automatic-speech-recognition",
        model=handler._model,
        tokenizer=handler._processor.tokenizer,
        feature_extractor=handler._processor.feature_extractor,
        chunk_length_s=30,
        **chunking,
    )
    kwargs: dict = {"language": "en", "task": "transcribe"}
    if beams is not None:
        kwargs["num_beams"] = beams
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


def short_whisper(folder: Path, num_beams: int | None) -> SpeechHandler:
    """`save_random_whisper`'s, its generation config writing at most 37 tokens (5 beams
    over the 445 a random window writes take 15 s here) and naming `num_beams` where
    given, loaded."""
    from transformers import GenerationConfig

    save_random_whisper(folder)
    config = GenerationConfig.from_pretrained(folder)
    config.max_length = 40  # the prompt's 3 tokens and 37 generated
    if num_beams is not None:
        config.num_beams = num_beams
    config.save_pretrained(folder)
    handler = SpeechHandler(ModelSpec(name="whisper", kind="speech", path=folder, max_batch=4))
    handler.load(CpuDevice())
    assert handler._model.generation_config.max_length == 40
    return handler


@pytest.mark.parametrize("num_beams", [None, 5])
def test_a_window_is_the_pipelines_greedy_transcript_whatever_beams_the_config_names(
    tmp_path: Path, num_beams: int | None
) -> None:
    """The server decodes greedily, as the pipeline does when asked for `num_beams=1`, even
    where the model's generation config names 5 beams. Left to itself (the config's beams,
    else its own default, 5) the pipeline searches beams and answers otherwise from the
    first token (when this was written, at <|0.54|>, the second most likely first
    timestamp, where greedy takes the first, <|0.28|>)."""
    torch.set_num_threads(1)
    handler = short_whisper(tmp_path / "whisper", num_beams)
    path = write_wav(tmp_path / "tone.wav", tone(5.0))
    ours = transcribe(handler, path.read_bytes())
    greedy = pipeline_transcript(handler, read_wav(path))
    beams = pipeline_transcript(handler, read_wav(path), beams=None)
    assert ours.text == greedy["text"] and ours.text
    assert [(s.start, s.end, s.text) for s in ours.segments] == within(greedy, 5.0)
    assert within(beams, 5.0)[0][0] != ours.segments[0].start  # 5 beams: another first token


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
    from app.models.prepared import Bucket

    one, four = (loaded.prior_bytes(Bucket(f"w30xb{n}", n)) for n in (1, 4))
    assert 0 < one < four == 4 * speech_bytes(loaded._model.config, 1, 4) * 4 // 4


def whisper_config(layers: int, heads: int, vocab: int) -> SimpleNamespace:
    return SimpleNamespace(
        max_source_positions=1500,
        max_target_positions=448,
        encoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_layers=layers,
        decoder_attention_heads=heads,
        vocab_size=vocab,
    )


@pytest.mark.parametrize(
    ("layers", "heads", "vocab", "element", "expected"),
    [
        # encoder maps + cross-attentions + float32 scores, a window
        (4, 6, 51865, 4, 216_000_000 + 64_512_000 + 92_942_080),  # tiny, float32
        (12, 12, 51865, 2, 648_000_000 + 193_536_000 + 92_942_080),  # small, float16
        (32, 20, 51866, 2, 2_880_000_000 + 860_160_000 + 92_943_872),  # large-v3, float16
    ],
)
def test_what_timing_words_adds_to_a_window(layers, heads, vocab, element, expected):
    assert word_bytes(whisper_config(layers, heads, vocab), element) == expected


def test_word_windows_are_a_bucket_variant_of_their_own(loaded, tmp_path):
    """Word runs hold every layer's attention maps: their own `~words` variant, quoted
    with `word_bytes` a window, never merged or batched with plain windows."""
    from app.models.prepared import Bucket

    data = write_wav(tmp_path / "w.wav", tone(40, seed=5)).read_bytes()
    words = loaded.preprocess([AudioClip(data, 60, SpeechOptions(language="en", words=True))])
    plain = loaded.preprocess([AudioClip(data, 60, EN)])
    assert words.bucket.label == "w30xb2~words" and plain.bucket.label == "w30xb2"
    assert loaded.merge([words, plain]) is None
    assert loaded.batch_group(words) != loaded.batch_group(plain)
    with pytest.raises(ValueError):
        loaded._prepared([*words.payload, *plain.payload])
    config = loaded._model.config
    quote = loaded.prior_bytes(Bucket("w30xb2~words", 2))
    assert quote == speech_bytes(config, 2, 4, words=True)
    assert quote - loaded.prior_bytes(Bucket("w30xb2", 2)) == 2 * word_bytes(config, 4) * 5 // 4


def test_a_word_run_leaves_the_models_attention_as_it_found_it(loaded, tmp_path):
    """transformers sets the config to eager attention for word timestamps and leaves it
    so: every later run of the model would be eager (slower, more bytes than priced)."""
    before = loaded._model.config._attn_implementation
    assert before != "eager"
    data = write_wav(tmp_path / "w.wav", tone(5, seed=2)).read_bytes()
    assert transcribe(loaded, data, SpeechOptions(language="en", words=True)).words
    assert loaded._model.config._attn_implementation == before


def test_no_run_generates_while_a_word_run_does(loaded, monkeypatch):
    """Every `generate` of the model holds the handler's lock: a plain run that arrives
    while a word run generates (the config eager) waits for it to end."""
    from app.models.audio import Window

    inner = loaded._model.generate
    inside, running, seen = threading.Event(), [0], []

    def generate(*args, **kwargs):
        seen.append((running[0], loaded._model.config._attn_implementation))
        running[0] += 1
        try:
            if kwargs.get("return_token_timestamps"):
                inside.set()
                time.sleep(0.5)  # the plain run arrives meanwhile
            return inner(*args, **kwargs)
        finally:
            running[0] -= 1

    monkeypatch.setattr(loaded._model, "generate", generate)
    word = Window(tone(5, seed=2), 0.0, SpeechOptions(language="en", words=True))
    thread = threading.Thread(target=lambda: loaded.forward(loaded._prepared([word])))
    thread.start()
    assert inside.wait(60)
    loaded.forward(loaded._prepared([Window(tone(5, seed=3), 0.0, EN)]))
    thread.join()
    assert [count for count, _ in seen] == [0, 0]  # one at a time
    assert seen[1][1] != "eager"  # the plain run ran as priced


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


@pytest.mark.slow
def test_a_segment_without_timestamps_is_placed_where_the_previous_one_ends(tmp_path):
    """Whisper may end a window with text and no timestamp at all (audio cut mid-word):
    transformers then gives that chunk (None, None). A model that writes one segment,
    then a language token and text to its end, loads (its warm-up decodes one) and
    transcribes, that text placed at the previous segment's end, lasting nothing."""
    folder = save_random_whisper(tmp_path / "vocab")
    the, fox = text_tokens(folder, " the"), text_tokens(folder, " fox dog")
    script = ["<|0.00|>", *the, "<|1.00|>", "<|en|>", *fox, "<|endoftext|>"]
    folder = save_scripted_whisper(tmp_path / "scripted", script)
    handler = SpeechHandler(ModelSpec(name="scripted", kind="speech", path=folder))
    handler.load(CpuDevice())
    handler.prime()  # the warm-up: it failed with a TypeError before
    clip = write_wav(tmp_path / "clip.wav", tone(40.0))
    transcript = transcribe(handler, clip.read_bytes())
    spans = [(s.start, s.end) for s in transcript.segments]
    # each 30-second window: (0, 1) " the", then (1, 1) " fox dog"
    assert spans == [(0.0, 1.0), (1.0, 1.0), (30.0, 31.0), (31.0, 31.0)]
    assert [s.text for s in transcript.segments][:2] == [" the", " fox dog"]
