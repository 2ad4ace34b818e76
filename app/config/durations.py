"""Durations as people write them: Ollama's `keep_alive` ("30s", "5m", "1h30m", 0, -1)."""

from __future__ import annotations

import math
import re

FOREVER = math.inf
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: object) -> float:
    """Seconds (FOREVER for a negative duration); ValueError for anything else."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("keep_alive is a duration such as 30s, 5m, 1h, 0 or -1")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip().lower()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = sign * float(body)
        except ValueError:
            parts = _PART.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise ValueError(
                    f"keep_alive {value!r} is not a duration (such as 30s, 5m, 1h, 0 or -1)"
                ) from None
            seconds = sign * sum(float(n) * _UNIT[u] for n, u in parts)
    if math.isnan(seconds):
        raise ValueError("keep_alive is not a number")
    return FOREVER if seconds < 0 else seconds


def keep_alive_seconds(value: object) -> float:
    """A keep-alive setting as seconds; -1.0 for "never unload"."""
    seconds = parse_keep_alive(value)
    return -1.0 if math.isinf(seconds) else seconds
