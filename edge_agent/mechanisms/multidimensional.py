"""Duchi et al.'s mechanism for d-dimensional data, fixed for even d, under ε-LDP and
(ε,δ)-LDP (Wang, Zhao, Yang and Ren, "Locally Differentially Private Data Collection and
Analysis", arXiv:1906.01777: Algorithm 1 "Mechanism-1", Algorithm 4 and Appendix A).

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

**A domain.**  Both mechanisms take a domain [low, high] per axis, mapped onto [-1, 1]
(values outside it are clipped, and counted); a report's ±B is mid ± B (high - low)/2.
On the wire (``perturb_codes``) a report is one code per axis, 1 for +B and 0 for -B:
all d of them for ``DuchiVector``, the k sampled ones for ``SampledDuchi``, axis by
axis.  Each axis' codes follow one two-atom distribution (``AxisMarginal``), from
which the collector estimates the axis' mean.
"""

from __future__ import annotations

import itertools
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


class AxisMarginal:
    """The distribution of one axis' reports of a vector mechanism: two atoms,
    mid ± scale (high - low)/2, the upper one (code 1) with probability
    (1 + t / scale) / 2 for t the input mapped onto [-1, 1] (each coordinate of an
    unbiased ±B report has mean t, Wang et al. arXiv:1906.01777 Lemma 3).  The closed
    forms the collector estimates an axis with (``collector.aggregation.blocks.LinearBlock``):
    unbiased, E[M(x)] = x, Var = (scale (high - low)/2)^2 - (x - mid)^2."""

    unbiased = True
    atoms = True  # every code is an atom of its own (no cells of a continuous output)
    n_cells = 2

    def __init__(self, *, name: str, epsilon: float, low: float, high: float, scale: float):
        self.name, self.epsilon, self.low, self.high = name, epsilon, low, high
        self.scale = float(scale)
        self.mid, self.half = 0.5 * (low + high), 0.5 * (high - low)
        self.output_low = self.mid - self.scale * self.half
        self.output_high = self.mid + self.scale * self.half
        _validate.output_domain("low, high", f"[{low:g}, {high:g}]", epsilon,
                                self.output_low, self.output_high,
                                self.output_high - self.output_low)

    @property
    def grid_values(self) -> tuple[float, float]:
        """Code c stands for ``origin + c * step``: 0 the lower atom, 1 the upper."""
        return self.output_low, self.output_high - self.output_low

    def _upper(self, x: Any) -> np.ndarray:
        t = np.clip((np.asarray(x, dtype=np.float64) - self.mid) / self.half, -1.0, 1.0)
        return 0.5 + 0.5 * t / self.scale

    def pdf(self, x: Any, y: Any) -> np.ndarray:
        """The probability of the atom y (0 elsewhere)."""
        up, y = self._upper(x), np.asarray(y, dtype=np.float64)
        return np.where(y == self.output_high, up, np.where(y == self.output_low, 1.0 - up, 0.0))

    def cdf(self, x: Any, y: Any) -> np.ndarray:
        up, y = self._upper(x), np.asarray(y, dtype=np.float64)
        return np.where(y >= self.output_high, 1.0, np.where(y >= self.output_low, 1.0 - up, 0.0))

    def mean_output(self, x: Any) -> np.ndarray:
        return np.clip(np.asarray(x, dtype=np.float64), self.low, self.high)

    def affine_mean(self) -> tuple[float, float, float, float]:
        return 1.0, 0.0, self.low, self.high

    def variance(self, x: Any) -> np.ndarray:
        return (self.scale * self.half) ** 2 - (self.mean_output(x) - self.mid) ** 2


