"""A machine lost from a Ray cluster loses no request. Three raylets on this machine
(Ray's cluster utilities: a head with no CPU and two one-CPU workers, so each worker
holds one replica), `vramgate cluster serve --address` as a person runs it against that
cluster, simulated devices and models (config choices), real HTTP through the ingress.
In the middle of a flood, with streams running, the worker holding one replica leaves
the cluster (`Cluster.remove_node`: its raylet and every process on it end): every
request is answered 200 (or 503 with `Retry-After` and a stable code), the other replica
serves the rest, and a stream the lost replica was answering ends with an error event.

The worker removed is the ingress's where a worker holds it: before the ingress was
pinned to the head, Ray placed it on any of the three machines, and when its machine
left, Ray Serve's proxy answered each request it held with a bare 500. Each round
deploys afresh (Ray places the ingress anew), so that the code before fails in some
round almost always."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import httpx
import orjson
import psutil
import pytest

from tests.support.live import clean_env, free_port, wait_until

pytest.importorskip("ray.serve", reason="the cluster extra (Linux only)")
import ray  # after the skip: Ray is an extra
from ray import serve
from ray._private.node import Node
from ray.cluster_utils import Cluster

pytestmark = pytest.mark.slow

ROUNDS = 3
FLOOD = 500  # requests from CLIENTS clients in each round
CLIENTS = 32
REMOVE_AFTER = 120  # answers before the worker leaves
STREAM_TOKENS = 1600  # 5 ms a step (8 s): each stream outlasts the flood's first answers
# Ray Serve gives a starting proxy 5 s to say it is ready, then kills it, and
# `serve.start` fails (ray/serve/_private/constants.py, PROXY_READY_CHECK_TIMEOUT_S): a
# CI run beside the other worker's tests saw "Proxy actor reported not ready" in its third
# round. The machine's two cores are shared by three raylets and the test.
SLOW_MACHINE = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}
STABLE_503 = {"device_failed", "queue_full", "shutting_down", "model_loading"}

CONFIG = """device = "simulated:2GiB"
data_dir = "{tmp}/data"
log_dir = "{tmp}/log"

[[models]]
name = "sim"
kind = "simulated"
buckets = [{{size = 16, bytes = "200MiB", run_ms = 30}}]

