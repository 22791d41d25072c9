"""Categorical frequency oracles under pure ε-LDP, sampled exactly.

A value is one of ``categories`` categories, numbered 0..k-1.  Each oracle
reports something that *supports* some categories; a collector counts, per
category, the reports supporting it and inverts the support probabilities:

    f_v = (C_v / n - q) / (p - q),    p = P[supports v | v],  q = P[supports v | u != v]

(Wang, Blocki, Li, Jha, "Locally differentially private protocols for frequency
estimation", USENIX Security 2017, Eq. 1; the (ε,δ) versions are Section 5 of Wang,
Zhao, Yang and Ren, "Locally Differentially Private Data Collection and Analysis",
arXiv:1906.01777).  The variance of that estimate from n reports is

    Var[f_v] = (f_v p (1 - p) + (1 - f_v) q (1 - q)) / (n (p - q)^2).

* **GRR** (generalized randomized response): report v with probability
  p = e^ε / (e^ε + k - 1), each other category with q = 1 / (e^ε + k - 1).
* **OUE** (optimized unary encoding): k bits, the value's bit 1 with p = 1/2,
  every other bit 1 with q = 1 / (e^ε + 1).
* **OLH** (optimized local hashing): hash the value into g = round(e^ε) + 1
  buckets with a keyed hash whose seed is drawn per value and reported, then
  GRR over the g buckets; a report supports every category that hashes to its
  bucket, so q = 1/g (to within g / 2**32, the hash's uniformity).
* **SUE** (symmetric unary encoding, RAPPOR's): p + q = 1.
* **L-GRR** (longitudinal GRR; RAPPOR's permanent and instantaneous randomized
  response with GRR, Arcolezi et al., "Improving the utility of locally differentially
  private protocols for longitudinal and multidimensional frequency estimates", 2022):
  each value is *memoized* once, B(v) = GRR at ``memo_epsilon`` (kept by the agent for
  good), and every report is GRR at ``epsilon`` of the memo.  A report is then GRR with
  p = p1 p2 + (1 - p1) q2 and q = q1 p2 + (1 - q1) q2 (1 and 2: the two layers).

**(ε,δ)** (``delta`` > 0; Wang et al. arXiv:1906.01777 Section 5): GRR-ALDP (Eq. 45), PRR-ALDP as
OUE with δ (Eqs. 47-50), SPRR-ALDP as SUE with δ (Eq. 51), OLH-ALDP (Eqs. 54-57).
For every one of them the paper's per-output condition is also the standard one
(the largest hockey-stick divergence has one exceeding output, or one exceeding
pair of bits), and ``exact_delta`` computes it from the integer weights.  δ = 0
gives the pure ε-LDP oracles.

Exactness, as for the numeric mechanisms: the irrational probabilities above
become integer weights out of 2**53 (``TOTAL``), chosen so that the worst ratio
of output probabilities is at most e^ε, decided exactly, and the top 53 bits of
one CSPRNG word per decision pick the outcome with no rejection.  The privacy
loss is computed from those integers.  The estimators use the exact p and q.
"""

from __future__ import annotations

import math
import numbers
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from edge_agent.mechanisms import _categorical, _validate
from edge_agent.mechanisms._layout import TOTAL_BITS, ratio_within
from edge_agent.mechanisms.base import ExactLoss, golden_minimum
from edge_agent.mechanisms.randomness import as_random_source

TOTAL = 1 << TOTAL_BITS
MAX_CATEGORIES = 1 << 16
MAX_UNARY_CATEGORIES = 1 << 10  # OUE sends k bits per value
MAX_LABELS = 1 << 10
# A category label: 1-40 characters, none of them a control character or a brace (a
# collector refuses a report whose braces do not pair up before decoding it:
# edge_agent.protocol.reports._braces_pair_up).
LABEL = re.compile(r"[^\x00-\x1f\x7f-\x9f{}]{1,40}")
# A unit of measurement ("g", "m/s²", "°C", "bpm"): free text of 1-16 such characters.
UNIT = re.compile(r"[^\x00-\x1f\x7f-\x9f{}]{1,16}")


def _within_delta(excess_numerator: int, epsilon_weight: int, denominator: int,
                  epsilon: float, delta: Fraction) -> bool:
    """Exactly decide (excess_numerator - e^ε epsilon_weight) / denominator <= δ (80
    digits; the 1e-60 guard only ever errs towards refusing)."""
    excess = _excess(excess_numerator, epsilon_weight, denominator, epsilon)
    with localcontext() as ctx:
        ctx.prec = 80
        return excess * (1 + Decimal(10) ** -60) + Decimal(10) ** -70 <= \
            Decimal(delta.numerator) / Decimal(delta.denominator)


