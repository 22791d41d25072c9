"""The hostile corpus (tests/support/hostile.py) against a collector.

* In process: every message of the corpus meets the fate it announces.
* Through a real Mosquitto, into a running collector next to a real fleet: the
  fleet's aggregates equal those of its valid stream alone, every reject is counted
  by its reason, the API answers throughout, and the collector's memory grows by
  less than 50 MB.
"""

from __future__ import annotations

import json
import math
import threading
import time
from types import SimpleNamespace

import msgspec
from paho.mqtt.client import topic_matches_sub

from collector.aggregation.ingest import IngestLimits, Ingestor
from collector.estimation.jsonsafe import json_safe
from collector.range.results import RangeResults
from edge_agent import protocol
from tests.support import (
    CollectorProcess,
    FleetProcess,
    MqttClient,
    Subscriber,
    hostile,
    write_agent_config,
)
from tests.support import wait_for_api as wait_until
from tests.support.ports import HANG_GUARD_SECONDS

RSS_GROWTH_MAX_KB = 50_000


def genuine_reports(now: float, count: int = 3) -> list[tuple[str, bytes]]:
    reports = []
    for agent in hostile.FLEET_AGENTS:
        for seq in range(count):
            for channel, kind, mechanism in (("ax", "linear", hostile.LINEAR),
                                             ("roll", "circular", hostile.CIRCULAR)):
                reports.append((protocol.data_topic(hostile.FLEET, agent, channel),
                                protocol.report(agent=agent, channel=channel, kind=kind,
                                                seq=seq, t=now, dt=1.0,
                                                mechanism=mechanism.describe(),
                                                codes=[1, 2, seq])))
    return reports


def limits() -> IngestLimits:
    settings = {key: value for key, value in hostile.LIMITS.items() if key != "range_results"}
    return IngestLimits(**settings, registry=frozenset(hostile.REGISTRY))


def range_outcome(results: RangeResults, entry: hostile.Hostile) -> str:
    before = dict(results.ignored)
    results.on_message(None, None, SimpleNamespace(topic=entry.topic, payload=entry.payload))
    changed = [reason for reason, n in results.ignored.items() if n != before.get(reason, 0)]
    return "range:" + (changed[0] if changed else "shown")


def test_every_message_of_the_corpus_meets_its_announced_fate():
    now = time.time()
    ingestor = Ingestor(fleet=hostile.FLEET, limits=limits())
    genuine = genuine_reports(now)
    for topic, payload in genuine:
        assert ingestor.ingest(topic, payload, now) == "accepted"
    corpus = hostile.build(now, genuine)
    assert len(corpus) >= 2000 and len({entry.kind for entry in corpus}) >= 25
    results = RangeResults(hostile.FLEET, coordinator=hostile.COORDINATOR,
                           limit=hostile.LIMITS["range_results"])
    for entry in corpus:
        if entry.expect == "dropped":  # the broker's business
            assert len(entry.payload) > hostile.MAX_PACKET
            continue
        outcome = range_outcome(results, entry) if entry.expect.startswith("range:") \
            else ingestor.ingest(entry.topic, entry.payload, now + 1)
        assert outcome == entry.expect, (entry.kind, entry.topic, entry.payload[:200])
    assert ingestor.rejects == hostile.expected(corpus, "rejected")
    assert sorted(results.get()) == ["r0", "r1"]
    # Bounded: the limits hold, and the device that played with its numbers has a
    # handful of runs in its tracker.
    assert len(ingestor.series) == hostile.LIMITS["channels"]
    assert len(ingestor.agents) == hostile.LIMITS["agents"]
    assert len(ingestor.trackers[("mallory", "m")].runs) < 40


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def channel_document(ingestor: Ingestor, name: str) -> dict:
    """A channel's aggregates as the API gives them (without other_series): its total's
    estimates and each window's history point."""
    series = ingestor.series[name][ingestor.latest[name]]
    document = series.get()
    document["windows"] = [msgspec.to_builtins(series.estimate(series.windows[start],
                                                               series.window_seconds, start)[1])
                           for start in sorted(series.windows)]
    return json.loads(json.dumps(json_safe(document)))


