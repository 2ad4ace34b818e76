"""POST /v1/audio/transcriptions and /translations through the official `openai` client,
on a tiny random Whisper built here and served on the CPU: text, srt, vtt, json and
verbose_json equal to transformers' own pipeline for the same file and weights, with
segments within the audio; every container we claim decodes; a 10-minute file runs in
30-second windows batched `max_batch` to a call; two files sent together share one
forward; what is no audio, or too long, is a 400 before anything is queued, and the
server goes on serving."""

from __future__ import annotations

import io
import json
import shutil
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest
from openai import OpenAI

from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings
from tests.support.random_whisper import (
    CODECS,
    not_audio,
    save_random_whisper,
    tone,
    write_encoded,
    write_wav,
)

MAX_BATCH = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_random_whisper(tmp_path_factory.mktemp("whisper"))


def serve(tmp_path_factory: Any, folder: Path, **overrides: Any) -> Iterator[Live]:
    spec = ModelSpec(
        name="whisper", kind="speech", path=folder, max_batch=MAX_BATCH, load="startup"
    )
    settings = make_settings(
        tmp_path_factory.mktemp("server"),
        device="cpu",
        models=(spec,),
        health_interval=3600,
        max_body_bytes=64 * 2**20,  # a 10-minute 16 kHz WAV is 19 MB
        cpu_threads=1,
        **overrides,
    )
    with live_server(settings) as server:
        yield server


@pytest.fixture(scope="module")
def live(tmp_path_factory, folder) -> Iterator[Live]:
    # requests arriving together gather for a quarter second, so they share a forward
    yield from serve(tmp_path_factory, folder, max_audio_seconds=900, max_batch_wait_ms=250)


@pytest.fixture(scope="module")
def client(live) -> OpenAI:
    return OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def short_wav(tmp_path_factory) -> Path:
    return write_wav(tmp_path_factory.mktemp("audio") / "short.wav", tone(12.0, seed=3))


@pytest.fixture(scope="module")
def expected(live, short_wav) -> dict[str, Any]:
    """transformers' own pipeline on the served weights, greedy, for the short file."""
    from transformers import pipeline

    handler = live.service.registry.get("whisper")
    asr = pipeline(
        "automatic-speech-recognition",
        model=str(handler.path),
        chunk_length_s=30,
        device="cpu",
    )
    kwargs = {"language": "en", "task": "transcribe", "num_beams": 1}
    return asr(read_wav(short_wav), return_timestamps=True, generate_kwargs=kwargs)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as reader:
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768


def pipeline_segments(expected: dict[str, Any], duration: float) -> list[tuple[float, float]]:
    """The pipeline's chunk times kept within the audio, as the server keeps them."""
    times = []
    for chunk in expected["chunks"]:
        start, end = chunk["timestamp"]
        first = min(max(start, 0.0), duration)
        times.append((round(first, 3), round(min(max(end, first), duration), 3)))
    return times


def test_an_empty_model_is_the_one_speech_model_served(client, short_wav, expected):
    """Open WebUI sends `model=""` when its speech to text model field is empty."""
    with short_wav.open("rb") as file:
        answer = client.audio.transcriptions.create(model="", file=file, language="en")
    assert answer.text == expected["text"] and answer.text
    listed = {m.id: m for m in client.models.list()}
    assert listed["whisper"].aliases == [""]  # type: ignore[attr-defined]


