"""Windows at several resolutions, closed into a real SQLite results store: a coarser window
is the exact merge of its finer ones for every kind, late reports merge exactly into what
the store holds, a batch is written once whatever crashes, retention drops exactly what it
should."""

from __future__ import annotations

import threading

import msgspec
import numpy as np
import pytest

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import new_series
from collector.config import ConfigError, parse_collector_config
from collector.results.recorder import ResultsRecorder
from collector.results.sqlite import SqliteResultsStore
from collector.results.store import SeriesRecord
from collector.storage.checkpoint import dump, load
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.collector.aggregation.test_stats import _message, _same_view, _series_cases

WINDOW = 10.0
COARSER = (3, 4)  # 10 s, 30 s, 120 s
SPANS = (10.0, 30.0, 120.0)
FLEET = "demo"


def _series(spec, **settings):
    spec = dict(spec)
    mechanism = spec.pop("mechanism")
    return new_series(channel="c", description=protocol.describe(mechanism),
                      keep_windows=50, **{"window_seconds": WINDOW, **settings}, **spec)


def _messages(case, mechanism, seed=5, n=40):
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0.0, 480.0, n))
    return [(f"agent-{i % 4}", float(t), _message(case, mechanism, rng, 30))
            for i, t in enumerate(times)]


@pytest.mark.parametrize("name", list(_series_cases()))
def test_every_coarser_window_is_the_exact_merge_of_its_finer_ones(name):
    """For every kind: each level's window counts what its finer windows count, its sums
    are their merge, and its estimates are those of one window holding all its reports."""
    spec, case = _series_cases()[name]
    messages = _messages(case, spec["mechanism"])
    series = _series(spec, coarser=COARSER, recording=True)
    series.update_many(messages)
    closed = series.close(now=10_000.0, grace=0.0)
    by_span = {span: {w.start: w for w in closed if w.span == span} for span in SPANS}
    assert sum(w.count for w in by_span[10.0].values()) == series.count()
    for fine, coarse, factor in ((10.0, 30.0, 3), (30.0, 120.0, 4)):
        for start, window in by_span[coarse].items():
            parts = [w for s, w in by_span[fine].items() if s // factor == start]
            assert window.count == sum(part.count for part in parts) > 0
            merged = series._new_blocks()
            for part in parts:
                for block_name, block in merged.items():
                    block.merge(part.blocks()[block_name])
            assert merged == window.blocks()
    # An hour (here 120 s) estimated from merged sums is one 120 s window's estimate.
    whole = _series(spec, window_seconds=120.0)
    whole.update_many(messages)
    for start, window in by_span[120.0].items():
        _, point = series.estimate(window.blocks(), 120.0, start)
        _, reference = whole.estimate(whole.windows[start], 120.0, start)
        assert _same_view(msgspec.to_builtins(point), msgspec.to_builtins(reference))


def _linear_report(rng, seq: int, t: float, n: int = 50, agent: str = "w1"):
    mechanism = ClassicalOGPM(epsilon=2.0, low=0.0, high=1.0)
    payload = protocol.report(agent=agent, channel="x", kind="linear", seq=seq, t=t, dt=1.0,
                              codes=mechanism.perturb_codes(rng.uniform(0, 1, n), rng).tolist(),
                              mechanism=mechanism.describe())
    return protocol.data_topic(FLEET, agent, "x"), payload


def _stored(store: SqliteResultsStore, ingestor: Ingestor) -> dict:
    """Every stored window: (span, start) -> (count, sums)."""
    series = next(iter(ingestor.series["x"].values()))
    key = SeriesRecord.of(series).key
    return {(row.span, row.start): (row.count, row.sums)
            for span in SPANS for row in store.windows(key, span, -10**9, 10**9, 10**6)}


def _recorder(store, ingestor, lock=None):
    recorder = ResultsRecorder(store, source="test", aggregates=lambda: ingestor,
                               lock=lock or threading.RLock(), retention={})
    recorder.durable = 10**9
    return recorder


def late_reports_study(store):
    """160 reports over 480 s, 4 of them late, into ``store`` at a checkpoint every 25:
    (the ingestor, its recorder, the reports on time, the late ones)."""
    rng = np.random.default_rng(11)
    reports = [_linear_report(rng, seq, 3.0 * seq) for seq in range(160)]  # 0 .. 480 s
    late = [reports.pop(i) for i in (150, 90, 40, 7)]  # arrive at the end
    ingestor = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER, keep_windows=50,
                        recording=True)
    recorder = _recorder(store, ingestor)
    for i, (topic, payload) in enumerate(reports):
        assert ingestor.ingest(topic, payload, now=1e9) == "accepted"
        if i % 25 == 24:  # a checkpoint: what ended closes, and is written
            ingestor.close_windows(now=3.0 * i, grace=5.0)
            recorder.record()
    for topic, payload in late:
        assert ingestor.ingest(topic, payload, now=1e9) == "accepted"
    assert ingestor.close_windows(now=10_000.0, grace=0.0) is not None
    recorder.record()
    assert not ingestor.pending
    return ingestor, recorder, reports, late


