"""The sign-ins of pages (the dashboard, /docs) when a token is set: server-side sessions.

A browser cannot send the bearer header when it opens a page, so the tray opens it once
with the token in its address and the guard answers with a session. A session is two
random values kept here, in memory (a restart signs every page out):

- its id, in an HttpOnly cookie. Browsers send 127.0.0.1's cookies to every port of
  it, so any other local web server the user visits receives the id: the cookie alone
  only opens the pages themselves (static HTML, the OpenAPI document);
- its page key, handed to the page once, in the fragment of the sign-in's redirect
  (a fragment is never sent to any server), kept by the page in its origin's storage
  (which other ports cannot read) and sent as a header with everything it fetches.

A session ends `lifetime_s` after its sign-in, used or not.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import Scope

SESSION_COOKIE = "vramgate_session"
PAGE_KEY_HEADER = "x-vramgate-page-key"
LIFETIME_S = 12 * 3600  # a working day; the tray's "Open dashboard" signs in again
MOST_SESSIONS = 32  # each needs the token; the bound keeps memory bounded all the same


def session_cookie(scope: Scope) -> str:
    """The cookie's name, with the server's port: two servers on one machine must not
    overwrite each other's sessions (browsers keep one cookie per name and host)."""
    server = scope.get("server") or (None, None)
    return f"{SESSION_COOKIE}_{server[1]}" if server[1] else SESSION_COOKIE


@dataclass(frozen=True)
class PageSession:
    id: str
    key: str
    ends_at: float

    def key_matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.key.encode())


class PageSessions:
    """The live sessions, oldest first. Used from the event loop only."""

    def __init__(
        self,
        lifetime_s: float = LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
        most: int = MOST_SESSIONS,
    ) -> None:
        self.lifetime_s = lifetime_s
        self._clock = clock
        self._most = most
        self._live: OrderedDict[str, PageSession] = OrderedDict()

    def open(self) -> PageSession:
        session = PageSession(
            secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._clock() + self.lifetime_s
        )
        self._live[session.id] = session
        while len(self._live) > self._most:
            self._live.popitem(last=False)
        return session

    def find(self, session_id: str | None) -> PageSession | None:
        """The live session of that id; None for an unknown or ended one."""
        if not session_id:
            return None
        session = self._live.get(session_id)  # 256 random bits: nothing to learn by timing
        if session is None:
            return None
        if self._clock() >= session.ends_at:
            del self._live[session_id]
            return None
        return session
