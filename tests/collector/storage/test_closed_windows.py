"""Closed windows' sums in the collector store: saved once, beside the checkpoint, until
the results store has them (``CollectorStore.checkpoint``, ``Ingestor.unsaved``).

With the collector's own service on real SQLite files: the results store ends with
exactly the windows of an ingestor that kept every window, whether the recorder wrote
them before or after a restart; a store that lost a window's sums stops the restart
saying so."""

from __future__ import annotations

import sqlite3
import time

import msgspec
import numpy as np
import pytest

from collector.aggregation import ingest
from collector.aggregation.ingest import Ingestor
from collector.config import load_collector_config
from collector.results.store import SeriesRecord
from collector.service import CollectorService
from collector.storage.checkpoint import CheckpointError, dump
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import CollectorProcess, MqttClient
from tests.support import wait_for_api as wait_until
from tests.support.configs import write_toml

FLEET = "demo"
WINDOW = 5.0
T0 = 1_700_000_000.0
MECHANISM = ClassicalOGPM(epsilon=2.0, low=0.0, high=1.0)


def _config(tmp_path):
    return load_collector_config(write_toml(tmp_path / "collector.toml", {
        "fleet": FLEET, "storage": {"path": str(tmp_path / "state.sqlite"),
                                    "checkpoint_seconds": 3600},
        "aggregates": {"window_seconds": WINDOW, "resolutions": ["5s", "1m"]},
        "results": {"close_after_seconds": 0}}))


def _reports(rng, agents=("w1", "w2", "w3"), seqs=range(40)):
    """(topic, payload, received): every agent one report of 20 values every 3 s."""
    return [(protocol.data_topic(FLEET, agent, "x"),
             protocol.report(agent=agent, channel="x", kind="linear", seq=seq,
                             t=T0 + 3.0 * seq, dt=1.0, mechanism=MECHANISM.describe(),
                             codes=MECHANISM.perturb_codes(rng.uniform(0, 1, 20),
                                                           rng).tolist()),
             T0 + 3.0 * seq + 0.5)
            for seq in seqs for agent in agents]


def _service(config, reports=()) -> CollectorService:
    service = CollectorService(config, web=False)
    service.clock = lambda: T0 + 10_000.0  # every window of the reports has ended
    for topic, payload, received in reports:
        service.store.append(topic, payload, received)
    service.store.commit()
    while service.catch_up():
        pass
    return service


def _closed_rows(config) -> int:
    with sqlite3.connect(config.storage.path) as db:
        return db.execute("SELECT COUNT(*) FROM closed").fetchone()[0]


def _expected(reports) -> dict:
    """(span, start) -> (count, sums, point) of every window, from an ingestor that kept
    them all."""
    reference = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=(12,), keep_windows=1000)
    for topic, payload, received in reports:
        reference.ingest(topic, payload, now=received)
    series = next(iter(reference.series["x"].values()))
    expected = {}
    for level, windows in enumerate(series.levels):
        for start, blocks in windows.items():
            count, point = series.estimate(blocks, series.span(level), start)
            expected[(series.span(level), start)] = (count, series.blocks_state(blocks),
                                                     msgspec.json.encode(point))
    return expected


def _stored(service: CollectorService) -> dict:
    series = next(iter(service.ingestor.series["x"].values()))
    key = SeriesRecord.of(series).key
    return {(row.span, row.start): (row.count, row.sums, row.point)
            for span in (WINDOW, 60.0)
            for row in service.results.windows(key, span, -10**12, 10**12, 10**6)}


@pytest.mark.parametrize("restart", [False, True])
def test_closed_sums_are_saved_once_beside_the_checkpoint_and_written_exactly(tmp_path,
                                                                              restart):
    config = _config(tmp_path)
    reports = _reports(np.random.default_rng(4))
    service = _service(config, reports)
    try:
        assert service.checkpoint()
        windows = [window for batch in service.ingestor.pending.values() for window in batch]
        assert len(windows) == len(_expected(reports))  # every window of both resolutions
        # Saved beside the state, not in it, and no longer held in memory.
        assert _closed_rows(config) == len(windows)
        assert all(window.sums is None for window in windows)
        assert not service.ingestor.unsaved()
        state, _ = service.store.load()
        assert b'"blocks"' not in state and state.count(b"null") >= len(windows)
        assert service.checkpoint()  # nothing closed since: nothing saved again
        assert _closed_rows(config) == len(windows)
        if restart:  # the recorder had not written them
            service.store.close()
            service = _service(config)
            assert [window.sums for batch in service.ingestor.pending.values()
                    for window in batch] == [None] * len(windows)
        service.recorder.wake(service.ingestor.flushes)
        assert service.recorder.record() == len(windows)
        assert _stored(service) == _expected(reports)
        assert not service.ingestor.pending
        assert service.checkpoint()  # the written batch leaves the collector store
        assert _closed_rows(config) == 0
    finally:
        service.store.close()