@pytest.mark.slow  # two servers of two Whisper models: ~30 s
def test_an_empty_model_with_two_speech_models_is_a_400_listing_them(tmp_path_factory, folder):
    """Which of two it would be is not for the server to guess; `model_aliases` may say."""
    specs = tuple(ModelSpec(name=n, kind="speech", path=folder) for n in ("whisper", "whisper2"))
    wav = write_wav(tmp_path_factory.mktemp("audio") / "two.wav", tone(2.0, seed=4))

    def transcribe(client: OpenAI, model: str) -> str:
        with wav.open("rb") as file:
            return client.audio.transcriptions.create(model=model, file=file, language="en").text

    root = tmp_path_factory.mktemp("two")
    with live_server(make_settings(root, device="cpu", models=specs)) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            transcribe(client, "")
        error = refused.value.body
        assert error["param"] == "model" and error["models"] == ["whisper", "whisper2"]
        assert "whisper, whisper2" in error["message"]
        assert transcribe(client, "whisper2") == transcribe(client, "whisper")  # both served
    chosen = make_settings(root, device="cpu", models=specs, model_aliases={"": "whisper2"})
    with live_server(chosen) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        assert transcribe(client, "") == transcribe(client, "whisper2")
        listed = {m.id: m.aliases for m in client.models.list()}  # type: ignore[attr-defined]
        assert listed == {"whisper": [], "whisper2": [""]}


def test_json_and_text_are_the_pipelines_own_text(client, short_wav, expected):
    with short_wav.open("rb") as file:
        answer = client.audio.transcriptions.create(model="whisper", file=file, language="en")
    assert answer.text == expected["text"] and answer.text
    with short_wav.open("rb") as file:
        text = client.audio.transcriptions.create(
            model="whisper", file=file, language="en", response_format="text"
        )
    assert text == expected["text"]


def test_verbose_json_segments_are_the_pipelines_chunks_within_the_audio(
    client, short_wav, expected
):
    with short_wav.open("rb") as file:
        answer = client.audio.transcriptions.create(
            model="whisper",
            file=file,
            language="en",
            response_format="verbose_json",
            timestamp_granularities=["segment"],
        )
    assert answer.duration == 12.0 and answer.language == "english"
    assert answer.text == expected["text"]
    segments = answer.segments or []
    assert [s.text for s in segments] == [c["text"] for c in expected["chunks"]]
    assert [(s.start, s.end) for s in segments] == pipeline_segments(expected, 12.0)
    assert all(0 <= s.start <= s.end <= 12.0 for s in segments)


def test_srt_and_vtt_carry_the_same_segments(client, short_wav, expected):
    with short_wav.open("rb") as file:
        srt = client.audio.transcriptions.create(
            model="whisper", file=file, language="en", response_format="srt"
        )
    with short_wav.open("rb") as file:
        vtt = client.audio.transcriptions.create(
            model="whisper", file=file, language="en", response_format="vtt"
        )
    cues = srt.strip().split("\n\n")
    assert len(cues) == len(expected["chunks"])
    start, end = pipeline_segments(expected, 12.0)[0]
    assert cues[0].split("\n")[1] == f"{clock(start, ',')} --> {clock(end, ',')}"
    assert vtt.startswith("WEBVTT\n\n")
    assert f"{clock(start, '.')} --> {clock(end, '.')}" in vtt


def clock(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    return (
        f"{millis // 3_600_000:02d}:{millis // 60_000 % 60:02d}:{millis // 1000 % 60:02d}"
        f"{separator}{millis % 1000:03d}"
    )


def test_a_stream_sends_deltas_then_the_whole_text(client, short_wav, expected):
    with short_wav.open("rb") as file:
        events = list(
            client.audio.transcriptions.create(
                model="whisper", file=file, language="en", stream=True
            )
        )
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = [e for e in events if e.type == "transcript.text.done"]
    assert len(done) == 1 and events[-1] is done[0]
    assert done[0].text == expected["text"] == "".join(deltas)


def test_stream_events_validate_as_openais_types(live, short_wav):
    """Each event as OpenAI's own models type it (pydantic, validated: the client itself
    only constructs them), so typed clients elsewhere read them too."""
    from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent

    answer = post(live, short_wav, language="en", stream="true")
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in answer.text.split("\n\n") if line]
    types = {
        "transcript.text.delta": TranscriptionTextDeltaEvent,
        "transcript.text.done": TranscriptionTextDoneEvent,
    }
    parsed = [types[event["type"]].model_validate(event) for event in events]
    assert isinstance(parsed[-1], TranscriptionTextDoneEvent) and len(parsed) > 1


