"""Duchi et al.'s mechanism for d-dimensional data, fixed for even d, under ε-LDP and
(ε,δ)-LDP (``papers/003``: Algorithm 1 "Mechanism-1", Algorithm 4 and Appendix A).

A tuple x in [-1, 1]^d is reported as x* in {-B, B}^d: draw V in {-1, 1}^d with
P[V_j = 1] = (1 + x_j)/2, then with probability α a tuple uniformly from
T+(V) = {x*: x*·V > 0}, else uniformly from T-(V) = {x*: x*·V <= 0}.  B makes the
report unbiased.

**Even d.**  |T+| = 2^(d-1) - C(d, d/2)/2 < |T-|, so the original α = e^ε/(e^ε + 1)
(Algorithm 4) lets the ratio α|T-| / ((1-α)|T+|) exceed e^ε: it is not ε-LDP
(Appendix A.1).  The fix (A.5) is α = e^ε |T+| / (e^ε |T+| + |T-|), which makes the
worst ratio exactly e^ε for every d.

**(ε,δ).**  The paper's Eq. 24 bounds δ per output (its Eq. 5).  The standard
guarantee bounds the hockey-stick divergence, sum over outputs y of
max(0, P[y|x] - e^ε P[y|x']): for extreme inputs x' = -x that is
|T+| (α/|T+| - e^ε (1-α)/|T-|), i.e. |T+| = C_d times the per-output δ, which for
d = 10 is 386 times it.  So α here is chosen for the standard δ:

    α - e^ε (1 - α) |T+| / |T-| <= δ,   i.e.  α = (δ |T-| + e^ε |T+|) / (|T-| + e^ε |T+|),

and with δ = 0 it is the fix (A.5).  B follows from E[x*] = x exactly: with
S = C(d-1, floor((d-1)/2)) (the sum over T+ of x*·V/(dB)),

    B = 1 / (S (α / |T+| - (1 - α) / |T-|)).

α is an integer weight out of 2**53, the largest that keeps the guarantee, decided
exactly; the loss and δ are computed from it.  V_j is drawn against
floor((1 + x_j) 2**52) (unbiased to within 2**-53; V's distribution does not enter
the guarantee, which holds for any mixture over V).  Reports are the sign
patterns (bit j set for +B), d <= 62.
"""

from __future__ import annotations

import math
import numbers
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np

from edge_agent.mechanisms import _categorical, _validate
from edge_agent.mechanisms._layout import TOTAL_BITS, ratio_within
from edge_agent.mechanisms.base import ExactLoss, split_epsilon
from edge_agent.mechanisms.randomized_response import RandomizedResponse
from edge_agent.mechanisms.randomness import as_random_source

TOTAL = 1 << TOTAL_BITS
MAX_DIMENSIONS = 62