def _excess(excess_numerator: int, epsilon_weight: int, denominator: int,
            epsilon: float) -> Decimal:
    """max(0, (excess_numerator - e^ε epsilon_weight) / denominator), to 80 digits."""
    with localcontext() as ctx:
        ctx.prec = 80
        value = (Decimal(excess_numerator) - Decimal(epsilon).exp() * epsilon_weight) / \
            Decimal(denominator)
        return max(Decimal(0), value)


def grr_other_weight(epsilon: float, outputs: int, delta: Fraction = Fraction(0)) -> int:
    """The least F for GRR over ``outputs`` values (the kept one with K = 2**53 -
    (outputs - 1) F, each other with F) whose guarantee holds exactly: K / F <= e^ε
    when δ = 0, else the hockey-stick divergence (K - e^ε F) / 2**53 <= δ.  Ideally
    F = 2**53 (1 - δ) / (e^ε + outputs - 1) (Wang et al. arXiv:1906.01777 Eq. 45)."""

    def holds(weight: int) -> bool:
        keep = TOTAL - (outputs - 1) * weight
        if delta == 0:
            return ratio_within(keep, weight, epsilon)
        return _within_delta(keep, weight, TOTAL, epsilon, delta)

    with localcontext() as ctx:
        ctx.prec = 80
        bound = Decimal(TOTAL) * (1 - Decimal(delta.numerator) / Decimal(delta.denominator)) \
            / (Decimal(epsilon).exp() + outputs - 1)
        weight = max(1, int(bound.to_integral_value(ROUND_CEILING)))
    while not holds(weight):
        weight += 1
    while weight > 1 and holds(weight - 1):
        weight -= 1
    return weight


def _categories(value: object, maximum: int = MAX_CATEGORIES) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"categories must be an integer, got {type(value).__name__}")
    if not 2 <= value <= maximum:
        raise ValueError(f"categories: must be in [2, {maximum}], got {value}")
    return int(value)


def _labels(value: object, categories: int) -> tuple[str, ...] | None:
    """Names of the categories (None: numbered): one distinct, printable string of
    1-40 characters per category, at most ``MAX_LABELS`` of them (every report carries
    them, so they stay short)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"labels must be a sequence of strings, got {type(value).__name__}")
    labels = tuple(value)
    if len(labels) != categories:
        raise ValueError(f"labels: must name each of the {categories} categories, "
                         f"got {len(labels)}")
    if categories > MAX_LABELS:
        raise ValueError(f"labels: at most {MAX_LABELS} categories can be named")
    for label in labels:
        if not isinstance(label, str):
            raise TypeError(f"labels must be strings, got {type(label).__name__}")
        if not LABEL.fullmatch(label):
            raise ValueError(f"labels: {label!r} is not 1-40 printable characters")
    if len(set(labels)) != len(labels):
        raise ValueError("labels: must be distinct")
    return labels


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
    # What a report is: "category" (one category: GRR, L-GRR), "hashed" (a seed and a
    # bucket: OLH) or "bits" (a bit per category: OUE, SUE).
    report_form: ClassVar[str]

    def __init__(self, *, epsilon: float, categories: int, delta: float = 0.0,
                 labels: Sequence[str] | None = None):
        self.epsilon = _validate.epsilon(epsilon)
        self.categories = _categories(categories, self.max_categories)
        self.delta = _validate.delta(delta)
        self.labels = _labels(labels, self.categories)

    max_categories: ClassVar[int] = MAX_CATEGORIES

    @abstractmethod
    def exact_delta(self) -> Decimal:
        """The standard δ at ε: the largest hockey-stick divergence over pairs of inputs,
        sum over outputs y of max(0, P[y|u] - e^ε P[y|v]), from the integer weights
        (80 digits).  0 when δ = 0."""

    @property
    @abstractmethod
    def support_probabilities(self) -> tuple[Fraction, Fraction]:
        """(p, q): P[a report supports v | value v], P[... | another value], exactly."""

    @abstractmethod
    def exact_privacy_loss(self) -> ExactLoss:
        """max over values u, v and outputs y of ln(P[y | u] / P[y | v]), exactly: at
        most ε when δ = 0 (with δ > 0 the guarantee is ``exact_delta`` at ε)."""

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
        described = {"name": self.name, "epsilon": self.epsilon,
                     "categories": self.categories, "delta": self.delta}
        if self.labels is not None:
            described["labels"] = self.labels
        return described

    def label(self, category: int) -> str:
        """A category's name: its label, or its number."""
        return str(category) if self.labels is None else self.labels[category]

    def __repr__(self) -> str:
        labels = "" if self.labels is None else f", labels={self.labels!r}"
        return (f"{type(self).__name__}(epsilon={self.epsilon!r}, "
                f"categories={self.categories}, delta={self.delta!r}{labels})")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.describe() == self.describe()

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.describe().items()))))