@pytest.mark.parametrize("suffix", sorted(CODECS))
def test_every_container_is_transcribed(client, tmp_path, suffix):
    path = write_encoded(tmp_path / f"clip.{suffix}", tone(4.0, seed=8))
    with path.open("rb") as file:
        answer = client.audio.transcriptions.create(
            model="whisper", file=file, response_format="verbose_json"
        )
    assert abs(answer.duration - 4.0) < 0.1
    assert all(0 <= s.start <= s.end <= answer.duration for s in answer.segments or [])


def test_a_translation_runs_the_translate_task(client, short_wav):
    with short_wav.open("rb") as file:
        answer = client.audio.translations.create(
            model="whisper", file=file, response_format="verbose_json"
        )
    assert answer.duration == 12.0
    assert getattr(answer, "task", None) == "translate"


def post(live: Live, path: Path | bytes, name: str = "clip.wav", **fields: str) -> httpx.Response:
    data = path.read_bytes() if isinstance(path, Path) else path
    with httpx.Client(base_url=live.url, timeout=300) as http:
        return http.post(
            "/v1/audio/transcriptions",
            files={"file": (name, data)},
            data={"model": "whisper", **fields},
        )


@pytest.mark.slow  # ~15-30 s
def test_a_10_minute_file_runs_in_30_second_windows_batched(live, tmp_path):
    path = write_wav(tmp_path / "ten.wav", tone(600.0, seed=9))
    answer = post(live, path, response_format="verbose_json", language="en")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["usage"]["windows"] == 20 and body["duration"] == 600.0
    # one forward: the 20 windows run 8 to a generate call, priced as one call's bucket
    assert answer.headers["X-Vramgate-Bucket"] == f"w30xb{MAX_BATCH}"
    assert all(0 <= s["start"] <= s["end"] <= 600.0 for s in body["segments"])
    starts = {int(s["start"] // 30) for s in body["segments"]}
    assert len(starts) >= 15  # segments come from windows all along the file


def test_two_files_sent_together_share_one_forward(live, tmp_path):
    paths = [write_wav(tmp_path / f"{i}.wav", tone(70.0, seed=20 + i)) for i in range(2)]
    alone = [post(live, p, language="en").json()["text"] for p in paths]
    calls = live.service.registry.get("whisper").forward_calls
    answers: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda p=p: answers.append(post(live, p, language="en")))
        for p in paths
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.headers["X-Vramgate-Batch"] for a in answers] == ["2", "2"]
    assert answers[0].headers["X-Vramgate-Bucket"] == "w30xb8"  # 3 + 3 windows in one call
    assert live.service.registry.get("whisper").forward_calls == calls + 1
    assert sorted(a.json()["text"] for a in answers) == sorted(alone)


def nothing_queued(live: Live, before: dict[str, Any]) -> None:
    after = live.status()
    assert after["queue"]["depth"] == 0 and after["pool"]["admitted_bytes"] == 0
    assert after["counters"]["served"] == before["counters"]["served"]


@pytest.mark.parametrize("body", ["pdf", "noise", "truncated"])
def test_what_is_no_audio_is_a_400_and_nothing_is_queued(live, tmp_path, short_wav, body):
    data = {
        "pdf": not_audio(tmp_path / "doc.pdf").read_bytes(),
        "noise": np.random.default_rng(0).bytes(4096),
        "truncated": short_wav.read_bytes()[:30],
    }[body]
    before = live.status()
    calls = live.service.registry.get("whisper").forward_calls
    answer = post(live, data, name="doc.pdf")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_audio"
    nothing_queued(live, before)
    assert live.service.registry.get("whisper").forward_calls == calls
    assert post(live, short_wav, response_format="text").status_code == 200  # still serves


