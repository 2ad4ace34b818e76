"""Smoke test of a built bundle: start `vramgate serve`, wait for /health, get a real
embedding from the embedded model, stop it cleanly. Standard library only, so CI on any
runner can run it right after the build.

    python packaging/smoke_test.py dist/vramgate [--timeout 300]

Prints one JSON line with the figures; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="GET" if data is None else "POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def smoke(bundle: Path, timeout: float) -> dict:
    exe = bundle / ("vramgate.exe" if sys.platform == "win32" else "vramgate")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    scratch = Path(tempfile.mkdtemp(prefix="vramgate-smoke-"))
    started = time.monotonic()
    output = (scratch / "output.txt").open("w")  # a file: an unread pipe could block it
    server = subprocess.Popen(
        [
            str(exe),
            "serve",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--data-dir",
            str(scratch / "data"),
            "--log-dir",
            str(scratch / "log"),
        ],
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    figures: dict = {"bundle": str(bundle)}
    try:
        while True:
            if server.poll() is not None:
                output.flush()
                log = (scratch / "output.txt").read_text(errors="replace")
                raise RuntimeError(f"the server exited with {server.returncode}:\n{log}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"not ready within {timeout:.0f}s")
            try:
                if call(url + "/health", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        figures["time_to_ready_s"] = round(time.monotonic() - started, 1)
        status, answer = call(
            url + "/v1/embeddings",
            {"model": "all-MiniLM-L6-v2", "input": ["The bundle runs without Python."]},
        )
        if status != 200:
            raise RuntimeError(f"embedding request failed with {status}: {answer}")
        figures["embedding_dims"] = len(answer["data"][0]["embedding"])
        if figures["embedding_dims"] != 384:
            raise RuntimeError(f"expected 384 dimensions, got {figures['embedding_dims']}")
        call(url + "/admin/shutdown", {})
        try:
            figures["exit_code"] = server.wait(60)
        except subprocess.TimeoutExpired:
            raise RuntimeError("the server did not stop within 60s of /admin/shutdown") from None
        if figures["exit_code"] != 0:
            raise RuntimeError(f"the server stopped with exit code {figures['exit_code']}")
        return figures
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        output.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    try:
        figures = smoke(args.bundle, args.timeout)
    except RuntimeError as error:
        print(f"smoke test FAILED: {error}", file=sys.stderr)
        return 1
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
