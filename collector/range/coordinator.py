"""The coordinator of range discovery: one private min or max search over MQTT.

A run (docs/reference/PROTOCOL.md, "Range discovery"):

1. ``announce`` on ``_range/control/<run>`` with the channel, side,
   epsilon, strategy and window; agents reply ``join`` (accept or refuse)
   on ``<agent>/_range/<run>`` until ``join_timeout_seconds``.
2. N = the agents that accepted.  Fewer than ``min_participants``: the run
   ends ``insufficient``.  Otherwise L and h_N follow the paper
   (``edge_agent.mechanisms.rangefind.plan_search``).  If not even one round could tell
   its answers from noise (``rangefind.uninformed_reason``), the run ends
   ``insufficient`` before any agent answers (nobody pays for it).
3. Each round publishes the threshold and collects one answer per expected
   agent (every joined agent, or for ``split`` those assigned to the round)
   until all have answered or ``round_timeout_seconds`` passes.  Answers
   from agents that did not join, for another round (stale or early),
   repeated, malformed or sent on another agent's topic are ignored and
   counted.  A round with too few answers ends the run ``insufficient``.
4. The search assesses itself (``RangeSearch.assess``): an interval holding
   the true min (max) at ``rangefind.CONFIDENCE`` and the estimate's
   ``error_bound``.  A result whose bound spans the domain, or whose rounds
   contradict each other, ends ``insufficient`` with the reason (its
   estimate and bound are still published, for the record).
5. ``end`` on the control topic, and the result (estimate, error_bound,
   interval, confidence, rounds, participants, parameters, started_at,
   finished_at, per-round history) retained on
   ``_range/result/<channel>/<side>``.

The search and its error bound are ``edge_agent.mechanisms.rangefind``; this module only
moves messages.  ``collector.range.results`` keeps the results the API serves;
``collector.range.schedule`` starts runs periodically.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from collector.config import CollectorConfig, RangeDiscoveryConfig
from edge_agent import protocol
from edge_agent.common.mqtt_client import MqttClient
from edge_agent.mechanisms.rangefind import (
    RangeSearch,
    assigned_round,
    plan_search,
    uninformed_reason,
)
from edge_agent.protocol import Announce, Answer, End, Join, RangeResult, Rejected, Round

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunRequest:
    channel: str
    side: str
    low: float
    high: float


class ReplyInbox:
    """Replies of one run, handed from paho's thread to the coordinator's."""

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()

    def on_message(self, client, userdata, message) -> None:
        self.queue.put((message.topic, message.payload))

    def drain(self, until: float, done: Callable[[], bool], handle) -> None:
        """Hand replies to ``handle`` until ``done()`` or the monotonic deadline."""
        while not done():
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            try:
                topic, payload = self.queue.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                continue
            handle(topic, payload)


class RangeCoordinator:
    """Runs searches with a connected client (it subscribes per run)."""

    def __init__(self, client: MqttClient, *, fleet: str, settings: RangeDiscoveryConfig,
                 clock: Callable[[], float] = time.time):
        self.client = client
        self.fleet = fleet
        self.settings = settings
        self.clock = clock
        self.ignored: collections.Counter = collections.Counter()
        self.inbox = ReplyInbox()
        client.on_message = self.inbox.on_message

    # -- replies ----------------------------------------------------------------------------
    def _reply(self, topic: str, payload: bytes, run: str) -> Join | Answer | None:
        """A well-formed reply of this run from the agent its topic names, or None (and
        counted in ``ignored`` by reason)."""
        try:
            return protocol.decode_range_reply(topic, payload, self.fleet, run)
        except Rejected as exc:
            self.ignored[exc.reason] += 1
            return None

    # -- one run ------------------------------------------------------------------------------
    def run(self, request: RunRequest, *, expected_agents: int | None = None) -> dict:
        """Run one search to its end; the result (as published) as plain values."""
        run = f"{request.channel}-{request.side}-{int(self.clock())}-{secrets.token_hex(3)}"
        result = RangeResult(v=protocol.PROTOCOL_VERSION, run=run,
                             coordinator=self.settings.client_id, channel=request.channel,
                             side=request.side, domain=(request.low, request.high),
                             started_at=self.clock())
        reply_topic = protocol.range_reply_subscription(self.fleet, run)
        self.client.subscribe(reply_topic, qos=1)
        try:
            self._search(run, request, result, expected_agents)
        finally:
            self.client.unsubscribe(reply_topic)
            self.client.publish(protocol.range_control_topic(self.fleet, run),
                                protocol.encode(End(v=protocol.PROTOCOL_VERSION, run=run,
                                                    status=result.status)), qos=1)
            result.finished_at = self.clock()
            result.ignored_replies = dict(self.ignored)
            published = self.client.publish(
                protocol.range_result_topic(self.fleet, request.channel, request.side),
                protocol.encode(result), qos=1, retain=True)
            try:  # the result is the point of the run: see it acknowledged
                published.wait_for_publish(10)
            except (RuntimeError, ValueError):
                log.warning("range result for %s/%s not acknowledged by the broker",
                            request.channel, request.side)
            log.info("range run %s: %s, estimate %s, error bound %s%s", run, result.status,
                     result.estimate, result.error_bound,
                     f" ({result.reason})" if result.reason else "")
        return protocol.as_dict(result)

    def _search(self, run: str, request: RunRequest, result: RangeResult,
                expected_agents: int | None) -> None:
        s = self.settings
        self.ignored.clear()
        terms = dict(v=protocol.PROTOCOL_VERSION, run=run, channel=request.channel,
                     side=request.side, epsilon=s.epsilon, strategy=s.strategy,
                     window_seconds=s.window_seconds)
        control = protocol.range_control_topic(self.fleet, run)
        time.sleep(0.2)  # let the reply subscription settle before anyone can answer
        self.client.publish(control, protocol.encode(Announce(
            **terms, domain=(request.low, request.high))), qos=1)
        joined: set[str] = set()
        refused: collections.Counter = collections.Counter()

        def on_join(topic, payload):
            message = self._reply(topic, payload, run)
            if message is None:
                return
            if not isinstance(message, Join):
                self.ignored["early"] += 1
            elif message.accept:
                joined.add(message.agent)
            else:
                refused[str(message.reason)] += 1

        # Joins are collected until the deadline, or until as many agents as the
        # caller expects (e.g. those online) have joined; 0 or None: unknown.
        self.inbox.drain(time.monotonic() + s.join_timeout_seconds,
                         lambda: bool(expected_agents) and len(joined) >= expected_agents,
                         on_join)
        result.participants, result.refused = len(joined), dict(refused)
        if len(joined) < s.min_participants:
            result.status = "insufficient"
            result.reason = (f"{len(joined)} agents joined, min_participants is "
                             f"{s.min_participants}")
            return
        plan = plan_search(participants=len(joined), epsilon=s.epsilon, strategy=s.strategy,
                           alpha_min=s.alpha_min, rounds=s.rounds, h=s.h)
        search = RangeSearch(low=request.low, high=request.high, side=request.side, plan=plan)
        result.parameters = protocol.RangeParameters(
            **plan.describe(), alpha_min=s.alpha_min, answer_epsilon=plan.answer_epsilon,
            window_seconds=s.window_seconds)
        needed = s.min_participants if s.strategy == "sequential" else max(
            1, math.ceil(s.min_participants / plan.rounds))
        if s.strategy == "sequential":
            per_round = [len(joined)] * plan.rounds
        else:
            assigned = collections.Counter(assigned_round(run, agent, plan.rounds)
                                           for agent in joined)
            per_round = [assigned[index] for index in range(plan.rounds)]
        pointless = uninformed_reason(plan, per_round)  # then nobody is asked (or pays)
        if pointless is not None:
            result.status, result.reason = "insufficient", pointless
            return
        while not search.done:
            index = search.round
            expected = joined if s.strategy == "sequential" else {
                agent for agent in joined if assigned_round(run, agent, plan.rounds) == index}
            answers: dict[str, int] = {}

            def on_answer(topic, payload):
                message = self._reply(topic, payload, run)
                if message is None:
                    return
                agent = message.agent
                if not isinstance(message, Answer):
                    self.ignored["late_join"] += 1
                elif message.round != index:
                    self.ignored["stale"] += 1
                elif agent not in expected:
                    self.ignored["not_expected"] += 1
                elif agent in answers:
                    self.ignored["duplicate"] += 1
                else:
                    answers[agent] = message.z

            self.client.publish(control, protocol.encode(Round(
                **terms, round=index, rounds=plan.rounds, threshold=search.threshold())), qos=1)
            self.inbox.drain(time.monotonic() + s.round_timeout_seconds,
                             lambda: len(answers) >= len(expected), on_answer)
            if len(answers) < needed:
                result.status, result.history = "insufficient", _history(search)
                result.reason = f"round {index}: {len(answers)} answers, need {needed}"
                return
            search.decide(sum(answers.values()), len(answers))
        assessment = search.assess()
        result.status = "done" if assessment.ok else "insufficient"
        result.reason = assessment.reason
        result.estimate, result.rounds = search.estimate(), plan.rounds
        result.error_bound, result.interval = assessment.error_bound, assessment.interval
        result.confidence = assessment.confidence
        result.history = _history(search)


def _history(search: RangeSearch) -> list:
    return [protocol.RoundRecord(**record) for record in search.history]


def connect_client(config: CollectorConfig, client_id: str) -> MqttClient:
    """A connected clean-session client with the collector's credentials, or
    ``ConnectionError``."""
    return MqttClient(config.broker.endpoint(), client_id, log=log,
                      label="range coordinator").start_and_wait()
