"""POST /v1/audio/speech on a tiny random VITS built here, served on the CPU, through the
official `openai` client and as Open WebUI sends it: every format decodes (PyAV) to the
audio transformers' own VitsModel speaks for each sentence, resampled to 24 kHz; a
streamed answer is the same audio as it is spoken; OpenAI's `sse` events carry it too;
what is wrong is a 400 before anything is queued. A tiny random SpeechT5 served beside it
speaks every format as its own `generate_speech` does."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from app.api.audio.parts import split_parts
from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings, wait_until
from tests.support.random_speecht5 import save_random_speecht5
from tests.support.random_vits import save_random_vits

TEXT = "Hello there, this is a test. A second sentence follows the first one!"
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
OUT_RATE = 24_000


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_random_vits(tmp_path_factory.mktemp("vits"))


@pytest.fixture(scope="module")
def speecht5_folder(tmp_path_factory) -> Path:
    return save_random_speecht5(tmp_path_factory.mktemp("speecht5"), speakers=2)


@pytest.fixture(scope="module")
def live(tmp_path_factory, folder, speecht5_folder) -> Iterator[Live]:
    spec = ModelSpec(name="vits", kind="speech_synthesis", path=folder, max_batch=8, load="startup")
    speecht5 = ModelSpec(name="speecht5", kind="speech_synthesis", path=speecht5_folder)
    settings = make_settings(
        tmp_path_factory.mktemp("server"),
        device="cpu",
        models=(spec, speecht5),
        health_interval=3600,
        cpu_threads=1,
        max_batch_wait_ms=100,
    )
    with live_server(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(live) -> OpenAI:
    return OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def expected_speech(folder) -> np.ndarray:
    """transformers' own VitsModel on each sentence (seed 0, as the server's default),
    one after the other through one resampler to 24 kHz (ffmpeg's, by PyAV): the audio
    the answer must hold, as floats."""
    import torch
    from transformers import VitsModel, VitsTokenizer

    tokenizer = VitsTokenizer.from_pretrained(folder)
    model = VitsModel.from_pretrained(folder).eval()
    waves = []
    for part in split_parts(TEXT):
        torch.manual_seed(0)
        with torch.inference_mode():
            waves.append(model(**tokenizer(part, return_tensors="pt")).waveform[0].numpy())
    return at_24_khz(waves, model.config.sampling_rate)


def at_24_khz(waves: list[np.ndarray], rate: int) -> np.ndarray:
    """`waves` (float, at `rate`) one after the other, resampled to 24 kHz within 16-bit
    range (a random model's speech passes it, before and, ringing, after resampling)."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=OUT_RATE)
    out = []
    for wave in [*waves, None]:
        frame = None
        if wave is not None:
            samples = wave.clip(-1, 1).reshape(1, -1).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
            frame.sample_rate = rate
        out += [piece.to_ndarray()[0] for piece in resampler.resample(frame)]
    return np.concatenate(out).clip(-1, 32767 / 32768)


def decoded(data: bytes, response_format: str) -> np.ndarray:
    """The answer's audio as floats at 24 kHz (Ogg Opus decodes at 48 kHz: resampled)."""
    if response_format == "pcm":  # 24 kHz, 16-bit signed little-endian, mono
        return np.frombuffer(data, dtype="<i2") / 32768
    resampler = av.AudioResampler(format="flt", layout="mono", rate=OUT_RATE)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert stream.channels == 1
        frames = [*container.decode(stream), None]
        return np.concatenate([p.to_ndarray()[0] for f in frames for p in resampler.resample(f)])


def assert_sounds_like(heard: np.ndarray, expected: np.ndarray, response_format: str) -> None:
    """The lossless formats: the same samples (within float rounding of a batched run);
    the lossy ones: the same waveform, after the encoder's delay (mp3: 1,105 samples;
    AAC's priming: 1,024) and within 0.15 s of its length (whole frames)."""
    assert np.abs(expected).max() > 0.1  # speech, against which silence differs
    if response_format not in ("mp3", "opus", "aac"):
        assert len(heard) == len(expected)
        differs = np.abs(heard - expected).max()
        assert differs < 2e-3, f"{response_format}: a sample differs by {differs:.4f}"
        return
    assert abs(len(heard) - len(expected)) <= 0.15 * OUT_RATE, (len(heard), len(expected))
    lag = int(np.argmax(np.correlate(heard[:6_000], expected[:4_000], "valid")))
    n = min(len(heard) - lag, len(expected))
    alike = np.corrcoef(heard[lag : lag + n], expected[:n])[0, 1]  # 0.92 to 0.99 here
    assert alike > 0.8, f"{response_format}: correlation {alike:.3f} with the model's speech"


@pytest.mark.parametrize("response_format", FORMATS)
def test_every_format_decodes_to_the_models_speech(client, expected_speech, response_format):
    answer = client.audio.speech.create(
        model="vits", input=TEXT, voice="alloy", response_format=response_format
    )
    assert_sounds_like(decoded(answer.content, response_format), expected_speech, response_format)
    assert answer.response.headers["X-Vramgate-Parts"] == "2"
    assert answer.response.headers["X-Vramgate-Bucket"].startswith("s")


def test_a_streamed_answer_is_the_same_audio_as_it_is_spoken(client):
    whole = client.audio.speech.create(
        model="vits", input=TEXT, voice="alloy", response_format="pcm"
    ).content
    with client.audio.speech.with_streaming_response.create(
        model="vits", input=TEXT, voice="alloy", response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        chunks = list(response.iter_bytes())
    assert b"".join(chunks) == whole and whole
    pcm = np.frombuffer(whole, dtype="<i2")
    assert np.abs(pcm).max() > 1000  # speech, not silence


def test_sse_events_carry_the_audio_and_the_usage(live, client):
    whole = client.audio.speech.create(
        model="vits", input=TEXT, voice="alloy", response_format="wav"
    ).content
    body = {"model": "vits", "input": TEXT, "response_format": "wav", "stream_format": "sse"}
    with httpx.stream("POST", live.url + "/v1/audio/speech", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and events[-1]["type"] == "speech.audio.done"
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == whole
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > len(TEXT) and usage["total_tokens"] == usage["input_tokens"]


def test_open_webuis_request_reaches_the_speech_model_through_tts_1(live):
    """Open WebUI's OpenAI TTS engine (backend/open_webui/routers/audio.py, `speech`): its
    page's {"input", "voice"} with "model" set to its TTS model (tts-1 by default),
    posted as JSON with a bearer key; the whole body read and saved as an .mp3."""
    payload = {"input": "Hello from Open WebUI.", "voice": "alloy", "model": "tts-1"}
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-unused"}
    reply = httpx.post(live.url + "/v1/audio/speech", json=payload, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "audio/mpeg"
    with av.open(io.BytesIO(reply.content)) as container:
        assert container.format.name == "mp3"
        assert len(decoded(reply.content, "mp3")) > 0.2 * OUT_RATE
    assert "ignored" in reply.headers["X-Vramgate-Warning"]  # one voice: alloy unused


def served_by(live: Live) -> dict[str, int]:
    return live.status()["counters"]["served_by_model"]


def test_openais_speech_names_are_listed_and_a_model_alias_takes_one(
    tmp_path, folder, speecht5_folder
):
    """OpenAI's speech model names reach the first speech_synthesis model (vits) and are
    listed under it in /v1/models; a `model_aliases` pattern for one of them (tts-1-hd)
    takes that one to another model, listed there, while tts-1 still reaches vits."""
    # both loaded and warmed up before: a request is then counted for its model alone
    vits = ModelSpec(name="vits", kind="speech_synthesis", path=folder, load="startup")
    speecht5 = ModelSpec(
        name="speecht5", kind="speech_synthesis", path=speecht5_folder, load="startup"
    )
    settings = make_settings(
        tmp_path, device="cpu", models=(vits, speecht5), model_aliases={"tts-1-hd": "speecht5"}
    )
    with live_server(settings) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        listed = {m.id: m.aliases for m in client.models.list()}  # type: ignore[attr-defined]
        assert listed == {"vits": ["tts-*", "gpt-4o-mini-tts*"], "speecht5": ["tts-1-hd"]}
        ready = lambda: {m["state"] for m in live.status()["models"]} == {"ready"}  # noqa: E731
        wait_until(ready, 120, "warm-ups")  # not counted as served: no caller's
        for name, reached in (("tts-1-hd", "speecht5"), ("tts-1", "vits")):
            before = served_by(live)
            client.audio.speech.create(model=name, input="Hello.", voice="alloy")
            assert served_by(live) == {**before, reached: before.get(reached, 0) + 1}, name


def test_a_speecht5_model_speaks_every_format_as_its_generate_speech_does(client, speecht5_folder):
    """SpeechT5 (its vocoder in the folder, two voices in its speakers file; `ash` is the
    second): every format decodes to what `generate_speech` says for each sentence (seed
    0, the server's default); streamed, the same audio as whole."""
    import torch
    from safetensors.torch import load_file
    from transformers import SpeechT5ForTextToSpeech, SpeechT5HifiGan, SpeechT5Tokenizer

    tokenizer = SpeechT5Tokenizer.from_pretrained(speecht5_folder)
    model = SpeechT5ForTextToSpeech.from_pretrained(speecht5_folder).eval()
    vocoder = SpeechT5HifiGan.from_pretrained(speecht5_folder / "vocoder").eval()
    voice = load_file(speecht5_folder / "speakers.safetensors")["speakers"][1:2]
    waves = []
    for part in split_parts(TEXT):
        torch.manual_seed(0)
        with torch.inference_mode():
            ids = tokenizer(part, return_tensors="pt").input_ids
            waves.append(model.generate_speech(ids, voice, vocoder=vocoder).numpy())
    expected = at_24_khz(waves, vocoder.config.sampling_rate)
    assert len(expected) > OUT_RATE
    for response_format in FORMATS:
        answer = client.audio.speech.create(
            model="speecht5", input=TEXT, voice="ash", response_format=response_format
        )
        assert_sounds_like(decoded(answer.content, response_format), expected, response_format)
        assert answer.response.headers["X-Vramgate-Parts"] == "2"
    with client.audio.speech.with_streaming_response.create(
        model="speecht5", input=TEXT, voice="ash", response_format="pcm"
    ) as response:
        streamed = b"".join(response.iter_bytes())
    assert streamed == answer.content and np.abs(np.frombuffer(streamed, "<i2")).max() > 1000


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"speed": 4.5}, "speed"),
        ({"speed": 0.2}, "speed"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "chunks"}, "stream_format"),
        ({"input": "¿¡ 🙂 !?"}, "input"),  # nothing the model's vocabulary has
    ],
)
def test_bad_input_is_a_400_and_nothing_is_queued(live, client, change, param):
    served = live.status()["counters"]["served"]
    body = {"model": "vits", "input": "Fine.", "voice": "alloy", **change}
    reply = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["code"], error
    assert live.status()["counters"]["served"] == served
    ok = client.audio.speech.create(model="vits", input="Fine.", voice="alloy")
    assert ok.content  # the valid twin is served


