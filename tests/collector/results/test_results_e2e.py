"""Results that last, through a real Mosquitto into a real collector process and its real
SQLite results store: a study's minutes, hours and day are served from the store by time
range; a collector killed (SIGKILL) again and again while it writes loses no closed window
and counts none twice; a restarted collector serves the same results at once."""

from __future__ import annotations

import csv
import io
import time
import urllib.error
import urllib.request

import numpy as np

from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import CollectorProcess, MqttClient
from tests.support import wait_for_api as wait_until

FLEET = "demo"
MECHANISM = ClassicalOGPM(epsilon=2.0, low=0.0, high=1.0)
MINUTE, HOUR = 60.0, 3600.0


def _reports(rng, first_hour: float, hours: int, agents: int = 3):
    """A report of 30 values per agent every 20 s over ``hours`` whole hours from
    ``first_hour`` (Unix seconds): (topic, payload, t, values)."""
    out = []
    for agent in range(agents):
        for seq, t in enumerate(np.arange(first_hour, first_hour + hours * HOUR, 20.0).tolist()):
            codes = MECHANISM.perturb_codes(rng.uniform(0.2, 0.8, 30), rng).tolist()
            name = f"w{agent}"
            out.append((protocol.data_topic(FLEET, name, "hr"),
                        protocol.report(agent=name, channel="hr", kind="linear", seq=seq,
                                        t=t + agent, dt=1.0, codes=codes,
                                        mechanism=MECHANISM.describe()), t + agent, 30))
    return out


def _expected(reports, span: float) -> dict[float, int]:
    counts: dict[float, int] = {}
    for _, _, t, values in reports:
        start = (t // span) * span
        counts[start] = counts.get(start, 0) + values
    return counts


def _history(collector, query: str) -> list[dict]:
    return collector.api(f"/api/channels/hr/history?{query}")["points"]


def _counts(collector, span_name: str, start: float, end: float) -> dict[float, int]:
    try:
        points = _history(collector, f"resolution={span_name}&start={start}&end={end}")
    except urllib.error.HTTPError:
        return {}
    return {point["start"]: point["count"] for point in points}


def _collector(tmp_path, mosquitto) -> CollectorProcess:
    return CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=0.5,
                            aggregates={"resolutions": ["1m", "1h", "1d"],
                                        "history_seconds": 600},
                            results={"close_after_seconds": 0})


def test_killed_while_writing_a_collector_loses_no_window_and_counts_none_twice(
        tmp_path, mosquitto):
    """Two past hours of three wearables' reports, sent in bursts with a SIGKILL of the
    collector after each: every minute and hour the store serves counts exactly what was
    sent, and the restarted collector serves it at once."""
    rng = np.random.default_rng(6)
    first = (time.time() // HOUR - 3) * HOUR  # three hours ago, on the hour
    reports = _reports(rng, first, hours=2)
    collector = _collector(tmp_path, mosquitto).start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    bursts = np.array_split(np.arange(len(reports)), 4)
    try:
        for burst in bursts:
            for i in burst:
                publisher.publish(*reports[i][:2])
            publisher.flush()
            # Killed at an arbitrary instant of ingesting, checkpointing and writing.
            time.sleep(float(rng.uniform(0.2, 1.5)))
            collector.kill()
            collector = _collector(tmp_path, mosquitto).start()
        minutes, hours = _expected(reports, MINUTE), _expected(reports, HOUR)
        end = first + 2 * HOUR
        assert wait_until(lambda: _counts(collector, "1h", first, end) == hours, 60), \
            (_counts(collector, "1h", first, end), hours)
        assert wait_until(lambda: _counts(collector, "1m", first, end) == minutes, 60)
        ingest = collector.api()["ingest"]
        assert ingest["messages"] == len(reports) and ingest["values"] == 30 * len(reports)
        # The two hours were closed into the store (not served from memory): a clean stop
        # and a restart serve the same windows at once, estimates included.
        before = _history(collector, f"resolution=1h&start={first}&end={end}")
        csv_before = urllib.request.urlopen(
            f"{collector.url}/api/channels/hr/history?resolution=1m&start={first}&end={end}"
            f"&format=csv").read()
        assert collector.terminate() == 0
        collector = _collector(tmp_path, mosquitto).start()
        assert _history(collector, f"resolution=1h&start={first}&end={end}") == before
        table = list(csv.DictReader(io.StringIO(csv_before.decode())))
        assert {float(row["start"]): int(row["count"]) for row in table} == minutes
        assert all(0.0 <= float(row["mean"]) <= 1.0 for row in table)
    finally:
        publisher.close()
        collector.kill()


def test_a_hostile_history_query_is_refused_and_slows_nothing(tmp_path, mosquitto):
    collector = _collector(tmp_path, mosquitto).start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    try:
        rng = np.random.default_rng(1)
        reports = _reports(rng, (time.time() // HOUR - 1) * HOUR, hours=1, agents=1)[:30]
        for topic, payload, _, _ in reports:
            publisher.publish(topic, payload)
        publisher.flush()
        assert wait_until(lambda: collector.api()["ingest"]["messages"] == 30, 30)
        for query, parameter in (("resolution=1y", "resolution"), ("start=-5", "start"),
                                 ("resolution=1m&start=0&end=99999999999", "end"),
                                 ("start=20&end=10", "start"), ("format=pdf", "format")):
            try:
                collector.api(f"/api/channels/hr/history?{query}")
                raise AssertionError(f"{query} was answered")
            except urllib.error.HTTPError as exc:
                assert exc.code == 400
                assert exc.read().decode().startswith(f'{{"error":"{parameter}:')
        # A report after them is counted as ever.
        later = protocol.report(agent="w0", channel="hr", kind="linear", seq=1000,
                                t=time.time(), dt=1.0, codes=[1, 2, 3],
                                mechanism=MECHANISM.describe())
        publisher.publish(protocol.data_topic(FLEET, "w0", "hr"), later)
        publisher.flush()
        assert wait_until(lambda: collector.api()["ingest"]["messages"] == 31, 30)
    finally:
        publisher.close()
        collector.kill()
