"""A runner's silence is its own failure, never the server's, and a runner never
outlives its server: the real SmolLM2 GGUF in a real runner process, the server live on
loopback (in this process, or as a child for the kill).

Each would fail on the code before: a prefill sends no tokens, so the watchdog took the
blocked stream for a wedged thread and ended the whole server (exit 76) after
2 x `run_timeout`; a SIGSTOPped runner did the same, and a request arriving meanwhile
hung in `/tokenize`; a runner whose server was SIGKILLed during a prefill lived 24 s more
(its `del server` waited for the batch); a runner whose computation hung while its HTTP
threads answered /health was trusted for 10 x `run_timeout`; a runner still loading
outlived a SIGKILLed server by its whole load (its parent watch began after it)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from app.config.settings import ModelSpec
from tests.engines.llama_cpp.pools import long_story
from tests.support.live import ServerProcess, clean_env, sse_events, wait_until

pytestmark = pytest.mark.slow

# above a prefill batch's time (512 tokens: 1.6 s alone, 2-7 s on 2 shared cores): the
# watchdog's bound is one batch, no more; a whole prefill is many
RUN_TIMEOUT = 10.0
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 780  # ~7,800 tokens


def model_row(live) -> dict:
    return next(m for m in live.status()["models"] if m["name"] == "smol")


def spec(gguf: Path) -> ModelSpec:
    return ModelSpec(
        name="smol", kind="generation", path=gguf, context_length=8192, parallel=2, load="startup"
    )


def served_by_a_new_runner(live, body: dict, pid: int) -> None:
    """/status says why the runner `pid` was ended, and `body` (unstreamed, 4 tokens) is
    answered by a runner loaded again."""
    wait_until(lambda: "did not move" in (model_row(live)["error"] or ""), 30, "said why")
    again = httpx.post(
        live.url + "/v1/chat/completions",
        json={**body, "stream": False, "max_tokens": 4},
        timeout=120,
    )
    assert again.status_code == 200, again.text
    assert model_row(live)["runner_pid"] not in (None, pid)


def test_a_prefill_longer_than_twice_run_timeout_is_served(server_factory, smollm2_gguf):
    live = server_factory(device="cpu", models=(spec(smollm2_gguf),), run_timeout=RUN_TIMEOUT)
    body = {"model": "smol", "prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0}
    started = time.monotonic()
    answer = httpx.post(live.url + "/v1/completions", json=body, timeout=600)
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] > 5000
    # the premise: the runner was silent of tokens past twice the watchdog's bound
    assert took > 2 * RUN_TIMEOUT, f"the prefill took {took:.1f}s: no test of the watchdog"
    assert live.service.state.phase == "ready" and live.service.scheduler.wedged == 0
    assert model_row(live)["runner_ended_because"] is None  # its runner was never taken as silent


def test_a_stopped_runner_is_ended_and_reloaded_while_the_server_lives(
    server_factory, smollm2_gguf
):
    """SIGSTOP the runner mid-stream: the stream ends with model_runner_stopped after
    `run_timeout`, a request that arrives meanwhile is refused (503) instead of hanging
    in `/tokenize`, /health answers live throughout (past 3 x `run_timeout`), /status
    says why, and the next request loads the model again and is answered."""
    live = server_factory(device="cpu", models=(spec(smollm2_gguf),), run_timeout=RUN_TIMEOUT)
    pid = model_row(live)["runner_pid"]
    body = long_story(2000)
    events: list[dict] = []
    healths: list[int] = []
    stop_watching = threading.Event()

    def watch_health() -> None:
        while not stop_watching.is_set():
            healths.append(httpx.get(live.url + "/health", timeout=30).status_code)
            time.sleep(0.5)

    watcher = threading.Thread(target=watch_health)
    stopped_at = 0.0
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for event in sse_events(r):
            events.append(event)
            if len(events) == 3:
                os.kill(pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
                watcher.start()
                late = {**body, "stream": False, "max_tokens": 4}
                refused = httpx.post(live.url + "/v1/chat/completions", json=late, timeout=120)
    errors = [e["error"] for e in events if "error" in e]
    assert errors and errors[-1]["code"] == "model_runner_stopped", events[-2:]
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "model_runner_stopped"
    wait_until(lambda: time.monotonic() - stopped_at > 3 * RUN_TIMEOUT, 60, "3 x run_timeout")
    stop_watching.set()
    watcher.join()
    assert healths and all(code in (200, 503) for code in healths)  # it answered each time
    assert live.service.state.exit_code == 0 and live.service.scheduler.wedged == 0
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    served_by_a_new_runner(live, body, pid)


EMBED_RUN_TIMEOUT = 6.0
EMBED_INPUT = "The quick brown fox jumps over the lazy dog. " * 300  # ~3,000 tokens


def test_an_embedding_longer_than_run_timeout_is_served_and_a_stopped_one_is_not_waited_for(
    server_factory, smollm2_gguf
):
    """An embedding is one decode with no progress events: past `run_timeout` the runner
    is asked for its /health and waited for while it answers (before, the call's timeout
    took it for silent and ended it: 503 after `run_timeout`). A SIGSTOPped runner does
    not answer, so the next embedding is refused after about `run_timeout`, not waited
    for as long as its tokens would allow."""
    embedder = ModelSpec(
        name="smol",
        kind="embedding",
        path=smollm2_gguf,
        context_length=4096,
        parallel=1,
        load="startup",
    )
    live = server_factory(device="cpu", models=(embedder,), run_timeout=EMBED_RUN_TIMEOUT)
    body = {"model": "smol", "input": EMBED_INPUT}
    started = time.monotonic()
    answer = httpx.post(live.url + "/v1/embeddings", json=body, timeout=300)
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] > 2500
    assert took > EMBED_RUN_TIMEOUT, f"it took {took:.1f}s: no test of the bound"
    pid = model_row(live)["runner_pid"]
    assert model_row(live)["runner_ended_because"] is None
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    refused = httpx.post(live.url + "/v1/embeddings", json=body, timeout=300)
    took = time.monotonic() - started
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "model_runner_stopped"
    assert took < 4 * EMBED_RUN_TIMEOUT, f"a stopped runner was waited for {took:.1f}s"
    assert httpx.get(live.url + "/health", timeout=30).status_code in (200, 503)
    assert live.service.scheduler.wedged == 0


def test_sigkill_of_the_server_during_a_prefill_leaves_no_runner(tmp_path, smollm2_gguf):
    config = tmp_path / "c.toml"
    config.write_text(
        'device = "cpu"\n[[models]]\nname = "smol"\nkind = "generation"\n'
        f'path = "{smollm2_gguf.as_posix()}"\ncontext_length = 8192\nload = "startup"\n'
    )
    argv = [sys.executable, "-m", "app", "serve", "--config", str(config)]
    argv += ["--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l")]
    server = ServerProcess(argv, clean_env())
    try:
        server.wait_ready(180)
        status = httpx.get(server.url + "/status", timeout=30).json()
        pid = next(m for m in status["models"] if m["name"] == "smol")["runner_pid"]
        runner = psutil.Process(pid)
        body = {"model": "smol", "prompt": LONG_PROMPT, "max_tokens": 4}

        def ask() -> None:
            with contextlib.suppress(httpx.TransportError):  # its server is killed under it
                httpx.post(server.url + "/v1/completions", json=body, timeout=120)

        threading.Thread(target=ask, daemon=True).start()
        wait_until(lambda: runner.cpu_percent(0.2) > 50, 60, "the runner prefilling")
        server.process.kill()
        server.process.wait(10)
        killed = time.monotonic()
        wait_until(lambda: not runner.is_running() or runner.status() == "zombie", 2.0, "gone")
        assert time.monotonic() - killed <= 2.0
    finally:
        server.stop(signal.SIGKILL)


# ptrace(2)'s requests (linux/ptrace.h): a seized thread stops alone on PTRACE_INTERRUPT,
# the process's other threads (llama.cpp's HTTP threads) run on
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
WALL = 0x40000000  # waitpid's __WALL: a thread's notices too (linux/wait.h)
HUNG_RUN_TIMEOUT = 5.0


def busiest_thread(pid: int) -> int:
    """The runner's thread that computes most over half a second (its loop, or a ggml
    worker the loop waits for at each step)."""

    def times() -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}

    before = times()
    time.sleep(0.5)
    after = times()
    return max(after, key=lambda tid: after[tid] - before.get(tid, 0.0))


def let_go_of(tid: int) -> None:
    """Take the seized thread's notices (its stop, then its end with the runner), as a
    tracer must: until it does, its process cannot be reaped by its parent."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            found, status = os.waitpid(tid, os.WNOHANG | WALL)
        except ChildProcessError:
            return
        if found and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
            return
        time.sleep(0.05)
    raise TimeoutError(f"thread {tid} never ended")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ptrace(2) is Linux's here")