def test_late_reports_are_merged_exactly_into_the_stored_windows(tmp_path):
    """Windows are closed and written while reports arrive, some of them for windows
    written already: the store ends with exactly the windows of a collector that got every
    report on time and kept every window."""
    store = SqliteResultsStore(tmp_path / "results.sqlite")
    ingestor, recorder, reports, late = late_reports_study(store)
    reference = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER, keep_windows=100,
                         recording=True)  # never closed: every window stays
    for topic, payload in [*reports, *late]:
        reference.ingest(topic, payload, now=1e9)
    series = next(iter(reference.series["x"].values()))
    expected = {(series.span(level), start): (series._count(blocks), series.blocks_state(blocks))
                for level, windows in enumerate(series.levels)
                for start, blocks in windows.items()}
    assert _stored(store, ingestor) == expected
    # The late reports' windows were written twice: first without them, then merged.
    assert recorder.written_windows > len(expected)
    # A window's estimates are a function of its sums alone: the windows merged in the
    # store (their earlier sums, then the late reports') are estimated as the reference's,
    # which counted every report in order, to the last bit.
    key = SeriesRecord.of(series).key
    for level, windows in enumerate(series.levels):
        span = series.span(level)
        stored = {row.start: row.point for row in store.windows(key, span, -10**9, 10**9, 10**6)}
        for start, blocks in windows.items():
            count, point = series.estimate(blocks, span, start)
            assert stored[start] == msgspec.json.encode(point), (span, start)


def test_a_batch_is_written_once_whatever_stops_the_collector(tmp_path):
    """A checkpoint keeps closed windows until the store has them; a collector that stopped
    after the store wrote a batch but before a checkpoint said so writes it again after
    the restart, and the store recognises it: no window counts twice."""
    rng = np.random.default_rng(2)
    store = SqliteResultsStore(tmp_path / "results.sqlite")
    ingestor = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER, keep_windows=50,
                        recording=True)
    for seq in range(40):
        ingestor.ingest(*_linear_report(rng, seq, 5.0 * seq), now=1e9)
    batch = ingestor.close_windows(now=150.0, grace=0.0)
    saved = dump(ingestor)  # the checkpoint holds the batch, pending
    _recorder(store, ingestor).record()
    written = _stored(store, ingestor)
    assert written and store.applied("test") == batch
    restored, _ = load(saved, recording=True)
    assert list(restored.pending) == [batch]
    assert _recorder(store, restored).record() == 0  # skipped: written already
    assert not restored.pending and _stored(store, restored) == written
    with pytest.raises(Exception, match="pending: closed windows for a results store"):
        load(saved)  # read by a collector without a store, the batch would be lost


def test_retention_drops_exactly_the_windows_older_than_their_resolution_keeps(tmp_path):
    rng = np.random.default_rng(4)
    store = SqliteResultsStore(tmp_path / "results.sqlite")
    ingestor = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER, keep_windows=50,
                        recording=True)
    for seq in range(96):
        ingestor.ingest(*_linear_report(rng, seq, 5.0 * seq), now=1e9)
    ingestor.close_windows(now=10_000.0, grace=0.0)
    recorder = _recorder(store, ingestor)
    recorder.record()
    before = _stored(store, ingestor)
    recorder.retention = {10.0: 200.0, 30.0: 100.0, 120.0: float("inf")}
    recorder._clock = lambda: 400.0
    deleted = recorder.retain()
    after = _stored(store, ingestor)
    kept = {(span, start) for span, start in before
            if span == 120.0 or (start + 1) * span > 400.0 - {10.0: 200.0, 30.0: 100.0}[span]}
    assert set(after) == kept and deleted == len(before) - len(kept) > 0
    assert all(after[key] == before[key] for key in kept)


