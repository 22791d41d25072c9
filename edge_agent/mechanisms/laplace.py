"""Laplace baselines on a bounded domain (OGPM paper Sec. 7.1.3, App. B.8).

Both use scale b = (high - low) / eps, the full width being the local
sensitivity.  Sampling is exact on the output grid: the input is mapped to
its grid cell and discrete-Laplace noise with a rational scale of
``num / 2**16`` cells is added by integer arithmetic (Canonne, Kamath and
Steinke 2020).  The scale is rounded *up* so that the exact privacy loss
``(n_cells - 1) * 2**16 / num`` never exceeds epsilon.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from edge_agent.mechanisms import _kernels, _validate
from edge_agent.mechanisms.base import ExactLoss, Mechanism
from edge_agent.mechanisms.randomness import RandomSource

_DEN_SHIFT = 16


def _gamma_series(p: int, z: np.ndarray) -> np.ndarray:
    """sum_{k=0..p} z**k / k!  (so that lower_gamma(p+1, z) = p! (1 - e**-z * series))."""
    total = np.ones_like(z)
    term = np.ones_like(z)
    for k in range(1, p + 1):
        term = term * z / k
        total = total + term
    return total


class _GridLaplace(Mechanism):
    bounded: bool

    def __init__(self, *, epsilon: float, low: float, high: float, grid_bits: int = 16):
        self.epsilon = _validate.epsilon(epsilon)
        self.low, self.high = _validate.interval(low, high)
        self.grid_bits = _validate.grid_bits(grid_bits)
        self.output_low, self.output_high = self.low, self.high
        self.scale = (self.high - self.low) / self.epsilon
        _validate.output_domain("low, high", f"[{self.low:g}, {self.high:g}]", self.epsilon,
                                self.scale)
        # Grid cells hold the inputs too, so the sensitivity is n_cells - 1 cells.
        sensitivity = self.n_cells - 1
        self._num = math.ceil(Fraction(sensitivity << _DEN_SHIFT) / Fraction(self.epsilon))
        self._q = math.exp(-(1 << _DEN_SHIFT) / self._num)  # ratio of neighbouring cells

    # -- pieces shared by both variants ------------------------------------------------
    def _clip(self, x: Any) -> np.ndarray:
        return np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)

    def _tail_moment(self, m: np.ndarray, p: int) -> np.ndarray:
        """J_p(m) = int_0^m z**p e**(-z/b) / (2b) dz = b**p p!/2 (1 - e**(-m/b) series)."""
        b = self.scale
        z = m / b
        return 0.5 * b**p * math.factorial(p) * (1.0 - np.exp(-z) * _gamma_series(p, z))

    def input_cells(self, x: Any) -> np.ndarray:
        x = self._clip(x)
        return np.clip(((x - self.low) * (self.n_cells / (self.high - self.low))).astype(np.int64),
                       0, self.n_cells - 1)

    def grid_pmf(self, x: Any) -> np.ndarray:
        k = np.arange(self.n_cells)
        c = self.input_cells(x)[..., None]
        q = self._q
        weights = q ** np.abs(k - c).astype(np.float64)
        if self.bounded:
            return weights / weights.sum(axis=-1, keepdims=True)
        pmf = (1.0 - q) / (1.0 + q) * weights
        pmf[..., 0] = q ** c[..., 0].astype(np.float64) / (1.0 + q)
        pmf[..., -1] = q ** (self.n_cells - 1 - c[..., 0]).astype(np.float64) / (1.0 + q)
        return pmf

    def exact_privacy_loss(self) -> ExactLoss:
        """(n_cells - 1) * 2**16 / num, a rational exponent.

        Truncation is post-processing of the discrete Laplace mechanism, so
        the loss is its (n_cells - 1) / scale.  For the bounded variant the
        normaliser ratio cancels at the extreme pair (both ends of the grid)
        and only shrinks the ratio elsewhere (see tests), so the same value
        is exact there too.
        """
        return ExactLoss(exponent=Fraction((self.n_cells - 1) << _DEN_SHIFT, self._num))

    def _sample(self, x: np.ndarray, source: RandomSource, as_values: bool):
        cells = np.empty(x.shape[0], dtype=np.int64)
        bad, clipped = _kernels.quantize(x, cells, low=self.low, high=self.high,
                                         n_cells=self.n_cells)
        if bad:
            return cells.astype(np.uint32), bad, clipped
        codes = _kernels.laplace_cells(cells, source, num=self._num, den_shift=_DEN_SHIFT,
                                       n_cells=self.n_cells, bounded=self.bounded)
        return (self.from_codes(codes) if as_values else codes), bad, clipped


class TruncatedLaplace(_GridLaplace):
    """T-Laplace: x + Laplace(b) clamped into [low, high] (b = w / eps).

    Clamping puts point masses on the ends: P[M(x) = low] = e**(-(x-low)/b) / 2
    and P[M(x) = high] = e**(-(high-x)/b) / 2 (see ``boundary_masses``); ``pdf``
    is the density of the continuous part on (low, high) and ``cdf`` includes
    the atoms.  On the grid the atoms are the first and last cells.
    """

    name = "laplace"
    bounded = False

    def boundary_masses(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        x = self._clip(x)
        b = self.scale
        return 0.5 * np.exp(-(x - self.low) / b), 0.5 * np.exp(-(self.high - x) / b)

    def pdf(self, x: Any, y: Any) -> np.ndarray:
        x, y = self._clip(x), np.asarray(y, dtype=np.float64)
        inside = (y > self.low) & (y < self.high)
        return np.where(inside, np.exp(-np.abs(y - x) / self.scale) / (2.0 * self.scale), 0.0)

    def cdf(self, x: Any, y: Any) -> np.ndarray:
        x, y = self._clip(x), np.asarray(y, dtype=np.float64)
        b = self.scale
        yc = np.clip(y, self.low, self.high)
        laplace = np.where(yc < x, 0.5 * np.exp((yc - x) / b), 1.0 - 0.5 * np.exp(-(yc - x) / b))
        return np.where(y < self.low, 0.0, np.where(y >= self.high, 1.0, laplace))

    def mean_output(self, x: Any) -> np.ndarray:
        """x + (b/2)(e**(-(x-low)/b) - e**(-(high-x)/b)): clamping pulls towards the middle."""
        x = self._clip(x)
        lo_mass, hi_mass = self.boundary_masses(x)
        return x + self.scale * (lo_mass - hi_mass)

    def expected_error(self, x: Any, p: int = 2) -> np.ndarray:
        p = _validate.error_power(p)
        x = self._clip(x)
        below, above = x - self.low, self.high - x
        lo_mass, hi_mass = self.boundary_masses(x)
        return (self._tail_moment(below, p) + self._tail_moment(above, p)
                + lo_mass * below**p + hi_mass * above**p)

    def variance(self, x: Any) -> np.ndarray:
        return self.expected_error(x, 2) - (self.mean_output(x) - self._clip(x)) ** 2


class BoundedLaplace(_GridLaplace):
    """B-Laplace (Holohan et al. 2018): Laplace(x, b) renormalised on [low, high].

    pdf(y | x) = e**(-|y - x|/b) / (2 b C(x)),
    C(x) = 1 - (e**(-(x - low)/b) + e**(-(high - x)/b)) / 2.

    With b = w / eps the privacy loss is exactly eps: the normaliser ratio
    C(x2)/C(x1) never outweighs the e**(-|x1-x2|/b) it comes with, and the
    extreme pair (low, high) has equal normalisers.  Note: the OGPM paper's
    App. B.8 uses the constant C = (1 - e**-eps)/2, which is C(x) at the ends
    only, so its error formula is exact at the ends and too large inside.
    """

    name = "bounded-laplace"
    bounded = True

    def normaliser(self, x: Any) -> np.ndarray:
        x = self._clip(x)
        b = self.scale
        return 1.0 - 0.5 * (np.exp(-(x - self.low) / b) + np.exp(-(self.high - x) / b))

    def pdf(self, x: Any, y: Any) -> np.ndarray:
        x, y = self._clip(x), np.asarray(y, dtype=np.float64)
        inside = (y >= self.low) & (y <= self.high)
        density = np.exp(-np.abs(y - x) / self.scale) / (2.0 * self.scale * self.normaliser(x))
        return np.where(inside, density, 0.0)

    def cdf(self, x: Any, y: Any) -> np.ndarray:
        x = self._clip(x)
        y = np.clip(np.asarray(y, dtype=np.float64), self.low, self.high)
        b = self.scale

        def laplace_cdf(t):
            return np.where(t < x, 0.5 * np.exp((t - x) / b), 1.0 - 0.5 * np.exp(-(t - x) / b))

        return (laplace_cdf(y) - laplace_cdf(self.low)) / self.normaliser(x)

    def _signed_moment(self, x: np.ndarray) -> np.ndarray:
        """int_{low}^{high} (y - x) e**(-|y-x|/b) / (2b) dy, before normalising."""
        b = self.scale
        below, above = x - self.low, self.high - x
        first = lambda m: 0.5 * b * (1.0 - np.exp(-m / b) * (1.0 + m / b))  # noqa: E731
        return first(above) - first(below)

    def mean_output(self, x: Any) -> np.ndarray:
        x = self._clip(x)
        return x + self._signed_moment(x) / self.normaliser(x)

    def expected_error(self, x: Any, p: int = 2) -> np.ndarray:
        p = _validate.error_power(p)
        x = self._clip(x)
        return (self._tail_moment(x - self.low, p) + self._tail_moment(self.high - x, p)) / (
            self.normaliser(x)
        )

    def variance(self, x: Any) -> np.ndarray:
        x = self._clip(x)
        shift = self._signed_moment(x) / self.normaliser(x)
        return self.expected_error(x, 2) - shift**2
