"""Host memory that requests hold outside the device's gate, bounded: a ledger of bytes
and the leases that take from it. Transcriptions are its users: an upload decodes to
16 kHz float32 (a 2-hour file: 461 MB, twice that while its pieces are joined) before it
is queued, and keeps it until its windows have run, so up to `max_queue` of them would
otherwise hold what they like. A lease that cannot take what it needs is refused at once
(the caller answers 503 with Retry-After), never made to wait.

Thread-safe: decoding runs on the CPU pool, leases close on the event loop."""

from __future__ import annotations

import threading


class HostBytes:
    """At most `limit` bytes held by all leases together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()  # guards `_held` against threads taking at once

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def lease(self) -> HostLease:
        return HostLease(self)

    def _take(self, nbytes: int) -> bool:
        with self._lock:
            if self._held + nbytes > self.limit:
                return False
            self._held += nbytes
            return True

    def _give(self, nbytes: int) -> None:
        with self._lock:
            self._held -= nbytes


class HostLease:
    """One request's share of a ledger: what it took comes back when it closes (or when
    it gives it back itself), once."""

    def __init__(self, ledger: HostBytes) -> None:
        self._ledger = ledger
        self.held = 0
        self._lock = threading.Lock()  # guards `held` (taken on a pool thread, closed on the loop)
        self._closed = False

    def take(self, nbytes: int) -> bool:
        """Whether `nbytes` more could be taken (False: nothing was; a closed lease takes
        nothing)."""
        with self._lock:
            if self._closed or not self._ledger._take(nbytes):
                return False
            self.held += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            nbytes = min(nbytes, self.held)
            self.held -= nbytes
            self._ledger._give(nbytes)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._ledger._give(self.held)
            self.held = 0

    def __enter__(self) -> HostLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
