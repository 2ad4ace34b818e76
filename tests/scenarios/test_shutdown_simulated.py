"""Shutdown while jobs run and wait, on a real server process with the simulated device
and simulated model: the running job finishes, waiting ones get 503 `shutting_down`, a
running stream ends, and the process exits 0 within its bound."""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import httpx
import pytest

from tests.support.live import ServerProcess, clean_env

CONFIG = (
    'device = "simulated:1GiB"\nmax_concurrent = 1\nmax_streams = 1\nhealth_interval = 3600\n'
    '[[models]]\nname = "sim"\nkind = "simulated"\nmax_batch = 1\n'
    'buckets = [{size = 64, bytes = "400MiB", run_ms = 1500}]\n'
)


@pytest.mark.slow
def test_simulated_sigint_with_running_waiting_and_streaming_work(tmp_path):
    (tmp_path / "c.toml").write_text(CONFIG)
    server = ServerProcess(
        [sys.executable, "-m", "app", "serve", "--config", str(tmp_path / "c.toml"),
         "--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l")],
        clean_env(),
    )  # fmt: skip
    server.wait_ready(120)

    async def scenario() -> tuple[list[httpx.Response], str, float]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            stream_body = {
                "model": "sim",
                "messages": [{"role": "user", "content": "go"}],
                "max_tokens": 40,  # 40 steps of 1.5 s: far longer than the drain bound
                "stream": True,
            }

            async def stream() -> str:
                async with client.stream("POST", "/v1/chat/completions", json=stream_body) as r:
                    return "".join([line async for line in r.aiter_lines()])

            streaming = asyncio.create_task(stream())
            await asyncio.sleep(0.3)
            body = {"model": "sim", "input": "x"}
            posts = [asyncio.create_task(client.post("/v1/embeddings", json=body))]
            await asyncio.sleep(0.3)  # the one job slot is now busy: these wait
            posts += [
                asyncio.create_task(client.post("/v1/embeddings", json=body)) for _ in range(3)
            ]
            await asyncio.sleep(0.3)
            started = time.monotonic()
            server.process.send_signal(signal.SIGINT)
            responses = await asyncio.gather(*posts)
            text = await streaming
            return responses, text, started

    responses, text, started = asyncio.run(scenario())
    code = server.process.wait(60)
    elapsed = time.monotonic() - started
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 503, 503, 503], [r.text for r in responses]
    for refused in (r for r in responses if r.status_code == 503):
        assert refused.json()["error"]["code"] == "shutting_down"
        assert int(refused.headers["Retry-After"]) >= 1
    # The stream outlived the drain bound: it was stopped and says so before [DONE].
    assert text.endswith("data: [DONE]") and '"code":"shutting_down"' in text, text[-300:]

    assert code == 0 and elapsed < 30, (code, elapsed)
