"""Type-II piecewise transformation technique (II-PTT, OPTT Sec. 3.3.2, Theorems 6-7),
sampled exactly.

On [-1, 1] (the input domain mapped there) II-PTT reports from [-B, B] with a density
that is p / e^ε everywhere plus a tent around k x: p at its peak, p / e^ε at its
ends k x ± a (so the worst density ratio is e^ε).  Unbiasedness and normalisation give
(Theorem 6, with B = η a):

    k = (2η + e^ε - 1) / (e^ε - 1),   a = k / (η - 1),
    Var = (k - 1) x^2 + (4η^3 / (e^ε - 1) + 1) a / (6 (η - 1))          (Eq. 22)

and η is chosen to minimise the worst case (x = ±1).  Theorem 7: for the same k and a,
I-PTT (``PTT``) has the smaller variance exactly when ε < ln 3.

**Exact sampling.**  The output [-B, B] is T = 2**grid_bits ticks (the report is the
tick).  Each tick has weight F; the tent adds E (A - |j|) at offset j from the
input's centre tick, |j| < A, A = T / (2η) ticks.  The tent's weights are drawn as
the sum of two uniform integers in [0, A) (their sum has exactly that triangular
law), the floor as one uniform tick, from the top 53 bits of a CSPRNG word against
T F + E A^2 <= 2**53; a word beyond that is drawn again (with the same probability for
every input, so the number of draws reveals nothing).  The worst ratio of a tick's
weight across inputs is (F + E A) / F, chosen at most e^ε and checked exactly.  The
centre is placed so that the mean report is x up to half a tick (the centre's
rounding); ``mean_output`` and ``variance`` are computed from the exact weights.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numba import njit

from edge_agent.mechanisms import _validate
from edge_agent.mechanisms._layout import TOTAL_BITS, ratio_within
from edge_agent.mechanisms.base import ExactLoss, golden_minimum
from edge_agent.mechanisms.randomness import as_random_source

TOTAL = 1 << TOTAL_BITS
_SHIFT = np.uint64(64 - TOTAL_BITS)


def ii_ptt_geometry(epsilon: float, eta: float) -> tuple[float, float]:
    """(k, a) of II-PTT for η = B / a (Theorem 6 with normalisation)."""
    e = math.exp(epsilon)
    k = (2 * eta + e - 1) / (e - 1)
    return k, k / (eta - 1)


def ii_ptt_variance(epsilon: float, eta: float, x: float = 1.0) -> float:
    """OPTT Eq. 22."""
    k, a = ii_ptt_geometry(epsilon, eta)
    return (k - 1) * x * x + (4 * eta ** 3 / math.expm1(epsilon) + 1) * a / (6 * (eta - 1))


def i_ptt_variance(epsilon: float, k: float, a: float, x: float = 1.0) -> float:
    """OPTT Eq. 15 (I-PTT) at its k and a (η = (k + a) / a)."""
    eta = (k + a) / a
    return (k - 1) * x * x + (eta ** 3 / math.expm1(epsilon) + 1) * a / (3 * (eta - 1))


def optimal_eta(epsilon: float) -> float:
    """The η of least worst-case variance (x = ±1), by golden-section search (the
    variance is unimodal in η on (1, ∞): it grows without bound at both ends)."""
    return golden_minimum(lambda eta: ii_ptt_variance(epsilon, eta), 1.0 + 1e-9, 1e4,
                          steps=300)


@njit(cache=True)
def _tent_ticks(centres, words, floor, slope, ticks, half, out):
    """The ticks of the reports of ``centres``, in order, until the words run out:
    returns (reports done, words used)."""
    accept = np.uint64(ticks) * floor + slope * np.uint64(half) * np.uint64(half)
    done, used = 0, 0
    for i in range(centres.shape[0]):
        while True:
            if used >= words.shape[0]:
                return done, used
            r = words[used] >> _SHIFT
            used += 1
            if r < accept:
                break
        if r < np.uint64(ticks) * floor:
            out[i] = r // floor
        else:
            u = np.int64((r - np.uint64(ticks) * floor) // slope)  # uniform in [0, A^2)
            out[i] = centres[i] - (half - 1) + u // half + u % half
        done += 1
    return done, used


class TypeIIPTT:
    """II-PTT on [low, high] (keyword-only, validated like every mechanism)."""

    name = "ptt-ii"

    def __init__(self, *, epsilon: float, low: float, high: float, grid_bits: int = 16):
        self.epsilon = _validate.epsilon(epsilon)
        self.low, self.high = _validate.interval(low, high)
        self.grid_bits = _validate.grid_bits(grid_bits)
        if self.grid_bits < 8:
            raise ValueError(f"grid_bits: must be in [8, {_validate.GRID_BITS_MAX}] for "
                             f"II-PTT (its tent needs ticks), got {grid_bits}")
        self.eta = optimal_eta(self.epsilon)
        ticks = self.ticks = 1 << self.grid_bits
        half = self.half = max(2, round(ticks / (2 * self.eta)))
        e = math.exp(self.epsilon)
        floor = TOTAL // (ticks + math.ceil((e - 1) * half) + half)
        slope = max(1, int((e - 1) * floor / half))
        while slope > 1 and not ratio_within(floor + slope * half, floor, self.epsilon):
            slope -= 1
        while ratio_within(floor + (slope + 1) * half, floor, self.epsilon):
            slope += 1
        if not ratio_within(floor + slope * half, floor, self.epsilon):
            raise ValueError(f"epsilon: {epsilon:g} is too small for II-PTT at "
                             f"grid_bits={grid_bits}")
        self.floor, self.slope = floor, slope
        accept = ticks * floor + slope * half * half
        self.tent_share = Fraction(slope * half * half, accept)  # P[the tent is drawn]
        # Output [-B, B] on [-1, 1], tick width w: the centre k_d x with k_d = 1 / share
        # (so E = share * k_d x = x), the tent inside [-B, B]: B = k_d + half * w.
        self.k = 1 / float(self.tent_share)
        self.tick_width = self.k / (ticks / 2 - half)
        self._mid, self._half_width = (self.low + self.high) / 2, (self.high - self.low) / 2

    # -- guarantees -----------------------------------------------------------------------
    def exact_privacy_loss(self) -> ExactLoss:
        """A tick's weight is F (floor only) for some inputs and at most F + E A (the
        tent's peak) for others."""
        return ExactLoss(Fraction(self.floor + self.slope * self.half, self.floor))

    # -- geometry -------------------------------------------------------------------------
    def _unit(self, values: Any) -> np.ndarray:
        x = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError("values must be finite")
        return np.clip((x - self._mid) / self._half_width, -1.0, 1.0)

    def centre_ticks(self, values: Any) -> np.ndarray:
        """The tent's centre tick for each input."""
        position = self.k * self._unit(values) / self.tick_width + self.ticks / 2 - 0.5
        return np.clip(np.rint(position), self.half - 1, self.ticks - self.half).astype(np.int64)

    def tick_values(self, ticks: Any) -> np.ndarray:
        """The value a tick reports (its centre), on [low, high]'s scale."""
        unit = (np.asarray(ticks, dtype=np.float64) + 0.5 - self.ticks / 2) * self.tick_width
        return self._mid + self._half_width * unit

    def pmf(self, value: float) -> np.ndarray:
        """P[tick | value] for every tick, exactly (as Fractions' floats: weights / total)."""
        centre = int(self.centre_ticks([value])[0])
        weights = np.full(self.ticks, self.floor, dtype=object)
        for j in range(-(self.half - 1), self.half):
            weights[centre + j] += self.slope * (self.half - abs(j))
        total = self.ticks * self.floor + self.slope * self.half * self.half
        return np.array([Fraction(int(w), total) for w in weights], dtype=object)

    def mean_output(self, value: float) -> float:
        probabilities = self.pmf(value).astype(np.float64)
        return float(probabilities @ self.tick_values(np.arange(self.ticks)))

    def variance(self, value: float) -> float:
        probabilities = self.pmf(value).astype(np.float64)
        values = self.tick_values(np.arange(self.ticks))
        mean = probabilities @ values
        return float(probabilities @ (values - mean) ** 2)

    # -- reports --------------------------------------------------------------------------
    def perturb_codes(self, values: Any, rng: Any = None) -> np.ndarray:
        """The reported ticks (uint32)."""
        centres = self.centre_ticks(np.asarray(values, dtype=np.float64).reshape(-1))
        out = np.zeros(centres.size, dtype=np.uint32)
        source, done = as_random_source(rng), 0
        while done < centres.size:
            words = source.words(centres.size - done + 16)
            finished, _ = _tent_ticks(centres[done:], words, np.uint64(self.floor),
                                      np.uint64(self.slope), self.ticks, self.half,
                                      out[done:])
            done += finished
        return out

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        return self.tick_values(self.perturb_codes(values, rng))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "low": self.low,
                "high": self.high, "grid_bits": self.grid_bits}
