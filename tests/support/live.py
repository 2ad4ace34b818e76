"""A real server on loopback for tests: uvicorn in a thread, real HTTP, the real app."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from app.api.app import create_app
from app.config.settings import Settings, load_settings
from app.core.fleet.fleet import Fleet
from app.core.service import InferenceService
from app.devices.base import Device
from tests.support import apps


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings isolated in `tmp_path` (no user config file, own data and log dirs)."""
    # models stay loaded however long a test module idles (keep-alive has tests of its own)
    base = {"data_dir": tmp_path / "data", "log_dir": tmp_path / "log", "port": 0, "keep_alive": -1}
    return load_settings({**base, **overrides}, tmp_path / "no-config.toml")


@dataclass
class Live:
    url: str
    app: FastAPI
    server: uvicorn.Server
    fatal_calls: list[float] = field(default_factory=list)

    @property
    def fleet(self) -> Fleet:
        return self.app.state.fleet

    @property
    def service(self) -> InferenceService:
        """The first device's service (the only one, unless the test asks for several)."""
        return self.fleet.lanes[0]

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)

    def status(self) -> dict[str, Any]:
        return httpx.get(self.url + "/status", timeout=30).json()


def wait_until(predicate: Any, timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} not reached within {timeout}s")


@contextlib.contextmanager
def live_server(
    settings: Settings,
    *,
    device: Device | None = None,
    ready: bool = True,
    hot_routes: bool = True,
    models_source: Any = None,
    front: Any = None,
) -> Iterator[Live]:
    """vramgate's app served by uvicorn on a free loopback port in a thread (`front`, an
    ASGI app wrapping it, served in its place where given: RequestBodies)."""

    fatal_calls: list[float] = []
    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(
        settings,
        device=device,
        on_fatal=lambda: fatal_calls.append(time.time()),
        on_shutdown_request=stop,
        hot_routes=hot_routes,
        models_source=models_source,
    )

    config = uvicorn.Config(
        app if front is None else front(app),
        host="127.0.0.1",
        port=settings.port,
        log_config=None,
        access_log=False,
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="live-server", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 60, "server start")
        port = server.servers[0].sockets[0].getsockname()[1]
        live = Live(f"http://127.0.0.1:{port}", app, server, fatal_calls)
        if ready:
            wait_until(lambda: live.fleet.ready, 180, "readiness")
        yield live
    finally:
        server.should_exit = True
        thread.join(60)
        assert not thread.is_alive(), "the server did not stop"


class RequestBodies:
    """An ASGI app in front of vramgate's that keeps each HTTP request's path and body as
    they arrived, and the body of the answer sent back (live_server's `front`): what an
    app sent and what it received, read off the wire."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, bytes]] = []
        self.answered: list[tuple[str, bytes]] = []

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies of the requests to `path`, in order."""
        return [json.loads(body) for seen, body in self.seen if seen == path]

    def replies(self, path: str) -> list[bytes]:
        """The bodies of the answers to `path` (a stream's every byte), in the order they
        ended."""
        return [body for seen, body in self.answered if seen == path]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        sent: list[bytes] = []

        async def receiving() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self.seen.append((scope["path"], b"".join(chunks)))
            return message

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.body":
                sent.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self.answered.append((scope["path"], b"".join(sent)))
            await send(message)

        await self.app(scope, receiving, sending)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env() -> dict[str, str]:
    """The environment without VRAMGATE_* settings, so tests set everything themselves."""
    return {k: v for k, v in os.environ.items() if not k.startswith("VRAMGATE_")}


class ServerProcess:
    """`vramgate serve` as a real child process on a free loopback port."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [*argv, "--port", str(self.port)],
            env=env or clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.process.stdout.read()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError("server not ready")

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(30)


def npm_binary(where: Path, package: str, command: str) -> Path:
    """`package` installed with npm (a coding agent's CLI), and the path of its
    `command`; where npm or the package cannot be had, the test fails in CI and skips
    elsewhere (`_install`). Kept as `pip_binary` keeps its environments."""
    folder = _kept(command) or where
    binary = apps.npm_command(folder, command)
    _install(folder, binary, lambda: apps.install_npm(folder, package, command))
    return binary


def pip_binary(where: Path, requirements: list[str], command: str) -> Path:
    """`requirements` installed with pip into a virtual environment of their own under
    `where` (an app whose pinned dependencies would clash with vramgate's: Open WebUI),
    and the path of its `command`; where they cannot be had, the test fails in CI and
    skips elsewhere (`_install`). Where
    VRAMGATE_TEST_VENVS names a folder, the environment is kept there under `command`'s
    name and reused, so that running the test again does not install it again (and
    `python -m tests.support.apps` can install it ahead, even while the tests run)."""
    venv = _kept(command) or where / "venv"
    binary = apps.pip_command(venv, command)
    _install(venv, binary, lambda: apps.install_pip(venv, requirements, command))
    return binary


def _kept(command: str) -> Path | None:
    kept = os.environ.get("VRAMGATE_TEST_VENVS")
    return Path(kept) / command if kept else None


def _install(folder: Path, binary: Path, install: Any, wait_s: float = 1800) -> None:
    """`binary`'s install in `folder`: taken where it is complete, waited for where
    another process is making it (`python -m tests.support.apps`), made here otherwise.
    Where it fails (its installer's timeout too), the test fails in CI, naming the app:
    a CI run that never ran an app must not end green; elsewhere (a developer's machine
    without network) it skips, saying why."""
    deadline = time.monotonic() + wait_s
    while not apps.installed(folder, binary):
        if apps.installing(folder) and time.monotonic() < deadline:
            time.sleep(1)
            continue
        failed = install()
        if failed == apps.BUSY:  # another process started it meanwhile
            continue
        if failed is not None:
            import pytest

            app = binary.stem  # the app's command: claude, codex, aider, llm, open-webui
            if in_ci():
                pytest.fail(f"{app} was not installed, in CI (CI={os.environ['CI']}): {failed}")
            pytest.skip(f"{app} was not installed (outside CI, so skipped): {failed}")


def in_ci() -> bool:
    """Whether CI runs the tests: CI set, as CI services and .ci/run set it."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """A streamed answer's server-sent events, as JSON, up to `[DONE]`."""
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])
