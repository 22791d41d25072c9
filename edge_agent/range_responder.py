"""The agent's side of range discovery: join runs, answer rounds, charge the ledger.

Protocol (docs/PROTOCOL.md, "Range discovery"): a coordinator announces a
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
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from . import protocol
from .mechanisms.randomized_response import RandomizedResponse
from .rangefind import MAX_ROUNDS, SIDES, STRATEGIES, answer_epsilon, assigned_round, true_answer
from .state import RANGE_REPLIES, RangeAnswer, StateStore, period_start, to_nano_down, to_nano_up

log = logging.getLogger(__name__)

RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_PAYLOAD = 4096
KEEP_SECONDS = 24 * 3600.0
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


@dataclass
class Terms:
    """What a run announced; a round that disagrees with it is ignored."""

    channel: str
    side: str
    epsilon: float
    strategy: str
    window_seconds: float

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


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


class Invalid(ValueError):
    pass


def _parse(payload: bytes) -> dict:
    if len(payload) > MAX_PAYLOAD:
        raise Invalid("oversized")
    try:
        message = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise Invalid("not JSON") from None
    if not isinstance(message, dict) or message.get("v") != protocol.PROTOCOL_VERSION:
        raise Invalid("not a v1 object")
    if message.get("type") not in ("announce", "round", "end"):
        raise Invalid("unknown type")
    if not isinstance(message.get("run"), str) or not RUN_ID.match(message["run"]):
        raise Invalid("bad run id")
    return message


def _number(message: dict, key: str, low: float, high: float) -> float:
    value = message.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not low <= value <= high:
        raise Invalid(f"{key} must be a number in [{low}, {high}]")
    return float(value)


def _terms(message: dict) -> Terms:
    channel, side, strategy = message.get("channel"), message.get("side"), message.get("strategy")
    if not isinstance(channel, str) or side not in SIDES or strategy not in STRATEGIES:
        raise Invalid("channel, side or strategy")
    epsilon = _number(message, "epsilon", 0.0, 20.0)
    if epsilon <= 0:
        raise Invalid("epsilon must be > 0")
    return Terms(channel, side, epsilon, strategy,
                 _number(message, "window_seconds", 0.0, KEEP_SECONDS))


class RangeResponder:
    """Answers range runs for one or many (virtual) agents sharing a state store."""

    def __init__(self, *, fleet: str, agents: dict[str, Iterable[str]], store: StateStore,
                 budget_epsilon: float, range_epsilon_max: float, period_seconds: float,
                 rng: Any = None, keep_seconds: float = KEEP_SECONDS):
        """``agents``: agent id -> names of its linear channels."""
        self.fleet = fleet
        self.store = store
        self.budget_epsilon = budget_epsilon
        self.range_epsilon_max = range_epsilon_max
        self.period_seconds = period_seconds
        self.rng = rng
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
            if topic.startswith(protocol.range_result_topic(self.fleet, "", "")[:-2]):
                self._result(topic, payload)
                return
            message = _parse(payload)
            if topic != protocol.range_control_topic(self.fleet, message["run"]):
                raise Invalid("run id differs from the topic")
            if message["type"] == "announce":
                self._announce(message, now)
            elif message["type"] == "round":
                self._round(message, now)
        except Invalid as exc:
            self.invalid += 1
            log.warning("ignored a range message on %s: %s", topic, exc)

    def _result(self, topic: str, payload: bytes) -> None:
        levels = topic.split("/")
        try:
            message = json.loads(payload) if payload else None
        except ValueError:
            raise Invalid("result is not JSON") from None
        if isinstance(message, dict) and message.get("status") == "done":
            self.results[(levels[-2], levels[-1])] = message

    def _announce(self, message: dict, now: float) -> None:
        terms = _terms(message)
        run = message["run"]
        start = period_start(now, self.period_seconds)
        joins = []
        for agent in self.agents:
            window = self.windows.get((agent, terms.channel))
            if window is None:
                continue  # not our channel (or not a linear one): stay silent
            reason = None
            if self.range_epsilon_max == 0:
                reason = "disabled"
            elif terms.epsilon > self.range_epsilon_max:
                reason = "epsilon_above_max"
            elif window.extreme(terms.side, terms.window_seconds) is None:
                reason = "no_data"
            elif self.store.spent(agent, start) + to_nano_up(terms.epsilon) \
                    > to_nano_down(self.budget_epsilon):
                reason = "budget"
            if reason is not None:
                self.counters[agent].refuse(reason)
                self.store.enqueue(protocol.range_reply_topic(self.fleet, agent, run),
                                   protocol.range_join(agent=agent, run=run, accept=False,
                                                       reason=reason), lane=RANGE_REPLIES)
                continue
            joins.append((agent, run, terms.to_json(), (
                protocol.range_reply_topic(self.fleet, agent, run),
                protocol.range_join(agent=agent, run=run, accept=True))))
        if joins:
            for (agent, *_), new in zip(joins, self.store.join_range(joins, now=now)):
                if new:
                    self.counters[agent].joined += 1

    def _round(self, message: dict, now: float) -> None:
        terms = _terms(message)
        run = message["run"]
        rounds = int(_number(message, "rounds", 1, MAX_ROUNDS))
        index = int(_number(message, "round", 0, MAX_ROUNDS - 1))
        threshold = _number(message, "threshold", -1e300, 1e300)
        if message["rounds"] != rounds or message["round"] != index or index >= rounds:
            raise Invalid("round and rounds must be integers with round < rounds")
        eps = answer_epsilon(terms.epsilon, rounds, terms.strategy)
        agents, truths = [], []
        for agent in self.agents:
            if (agent, terms.channel) not in self.windows:
                continue
            agreed = self.store.range_terms(agent, run)
            if agreed is None:
                continue  # only joined runs are answered
            if agreed != terms.to_json():
                self.counters[agent].refuse("terms_changed")
                continue
            if terms.strategy == "split" and assigned_round(run, agent, rounds) != index:
                continue
            value = self.windows[(agent, terms.channel)].extreme(terms.side,
                                                                 terms.window_seconds)
            if value is None:
                continue
            agents.append(agent)
            truths.append(true_answer(value, threshold, terms.side))
        if not agents:
            return
        answers = RandomizedResponse(epsilon=eps).respond(np.array(truths, dtype=np.int8),
                                                          self.rng)
        allowed = rounds if terms.strategy == "sequential" else 1
        requests = [RangeAnswer(
            agent=agent, run=run, round=index, rounds=rounds, answers_allowed=allowed,
            ledger_channel=f"_range:{terms.channel}", epsilon=eps,
            message=(protocol.range_reply_topic(self.fleet, agent, run),
                     protocol.range_answer(agent=agent, run=run, round=index, z=int(z))))
            for agent, z in zip(agents, answers)]
        outcomes = self.store.answer_range(
            requests, start=period_start(now, self.period_seconds),
            budget_epsilon=self.budget_epsilon, now=now)
        for agent, outcome in zip(agents, outcomes):
            if outcome == "answered":
                self.counters[agent].answered += 1
            elif outcome != "duplicate":
                self.counters[agent].refuse(outcome)
