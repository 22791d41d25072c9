"""Locally private minimum / maximum finding (Fukuchi, Yu, Haishima, Sakuma).

Pure logic shared by the agents (who answer) and the coordinator (who
searches); the MQTT exchange is in ``edge_agent.range_responder`` and
``collector.range.coordinator``.

Algorithm 2 of the paper: a binary search over the domain [l, r].  In round
t every participant answers z = sign(tau_t - v) (is my value below the
threshold?) by randomized response; the coordinator estimates the share
below, Phi' (line 6), and keeps the lower half when Phi' >= gamma (line 7).
After L rounds it returns the middle of [l, r].  The maximum is the same
search on -v: agents answer +1 when v > tau.

Strategies:

* ``sequential`` (the paper): every participant answers every round at
  eps/L (sequential composition, Theorem 6, gives eps per run).
* ``split``: participants are assigned to one round each by a hash of
  (run id, agent id) and answer only that round at the full eps.  A round
  then has about N/L answers instead of N, but each is far less noisy:
  for small eps the variance of Phi' falls from ~L^2/(eps^2 N) to
  ~L/(eps^2 N).  Still eps per agent per run.

Parameters L (rounds) and h_N follow Section 6.1 of the paper:

* lower bound alpha_min on the fatness alpha known (Corollary 1):
  L = ceil(log2(N) / (2 alpha_min)), h_N = ln(N) / (2 alpha_min);
* alpha unknown (Corollary 2): L = ceil(log2(N)^2 / (2 log2 1000)),
  h_N = ln(N)^2 / (2 ln 1000);

and gamma = sqrt(4 e^e' (1 + e^e') h_N / ((e^e' - 1)^2 n)) (Theorem 2) with
e' the per-answer epsilon and n the answers actually received that round.

Every finished search also states its own error (``assess``, see there): an
interval that holds the true minimum (maximum) at ``CONFIDENCE``, the
``error_bound`` of the estimate against it, and whether the result is
``ok`` or ``insufficient`` (with a reason a person can read).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from edge_agent.mechanisms import split_epsilon
from edge_agent.mechanisms.randomized_response import RandomizedResponse

STRATEGIES = ("sequential", "split")
SIDES = ("min", "max")
MAX_ROUNDS = 64
CONFIDENCE = 0.95  # of a result's interval, for all its rounds together


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{name}: must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _count(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name}: must be in [{low}, {high}], got {value}")
    return value


def answer_epsilon(epsilon: float, rounds: int, strategy: str) -> float:
    """eps/L rounded down so that L answers compose to at most eps exactly (split: eps)."""
    return epsilon if strategy == "split" else split_epsilon(epsilon, rounds)


@dataclass(frozen=True)
class SearchPlan:
    """The parameters of one run: how many rounds, at which epsilon, which threshold."""

    strategy: str
    epsilon: float  # per agent per run
    rounds: int  # L
    h: float  # h_N
    participants: int  # N, the agents that joined

    @property
    def answer_epsilon(self) -> float:
        """The epsilon of one answer: eps/L (sequential) or eps (split)."""
        return answer_epsilon(self.epsilon, self.rounds, self.strategy)

    @property
    def answers_per_agent(self) -> int:
        return self.rounds if self.strategy == "sequential" else 1

    def gamma(self, answers: int) -> float:
        """Theorem 2's threshold for a round with ``answers`` replies."""
        if answers <= 0:
            return math.inf
        e = math.exp(self.answer_epsilon)
        return math.sqrt(4 * e * (1 + e) * self.h / ((e - 1) ** 2 * answers))

    def describe(self) -> dict:
        return {"strategy": self.strategy, "epsilon": self.epsilon, "rounds": self.rounds,
                "h": self.h, "participants": self.participants}


def plan_search(*, participants: int, epsilon: float, strategy: str = "sequential",
                alpha_min: float | None = None, rounds: int | None = None,
                h: float | None = None) -> SearchPlan:
    """L and h_N from the paper's corollaries; ``rounds`` / ``h`` override them."""
    participants = _count("participants", participants, 1, 10**9)
    strategy = _choice("strategy", strategy, STRATEGIES)
    epsilon = RandomizedResponse(epsilon=epsilon).epsilon  # validated the same way
    n = max(participants, 2)  # ln(1) = 0 would give h = 0 and no threshold at all
    if alpha_min is not None:
        if isinstance(alpha_min, bool) or not isinstance(alpha_min, (int, float)) \
                or not 0 < alpha_min <= 100:
            raise ValueError(f"alpha_min: must be in (0, 100], got {alpha_min!r}")
        default_rounds = math.ceil(math.log2(n) / (2 * alpha_min))  # Corollary 1
        default_h = math.log(n) / (2 * alpha_min)
    else:
        default_rounds = math.ceil(math.log2(n) ** 2 / (2 * math.log2(1000)))  # Corollary 2
        default_h = math.log(n) ** 2 / (2 * math.log(1000))
    rounds = _count("rounds", rounds if rounds is not None else max(1, default_rounds), 1,
                    MAX_ROUNDS)
    h = default_h if h is None else h
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 < h <= 1e6:
        raise ValueError(f"h: must be in (0, 1e6], got {h!r}")
    return SearchPlan(strategy, epsilon, rounds, float(h), participants)