def test_a_playlist_of_a_local_file_is_the_same_400_whether_the_file_exists(
    live, client, tmp_path, monkeypatch
):
    """ffmpeg's concat demuxer opens the files its list names (relative to the server's
    working directory): the upload must not be transcribed from them, nor tell which exist."""
    monkeypatch.chdir(tmp_path)  # the server runs in this process: its working directory
    (tmp_path / "Music").mkdir()
    secret = write_wav(tmp_path / "Music" / "secret.wav", tone(2.0, seed=5))
    before = live.status()
    errors = []
    for name in ("secret.wav", "absent.wav"):
        playlist = f"ffconcat version 1.0\nfile Music/{name}\n".encode()
        with pytest.raises(openai.BadRequestError) as refused:
            client.audio.transcriptions.create(model="whisper", file=("list.wav", playlist))
        errors.append(refused.value.body)
    assert errors[0] == errors[1] and errors[0]["code"] == "invalid_audio"
    nothing_queued(live, before)
    # the valid twin: the file itself, uploaded, is transcribed
    with secret.open("rb") as file:
        answer = client.audio.transcriptions.create(
            model="whisper", file=file, language="en", response_format="verbose_json"
        )
    assert answer.duration == 2.0


def test_a_file_over_the_limit_is_a_400_naming_both_numbers(tmp_path_factory, folder, tmp_path):
    for live in serve(tmp_path_factory, folder, max_audio_seconds=5):
        path = write_encoded(tmp_path / "long.ogg", tone(8.0))
        before = live.status()
        answer = post(live, path, name="long.ogg")
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "audio_too_long"
        assert "8.0 s" in error["message"] and "at most 5 s" in error["message"]
        nothing_queued(live, before)


def send_to(client: OpenAI, data: bytes, answers: list[Any]) -> None:
    """A transcription of `data`; its answer or its error goes to `answers`."""
    try:
        text = client.audio.transcriptions.create(
            model="whisper", file=("half.wav", data), language="en"
        )
        answers.append(text)
    except openai.APIStatusError as exc:
        answers.append(exc)


@pytest.mark.slow
def test_audio_held_past_max_audio_bytes_is_a_503_with_retry_after(
    tmp_path_factory, folder, tmp_path
):
    """Uploads and their decoded samples count against max_audio_bytes while they wait
    and run: four 30-second files at once (each 0.96 MB sent, 1.92 MB decoded, twice
    that while joined) cannot all be held within 5 MiB; those refused are 503s with
    Retry-After, the rest are served, and every byte comes back."""
    data = write_wav(tmp_path / "half.wav", tone(30.0, seed=2)).read_bytes()
    for live in serve(tmp_path_factory, folder, max_audio_bytes=5 * 2**20):
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        answers: list[Any] = []
        threads = [threading.Thread(target=send_to, args=(client, data, answers)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        refused = [a for a in answers if isinstance(a, openai.APIStatusError)]
        assert refused, "four files at once were all held"
        for error in refused:
            assert error.status_code == 503 and error.body["code"] == "audio_memory_full"
            assert int(error.response.headers["Retry-After"]) >= 1
        assert live.fleet.audio_bytes.held == 0
        # the valid twin: one file alone is served
        assert client.audio.transcriptions.create(
            model="whisper", file=("half.wav", data), language="en"
        ).text
        assert live.fleet.audio_bytes.held == 0


def three_hours_of_silence() -> bytes:
    """A real 3-hour FLAC (8 kHz silence, 2 MB), encoded by PyAV a minute at a time."""
    import av

    out = io.BytesIO()
    minute = np.zeros((1, 8000 * 60), dtype=np.int16)
    with av.open(out, "w", format="flac") as container:
        stream = container.add_stream("flac", rate=8000)
        stream.layout = "mono"  # type: ignore[union-attr]
        for index in range(180):
            frame = av.AudioFrame.from_ndarray(minute, format="s16", layout="mono")
            frame.sample_rate, frame.pts = 8000, index * minute.size
            for packet in stream.encode(frame):  # type: ignore[union-attr]
                container.mux(packet)
        for packet in stream.encode(None):  # type: ignore[union-attr]
            container.mux(packet)
    return out.getvalue()


def test_a_3_hour_file_is_refused_by_the_default_limit_before_decoding(
    tmp_path_factory, folder, short_wav
):
    """The default max_audio_seconds (2 hours): the container's declared duration is read
    and the file refused without decoding it; nothing queued, the server serves on."""
    data = three_hours_of_silence()
    for live in serve(tmp_path_factory, folder):
        assert live.fleet.settings.max_audio_seconds == 7200
        before = live.status()
        started = time.monotonic()
        answer = post(live, data, name="meeting.flac")
        took = time.monotonic() - started
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "audio_too_long" and error["param"] == "file"
        assert "10800.0 s" in error["message"] and "at most 7200 s" in error["message"]
        assert took < 5, took  # 3 hours decoded would take far longer on this CPU
        nothing_queued(live, before)
        assert post(live, short_wav, response_format="text").status_code == 200


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"timestamp_granularities[]": "letter"}, "timestamp_granularities"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),  # json: no words
        (
            {
                "timestamp_granularities[]": "word",
                "response_format": "verbose_json",
                "stream": "true",
            },
            "timestamp_granularities",
        ),
        ({"response_format": "docx"}, "response_format"),
        ({"temperature": "3"}, "temperature"),
        ({"language": "english"}, "language"),
        ({"language": "xx"}, "language"),
    ],
)
def test_bad_fields_are_400s_naming_the_field(live, short_wav, fields, param):
    answer = post(live, short_wav, **fields)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def second_wav(tmp_path_factory) -> Path:
    return write_wav(tmp_path_factory.mktemp("audio") / "second.wav", tone(7.0, seed=5))