class _VectorMechanism:
    """What both vector mechanisms share: the domain [low, high] of every axis, mapped
    onto [-1, 1]; comparison by description (``mechanism_of`` caches by it)."""

    name: str
    epsilon: float
    dimensions: int
    delta: float
    low: float
    high: float

    def _set_domain(self, low: float, high: float) -> None:
        self.low, self.high = _validate.interval(low, high)
        self._mid, self._half = 0.5 * (self.low + self.high), 0.5 * (self.high - self.low)

    def _normalized(self, values: Any) -> tuple[np.ndarray, int]:
        """Tuples (n, d) in [-1, 1], and how many values lay outside [low, high]."""
        try:
            x = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"values must be numeric: {exc}") from None
        if x.ndim != 2 or x.shape[1] != self.dimensions:
            raise ValueError(f"values must be an (n, {self.dimensions}) array")
        if not np.all(np.isfinite(x)):
            raise ValueError("values must be finite")
        clipped = int(np.count_nonzero((x < self.low) | (x > self.high)))
        return np.ascontiguousarray(np.clip((x - self._mid) / self._half, -1.0, 1.0)), clipped

    @property
    def components(self) -> tuple[AxisMarginal]:
        """The scalar distribution every axis' codes follow (the same for every axis)."""
        return (self._marginal,)

    def codes_problem(self, lengths: list[int]) -> str | None:
        """Why codes of these lengths per axis cannot be one message's reports, or None."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.describe() == self.describe()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.describe().items()))))


class DuchiVector(_VectorMechanism):
    """d-dimensional tuples in [low, high]^d at (ε, δ) (δ = 0: pure ε-LDP)."""

    name = "duchi-vector"

    def __init__(self, *, epsilon: float, dimensions: int, delta: float = 0.0,
                 low: float = -1.0, high: float = 1.0):
        self.epsilon = _validate.epsilon(epsilon)
        if isinstance(dimensions, bool) or not isinstance(dimensions, numbers.Integral):
            raise TypeError(f"dimensions must be an integer, got {type(dimensions).__name__}")
        if not 1 <= dimensions <= MAX_DIMENSIONS:
            raise ValueError(f"dimensions: must be in [1, {MAX_DIMENSIONS}], got {dimensions}")
        self.dimensions = int(dimensions)
        self.delta = delta = _validate.delta(delta)
        self._set_domain(low, high)
        self.alpha_weight = _alpha_weight(self.epsilon, Fraction(delta), self.dimensions)
        self.alpha = Fraction(self.alpha_weight, TOTAL)
        plus, minus = half_spaces(self.dimensions)
        spread = math.comb(self.dimensions - 1, (self.dimensions - 1) // 2)
        self.scale = 1 / (spread * (self.alpha / plus - (1 - self.alpha) / minus))  # B
        self._marginal = AxisMarginal(name=self.name, epsilon=self.epsilon, low=self.low,
                                      high=self.high, scale=float(self.scale))

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
    def perturb_signs(self, values: Any, rng: Any = None, *, return_clipped: bool = False):
        """Sign patterns (uint64, bit j set for +B) of tuples ``values`` (n, d) in
        [low, high]^d (clipped to it)."""
        x, clipped = self._normalized(values)
        out = np.zeros(x.shape[0], dtype=np.uint64)
        source, done = as_random_source(rng), 0
        while done < x.shape[0]:
            words = source.words((x.shape[0] - done) * (self.dimensions + 5) + 64)
            done, _ = _categorical.sign_vectors(x, words, np.uint64(self.alpha_weight), out,
                                                done)
        return (out, clipped) if return_clipped else out

    def perturb_codes(self, values: Any, rng: Any = None, *, return_clipped: bool = False):
        """The wire form of tuples ``values`` (n, d): per axis, one code per tuple, 1 for
        +B and 0 for -B (uint32, shape (d, n))."""
        signs, clipped = self.perturb_signs(values, rng, return_clipped=True)
        codes = sign_bits(signs, self.dimensions)
        return (codes, clipped) if return_clipped else codes

    def codes_problem(self, lengths: list[int]) -> str | None:
        if len(set(lengths)) > 1:
            return "duchi-vector codes need one code per axis for every reading"
        return None

    def to_values(self, signs: Any) -> np.ndarray:
        """The reported tuples (n, d) of sign patterns: mid ± B (high - low)/2."""
        bits = sign_bits(np.asarray(signs, dtype=np.uint64).reshape(-1), self.dimensions).T
        return self._marginal.output_low + bits * self._marginal.grid_values[1]

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        return self.to_values(self.perturb_signs(values, rng))

    def variance(self, x: Any) -> np.ndarray:
        """Var[x*_j] = B^2 - x_j^2 on [-1, 1] (each coordinate is ±B with mean x_j),
        scaled by ((high - low)/2)^2."""
        return self._marginal.variance(x)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "dimensions": self.dimensions,
                "delta": self.delta, "low": self.low, "high": self.high}

    def __repr__(self) -> str:
        return (f"DuchiVector(epsilon={self.epsilon!r}, dimensions={self.dimensions}, "
                f"delta={self.delta!r}, low={self.low!r}, high={self.high!r})")


def sign_bits(signs: np.ndarray, d: int) -> np.ndarray:
    """Sign patterns (uint64) as codes per axis: (d, n) uint32, 1 where bit j is set."""
    shifts = np.arange(d, dtype=np.uint64)[:, None]
    return ((signs[None, :] >> shifts) & np.uint64(1)).astype(np.uint32)


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


# Wang et al. arXiv:1906.01777 Lemma 5: the per-axis epsilon that minimises the variance
LEMMA5_A = 2.17


class SampledDuchi(_VectorMechanism):
    """k of d axes per tuple, each at (ε/k, δ/k) with the one-dimensional mechanism
    (``DuchiVector`` with d = 1, Algorithm 2), scaled by d/k; the other axes report 0
    (Wang et al. arXiv:1906.01777 Algorithm 3, "Mechanism-2").  Basic composition: k
    shares, each rounded down, compose to at most (ε, δ) exactly.

    ``k`` None: the k in 1..d of least worst-case variance d/k B(ε/k, δ/k)^2, from the
    exact B (Lemma 5 gives max(1, min(d, floor(ε / 2.17))), which it agrees with up to
    the floor).

    Which axes a tuple reports is drawn apart from its values (``_categorical.
    sampled_axes``), so the wire form names them by where the codes are: per axis, the
    codes of the tuples that sampled it.  The collector averages each axis' ±B over the
    tuples that reported it: unbiased like the paper's (d/k)-scaled mean over all
    tuples (Lemma 6), with variance (d/k)(B^2 - x^2)/n instead of ((d/k) B^2 - x^2)/n."""

    name = "sampled-duchi"

    def __init__(self, *, epsilon: float, dimensions: int, delta: float = 0.0,
                 k: int | None = None, low: float = -1.0, high: float = 1.0):
        probe = DuchiVector(epsilon=epsilon, dimensions=dimensions, delta=delta, low=low,
                            high=high)
        self.epsilon, self.dimensions, self.delta = probe.epsilon, probe.dimensions, probe.delta
        self.low, self.high = probe.low, probe.high
        self._mid, self._half = probe._mid, probe._half
        if k is None:
            k = min(range(1, self.dimensions + 1), key=self._worst_variance)
        elif isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise TypeError(f"k must be an integer, got {type(k).__name__}")
        elif not 1 <= k <= self.dimensions:
            raise ValueError(f"k: must be in [1, {self.dimensions}], got {k}")
        self.k = int(k)
        self.axis = self._axis(self.k)  # on [-1, 1]: it takes the tuples mapped there
        self._marginal = AxisMarginal(name=self.name, epsilon=self.epsilon, low=self.low,
                                      high=self.high, scale=float(self.axis.scale))

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

    def pmf(self, vertex: tuple[int, ...]) -> dict[tuple[tuple[int, ...], tuple[int, ...]],
                                                   Fraction]:
        """P[(sampled axes, their signs) | x = vertex] for an extreme input (signs ±1),
        exactly: each k-subset with probability 1 / C(d, k), each sampled sign kept
        with the one-dimensional α."""
        alpha, share = self.axis.alpha, Fraction(1, math.comb(self.dimensions, self.k))
        out = {}
        for axes in itertools.combinations(range(self.dimensions), self.k):
            for signs in itertools.product((-1, 1), repeat=self.k):
                p = share
                for axis, sign in zip(axes, signs):
                    p *= alpha if sign == vertex[axis] else 1 - alpha
                out[(axes, signs)] = p
        return out

    # -- reports ----------------------------------------------------------------------------
    def sample_axes(self, n: int, rng: Any = None) -> np.ndarray:
        """Which k axes each of n tuples reports: (n, d) bool, uniformly over k-subsets."""
        return random_axes(n, self.dimensions, self.k, rng)

    def _draw(self, values: Any, rng: Any) -> tuple[np.ndarray, np.ndarray, int]:
        """(which axes each tuple sampled, (d, n) bool; the sampled axes' signs, 1 for
        +B, axis by axis and tuple by tuple within an axis; how many values were
        clipped)."""
        x, clipped = self._normalized(values)
        source = as_random_source(rng)
        chosen = self.sample_axes(x.shape[0], source).T
        signs = self.axis.perturb_signs(x.T[chosen].reshape(-1, 1), source)
        return chosen, signs.astype(np.uint32), clipped

    def perturb_codes(self, values: Any, rng: Any = None, *, return_clipped: bool = False):
        """The wire form of tuples ``values`` (n, d): per axis, the codes (1 for +B, 0 for
        -B, uint32) of the tuples that sampled it, in their order."""
        chosen, signs, clipped = self._draw(values, rng)
        codes = np.split(signs, np.cumsum(chosen.sum(axis=1))[:-1])
        return (codes, clipped) if return_clipped else codes

    def codes_problem(self, lengths: list[int]) -> str | None:
        if sum(lengths) % self.k:
            return f"sampled-duchi codes need k = {self.k} codes for every reading"
        return None

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        """The paper's tuples x* (n, d): mid ± (d/k) B (high - low)/2 on the sampled
        axes, mid on the others (Algorithm 3, line 5)."""
        chosen, signs, _ = self._draw(values, rng)
        out = np.full(chosen.shape, self._mid)
        out[chosen] = self._mid + np.where(signs == 1, 1.0, -1.0) * (
            self.dimensions / self.k * float(self.axis.scale) * self._half)
        return out.T

    def variance(self, x: Any) -> np.ndarray:
        """Var[x*_j] = d/k B^2 - x_j^2 (Eq. 37 with the exact B), scaled by
        ((high - low)/2)^2."""
        offset = np.asarray(x, dtype=np.float64) - self._mid
        return (self.dimensions / self.k * float(self.axis.scale) ** 2 * self._half ** 2
                - offset ** 2)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "dimensions": self.dimensions,
                "delta": self.delta, "k": self.k, "low": self.low, "high": self.high}

    def __repr__(self) -> str:
        return (f"SampledDuchi(epsilon={self.epsilon!r}, dimensions={self.dimensions}, "
                f"delta={self.delta!r}, k={self.k}, low={self.low!r}, high={self.high!r})")


def random_axes(n: int, d: int, k: int, rng: Any = None) -> np.ndarray:
    """k distinct axes of d for each of n readings, exactly uniformly over the k-subsets
    and apart from any value (``_categorical.sampled_axes``): (n, d) bool.  A vector
    channel's k-of-d strategy and sampled-duchi both draw with it."""
    if not 1 <= k <= d <= 64:
        raise ValueError(f"k, d: need 1 <= k <= d <= 64, got k={k}, d={d}")
    masks = np.zeros(n, dtype=np.uint64)
    order = np.empty(d, dtype=np.int64)
    source, done = as_random_source(rng), 0
    while done < n:
        words = source.words((n - done) * k + 16)
        done, _ = _categorical.sampled_axes(words, k, order, masks, done)
    return sign_bits(masks, d).T.astype(bool)