def test_a_model_that_does_not_speak_is_refused_by_name(live):
    with pytest.raises(openai.NotFoundError):
        OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0).audio.speech.create(
            model="nobody", input="Hi.", voice="alloy"
        )


def test_the_model_is_listed_and_its_parts_batch_and_learn_their_price(live, client):
    listed = {m.id: m for m in client.models.list()}
    assert "speech" in listed["vits"].capabilities  # type: ignore[attr-defined]
    answer = client.audio.speech.create(model="vits", input=TEXT, voice="alloy")
    headers = answer.response.headers
    assert headers["X-Vramgate-Batch"] == "2"  # the two sentences shared one forward
    row = next(m for m in live.status()["models"] if m["name"] == "vits")
    assert row["kind"] == "speech_synthesis"
    prices = {p["bucket"]: p for p in row["prices"]}
    assert prices[headers["X-Vramgate-Bucket"]]["source"] == "learned", prices


LONG = " ".join(f"Sentence number {i} is spoken here, and then more words." for i in range(25))


@pytest.fixture
def rows_spoken(live) -> Iterator[list[int]]:
    """The rows each forward of the served model speaks (its real forward, counted)."""
    handler = live.service.registry.get("vits")
    forward, counts = handler.forward, []

    def counted(prepared: Any) -> Any:
        counts.append(prepared.count)
        return forward(prepared)

    handler.forward = counted
    yield counts
    del handler.forward