class _RandomizedResponseOver(FrequencyOracle):
    """GRR over ``outputs`` values: kept with weight K, each other value with F."""

    def _weights(self, outputs: int) -> None:
        self.other_weight = grr_other_weight(self.epsilon, outputs, Fraction(self.delta))
        self.keep_weight = TOTAL - (outputs - 1) * self.other_weight

    def exact_privacy_loss(self) -> ExactLoss:
        return ExactLoss(Fraction(self.keep_weight, self.other_weight))

    def exact_delta(self) -> Decimal:
        """Only the output that is one input's own exceeds e^ε times its probability
        under another: (K - e^ε F) / 2**53."""
        return _excess(self.keep_weight, self.other_weight, TOTAL, self.epsilon)

    def _respond(self, values: np.ndarray, rng: Any) -> np.ndarray:
        out = np.empty(values.size, dtype=np.uint32)
        words = as_random_source(rng).words(values.size)
        _categorical.grr_codes(values, words, np.uint64(self.keep_weight),
                               np.uint64(self.other_weight), out)
        return out


class GeneralizedRR(_RandomizedResponseOver):
    """k-ary randomized response: the report is a category (δ > 0: GRR-ALDP,
    Wang et al. arXiv:1906.01777 Eq. 45)."""

    name = "grr"
    report_form = "category"

    def __init__(self, *, epsilon: float, categories: int, delta: float = 0.0,
                 labels: Sequence[str] | None = None):
        super().__init__(epsilon=epsilon, categories=categories, delta=delta,
                         labels=labels)
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


