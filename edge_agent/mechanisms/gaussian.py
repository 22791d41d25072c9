"""Opt-GM on the output grid: the optimal Gaussian mechanism of the (ε,δ)-LDP paper
(Wang, Zhao, Yang and Ren, "Locally Differentially Private Data Collection and Analysis",
arXiv:1906.01777, Theorem 1; Balle and Wang 2018) as a discrete Gaussian.

A value in [low, high] is a point of a lattice of ``steps`` equal steps over the domain
(rounded at random to one of its two neighbours, so the rounding adds no bias); the report
is that point plus discrete-Gaussian noise N_Z(0, σ²) on the same lattice, clamped to the
``2**grid_bits`` codes, which reach ``tail`` σ beyond each end.  The noise is drawn
exactly with integer arithmetic from the CSPRNG's words (Canonne, Kamath and Steinke 2020,
Algorithm 3), with σ² = t·m cells² for integers t ≈ σ and m, so every acceptance
probability is a ratio of 64-bit integers.

σ is the analytic Gaussian's for sensitivity ``steps`` cells at (ε, δ) (the least σ whose
continuous δ is at most δ), raised until the discrete mechanism's δ is too.  ``exact_delta``
is the hockey-stick divergence of the discrete Gaussian shifted by the whole domain,
summed over its pmf: rounding mixes lattice points (the divergence is jointly convex),
clamping is post-processing, and a shorter shift diverges less, so it bounds every pair of
inputs of what is released.

Clamped to a finite grid the mechanism is also pure ε'-LDP for a larger ε'
(``exact_privacy_loss``, about 8/(σ per width) + 0.03): the ledger charges (ε, δ).
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from edge_agent.mechanisms import _kernels, _validate
from edge_agent.mechanisms.base import ExactLoss, Mechanism
from edge_agent.mechanisms.randomness import RandomSource

# Codes reach this many σ beyond each end of the domain: the clamped mass,
# P(|Z| > 8σ) < 1.3e-15, biases a mean by less than 1e-14 σ.
TAIL = 8
# Float sums of at most ~10**6 terms, each exp() within an ulp: a relative 1e-9 covers
# their rounding many times over, always upwards.
_ROUNDING = 1 + 1e-9


def _normal_cdf(t: float) -> float:
    return 0.5 * math.erfc(-t / math.sqrt(2.0))


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """δ of the continuous Gaussian mechanism with noise σ at ε (Balle and Wang 2018,
    Theorem 8): Φ(Δ/2σ - εσ/Δ) - e^ε Φ(-Δ/2σ - εσ/Δ)."""
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    return _normal_cdf(a - b) - math.exp(epsilon) * _normal_cdf(-a - b)


@lru_cache(maxsize=256)
def analytic_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Opt-GM's σ (Wang et al. arXiv:1906.01777 Theorem 1, Eq. 4; the analytic Gaussian
    mechanism): the least σ whose δ at ε is at most δ, by bisection on the exact condition
    (δ falls as σ grows)."""
    low, high = 1e-9 * sensitivity, 1e9 * sensitivity
    for _ in range(200):
        middle = math.sqrt(low * high)
        if gaussian_delta(middle, epsilon, sensitivity) > delta:
            low = middle
        else:
            high = middle
    return high


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _tail_mass(a: Any, s: float) -> np.ndarray:
    """P(N(0, s) <= a)."""
    return 0.5 * _erfc(-np.asarray(a, dtype=np.float64) / math.sqrt(2.0 * s))


def _tail_sum_upper(a: float, sigma: float) -> float:
    """An upper bound of sum_{z <= a} exp(-z**2 / 2σ²) for a <= 0 (an increasing term:
    the last term plus the integral up to a)."""
    return math.exp(-a * a / (2 * sigma * sigma)) + sigma * math.sqrt(math.pi / 2) * math.erfc(
        -a / (sigma * math.sqrt(2.0)))


def discrete_gaussian_delta(steps: int, t: int, m: int, epsilon: float) -> float:
    """δ at ε of the discrete Gaussian N_Z(0, t·m) shifted by ``steps``: the sum over z of
    max(0, p(z) - e^ε p(z - steps)), rounded up.

    The terms are positive exactly for z < steps/2 - ε t m / steps; they are summed from
    there down to 12σ below (numpy's pairwise sum), the rest bounded by a tail integral
    (below e^-72 of the first), and the normaliser
    taken as √(2π t m), which the true one exceeds (Poisson summation: it is that times
    1 + 2 Σ_k exp(-2π² t m k²))."""
    s = t * m
    sigma = math.sqrt(s)
    top = math.floor(Fraction(steps * steps - 2 * s * Fraction(epsilon), 2 * steps))
    if steps * steps - 2 * s * Fraction(epsilon) == 2 * steps * top:
        top -= 1  # the term at equality is 0
    bottom = top - math.ceil(12 * sigma)
    z = np.arange(bottom, top + 1, dtype=np.float64)
    terms = np.exp(-z * z / (2 * s)) - np.exp(epsilon - (z - steps) ** 2 / (2 * s))
    total = float(np.maximum(terms, 0.0).sum()) + _tail_sum_upper(min(bottom - 1.0, 0.0),
                                                                   sigma)
    return total / math.sqrt(2 * math.pi * s) * _ROUNDING