def test_the_write_ahead_log_is_cut_back_after_a_large_retention_delete(tmp_path, monkeypatch):
    """A retention pass deletes a day of windows in one transaction, which grows SQLite's
    write-ahead log; once checkpointed, the next write cuts it back to the limit."""
    from collector.results import sqlite
    from collector.results.store import WindowRow

    monkeypatch.setattr(sqlite, "WAL_LIMIT_BYTES", 2**20)
    store = SqliteResultsStore(tmp_path / "results.sqlite")
    wal = tmp_path / "results.sqlite-wal"
    record = SeriesRecord("k" * 32, "x", "linear", b"{}")
    sums = bytes(600)  # about a window's sums and estimates
    for batch in range(1, 21):
        rows = [WindowRow(record.key, 60.0, 1000 * batch + i, 1, sums, b"{}")
                for i in range(1000)]
        assert store.write("test", batch, [record], rows, now=0.0)
    assert store.retain(60.0, 60.0 * 10**6) == 20_000
    grown = wal.stat().st_size
    store.write("test", 21, [record], [WindowRow(record.key, 60.0, 0, 1, sums, b"{}")], 0.0)
    assert grown > 4 * 2**20 and wal.stat().st_size <= 2**20
    assert [row.start for row in store.windows(record.key, 60.0, -1, 10**9, 10)] == [0]


def _config(**sections):
    return parse_collector_config({"fleet": FLEET, **sections})


def test_resolutions_and_retention_are_configured_by_name():
    config = _config()
    assert config.aggregates.resolution_names == ["1m", "1h", "1d"]
    assert config.aggregate_settings.coarser == (60, 24)
    assert config.retention() == {60.0: 7 * 86400.0, 3600.0: 400 * 86400.0,
                                  86400.0: float("inf")}
    config = _config(aggregates={"resolutions": ["10s", "5m", "1h"]},
                     results={"retention": {"5m": "30d", "1h": "forever"}})
    assert config.aggregates.window_seconds == 10.0
    assert config.aggregate_settings.coarser == (30, 12)
    assert config.retention() == {10.0: 7 * 86400.0, 300.0: 30 * 86400.0,
                                  3600.0: float("inf")}
    assert _config(aggregates={"window_seconds": 7}).aggregates.spans == [7.0]


@pytest.mark.parametrize("sections, message", [
    ({"aggregates": {"resolutions": ["1m", "90s"]}},
     r"aggregates.resolutions: 90s must be a whole number"),
    ({"aggregates": {"resolutions": ["1 minute"]}},
     r"aggregates.resolutions: expected a number and a unit"),
    ({"aggregates": {"window_seconds": 10, "resolutions": ["1m"]}},
     r"aggregates.resolutions: the finest \(1m\) must be window_seconds"),
    ({"aggregates": {"resolutions": []}}, r"aggregates.resolutions"),
    ({"results": {"retention": {"1w": "3d"}}}, r"results.retention.1w: not one of the"),
    ({"results": {"retention": {"1h": "soon"}}}, r"results.retention.1h: \"forever\" or a"),
    ({"results": {"url": "mysql://x"}}, r"results.url"),
    ({"results": {"url": "postgresql://u@h/db", "path": "/tmp/r.sqlite"}},
     r"results.url: give a PostgreSQL url or a SQLite path, not both"),
])
def test_bad_resolutions_and_retention_are_errors_naming_the_key(sections, message):
    with pytest.raises(ConfigError, match=message):
        _config(**sections)


def test_a_checkpoint_written_before_resolutions_gains_the_hour_and_the_day(tmp_path):
    """A 0.2.0 checkpoint (no coarser levels, none of the results fields) is restored as it
    is, with its minutes; the configured hour and day count the reports from then on."""
    import json

    from collector.storage.checkpoint import restore
    from collector.storage.store import CollectorStore

    rng = np.random.default_rng(9)
    old = Ingestor(fleet=FLEET, window_seconds=60.0, keep_windows=61)
    for seq in range(20):
        old.ingest(*_linear_report(rng, seq, 30.0 * seq), now=1e9)
    document = json.loads(dump(old))
    state = document["state"]
    for name in ("pending", "flushes", "source"):
        del state[name]
    del state["settings"]["coarser"]
    for series in state["series"]:
        for name in ("coarse", "coarse_points", "sealed"):
            series.pop(name, None)
    store = CollectorStore(tmp_path / "state.sqlite")
    store.checkpoint(json.dumps(document).encode(), 0)
    config = _config(storage={"path": str(tmp_path / "state.sqlite")})
    ingestor, _ = restore(config, store, recording=True)
    series = next(iter(ingestor.series["x"].values()))
    before = next(iter(old.series["x"].values()))
    assert series.factors == (1, 60, 1440) and series.windows == before.windows
    assert series.count() == before.count() and not any(series.levels[1:])
    assert ingestor.ingest(*_linear_report(rng, 20, 600.0), now=700.0) == "accepted"
    assert [len(level) for level in series.levels] == [len(before.windows) + 1, 1, 1]
    assert series._count(series.levels[1][0]) == 50  # the hour: from the restart on
    store.close()


