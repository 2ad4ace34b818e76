"""Speech benchmarks on the CPU, side by side in one run: speech to text and text to speech.

    python bench/speech.py [--part asr|tts|all] [--minutes 10] [--d-model 256] [--layers 4]
                           [--rounds 3] [--write-readme]

(bench/README.md holds a run with --d-model 128.)

Speech to text: a random Whisper (mid-size by default: d_model 256, 4 encoder and 4
decoder layers, the tiny test tokenizer, built here with save_pretrained) transcribes a
10-minute 16 kHz WAV (a tone whose pitch changes each second): vramgate's
/v1/audio/transcriptions with one file alone, in turns with transformers' own ASR
pipeline on the same weights and file (chunk_length_s=30, no stride, batch_size =
max_batch) as the raw baseline (`--rounds` of each, the best of each kept); then two
files at once (their windows share generate calls), and the same two one after the
other. Real-time factor = processing seconds / audio seconds
(lower is faster). faster-whisper is not compared: it runs CTranslate2 conversions of
Whisper checkpoints, and these random weights would first need
`ct2-transformers-converter` (not installed here).

Text to speech: a random VITS at MMS-TTS's size (VitsConfig's defaults, those of
facebook/mms-tts-eng: 36 M parameters) speaks one sentence through /v1/audio/speech
(`pcm`: 24 kHz 16-bit, as OpenAI sends it), then four different sentences at once (one
forward for the four: `X-Vramgate-Batch`), against transformers' VitsModel called
directly on the same weights, one sentence and the four one after the other. Real-time
factor = seconds to the whole answer / seconds of audio in it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from app.config.settings import ModelSpec  # noqa: E402
from bench.run import write_readme  # noqa: E402
from tests.support.live import live_server, make_settings  # noqa: E402
from tests.support.random_vits import save_random_vits  # noqa: E402
from tests.support.random_whisper import save_random_whisper, tone, write_wav  # noqa: E402

MAX_BATCH = 8
SENTENCES = [
    "The lighthouse keeper climbed the stairs before the storm reached the harbour.",
    "Four ships waited outside the bay while the wind turned to the north.",
    "She wrote each reading in the log and lit the lamp an hour early.",
    "By morning the sea was calm and the boats came home one after another.",
]
T = TypeVar("T")
R = TypeVar("R")
PCM_RATE = 24_000  # OpenAI's pcm: 24 kHz, 16-bit signed, mono


def transcribe(url: str, path: Path) -> dict[str, object]:
    with httpx.Client(base_url=url, timeout=3600) as http:
        answer = http.post(
            "/v1/audio/transcriptions",
            files={"file": (path.name, path.read_bytes())},
            data={"model": "whisper", "language": "en", "response_format": "verbose_json"},
        )
    answer.raise_for_status()
    return {"text": answer.json()["text"], "batch": answer.headers["X-Vramgate-Batch"]}


def timed(work: object) -> tuple[float, object]:
    started = time.perf_counter()
    result = work()  # type: ignore[operator]
    return time.perf_counter() - started, result


def at_once(work: Callable[[T], R], items: list[T]) -> list[R]:
    """`work(item)` for every item, each on a thread of its own, all started together;
    the results in the items' order."""
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(work, items))


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as reader:
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768


def asr_pipeline(folder: Path, path: Path) -> object:
    """transformers' ASR pipeline on the same weights, warmed; `run()` transcribes the
    file (given as the pipeline takes it: samples, decoded before the clock starts)."""
    from transformers import pipeline

    asr = pipeline(
        "automatic-speech-recognition",
        model=str(folder),
        chunk_length_s=30,
        stride_length_s=0,
        batch_size=MAX_BATCH,
        device="cpu",
    )
    kwargs = {"language": "en", "task": "transcribe", "num_beams": 1}
    samples = read_wav(path)
    asr(samples[: 5 * 16_000], return_timestamps=True, generate_kwargs=kwargs)  # warm

    def run() -> str:
        return asr(samples, return_timestamps=True, generate_kwargs=kwargs)["text"]  # type: ignore[index,no-any-return]

    return run