def pipeline_words(live: Live, path: Path) -> list[tuple[str, float, float]]:
    """transformers' pipeline with `return_timestamps="word"` on the served weights, its
    words as OpenAI writes them (no surrounding space), times kept within the audio."""
    from transformers import pipeline

    asr = pipeline(
        "automatic-speech-recognition",
        model=str(live.service.registry.get("whisper").path),
        chunk_length_s=30,
        device="cpu",
    )
    samples = read_wav(path)
    kwargs = {"language": "en", "task": "transcribe", "num_beams": 1}
    found = asr(samples, return_timestamps="word", generate_kwargs=kwargs)
    times = pipeline_segments(found, samples.size / 16_000)
    return [(c["text"].strip(), *t) for c, t in zip(found["chunks"], times, strict=True)]


def words_of(answer: Any) -> list[tuple[str, float, float]]:
    return [(w.word, w.start, w.end) for w in answer.words or []]


def test_word_timestamps_are_the_pipelines_words_within_the_audio(
    client, short_wav, second_wav, live
):
    """Two files sent together share one `generate` call (the shorter row padded after
    its end) and each gets the words the pipeline gives it alone."""
    expected = {path: pipeline_words(live, path) for path in (short_wav, second_wav)}
    answers: dict[Path, Any] = {}

    def ask(path: Path) -> None:
        with path.open("rb") as file:
            answers[path] = client.audio.transcriptions.with_raw_response.create(
                model="whisper",
                file=file,
                language="en",
                response_format="verbose_json",
                timestamp_granularities=["word"],
            )

    threads = [threading.Thread(target=ask, args=(p,)) for p in expected]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [answers[p].headers["X-Vramgate-Batch"] for p in expected] == ["2", "2"]
    for path, duration in ((short_wav, 12.0), (second_wav, 7.0)):
        answer = answers[path].parse()
        assert expected[path] and words_of(answer) == expected[path]
        assert all(0 <= w.start <= w.end <= duration for w in answer.words or [])
        assert answer.segments  # segments stay beside the words


