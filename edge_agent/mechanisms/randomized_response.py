"""Binary randomized response with an exact integer keep probability.

Used by range discovery (Fukuchi et al., Algorithm 2, line 4): each answer
is a sign z in {-1, +1}, kept with probability p and flipped otherwise.  The
textbook p = e^eps / (1 + e^eps) is irrational, so, as for the piecewise
mechanisms (``_layout.py``), the probability is a ratio of integers out of
2^53: the flip weight F is the smallest integer with (2^53 - F) / F <= e^eps,
decided in 80-digit arithmetic and checked exactly.  One CSPRNG word per
answer (its top 53 bits) decides keep or flip, with no rejection.

The privacy loss is ln(K / F) with K = 2^53 - F: at most eps, short of it
by about 2^-53 relative.  The estimator uses the exact p, so it stays
unbiased: E[z'] = (2p - 1) z.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from edge_agent.mechanisms import _validate
from edge_agent.mechanisms._layout import TOTAL_BITS
from edge_agent.mechanisms.base import ExactLoss
from edge_agent.mechanisms.categorical import grr_other_weight
from edge_agent.mechanisms.randomness import as_random_source

_TOTAL = 1 << TOTAL_BITS


class RandomizedResponse:
    """Report a sign z in {-1, +1}: kept with probability K/2^53, else flipped."""

    name = "randomized-response"

    def __init__(self, *, epsilon: float):
        # Down to RESPONSE_EPSILON_MIN, below the other mechanisms' EPSILON_MIN: range
        # discovery answers each round at a share of a run's epsilon.
        self.epsilon = _validate.epsilon(epsilon, minimum=_validate.RESPONSE_EPSILON_MIN)
        # The least F with (2^53 - F) / F <= e^eps: GRR over two answers.
        self.flip_weight = grr_other_weight(self.epsilon, 2)
        self.keep_weight = _TOTAL - self.flip_weight

    # -- closed forms -----------------------------------------------------------------------
    @property
    def keep_probability(self) -> Fraction:
        return Fraction(self.keep_weight, _TOTAL)

    def exact_privacy_loss(self) -> ExactLoss:
        """The worst ratio P[z' | z] / P[z' | -z] over both answers: K / F."""
        return ExactLoss(Fraction(self.keep_weight, self.flip_weight))

    def privacy_loss(self) -> float:
        return float(self.exact_privacy_loss())

    def pmf(self, answer: int, truth: int) -> Fraction:
        """P[z' = answer | z = truth] for answer, truth in {-1, +1}."""
        if answer not in (-1, 1) or truth not in (-1, 1):
            raise ValueError("answer and truth must be -1 or +1")
        return self.keep_probability if answer == truth else 1 - self.keep_probability

    @property
    def debias_factor(self) -> float:
        """1 / (2p - 1): E[z'] / z inverted; (e^eps + 1)/(e^eps - 1) for the ideal p."""
        return _TOTAL / (self.keep_weight - self.flip_weight)

    def estimate_share_below(self, answer_sum: float, n: int) -> float:
        """Phi' of Algorithm 2, line 6: the unbiased estimate of the share of z = +1."""
        if n <= 0:
            raise ValueError(f"n: must be >= 1, got {n}")
        return self.debias_factor * answer_sum / (2 * n) + 0.5

    def estimate_variance(self, n: int) -> float:
        """Var[Phi'] when every true answer is the same sign (its largest value)."""
        p = float(self.keep_probability)
        return self.debias_factor ** 2 * 4 * p * (1 - p) / (4 * n)

    # -- sampling ---------------------------------------------------------------------------
    def respond(self, truth: Any, rng: Any = None) -> np.ndarray:
        """Privatise signs (array of -1/+1); ``rng`` None means the OS CSPRNG."""
        truth = np.asarray(truth)
        if truth.size and not np.isin(truth, (-1, 1)).all():
            raise ValueError("truth must contain only -1 and +1")
        words = as_random_source(rng).words(truth.size).reshape(truth.shape)
        keep = (words >> np.uint64(64 - TOTAL_BITS)) < np.uint64(self.keep_weight)
        return np.where(keep, truth, -truth).astype(np.int8)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon}

    def __repr__(self) -> str:
        return f"RandomizedResponse(epsilon={self.epsilon!r})"