def measure(args: argparse.Namespace, root: Path) -> list[tuple[str, float, str]]:
    """One file alone through vramgate and through the pipeline, in turns (`rounds` of
    each, the best kept: this machine's noise moves one run by 20-40%); then two files
    at once and one after the other, once."""
    folder = save_random_whisper(root / "whisper", d_model=args.d_model, layers=args.layers)
    audio_s = args.minutes * 60
    paths = [write_wav(root / f"{i}.wav", tone(audio_s, seed=i)) for i in range(2)]
    raw_run = asr_pipeline(folder, paths[0])
    spec = ModelSpec(name="whisper", kind="speech", path=folder, max_batch=MAX_BATCH)
    settings = make_settings(
        root / "server",
        device="cpu",
        models=(spec,),
        health_interval=3600,
        max_body_bytes=256 * 2**20,
        max_batch_wait_ms=250,
        # a clip is one job, which shows no progress until all its windows are done:
        # two 10-minute files together outlast the 120 s default on this CPU
        run_timeout=3600,
    )
    rows: list[tuple[str, float, str]] = []
    alone_s: list[float] = []
    raw_s: list[float] = []
    with live_server(settings) as live:
        threads = torch.get_num_threads()  # the server's choice, kept for the pipeline too
        for _ in range(args.rounds):
            seconds, first = timed(lambda: transcribe(live.url, paths[0]))
            alone_s.append(seconds)
            seconds, text = timed(raw_run)
            raw_s.append(seconds)
        spread = f"rounds {min(alone_s):.1f}-{max(alone_s):.1f} s"
        rows.append(
            (
                f"vramgate, one file alone (best of {args.rounds})",
                min(alone_s) / audio_s,
                f"batch {first['batch']}, {spread}",  # type: ignore[index]
            )
        )
        both, answers = timed(lambda: at_once(lambda p: transcribe(live.url, p), paths))
        batches = ",".join(str(a["batch"]) for a in answers)  # type: ignore[union-attr]
        rows.append(("vramgate, two files at once", both / (2 * audio_s), f"batch {batches}"))
        serial, _ = timed(lambda: [transcribe(live.url, p) for p in paths])
        rows.append(("vramgate, two files one after the other", serial / (2 * audio_s), ""))
        same = answers[0]["text"] == first["text"]  # type: ignore[index]
        rows.append(("(two at once gave the alone text)", float(same), ""))
    note = f"torch threads {threads}, as the server's; rounds {min(raw_s):.1f}-{max(raw_s):.1f} s"
    rows.append(
        (f"transformers pipeline, one file (batch_size 8, best of {args.rounds})",
         min(raw_s) / audio_s, note)
    )  # fmt: skip
    rows.append(("(pipeline text equals vramgate's)", float(text == first["text"]), ""))  # type: ignore[index]
    return rows


def speak(url: str, text: str) -> tuple[float, str]:
    """Seconds of audio in vramgate's answer (pcm), and the rows that ran together."""
    with httpx.Client(base_url=url, timeout=600) as http:
        body = {"model": "tts", "input": text, "response_format": "pcm"}
        answer = http.post("/v1/audio/speech", json=body)
    answer.raise_for_status()
    return len(answer.content) / 2 / PCM_RATE, answer.headers["X-Vramgate-Batch"]


def direct_speech(folder: Path) -> object:
    """transformers' VitsModel called as its model card shows: one sentence a forward;
    seconds of audio back."""
    from transformers import VitsModel, VitsTokenizer

    model = VitsModel.from_pretrained(folder).eval()
    tokenizer = VitsTokenizer.from_pretrained(folder)

    def say(text: str) -> float:
        with torch.inference_mode():
            waveform = model(**tokenizer(text, return_tensors="pt")).waveform
        return waveform.shape[-1] / model.config.sampling_rate

    say(SENTENCES[0])  # warm
    return say


