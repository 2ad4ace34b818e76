"""Stored answers of the Responses API (`store: true`): one JSON file per response in the
data folder, so that `previous_response_id` continues a conversation across requests and
restarts, and GET /v1/responses/{id} gives an answer back.

A file holds the Response object as it was answered and the conversation's items before
its output (the previous responses' input and output, then this request's input, each as
the model was shown it). Files are written whole to a temporary name and renamed, so a
reader never sees half of one. Ids begin with the time they were made (hexadecimal
nanoseconds), so their names sort oldest first; beyond `limit` files the oldest go.

Every call runs on the event loop, one at a time: a file of a conversation that fits a
model's context is written in well under a millisecond, and no other writer can be under
way while one prunes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
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
    def __init__(self, folder: Path, limit: int) -> None:
        """`folder`: created when the first response is saved; `limit`: files kept (0:
        nothing is stored)."""
        self.folder = folder
        self.limit = limit

    def save(self, stored: StoredResponse) -> None:
        if self.limit <= 0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self._path(stored.id)
        partial = target.with_name(target.name + _PARTIAL)
        data = {"response": stored.response, "input": stored.input}
        partial.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(partial, target)
        self._prune()

    def load(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None (not stored, pruned, deleted, or unreadable)."""
        path = self._path(response_id)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return StoredResponse(dict(data["response"]), list(data["input"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("stored response %s is unreadable (%s); treated as absent", path, exc)
            return None

    def delete(self, response_id: str) -> bool:
        try:
            self._path(response_id).unlink()
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
        """The oldest files beyond `limit` go, and any partial file a crash left."""
        for name in os.listdir(self.folder):
            if name.endswith(_PARTIAL):
                (self.folder / name).unlink(missing_ok=True)
        ids = self.ids()
        for response_id in ids[: max(0, len(ids) - self.limit)]:
            self._path(response_id).unlink(missing_ok=True)
