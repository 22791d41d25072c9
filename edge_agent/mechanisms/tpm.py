"""Generic three-piece mechanism (TPM, OGPM paper Definition 2.2).

A TPM is fixed by its output domain, the length ``L`` of its central interval,
the interval's centre as an affine function of the input, and the density
ratio ``e**eps`` between the central piece and the rest.  Normalisation then
fixes both densities:

    p_low * (W - L) + p_high * L = 1,  p_high = e**eps * p_low,

with ``W`` the output width.  OGPM (classical, unbiased, circular), PM, SW,
their compressed variants and PTT are all TPMs; each subclass only says how
its paper chooses ``L`` and the centre, and every closed form below is
computed from those pieces.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from edge_agent.mechanisms import _kernels, _validate
from edge_agent.mechanisms._layout import TOTAL_BITS, TickLayout
from edge_agent.mechanisms.base import ExactLoss, Mechanism
from edge_agent.mechanisms.randomness import RandomSource

# A flat end narrower than this share of the domain is rounding (a report's finest cell is
# 2**-GRID_BITS_MAX = 2**-16 of it): affine_mean reports none.
FLAT_END_ROUNDING = 1e-9


def _antiderivative(y: np.ndarray, x: np.ndarray, p: int) -> np.ndarray:
    """G with G' = |y - x|**p."""
    d = y - x
    return np.sign(d) * np.abs(d) ** (p + 1) / (p + 1)


class BoundedLineSampling(Mechanism):
    """Sampling through the bounded-line kernel, with the ``_kernel_args`` the mechanism
    built (the three-piece mechanisms, and Duchi's two atoms)."""

    _kernel_args: tuple

    def _sample(self, x: np.ndarray, source: RandomSource, as_values: bool):
        out = self._output(x, as_values)
        bad, clipped = _kernels.tpm_linear(x, source.words(x.shape[0]), out, self._kernel_args,
                                           self.grid_values)
        return out, bad, clipped


