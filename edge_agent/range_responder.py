"""The agent's side of range discovery: join runs, answer rounds, charge the ledger.

Protocol (docs/reference/PROTOCOL.md, "Range discovery"): a coordinator announces a
run on ``_range/control/<run>``; each agent that can take part replies
``join`` on its own ``<agent>/_range/<run>`` topic.  Each round then
carries a threshold; a joined agent answers with one randomized-response
sign of "my value is beyond the threshold" (``rangefind.true_answer``).

What an agent holds as "its value": the minimum (or maximum) of the
channel's readings over the run's ``window_seconds``, counted back from the
agent's newest reading of that channel (so a replayed recording that has
ended can still answer).  Readings are kept as one (newest time, min, max)
block per batch for at most ``keep_seconds``.

Privacy rules, each enforced before anything is sent:

* a run announcing more than ``[privacy] range_epsilon_max`` is refused (0
  disables range discovery);
* only joined runs are answered, each round at most once, at most L answers
  (sequential, eps/L each) or one (split, eps), and L cannot change
  mid-run; so one run never costs more than its announced eps;
* every answer is charged to the persisted budget ledger (ledger channel
  ``_range:<channel>``) in the same transaction that spools it; an answer
  the period budget cannot pay for is not sent (``exhausted``).
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent import protocol
from edge_agent.mechanisms.randomized_response import RandomizedResponse
from edge_agent.mechanisms.rangefind import answer_epsilon, assigned_round, true_answer
from edge_agent.protocol import Announce, RangeTerms, Rejected, Round
from edge_agent.state import NANO, RANGE_REPLIES, Budget, StateStore, Transaction, to_nano_up

log = logging.getLogger(__name__)

KEEP_SECONDS = protocol.RANGE_WINDOW_MAX
MAX_BLOCKS = 100_000


class RangeWindow:
    """Per-batch (newest time, min, max) of one channel's finite readings."""

    def __init__(self, keep_seconds: float = KEEP_SECONDS):
        self.keep_seconds = keep_seconds
        self.blocks: collections.deque = collections.deque(maxlen=MAX_BLOCKS)

    def add(self, times: np.ndarray, values: np.ndarray) -> None:
        finite = np.isfinite(values)
        if not finite.any():
            return
        times, values = times[finite], values[finite]
        self.blocks.append((float(times.max()), float(values.min()), float(values.max())))
        newest = max(self.blocks[-1][0], self.blocks[0][0])
        while self.blocks and self.blocks[0][0] < newest - self.keep_seconds:
            self.blocks.popleft()

    def extreme(self, side: str, window_seconds: float) -> float | None:
        if not self.blocks:
            return None
        newest = max(block[0] for block in self.blocks)
        recent = [b for b in self.blocks if b[0] >= newest - window_seconds]
        if side == "min":
            return min(b[1] for b in recent)
        return max(b[2] for b in recent)


def terms_key(terms: RangeTerms) -> str:
    """A run's terms as stored at join and compared at every round (JSON text)."""
    return json.dumps({"channel": terms.channel, "side": terms.side, "epsilon": terms.epsilon,
                       "strategy": terms.strategy, "window_seconds": terms.window_seconds},
                      sort_keys=True)


@dataclass
class RangeCounters:
    joined: int = 0
    answered: int = 0
    refused: collections.Counter = field(default_factory=collections.Counter)
    last_refusal: str | None = None

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1
        self.last_refusal = reason

    def as_dict(self) -> dict[str, Any]:
        return {"joined": self.joined, "answered": self.answered, "refused": dict(self.refused),
                "last_refusal": self.last_refusal}


