"""A server that stops ends what its models run: the torch model's batch thread and the
GGUF model's runner process are gone when the server is, even where the server ran
inside another program (here: this test's process), not only when that program exits."""

from __future__ import annotations

import threading

import psutil
from openai import OpenAI

from app.config.settings import ModelSpec
from tests.support.live import live_server, make_settings
from tests.support.random_models import save_random_llama


def runners() -> list[psutil.Process]:
    """This process's llama.cpp runners that have not ended (a zombie has ended)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and any(
                "runner_main" in part for part in child.cmdline()
            ):
                found.append(child)
        except psutil.Error:
            continue
    return found


def batch_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"vramgate-batch-{name}" and t.is_alive()]


def test_a_stopped_server_leaves_no_batch_thread_and_no_runner_behind(tmp_path, smollm2_gguf):
    tiny = save_random_llama(tmp_path / "tiny")
    models = (
        ModelSpec(name="tiny", kind="generation", path=tiny, load="startup"),
        ModelSpec(name="smol", kind="generation", path=smollm2_gguf, context_length=1024),
    )
    before = {p.pid for p in runners()}
    others = set(batch_threads("tiny"))  # another test's server may serve a "tiny" too
    with live_server(make_settings(tmp_path, device="cpu", models=models)) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        for model in ("tiny", "smol"):  # each serves: its thread and its runner run
            answer = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            assert answer.choices[0].finish_reason in ("stop", "length")
        (batching,) = set(batch_threads("tiny")) - others
        serving = [p for p in runners() if p.pid not in before]
        assert len(serving) == 1, serving
    assert not batching.is_alive()
    assert not serving[0].is_running() or serving[0].status() == psutil.STATUS_ZOMBIE
    assert [p for p in runners() if p.pid not in before] == []
