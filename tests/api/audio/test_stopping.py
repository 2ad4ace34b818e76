"""A transcription stops when nobody is left to read it: within one window batch of its
client leaving, and at the end of the drain when the server is told to stop (SIGTERM),
on a tiny random Whisper served on the CPU. Before, every window of a long file ran
after its client had gone, and a stopping server computed on past its drain."""

from __future__ import annotations

import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config.settings import ModelSpec
from tests.support.live import Live, ServerProcess, live_server, make_settings, wait_until
from tests.support.random_whisper import save_random_whisper, tone, write_wav

BATCH = 2  # windows to a generate call: a 10-minute file is 10 calls


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Iterator[Live]:
    spec = ModelSpec(name="whisper", kind="speech", path=folder, max_batch=BATCH, load="startup")
    settings = make_settings(
        tmp_path_factory.mktemp("server"), device="cpu", models=(spec,), health_interval=3600,
        max_body_bytes=64 * 2**20, cpu_threads=1,
    )  # fmt: skip
    with live_server(settings) as server:
        yield server


def upload(url: str, wav: Path) -> httpx.Request:
    return httpx.Request(
        "POST",
        url + "/v1/audio/transcriptions",
        files={"file": ("clip.wav", wav.read_bytes())},
        data={"model": "whisper", "language": "en"},
    )


def send(conn: socket.socket, request: httpx.Request) -> None:
    """`request` written whole on a raw connection, whose answer nobody reads."""
    head = [f"{request.method} {request.url.raw_path.decode()} HTTP/1.1"]
    head += [f"{name}: {value}" for name, value in request.headers.items()]
    conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + request.read())


def sent_then_left(request: httpx.Request, until: Any) -> None:
    """A client that leaves before its answer: `request` sent, the connection closed
    once `until()` holds."""
    with socket.create_connection((request.url.host, request.url.port), timeout=60) as conn:
        send(conn, request)
        wait_until(until, 120, "the transcription running")


@pytest.mark.slow  # a 10-minute file's first window batch, and a 2-minute control: ~15 s
def test_a_transcription_stops_within_a_window_batch_of_its_client_leaving(live, tmp_path):
    handler = live.service.registry.get("whisper")
    before = handler.generate_calls
    wav = write_wav(tmp_path / "ten.wav", tone(600.0, seed=9))  # 20 windows, 10 calls
    sent_then_left(upload(live.url, wav), lambda: handler.generate_calls > before)
    left_at = handler.generate_calls - before
    wait_until(lambda: live.service.scheduler.gate.running == 0, 120, "the run ending")
    ran = handler.generate_calls - before
    assert ran <= left_at + 1 < 10, (left_at, ran)  # the batch under way, and no more
    # the control: a client that stays gets every window of its file, and nothing else
    short = write_wav(tmp_path / "two.wav", tone(120.0, seed=10))  # 4 windows, 2 calls
    with httpx.Client(timeout=300) as http:
        answer = http.send(upload(live.url, short))
    assert answer.status_code == 200, answer.text
    assert handler.generate_calls - before == ran + 2


CONFIG = """\
device = "cpu"
cpu_threads = 1
max_body_bytes = "64MiB"
[[models]]
name = "whisper"
kind = "speech"
path = "{path}"
max_batch = 1
load = "startup"
"""


@pytest.mark.slow  # a 20-minute file's first windows and the 10-second drain: ~30 s
def test_sigterm_ends_a_long_transcription_within_the_drain(folder, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(path=folder.as_posix()))
    server = ServerProcess([
        sys.executable, "-m", "app", "serve", "--config", str(config),
        "--data-dir", str(tmp_path / "data"), "--log-dir", str(tmp_path / "log"),
    ])  # fmt: skip
    try:
        server.wait_ready(120)
        wav = write_wav(tmp_path / "twenty.wav", tone(1200.0, seed=11))  # 40 windows, 40 calls

        def running() -> bool:
            return httpx.get(server.url + "/status", timeout=10).json()["queue"]["running"] > 0

        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as conn:
            send(conn, upload(server.url, wav))
            wait_until(running, 120, "the transcription running")
            time.sleep(2)  # a window or two in
            told = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            code = server.process.wait(120)
            took = time.monotonic() - told
    finally:
        server.stop()
    # the drain is 10 s; past it the job stops at its next window (each ~1 s here), where
    # its 40 windows alone took over a minute before
    assert code == 0 and took < 25, (code, took)
