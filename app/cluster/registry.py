"""The request routers alive in this process (the ingress's handle makes one), so the
ingress can list its replicas through them.

A module of its own: Ray Serve ships the router's module, and the ingress class, by value
(copies, with copies of the globals they name), so a set kept in either would not be the
one the other reads; both reach this module by attribute, and a module travels by
reference.
"""

from __future__ import annotations

import weakref
from typing import Any

ROUTERS: weakref.WeakSet[Any] = weakref.WeakSet()