@pytest.mark.slow
def test_a_client_that_leaves_stops_the_parts_not_yet_run(live, rows_spoken):
    """25 sentences: 9 parts, 4 queued at once. A client that leaves while the first
    runs: the parts on the device finish, the others never run; its valid twin, heard
    to the end, runs all 9."""
    assert len(split_parts(LONG)) == 9
    body = {"model": "vits", "input": LONG, "response_format": "pcm"}
    handler = live.service.registry.get("vits")
    counted, left = handler.forward, threading.Event()

    def held(prepared: Any) -> Any:  # the first forward lasts until its client has left
        left.wait(60)  # (on a fast machine all 9 parts were spoken within the second)
        return counted(prepared)

    handler.forward = held
    with pytest.raises(httpx.ReadTimeout):  # gone before the first part is spoken
        httpx.post(live.url + "/v1/audio/speech", json=body, timeout=httpx.Timeout(60, read=1))
    left.set()
    wait_idle(live)
    handler.forward = counted
    assert 1 <= sum(rows_spoken) <= 4, rows_spoken
    rows_spoken.clear()
    whole = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=300)
    assert whole.status_code == 200 and whole.headers["X-Vramgate-Parts"] == "9"
    wait_idle(live)
    assert sum(rows_spoken) == 9, rows_spoken


def wait_idle(live: Live) -> None:
    from tests.support.live import wait_until

    def idle() -> bool:
        queue = live.status()["queue"]
        return queue["running"] == 0 and queue["depth"] == 0

    time.sleep(1.5)  # the watch notices the leave within a quarter second
    wait_until(idle, timeout=120, what="an idle queue")
