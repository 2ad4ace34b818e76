"""Smoke test of a built bundle, through its console executable `vramgate-cli`: `--help`
prints; the bundled pip runs; with `--gguf FILE`, `pull` keeps that GGUF in the models
folder; `serve` answers /health, gives a real embedding from the embedded model and (with
a GGUF) streams a chat from the pulled model through the engine it names (llama.cpp's,
in a runner process the bundle's executable starts; with `--gguf-refused`, where
llama.cpp's CUDA engine cannot load for want of the NVIDIA driver, the chat must be
refused saying so, the rest still served); with `--whisper FOLDER --audio FILE`,
`pull` takes that Whisper folder as a speech model and `serve` transcribes the file (PyAV
decoding it, transformers' Whisper running); with `--diffusion FOLDER`, a diffusers
folder is pulled and draws one 64x64 image; with `--vision FOLDER`, a vision-language
folder is pulled and answers a chat with an image in it; with `--tts FOLDER` (once or
more), a VITS or SpeechT5 folder is pulled as text to speech and speaks one sentence
(transformers' VITS, or SpeechT5 with its vocoder and SentencePiece tokenizer, running;
PyAV encoding); it stops cleanly. Standard library only, so CI on any runner can run it
right after the build.

    python packaging/smoke_test.py dist/vramgate [--gguf tiny.gguf [--gguf-refused]]
        [--whisper tiny-whisper --audio clip.flac] [--diffusion tiny-sd] [--vision tiny-vl]
        [--tts tiny-tts [--tts tiny-t5-tts]] [--timeout 300]

Prints one JSON line with the figures; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="GET" if data is None else "POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def wait_ready(server: subprocess.Popen, url: str, output: Path, timeout: float) -> float:
    """Seconds until /health answers 200; fails if the server exits or takes too long."""
    started = time.monotonic()
    while True:
        if server.poll() is not None:
            log = output.read_text(errors="replace")
            raise RuntimeError(f"the server exited with {server.returncode}:\n{log}")
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"not ready within {timeout:.0f}s")
        try:
            if call(url + "/health", timeout=2)[0] == 200:
                return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)


def embedding_dims(url: str) -> int:
    status, answer = call(
        url + "/v1/embeddings",
        {"model": "all-MiniLM-L6-v2", "input": ["The bundle runs without Python."]},
    )
    if status != 200:
        raise RuntimeError(f"embedding request failed with {status}: {answer}")
    dims = len(answer["data"][0]["embedding"])
    if dims != 384:
        raise RuntimeError(f"expected 384 dimensions, got {dims}")
    return dims


def engine_of(url: str, model: str) -> str:
    """The engine /status says serves `model`."""
    status, answer = call(url + "/status")
    if status != 200:
        raise RuntimeError(f"/status answered {status}")
    row = next((m for m in answer["models"] if m["name"] == model), None)
    if row is None:
        raise RuntimeError(f"/status lists no model {model!r}")
    return str(row.get("engine", "torch"))


def streamed_chat(url: str, model: str) -> int:
    """A streamed chat (server-sent events, as OpenAI's clients read them): its chunks."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks, done = 0, False
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks += 1
    if not done or chunks < 2:
        raise RuntimeError(f"the chat stream ended after {chunks} chunks without [DONE]")
    return chunks


def refused_chat(url: str, model: str, timeout: float = 120) -> str:
    """A chat with a GGUF model that the server refuses because llama.cpp's engine cannot
    load there (xllamacpp's CUDA build on a runner without the NVIDIA driver): 503 while
    it tries the load, then a 404 that says why. Its message."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, answer = call(url + "/v1/chat/completions", body, timeout=timeout)
        message = str((answer.get("error") or {}).get("message", ""))
        if status == 404 and "llama.cpp's engine (xllamacpp) cannot load here" in message:
            return message
        if status != 503:
            raise RuntimeError(f"the GGUF chat was not refused for its engine: {status} {answer}")
        time.sleep(0.5)
    raise RuntimeError(f"the GGUF model was neither served nor refused within {timeout:.0f}s")


def transcribe(url: str, model: str, audio: Path) -> dict:
    """verbose_json of `audio` through /v1/audio/transcriptions (a multipart upload)."""
    boundary = "vramgate-smoke-boundary"
    fields = [
        ('name="model"', model.encode()),
        ('name="response_format"', b"verbose_json"),
        (f'name="file"; filename="{audio.name}"', audio.read_bytes()),
    ]
    body = (
        b"".join(
            f"--{boundary}\r\nContent-Disposition: form-data; {head}\r\n\r\n".encode()
            + data
            + b"\r\n"
            for head, data in fields
        )
        + f"--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        url + "/v1/audio/transcriptions",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"transcription: {error.code} {error.read()[:2000]!r}") from None


def spoken_seconds(url: str, model: str) -> float:
    """The seconds of one sentence spoken through /v1/audio/speech, as OpenAI's `pcm`
    (24 kHz, 16-bit signed little-endian mono: two bytes a sample); silence fails."""
    body = json.dumps({"model": model, "input": "Hello from the bundle.", "voice": "alloy",
                       "response_format": "pcm"}).encode()  # fmt: skip
    request = urllib.request.Request(
        url + "/v1/audio/speech", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            pcm = response.read()
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"speech: {error.code} {error.read()[:2000]!r}") from None
    peak = max((abs(s) for (s,) in struct.iter_unpack("<h", pcm[: len(pcm) // 2 * 2])), default=0)
    if peak < 100:  # of 32,768: a random model's speech peaks near full scale
        raise RuntimeError(f"speech: {len(pcm)} bytes of silence (peak {peak})")
    return len(pcm) / 2 / 24_000


def image_bytes(url: str, model: str) -> int:
    """The size of one 64x64 PNG drawn in 2 steps through /v1/images/generations."""
    body = {"model": model, "prompt": "a red fox", "size": "64x64", "steps": 2}
    status, answer = call(url + "/v1/images/generations", {**body, "seed": 1}, timeout=600)
    if status != 200:
        raise RuntimeError(f"image generation: {status} {answer}")
    return len(base64.b64decode(answer["data"][0]["b64_json"]))


def png(width: int = 8, height: int = 8) -> bytes:
    """A small RGB gradient as a PNG, written with zlib (standard library only)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\x00" + b"".join(bytes((x * 30 % 256, y * 30 % 256, 128)) for x in range(width))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def chat_with_an_image(url: str, model: str) -> str:
    """A chat whose message holds a PNG (an OpenAI `image_url` data URL): its finish reason."""
    image = "data:image/png;base64," + base64.b64encode(png()).decode()
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": image}},
    ]
    # greedy: at OpenAI's default temperature of 1 a random model's end-of-text token,
    # one of ~400 near-equal choices, ended one CI run's four tokens early
    message = {"role": "user", "content": parts}
    body = {"model": model, "messages": [message], "max_tokens": 4, "temperature": 0}
    status, answer = call(url + "/v1/chat/completions", body, timeout=600)
    if status != 200:
        raise RuntimeError(f"chat with an image: {status} {answer}")
    return str(answer["choices"][0]["finish_reason"])


