"""Categorical frequency oracles under pure ε-LDP, sampled exactly.

A value is one of ``categories`` categories, numbered 0..k-1.  Each oracle
reports something that *supports* some categories; a collector counts, per
category, the reports supporting it and inverts the support probabilities:

    f_v = (C_v / n - q) / (p - q),    p = P[supports v | v],  q = P[supports v | u != v]

(Wang, Blocki, Li, Jha, "Locally differentially private protocols for frequency
estimation", USENIX Security 2017, Eq. 1; the (ε,δ) versions are Section 5 of
``papers/003``).  The variance of that estimate from n reports is

    Var[f_v] = (f_v p (1 - p) + (1 - f_v) q (1 - q)) / (n (p - q)^2).

* **GRR** (generalized randomized response): report v with probability
  p = e^ε / (e^ε + k - 1), each other category with q = 1 / (e^ε + k - 1).
* **OUE** (optimized unary encoding): k bits, the value's bit 1 with p = 1/2,
  every other bit 1 with q = 1 / (e^ε + 1).
* **OLH** (optimized local hashing): hash the value into g = round(e^ε) + 1
  buckets with a keyed hash whose seed is drawn per value and reported, then
  GRR over the g buckets; a report supports every category that hashes to its
  bucket, so q = 1/g (to within g / 2**32, the hash's uniformity).

Exactness, as for the numeric mechanisms: the irrational probabilities above
become integer weights out of 2**53 (``TOTAL``), chosen so that the worst ratio
of output probabilities is at most e^ε, decided exactly, and the top 53 bits of
one CSPRNG word per decision pick the outcome with no rejection.  The privacy
loss is computed from those integers.  The estimators use the exact p and q.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from . import _categorical, _validate
from ._layout import TOTAL_BITS, ratio_within
from .base import ExactLoss
from .randomness import as_random_source

TOTAL = 1 << TOTAL_BITS
MAX_CATEGORIES = 1 << 16
MAX_UNARY_CATEGORIES = 1 << 10  # OUE sends k bits per value


def _other_weight(epsilon: float, outputs: int) -> int:
    """The least F with K / F <= e^ε, K = 2**53 - (outputs - 1) F: one output kept with
    K, each of the others drawn with F (F >= 2**53 / (e^ε + outputs - 1))."""
    with localcontext() as ctx:
        ctx.prec = 80
        bound = Decimal(TOTAL) / (Decimal(epsilon).exp() + outputs - 1)
        weight = int((bound * (1 + Decimal(10) ** -70)).to_integral_value(ROUND_CEILING))
    while not ratio_within(TOTAL - (outputs - 1) * weight, weight, epsilon):
        weight += 1  # never runs: the guard above is the proof
    return weight


def _categories(value: object, maximum: int = MAX_CATEGORIES) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"categories must be an integer, got {type(value).__name__}")
    if not 2 <= value <= maximum:
        raise ValueError(f"categories: must be in [2, {maximum}], got {value}")
    return int(value)


def as_categories(values: Any, categories: int) -> np.ndarray:
    """A 1-D int64 array of category numbers in [0, categories), or TypeError/ValueError."""
    array = np.asarray(values)
    if array.dtype.kind not in "iu":
        raise TypeError(f"values must be integer category numbers, got dtype {array.dtype}")
    array = np.ascontiguousarray(array.reshape(-1), dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= categories):
        raise ValueError(f"values must be category numbers in [0, {categories - 1}]")
    return array


class FrequencyOracle(ABC):
    """What every oracle offers: support probabilities, the estimator and its variance,
    the exact privacy loss."""

    name: ClassVar[str]

    def __init__(self, *, epsilon: float, categories: int):
        self.epsilon = _validate.epsilon(epsilon)
        self.categories = _categories(categories, self.max_categories)

    max_categories: ClassVar[int] = MAX_CATEGORIES

    @property
    @abstractmethod
    def support_probabilities(self) -> tuple[Fraction, Fraction]:
        """(p, q): P[a report supports v | value v], P[... | another value], exactly."""

    @abstractmethod
    def exact_privacy_loss(self) -> ExactLoss:
        """max over values u, v and outputs y of ln(P[y | u] / P[y | v]), exactly."""

    def privacy_loss(self) -> float:
        return float(self.exact_privacy_loss())

    @abstractmethod
    def perturb(self, values: Any, rng: Any = None):
        """The reports of category numbers ``values`` (``rng`` None: the OS CSPRNG)."""

    @abstractmethod
    def support(self, reports) -> np.ndarray:
        """C_v: how many of ``reports`` (as ``perturb`` returns them) support each v."""

    # -- estimation -----------------------------------------------------------------------
    def estimate(self, counts: Any, n: int) -> np.ndarray:
        """Unbiased frequencies from the support counts of ``n`` reports (they may be
        negative or sum to other than 1: consistency is the collector's step)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"n: must be a positive integer, got {n!r}")
        p, q = (float(x) for x in self.support_probabilities)
        return (np.asarray(counts, dtype=np.float64) / n - q) / (p - q)

    def variance(self, frequencies: Any, n: int) -> np.ndarray:
        """Var of ``estimate`` for true frequencies ``frequencies`` and n reports."""
        p, q = (float(x) for x in self.support_probabilities)
        f = np.asarray(frequencies, dtype=np.float64)
        return (f * p * (1 - p) + (1 - f) * q * (1 - q)) / (n * (p - q) ** 2)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "categories": self.categories}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon!r}, categories={self.categories})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.describe() == self.describe()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.describe().items()))))


