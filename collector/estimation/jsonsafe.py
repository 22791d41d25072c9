"""Strict-JSON-safe values: what the API, MQTT snapshots and range results send."""

from __future__ import annotations

import math
from typing import Any

import msgspec


def finite(value: float | None) -> float | None:
    """``value`` as a float, or None where it is None or not finite (JSON has no NaN)."""
    return None if value is None or not math.isfinite(value) else float(value)


def json_safe(value: Any) -> Any:
    """``value`` with NaN and ±inf as None: JSON has no such numbers and
    browsers' JSON.parse rejects Python's ``NaN`` extension.

    numpy arrays and scalars (anything with ``tolist``) become plain lists and
    numbers, so a source may hand them over as they are.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    if isinstance(value, msgspec.Struct):  # typed documents (history points)
        return json_safe(msgspec.to_builtins(value))
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def to_json(value: Any) -> bytes:
    """``value`` as compact strict JSON, on one line (an event-stream data line needs
    that): what ``json_safe`` gives, written by msgspec, which writes NaN and ±inf as
    null itself, about ten times faster than ``json`` over ``json_safe``."""
    return msgspec.json.encode(value, enc_hook=_plain)


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
