"""Stored answers of the Responses API (`store: true`): one JSON file per response in the
data folder, so that `previous_response_id` continues a conversation across requests and
restarts, and GET /v1/responses/{id} gives an answer back.

A file holds the Response object as it was answered and the conversation's items before
its output (the previous responses' input and output, then this request's input, each as
the model was shown it). Files are written whole to a temporary name and renamed, so a
reader never sees half of one. Ids begin with the time they were made (hexadecimal
nanoseconds), so their names sort oldest first; beyond `limit` files, or `max_bytes` of
them together, the oldest go, and an answer bigger than `max_bytes` alone is not kept.

The routes call it from worker threads (a conversation can be megabytes of JSON: never
on the event loop); one lock makes its calls one at a time, so no writer is under way
while another prunes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import InvalidResponseId

log = logging.getLogger("vramgate.responses")

RESPONSE_ID = re.compile(r"^resp_[A-Za-z0-9]{1,96}$")
_SUFFIX = ".json"
_PARTIAL = ".partial"


def new_response_id(clock_ns: Callable[[], int] = time.time_ns) -> str:
    """resp_ + 16 hex digits of the time + 32 random ones: later ids sort later."""
    return f"resp_{clock_ns():016x}{secrets.token_hex(16)}"


def check_response_id(value: str, param: str) -> str:
    """`value` if it is of our ids' form (it names a file), else a 400 naming `param`."""
    if not RESPONSE_ID.match(value):
        raise InvalidResponseId(
            f"{param} {value[:140]!r} is not a response id (resp_ and up to 96 letters or digits)",
            param=param,
        )
    return value


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the Response object as it was answered
    input: list[dict[str, Any]]  # the items the model was shown, before the output

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def conversation(self) -> list[dict[str, Any]]:
        """The items a response that continues this one comes after."""
        return [*self.input, *self.response.get("output", [])]


class ResponseStore:
    def __init__(self, folder: Path, limit: int, max_bytes: int = 256 * 2**20) -> None:
        """`folder`: created when the first response is saved; `limit`: files kept (0:
        nothing is stored); `max_bytes`: what they may take together."""
        self.folder = folder
        self.limit = limit
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # one call at a time: a save never races a prune

    def save(self, stored: StoredResponse) -> bool:
        """Kept (True), or not: storing is off, or this answer alone is over `max_bytes`
        (said in the log)."""
        if self.limit <= 0:
            return False
        data = json.dumps({"response": stored.response, "input": stored.input}, ensure_ascii=False)
        encoded = data.encode("utf-8")
        if len(encoded) > self.max_bytes:
            log.warning(
                "response %s is not stored: %d bytes, over max_stored_response_bytes (%d)",
                stored.id, len(encoded), self.max_bytes,
            )  # fmt: skip
            return False
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            target = self._path(stored.id)
            partial = target.with_name(target.name + _PARTIAL)
            partial.write_bytes(encoded)
            os.replace(partial, target)
            self._prune()
        return True

    def load(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None (not stored, pruned, deleted, or unreadable)."""
        path = self._path(response_id)
        try:
            with self._lock:
                text = path.read_text(encoding="utf-8")
            data = json.loads(text)
            return StoredResponse(dict(data["response"]), list(data["input"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("stored response %s is unreadable (%s); treated as absent", path, exc)
            return None

    def delete(self, response_id: str) -> bool:
        path = self._path(response_id)
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        return True

    def ids(self) -> list[str]:
        """The stored responses' ids, oldest first."""
        if not self.folder.is_dir():
            return []
        names = (
            name[: -len(_SUFFIX)] for name in os.listdir(self.folder) if name.endswith(_SUFFIX)
        )
        return sorted(name for name in names if RESPONSE_ID.match(name))

    def _path(self, response_id: str) -> Path:
        return self.folder / (check_response_id(response_id, "response_id") + _SUFFIX)

    def _prune(self) -> None:
        """The oldest files beyond `limit` or past `max_bytes` together go, and any
        partial file a crash left."""
        for name in os.listdir(self.folder):
            if name.endswith(_PARTIAL):
                (self.folder / name).unlink(missing_ok=True)
        ids = self.ids()
        sizes: dict[str, int] = {}
        for response_id in ids:
            try:
                sizes[response_id] = self._path(response_id).stat().st_size
            except FileNotFoundError:
                sizes[response_id] = 0
        total = sum(sizes.values())
        for index, response_id in enumerate(ids):
            if len(ids) - index <= self.limit and total <= self.max_bytes:
                break
            self._path(response_id).unlink(missing_ok=True)
            total -= sizes[response_id]
