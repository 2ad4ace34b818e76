"""Windows' sign-out and shutdown: the tray lets the session end and stops its server
cleanly before it does.

pystray's window procedure answers every message it has no handler for with 0, and 0 to
WM_QUERYENDSESSION means "this program cannot end the session": Windows then lists
vramgate as preventing sign-out. So the tray answers TRUE, and on WM_ENDSESSION (its
wParam TRUE: the session ends) stops the server through its shutdown route before
returning, within a drain bound short enough for Windows, which may end the process at
any time once the handler returns (winuser.h; Microsoft's "Shutting Down" and
"WM_ENDSESSION" pages).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("vramgate.tray.session_end")
WM_QUERYENDSESSION = 0x0011
WM_ENDSESSION = 0x0016
# Windows waits about 5 s for a program to finish WM_ENDSESSION before it offers to end
# it (WaitToKillAppTimeout): the server gets most of that to drain
SESSION_END_DRAIN_S = 4.0


def stop_at_session_end(icon: Any, stop: Callable[[float], object]) -> bool:
    """On a win32 icon, answers WM_QUERYENDSESSION with TRUE and calls `stop(drain_s)`
    on WM_ENDSESSION; whether `icon` is one (other backends have no such messages)."""
    modules = {cls.__module__ for cls in type(icon).__mro__}
    handlers = getattr(icon, "_message_handlers", None)
    if "pystray._win32" not in modules or handlers is None:
        return False

    def query(_wparam: int, _lparam: int) -> int:
        return 1  # TRUE: the session may end

    def ended(wparam: int, _lparam: int) -> int:
        if wparam:  # FALSE: another program cancelled it, the session goes on
            log.info("the session ends: stopping the server")
            stop(SESSION_END_DRAIN_S)
        return 0

    handlers[WM_QUERYENDSESSION] = query
    handlers[WM_ENDSESSION] = ended
    return True
