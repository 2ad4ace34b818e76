"""A Hugging Face hub of our own on loopback (point `HF_ENDPOINT` at `Hub.url`): the routes
huggingface_hub calls to list a repo (`/api/models/ORG/NAME[/revision/REV]` with its
files' sizes, and its tree) and to fetch a file (`/ORG/NAME/resolve/REV/PATH`, HEAD and
GET, with HTTP Range: `bytes=N-` for the rest, `bytes=A-B` for a part, as a GGUF header is
read), and to search (`/api/models?search=`). It counts the bytes it sends per file and
keeps the Range headers it was sent; a file can be set to stall after N bytes (a pull
killed there resumes), to pause after N bytes until the test lets it go on, or to come
with more bytes than its listing says."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


class Hub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.sent: Counter[str] = Counter()  # "ORG/NAME/PATH": body bytes sent
        self.ranges: list[tuple[str, str]] = []  # (ORG/NAME/PATH, Range header)
        self.paths: list[str] = []  # every request's path
        self.stall: dict[str, int] = {}  # "ORG/NAME/PATH": bytes sent before it stalls
        # "ORG/NAME/PATH": bytes sent before it pauses, and what lets it go on
        self.paused: dict[str, tuple[int, threading.Event]] = {}
        self.oversend: dict[str, int] = {}  # "ORG/NAME/PATH": bytes sent past its end
        self._release = threading.Event()
        hub = self

        class Handler(HubHandler):
            pass

        Handler.hub = hub
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos[repo] = files

    def commit(self, repo: str) -> str:
        digest = hashlib.sha1()
        for path, content in sorted(self.repos[repo].items()):
            digest.update(path.encode() + hashlib.sha1(content).digest())
        return digest.hexdigest()

    def reset(self) -> None:
        self.sent.clear()
        self.ranges.clear()
        self.paths.clear()
        self.stall.clear()
        for _, go_on in self.paused.values():
            go_on.set()
        self.paused.clear()
        self.oversend.clear()

    def __enter__(self) -> Hub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()  # stalled answers end
        for _, go_on in self.paused.values():
            go_on.set()
        self.server.shutdown()
        self.server.server_close()


class HubHandler(http.server.BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _missing(self, what: str) -> None:
        self._json(404, {"error": f"{what} not found"}, {"X-Error-Code": "RepoNotFound"})

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.paths.append(path)
        if path == "/api/models":
            return self._search(parse_qs(urlsplit(self.path).query))
        api = re.match(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(?:/(.*))?)?$", path)
        if api is not None:
            repo, what = api[1], api[2]
            if repo not in self.hub.repos:
                return self._missing(f"Repository {repo}")
            files = self.hub.repos[repo]
            if what == "tree":
                return self._json(200, [
                    {"type": "file", "oid": hashlib.sha1(c).hexdigest(), "size": len(c), "path": p}
                    for p, c in sorted(files.items())
                ])  # fmt: skip
            siblings = [
                {"rfilename": p, "size": len(c), "blobId": hashlib.sha1(c).hexdigest()}
                for p, c in sorted(files.items())
            ]
            return self._json(200, {
                "id": repo, "modelId": repo, "sha": self.hub.commit(repo), "private": False,
                "tags": ["gguf"], "siblings": siblings,
            })  # fmt: skip
        resolve = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if resolve is None or resolve[1] not in self.hub.repos:
            return self._missing(path)
        repo, file = resolve[1], resolve[3]
        if file not in self.hub.repos[repo]:
            return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        self._file(repo, file, self.hub.repos[repo][file])

    do_HEAD = do_GET

    def _search(self, query: dict[str, list[str]]) -> None:
        """The Hub's model search (`list_models`): the repos whose name holds `search`
        (any case) and, where `filter=gguf`, hold a .gguf file; most downloaded first
        (`downloads`: its files' count here, so that the order is fixed), at most `limit`."""
        words = query.get("search", [""])[0].lower()
        gguf = "gguf" in query.get("filter", [])
        found = [
            {"id": repo, "modelId": repo, "downloads": len(files), "tags": ["gguf"] if gguf else []}
            for repo, files in sorted(self.hub.repos.items())
            if words in repo.lower() and (not gguf or any(p.endswith(".gguf") for p in files))
        ]
        found.sort(key=lambda model: -model["downloads"])
        limit = int(query.get("limit", ["1000"])[0])
        self._json(200, found[:limit])

    def _file(self, repo: str, file: str, content: bytes) -> None:
        key = f"{repo}/{file}"
        start, end = 0, len(content) - 1
        wanted = self.headers.get("Range")
        if wanted is not None:
            self.hub.ranges.append((key, wanted))
            asked = re.match(r"bytes=(\d+)-(\d*)", wanted)
            start = int(asked[1])  # type: ignore[index]
            if asked[2]:  # type: ignore[index]  # a closed range: `bytes=0-1048575`
                end = min(int(asked[2]), end)  # type: ignore[index]
        body = content[start : end + 1] + b"\0" * self.hub.oversend.get(key, 0)
        self.send_response(206 if wanted else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{hashlib.sha1(content).hexdigest()}"')
        self.send_header("X-Repo-Commit", self.hub.commit(repo))
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(content)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        stall = self.hub.stall.get(key)
        if stall is not None and start < stall:
            self.wfile.write(body[: stall - start])
            self.wfile.flush()
            self.hub.sent[key] += stall - start
            self.hub._release.wait()  # until the hub stops: the client is killed meanwhile
            return
        pause = self.hub.paused.get(key)
        if pause is not None and start < pause[0]:
            first = body[: pause[0] - start]
            self.wfile.write(first)
            self.wfile.flush()
            self.hub.sent[key] += len(first)
            pause[1].wait()  # until the test lets it go on
            body = body[len(first) :]
        self.wfile.write(body)
        self.hub.sent[key] += len(body)