class RangeResponder:
    """Answers range runs for one or many (virtual) agents sharing a state store."""

    def __init__(self, *, fleet: str, agents: dict[str, Iterable[str]], store: StateStore,
                 budget: Budget, range_epsilon_max: float, rng: Any = None,
                 keep_seconds: float = KEEP_SECONDS):
        """``agents``: agent id -> names of its linear channels."""
        self.fleet, self.store, self.rng, self.budget = fleet, store, rng, budget
        self.range_epsilon_max = range_epsilon_max
        self.windows = {(agent, channel): RangeWindow(keep_seconds)
                        for agent, channels in agents.items() for channel in channels}
        self.agents = list(agents)
        self.counters = {agent: RangeCounters() for agent in agents}
        self.invalid = 0
        self.results: dict[tuple[str, str], dict] = {}  # (channel, side) -> latest result

    @property
    def subscriptions(self) -> list[str]:
        return [protocol.range_control_subscription(self.fleet),
                protocol.range_result_subscription(self.fleet)]

    def observe(self, agent: str, channel: str, times: np.ndarray, values: np.ndarray) -> None:
        window = self.windows.get((agent, channel))
        if window is not None:
            window.add(times, values)

    def status(self, agent: str) -> dict[str, Any]:
        return self.counters[agent].as_dict()

    # -- messages -----------------------------------------------------------------------------
    def handle(self, topic: str, payload: bytes, now: float) -> None:
        """One control or result message (from the transport's thread-safe queue)."""
        try:
            result_of = protocol.range_result_levels(topic, self.fleet)
            if result_of is not None:
                self._result(result_of, payload)
                return
            message = protocol.decode_range_control(topic, payload, self.fleet)
            if isinstance(message, Announce):
                self._announce(message, now)
            elif isinstance(message, Round):
                self._round(message, now)
        except Rejected as exc:
            self.invalid += 1
            log.warning("ignored a range message on %s: %s", topic, exc.detail)

    def _result(self, channel_side: tuple[str, str], payload: bytes) -> None:
        result = protocol.decode_range_result(payload)
        if result is not None and result.status == "done" and result.estimate is not None:
            self.results[channel_side] = result

    def _announce(self, message: Announce, now: float) -> None:
        run, terms = message.run, terms_key(message)
        joins = []
        for agent in self.agents:
            window = self.windows.get((agent, message.channel))
            if window is None:
                continue  # not our channel (or not a linear one): stay silent
            reason = None
            if self.range_epsilon_max == 0:
                reason = "disabled"
            elif message.epsilon > self.range_epsilon_max:
                reason = "epsilon_above_max"
            elif window.extreme(message.side, message.window_seconds) is None:
                reason = "no_data"
            elif to_nano_up(message.epsilon) > self.store.epsilon_room(agent, self.budget, now):
                reason = "budget"
            if reason is not None:
                self.counters[agent].refuse(reason)
                self.store.enqueue(protocol.range_reply_topic(self.fleet, agent, run),
                                   protocol.range_join(agent=agent, run=run, accept=False,
                                                       reason=reason), lane=RANGE_REPLIES)
            else:
                joins.append(agent)
        if not joins:
            return
        with self.store.transaction(now) as tx:
            for agent in joins:  # an agent joins a run at most once
                if tx.join_range(agent, run, terms):
                    self.counters[agent].joined += 1
                    tx.spool(protocol.range_reply_topic(self.fleet, agent, run),
                             protocol.range_join(agent=agent, run=run, accept=True),
                             lane=RANGE_REPLIES)

    def _round(self, message: Round, now: float) -> None:
        run, rounds, index = message.run, message.rounds, message.round
        terms = terms_key(message)
        agents, truths = [], []
        for agent in self.agents:
            if (agent, message.channel) not in self.windows:
                continue
            agreed = self.store.range_terms(agent, run)
            if agreed is None:
                continue  # only joined runs are answered
            if agreed != terms:
                self.counters[agent].refuse("terms_changed")
                continue
            if message.strategy == "split" and assigned_round(run, agent, rounds) != index:
                continue
            value = self.windows[(agent, message.channel)].extreme(message.side,
                                                                   message.window_seconds)
            if value is None:
                continue
            agents.append(agent)
            truths.append(true_answer(value, message.threshold, message.side))
        if not agents:
            return
        mechanism = RandomizedResponse(epsilon=answer_epsilon(message.epsilon, rounds,
                                                              message.strategy))
        answers = mechanism.respond(np.array(truths, dtype=np.int8), self.rng)
        cost = mechanism.exact_privacy_loss().ceiling(NANO)  # its privacy map, exactly
        allowed = rounds if message.strategy == "sequential" else 1  # answers per run
        outcomes = []
        with self.store.transaction(now) as tx:
            for agent, z in zip(agents, answers):
                outcome = self._answer(tx, agent, message, allowed, cost)
                if outcome == "answered":
                    tx.spool(protocol.range_reply_topic(self.fleet, agent, run),
                             protocol.range_answer(agent=agent, run=run, round=index, z=int(z)),
                             lane=RANGE_REPLIES)
                outcomes.append((agent, outcome))
        for agent, outcome in outcomes:  # booked once committed
            if outcome == "answered":
                self.counters[agent].answered += 1
            elif outcome != "duplicate":
                self.counters[agent].refuse(outcome)

    def _answer(self, tx: Transaction, agent: str, message: Round, allowed: int,
                cost: int) -> str:
        """Whether ``agent`` may answer this round, and if so the answer's charge.

        ``answered``; or, with nothing charged or sent: ``not_joined``, ``duplicate``
        (this round was answered already: replays never make an agent answer twice),
        ``rounds_changed`` (another L than the rounds answered before), ``run_complete``
        (the run's answers are used up), ``clock_behind`` (the wall clock is behind its
        latest time) or ``exhausted`` (the rolling budget cannot pay)."""
        joined = tx.range_run(agent, message.run)
        if joined is None:
            return "not_joined"
        if message.round in joined.answered:
            return "duplicate"
        if joined.rounds is not None and joined.rounds != message.rounds:
            return "rounds_changed"
        if len(joined.answered) >= allowed:
            return "run_complete"
        if tx.clock.behind(tx.now):
            return "clock_behind"
        if not tx.charge(agent, f"_range:{message.channel}", cost=cost, wanted=1,
                         budget=self.budget):
            return "exhausted"
        tx.answer_range(agent, message.run, message.round, message.rounds)
        return "answered"