class OptimalGaussian(Mechanism):
    """Opt-GM as a discrete Gaussian on [low, high]'s grid ((ε, δ)-LDP)."""

    name = "opt-gm"
    unbiased = True

    def __init__(self, *, epsilon: float, delta: float, low: float, high: float,
                 grid_bits: int = 16):
        self.epsilon = _validate.epsilon(epsilon)
        self.delta = _validate.delta(delta)
        if self.delta == 0:
            raise ValueError("delta: opt-gm is (epsilon, delta)-LDP and needs delta > 0 "
                             f"(at most {_validate.DELTA_MAX:g})")
        self.low, self.high = _validate.interval(low, high)
        self.grid_bits = _validate.grid_bits(grid_bits)
        self.steps, self.t, self.m = _lattice(self.epsilon, self.delta, self.n_cells)
        self.tail_cells = (self.n_cells - 1 - self.steps) // 2
        self.step = (self.high - self.low) / self.steps
        self.output_low = self.low - (self.tail_cells + 0.5) * self.step
        self.output_high = self.output_low + self.n_cells * self.step
        _validate.output_domain("low, high", f"[{self.low:g}, {self.high:g}]", self.epsilon,
                                self.output_low, self.output_high, self.step)
        self.sigma = math.sqrt(self.t * self.m) * self.step  # in the values' unit

    # -- guarantees -------------------------------------------------------------------
    def exact_delta(self) -> Decimal:
        """δ at ε (see the module): at most the configured δ."""
        return Decimal(discrete_gaussian_delta(self.steps, self.t, self.m, self.epsilon))

    def exact_privacy_loss(self) -> ExactLoss:
        """The pure loss of the clamped codes, bounded exactly: inside the grid the ratio
        of two inputs' probabilities is at most exp(n (n + 2r - 2) / 2s) (n steps, r tail
        cells, s = σ² in cells²); the end codes hold the tails, T(r) / T(r + n) with
        T(a) = Σ_{z>=a} p(z), at most exp(n (2r + n) / 2s) E[exp(n J / s)], J the overshoot
        beyond r + n, which a geometric law of ratio exp(-x), x = (2(r + n) + 1) / 2s,
        dominates: E <= (1 - e^-x) / (1 - e^-y) <= x / (y - y²/2), y = x - n / s."""
        n, r, s = self.steps, self.tail_cells, self.t * self.m
        x = Fraction(2 * (r + n) + 1, 2 * s)
        y = x - Fraction(n, s)
        return ExactLoss(ratio=x / (y - y * y / 2), exponent=Fraction(n * (2 * r + n), 2 * s))

    # -- reports ------------------------------------------------------------------------
    def _sample(self, x: np.ndarray, source: RandomSource,
                as_values: bool) -> tuple[np.ndarray, int, int]:
        finite = np.isfinite(x)
        bad = int(x.size - np.count_nonzero(finite))
        clipped_values = np.clip(np.where(finite, x, self.low), self.low, self.high)
        clipped = int(np.count_nonzero(finite & (clipped_values != x)))
        codes = _kernels.gaussian_cells(clipped_values, source, low=self.low, step=self.step,
                                        steps=self.steps, offset=self.tail_cells,
                                        top=2 * self.tail_cells + self.steps, t=self.t,
                                        m=self.m)
        if as_values:
            origin, step = self.grid_values
            return origin + codes * step, bad, clipped
        return codes, bad, clipped

    # -- closed forms (the continuous Opt-GM with the same σ, as the paper's) -------------
    def _clip(self, x: Any) -> np.ndarray:
        return np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)

    def pdf(self, x: Any, y: Any) -> np.ndarray:
        z = (np.asarray(y, dtype=np.float64) - self._clip(x)) / self.sigma
        return np.exp(-0.5 * z * z) / (self.sigma * math.sqrt(2 * math.pi))

    def cdf(self, x: Any, y: Any) -> np.ndarray:
        return _tail_mass(np.asarray(y, dtype=np.float64) - self._clip(x), self.sigma**2)

    def mean_output(self, x: Any) -> np.ndarray:
        return self._clip(x)

    def variance(self, x: Any) -> np.ndarray:
        """σ² (the grid's random rounding adds at most step²/4: 1/(4σ²) of it with σ in
        steps, 1.5e-8 at 16 bits and ε 1, δ 1e-6; 0.14% on an 8-bit grid at δ 1e-2)."""
        return np.full(np.shape(self._clip(x)), self.sigma**2)

    def expected_error(self, x: Any, p: int = 2) -> np.ndarray:
        """E|N(0, σ²)|^p = σ^p 2^(p/2) Γ((p + 1)/2) / √π."""
        p = _validate.error_power(p)
        moment = self.sigma**p * 2 ** (p / 2) * math.gamma((p + 1) / 2) / math.sqrt(math.pi)
        return np.full(np.shape(self._clip(x)), moment)

    def affine_mean(self) -> tuple[float, float, float, float]:
        return 1.0, 0.0, self.low, self.high

    def grid_pmf(self, x: Any) -> np.ndarray:
        """Exact code probabilities: the two neighbouring lattice points' discrete
        Gaussians mixed by the rounding, the tails on the end codes."""
        position = (self._clip(x) - self.low) / self.step
        below = np.minimum(np.floor(position).astype(np.int64), self.steps)
        up = position - below
        return ((1 - up)[..., None] * self._point_pmf(below)
                + up[..., None] * self._point_pmf(np.minimum(below + 1, self.steps)))

    def _point_pmf(self, points: np.ndarray) -> np.ndarray:
        s = self.t * self.m
        norm = math.sqrt(2 * math.pi * s)
        z = (np.arange(self.n_cells) - self.tail_cells - points[..., None]).astype(np.float64)
        pmf = np.exp(-z * z / (2 * s)) / norm
        top = 2 * self.tail_cells + self.steps
        pmf[..., top + 1:] = 0.0  # an odd remainder cell above the clamp is never drawn
        # The end codes hold the tails beyond them (below 1e-14: the midpoint rule's
        # integral, which for these σ is the sum to far below a float's resolution).
        pmf[..., 0] = _tail_mass(-(self.tail_cells + points) + 0.5, s)
        pmf[..., top] = _tail_mass(-(self.tail_cells + self.steps - points) + 0.5, s)
        return pmf

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "delta": self.delta}


