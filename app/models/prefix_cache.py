"""The prefix cache: the KV of ended generations, kept for the next request that begins
the same way (an agent resends its whole conversation every turn).

When a stream ends, its model may `put` what its cache held (the prompt and the tokens
fed back) under those token ids; a new request asks `longest` for the entry sharing the
most leading tokens with its prompt and prefills only what follows. Entries are the
device's memory like idle models' weights: the core counts them in its pool and keeps
them within what no admitted job holds (`set_limit`, called at every admission and
release, evicts the least recently used until they fit), so a cached prefix never makes
a request wait or be refused. An entry that would not fit is not kept. One store per
device, shared by the models on it (each entry names its model); thread-safe, as the
models' batch threads put and read while the event loop sets the limit.

Each entry also names its caller's scope (`SamplingParams.cache_scope`, from the
caller's address, credential and the `user`-like ids of its request: app.api.callers):
a prompt reuses, and reports as `cached_tokens`, only what its own scope kept, so one
caller cannot read another's prompt back by guessing at it one token at a time.

What an entry holds is the engine's: the torch engine's per-layer key and value tensors,
the simulated model's bookkeeping. `release` is called once when an entry goes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_CACHED = 16  # fewer shared tokens are not worth an entry or a copy


def shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


@dataclass(eq=False)
class Entry:
    model: str
    ids: tuple[int, ...]  # the tokens its KV holds, in order
    nbytes: int
    payload: Any  # the engine's: what holds the KV
    release: Callable[[], None] = lambda: None
    used_at: float = field(default_factory=time.monotonic)
    scope: str = ""  # whose prompts may reuse it (app.api.callers.cache_scope)


@dataclass
class Stats:
    lookups: int = 0  # requests that asked (the probe and warm-up do not)
    hits: int = 0  # of those, the ones that reused a prefix
    tokens_reused: int = 0  # prompt tokens not prefilled thanks to it
    evicted: int = 0  # entries dropped for room


class PrefixStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[Entry] = []
        self._held = 0
        self._limit = 0  # the most entries may hold now (no admitted job needs it)
        self.stats = Stats()

    @property
    def held_bytes(self) -> int:
        return self._held

    @property
    def limit(self) -> int:
        """The most entries may hold now (what no admitted job holds)."""
        return self._limit

    def __len__(self) -> int:
        return len(self._entries)

    def longest(
        self, model: str, prompt: Sequence[int], *, scope: str = "", used: bool = True
    ) -> tuple[Entry | None, int]:
        """The entry of `model` and `scope` sharing the most leading tokens with `prompt`
        and how many (at most all but the prompt's last token, whose logits give the
        first new token); (None, 0) below MIN_CACHED. Counts as a lookup, and as a hit
        where found (`used` False: the caller may not copy it, and counts it by `hit` if
        it does)."""
        best: Entry | None = None
        count = 0
        with self._lock:
            self.stats.lookups += 1
            for entry in self._entries:
                if entry.model != model or entry.scope != scope:
                    continue
                shared = min(shared_length(entry.ids, prompt), len(prompt) - 1)
                if shared > count:
                    best, count = entry, shared
            if best is None or count < MIN_CACHED:
                return None, 0
            best.used_at = time.monotonic()
            if used:
                self.stats.hits += 1
                self.stats.tokens_reused += count
            return best, count

    def hit(self, reused: int) -> None:
        """A prompt copied `reused` tokens from an entry `longest(used=False)` found."""
        with self._lock:
            self.stats.hits += 1
            self.stats.tokens_reused += reused

    def record(self, reused: int) -> None:
        """A lookup an engine made in its own cache (llama.cpp's slots): `reused`
        prompt tokens came from it."""
        with self._lock:
            self.stats.lookups += 1
            self.stats.hits += reused > 0
            self.stats.tokens_reused += reused

    def covers(self, model: str, ids: Sequence[int], scope: str = "") -> bool:
        """Whether an entry of `model` and `scope` already holds all of `ids` (nothing to
        add)."""
        with self._lock:
            mine = [e for e in self._entries if e.model == model and e.scope == scope]
            return any(shared_length(e.ids, ids) == len(ids) for e in mine)

    def make_room(self, model: str, ids: Sequence[int], nbytes: int, scope: str = "") -> bool:
        """Before an entry of `nbytes` under `ids` is copied out (the copy takes device
        bytes as it is made): the entries it will replace (its model's and scope's, that
        are a prefix of it) and the least recently used go now, until it fits within the
        limit beside the others. False (nothing evicted): it cannot fit at all."""
        with self._lock:
            if nbytes > self._limit or len(ids) < MIN_CACHED:
                return False
            dropped = self._displace(model, ids, nbytes, scope)
        for old in dropped:
            old.release()
        return True

    def put(self, entry: Entry) -> bool:
        """Keep `entry` if it fits within the limit, evicting the least recently used
        for it; entries of its model that are a prefix of it go (it holds them). False
        (and `entry` released): it was not kept. Only its own scope's entries are
        replaced: another caller's identical prefix stays theirs."""
        dropped: list[Entry] = []
        with self._lock:
            kept = entry.nbytes <= self._limit and len(entry.ids) >= MIN_CACHED
            if kept:
                dropped = self._displace(entry.model, entry.ids, entry.nbytes, entry.scope)
                self._entries.append(entry)
                self._held += entry.nbytes
        for old in dropped:
            old.release()
        if not kept:
            entry.release()
        return kept

    def set_limit(self, nbytes: int) -> int:
        """The most entries may hold from now (what no admitted job holds); evicts the
        least recently used beyond it. Returns the bytes freed."""
        with self._lock:
            self._limit = max(0, nbytes)
            dropped = self._trim(self._limit)
            self.stats.evicted += len(dropped)
        for entry in dropped:
            entry.release()
        return sum(e.nbytes for e in dropped)

    def expire(self, model: str, idle_s: float) -> int:
        """Forget `model`'s entries unused for more than `idle_s` seconds (its
        keep-alive: kept prefixes go back to other programs as idle models do); returns
        the bytes freed."""
        dropped: list[Entry] = []
        cut = time.monotonic() - idle_s
        with self._lock:
            for entry in [e for e in self._entries if e.model == model and e.used_at < cut]:
                self._remove(entry, dropped)
        for entry in dropped:
            entry.release()
        return sum(e.nbytes for e in dropped)

    def drop_model(self, model: str) -> int:
        """Forget `model`'s entries (it unloads); returns the bytes freed."""
        dropped: list[Entry] = []
        with self._lock:
            for entry in [e for e in self._entries if e.model == model]:
                self._remove(entry, dropped)
        for entry in dropped:
            entry.release()
        return sum(e.nbytes for e in dropped)

    def view(self) -> dict[str, Any]:
        """/status `prefix_cache`: what it holds and how often it served."""
        with self._lock:
            stats = self.stats
            return {
                "bytes": self._held,
                "entries": len(self._entries),
                "tokens": sum(len(e.ids) for e in self._entries),
                "lookups": stats.lookups,
                "hits": stats.hits,
                "hit_rate": round(stats.hits / stats.lookups, 3) if stats.lookups else None,
                "tokens_reused": stats.tokens_reused,
                "evicted": stats.evicted,
            }

    # -- under the lock --------------------------------------------------------------
    def _displace(self, model: str, ids: Sequence[int], nbytes: int, scope: str) -> list[Entry]:
        """Room for an entry of `nbytes` under `ids`: its model's and scope's entries
        that are a prefix of it go (it holds them), then the least recently used until it
        fits."""
        dropped: list[Entry] = []
        for old in list(self._entries):
            mine = old.model == model and old.scope == scope
            if mine and shared_length(old.ids, ids) == len(old.ids):
                self._remove(old, dropped)
        evicted = self._trim(self._limit - nbytes)
        self.stats.evicted += len(evicted)
        return dropped + evicted

    def _trim(self, limit: int) -> list[Entry]:
        dropped: list[Entry] = []
        by_age = sorted(self._entries, key=lambda e: e.used_at)
        while self._held > limit and by_age:
            self._remove(by_age.pop(0), dropped)
        return dropped

    def _remove(self, entry: Entry, dropped: list[Entry]) -> None:
        self._entries.remove(entry)
        self._held -= entry.nbytes
        dropped.append(entry)
