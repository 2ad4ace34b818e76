"""Speech-to-text benchmark on the CPU, side by side in one run:

    python bench/speech.py [--minutes 10] [--d-model 256] [--layers 4] [--write-readme]

(bench/README.md holds a run with --d-model 128.)

A random Whisper (mid-size by default: d_model 256, 4 encoder and 4 decoder layers, the
tiny test tokenizer, built here with save_pretrained) transcribes a 10-minute 16 kHz WAV
(a tone whose pitch changes each second): vramgate's /v1/audio/transcriptions with one
file alone, two files at once (their windows share generate calls), and the same two
one after the other; then transformers' own ASR pipeline on the same weights and file
(chunk_length_s=30, no stride, batch_size = max_batch) as the raw baseline. Real-time
factor = processing seconds / audio seconds (lower is faster). faster-whisper is not
compared: it runs CTranslate2 conversions of Whisper checkpoints, and these random
weights would first need `ct2-transformers-converter` (not installed here).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path

import httpx
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from app.config.settings import ModelSpec  # noqa: E402
from bench.run import write_readme  # noqa: E402
from tests.support.live import live_server, make_settings  # noqa: E402
from tests.support.random_whisper import save_random_whisper, tone, write_wav  # noqa: E402

MAX_BATCH = 8


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


def concurrently(url: str, paths: list[Path]) -> list[dict[str, object]]:
    results: list[dict[str, object]] = [{} for _ in paths]

    def one(index: int) -> None:
        results[index] = transcribe(url, paths[index])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(paths))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as reader:
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768


def pipeline_seconds(folder: Path, path: Path) -> tuple[float, str]:
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
    asr(read_wav(path)[: 5 * 16_000], return_timestamps=True, generate_kwargs=kwargs)  # warm
    seconds, out = timed(
        lambda: asr(read_wav(path), return_timestamps=True, generate_kwargs=kwargs)
    )
    return seconds, out["text"]  # type: ignore[index]


def measure(args: argparse.Namespace, root: Path) -> list[tuple[str, float, str]]:
    folder = save_random_whisper(root / "whisper", d_model=args.d_model, layers=args.layers)
    audio_s = args.minutes * 60
    paths = [write_wav(root / f"{i}.wav", tone(audio_s, seed=i)) for i in range(2)]
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
    with live_server(settings) as live:
        threads = torch.get_num_threads()  # the server's choice, kept for the pipeline too
        alone, first = timed(lambda: transcribe(live.url, paths[0]))
        rows.append(("vramgate, one file alone", alone / audio_s, f"batch {first['batch']}"))  # type: ignore[index]
        both, answers = timed(lambda: concurrently(live.url, paths))
        batches = ",".join(str(a["batch"]) for a in answers)  # type: ignore[union-attr]
        rows.append(("vramgate, two files at once", both / (2 * audio_s), f"batch {batches}"))
        serial, _ = timed(lambda: [transcribe(live.url, p) for p in paths])
        rows.append(("vramgate, two files one after the other", serial / (2 * audio_s), ""))
        same = answers[0]["text"] == first["text"]  # type: ignore[index]
        rows.append(("(two at once gave the alone text)", float(same), ""))
    raw, text = pipeline_seconds(folder, paths[0])
    note = f"torch threads {threads}, as the server's"
    rows.append(("transformers pipeline, one file (batch_size 8)", raw / audio_s, note))
    rows.append(("(pipeline text equals vramgate's)", float(text == first["text"]), ""))  # type: ignore[index]
    return rows


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
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        text = table(measure(args, Path(scratch)), args)
    print(text)
    if args.write_readme:
        write_readme(text, "speech", "bench/speech.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
