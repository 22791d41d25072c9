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
# The smallest epsilon every mechanism runs at, with every grid_bits and domain.  The
# binding limit is the grid Laplace sampler: its scale num = (2**grid_bits - 1) * 2**16 /
# epsilon cells must stay below 2**50 (laplace.py, _kernels.laplace_cells), i.e. epsilon
# > 3.8e-6 at grid_bits = 16.  The three-piece layouts (_layout.py) need A * (e**eps - 1)
# >= 1 with A ~ 2**33 and a central interval of at least one tick: measured, they fail
# below 2**-32 ~ 2.3e-10.  Duchi's (e**eps + 1) / (e**eps - 1) needs e**eps > 1 in floats
# (epsilon > 1.1e-16).  1e-5 keeps a factor 2.6 from the Laplace limit.
EPSILON_MIN = 1e-5
# Randomized response alone goes lower: range discovery's sequential strategy answers
# each of up to 64 rounds at epsilon / rounds of a run's epsilon (>= EPSILON_MIN), and its
# integer keep/flip weights work while K - F = 2**53 (e**eps - 1) / (e**eps + 1) >= 1
# (epsilon > 2.2e-16), so it takes shares down to this.
RESPONSE_EPSILON_MIN = 1e-9
# Domains: the width high - low must be at least WIDTH_MIN (keeps 2**20 / width, the
# densities and the cubes in the closed forms normal floats: far below any physical
# quantity, the Planck length is 1.6e-35 m) and at least WIDTH_MIN_RELATIVE times the
# larger of |low| and |high|, so the domain holds at least 2**20 doubles (one per tick of
# the output grid, see _layout.py) and the grid's cell centres are distinct doubles.
WIDTH_MIN = 1e-100
WIDTH_MIN_RELATIVE = 2.0**-32
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


def epsilon(value: object, name: str = "epsilon", minimum: float = EPSILON_MIN) -> float:
    value = real(name, value)
    if not minimum <= value <= EPSILON_MAX:
        raise ValueError(f"{name}: must be in [{minimum:g}, {EPSILON_MAX:g}], got {value:g}")
    return value


DELTA_MAX = 0.1  # (ε,δ) mechanisms: a δ beyond this protects nothing worth the name


def delta(value: object) -> float:
    """δ of an (ε,δ) mechanism: 0 (pure ε-LDP) up to DELTA_MAX."""
    value = real("delta", value)
    if not 0 <= value <= DELTA_MAX:
        raise ValueError(f"delta: must be in [0, {DELTA_MAX:g}], got {value:g}")
    return value


def positive(name: str, value: object) -> float:
    value = real(name, value)
    if value <= 0.0:
        raise ValueError(f"{name}: must be > 0, got {value:g}")
    return value


def interval(low: object, high: object, names: str = "low, high") -> tuple[float, float]:
    """A bounded domain [low, high] of a linear mechanism (see WIDTH_MIN*)."""
    low = real("low", low)
    high = real("high", high)
    if not low < high:
        raise ValueError(f"{names}: need low < high, got low={low:g}, high={high:g}")
    _width(names, f"[{low:g}, {high:g}]", high - low, max(abs(low), abs(high)))
    return low, high


def circle(period: object, origin: object) -> tuple[float, float]:
    """A circle [origin, origin + period): the same rule as ``interval`` for its turn."""
    period = positive("period", period)
    origin = real("origin", origin)
    if not math.isfinite(origin + period):
        raise ValueError(f"origin, period: origin + period overflows, got origin={origin:g}, "
                         f"period={period:g}")
    _width("period", f"{period:g} (origin={origin:g})", period,
           max(abs(origin), abs(origin + period)))
    return period, origin


def _width(name: str, shown: str, width: float, magnitude: float) -> None:
    if not math.isfinite(width):
        raise ValueError(f"{name}: the width overflows, got {shown}")
    least = max(WIDTH_MIN, WIDTH_MIN_RELATIVE * magnitude)
    if not width >= least:
        raise ValueError(
            f"{name}: the width must be at least {WIDTH_MIN:g} and 2**-32 times the largest "
            f"magnitude ({least:g} here), got {shown}")


def output_domain(names: str, shown: str, epsilon: float, *values: float) -> None:
    """Refuse a domain whose output domain (or a density or scale built from it) overflows.

    ``values`` are what the mechanism derived: the output ends, their difference, ...
    """
    if not all(math.isfinite(v) for v in values):
        raise ValueError(
            f"{names}: {shown} is too wide at epsilon={epsilon:g}: the mechanism's output "
            "domain or density overflows a float; use a narrower domain")


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