def test_a_runner_whose_compute_hangs_while_its_http_threads_answer_is_replaced(
    server_factory, smollm2_gguf
):
    """One thread of the runner stopped mid-stream (ptrace), the rest running: its
    /health answers, its work does not move. The stream ends 503 model_runner_stopped
    within about 2 x run_timeout, and the next request is served by a new runner."""
    live = server_factory(device="cpu", models=(spec(smollm2_gguf),), run_timeout=HUNG_RUN_TIMEOUT)
    pid = model_row(live)["runner_pid"]
    client = live.service.registry.entries["smol"].handler._client
    body = long_story(2000)
    libc = ctypes.CDLL(None, use_errno=True)
    events: list[dict] = []
    hung_at = 0.0
    health = None
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for event in sse_events(r):
            events.append(event)
            if len(events) == 3:
                tid = busiest_thread(pid)
                assert libc.ptrace(PTRACE_SEIZE, tid, 0, 0) == 0, os.strerror(ctypes.get_errno())
                assert libc.ptrace(PTRACE_INTERRUPT, tid, 0, 0) == 0
                hung_at = time.monotonic()
                # the premise: its HTTP threads answer while its computation is still
                health = asyncio.run(client.call("GET", "/health"))
    ended_after = time.monotonic() - hung_at
    let_go_of(tid)
    assert health == {"status": "ok"}, health
    errors = [e["error"] for e in events if "error" in e]
    assert errors and errors[-1]["code"] == "model_runner_stopped", events[-2:]
    assert ended_after <= 2 * HUNG_RUN_TIMEOUT + 2, f"ended {ended_after:.1f}s after the hang"
    served_by_a_new_runner(live, body, pid)