class _UnaryEncoding(FrequencyOracle):
    """k bits per value: its own bit 1 with weight P (of 2**53), every other with Q."""

    max_categories = MAX_UNARY_CATEGORIES
    report_form = "bits"
    one_own: int
    one_other: int

    @property
    def support_probabilities(self) -> tuple[Fraction, Fraction]:
        return Fraction(self.one_own, TOTAL), Fraction(self.one_other, TOTAL)

    def exact_privacy_loss(self) -> ExactLoss:
        """Two values differ in two bits: the worst ratio is p (1 - q) / ((1 - p) q)."""
        p, q = self.support_probabilities
        return ExactLoss(p * (1 - q) / ((1 - p) * q))

    def exact_delta(self) -> Decimal:
        """The bits of the two values are the only ones whose distributions differ; of
        their four outcomes only (1, 0) exceeds: p (1 - q) - e^ε q (1 - p)."""
        p, q = self.one_own, self.one_other
        return _excess(p * (TOTAL - q), q * (TOTAL - p), TOTAL * TOTAL, self.epsilon)

    def _holds(self, own: int, other: int) -> bool:
        if self.delta == 0:
            return ratio_within(own * (TOTAL - other), other * (TOTAL - own), self.epsilon)
        return _within_delta(own * (TOTAL - other), other * (TOTAL - own), TOTAL * TOTAL,
                             self.epsilon, Fraction(self.delta))

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        """An (n, k) array of bits (uint8)."""
        values = as_categories(values, self.categories)
        out = np.empty((values.size, self.categories), dtype=np.uint8)
        words = as_random_source(rng).words(out.size)
        _categorical.unary_bits(values, words, np.uint64(self.one_own),
                                np.uint64(self.one_other), out)
        return out

    def support(self, reports) -> np.ndarray:
        """``reports``: an (n, k) array of bits as ``perturb`` gives them, or the sparse
        form a report message carries, (ones per value, the categories of the ones one
        after the other; each value's listed once)."""
        if isinstance(reports, tuple):
            ones, categories = (np.asarray(part).reshape(-1) for part in reports)
            if int(ones.sum()) != categories.size:
                raise ValueError("reports: the ones per value must add up to the categories")
            return np.bincount(as_categories(categories, self.categories),
                               minlength=self.categories).astype(np.int64)
        bits = np.asarray(reports)
        if bits.ndim != 2 or bits.shape[1] != self.categories:
            raise ValueError(f"reports must be an (n, {self.categories}) array of bits")
        return bits.sum(axis=0, dtype=np.int64)

    @staticmethod
    def sparse(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n, k) bits as (ones per value, the categories of the ones, row by row)."""
        rows, categories = np.nonzero(bits)
        return np.bincount(rows, minlength=bits.shape[0]).astype(np.int64), categories


def _unary_variance(q: float, epsilon: float, delta: float) -> float:
    """Wang et al. arXiv:1906.01777 Eq. 50 (per report, f -> 0) with p from Eq. 49."""
    e = math.exp(epsilon)
    return q * (1 - q) * (1 - q + q * e) ** 2 / (q * (1 - q) * (e - 1) + delta) ** 2


class OptimizedUnaryEncoding(_UnaryEncoding):
    """OUE: the own bit 1 with p, the others with q; δ = 0: p = 1/2, q = 1/(e^ε + 1)
    (Wang et al. 2017); δ > 0: PRR-ALDP (Wang et al. arXiv:1906.01777 Eqs. 47-50) with
    the q of least
    variance (Eq. 50) and the largest p that keeps the hockey-stick δ."""

    name = "oue"

    def __init__(self, *, epsilon: float, categories: int, delta: float = 0.0,
                 labels: Sequence[str] | None = None):
        super().__init__(epsilon=epsilon, categories=categories, delta=delta,
                         labels=labels)
        if self.delta == 0:
            self.one_own = TOTAL // 2
            # (1 - q) / q <= e^ε: binary randomized response's weight (F of 2**53).
            self.one_other = grr_other_weight(self.epsilon, 2)
            return
        q = golden_minimum(lambda q: _unary_variance(q, self.epsilon, self.delta),
                           1e-12, 0.5)  # the variance is unimodal in q
        self.one_other = max(1, round(q * TOTAL))
        self.one_own = _largest(lambda own: self._holds(own, self.one_other),
                                self.one_other, TOTAL - 1)


class SymmetricUnaryEncoding(_UnaryEncoding):
    """RAPPOR's symmetric choice p + q = 1 (SPRR-ALDP, Wang et al. arXiv:1906.01777 Eq. 51):
    the largest p that keeps the guarantee (δ = 0: p = e^(ε/2) / (1 + e^(ε/2)))."""

    name = "sue"

    def __init__(self, *, epsilon: float, categories: int, delta: float = 0.0,
                 labels: Sequence[str] | None = None):
        super().__init__(epsilon=epsilon, categories=categories, delta=delta,
                         labels=labels)
        self.one_own = _largest(lambda own: self._holds(own, TOTAL - own), TOTAL // 2,
                                TOTAL - 1)
        self.one_other = TOTAL - self.one_own


def _largest(holds, low: int, high: int) -> int:
    """The largest integer in [low, high] for which ``holds`` (monotone: true up to it)."""
    while low < high:
        middle = (low + high + 1) // 2
        if holds(middle):
            low = middle
        else:
            high = middle - 1
    return low


MAX_BUCKETS = 1 << 31  # the hash's range (Lemire's reduction of 32 bits)


def _hashing_variance(g: float, epsilon: float, delta: float) -> float:
    """Wang et al. arXiv:1906.01777 Eq. 56 per report:
    (e^ε + g - 1)^2 / ((g - 1)(e^ε + g δ - 1)^2)."""
    e = math.exp(epsilon)
    return (e + g - 1) ** 2 / ((g - 1) * (e + g * delta - 1) ** 2)


def optimal_buckets(epsilon: float, delta: float = 0.0) -> int:
    """OLH's g: the integer of least variance (Eq. 56); δ = 0: e^ε + 1 (Wang et al.
    2017, Sec. 4.4), rounded; δ > 0: next to the root of the cubic Eq. 57."""
    if delta == 0:
        return min(MAX_BUCKETS, max(2, round(math.exp(epsilon)) + 1))
    best = 1 + math.exp(golden_minimum(  # unimodal in log(g - 1)
        lambda t: _hashing_variance(1 + math.exp(t), epsilon, delta),
        math.log(1.0 + 1e-9), math.log(4 * math.exp(epsilon) + 8)))
    candidates = {max(2, math.floor(best)), max(2, math.ceil(best))}
    return min(MAX_BUCKETS, min(candidates, key=lambda g: _hashing_variance(g, epsilon, delta)))


class OptimizedLocalHashing(_RandomizedResponseOver):
    """A keyed hash into g buckets (seed drawn per value and reported), then GRR over g
    (δ > 0: OLH-ALDP, Wang et al. arXiv:1906.01777 Eqs. 54-57)."""

    name = "olh"
    report_form = "hashed"

    def __init__(self, *, epsilon: float, categories: int, delta: float = 0.0,
                 labels: Sequence[str] | None = None):
        super().__init__(epsilon=epsilon, categories=categories, delta=delta,
                         labels=labels)
        self.buckets = optimal_buckets(self.epsilon, self.delta)
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


class LongitudinalGRR(FrequencyOracle):
    """L-GRR (module docstring): a value's memo B(v) = GRR at ``memo_epsilon``, drawn once
    and kept (``memoize``), each report GRR at ``epsilon`` of the memo (``respond``).

    What it guarantees (docs/guides/PRIVACY.md, "Memoized categories"):

    * any n reports, whatever the values behind them and however memos are shared: at
      most n ``epsilon`` (each report passes through the instantaneous layer: every
      report's probability is between the layer's least and largest output weights
      whatever the memo, so the ratio of any transcript's probabilities under two value
      sequences is at most e^(n ε)).  ``exact_privacy_loss`` is that layer's, what the
      ledger charges per report;
    * over a wearer's whole life, about *which* values they had, given when their value
      changed: at most ``memo_epsilon`` per distinct value memoized (every report is a
      function of the memos and fresh noise; ``memo_loss`` exactly).  What it does not
      hide: reports of an unchanged value share their memo, so they link the times a
      wearer's value stayed the same.
    """

    name = "l-grr"
    report_form = "category"

    def __init__(self, *, epsilon: float, memo_epsilon: float, categories: int,
                 delta: float = 0.0, labels: Sequence[str] | None = None):
        super().__init__(epsilon=epsilon, categories=categories, delta=delta, labels=labels)
        if self.delta != 0:
            raise ValueError("delta: memoized reports are pure epsilon-LDP (0)")
        self.memo_epsilon = _validate.epsilon(memo_epsilon)
        self.permanent = GeneralizedRR(epsilon=self.memo_epsilon, categories=self.categories)
        self.instant = GeneralizedRR(epsilon=self.epsilon, categories=self.categories)

    @property
    def support_probabilities(self) -> tuple[Fraction, Fraction]:
        p1, q1 = self.permanent.support_probabilities
        p2, q2 = self.instant.support_probabilities
        return p1 * p2 + (1 - p1) * q2, q1 * p2 + (1 - q1) * q2

    def exact_privacy_loss(self) -> ExactLoss:
        """The instantaneous layer's: what any one report adds, however many share a memo."""
        return self.instant.exact_privacy_loss()

    def single_report_loss(self) -> ExactLoss:
        """What one report alone reveals: ln(p / q) of the two layers together."""
        p, q = self.support_probabilities
        return ExactLoss(p / q)

    def memo_loss(self) -> ExactLoss:
        """What a memo reveals about its value, for good (the permanent layer's)."""
        return self.permanent.exact_privacy_loss()

    def exact_delta(self) -> Decimal:
        return Decimal(0)

    def memoize(self, values: Any, rng: Any = None) -> np.ndarray:
        """Memos of category numbers ``values`` (draw once per value, then keep them)."""
        return self.permanent.perturb(values, rng)

    def respond(self, memos: Any, rng: Any = None) -> np.ndarray:
        """Reports of memos: the instantaneous layer."""
        return self.instant.perturb(memos, rng)

    def perturb(self, values: Any, rng: Any = None) -> np.ndarray:
        """Reports of values memoized afresh (one report per memo: for tests and
        simulations; an agent keeps its memos and calls ``respond``)."""
        source = as_random_source(rng)
        return self.respond(self.memoize(values, source), source)

    def pmf(self, value: int) -> list[Fraction]:
        """P[report = y | value] for every y, exactly."""
        p, q = self.support_probabilities
        return [p if y == value else q for y in range(self.categories)]

    def support(self, reports) -> np.ndarray:
        return self.instant.support(reports)

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["memo_epsilon"] = self.memo_epsilon
        return described


ORACLES = {cls.name: cls for cls in (GeneralizedRR, OptimizedUnaryEncoding,
                                      SymmetricUnaryEncoding, OptimizedLocalHashing)}
# Oracles a channel gets by other keys than ``oracle`` (memoize = true), decoded alike.
LONGITUDINAL = {LongitudinalGRR.name: LongitudinalGRR}


def best_oracle(*, epsilon: float, categories: int, delta: float = 0.0) -> str:
    """The oracle of least variance for rare categories (f -> 0), GRR or OLH (OUE has
    OLH's variance in k bits per value): GRR for small domains, OLH for large ones
    (Wang et al. 2017: GRR while k < 3 e^ε + 2)."""
    variance = {name: ORACLES[name](epsilon=epsilon, categories=categories,
                                    delta=delta).variance(0.0, 1)
                for name in ("grr", "olh")}
    return min(variance, key=variance.get)