def pulled_kind(cli: Path, folder: Path, config: Path, models: Path) -> str:
    """`pull` of a local folder: the kind it said it took the folder for."""
    said = run_cli(cli, "pull", str(folder), "--config", str(config), "--models-dir", str(models))
    found = re.search(r"^pulled \S+ \((\w+)\)", said, re.MULTILINE)
    return found.group(1) if found else said[-300:]


def run_cli(cli: Path, *args: str, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(cli), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"vramgate-cli {' '.join(args)} exited {done.returncode}:\n"
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return done.stdout


def shut_down(server: subprocess.Popen, url: str) -> int:
    call(url + "/admin/shutdown", {})
    try:
        code = server.wait(60)
    except subprocess.TimeoutExpired:
        raise RuntimeError("the server did not stop within 60s of /admin/shutdown") from None
    if code != 0:
        raise RuntimeError(f"the server stopped with exit code {code}")
    return code


def smoke(
    bundle: Path,
    timeout: float,
    gguf: Path | None = None,
    speech: tuple[Path, Path] | None = None,
    diffusion: Path | None = None,
    vision: Path | None = None,
    tts: list[Path] | None = None,
    gguf_refused: bool = False,
) -> dict:
    suffix = ".exe" if sys.platform == "win32" else ""
    cli = bundle / f"vramgate-cli{suffix}"
    if not (bundle / f"vramgate{suffix}").is_file():
        raise RuntimeError(f"{bundle} has no windowed executable vramgate{suffix}")
    if "usage: vramgate" not in run_cli(cli, "--help"):
        raise RuntimeError("vramgate-cli --help printed no usage")
    pip_version = run_cli(cli, "_pip", "--version").strip()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    scratch = Path(tempfile.mkdtemp(prefix="vramgate-smoke-"))
    config = scratch / "config.toml"
    figures: dict = {"bundle": str(bundle), "pip": pip_version.split(" from ")[0]}
    if gguf is not None:
        started = time.monotonic()
        models = str(scratch / "models")
        run_cli(cli, "pull", str(gguf), "--config", str(config), "--models-dir", models)
        figures["gguf_pull_s"] = round(time.monotonic() - started, 1)
    models = scratch / "models"
    if speech is not None:
        figures["whisper_kind"] = pulled_kind(cli, speech[0], config, models)
    if diffusion is not None:
        figures["diffusion_kind"] = pulled_kind(cli, diffusion, config, models)
    if vision is not None:
        figures["vision_kind"] = pulled_kind(cli, vision, config, models)
    voices = tts or []
    if voices:
        figures["tts_kinds"] = {f.name: pulled_kind(cli, f, config, models) for f in voices}
    log = scratch / "output.txt"
    with log.open("w") as output:  # a file: an unread pipe could block the server
        server = subprocess.Popen(
            [
                str(cli), "serve", "--config", str(config), "--port", str(port),
                "--device", "cpu", "--data-dir", str(scratch / "data"),
                "--log-dir", str(scratch / "log"),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            figures["time_to_ready_s"] = round(wait_ready(server, url, log, timeout), 1)
            figures["embedding_dims"] = embedding_dims(url)
            if gguf is not None and gguf_refused:
                figures["gguf_refused"] = refused_chat(url, gguf.stem)
            elif gguf is not None:
                figures["chat_chunks"] = streamed_chat(url, gguf.stem)
                figures["gguf_engine"] = engine_of(url, gguf.stem)
            if speech is not None:
                answer = transcribe(url, speech[0].name, speech[1])
                figures["audio_duration_s"] = answer["duration"]
                figures["audio_segments"] = len(answer["segments"])
            if diffusion is not None:
                figures["image_bytes"] = image_bytes(url, diffusion.name)
            if vision is not None:
                figures["vision_finish"] = chat_with_an_image(url, vision.name)
            if voices:
                spoken = {f.name: round(spoken_seconds(url, f.name), 3) for f in voices}
                figures["speech_seconds"] = spoken
            figures["exit_code"] = shut_down(server, url)
            return figures
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--gguf", type=Path, default=None, help="a GGUF to pull and chat with")
    parser.add_argument("--whisper", type=Path, default=None, help="a Whisper folder to pull")
    parser.add_argument("--audio", type=Path, default=None, help="a file it transcribes")
    parser.add_argument("--diffusion", type=Path, default=None, help="a diffusers folder to pull")
    parser.add_argument("--vision", type=Path, default=None, help="a vision-language folder")
    parser.add_argument(
        "--tts", type=Path, action="append", help="a VITS or SpeechT5 folder to pull and hear"
    )
    parser.add_argument(
        "--gguf-refused",
        action="store_true",
        help="expect the GGUF model refused, saying why (a CUDA build without the driver)",
    )
    args = parser.parse_args(argv)
    if (args.whisper is None) != (args.audio is None):
        parser.error("--whisper and --audio go together")
    speech = None if args.whisper is None else (args.whisper, args.audio)
    try:
        figures = smoke(
            args.bundle,
            args.timeout,
            args.gguf,
            speech,
            args.diffusion,
            args.vision,
            args.tts,
            args.gguf_refused,
        )
    except RuntimeError as error:
        print(f"smoke test FAILED: {error}", file=sys.stderr)
        return 1
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