def assigned_round(run_id: str, agent: str, rounds: int) -> int:
    """The one round (0-based) an agent answers in a ``split`` run.

    A keyed hash, so the coordinator and the agent agree without talking and
    nobody can pick their round.
    """
    digest = hashlib.blake2b(f"{run_id}/{agent}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % rounds


def true_answer(value: float, threshold: float, side: str) -> int:
    """The sign an agent privatises: +1 if its value is beyond the threshold on ``side``."""
    beyond = value < threshold if side == "min" else value > threshold
    return 1 if beyond else -1


@dataclass
class RangeSearch:
    """Algorithm 2's state for one side of one channel's domain [low, high]."""

    low: float
    high: float
    side: str
    plan: SearchPlan
    history: list[dict] = field(default_factory=list)

    def __post_init__(self):
        _choice("side", self.side, SIDES)
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(f"domain: need finite low < high, got [{self.low}, {self.high}]")
        # Search in "min space": the max is the min of -v.
        self._l, self._r = ((self.low, self.high) if self.side == "min"
                            else (-self.high, -self.low))
        self.mechanism = RandomizedResponse(epsilon=self.plan.answer_epsilon)

    @property
    def round(self) -> int:
        """The 0-based round to ask next (== plan.rounds when done)."""
        return len(self.history)

    @property
    def done(self) -> bool:
        return self.round >= self.plan.rounds

    def _outward(self, x: float) -> float:
        return x if self.side == "min" else -x

    def threshold(self) -> float:
        """tau_t in the channel's units (Algorithm 2, line 3)."""
        return self._outward((self._l + self._r) / 2)

    def decide(self, answer_sum: int, answers: int) -> dict:
        """Lines 6-10: estimate Phi' from the answers and halve the interval."""
        if self.done:
            raise RuntimeError("the search has finished")
        if answers <= 0:
            raise ValueError("a round needs at least one answer")
        tau = (self._l + self._r) / 2
        phi = self.mechanism.estimate_share_below(answer_sum, answers)
        gamma = self.plan.gamma(answers)
        if phi >= gamma:
            self._r = tau
        else:
            self._l = tau
        record = {"round": self.round, "threshold": self._outward(tau), "answers": answers,
                  "phi": phi, "gamma": gamma, "beyond": phi >= gamma}
        self.history.append(record)
        return record

    def estimate(self) -> float:
        """Line 11: the middle of the final interval, in the channel's units."""
        return self._outward((self._l + self._r) / 2)

    def assess(self, confidence: float = CONFIDENCE) -> Assessment:
        """The finished search's own error: ``assess`` over its history."""
        if not self.done:
            raise RuntimeError("the search has not finished")
        return assess(self.history, low=self.low, high=self.high, side=self.side,
                      answer_epsilon=self.plan.answer_epsilon,
                      participants=self.plan.participants, estimate=self.estimate(),
                      confidence=confidence)


# -- the search's own error ---------------------------------------------------------------------
#
# Where the true minimum can be, given what the rounds answered.  The paper bounds the
# *mean* error (Theorems 2, 4 and 5); a result needs a bound that holds for the run at
# hand, so this follows the proof of Theorem 4 (Appendix B.1, C.2) step by step, with
# each step made to hold at a stated confidence instead of in expectation:
#
# 1. Lemma 2 (concentration of Phi').  In round t, with n answers, the count of +1
#    answers is a sum of n independent 0/1 variables with mean
#    mu = (1 - p) + (2p - 1) F(tau_t), F the share of answering agents beyond tau_t and
#    p the exact keep probability.  The Chernoff-Hoeffding bound (Hoeffding 1963,
#    Thm. 1: P(mean_hat >= a) <= exp(-n KL(a || mu)) for a >= mu, and the mirror) is the
#    same kind of statement as Lemma 2 but exact in its constant; inverting it gives
#    F_lo(t) <= F(tau_t) <= F_hi(t), each side failing with probability <= delta_1.
#    With ``split`` the n answerers are a hash-random sample of the N joined agents
#    (without replacement); Hoeffding's Thm. 4 makes the same bound hold for the share
#    among all N.
# 2. Upper end (the "decision" half of Lemma 1, without any assumption): F_lo(t) > 0
#    means at least one agent is beyond tau_t, so min < tau_t.  upper = the smallest
#    such tau_t (or the domain's top).
# 3. Lower end (the first term of Eq. (2); in the proof of Theorem 4 the gap between
#    the minimum and the 2 gamma quantile is at most (2 gamma / C)^(1/alpha), here with
#    the round's bound q = F_hi(t) in place of 2 gamma, alpha = 1 and C = 1/W, W the
#    domain's width): a rank statement turned into a value needs the data's fatness
#    (Definition 1); no private method can do without one (Theorem 1: an isolated
#    minimum is invisible).  Assumed: at least a share q of the agents lie within q W
#    of the minimum, for every q; true for data at least as dense near their minimum
#    as if spread uniformly over the whole domain (e.g. uniform on any sub-interval,
#    or a density >= 1/W above the minimum).  Then F(tau) <= F_hi(t) gives
#    min >= tau_t - F_hi(t) W.  lower = the largest such bound (or the domain's
#    bottom).
# 4. Union bound: 2 statements per round, delta_1 = (1 - confidence) / (2 L); the
#    interval [lower, upper] holds the true minimum with probability >= confidence
#    (under the assumption of step 3).  Its ends are thresholds of the search, so its
#    resolution is the final cell's width, W 2^-L (Lemma 1's last term).
#
# error_bound = the largest distance from the estimate to a point of [lower, upper]:
# |estimate - min| <= error_bound at that confidence.  The result is ``insufficient``
# when estimate +- error_bound spans the domain's width or more (the number says
# nothing the domain did not), or when the two ends contradict each other.  The
# maximum is the same on -v.


def _kl(a: float, b: float) -> float:
    """KL(Bernoulli(a) || Bernoulli(b)), with 0 log 0 = 0."""
    def term(x: float, y: float) -> float:
        if x <= 0.0:
            return 0.0
        return math.inf if y <= 0.0 else x * math.log(x / y)
    return term(a, b) + term(1.0 - a, 1.0 - b)


def _mean_interval(mean: float, n: int, level: float) -> tuple[float, float]:
    """The means mu with n KL(mean || mu) <= level, rounded outwards (bisection)."""
    def edge(inside: float, outside: float) -> float:
        for _ in range(64):
            middle = (inside + outside) / 2
            if n * _kl(mean, middle) <= level:
                inside = middle
            else:
                outside = middle
        return outside  # the end just beyond: the interval only gets wider
    lo = 0.0 if n * _kl(mean, 0.0) <= level else edge(mean, 0.0)
    hi = 1.0 if n * _kl(mean, 1.0) <= level else edge(mean, 1.0)
    return lo, hi


def share_interval(share_yes: float, answers: int, answer_epsilon: float,
                   delta: float) -> tuple[float, float]:
    """Bounds on the share of agents beyond a threshold from one round (step 1 above).

    ``share_yes``: the share of +1 answers; each bound fails with probability <= delta.
    """
    p = float(RandomizedResponse(epsilon=answer_epsilon).keep_probability)
    lo, hi = _mean_interval(min(1.0, max(0.0, share_yes)), answers, math.log(1 / delta))
    return (max(0.0, (lo - (1 - p)) / (2 * p - 1)), min(1.0, (hi - (1 - p)) / (2 * p - 1)))


def _round_delta(rounds: int, confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence!r}")
    return (1.0 - confidence) / (2 * max(1, rounds))


def _g(x: float) -> str:
    return f"{x:.3g}"


@dataclass(frozen=True)
class Assessment:
    """A finished run's own error; ``interval`` and ``error_bound`` in channel units."""

    status: str  # "ok" or "insufficient"
    reason: str | None
    interval: tuple[float, float]  # holds the true min (max) at ``confidence``
    error_bound: float  # |estimate - true min (max)| <= error_bound at ``confidence``
    confidence: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def assess(history: list[dict], *, low: float, high: float, side: str, answer_epsilon: float,
           participants: int, estimate: float, confidence: float = CONFIDENCE) -> Assessment:
    """The interval, error bound and status of a finished search (see the comment above).

    ``history``: the rounds as ``RangeSearch.decide`` records them (threshold in channel
    units, answers, phi); ``estimate`` the search's estimate.
    """
    _choice("side", side, SIDES)
    if not history:
        raise ValueError("a search without rounds has nothing to assess")
    flip = 1.0 / RandomizedResponse(epsilon=answer_epsilon).debias_factor  # 2p - 1
    delta = _round_delta(len(history), confidence)
    sign = 1.0 if side == "min" else -1.0  # to "min space" and back
    bottom, top = sorted((sign * low, sign * high))
    width = top - bottom
    lower, upper = bottom, top
    for record in history:
        tau = sign * record["threshold"]
        # phi = (share_yes - (1 - p)) / (2p - 1): the share of +1 answers, recovered
        share_yes = (record["phi"] - 0.5) * flip + 0.5
        f_lo, f_hi = share_interval(share_yes, record["answers"], answer_epsilon, delta)
        if f_lo > 0.0:
            upper = min(upper, tau)
        if f_hi < 1.0:
            lower = max(lower, tau - f_hi * width)
    point = sign * estimate
    reason = None
    if lower > upper:  # an improbable round, or data thinner near its extreme than assumed
        below, above = ("below", "above") if side == "min" else ("above", "below")
        reason = (f"the rounds contradict each other: the {side} would be {below} "
                  f"{_g(sign * upper)} and {above} {_g(sign * lower)}")
        lower, upper = bottom, top
    bound = max(point - lower, upper - point, 0.0)
    if reason is None and 2 * bound >= width:
        reason = (f"{participants} agents: the search's error bound \u00b1{_g(bound)} is "
                  f"wider than the domain [{_g(low)}, {_g(high)}]")
    interval = tuple(sorted((sign * lower, sign * upper)))
    return Assessment("insufficient" if reason else "ok", reason, interval, bound, confidence)


def round_can_inform(answers: int, answer_epsilon: float, delta: float) -> bool:
    """Whether a round of ``answers`` could prove anything even if every answer agreed:
    all +1 proving some agent beyond the threshold, or all -1 proving that not all are."""
    if answers <= 0:
        return False
    return (share_interval(1.0, answers, answer_epsilon, delta)[0] > 0.0
            or share_interval(0.0, answers, answer_epsilon, delta)[1] < 1.0)


def uninformed_reason(plan: SearchPlan, answers_per_round: list[int],
                      confidence: float = CONFIDENCE) -> str | None:
    """Why a run would be pointless before asking anything (no round could inform), or
    None.  ``answers_per_round``: the answers each round can expect at most."""
    delta = _round_delta(plan.rounds, confidence)
    if any(round_can_inform(n, plan.answer_epsilon, delta) for n in answers_per_round):
        return None
    most = max(answers_per_round, default=0)
    return (f"{plan.participants} agents joined: too few for even one informative round "
            f"({most} answers at \u03b5 {_g(plan.answer_epsilon)} each cannot be told "
            f"from noise at {confidence:.0%} confidence)")


def pair_conflict(min_estimate: float | None, max_estimate: float | None) -> str | None:
    """Why a channel's min and max (of the same time) cannot both be right, or None."""
    if min_estimate is None or max_estimate is None or min_estimate <= max_estimate:
        return None
    return f"min {_g(min_estimate)} exceeds max {_g(max_estimate)}"


def simulate(values, *, low: float, high: float, side: str, plan: SearchPlan, rng,
             run_id: str = "sim", agents: list[str] | None = None) -> RangeSearch:
    """Run the whole search in memory over ``values`` (one per agent).

    The same ``RangeSearch`` and ``RandomizedResponse`` as over MQTT, with
    every agent present in every round; for evaluation (benchmarks, tests).
    ``rng`` is a seeded generator, or None for the CSPRNG.
    """
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    search = RangeSearch(low=low, high=high, side=side, plan=plan)
    if plan.strategy == "split":
        names = agents if agents is not None else [f"a{i}" for i in range(values.size)]
        rounds = np.array([assigned_round(run_id, name, plan.rounds) for name in names])
    while not search.done:
        tau = search.threshold()
        active = values if plan.strategy == "sequential" else values[rounds == search.round]
        if active.size == 0:
            break  # a split round nobody was assigned to: the run cannot finish
        beyond = active < tau if side == "min" else active > tau
        answers = search.mechanism.respond(np.where(beyond, 1, -1), rng)
        search.decide(int(answers.sum(dtype=np.int64)), int(active.size))
    return search