class _RandomizedResponseOver(FrequencyOracle):
    """GRR over ``outputs`` values: kept with weight K, each other value with F."""

    def _weights(self, outputs: int) -> None:
        self.other_weight = _other_weight(self.epsilon, outputs)
        self.keep_weight = TOTAL - (outputs - 1) * self.other_weight

    def exact_privacy_loss(self) -> ExactLoss:
        return ExactLoss(Fraction(self.keep_weight, self.other_weight))

    def _respond(self, values: np.ndarray, rng: Any) -> np.ndarray:
        out = np.empty(values.size, dtype=np.uint32)
        words = as_random_source(rng).words(values.size)
        _categorical.grr_codes(values, words, np.uint64(self.keep_weight),
                               np.uint64(self.other_weight), out)
        return out


class GeneralizedRR(_RandomizedResponseOver):
    """k-ary randomized response: the report is a category."""

    name = "grr"

    def __init__(self, *, epsilon: float, categories: int):
        super().__init__(epsilon=epsilon, categories=categories)
        self._weights(self.categories)

    @property
    def support_probabilities(self) -> tuple[Fraction, Fraction]:
        return Fraction(self.keep_weight, TOTAL), Fraction(self.other_weight, TOTAL)

    def pmf(self, value: int) -> list[Fraction]:
        """P[report = y | value] for every y, exactly."""
        p, q = self.support_probabilities
        return [p if y == value else q for y in range(self.categories)]

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        return self._respond(as_categories(values, self.categories), rng)

    def support(self, reports) -> np.ndarray:
        codes = as_categories(reports, self.categories)
        return np.bincount(codes, minlength=self.categories)


class OptimizedUnaryEncoding(FrequencyOracle):
    """k bits per value: its own bit 1 with probability 1/2, every other 1 with q."""

    name = "oue"
    max_categories = MAX_UNARY_CATEGORIES

    def __init__(self, *, epsilon: float, categories: int):
        super().__init__(epsilon=epsilon, categories=categories)
        self.one_own = TOTAL // 2
        # (1 - q) / q <= e^ε: binary randomized response's weight (F of 2**53).
        self.one_other = _other_weight(self.epsilon, 2)

    @property
    def support_probabilities(self) -> tuple[Fraction, Fraction]:
        return Fraction(self.one_own, TOTAL), Fraction(self.one_other, TOTAL)

    def exact_privacy_loss(self) -> ExactLoss:
        """Two values differ in two bits: the worst ratio is p (1 - q) / ((1 - p) q)."""
        p, q = self.support_probabilities
        return ExactLoss(p * (1 - q) / ((1 - p) * q))

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        """An (n, k) array of bits (uint8)."""
        values = as_categories(values, self.categories)
        out = np.empty((values.size, self.categories), dtype=np.uint8)
        words = as_random_source(rng).words(out.size)
        _categorical.unary_bits(values, words, np.uint64(self.one_own),
                                np.uint64(self.one_other), out)
        return out

    def support(self, reports) -> np.ndarray:
        bits = np.asarray(reports)
        if bits.ndim != 2 or bits.shape[1] != self.categories:
            raise ValueError(f"reports must be an (n, {self.categories}) array of bits")
        return bits.sum(axis=0, dtype=np.int64)


def optimal_buckets(epsilon: float) -> int:
    """OLH's g: e^ε + 1 minimises the variance (Wang et al. 2017, Sec. 4.4), rounded."""
    return max(2, round(math.exp(epsilon)) + 1)


class OptimizedLocalHashing(_RandomizedResponseOver):
    """A keyed hash into g buckets (seed drawn per value and reported), then GRR over g."""

    name = "olh"

    def __init__(self, *, epsilon: float, categories: int):
        super().__init__(epsilon=epsilon, categories=categories)
        self.buckets = optimal_buckets(self.epsilon)
        self._weights(self.buckets)

    @property
    def support_probabilities(self) -> tuple[Fraction, Fraction]:
        """q = 1/g: another category hashes to the reported bucket with probability 1/g
        over the seed (to within g / 2**32)."""
        return Fraction(self.keep_weight, TOTAL), Fraction(1, self.buckets)

    def perturb(self, values: Any, rng: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(seeds, buckets): uint32 each, one per value."""
        values = as_categories(values, self.categories)
        source = as_random_source(rng)
        seeds = (source.words(values.size) >> np.uint64(32)).astype(np.uint32)
        hashed = np.empty(values.size, dtype=np.int64)
        _categorical.hashed_values(seeds, values, self.buckets, hashed)
        return seeds, self._respond(hashed, source)

    def support(self, reports) -> np.ndarray:
        seeds, codes = (np.ascontiguousarray(np.asarray(r).reshape(-1)) for r in reports)
        if seeds.shape != codes.shape:
            raise ValueError("reports: as many seeds as buckets")
        if codes.size and codes.max() >= self.buckets:
            raise ValueError(f"reports: buckets must be in [0, {self.buckets - 1}]")
        counts = np.zeros(self.categories, dtype=np.int64)
        _categorical.support_counts(seeds.astype(np.uint32), codes.astype(np.uint32),
                                    self.buckets, counts)
        return counts


ORACLES = {cls.name: cls for cls in (GeneralizedRR, OptimizedUnaryEncoding,
                                      OptimizedLocalHashing)}


def best_oracle(*, epsilon: float, categories: int) -> str:
    """The oracle of least variance for rare categories (f -> 0), GRR or OLH (OUE has
    OLH's variance in k bits per value): GRR for small domains, OLH for large ones
    (Wang et al. 2017: GRR while k < 3 e^ε + 2)."""
    variance = {name: ORACLES[name](epsilon=epsilon, categories=categories).variance(0.0, 1)
                for name in ("grr", "olh")}
    return min(variance, key=variance.get)