def test_an_open_hour_is_estimated_again_once_per_finest_window_not_per_report():
    """The live view estimates a coarser window while it is open, but while the finest
    windows change only when a new one has begun since (every push would cost an estimate
    per channel and level), and once the stream pauses; the finest window and the total,
    as ever, at every change."""
    from collector.aggregation.series import TOTAL
    from collector.api.documents import Views

    rng = np.random.default_rng(3)
    ingestor = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER, keep_windows=50,
                        recording=True)
    views = Views(lambda: ingestor, budget_seconds=None)
    series = None
    for seq, t in enumerate((0.0, 3.0, 6.0, 12.0)):
        ingestor.ingest(*_linear_report(rng, seq, t), now=1e9)
        series = next(iter(ingestor.series["x"].values()))
        if seq == 0:
            assert set(series.stale()) == {TOTAL, 0, (1, 0), (2, 0)}
        elif seq < 3:  # the same finest window: the hour waits
            assert set(series.stale()) == {TOTAL, 0}
        else:  # a new finest window: the hour is estimated again
            assert set(series.stale()) == {TOTAL, 1, (1, 0), (2, 0)}
        views.documents(views.capture())
        if seq in (1, 2):  # the stream pauses: the open windows catch up at the next push
            assert set(series.stale()) == {(1, 0), (2, 0)}
            views.documents(views.capture())
        assert series.stale() == []
    count = series.coarse_points[(1, 0)][0]
    assert count == series.window_count((1, 0)) == 4 * 50


def test_the_merge_view_writes_the_merged_closed_windows_once_each_count(tmp_path):
    """Two members' partition states merged as they come: every closed window at every
    level is written whole, as a single collector counting every report has it; a late
    report in a member's state writes its windows again with the new count, and nothing
    else."""
    from collector.results.recorder import MergedResultsRecorder
    from collector.scaleout.merge import MergeView
    from collector.storage.checkpoint import tracker_states
    from collector.storage.states import encode_partition_state

    rng = np.random.default_rng(12)
    settings = dict(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER, keep_windows=50)
    members = [Ingestor(**settings), Ingestor(**settings)]
    reference = Ingestor(**settings, recording=True)  # never closed: every window
    view = MergeView(FLEET, members[0].settings())
    now = [0.0]
    store = SqliteResultsStore(tmp_path / "results.sqlite")
    recorder = MergedResultsRecorder(store, source="merge", aggregates=view.ingestor,
                                     grace=0.0, retention={}, clock=lambda: now[0])

    def publish(number: int) -> None:
        member = members[number]
        state = encode_partition_state(member.to_state(), tracker_states(member),
                                       partition=number, partitions=2, owner="m", now=1.0,
                                       every=5.0, sequence=1)
        assert view.update_partition(f"p.{number}", state) == "accepted"

    written = 0
    for seq in range(60):  # a report every 4 s; the states and the recorder every 20 s
        report = _linear_report(rng, seq, 4.0 * seq, agent=f"w{seq % 2}")
        members[seq % 2].ingest(*report, now=1e9)
        reference.ingest(*report, now=1e9)
        if seq % 5 == 4:
            now[0] = 4.0 * seq
            publish(0)
            publish(1)
            written += recorder.record()
    now[0] = 240.0
    written += recorder.record()
    series = next(iter(reference.series["x"].values()))
    closed = {(series.span(level), start): (series._count(blocks), series.blocks_state(blocks))
              for level, windows in enumerate(series.levels)
              for start, blocks in windows.items() if (start + 1) * series.span(level) <= 240}
    assert _stored(store, view.ingestor()) == closed
    assert written == len(closed)  # each once
    assert recorder.record() == 0  # nothing changed: nothing written
    late = _linear_report(rng, 61, 215.0, agent="w1")  # in a closed 10 s and 30 s window
    members[1].ingest(*late, now=1e9)
    reference.ingest(*late, now=1e9)
    publish(1)
    assert recorder.record() == 3  # its 10 s, 30 s and 120 s windows
    stored = _stored(store, view.ingestor())
    for level, start in ((0, 21), (1, 7), (2, 1)):
        assert stored[(series.span(level), start)][0] == \
            series._count(series.levels[level][start])
