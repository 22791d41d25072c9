"""Resolutions and retention periods as people write them: ``"1m"``, ``"1h"``, ``"1d"``,
``"400d"``, ``"forever"``."""

from __future__ import annotations

import math
import re

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
FOREVER = "forever"
_DURATION = re.compile(r"^([1-9][0-9]{0,8})([smhdw])$")


def parse_duration(text: str, *, what: str = "duration") -> int:
    """Whole seconds of ``"<n><s|m|h|d|w>"`` (``ValueError`` saying what is expected)."""
    found = _DURATION.match(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{what}: expected a number and a unit (s, m, h, d, w), such as "
                         f"\"1m\" or \"1h\", got {text!r}")
    return int(found[1]) * UNITS[found[2]]


def duration_name(seconds: float) -> str:
    """The shortest name of a whole number of seconds: 60 -> "1m", 86400 -> "1d"."""
    for unit in ("w", "d", "h", "m"):
        if seconds % UNITS[unit] == 0:
            return f"{int(seconds // UNITS[unit])}{unit}"
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{seconds:g}s"


def parse_retention(text: str, *, what: str) -> float:
    """Seconds a resolution is kept: a duration, or ``"forever"`` (infinity)."""
    return math.inf if text == FOREVER else parse_duration(text, what=what)


def default_retention(span: float) -> float:
    """How long windows of ``span`` seconds are kept unless configured: shorter than an
    hour 7 days, shorter than a day 400 days, days and longer for ever (as Home
    Assistant's recorder keeps its short-term and long-term statistics)."""
    if span < UNITS["h"]:
        return 7.0 * UNITS["d"]
    if span < UNITS["d"]:
        return 400.0 * UNITS["d"]
    return math.inf