def measure_tts(root: Path, rounds: int) -> list[tuple[str, float, str]]:
    """One sentence called directly and through vramgate, in turns (`rounds` of each,
    the best kept); then the four sentences one after the other directly, and at once
    through vramgate."""
    folder = save_random_vits(root / "vits", mms_size=True)
    say = direct_speech(folder)
    spec = ModelSpec(name="tts", kind="speech_synthesis", path=folder, max_batch=4)
    settings = make_settings(
        root / "tts-server", device="cpu", models=(spec,), health_interval=3600
    )
    direct: list[tuple[float, float]] = []
    served: list[tuple[float, float]] = []
    with live_server(settings) as live:
        speak(live.url, SENTENCES[1])  # its own warm-up: the bucket measured once
        for _ in range(rounds):
            seconds, audio = timed(lambda: say(SENTENCES[0]))  # type: ignore[operator]
            direct.append((seconds / audio, audio))  # type: ignore[operator]
            seconds, (audio, batch) = timed(lambda: speak(live.url, SENTENCES[0]))  # type: ignore[misc]
            served.append((seconds / audio, audio))
        seconds, answers = timed(lambda: at_once(lambda t: speak(live.url, t), SENTENCES))
    total = sum(a for a, _ in answers)  # type: ignore[union-attr]
    batches = ",".join(b for _, b in answers)  # type: ignore[union-attr]
    together = ("vramgate, four at once", seconds / total, f"{total:.1f} s, batch {batches}")
    one_by_one, audios = timed(lambda: [say(text) for text in SENTENCES])  # type: ignore[operator]
    total = sum(audios)  # type: ignore[arg-type]

    def best(runs: list[tuple[float, float]]) -> tuple[float, str]:
        factor, audio = min(runs)
        return factor, f"{audio:.1f} s; rounds {min(runs)[0]:.3f}-{max(runs)[0]:.3f}"

    factor, note = best(direct)
    rows = [(f"VitsModel called directly, one sentence (best of {rounds})", factor, note)]
    rows.append(
        ("VitsModel directly, four one after the other", one_by_one / total, f"{total:.1f} s")
    )
    factor, note = best(served)
    rows.append((f"vramgate, one sentence (best of {rounds})", factor, f"{note}, batch {batch}"))
    rows.append(together)
    return rows


def tts_table(rows: list[tuple[str, float, str]]) -> str:
    direct = rows[0][1]
    lines = [
        "Random VITS at MMS-TTS's size (36 M parameters), 16 kHz, max_batch 4, CPU, torch "
        f"threads {torch.get_num_threads()} (real-time factor: seconds to the answer / "
        "seconds of audio; lower is faster)",
        "",
        "| run | real-time factor | vs one sentence called directly | audio, note |",
        "|---|---:|---:|---|",
    ]
    for name, value, note in rows:
        lines.append(f"| {name} | {value:.3f} | {value / direct:.2f} | {note} |")
    return "\n".join(lines)


def table(rows: list[tuple[str, float, str]], args: argparse.Namespace) -> str:
    alone = rows[0][1]
    lines = [
        f"Random Whisper d_model {args.d_model}, {args.layers}+{args.layers} layers, "
        f"{args.minutes:g}-minute 16 kHz WAV, max_batch {MAX_BATCH}, CPU "
        "(real-time factor: processing s / audio s; lower is faster)",
        "",
        "| run | real-time factor | vs one file alone | note |",
        "|---|---:|---:|---|",
    ]
    for name, value, note in rows:
        if name.startswith("("):
            lines.append(f"| {name} | {'yes' if value else 'no'} | | |")
        else:
            lines.append(f"| {name} | {value:.4f} | {value / alone:.2f} | {note} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="turns of one file / sentence")
    parser.add_argument("--part", choices=("asr", "tts", "all"), default="all")
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.part in ("asr", "all"):
            text = table(measure(args, Path(scratch)), args)
            print(text)
            if args.write_readme:
                write_readme(text, "speech", "bench/speech.py --part asr")
        if args.part in ("tts", "all"):
            text = tts_table(measure_tts(Path(scratch), args.rounds))
            print(text)
            if args.write_readme:
                write_readme(text, "tts", "bench/speech.py --part tts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
