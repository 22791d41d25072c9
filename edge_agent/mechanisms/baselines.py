"""Baseline mechanisms the OGPM paper compares against (Sec. 7).

All take ``(epsilon, low, high)`` as their input domain.  PM, SW and PTT are
three-piece mechanisms and share OGPM's exact integer sampler; Duchi's
mechanism is a two-point mechanism sampled with the same construction on a
two-cell grid.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np

from edge_agent.mechanisms import _kernels, _validate
from edge_agent.mechanisms._layout import TOTAL_BITS, TickLayout
from edge_agent.mechanisms.base import ExactLoss
from edge_agent.mechanisms.tpm import BoundedLineSampling, ThreePieceMechanism


class _Compressible(ThreePieceMechanism):
    """PM and SW: native enlarged output, or compressed linearly into [low, high].

    The compressed variants (PM-C, SW-C in the OGPM paper) apply the
    transformation invariant (Theorem 3.6) to the output only, so they keep
    epsilon-LDP but report inside the input domain, biased towards its middle.
    """

    def __init__(self, *, epsilon: float, low: float, high: float, compressed: bool = False,
                 grid_bits: int = 16):
        epsilon = _validate.epsilon(epsilon)
        low, high = _validate.interval(low, high)
        self.compressed = _validate.flag("compressed", compressed)
        self._set_unit_pieces(epsilon=epsilon, low=low, high=high,
                              grid_bits=_validate.grid_bits(grid_bits),
                              **self._unit_pieces(epsilon))

    def _unit_pieces(self, epsilon: float) -> dict[str, float]:
        """The pieces on the unit input domain [0, 1] -> [unit_low, unit_high]: unit_low,
        unit_high, unit_length, unit_centre_at_low and unit_centre_slope."""
        raise NotImplementedError

    def _set_unit_pieces(self, *, epsilon: float, low: float, high: float, grid_bits: int,
                         unit_low: float, unit_high: float, unit_length: float,
                         unit_centre_at_low: float, unit_centre_slope: float) -> None:
        compressed = self.compressed
        w = high - low
        if compressed:  # map [unit_low, unit_high] onto [low, high]
            scale = w / (unit_high - unit_low)
            shift = low - unit_low * scale
        else:  # apply the input's affine map to the output as well
            scale, shift = w, low
        self._set_pieces(epsilon=epsilon, low=low, high=high,
                         output_low=shift + scale * unit_low, output_high=shift + scale * unit_high,
                         length=scale * unit_length,
                         centre_at_low=shift + scale * unit_centre_at_low,
                         centre_slope=scale * unit_centre_slope / w, grid_bits=grid_bits)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "compressed": self.compressed}


class PiecewiseMechanism(_Compressible):
    """PM (Wang et al. 2019): [-1, 1] -> [-C, C], C = (s + 1) / (s - 1).

    Density p = (e**eps - s) / (2 s + 2) on [l(x), l(x) + C - 1) with
    l(x) = (C + 1)/2 x - (C - 1)/2, and p / e**eps elsewhere.  Unbiased unless
    ``compressed=True`` (PM-C).
    """

    name = "pm"

    @property
    def unbiased(self) -> bool:
        return not self.compressed

    def _unit_pieces(self, epsilon: float) -> dict[str, float]:
        s = math.exp(epsilon / 2.0)
        c = (s + 1.0) / (s - 1.0)
        # On [0, 1]: x' = 2x - 1, so the centre (C+1)/2 x' becomes (C+1)x - (C+1)/2,
        # and the output [-C, C] of x' halves in scale: [-C/2 + 1/2, C/2 + 1/2].
        return dict(unit_low=0.5 - c / 2.0, unit_high=0.5 + c / 2.0,
                    unit_length=(c - 1.0) / 2.0, unit_centre_at_low=0.5 - (c + 1.0) / 4.0,
                    unit_centre_slope=(c + 1.0) / 2.0)


class SquareWave(_Compressible):
    """SW (Li et al. 2020): [0, 1] -> [-b, 1 + b], density e**eps/(2b e**eps + 1) on x +- b.

    b = (eps e**eps - e**eps + 1) / (2 e**eps (e**eps - 1 - eps)).  Biased (it
    was designed for distribution estimation); ``compressed=True`` is SW-C.
    """

    name = "sw"

    def _unit_pieces(self, epsilon: float) -> dict[str, float]:
        e = math.exp(epsilon)
        # expm1 keeps both numerator and denominator accurate as eps -> 0 (both ~ eps**2/2).
        b = (epsilon * e - math.expm1(epsilon)) / (2.0 * e * (math.expm1(epsilon) - epsilon))
        self.half_width = b
        return dict(unit_low=-b, unit_high=1.0 + b, unit_length=2.0 * b,
                    unit_centre_at_low=0.0, unit_centre_slope=1.0)


def ptt_eta(epsilon: float) -> float:
    """eta_0 = B / a of the optimal type-I PTT (OPTT Appendix A, Eq. A.4).

    eta_0 = 1 + c + 1/c with c = cbrt(e**eps + sqrt(e**(2 eps) - 1)); the
    paper's second cube root equals 1/c, which avoids its cancellation.
    """
    e = math.exp(epsilon)
    c = (e + math.sqrt(math.expm1(2.0 * epsilon))) ** (1.0 / 3.0)
    return 1.0 + c + 1.0 / c


class PTT(ThreePieceMechanism):
    """Type-I piecewise transformation technique with the optimal a (OPTT Thm 2-4).

    On [-1, 1]: central piece [k x - a, k x + a) with density p, p / e**eps on
    the rest of [-B, B], B = k + a.  Unbiasedness (Thm 2) and normalisation
    give k = (e**eps + eta - 1) / (e**eps - 1) and a = k / (eta - 1) for
    eta = B / a; Theorem 4's variance-optimal eta is ``ptt_eta``.
    """

    name = "ptt"
    unbiased = True

    def __init__(self, *, epsilon: float, low: float, high: float, grid_bits: int = 16):
        epsilon = _validate.epsilon(epsilon)
        low, high = _validate.interval(low, high)
        eta = ptt_eta(epsilon)
        k = (math.exp(epsilon) + eta - 1.0) / math.expm1(epsilon)
        a = k / (eta - 1.0)
        self.k, self.a, self.eta = k, a, eta
        bound = k + a
        mid, half = 0.5 * (low + high), 0.5 * (high - low)
        self._set_pieces(epsilon=epsilon, low=low, high=high, output_low=mid - bound * half,
                         output_high=mid + bound * half, length=2.0 * a * half,
                         centre_at_low=mid - k * half, centre_slope=k,
                         grid_bits=_validate.grid_bits(grid_bits))


class Duchi(BoundedLineSampling):
    """Duchi et al.'s two-point mechanism: reports mid +- C w/2, C = (e**eps+1)/(e**eps-1).

    P[upper] = 1/2 + (e**eps - 1) / (2 (e**eps + 1)) x' for x' in [-1, 1] the
    input mapped from [low, high].  Unbiased.  The output is inherently two
    atoms, so the grid has two cells: code 0 is the lower atom, code 1 the
    upper; ``pdf`` gives the probability mass of an atom.
    """

    name = "duchi"
    unbiased = True
    grid_bits = 1

    def __init__(self, *, epsilon: float, low: float, high: float):
        self.epsilon = _validate.epsilon(epsilon)
        self.low, self.high = _validate.interval(low, high)
        e = math.exp(self.epsilon)
        self.bound = (e + 1.0) / (e - 1.0)
        mid, half = 0.5 * (self.low + self.high), 0.5 * (self.high - self.low)
        self.output_low = mid - self.bound * half
        # Define the upper atom as low + step so the kernel's low + 1 * step is it exactly.
        self._atom_step = (mid + self.bound * half) - self.output_low
        self.output_high = self.output_low + self._atom_step
        _validate.output_domain("low, high", f"[{self.low:g}, {self.high:g}]", self.epsilon,
                                self.output_low, self.output_high, self._atom_step)
        # Two cells of T/2 ticks; the 'central interval' is exactly one cell long
        # and slides from the lower cell (x = low) to the upper (x = high), so
        # P[upper] = (A T/2 + D * start) / 2**53 is affine in the start tick.
        self.layout = TickLayout.for_exact_length(
            epsilon=self.epsilon, length=1 << 19, grid_bits=1, tick_bits=20
        )
        self._constants = self.layout.kernel_constants()
        self._tick_slope = (self.layout.ticks // 2) / (self.high - self.low)
        self._kernel_args = _kernels.linear_args(
            low=self.low, high=self.high, slope=self._tick_slope, intercept=0.5,
            max_left=self.layout.ticks // 2, constants=self._constants)

    def _upper_probability(self, x: Any) -> np.ndarray:
        x = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        t = 2.0 * (x - self.low) / (self.high - self.low) - 1.0
        e = math.exp(self.epsilon)
        return 0.5 + (e - 1.0) / (2.0 * (e + 1.0)) * t

    @cached_property
    def grid_values(self) -> tuple[float, float]:
        """Code 0 is the lower atom, code 1 the upper (not cell centres)."""
        return self.output_low, self._atom_step

    def to_codes(self, values: Any) -> np.ndarray:
        y = np.asarray(values, dtype=np.float64)
        upper, lower = y == self.output_high, y == self.output_low
        if not np.all(upper | lower):
            raise ValueError(f"Duchi reports are exactly {self.output_low!r} or "
                             f"{self.output_high!r}")
        return upper.astype(np.uint32)

    def pdf(self, x: Any, y: Any) -> np.ndarray:
        up = self._upper_probability(x)
        y = np.asarray(y, dtype=np.float64)
        return np.where(y == self.output_high, up, np.where(y == self.output_low, 1.0 - up, 0.0))

    def cdf(self, x: Any, y: Any) -> np.ndarray:
        up = self._upper_probability(x)
        y = np.asarray(y, dtype=np.float64)
        return np.where(y >= self.output_high, 1.0, np.where(y >= self.output_low, 1.0 - up, 0.0))

    def mean_output(self, x: Any) -> np.ndarray:
        return np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)

    def affine_mean(self) -> tuple[float, float, float, float]:
        return 1.0, 0.0, self.low, self.high  # unbiased

    def variance(self, x: Any) -> np.ndarray:
        """C**2 - x'**2 on [-1, 1] (OPTT Lemma 2), scaled by (w/2)**2."""
        half = 0.5 * (self.high - self.low)
        offset = self.mean_output(x) - 0.5 * (self.low + self.high)
        return (self.bound * half) ** 2 - offset**2

    def expected_error(self, x: Any, p: int = 2) -> np.ndarray:
        p = _validate.error_power(p)
        x = self.mean_output(x)
        up = self._upper_probability(x)
        return (up * np.abs(self.output_high - x) ** p
                + (1.0 - up) * np.abs(x - self.output_low) ** p)

    def start_ticks(self, x: Any) -> np.ndarray:
        x = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        return (self._tick_slope * (x - self.low) + 0.5).astype(np.int64)

    def grid_pmf(self, x: Any) -> np.ndarray:
        left = self.start_ticks(x)[..., None]
        weights = self.layout.cell_weights(left, np.arange(2), circular=False)
        return weights / float(1 << TOTAL_BITS)

    def exact_privacy_loss(self) -> ExactLoss:
        return ExactLoss(Fraction(*self.layout.max_cell_ratio(0, self.layout.ticks // 2, False)))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "low": self.low, "high": self.high}