def test_a_batched_rows_token_times_are_its_own_not_the_paddings(live):
    """Windows of different lengths in one `generate` call: each row's tokens and times
    are those it gets alone, its padding after its end cut off (the last word's end
    would otherwise be read past it)."""
    from app.models.audio import SpeechOptions, Window

    handler = live.service.registry.get("whisper")
    options = SpeechOptions(language="en", words=True)
    rows = [Window(tone(seconds, seed=seed), 0.0, options) for seconds, seed in ((12, 3), (7, 5))]
    together = handler.forward(handler._prepared(rows))
    alone = [handler.forward(handler._prepared([row]))[0] for row in rows]
    assert len({len(d.tokens) for d in alone}) == 2  # one row ends before the other
    for mixed, single in zip(together, alone, strict=True):
        assert mixed.tokens == single.tokens
        assert mixed.times is not None and len(mixed.times) == len(mixed.tokens)


def test_a_model_without_alignment_heads_refuses_words(tmp_path_factory, folder, short_wav):
    """transformers times words by the cross-attention heads `alignment_heads` names and
    raises without them: a 400 before anything is queued; segments still served."""
    plain = tmp_path_factory.mktemp("no-heads") / "whisper"
    shutil.copytree(folder, plain)
    generation = json.loads((plain / "generation_config.json").read_text())
    del generation["alignment_heads"]
    (plain / "generation_config.json").write_text(json.dumps(generation))
    for live in serve(tmp_path_factory, plain):
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        before = live.status()
        with short_wav.open("rb") as file, pytest.raises(openai.BadRequestError) as refused:
            client.audio.transcriptions.create(
                model="whisper",
                file=file,
                response_format="verbose_json",
                timestamp_granularities=["word"],
            )
        assert "alignment_heads" in refused.value.message
        nothing_queued(live, before)
        assert post(live, short_wav, response_format="verbose_json").status_code == 200


def test_the_model_is_listed_with_its_capability(live, client):
    listed = {m.id: m for m in client.models.list()}
    assert "transcription" in listed["whisper"].capabilities  # type: ignore[attr-defined]
    row = next(m for m in live.status()["models"] if m["name"] == "whisper")
    assert row["kind"] == "speech" and row["loaded"]
    tags = httpx.get(live.url + "/api/tags", timeout=30).json()["models"]
    # Ollama lists what it can chat or embed with: a speech model is not in its pickers,
    # and is shown when asked for by name
    assert "whisper" not in [t["name"] for t in tags]
    shown = ollama.Client(host=live.url).show("whisper")
    assert shown.capabilities == [] and shown.details and shown.details.family == "whisper"
    assert shown.modelinfo and shown.modelinfo["vramgate.kind"] == "speech"


def test_the_window_bucket_has_a_learned_price(live, short_wav):
    assert post(live, short_wav, language="en").status_code == 200
    row = next(m for m in live.status()["models"] if m["name"] == "whisper")
    prices = {p["bucket"]: p for p in row["prices"]}
    assert prices["w30xb1"]["source"] == "learned", prices


def test_a_word_request_has_its_own_bucket_and_leaves_the_attention_as_it_was(live, short_wav):
    """Word timestamps hold every layer's attention maps: a `~words` bucket of its own,
    never the plain window's price; and transformers' switch of the shared config to
    eager attention is undone, so later plain runs run as priced."""
    config = live.service.registry.get("whisper")._model.config
    before = config._attn_implementation
    assert before != "eager"
    words = post(
        live,
        short_wav,
        language="en",
        response_format="verbose_json",
        **{"timestamp_granularities[]": "word"},
    )
    assert words.status_code == 200, words.text
    assert words.json()["words"] and words.headers["X-Vramgate-Bucket"] == "w30xb1~words"
    assert config._attn_implementation == before
    plain = post(live, short_wav, language="en")
    assert plain.status_code == 200 and plain.headers["X-Vramgate-Bucket"] == "w30xb1"
    row = next(m for m in live.status()["models"] if m["name"] == "whisper")
    prices = {p["bucket"]: p for p in row["prices"]}
    assert prices["w30xb1~words"]["source"] == "learned", prices
