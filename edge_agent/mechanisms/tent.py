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

**Exact sampling.**  The output is T = 2**grid_bits ticks, the grid's cells (the report
is the tick).  Each tick has weight F; the tent adds E (A - |j|) at offset j from its
centre tick, |j| < A, A = T / (2η) ticks (rounded; at least 1, a tent of one tick on a
coarse grid, and at most T / 2).  The tent's weights are drawn as the sum of two uniform
integers in [0, A) (their sum has exactly that triangular law), the floor as one uniform
tick, from the top 53 bits of a CSPRNG word against T F + E A^2 <= 2**53; a word beyond
that is drawn again (with the same probability for every input, so the number of draws
reveals nothing).  The worst ratio of a tick's weight across inputs is at most
(F + E A) / F, chosen at most e^ε; ``exact_privacy_loss`` takes the exact one.

**The tent's centre.**  An input's centre is a real tick position c(x), affine from
A - 1 (x = low) to T - A (x = high), and the tent is centred on the tick below it or the
one above: the upper with probability frac(c(x)), decided by a second word.  Rounding
c(x) to a tick instead (as this sampler first did) made E[M(x)] a staircase, off by up to
half a step of the centre: 1 / (2 (T - 2A + 1)) of the domain's width, at grid_bits = 8
and ε = 1 0.37%, a bias that no number of reports averages away and that exceeds the
standard error of a fleet's mean from some 2.4 10^5 reports on (at 10 bits 3.8 10^6).
With the randomized centre E[centre] = c(x) exactly (the kernel works with c(x) + 1 >= 1,
whose fraction is a multiple of 2**-52, so the second word's 53 bits compare against
exactly that fraction), and the mean report is exactly affine in the input: x itself, the
mechanism is unbiased on the whole domain.  The variance grows by at most a quarter of a
squared tick times the tent's share, and the privacy loss does not change: every tick's
weight is an interpolation of its weights under the two neighbouring integer centres, so
it stays between them.  The cost is the second word, drawn whenever the tent is (with
the same probability for every input again).