[[models]]
name = "chat"
kind = "simulated"
load = "startup"
buckets = [{{size = 2048, bytes = "100MiB", run_ms = 20}}]
generation = {{ kv_bytes_per_token = "64KiB", fixed_bytes = "16MiB", step_ms = 5 }}
"""


@contextlib.contextmanager
def ray_cluster() -> Iterator[Cluster]:
    """A head (no CPU: no replica goes there) and two one-CPU workers; shut down at the
    end, and none of its processes left (its raylets, their workers, its GCS). Its
    processes take SLOW_MACHINE from the environment they start in."""
    with mock.patch.dict(os.environ, SLOW_MACHINE):
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    started: set[psutil.Process] = set()
    try:
        for _ in range(2):
            with mock.patch.dict(os.environ, SLOW_MACHINE):
                cluster.add_node(num_cpus=1)
        yield cluster
    finally:
        for node in [cluster.head_node, *cluster.worker_nodes]:
            started |= _processes_of(node)
        cluster.shutdown()
    left = lambda: [p.pid for p in started if p.is_running() and p.status() != "zombie"]  # noqa: E731
    wait_until(lambda: not left(), 30, "the cluster's processes ended")


def _processes_of(node: Node | None) -> set[psutil.Process]:
    """A node's processes: Ray's own (raylet, GCS...) and the workers its raylet began."""
    found: set[psutil.Process] = set()
    for infos in node.all_processes.values() if node else ():
        for info in infos:
            with contextlib.suppress(psutil.Error):
                found.add(psutil.Process(info.process.pid))
                found.update(psutil.Process(info.process.pid).children(recursive=True))
    return found


@contextlib.contextmanager
def serving(cluster: Cluster, config: Path, port: int, log: Path) -> Iterator[str]:
    """`vramgate cluster serve --address` on the cluster, two replicas of one CPU each;
    stopped with Ctrl+C (the application is deleted, the cluster stays)."""
    argv = [sys.executable, "-m", "app", "cluster", "serve", "--config", str(config)]
    argv += ["--address", cluster.address, "--replicas", "2", "--gpus-per-replica", "0"]
    argv += ["--cpus-per-replica", "1", "--port", str(port)]
    env = {k: v for k, v in clean_env().items() if not k.startswith("RAY_")} | SLOW_MACHINE
    with log.open("a") as out:
        child = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url) or child.poll() is not None, 240, "cluster")
        assert child.poll() is None, log.read_text()[-3000:]
        yield url
    finally:
        child.send_signal(signal.SIGINT)
        try:
            code = child.wait(90)
        except subprocess.TimeoutExpired:
            code = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        assert code == 0, log.read_text()[-3000:]


def _stop_serve(cluster: Cluster) -> None:
    """Ray Serve off the cluster (its proxy holds the port after the application went),
    so that the next `vramgate cluster serve` starts it again and Ray places the ingress
    anew."""
    ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def _ready(url: str) -> bool:
    try:
        rows = httpx.get(url + "/status", timeout=15).json().get("replicas", [])
    except (httpx.HTTPError, ValueError):
        return False
    return len(rows) == 2 and all(r["status"] and r["status"]["ready"] and "pid" in r for r in rows)


def _titles_on(node: Node) -> dict[int, str]:
    """The processes a node's raylet started (Ray's workers, each actor one), by pid,
    with the title Ray gives each (`ray::ServeReplica:vramgate:Ingress`...)."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    titles = {}
    for child in raylet.children():
        with contextlib.suppress(psutil.Error):
            titles[child.pid] = " ".join(child.cmdline())
    return titles


@dataclass
class Round:
    answered: list[tuple[float, int, str | None]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # what is neither 200 nor a stable 503
    streams: list[tuple[str | None, list[str], str | None]] = field(default_factory=list)
    removed_at: float = 0.0


async def _flood(client: httpx.AsyncClient, result: Round) -> None:
    pending = list(range(FLOOD))

    async def one_client() -> None:
        while pending:
            pending.pop()
            try:
                reply = await client.post("/v1/embeddings", json={"model": "sim", "input": "w w"})
            except httpx.HTTPError as exc:  # a lost request
                result.answered.append((time.monotonic(), 0, None))
                result.refused.append(f"no answer: {exc!r}")
                continue
            replica = reply.headers.get("x-vramgate-replica")
            result.answered.append((time.monotonic(), reply.status_code, replica))
            if reply.status_code == 200:
                continue
            code = _code(reply.content)
            if reply.status_code != 503 or "retry-after" not in reply.headers or code is None:
                result.refused.append(f"{reply.status_code} {reply.text[:300]}")

    await asyncio.gather(*(one_client() for _ in range(CLIENTS)))


def _code(body: bytes) -> str | None:
    try:
        code = orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return code if code in STABLE_503 else None


async def _stream(
    client: httpx.AsyncClient, began: asyncio.Future[str | None]
) -> tuple[str | None, list[str], str | None]:
    """A chat stream: the replica answering it, its lines, and how the reading ended
    (None: the body ended as HTTP ends a body)."""
    ask = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    ask |= {"max_tokens": STREAM_TOKENS, "stream": True}
    lines: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=ask) as reply:
        replica = reply.headers.get("x-vramgate-replica")
        began.set_result(replica)
        try:
            async for line in reply.aiter_lines():
                if line:
                    lines.append(line)
        except httpx.HTTPError as exc:  # the connection closed before the body's end
            return replica, lines, repr(exc)
    return replica, lines, None


