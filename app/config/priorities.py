"""The names of the priority classes, as the config and clients write them (the classes
themselves: app.sched.priority)."""

from __future__ import annotations

from typing import Literal, get_args

PriorityName = Literal["priority", "interactive", "background"]
PRIORITY_NAMES: tuple[str, ...] = get_args(PriorityName)
