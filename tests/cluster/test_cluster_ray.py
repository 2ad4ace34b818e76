"""vramgate on Ray Serve: `vramgate cluster serve` as a person runs it (a real child
process that starts a local Ray instance on this machine's CPUs), two replicas with a
simulated device each (config choices), real HTTP through the ingress, the official
openai client, and one replica killed in the middle of a flood."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pytest
from openai import OpenAI

from tests.support.live import clean_env, free_port, wait_until

pytest.importorskip("ray.serve", reason="the cluster extra (Linux only)")
pytestmark = pytest.mark.slow

CONFIG = """{settings}
device = "simulated:2GiB"
data_dir = "{tmp}/data"
log_dir = "{tmp}/log"

[[models]]
name = "sim"
kind = "simulated"
buckets = [{{size = 16, bytes = "200MiB", run_ms = {run_ms}}}]

[[models]]
name = "chat"
kind = "simulated"
load = "startup"
buckets = [{{size = 16, bytes = "100MiB", run_ms = 20}}]
generation = {{ kv_bytes_per_token = "64KiB", fixed_bytes = "16MiB", step_ms = 5 }}
"""


@contextlib.contextmanager
def cluster(
    tmp_path, replicas: int = 2, settings: str = "", run_ms: int = 30, headers: dict | None = None
):
    """`vramgate cluster serve` on a free port; stopped with Ctrl+C at the end, and
    nothing of it left running."""
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(tmp=tmp_path, settings=settings, run_ms=run_ms))
    port = free_port()
    argv = [sys.executable, "-m", "app", "cluster", "serve", "--config", str(config)]
    argv += ["--replicas", str(replicas), "--gpus-per-replica", "0", "--port", str(port)]
    env = {k: v for k, v in clean_env().items() if not k.startswith("RAY_")}
    log = (tmp_path / "cluster.log").open("w")
    child = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        ready = lambda: _ready(url, replicas, headers or {}) or child.poll() is not None  # noqa: E731
        wait_until(ready, 240, "cluster")
        assert child.poll() is None, (tmp_path / "cluster.log").read_text()[-3000:]
        yield url
    finally:
        child.send_signal(signal.SIGINT)
        try:
            code = child.wait(90)
        except subprocess.TimeoutExpired:
            code = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # whatever of it is left
        log.close()
        assert code == 0, (tmp_path / "cluster.log").read_text()[-3000:]


def _ready(url: str, replicas: int, headers: dict) -> bool:
    try:
        status = httpx.get(url + "/status", headers=headers, timeout=15).json()
    except (httpx.HTTPError, ValueError):
        return False
    rows = status.get("replicas", [])
    # each ready, and each one's routing figures (which carry its pid) reported once
    return len(rows) == replicas and all(
        r["status"] and r["status"]["ready"] and "pid" in r for r in rows
    )


async def flood(url: str, count: int, clients: int, answered: list) -> None:
    """`count` embeddings from `clients` clients; each answer (time, status, replica)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)
    # idle connections expire here before the server's keep-alive (5 s) closes them, so
    # no request goes out on a connection the server is closing
    limits = httpx.Limits(max_connections=clients, keepalive_expiry=2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one_client() -> None:
            while not queue.empty():
                queue.get_nowait()
                body = {"model": "sim", "input": "w w w"}
                reply = await client.post("/v1/embeddings", json=body)
                answered.append(
                    (time.monotonic(), reply.status_code, reply.headers.get("x-vramgate-replica"))
                )

        await asyncio.gather(*(one_client() for _ in range(clients)))


def serve_controllers_of(config: Path) -> list[psutil.Process]:
    """The Serve controllers of the Ray that `vramgate cluster serve --config CONFIG`
    started (descendants of it): another test's cluster may run beside it."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "ServeController" not in " ".join(process.info["cmdline"] or ()):
            continue
        with contextlib.suppress(psutil.Error):
            if any(str(config) in " ".join(a.cmdline()) for a in process.parents()):
                found.append(process)
    return found


def test_ray_cluster_of_two_simulated_replicas_answers_every_request_also_when_one_is_killed(
    tmp_path,
):
    with cluster(tmp_path) as url:
        replicas = {
            r["replica"]: r for r in httpx.get(url + "/status", timeout=30).json()["replicas"]
        }
        assert len(replicas) == 2
        assert all(r["status"]["device"]["kind"] == "simulated" for r in replicas.values())
        # the Ray it started gives Serve's proxy a minute to start (app.cluster.deploy)
        (controller,) = serve_controllers_of(tmp_path / "config.toml")
        assert controller.environ()["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "60"

        # the official client, unchanged, through the ingress: a stream, and an embedding
        client = OpenAI(base_url=url + "/v1", api_key="unused")
        chunks = list(
            client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=12,
                stream=True,
            )
        )
        assert len(chunks) > 3 and chunks[-1].choices[0].finish_reason in ("stop", "length")
        raw = client.embeddings.with_raw_response.create(model="sim", input=["a b"])
        assert raw.headers["x-vramgate-replica"] in replicas
        assert len(raw.parse().data) == 1

        answered: list = []
        asyncio.run(flood(url, 300, 32, answered))
        served = Counter(replica for _, _, replica in answered)
        print(f"\n300 requests from 32 clients through the ingress: by replica {dict(served)}")
        assert [code for _, code, _ in answered] == [200] * 300
        assert set(served) == set(replicas)  # both served

        # a replica dies in the middle of a flood: the rest are answered by the other
        answered = []
        victim = next(iter(replicas))

        async def flood_and_kill() -> float:
            run = asyncio.create_task(flood(url, 300, 32, answered))
            while len(answered) < 60:
                await asyncio.sleep(0.01)
            os.kill(replicas[victim]["pid"], signal.SIGKILL)
            killed_at = time.monotonic()
            await run
            return killed_at

        killed_at = asyncio.run(flood_and_kill())
        after = Counter(replica for at, _, replica in answered if at > killed_at + 1.0)
        print(f"with {victim} killed after 60 answers: by replica after the kill {dict(after)}")
        assert [code for _, code, _ in answered] == [200] * 300  # none lost
        assert victim not in after and sum(after.values()) > 0


def test_ray_cluster_a_replica_with_a_full_queue_hands_the_request_to_the_other(tmp_path):
    """Two replicas that each take one request and queue none (max_queue 0): of three
    clients, one is always refused by the replica it reaches. No refusal reaches a
    caller before both replicas were asked. Then a refusal the router cannot foresee
    (one replica paused, each in turn): every request is answered, by the other one,
    and those the router sent to the paused one first say they asked two."""
    with cluster(tmp_path, settings="max_queue = 0\nmax_concurrent = 1\n", run_ms=150) as url:
        answers: list[httpx.Response] = []

        async def three_clients() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:

                async def one() -> None:
                    for _ in range(10):
                        body = {"model": "sim", "input": "w"}
                        answers.append(await client.post("/v1/embeddings", json=body))

                await asyncio.gather(one(), one(), one())

        asyncio.run(three_clients())
        tries = Counter((r.status_code, r.headers["x-vramgate-tries"]) for r in answers)
        print(f"\n(status, replicas asked) under three clients: {dict(tries)}")
        refused = [r for r in answers if r.status_code != 200]
        assert all(r.status_code == 503 for r in refused)
        assert all(r.json()["error"]["code"] == "queue_full" for r in refused)
        assert all(
            r.headers["x-vramgate-tries"] == "2" and "retry-after" in r.headers for r in refused
        )

        # Whether a busy replica is asked first under a flood depends on how fresh the
        # router's counts are (a CI run saw none in 30); a paused one always refuses.
        replicas = [r["replica"] for r in httpx.get(url + "/status", timeout=30).json()["replicas"]]
        second_asked = Counter()
        for paused in replicas:
            other = next(r for r in replicas if r != paused)
            pause = httpx.post(f"{url}/replicas/{paused}/admin/pause", timeout=30)
            assert pause.status_code == 200 and pause.json() == {"paused": True}
            for _ in range(6):
                reply = httpx.post(
                    url + "/v1/embeddings", json={"model": "sim", "input": "w"}, timeout=60
                )
                assert reply.status_code == 200, reply.text
                assert reply.headers["x-vramgate-replica"] == other
                second_asked[reply.headers["x-vramgate-tries"]] += 1
            httpx.post(f"{url}/replicas/{paused}/admin/resume", timeout=30).raise_for_status()
        print(f"replicas asked with one paused: {dict(second_asked)}")
        assert set(second_asked) <= {"1", "2"}
        assert second_asked["2"] > 0  # the router chose the paused one first: it went on
