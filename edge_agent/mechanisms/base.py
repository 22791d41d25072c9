"""What every mechanism offers, and the output grid they share.

Why reports are grid codes
--------------------------
A sampler that computes a float, e.g. ``x + scale * log(u)``, cannot reach
every double, and *which* doubles it can reach depends on ``x``.  Looking at
the least significant bits of one report can then rule inputs in or out
entirely, an unbounded privacy loss (Mironov 2012; Haney et al. 2022 broke
three major DP libraries this way).  Our kernels never produce such a float:
they pick one of ``2**grid_bits`` fixed cells of the output domain with an
exactly computed integer probability, and a report is that cell's index (its
*code*).  ``from_codes`` maps codes back to the cell centres, a fixed set of
values that does not depend on any input, so nothing finer than a cell is
ever released.

Inputs
------
``perturb`` accepts any array shape.  A NaN or infinite value raises
``ValueError`` (a sensor that says NaN is broken, and guessing a value would
misreport it).  Values outside the input domain are clipped to it; on a
circle they are wrapped instead.  ``perturb_codes(..., return_clipped=True)``
also returns how many values were clipped or wrapped so callers can count them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from edge_agent.mechanisms import _kernels, _validate
from edge_agent.mechanisms.randomness import RandomSource, as_random_source

# 1/φ: golden-section search keeps this share of an interval each step.
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def as_batch(values: Any, name: str = "values") -> tuple[np.ndarray, tuple[int, ...]]:
    """Contiguous 1-D float64 view of ``values`` (copied only if needed) and its shape."""
    if type(values) is np.ndarray and values.dtype.kind == "f" and values.dtype.itemsize == 8 \
            and values.ndim == 1 \
            and values.flags.c_contiguous:
        return values, values.shape  # the common case, without the generic conversions
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be numeric (array-like of floats): {exc}") from None
    return np.ascontiguousarray(array.reshape(-1)), array.shape


def raise_non_finite(bad: int, total: int, name: str = "values") -> None:
    if bad:
        raise ValueError(
            f"{name}: {bad} of {total} values are NaN or infinite; "
            "drop or repair them before perturbing"
        )


def golden_minimum(f, low: float, high: float, steps: int = 200) -> float:
    """The minimiser of a function unimodal on [low, high], by golden-section search
    (the closed-form variances the mechanisms tune their parameters with)."""
    for _ in range(steps):
        a, b = low + (high - low) * 0.382, low + (high - low) * 0.618
        if f(a) < f(b):
            high = b
        else:
            low = a
    return (low + high) / 2


def split_epsilon(epsilon: float, parts: int) -> float:
    """epsilon / parts, rounded down so that ``parts`` shares compose to at most epsilon
    exactly (parts * Fraction(share) <= Fraction(epsilon)): the float quotient can be a
    little more than the exact one."""
    share = epsilon / parts
    while Fraction(share) * parts > Fraction(epsilon):
        share = math.nextafter(share, 0.0)
    return share


@dataclass(frozen=True)
class ExactLoss:
    """A privacy loss ln(ratio) + exponent held exactly (ratio, exponent rational).

    The three-piece mechanisms lose ln of a ratio of integer weights, the
    grid Laplace ones a rational exponent; composition multiplies ratios and
    adds exponents.  ``at_most(eps)`` decides loss <= eps without rounding.
    """

    ratio: Fraction = Fraction(1)
    exponent: Fraction = Fraction(0)

    def __add__(self, other: ExactLoss) -> ExactLoss:
        return ExactLoss(self.ratio * other.ratio, self.exponent + other.exponent)

    def _decimal(self) -> Decimal:
        """The loss to 80 significant digits."""
        with localcontext() as ctx:
            ctx.prec = 80
            return (Decimal(self.ratio.numerator).ln() - Decimal(self.ratio.denominator).ln()
                    + Decimal(self.exponent.numerator) / Decimal(self.exponent.denominator))

    def __float__(self) -> float:
        # Correctly rounded: if the exact loss is <= a float epsilon, so is this.
        return float(self._decimal())

    def ceiling(self, unit: int) -> int:
        """The least integer n with loss <= n / unit, exactly (what a ledger counting in
        units of 1/unit must charge)."""
        if self.ratio == 1:
            return math.ceil(self.exponent * unit)
        with localcontext() as ctx:
            ctx.prec = 80
            n = math.ceil(self._decimal() * unit)
        # ln of a rational other than 1 is irrational, so the loss is never n / unit
        # itself; 80 digits place it, and the exact check below settles any doubt.
        while not self.at_most(Fraction(n, unit)):
            n += 1
        return n

    def at_most(self, epsilon: float | Fraction) -> bool:
        room = Fraction(epsilon) - self.exponent
        if room == 0:  # e**0 = 1 is the one rational value of exp at a rational point
            return self.ratio <= 1
        with localcontext() as ctx:
            ctx.prec = 80
            # Otherwise exp(room) is irrational (Lindemann), so it never equals the
            # ratio; exp() is correctly rounded to 80 digits and the 1e-70 guard
            # only ever errs towards refusing.
            bound = (Decimal(room.numerator) / Decimal(room.denominator)).exp() * (
                1 - Decimal(10) ** -70)
            return Decimal(self.ratio.numerator) <= Decimal(self.ratio.denominator) * bound


class Mechanism(ABC):
    """Base class: input domain, output grid, codes and the closed-form API.

    Subclasses set ``epsilon``, ``low``, ``high``, ``output_low``,
    ``output_high`` and ``grid_bits`` and implement the sampling and the
    closed forms.  Closed forms (``pdf``, ``cdf``, ``mean_output``,
    ``variance``, ``expected_error``) describe the continuous mechanism of the
    paper; ``grid_pmf`` gives the exact probabilities of the codes that
    ``perturb`` actually draws, which differ from the cell integrals of
    ``pdf`` only by the sub-cell placement of interval ends (about 2**-20 of
    the output width).  Duchi's two atoms and II-PTT's ticks are discrete
    mechanisms: their closed forms are those of the reports themselves, ``pdf``
    a probability mass.
    """

    name: ClassVar[str]
    circular: ClassVar[bool] = False
    unbiased: ClassVar[bool] = False

    epsilon: float
    low: float
    high: float
    output_low: float
    output_high: float
    grid_bits: int

    # -- grid ----------------------------------------------------------------
    @property
    def n_cells(self) -> int:
        return 1 << self.grid_bits

    @property
    def cell_width(self) -> float:
        return (self.output_high - self.output_low) / self.n_cells

    def cell_edges(self) -> np.ndarray:
        return self.output_low + np.arange(self.n_cells + 1) * self.cell_width

    @cached_property
    def grid_values(self) -> tuple[float, float]:
        """(value of code 0, step between codes): code k reports the centre of cell k."""
        return self.output_low + 0.5 * self.cell_width, self.cell_width

    def from_codes(self, codes: Any) -> np.ndarray:
        """Cell centres for integer codes; a code outside the grid raises ValueError."""
        array = np.asarray(codes)
        if array.dtype.kind not in "iu":
            raise TypeError(f"codes must be integers, got dtype {array.dtype}")
        origin, step = self.grid_values
        values, bad = _kernels.cell_values(np.ascontiguousarray(array.reshape(-1)),
                                           value_origin=origin, value_step=step,
                                           n_cells=self.n_cells)
        if bad:
            raise ValueError(f"codes must be in [0, {self.n_cells - 1}]: {bad} are not")
        return values.reshape(array.shape)

    def to_codes(self, values: Any) -> np.ndarray:
        """Code of the cell holding each value (values outside the output domain raise)."""
        y = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise ValueError("values must be finite to have a code")
        if self.circular:
            y = self.output_low + np.mod(y - self.output_low, self.output_high - self.output_low)
        elif np.any((y < self.output_low) | (y > self.output_high)):
            raise ValueError(
                f"values must lie in the output domain [{self.output_low:g}, {self.output_high:g}]"
            )
        codes = np.floor((y - self.output_low) / self.cell_width).astype(np.int64)
        return np.clip(codes, 0, self.n_cells - 1).astype(np.uint32)

    # -- reports -------------------------------------------------------------
    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        """Privatised values (cell centres), same shape as ``values``.

        ``rng=None`` draws from the OS-seeded CSPRNG; pass a seeded
        ``numpy.random.Generator`` only for tests and benchmarks.
        """
        x, shape = as_batch(values)
        out, bad, _ = self._sample(x, as_random_source(rng), as_values=True)
        raise_non_finite(bad, x.size)
        return out.reshape(shape)

    def perturb_codes(self, values: Any, rng: Any = None, *, return_clipped: bool = False):
        """Grid codes (uint32) of privatised values, same shape as ``values``."""
        x, shape = as_batch(values)
        codes, bad, clipped = self._sample(x, as_random_source(rng), as_values=False)
        raise_non_finite(bad, x.size)
        codes = codes.reshape(shape)
        return (codes, int(clipped)) if return_clipped else codes

    @abstractmethod
    def _sample(self, x: np.ndarray, source: RandomSource,
                as_values: bool) -> tuple[np.ndarray, int, int]:
        """Codes (uint32), or their cell centres, for a 1-D float64 batch, with
        (non-finite, clipped) counts."""

    @staticmethod
    def _output(x: np.ndarray, as_values: bool) -> np.ndarray:
        """What ``_sample`` fills: codes, or values."""
        return np.empty(x.shape[0], dtype=np.float64 if as_values else np.uint32)

    # -- closed forms --------------------------------------------------------
    @abstractmethod
    def pdf(self, x: Any, y: Any) -> np.ndarray:
        """Density of the report y given input x (broadcasting)."""

    @abstractmethod
    def cdf(self, x: Any, y: Any) -> np.ndarray:
        """P[M(x) <= y] (on a circle: P[origin <= M(x) <= y])."""

    @abstractmethod
    def mean_output(self, x: Any) -> np.ndarray:
        """E[M(x)] in closed form (on a circle: the mean direction)."""

    @abstractmethod
    def variance(self, x: Any) -> np.ndarray:
        """Var[M(x)] in closed form (on a circle: E[d(M(x), x)**2])."""

    @abstractmethod
    def expected_error(self, x: Any, p: int = 2) -> np.ndarray:
        """E|M(x) - x|**p in closed form (circular distance on a circle)."""

    @abstractmethod
    def grid_pmf(self, x: Any) -> np.ndarray:
        """Exact probability of each code for input(s) x, shape (..., n_cells)."""

    @abstractmethod
    def exact_privacy_loss(self) -> ExactLoss:
        """max over inputs x1, x2 and codes k of ln(P[k|x1] / P[k|x2]), held exactly.

        Computed from the integer pieces the kernel samples from, so it is
        the loss of what is released, not of an idealised continuous density.
        """

    def privacy_loss(self) -> float:
        """The maximal log probability ratio of the released codes (<= epsilon, tested exactly)."""
        return float(self.exact_privacy_loss())

    def affine_mean(self) -> tuple[float, float, float, float] | None:
        """(a, b, x_lo, x_hi) with E[M(x)] = a x + b exactly for x in [x_lo, x_hi].

        None where the mean is nowhere affine (the Laplace variants).  A
        collector inverts it to remove the bias of an average of reports.
        """
        return None

    def averaged_error(self, x: Any, reports: int = 1) -> np.ndarray:
        """E[(x^ - x)**2] for the average x^ of ``reports`` reports of the value x, each
        inverted through the affine part of the mean, x^ = (M - b) / a: what a
        collector's bias-removed mean of a fleet at x errs by.

        Var[M(x)] / (reports a**2), plus the squared bias where E[M(x)] is not affine:
        where classical OGPM's mean is flat near an end (Theorem 3.7) every value gives
        the mean of the flat region's edge, and no number of reports moves it.  A
        mechanism whose mean is nowhere affine (the Laplace variants): its raw squared
        error over ``reports``.
        """
        if not isinstance(reports, int) or isinstance(reports, bool):
            raise TypeError("reports must be an int")
        if reports < 1:
            raise ValueError(f"reports: must be >= 1, got {reports}")
        affine = self.affine_mean()
        x = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        if affine is None:
            return self.expected_error(x, 2) / reports
        return self.variance(x) / (reports * affine[0] ** 2) + self.inversion_bias(x) ** 2

    def inversion_bias(self, x: Any) -> np.ndarray:
        """E[x^] - x for a report of x inverted through the affine part of the mean,
        x^ = (M - b) / a: 0 where the mean is affine, the distance to the flat region's
        edge where classical OGPM's is flat (Theorem 3.7).  0 for a mechanism whose mean
        is nowhere affine (nothing to invert)."""
        affine = self.affine_mean()
        x = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        if affine is None:
            return np.zeros_like(x)
        return (self.mean_output(x) - affine[1]) / affine[0] - x

    def worst_case_error(self, p: int = 2) -> float:
        """max over inputs x of expected_error(x, p).

        The closed form is evaluated on 4097 points of the input domain and
        refined by golden-section search around the best one (for the
        piecewise mechanisms the maximum is at an end, OGPM paper Lemma 3.2).
        """
        p = _validate.error_power(p)
        grid = np.linspace(self.low, self.high, 4097)
        errors = self.expected_error(grid, p)
        best = int(np.argmax(errors))
        a = grid[max(best - 1, 0)]
        b = grid[min(best + 1, grid.size - 1)]
        f = lambda t: float(self.expected_error(t, p))  # noqa: E731
        c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
        for _ in range(80):
            if f(c) > f(d):
                b = d
            else:
                a = c
            c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
        return max(float(errors[best]), f((a + b) / 2.0))

    # -- description ---------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Parameters that rebuild this mechanism (see ``from_description``)."""
        return {"name": self.name, "epsilon": self.epsilon, "low": self.low,
                "high": self.high, "grid_bits": self.grid_bits}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.describe().items() if k != "name")
        return f"{type(self).__name__}({params})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.describe() == self.describe()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.describe().items()))))