@pytest.mark.parametrize("damage, reason", [
    ("DELETE FROM closed WHERE seq = 3", "1 window\\(s\\) missing"),
    ("UPDATE closed SET sums = X'7B7D' WHERE seq = 2", "window 2"),
    ("UPDATE closed SET seq = 100000 WHERE seq = 0", "window 100000: not a window"),
])
def test_a_store_that_lost_closed_sums_stops_the_restart_saying_why(tmp_path, damage, reason):
    config = _config(tmp_path)
    service = _service(config, _reports(np.random.default_rng(5)))
    try:
        assert service.checkpoint()
    finally:
        service.store.close()
    with sqlite3.connect(config.storage.path) as db:
        db.execute(damage)
    with pytest.raises(CheckpointError, match=f"closed windows cannot be read.*{reason}"):
        CollectorService(config, web=False)


def test_a_checkpoint_with_the_sums_inside_is_still_read_and_saves_them_beside(tmp_path):
    """A checkpoint of a collector before the closed table: its windows' sums come with
    it, and the next checkpoint moves them to the table."""
    config = _config(tmp_path)
    reports = _reports(np.random.default_rng(6))
    service = _service(config, reports)
    try:
        service.ingestor.close_windows(service.clock(), 0.0)
        state = msgspec.json.decode(dump(service.ingestor))
        for batch, windows in zip(state["state"]["pending"], service.ingestor.pending.values()):
            # [series, span, start, delta, blocks] as such a collector wrote them
            batch[1] = [window[:4] + [msgspec.json.decode(closed.sums)]
                        for window, closed in zip(batch[1], windows)]
        service.store.checkpoint(msgspec.json.encode(state), service.position)
    finally:
        service.store.close()
    service = _service(config)
    try:
        assert all(window.sums is not None for batch in service.ingestor.pending.values()
                   for window in batch)
        assert service.checkpoint()
        assert _closed_rows(config) == sum(map(len, service.ingestor.pending.values()))
        service.recorder.wake(service.ingestor.flushes)
        service.recorder.record()
        assert _stored(service) == _expected(reports)
    finally:
        service.store.close()


def test_a_burst_of_history_is_closed_early_and_a_steady_fleet_is_not(monkeypatch):
    """Windows opened since the last close beyond ``OPENED_BEFORE_CLOSING`` (a burst of
    history) ask for a close now: the open windows a burst holds at once stay bounded."""
    monkeypatch.setattr(ingest, "OPENED_BEFORE_CLOSING", 30)
    ingestor = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=(12,), keep_windows=1000,
                        recording=True)
    steady = _reports(np.random.default_rng(7), seqs=range(20))  # 60 s: 12 + 1 + 1 windows
    with ingestor.batch():
        for topic, payload, received in steady:
            ingestor.ingest(topic, payload, now=received)
    assert ingestor.opened == 14 and not ingestor.overfull
    burst = _reports(np.random.default_rng(8), agents=("w4",), seqs=range(100, 160))
    for topic, payload, received in burst[:10]:  # one at a time, as outside a batch
        ingestor.ingest(topic, payload, now=received)
    assert not ingestor.overfull
    with ingestor.batch():
        for topic, payload, received in burst[10:]:
            ingestor.ingest(topic, payload, now=received)
    assert ingestor.opened > 30 and ingestor.overfull
    assert ingestor.close_windows(T0 + 10_000.0, 0.0) is not None
    assert ingestor.opened == 0 and not ingestor.overfull
    without_store = Ingestor(fleet=FLEET, window_seconds=WINDOW, keep_windows=10)
    for topic, payload, received in burst:
        without_store.ingest(topic, payload, now=received)
    assert without_store.opened == 0 and not without_store.overfull  # nothing to close


def test_the_collector_closes_a_burst_of_history_without_waiting_for_its_checkpoint(
        tmp_path, mosquitto, monkeypatch):
    """The service with its network child and a real broker: a burst of reports into past
    windows reaches the results store long before the hourly checkpoint."""
    monkeypatch.setattr(ingest, "OPENED_BEFORE_CLOSING", 30)
    collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=3600,
                                 aggregates={"window_seconds": 60, "history_seconds": 3600},
                                 results={"close_after_seconds": 0})  # its config
    # An hour of minutes: no series holds more windows than it keeps (61).
    config = load_collector_config(collector.config)
    service = CollectorService(config, web=False)
    service.start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    try:
        assert wait_until(lambda: service.store.network()["connected"], 30)
        now = time.time()
        for seq in range(60):  # an hour ago, a report a minute: 60 minutes, 2 hours, a day
            payload = protocol.report(agent="w1", channel="x", kind="linear", seq=seq,
                                      t=now - 3600 + 60 * seq, dt=1.0, codes=[1, 2, 3],
                                      mechanism=MECHANISM.describe())
            publisher.publish(protocol.data_topic(config.fleet, "w1", "x"), payload)
        publisher.flush()
        assert wait_until(lambda: service.recorder.written_windows >= 30, 30)
        assert service.ingestor.counters["messages"] == 60
    finally:
        publisher.close()
        service.stop()