def test_a_collector_next_to_a_fleet_takes_the_corpus_unharmed(tmp_path, mosquitto):
    registry = tmp_path / "agents.txt"
    registry.write_text("\n".join(hostile.REGISTRY) + "\n")
    collector = CollectorProcess(
        tmp_path, mosquitto, checkpoint_seconds=1, limits=hostile.LIMITS,
        registry={"agents": "registered", "file": str(registry)},
        range_discovery={"client_id": hostile.COORDINATOR}).start()
    wire = Subscriber(mosquitto, f"ldp/v1/{hostile.FLEET}/+/+")  # what really went over
    fleet = FleetProcess(write_agent_config(
        tmp_path / "fleet.toml", agent_id="w", broker=mosquitto, state_dir=tmp_path / "fleet",
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50, "duration": 20.0}],
        channels=list(hostile.FLEET_CHANNELS.values())), tmp_path / "fleet.log", 4).start()
    attacker = MqttClient(mosquitto, v5=False).connect()
    try:
        def fleet_reporting() -> bool:
            channels = collector.api()["channels"]
            return all(channels.get(name, {}).get("agents") == 4
                       for name in hostile.FLEET_CHANNELS)

        assert wait_until(fleet_reporting, 60), fleet.output()[-2000:]
        time.sleep(2)  # the collector's memory after its first checkpoints
        pids = [collector.pid, *children(collector.pid)]
        rss_before = sum(map(rss_kb, pids))
        with wire._lock:
            replays = [(topic, payload) for topic, payload, _ in wire.messages
                       if topic.split("/")[3] in hostile.FLEET_AGENTS][:100]
        corpus = hostile.build(time.time(), replays)

        answers: list[object] = []  # the API's answers, or what failed instead
        sending = threading.Event()
        sending.set()

        def watch_api():  # the API keeps answering while the corpus arrives
            while sending.is_set():
                try:
                    answers.append(collector.api()["fleet"])
                except Exception as exc:
                    answers.append(exc)
                time.sleep(0.1)

        watcher = threading.Thread(target=watch_api, daemon=True)
        watcher.start()
        for entry in corpus:
            attacker.publish(entry.topic, entry.payload, retain=entry.retain)
        attacker.flush(120)
        # Through the broker, the collector gets only what its subscription matches.
        delivered = [entry for entry in corpus if topic_matches_sub(
            protocol.data_subscription(hostile.FLEET), entry.topic)]
        expected_rejects = hostile.expected(delivered, "rejected")
        assert wait_until(lambda: collector.api()["ingest"]["rejects"] == expected_rejects,
                          120), (collector.api()["ingest"]["rejects"], expected_rejects)
        sending.clear()
        watcher.join(HANG_GUARD_SECONDS)
        assert fleet.wait(120) == 0, fleet.output()[-3000:]
        rss_after = sum(map(rss_kb, pids))

        # The fleet's valid stream alone, aggregated in process: every genuine report
        # the wire carried (the corpus's replays are byte for byte genuine ones).
        hostile_messages = {(entry.topic, entry.payload) for entry in corpus
                            if entry.expect != "duplicate"}
        reference = Ingestor(fleet=hostile.FLEET, window_seconds=5)  # as CollectorProcess
        with wire._lock:
            genuine = [(topic, payload) for topic, payload, _ in wire.messages
                       if topic.split("/")[3] in hostile.FLEET_AGENTS
                       and topic.split("/")[4] in hostile.FLEET_CHANNELS
                       and (topic, payload) not in hostile_messages]
        outcomes = [reference.ingest(topic, payload) for topic, payload in genuine]
        assert set(outcomes) <= {"accepted", "duplicate"}
        fleet_messages = reference.counters["messages"]

        def fleet_counted() -> int:
            agents = collector.api()["agents"]
            return sum(agents[agent]["messages"] for agent in hostile.FLEET_AGENTS)

        assert wait_until(lambda: fleet_counted() == fleet_messages, 60), \
            (fleet_counted(), fleet_messages)
        assert wait_until(lambda: all(collector.api()["channels"][name]["state"] == "ready"
                                      for name in hostile.FLEET_CHANNELS))
        for name in hostile.FLEET_CHANNELS:
            document = collector.api(f"/api/channels/{name}")
            expected = channel_document(reference, name)
            # Equal; float sums (a circle's cos and sin) up to their order of summation.
            assert_close({key: document[key] for key in expected}, expected, name)
            assert document["other_series"] == []
        agents = collector.api()["agents"]
        for agent in hostile.FLEET_AGENTS:
            assert agents[agent]["values"] == reference.agents[agent].values
            # Rejects on a device's topics are counted against it too (no more, no less).
            assert agents[agent]["rejects"] == sum(
                1 for entry in delivered if entry.expect.startswith("rejected:")
                and len(entry.topic.split("/")) == 5 and entry.topic.split("/")[3] == agent)
        ranges = collector.api("/api/range")
        assert sorted(ranges["channels"]) == ["r0", "r1"]
        assert ranges["ignored"] == {reason: n for reason, n in
                                     hostile.expected(corpus, "range").items() if reason != "shown"}
        # Every request answered (how fast: benchmarks/bench_collector_load.py).
        assert answers and set(answers) == {hostile.FLEET}, answers
        assert rss_after - rss_before < RSS_GROWTH_MAX_KB, (rss_before, rss_after)
    finally:
        attacker.close()
        wire.close()
        fleet.kill()
    assert collector.terminate() == 0


def assert_close(got, expected, where: str) -> None:
    """Equal, floats to 1e-9 relative (numbers summed in another order)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for key in expected:
            assert_close(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(expected, float) and isinstance(got, float):
        assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12), (where, got, expected)
    else:
        assert got == expected, (where, got, expected)


def children(pid: int) -> list[int]:
    found = []
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        found.extend(map(int, listed.read().split()))
    return found
