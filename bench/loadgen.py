"""A cheap closed-loop load generator: N clients, each with one keep-alive HTTP/1.1
connection, sending the next request as soon as the last answer arrives.

httpx costs about 1.7-5 ms of client CPU per request on these machines and becomes the
bottleneck below 200 requests/s; this client costs about 0.25 ms.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    clients: int
    seconds: float
    ok: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _request(host: str, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


async def _client(
    host: str, port: int, payload: bytes, stop: float, measure_from: float, result: LoadResult
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop:
            sent = time.perf_counter()
            writer.write(payload)
            status = await _read_response(reader)
            done = time.perf_counter()
            if sent < measure_from:
                continue  # warm-up
            if status == 200:
                result.ok += 1
                result.latencies.append(done - sent)
            else:
                result.errors += 1
    finally:
        writer.close()


async def run_load(
    url: str,
    path: str,
    body: dict,
    *,
    clients: int,
    warmup_s: float = 3.0,
    seconds: float = 20.0,
) -> LoadResult:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    payload = _request(host, path, json.dumps(body).encode())
    started = time.perf_counter()
    measure_from = started + warmup_s
    stop = measure_from + seconds
    result = LoadResult(clients, seconds)
    cpu_before = time.process_time()
    await asyncio.gather(
        *(_client(host, int(port), payload, stop, measure_from, result) for _ in range(clients))
    )
    result.client_cpu_s = time.process_time() - cpu_before
    return result


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process (and its threads) has used so far."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