The closed forms (``pdf``, ``cdf``, ``mean_output``, ``variance``, ``expected_error``)
are those of this discrete mechanism, the one reported: like Duchi's atoms, ``pdf`` is a
probability mass (at a tick's value, 0 elsewhere) and ``cdf`` a step function.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numba import njit

from edge_agent.mechanisms import _validate
from edge_agent.mechanisms._layout import TOTAL_BITS, ratio_within
from edge_agent.mechanisms.base import ExactLoss, Mechanism, golden_minimum
from edge_agent.mechanisms.randomness import RandomSource

TOTAL = 1 << TOTAL_BITS
_SHIFT = np.uint64(64 - TOTAL_BITS)
# Words one report may take in its last attempt: the tick's, and the centre's.
_ATTEMPT_WORDS = 2
# Values of x at once in the sums over every tick (``expected_error`` for p != 2).
_ROWS_PER_BLOCK = 64


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


def tent_weights(epsilon: float, ticks: int, half: int) -> tuple[int, int]:
    """(F, E) with (F + E A) / F <= e^ε exactly and T F + E A^2 <= 2**53: E as large as the
    floor weight with room for the tent allows, then F the least for that E, so that the
    loss falls short of ε by about 1 / F (E itself is an integer: the largest F would
    spend ε only up to 1 / E, 2.5e-6 of it at ε = 0.05 and grid_bits = 16)."""
    grown = math.expm1(epsilon)
    room = int(TOTAL / (ticks + grown * half))  # F (T + (e^ε - 1) A) <= 2**53
    for slope in range(max(1, int(grown * room / half)), 0, -1):
        floor = max(1, math.ceil(slope * half / grown))
        while floor > 1 and ratio_within(floor - 1 + slope * half, floor - 1, epsilon):
            floor -= 1
        while not ratio_within(floor + slope * half, floor, epsilon):
            floor += 1
        # E A <= (e^ε - 1) F: the tent fits beside T F, unless a float above rounded the
        # wrong way; then one step less.
        if ticks * floor + slope * half * half <= TOTAL:
            return floor, slope
    raise ValueError(f"epsilon: {epsilon:g} is too small for II-PTT at "
                     f"{ticks.bit_length() - 1} grid bits")


def tent_heights(offsets: Any, half: int) -> np.ndarray:
    """The tent's height A - |j| at offset j from its centre tick, 0 beyond (int64)."""
    return np.maximum(half - np.abs(np.asarray(offsets, dtype=np.int64)), 0)


def tent_below(offsets: Any, half: int) -> np.ndarray:
    """The tent's heights summed over the offsets below each of ``offsets`` (int64):
    0 up to -(A - 1), A^2 from A on, the triangular numbers between."""
    m = np.clip(np.asarray(offsets, dtype=np.int64), 1 - half, half)
    return np.where(m <= 0, (half + m - 1) * (half + m) // 2,
                    half * half - (half - m) * (half - m + 1) // 2)


@njit(cache=True, nogil=True, boundscheck=False)
def _tent_linear(x, words, out, start, value_origin, value_step, low, high, scale, lowest,
                 highest, floor, slope, ticks, half):
    """Perturb ``x[start:]`` until fewer words remain than an attempt may take: returns
    (the index reached, the words used, non-finite count, clipped count) of the values
    done.  The words are used in order and only when read, so the caller resumes at the
    index reached with the unused words first.  ``out`` as for ``_kernels.tpm_linear``:
    ``value_origin + tick * value_step``, codes or values."""
    flat = np.uint64(ticks) * floor
    accept = flat + slope * np.uint64(half) * np.uint64(half)
    exact = np.float64(1 << 53)
    bad, clipped, used = 0, 0, 0
    for i in range(start, x.shape[0]):
        v = x[i]
        finite = math.isfinite(v)
        c = min(max(v, low), high) if finite else low
        # One tick above the centre's position: >= 1, so its fraction is a multiple of
        # 2**-52 and the comparison below is with exactly that fraction.
        lifted = min(max((c - low) * scale + lowest, lowest), highest)
        below = math.floor(lifted)
        up = np.uint64((lifted - below) * exact)
        while True:
            if used + _ATTEMPT_WORDS > words.shape[0]:
                return i, used, bad, clipped
            r = words[used] >> _SHIFT
            used += 1
            if r < accept:
                break
        if r < flat:
            tick = np.int64(r // floor)
        else:
            u = np.int64((r - flat) // slope)  # uniform on [0, A^2)
            tick = np.int64(below) - half + u // half + u % half
            tick += np.int64((words[used] >> _SHIFT) < up)
            used += 1
        out[i] = value_origin + tick * value_step
        bad += not finite
        clipped += finite and c != v
    return x.shape[0], used, bad, clipped


class TypeIIPTT(Mechanism):
    """II-PTT on [low, high] (OPTT Theorem 6 with the η of least worst-case variance),
    unbiased: E[M(x)] = x on the whole domain.  Its ticks are the grid's cells."""

    name = "ii-ptt"
    unbiased = True

    def __init__(self, *, epsilon: float, low: float, high: float, grid_bits: int = 16):
        self.epsilon = _validate.epsilon(epsilon)
        self.low, self.high = _validate.interval(low, high)
        self.grid_bits = _validate.grid_bits(grid_bits)
        self.eta = optimal_eta(self.epsilon)
        ticks = self.ticks = self.n_cells
        half = self.half = min(ticks // 2, max(1, round(ticks / (2 * self.eta))))
        self.floor, self.slope = tent_weights(self.epsilon, ticks, half)
        self.total = ticks * self.floor + self.slope * half * half
        self.tent_share = Fraction(self.slope * half * half, self.total)  # P[tent drawn]
        share = float(self.tent_share)
        # The discrete k: the tent's centre value on [-1, 1] is k x, so E = share k x = x.
        self.k = 1.0 / share
        # Centre positions: A - 1 at low, T - A at high, so the tent stays on the grid.
        self.first, self.last = half - 1, ticks - half
        self._scale = (self.last - self.first) / (self.high - self.low)
        # E[M(x)] - mid = cell * share * (c(x) - (T - 1) / 2) = cell * share * scale *
        # (x - mid): a cell of 1 / (share * scale) makes it x - mid.
        cell = (self.high - self.low) / (share * (self.last - self.first))
        mid = 0.5 * self.low + 0.5 * self.high
        self.output_low, self.output_high = mid - 0.5 * ticks * cell, mid + 0.5 * ticks * cell
        _validate.output_domain("low, high", f"[{self.low:g}, {self.high:g}]", self.epsilon,
                                cell, self.output_low, self.output_high,
                                self.output_high - self.output_low)
        self._kernel_args = (float(self.low), float(self.high), float(self._scale),
                             float(self.first + 1), float(self.last + 1), np.uint64(self.floor),
                             np.uint64(self.slope), int(ticks), int(half))
        # Words a value takes on average: 1 / P[accept] attempts, a second when the tent
        # is drawn; what a batch asks for at once (a little more, rarely a refill).
        self._words_per_value = 1.02 * (1.0 + share) * TOTAL / self.total

    # -- where the tent sits ----------------------------------------------------------------
    def centre_positions(self, x: Any) -> np.ndarray:
        """The tent's centre c(x) in ticks, exactly as the kernel has it: the tick below
        it, or the one above with probability its fraction.  (The kernel works with
        c(x) + 1 >= 1, whose fraction it can compare exactly; subtracting 1 is exact.)"""
        return self._lifted(x) - 1.0

    def _lifted(self, x: Any) -> np.ndarray:
        c = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        lowest, highest = self.first + 1, self.last + 1
        return np.clip((c - self.low) * self._scale + lowest, lowest, highest)

    def _centre(self, x: Any) -> tuple[np.ndarray, np.ndarray]:
        """(the tick below c(x), P[the tick above])."""
        lifted = self._lifted(x)
        below = np.floor(lifted)
        return below.astype(np.int64) - 1, lifted - below

    def _mixed(self, pieces, n: np.ndarray, centre: np.ndarray, up: np.ndarray) -> np.ndarray:
        """``pieces`` (the tent's heights, or its heights below) at ticks ``n``, mixed over
        the two centres: h0 + up (h1 - h0), so that the whole tent's A^2 stays exact."""
        lower = pieces(n - centre, self.half).astype(np.float64)
        upper = pieces(n - centre - 1, self.half).astype(np.float64)
        return lower + up * (upper - lower)

    # -- the exact mechanism -----------------------------------------------------------------
    def grid_pmf(self, x: Any) -> np.ndarray:
        centre, up = self._centre(x)
        ticks = np.arange(self.ticks, dtype=np.int64)
        tent = self._mixed(tent_heights, ticks, centre[..., None], up[..., None])
        return (self.floor + self.slope * tent) / self.total

    def exact_privacy_loss(self) -> ExactLoss:
        """max over ticks t of (F + E max_c h(t - c)) / (F + E min_c h(t - c)) over the
        reachable integer centres c in [A - 1, T - A]: a tick's weight under a centre
        between two of them is an interpolation of theirs, so these are its extremes."""
        ticks = np.arange(self.ticks, dtype=np.int64)
        near = np.maximum(np.maximum(self.first - ticks, ticks - self.last), 0)
        far = np.maximum(ticks - self.first, self.last - ticks)
        high = self.floor + self.slope * tent_heights(near, self.half)
        low = self.floor + self.slope * tent_heights(far, self.half)
        # Floats find the contenders; Python integers pick the exact maximum.
        ratio = high / low
        contenders = np.flatnonzero(ratio >= ratio.max() * (1 - 1e-9))
        return ExactLoss(max(Fraction(int(high[t]), int(low[t])) for t in contenders))

    def _sample(self, x: np.ndarray, source: RandomSource, as_values: bool):
        out = self._output(x, as_values)
        origin, step = self.grid_values if as_values else (0, 1)
        done, bad, clipped = 0, 0, 0
        words = source.words(int(x.shape[0] * self._words_per_value) + 16)
        while True:
            done, used, b, c = _tent_linear(x, words, out, done, origin, step,
                                            *self._kernel_args)
            bad, clipped = bad + b, clipped + c
            if done == x.shape[0]:
                return out, bad, clipped
            # The unused words first: the value where it stopped has read none of them.
            fresh = source.words(int((x.shape[0] - done) * self._words_per_value) + 16)
            words = np.concatenate([words[used:], fresh])

    # -- closed forms of the reported ticks --------------------------------------------------
    def _tick_moments(self, x: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x clipped, E[tick], Var[tick]): a mixture of the uniform floor (mean (T-1)/2,
        variance (T^2-1)/12) and the tent: c(x) plus the triangle (two uniforms on [0, A),
        variance (A^2-1)/6) plus the centre's coin (variance f (1 - f))."""
        share = float(self.tent_share)
        centre, up = self._centre(x)
        position = centre + up
        middle = (self.ticks - 1) / 2.0
        mean = middle + share * (position - middle)
        variance = ((1.0 - share) * (self.ticks ** 2 - 1) / 12.0
                    + share * ((self.half ** 2 - 1) / 6.0 + up * (1.0 - up))
                    + share * (1.0 - share) * (position - middle) ** 2)
        return np.clip(np.asarray(x, dtype=np.float64), self.low, self.high), mean, variance

    def mean_output(self, x: Any) -> np.ndarray:
        """E[M(x)] of the reported values: x (up to the floats' rounding)."""
        origin, step = self.grid_values
        return origin + step * self._tick_moments(x)[1]

    def affine_mean(self) -> tuple[float, float, float, float]:
        return 1.0, 0.0, self.low, self.high  # unbiased on the whole domain

    def variance(self, x: Any) -> np.ndarray:
        return self.grid_values[1] ** 2 * self._tick_moments(x)[2]

    def expected_error(self, x: Any, p: int = 2) -> np.ndarray:
        p = _validate.error_power(p)
        if p == 2:
            x, mean, variance = self._tick_moments(x)
            origin, step = self.grid_values
            return step ** 2 * variance + (origin + step * mean - x) ** 2
        # Other powers: the sum over every tick, a block of inputs at a time.
        x = np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)
        flat = x.reshape(-1)
        values = self.from_codes(np.arange(self.ticks))
        out = np.empty(flat.size)
        for start in range(0, flat.size, _ROWS_PER_BLOCK):
            rows = flat[start:start + _ROWS_PER_BLOCK]
            out[start:start + rows.size] = (self.grid_pmf(rows)
                                            * np.abs(values - rows[:, None]) ** p).sum(axis=1)
        return out.reshape(x.shape)

    def _ticks_at_most(self, y: Any) -> np.ndarray:
        """How many ticks report a value <= y (the values exactly as ``from_codes``)."""
        origin, step = self.grid_values
        y = np.asarray(y, dtype=np.float64)
        n = np.clip(np.floor((y - origin) / step) + 1.0, 0, self.ticks).astype(np.int64)
        # The division rounds: settle the ticks next to y on their values.
        n = n + ((n < self.ticks) & (origin + n * step <= y))
        return n - ((n > 0) & (origin + (n - 1) * step > y))

    def cdf(self, x: Any, y: Any) -> np.ndarray:
        """P[M(x) <= y]: a step at every tick's value."""
        centre, up = self._centre(x)
        n = self._ticks_at_most(y)
        return (self.floor * n + self.slope * self._mixed(tent_below, n, centre, up)) / \
            self.total

    def pdf(self, x: Any, y: Any) -> np.ndarray:
        """P[M(x) = y]: a probability mass, at the ticks' values (0 elsewhere)."""
        centre, up = self._centre(x)
        n = self._ticks_at_most(y)
        origin, step = self.grid_values
        on_tick = (n > 0) & (origin + (n - 1) * step == np.asarray(y, dtype=np.float64))
        mass = (self.floor + self.slope * self._mixed(tent_heights, n - 1, centre, up)) / \
            self.total
        return np.where(on_tick, mass, 0.0)
