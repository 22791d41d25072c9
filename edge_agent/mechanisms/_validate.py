"""Parameter checks shared by every mechanism constructor.

Each check raises ``TypeError`` for a wrong type and ``ValueError`` naming the
parameter, its allowed range and the value received, so that a mistyped
configuration is fixed from the message alone.
"""

from __future__ import annotations

import math
import numbers

# Above e**20 ~ 4.9e8 a report is practically the raw value; the integer
# sampler (see _layout.py) also needs e**epsilon well below 2**53.
EPSILON_MAX = 20.0
GRID_BITS_MIN = 1
GRID_BITS_MAX = 16


def real(name: str, value: object) -> float:
    """A finite real number (bool is refused: ``True`` is not an epsilon)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def epsilon(value: object, name: str = "epsilon") -> float:
    value = real(name, value)
    if not 0.0 < value <= EPSILON_MAX:
        raise ValueError(f"{name}: must be in (0, {EPSILON_MAX:g}], got {value:g}")
    return value


def positive(name: str, value: object) -> float:
    value = real(name, value)
    if value <= 0.0:
        raise ValueError(f"{name}: must be > 0, got {value:g}")
    return value


def interval(low: object, high: object) -> tuple[float, float]:
    low = real("low", low)
    high = real("high", high)
    if not low < high:
        raise ValueError(f"low, high: need low < high, got low={low:g}, high={high:g}")
    if not math.isfinite(high - low):
        raise ValueError(f"low, high: the width high - low overflows, got [{low:g}, {high:g}]")
    return low, high


def grid_bits(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"grid_bits must be an integer, got {type(value).__name__}")
    value = int(value)
    if not GRID_BITS_MIN <= value <= GRID_BITS_MAX:
        raise ValueError(
            f"grid_bits: must be in [{GRID_BITS_MIN}, {GRID_BITS_MAX}], got {value}"
        )
    return value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def error_power(p: object) -> int:
    """The exponent of E|Y - x|**p; positive integers keep every closed form exact."""
    if isinstance(p, bool) or not isinstance(p, numbers.Integral):
        raise TypeError(f"p must be a positive integer, got {type(p).__name__}")
    p = int(p)
    if p < 1:
        raise ValueError(f"p: must be an integer >= 1, got {p}")
    return p
