"""The torch engine's generation handler through a real server: what it tells the gate."""

from __future__ import annotations

import threading

import httpx
import pytest

from app.config.settings import ModelSpec
from tests.support.random_models import save_random_llama

pytestmark = pytest.mark.slow


def test_a_sliding_window_model_runs_one_stream_at_a_time_and_the_others_wait_queued(
    server_factory, tmp_path
):
    """A Mistral-v0.1-style model (sliding-window KV cache): rows cannot join its running
    batch. Three chats at once, each longer than `run_timeout`: one runs, the others wait
    in the queue (whose deadline is the queue's) and all three are answered; none waits
    on the device showing no progress until the watchdog's 504."""
    folder = save_random_llama(tmp_path / "mistral", context=1024, sliding_window=64)
    spec = ModelSpec(name="sw", kind="generation", path=folder)
    live = server_factory(models=(spec,), run_timeout=0.5, health_interval=3600)
    handler = live.service.registry.entries["sw"].handler
    assert handler.cell_capacity == 1
    answers: list[tuple[int, str]] = []
    most_running = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            most_running[0] = max(most_running[0], live.service.scheduler.running_for("sw"))
            done.wait(0.01)

    def chat(i: int) -> None:
        body = {
            "model": "sw",
            "messages": [{"role": "user", "content": f"Tell a long story {i}."}],
            "max_tokens": 300,
            "temperature": 0,
        }
        r = httpx.post(live.url + "/v1/chat/completions", json=body, timeout=120)
        answers.append((r.status_code, r.text[:200]))

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=chat, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    done.set()
    watcher.join()
    assert [status for status, _ in answers] == [200, 200, 200], answers
    assert most_running[0] == 1
    assert live.fatal_calls == []