@lru_cache(maxsize=256)
def _lattice(epsilon: float, delta: float, n_cells: int) -> tuple[int, int, int]:
    """(steps, t, m): the most lattice steps over the domain, odd so that the clamp is
    symmetric, whose noise σ² = t·m (δ at ε at most δ) leaves TAIL σ of codes at each
    end."""
    per_step = analytic_sigma(epsilon, delta)  # σ per step of sensitivity 1
    steps = math.floor((n_cells - 1) / (1 + 2 * TAIL * per_step))
    steps -= 1 - steps % 2
    while steps >= 1:
        t, m = _noise(steps, epsilon, delta, per_step * steps)
        if (n_cells - 1 - steps) // 2 >= TAIL * math.sqrt(t * m):
            return steps, t, m
        steps -= 2
    raise ValueError(
        f"grid_bits: {n_cells.bit_length() - 1} is too coarse for opt-gm at "
        f"epsilon={epsilon:g}, delta={delta:g}: its noise (σ = {per_step:.3g} widths) and "
        f"{TAIL}σ tails need at least {math.ceil(1 + 2 * TAIL * per_step)} cells")


def _noise(steps: int, epsilon: float, delta: float, target: float) -> tuple[int, int]:
    """(t, m) with the least σ² = t·m whose discrete δ at ε is at most δ.  CKS Algorithm 3
    is fastest with t = floor(σ) + 1; σ² then moves in steps of t, which for a σ of
    a few cells is a coarse rounding, so small σ also try the smaller t (exact for any t)."""
    def fits(t: int, m: int) -> bool:
        return discrete_gaussian_delta(steps, t, m, epsilon) <= delta

    def least_m(t: int) -> int:
        # Bracket the continuous σ's m, widening by doubling, then bisect (δ falls as m
        # grows): about a dozen δ sums.
        guess = max(1, math.ceil(target * target / t))
        reach = max(1, guess // 10_000)
        if fits(t, guess):
            high, low = guess, guess - reach
            while low >= 1 and fits(t, low):
                high, low, reach = low, low - 2 * reach, 2 * reach
            low = max(low, 0)
        else:
            low, high = guess, guess + reach
            while not fits(t, high):
                low, high, reach = high, high + 2 * reach, 2 * reach
        while high - low > 1:
            middle = (low + high) // 2
            if fits(t, middle):
                high = middle
            else:
                low = middle
        return high

    fastest = math.floor(target) + 1
    candidates = range(max(1, fastest // 2), fastest + 1) if target < 64 else (fastest,)
    return min(((t, least_m(t)) for t in candidates), key=lambda tm: (tm[0] * tm[1], -tm[0]))
