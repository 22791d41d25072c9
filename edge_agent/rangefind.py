"""Locally private minimum / maximum finding (Fukuchi, Yu, Haishima, Sakuma).

Pure logic shared by the agents (who answer) and the coordinator (who
searches); the MQTT exchange is in ``edge_agent.range_responder`` and
``collector.range``.

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
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from .mechanisms import split_epsilon
from .mechanisms.randomized_response import RandomizedResponse

STRATEGIES = ("sequential", "split")
SIDES = ("min", "max")
MAX_ROUNDS = 64


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