async def _round(url: str, cluster: Cluster, victim: Node, lost_replica: str) -> Round:
    """Streams until one is on `lost_replica`, then the flood; the victim leaves after
    REMOVE_AFTER answers."""
    result = Round()
    limits = httpx.Limits(max_connections=CLIENTS + 8, keepalive_expiry=2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        streams = []
        for _ in range(8):
            began: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            streams.append(asyncio.create_task(_stream(client, began)))
            if await began == lost_replica:
                break
        flood = asyncio.create_task(_flood(client, result))
        while len(result.answered) < REMOVE_AFTER and not flood.done():
            await asyncio.sleep(0.01)
        result.removed_at = time.monotonic()
        await asyncio.to_thread(cluster.remove_node, victim)
        await flood
        result.streams = list(await asyncio.gather(*streams))
    return result


def _victim(cluster: Cluster, replicas: dict[int, str]) -> tuple[Node, str, Node | None]:
    """The worker to remove (the ingress's, where a worker holds it), the replica on it,
    and the node the ingress runs on."""
    nodes = [cluster.head_node, *cluster.worker_nodes]
    titles = {id(node): _titles_on(node) for node in nodes}
    ingress = next((n for n in nodes if any(":Ingress" in t for t in titles[id(n)].values())), None)
    holding = {
        id(n): replica
        for n in cluster.worker_nodes
        for pid, replica in replicas.items()
        if pid in titles[id(n)]
    }
    assert len(holding) == 2, f"a replica on each worker: {holding}, {replicas}"
    victim = ingress if ingress in cluster.worker_nodes else next(iter(cluster.worker_nodes))
    assert victim is not None
    return victim, holding[id(victim)], ingress


# 110 s alone here; a CI run beside the other worker's tests passed the suite's 300 s in
# its second round's deploy (Ray Serve had only begun adding replicas)
@pytest.mark.timeout(900)
def test_a_worker_lost_in_a_flood_loses_no_request(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(tmp=tmp_path))
    log = tmp_path / "cluster.log"
    with ray_cluster() as cluster:
        for index in range(ROUNDS):
            if index:
                cluster.add_node(num_cpus=1)  # where the lost replica's successor goes
                _stop_serve(cluster)
            with serving(cluster, config, free_port(), log) as url:
                rows = httpx.get(url + "/status", timeout=30).json()["replicas"]
                replicas = {r["pid"]: r["replica"] for r in rows}
                victim, lost, ingress = _victim(cluster, replicas)
                (other,) = set(replicas.values()) - {lost}
                result = asyncio.run(_round(url, cluster, victim, lost))

                codes = Counter(code for _, code, _ in result.answered)
                after = Counter(r for at, _, r in result.answered if at > result.removed_at + 1)
                on = "the head" if ingress is cluster.head_node else "a worker"
                print(f"\nround {index + 1}: ingress on {on}; {lost} lost after {REMOVE_AFTER}")
                print(f"answers: {dict(codes)}; by replica a second after: {dict(after)}")
                refused, lost_requests = result.refused[:5], FLOOD - len(result.answered)
                assert not refused, f"{dict(codes)}: {refused}"
                assert not lost_requests
                assert lost not in after and after[other] > 0  # the live replica served

                # the streams: the lost replica's ends with an error event, the rest whole
                ended = Counter()
                for replica, lines, failure in result.streams:
                    assert failure is None, f"{replica}: {failure} after {len(lines)} lines"
                    assert lines[-1] == "data: [DONE]"
                    last = orjson.loads(lines[-2].removeprefix("data: "))
                    if replica == lost:
                        assert last["error"]["code"] == "device_failed", last
                        ended["error event"] += 1
                    else:
                        assert last["choices"][0]["finish_reason"] == "length", last
                        ended["whole"] += 1
                print(f"streams: {dict(ended)}")
                assert ended["error event"] == 1

                # the ingress runs beside the proxy, on the head: no worker takes it along
                assert ingress is cluster.head_node
