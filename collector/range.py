"""The coordinator of range discovery: one private min or max search over MQTT.

A run (docs/PROTOCOL.md, "Range discovery"):

1. ``announce`` on ``_range/control/<run>`` with the channel, side,
   epsilon, strategy and window; agents reply ``join`` (accept or refuse)
   on ``<agent>/_range/<run>`` until ``join_timeout_seconds``.
2. N = the agents that accepted.  Fewer than ``min_participants``: the run
   ends ``insufficient``.  Otherwise L and h_N follow the paper
   (``edge_agent.rangefind.plan_search``).
3. Each round publishes the threshold and collects one answer per expected
   agent (every joined agent, or for ``split`` those assigned to the round)
   until all have answered or ``round_timeout_seconds`` passes.  Answers
   from agents that did not join, for another round (stale or early),
   repeated, malformed or sent on another agent's topic are ignored and
   counted.  A round with too few answers ends the run ``insufficient``.
4. ``end`` on the control topic, and the result (estimate, rounds,
   participants, parameters, started_at, finished_at, per-round history)
   retained on ``_range/result/<channel>/<side>``.

The search itself is ``edge_agent.rangefind.RangeSearch``; this module only
moves messages.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

import paho.mqtt.client as mqtt

from edge_agent import protocol
from edge_agent.rangefind import RangeSearch, assigned_round, plan_search

from .jsonsafe import json_safe
from .config import CollectorBrokerConfig, CollectorConfig, RangeDiscoveryConfig

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 1024


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
    """Runs searches with a connected paho client (it subscribes per run)."""

    def __init__(self, client: mqtt.Client, *, fleet: str, settings: RangeDiscoveryConfig,
                 clock: Callable[[], float] = time.time):
        self.client = client
        self.fleet = fleet
        self.settings = settings
        self.clock = clock
        self.ignored: collections.Counter = collections.Counter()
        self.inbox = ReplyInbox()
        client.on_message = self.inbox.on_message

    # -- replies ----------------------------------------------------------------------------
    def _reply(self, topic: str, payload: bytes, run: str) -> dict | None:
        """A well-formed reply of this run from the agent its topic names, or None."""
        levels = topic.split("/")
        if len(levels) != 6 or levels[5] != run or len(payload) > MAX_REPLY_BYTES:
            self.ignored["malformed"] += 1
            return None
        try:
            message = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            self.ignored["malformed"] += 1
            return None
        if not isinstance(message, dict) or message.get("run") != run \
                or message.get("type") not in ("join", "answer"):
            self.ignored["malformed"] += 1
            return None
        if message.get("agent") != levels[3]:
            self.ignored["spoofed"] += 1
            return None
        return message

    # -- one run ------------------------------------------------------------------------------
    def run(self, request: RunRequest, *, expected_agents: int | None = None) -> dict:
        s = self.settings
        run = f"{request.channel}-{request.side}-{int(self.clock())}-{secrets.token_hex(3)}"
        started = self.clock()
        result = {"v": protocol.PROTOCOL_VERSION, "run": run, "channel": request.channel,
                  "side": request.side, "domain": [request.low, request.high],
                  "started_at": started}
        reply_topic = protocol.range_reply_subscription(self.fleet, run)
        self.client.subscribe(reply_topic, qos=1)
        try:
            return self._search(run, request, result, expected_agents)
        finally:
            self.client.unsubscribe(reply_topic)
            self.client.publish(protocol.range_control_topic(self.fleet, run),
                                protocol.encode({"v": 1, "type": "end", "run": run,
                                                 "status": result.get("status")}), qos=1)
            result["finished_at"] = self.clock()
            result["ignored_replies"] = dict(self.ignored)
            published = self.client.publish(
                protocol.range_result_topic(self.fleet, request.channel, request.side),
                protocol.encode(json_safe(result)), qos=1, retain=True)
            try:  # the result is the point of the run: see it acknowledged
                published.wait_for_publish(10)
            except (RuntimeError, ValueError):
                log.warning("range result for %s/%s not acknowledged by the broker",
                            request.channel, request.side)
            log.info("range run %s: %s, estimate %s", run, result.get("status"),
                     result.get("estimate"))

    def _search(self, run: str, request: RunRequest, result: dict,
                expected_agents: int | None) -> dict:
        s = self.settings
        self.ignored.clear()
        terms = {"run": run, "channel": request.channel, "side": request.side,
                 "epsilon": s.epsilon, "strategy": s.strategy,
                 "window_seconds": s.window_seconds}
        control = protocol.range_control_topic(self.fleet, run)
        time.sleep(0.2)  # let the reply subscription settle before anyone can answer
        self.client.publish(control, protocol.encode({"v": 1, "type": "announce", **terms,
                                                      "domain": [request.low, request.high]}),
                            qos=1)
        joined: set[str] = set()
        refused: collections.Counter = collections.Counter()

        def on_join(topic, payload):
            message = self._reply(topic, payload, run)
            if message is None:
                return
            if message["type"] != "join":
                self.ignored["early"] += 1
            elif message.get("accept") is True:
                joined.add(message["agent"])
            else:
                refused[str(message.get("reason"))[:40]] += 1

        # Joins are collected until the deadline, or until as many agents as the
        # caller expects (e.g. those online) have joined; 0 or None: unknown.
        self.inbox.drain(time.monotonic() + s.join_timeout_seconds,
                         lambda: bool(expected_agents) and len(joined) >= expected_agents,
                         on_join)
        result.update(participants=len(joined), refused=dict(refused))
        if len(joined) < s.min_participants:
            result.update(status="insufficient",
                          reason=f"{len(joined)} agents joined, min_participants is "
                                 f"{s.min_participants}")
            return result
        plan = plan_search(participants=len(joined), epsilon=s.epsilon, strategy=s.strategy,
                           alpha_min=s.alpha_min, rounds=s.rounds, h=s.h)
        search = RangeSearch(low=request.low, high=request.high, side=request.side, plan=plan)
        result["parameters"] = {**plan.describe(), "alpha_min": s.alpha_min,
                                "answer_epsilon": plan.answer_epsilon,
                                "window_seconds": s.window_seconds}
        needed = s.min_participants if s.strategy == "sequential" else max(
            1, math.ceil(s.min_participants / plan.rounds))
        while not search.done:
            index = search.round
            expected = joined if s.strategy == "sequential" else {
                agent for agent in joined if assigned_round(run, agent, plan.rounds) == index}
            answers: dict[str, int] = {}

            def on_answer(topic, payload):
                message = self._reply(topic, payload, run)
                if message is None:
                    return
                agent = message["agent"]
                if message["type"] != "answer":
                    self.ignored["late_join"] += 1
                elif message.get("round") != index:
                    self.ignored["stale"] += 1
                elif agent not in expected:
                    self.ignored["not_expected"] += 1
                elif agent in answers:
                    self.ignored["duplicate"] += 1
                elif message.get("z") not in (-1, 1) or isinstance(message.get("z"), bool):
                    self.ignored["malformed"] += 1
                else:
                    answers[agent] = message["z"]

            self.client.publish(control, protocol.encode({
                "v": 1, "type": "round", **terms, "round": index, "rounds": plan.rounds,
                "threshold": search.threshold()}), qos=1)
            self.inbox.drain(time.monotonic() + s.round_timeout_seconds,
                             lambda: len(answers) >= len(expected), on_answer)
            if len(answers) < needed:
                result.update(status="insufficient", history=search.history,
                              reason=f"round {index}: {len(answers)} answers, need {needed}")
                return result
            search.decide(sum(answers.values()), len(answers))
        result.update(status="done", estimate=search.estimate(), rounds=plan.rounds,
                      history=search.history)
        return result


def new_client(broker: CollectorBrokerConfig, client_id: str) -> mqtt.Client:
    """A clean-session paho client with the collector's credentials and TLS, not connected."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=broker.paho_protocol)
    if broker.username is not None:
        client.username_pw_set(broker.username, broker.resolved_password())
    if broker.tls is not None:
        import ssl

        client.tls_set(ca_certs=str(broker.tls.ca) if broker.tls.ca else None,
                       certfile=str(broker.tls.cert) if broker.tls.cert else None,
                       keyfile=str(broker.tls.key) if broker.tls.key else None,
                       cert_reqs=ssl.CERT_REQUIRED)
        client.tls_insecure_set(broker.tls.insecure)
    return client


def connect_client(config: CollectorConfig, client_id: str) -> mqtt.Client:
    """A connected clean-session client (MQTT 5 or 3.1.1) with the collector's credentials."""
    broker = config.broker
    client = new_client(broker, client_id)
    connected = threading.Event()
    failure: list[str] = []

    def on_connect(client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            failure.append(str(reason_code))
        connected.set()

    client.on_connect = on_connect
    client.connect(broker.host, broker.port, broker.keepalive)
    client.loop_start()
    if not connected.wait(15) or failure:
        client.loop_stop()
        raise ConnectionError(f"broker {broker.host}:{broker.port} refused or did not answer: "
                              f"{failure[0] if failure else 'timeout'}")
    return client