def half_spaces(d: int) -> tuple[int, int]:
    """(|T+|, |T-|): sign patterns with more agreements than disagreements, and the rest."""
    plus = sum(math.comb(d, k) for k in range(d // 2 + 1, d + 1))
    return plus, (1 << d) - plus


def hockey_stick(alpha: Fraction, d: int, epsilon: float) -> Decimal:
    """The largest hockey-stick divergence over inputs (at extreme x' = -x): the
    standard δ of the mechanism at ε, to 80 digits."""
    plus, minus = half_spaces(d)
    with localcontext() as ctx:
        ctx.prec = 80
        excess = Decimal(alpha.numerator) / Decimal(alpha.denominator) - \
            Decimal(epsilon).exp() * Decimal((1 - alpha).numerator) * plus / \
            (Decimal((1 - alpha).denominator) * minus)
        return max(Decimal(0), excess)


def _alpha_weight(epsilon: float, delta: Fraction, d: int) -> int:
    """The largest A with (ε,δ) holding for α = A / 2**53, decided exactly."""
    plus, minus = half_spaces(d)
    with localcontext() as ctx:
        ctx.prec = 80
        e = Decimal(epsilon).exp()
        dec_delta = Decimal(delta.numerator) / Decimal(delta.denominator)
        ideal = (dec_delta * minus + e * plus) / (minus + e * plus)
        weight = min(TOTAL - 1, int(ideal * TOTAL))

    def holds(a: int) -> bool:
        alpha = Fraction(a, TOTAL)
        if delta == 0:
            return ratio_within(a * minus, (TOTAL - a) * plus, epsilon)
        return hockey_stick(alpha, d, epsilon) * (1 + Decimal(10) ** -60) <= \
            Decimal(delta.numerator) / Decimal(delta.denominator)

    while not holds(weight):
        weight -= 1
    while weight + 1 < TOTAL and holds(weight + 1):
        weight += 1
    return weight


class DuchiVector:
    """d-dimensional tuples in [-1, 1]^d at (ε, δ) (δ = 0: pure ε-LDP)."""

    name = "duchi-vector"

    def __init__(self, *, epsilon: float, dimensions: int, delta: float = 0.0):
        self.epsilon = _validate.epsilon(epsilon)
        if isinstance(dimensions, bool) or not isinstance(dimensions, numbers.Integral):
            raise TypeError(f"dimensions must be an integer, got {type(dimensions).__name__}")
        if not 1 <= dimensions <= MAX_DIMENSIONS:
            raise ValueError(f"dimensions: must be in [1, {MAX_DIMENSIONS}], got {dimensions}")
        self.dimensions = int(dimensions)
        self.delta = delta = _validate.delta(delta)
        self.alpha_weight = _alpha_weight(self.epsilon, Fraction(delta), self.dimensions)
        self.alpha = Fraction(self.alpha_weight, TOTAL)
        plus, minus = half_spaces(self.dimensions)
        spread = math.comb(self.dimensions - 1, (self.dimensions - 1) // 2)
        self.scale = 1 / (spread * (self.alpha / plus - (1 - self.alpha) / minus))  # B

    # -- guarantees -------------------------------------------------------------------------
    def exact_privacy_loss(self) -> ExactLoss:
        """The worst ratio P[x*|x] / P[x*|x'] = α |T-| / ((1 - α) |T+|) (Lemma 2): at most
        e^ε when δ = 0; with δ > 0 the guarantee is ``exact_delta`` at ε instead."""
        plus, minus = half_spaces(self.dimensions)
        return ExactLoss(self.alpha * minus / ((1 - self.alpha) * plus))

    def exact_delta(self) -> Decimal:
        """The standard δ at ε (the largest hockey-stick divergence), to 80 digits."""
        return hockey_stick(self.alpha, self.dimensions, self.epsilon)

    def pmf(self, vertex: tuple[int, ...]) -> dict[tuple[int, ...], Fraction]:
        """P[sign pattern | x = vertex] for an extreme input (signs ±1), exactly."""
        plus, minus = half_spaces(self.dimensions)
        out = {}
        for pattern in _patterns(self.dimensions):
            agree = sum(a == b for a, b in zip(pattern, vertex))
            inside = 2 * agree > self.dimensions
            out[pattern] = self.alpha / plus if inside else (1 - self.alpha) / minus
        return out

    # -- reports ----------------------------------------------------------------------------
    def perturb_signs(self, values: Any, rng: Any = None) -> np.ndarray:
        """Sign patterns (uint64, bit j set for +B) of tuples ``values`` (n, d)."""
        x = np.asarray(values, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dimensions:
            raise ValueError(f"values must be an (n, {self.dimensions}) array")
        if not np.all(np.isfinite(x)):
            raise ValueError("values must be finite")
        x = np.ascontiguousarray(np.clip(x, -1.0, 1.0))
        out = np.zeros(x.shape[0], dtype=np.uint64)
        source, done = as_random_source(rng), 0
        while done < x.shape[0]:
            words = source.words((x.shape[0] - done) * (self.dimensions + 5) + 64)
            done, _ = _categorical.sign_vectors(x, words, np.uint64(self.alpha_weight), out,
                                                done)
        return out

    def to_values(self, signs: Any) -> np.ndarray:
        """The reported tuples (n, d) of sign patterns: ±B."""
        signs = np.asarray(signs, dtype=np.uint64).reshape(-1, 1)
        bits = (signs >> np.arange(self.dimensions, dtype=np.uint64)) & np.uint64(1)
        return np.where(bits == 1, float(self.scale), -float(self.scale))

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        return self.to_values(self.perturb_signs(values, rng))

    def variance(self, x: Any) -> np.ndarray:
        """Var[x*_j] = B^2 - x_j^2 (each coordinate is ±B with mean x_j)."""
        return float(self.scale) ** 2 - np.asarray(x, dtype=np.float64) ** 2

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "dimensions": self.dimensions,
                "delta": self.delta}

    def __repr__(self) -> str:
        return (f"DuchiVector(epsilon={self.epsilon!r}, dimensions={self.dimensions}, "
                f"delta={self.delta!r})")


def _patterns(d: int):
    for bits in range(1 << d):
        yield tuple(1 if (bits >> j) & 1 else -1 for j in range(d))


def original_duchi_loss(epsilon: float, dimensions: int) -> ExactLoss:
    """The loss of Algorithm 4 as published (α = e^ε / (e^ε + 1), as binary randomized
    response draws it): above ε for every even d (Appendix A.1)."""
    keep = RandomizedResponse(epsilon=epsilon).keep_probability
    plus, minus = half_spaces(dimensions)
    return ExactLoss(keep * minus / ((1 - keep) * plus))


def paper_delta_alpha(epsilon: float, delta: float, dimensions: int) -> Fraction:
    """α of the paper's Eq. 24 (δ per output), to 80 digits, as a fraction."""
    plus, minus = half_spaces(dimensions)
    with localcontext() as ctx:
        ctx.prec = 80
        e, dl = Decimal(epsilon).exp(), Decimal(delta)
        if dimensions % 2:
            alpha = (e + plus * dl) / (e + 1)
        else:
            alpha = (e * plus + dl * plus * minus) / ((e - 1) * plus + (1 << dimensions))
        return Fraction(alpha)


LEMMA5_A = 2.17  # papers/003 Lemma 5: the per-axis epsilon that minimises the variance


class SampledDuchi:
    """k of d axes per tuple, each at (ε/k, δ/k) with the one-dimensional mechanism
    (``DuchiVector`` with d = 1, Algorithm 2), scaled by d/k; the other axes report 0
    (papers/003 Algorithm 3, "Mechanism-2").  Basic composition: k shares, each rounded
    down, compose to at most (ε, δ) exactly.

    ``k`` None: the k in 1..d of least worst-case variance d/k B(ε/k, δ/k)^2, from the
    exact B (Lemma 5 gives max(1, min(d, floor(ε / 2.17))), which it agrees with up to
    the floor)."""

    name = "duchi-sampled"

    def __init__(self, *, epsilon: float, dimensions: int, delta: float = 0.0,
                 k: int | None = None):
        probe = DuchiVector(epsilon=epsilon, dimensions=dimensions, delta=delta)
        self.epsilon, self.dimensions, self.delta = probe.epsilon, probe.dimensions, probe.delta
        if k is None:
            k = min(range(1, self.dimensions + 1), key=self._worst_variance)
        elif isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise TypeError(f"k must be an integer, got {type(k).__name__}")
        elif not 1 <= k <= self.dimensions:
            raise ValueError(f"k: must be in [1, {self.dimensions}], got {k}")
        self.k = int(k)
        self.axis = self._axis(self.k)

    def _axis(self, k: int) -> DuchiVector:
        return DuchiVector(epsilon=split_epsilon(self.epsilon, k), dimensions=1,
                           delta=split_epsilon(self.delta, k))

    def _worst_variance(self, k: int) -> float:
        try:
            return self.dimensions / k * float(self._axis(k).scale) ** 2
        except ValueError:  # ε/k below the least a mechanism takes
            return math.inf

    @staticmethod
    def lemma5_k(epsilon: float, dimensions: int) -> int:
        return max(1, min(dimensions, math.floor(epsilon / LEMMA5_A)))

    def exact_privacy_loss(self) -> ExactLoss:
        """k axis reports: k times the one-dimensional loss (pure ε only when δ = 0)."""
        one = self.axis.exact_privacy_loss()
        return sum([one] * (self.k - 1), one)

    def exact_delta(self) -> Decimal:
        """Basic composition: k times the one-dimensional δ."""
        return self.k * self.axis.exact_delta()

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        x = np.asarray(values, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dimensions:
            raise ValueError(f"values must be an (n, {self.dimensions}) array")
        source = as_random_source(rng)
        n, d = x.shape
        # k distinct axes per tuple, uniformly: the k smallest of d random keys.
        keys = source.words(n * d).reshape(n, d)
        chosen = np.argsort(np.argsort(keys, axis=1), axis=1) < self.k
        out = np.zeros((n, d))
        out[chosen] = self.axis.perturb(x[chosen].reshape(-1, 1), source).ravel() * (d / self.k)
        return out

    def variance(self, x: Any) -> np.ndarray:
        """Var[x*_j] = d/k B^2 - x_j^2 (Eq. 37 with the exact B)."""
        return self.dimensions / self.k * float(self.axis.scale) ** 2 \
            - np.asarray(x, dtype=np.float64) ** 2

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "dimensions": self.dimensions,
                "delta": self.delta, "k": self.k}
