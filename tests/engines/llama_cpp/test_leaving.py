"""A client that leaves cuts nobody else short: the real SmolLM2 GGUF in a real runner,
a pool of 2,048 cells filled in actual use by four streams of 432-token prompts and
72-token answers (504 cells each, 512 admitted), a fifth waiting in vramgate's queue,
and one client leaving at a random point of its stream; several rounds in one run.

On the code before, the leaving stream's cells went back to the gate when our side
closed its connection, but llama.cpp's slot kept them until its HTTP thread noticed
(it polls the socket every second) and its loop next turned: the queued request was
admitted into them, its prompt found no room in the unified pool, and llama.cpp failed
every running request with "Context size has been exceeded." (2 of 3 rounds cut the
three streams that stayed short with an error event and refused the queued one, in the
issue's probe). The race is narrow: llama.cpp handles a cancel and a new task that
arrive between two batches in order, so it takes a cancel noticed just after a batch
began; here it showed on the code before only with the machine busy as a desktop is
(two busy processes beside the server: "failed to find free space in the KV cache"
for the queued request's prompt, in the first run of four rounds; none in three runs of four
on an idle machine)."""

from __future__ import annotations

import contextlib
import logging
import random
import subprocess
import sys
import threading

import openai
import pytest
from openai import OpenAI

from tests.engines.llama_cpp.pools import pool_of
from tests.support.live import live_server, make_settings, wait_until

pytestmark = pytest.mark.slow

CELLS = 2048  # the pool, on the defaults otherwise: 32 slots, a request may take it all
RUNNING = 4  # requests of 504 cells it admits at once
MAX_TOKENS = 72
ROUNDS = 3
# what llama.cpp's server logs when a batch finds no room in the pool, and the error it
# then gives every running task (both seen here from xllamacpp 2026.10.11549's runner)
OVERFLOW_WORDS = ("Context size has been exceeded", "failed to find free space")


class RunnerLog(logging.Handler):
    """The runner's own log lines (app.engines.llama_cpp.process logs each at DEBUG)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.overflows: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if any(word in line for word in OVERFLOW_WORDS):
            self.overflows.append(line)


@contextlib.contextmanager
def busy_machine(processes: int = 2, limit_s: float = 600.0):
    """Other programs computing beside the server (they end by themselves after
    `limit_s`, or when the block ends)."""
    spin = f"import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end: pass"
    others = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]
    try:
        yield
    finally:
        for other in others:
            other.kill()
            other.wait()


@pytest.fixture(scope="module")
def pool(smollm2_gguf, tmp_path_factory):
    spec = pool_of(smollm2_gguf, CELLS)
    tmp = tmp_path_factory.mktemp("leaving")
    settings = make_settings(tmp, device="cpu", models=(spec,), queue_timeout=600)
    runner_log = RunnerLog()
    logger = logging.getLogger("vramgate.runner")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(runner_log)
    try:
        with live_server(settings) as live:
            yield live, runner_log
    finally:
        logger.removeHandler(runner_log)
        logger.setLevel(level)


def prompt(n: int) -> str:
    """About 432 tokens of SmolLM2's, different from the first word on (no two streams
    share a cached prefix)."""
    return f"Story number {n}. " + "A cat walked along the old river and looked around. " * 39


@pytest.mark.timeout(900)  # 150-180 s here; CI's second worker shares the two cores
def test_a_client_leaving_mid_stream_cuts_nobody_short_and_the_queued_are_served(pool):
    live, runner_log = pool
    client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    measured = client.completions.create(model="smol", prompt=prompt(0), max_tokens=1)
    assert 410 <= measured.usage.prompt_tokens <= 440, measured.usage
    pid = next(m for m in live.status()["models"] if m["name"] == "smol")["runner_pid"]
    chance = random.Random(49)
    outcomes: list[tuple[int, str, int, str | None]] = []  # (round, who, tokens, error)
    lock = threading.Lock()

    def ask(n: int, who: str, leave_after: int | None) -> None:
        tokens, error, finish = 0, None, None
        try:
            stream = client.completions.create(
                model="smol",
                prompt=prompt(n),
                max_tokens=MAX_TOKENS,
                temperature=0.8,
                stream=True,
                stream_options={"include_usage": True},
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                elif chunk.choices and chunk.choices[0].text:
                    tokens += 1
                if leave_after is not None and tokens >= leave_after:
                    stream.close()  # the client leaves: Stop in a chat window
                    break
        except openai.APIError as exc:
            error = f"{type(exc).__name__}: {exc}"
        with lock:
            outcomes.append((n, who, tokens, error or finish))

    def play_round(round_: int) -> None:
        leave_after = chance.randint(40, 66)  # four streams and a prompt: past 2,048
        base = 10 * (round_ + 1)
        threads = [
            threading.Thread(
                target=ask, args=(base + i, "stays" if i else "leaves", None if i else leave_after)
            )
            for i in range(RUNNING)
        ]
        for thread in threads:
            thread.start()
        wait_until(lambda: live.service.scheduler.gate.running == RUNNING, 120, "four running")
        queued = threading.Thread(target=ask, args=(base + RUNNING, "queued", None))
        queued.start()
        wait_until(lambda: live.service.scheduler.gate.depth == 1, 60, "one queued")
        for thread in [*threads, queued]:
            thread.join(600)
        wait_until(lambda: live.service.scheduler.gate.running == 0, 60, "all done")

    with busy_machine():
        for round_ in range(ROUNDS):
            play_round(round_)

    stayed = [o for o in outcomes if o[1] != "leaves"]
    assert len(stayed) == ROUNDS * RUNNING
    cut = [o for o in stayed if o[3] not in ("length", "stop")]
    assert not cut, f"cut short or refused: {cut}"
    assert all(o[2] == MAX_TOKENS for o in stayed if o[3] == "length"), stayed
    assert not runner_log.overflows, runner_log.overflows[:4]
    row = next(m for m in live.status()["models"] if m["name"] == "smol")
    assert row["runner_pid"] == pid and row.get("runner_failures", 0) == 0