def test_sigkill_of_the_server_during_a_slow_runner_load_leaves_no_runner(tmp_path, smollm2_gguf):
    """A pool of 131,072 cells (16 x 8,192) takes the runner 8-9 s to load here: the
    server killed a moment into it, the runner is gone within 2 s (before, it lived to
    the end of its load, whose parent watch only then began)."""
    config = tmp_path / "c.toml"
    config.write_text(
        'device = "cpu"\n[[models]]\nname = "smol"\nkind = "generation"\n'
        f'path = "{smollm2_gguf.as_posix()}"\ncontext_length = 8192\nparallel = 16\n'
        'load = "startup"\n'
    )
    logs = tmp_path / "l"
    argv = [sys.executable, "-m", "app", "serve", "--config", str(config)]
    argv += ["--data-dir", str(tmp_path / "d"), "--log-dir", str(logs)]
    server = ServerProcess(argv, clean_env())
    try:
        parent = psutil.Process(server.process.pid)
        found: list[psutil.Process] = []

        def runner_started() -> bool:
            found[:] = [c for c in parent.children() if "runner_main" in " ".join(c.cmdline())]
            return bool(found)

        wait_until(runner_started, 180, "the runner started")
        runner = found[0]
        time.sleep(1.0)  # into its load: the import is behind it, the pool not yet made
        server.process.kill()
        server.process.wait(10)
        killed = time.monotonic()
        wait_until(lambda: not runner.is_running() or runner.status() == "zombie", 5, "gone")
        assert time.monotonic() - killed <= 2.0
        said = " ".join(p.read_text() for p in logs.rglob("*.log*") if p.is_file())
        assert "runner pid" not in said, "the load had ended: no test of a load"
    finally:
        server.stop(signal.SIGKILL)