class ThreePieceMechanism(BoundedLineSampling):
    """Base for every TPM; subclasses call ``_set_pieces`` from ``__init__``."""

    def _set_pieces(self, *, epsilon: float, low: float, high: float, output_low: float,
                    output_high: float, length: float, centre_at_low: float,
                    centre_slope: float, grid_bits: int) -> None:
        self.epsilon = epsilon
        self.low, self.high = low, high
        self.output_low, self.output_high = output_low, output_high
        self.grid_bits = grid_bits
        self.length = length
        self._centre_at_low = centre_at_low
        self._centre_slope = centre_slope
        width = output_high - output_low
        ratio = math.exp(epsilon)
        normaliser = (width - length) + ratio * length
        _validate.output_domain("origin, period" if self.circular else "low, high",
                                f"[{low:g}, {high:g}]", epsilon, output_low, output_high, width,
                                normaliser)
        self.p_low = 1.0 / normaliser
        self.p_high = ratio * self.p_low
        self.layout = TickLayout.for_fraction(
            epsilon=epsilon, fraction=length / width, grid_bits=grid_bits
        )
        self._constants = self.layout.kernel_constants()
        ticks = self.layout.ticks
        per_unit = ticks / width  # ticks per unit of output
        # Start tick of the central interval = floor(slope*(x - low) + intercept):
        # the continuous centre, minus half the integer interval, rounded.
        self._tick_slope = centre_slope * per_unit
        self._tick_intercept = (
            (centre_at_low - output_low) * per_unit - self.layout.effective_length / 2.0 + 0.5
        )
        self._max_left = ticks - self.layout.length
        self._kernel_args = _kernels.linear_args(
            low=low, high=high, slope=self._tick_slope, intercept=self._tick_intercept,
            max_left=self._max_left, constants=self._constants)

    # -- the continuous pieces -------------------------------------------
    def centre(self, x: Any) -> np.ndarray:
        """Centre of the central interval before clamping into the output domain."""
        x = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        return self._centre_at_low + self._centre_slope * (x - self.low)

    def interval(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        """[l(x), r(x)): the central piece, clamped into the output domain."""
        left = np.clip(self.centre(x) - self.length / 2.0, self.output_low,
                       self.output_high - self.length)
        return left, left + self.length

    def pdf(self, x: Any, y: Any) -> np.ndarray:
        left, right = self.interval(x)
        y = np.asarray(y, dtype=np.float64)
        inside = (y >= self.output_low) & (y <= self.output_high)
        return np.where(inside, np.where((y >= left) & (y < right), self.p_high, self.p_low), 0.0)

    def cdf(self, x: Any, y: Any) -> np.ndarray:
        left, _ = self.interval(x)
        y = np.clip(np.asarray(y, dtype=np.float64), self.output_low, self.output_high)
        return self.p_low * (y - self.output_low) + (self.p_high - self.p_low) * np.clip(
            y - left, 0.0, self.length
        )

    def _reference(self) -> float:
        # Moments are taken about the middle of the output domain to avoid
        # cancellation for domains far from zero.
        return 0.5 * (self.output_low + self.output_high)

    def mean_output(self, x: Any) -> np.ndarray:
        left, _ = self.interval(x)
        m = self._reference()
        # p_low over the whole symmetric domain contributes 0 about m.
        return m + (self.p_high - self.p_low) * self.length * (left + self.length / 2.0 - m)

    def variance(self, x: Any) -> np.ndarray:
        left, right = self.interval(x)
        m = self._reference()
        width = self.output_high - self.output_low
        second = self.p_low * width**3 / 12.0 + (self.p_high - self.p_low) * (
            (right - m) ** 3 - (left - m) ** 3
        ) / 3.0
        return second - (self.mean_output(x) - m) ** 2

    def affine_mean(self) -> tuple[float, float, float, float] | None:
        """Where the central piece is not clamped, E[M(x)] = m + (p_high - p_low) L (c(x) - m).

        c(x) is the piece's centre (affine) and m the middle of the output
        domain; the clamp binds only for OGPM near the ends (Theorem 3.7).
        """
        m = self._reference()
        slope = (self.p_high - self.p_low) * self.length * self._centre_slope
        intercept = m + (self.p_high - self.p_low) * self.length * (
            self._centre_at_low - self._centre_slope * self.low - m)
        # Centre range that keeps the whole piece inside the output domain.
        c_lo = self.output_low + self.length / 2.0
        c_hi = self.output_high - self.length / 2.0
        x_lo = self.low + (c_lo - self._centre_at_low) / self._centre_slope
        x_hi = self.low + (c_hi - self._centre_at_low) / self._centre_slope
        # Where the clamp never binds, x_lo and x_hi are the domain's ends up to rounding
        # (PM-C at eps 2: 4e-16 of the width short).  A flat region that narrow is no
        # region: read as one, a collector would note data "where the mechanism reports the
        # same distribution for every value" and widen its bias bound for it.
        rounding = FLAT_END_ROUNDING * (self.high - self.low)
        x_lo = self.low if x_lo - self.low <= rounding else x_lo
        x_hi = self.high if self.high - x_hi <= rounding else x_hi
        return slope, intercept, x_lo, x_hi

    def expected_error(self, x: Any, p: int = 2) -> np.ndarray:
        p = _validate.error_power(p)
        x = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        left, right = self.interval(x)
        g = lambda y: _antiderivative(y, x, p)  # noqa: E731
        return self.p_low * (g(self.output_high) - g(self.output_low)) + (
            self.p_high - self.p_low
        ) * (g(right) - g(left))

    # -- the integer mechanism actually sampled ------------------------------
    def start_ticks(self, x: Any) -> np.ndarray:
        """Start tick of the central interval, computed exactly as the kernel does."""
        x = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        raw = (self._tick_slope * (x - self.low) + self._tick_intercept).astype(np.int64)
        return np.clip(raw, 0, self._max_left)

    def grid_pmf(self, x: Any) -> np.ndarray:
        left = self.start_ticks(x)[..., None]
        cells = np.arange(self.n_cells, dtype=np.int64)
        return self.layout.cell_weights(left, cells, self.circular) / float(1 << TOTAL_BITS)

    def _reachable_starts(self) -> tuple[int, int]:
        ends = self.start_ticks(np.array([self.low, self.high]))
        return int(ends.min()), int(ends.max())

    def exact_privacy_loss(self) -> ExactLoss:
        first, last = self._reachable_starts()
        return ExactLoss(Fraction(*self.layout.max_cell_ratio(first, last, self.circular)))



class CircularThreePiece(ThreePieceMechanism):
    """A TPM on a circle: the central arc is centred on x and may wrap."""

    circular = True

    def _set_circle(self, *, epsilon: float, period: float, origin: float, length: float,
                    grid_bits: int) -> None:
        self.period = period
        self.origin = origin
        self._set_pieces(epsilon=epsilon, low=origin, high=origin + period, output_low=origin,
                         output_high=origin + period, length=length, centre_at_low=origin,
                         centre_slope=1.0, grid_bits=grid_bits)
        self._tick_scale = self.layout.ticks / period
        self._tick_offset = 0.5 - self.layout.effective_length / 2.0
        self._kernel_args = _kernels.circular_args(
            origin=origin, period=period, scale=self._tick_scale, offset=self._tick_offset,
            constants=self._constants)

    def offset(self, x: Any) -> np.ndarray:
        """(x - origin) mod period in [0, period), exactly as the kernel wraps (any finite x).

        Inside the turn it is x - origin; outside, the kernel's ``_circle_offset``: the
        exact fmod remainders of x and origin, so a huge x (1e300) wraps to where it
        lies instead of overflowing ((x - origin) * ticks / period).
        """
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(over="ignore"):  # an overflow to +-inf is outside, as it should be
            d = x - self.origin
        outside = (d < 0.0) | (d >= self.period)
        if not np.any(outside):
            return d
        with np.errstate(invalid="ignore"):  # inf and NaN inputs stay NaN
            w = np.fmod(np.fmod(x, self.period) - math.fmod(self.origin, self.period),
                        self.period)
        w = np.where(w < 0.0, w + self.period, w)
        w = np.where((w < self.period) | np.isnan(w), w, 0.0)
        return np.where(outside, w, d)

    def wrap(self, x: Any) -> np.ndarray:
        return self.origin + self.offset(x)

    def distance(self, x: Any, y: Any) -> np.ndarray:
        """Circular distance in [0, period / 2]."""
        d = np.mod(np.asarray(y, dtype=np.float64) - np.asarray(x, dtype=np.float64), self.period)
        return np.minimum(d, self.period - d)

    def pdf(self, x: Any, y: Any) -> np.ndarray:
        return np.where(self._in_arc(x, y), self.p_high, self.p_low)

    def _in_arc(self, x: Any, y: Any) -> np.ndarray:
        # The arc is [x - L/2, x + L/2) taken modulo the period.
        offset = np.mod(np.asarray(y, dtype=np.float64) - np.asarray(x, dtype=np.float64)
                        + self.length / 2.0, self.period)
        return offset < self.length

    def cdf(self, x: Any, y: Any) -> np.ndarray:
        """P[origin <= M(x) <= y] for y in [origin, origin + period]."""
        y = np.clip(np.asarray(y, dtype=np.float64), self.origin, self.origin + self.period)
        start = self.wrap(x) - self.length / 2.0
        covered = np.zeros(np.broadcast(start, y).shape)
        for shift in (-self.period, 0.0, self.period):
            lo = np.maximum(start + shift, self.origin)
            hi = np.minimum(start + shift + self.length, y)
            covered = covered + np.maximum(hi - lo, 0.0)
        return self.p_low * (y - self.origin) + (self.p_high - self.p_low) * covered

    def mean_output(self, x: Any) -> np.ndarray:
        """Mean direction: the arc is symmetric about x, so it is x itself (Sec. 5.2)."""
        return self.wrap(x)

    def variance(self, x: Any) -> np.ndarray:
        """E[d(M(x), x)**2], the same for every x (Theorem 4.4)."""
        return self.expected_error(x, 2)

    def expected_error(self, x: Any, p: int = 2) -> np.ndarray:
        p = _validate.error_power(p)
        half_arc, half_circle = self.length / 2.0, self.period / 2.0
        value = 2.0 * (
            self.p_high * half_arc ** (p + 1)
            + self.p_low * (half_circle ** (p + 1) - half_arc ** (p + 1))
        ) / (p + 1)
        return np.full(np.shape(x), value)

    def worst_case_error(self, p: int = 2) -> float:
        return float(self.expected_error(0.0, p))

    def affine_mean(self) -> None:
        """Means of angles are directions, not affine maps: see mean_resultant_length."""
        return None

    def mean_resultant_length(self) -> float:
        """rho = E[cos(2*pi*(M(x) - x)/period)], the shrink of the mean resultant length."""
        angle = math.pi * self.length / self.period
        return (self.p_high - self.p_low) * self.period / math.pi * math.sin(angle)

    def start_ticks(self, x: Any) -> np.ndarray:
        t = self.offset(x) * self._tick_scale
        ticks = float(self.layout.ticks)
        t = t - np.floor(t / ticks) * ticks
        return np.floor(t + self._tick_offset).astype(np.int64) & (self.layout.ticks - 1)

    def _reachable_starts(self) -> tuple[int, int]:
        return 0, self.layout.ticks - 1

    def _sample(self, x: np.ndarray, source: RandomSource, as_values: bool):
        out = self._output(x, as_values)
        bad, wrapped = _kernels.tpm_circular(x, source.words(x.shape[0]), out, self._kernel_args,
                                             self.grid_values)
        return out, bad, wrapped

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "period": self.period,
                "origin": self.origin, "grid_bits": self.grid_bits}
