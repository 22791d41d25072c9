"""The results store on a real PostgreSQL (tests/support/postgres.py: a private cluster, a
fresh database per test) holds exactly what the SQLite store holds: every kind's windows
read back byte for byte as from SQLite, late reports merge exactly, a batch is written
once, retention deletes exactly the old windows, queries return the right rows in order;
a server that goes away fails the calls meanwhile, and the store works again at the next
call once it is back.  Each scenario runs on both engines (``stores``), so the SQLite
store is the reference the PostgreSQL one is held to."""

from __future__ import annotations

import threading
import urllib.parse

import numpy as np
import pytest

from collector.aggregation.ingest import Ingestor
from collector.config import parse_collector_config
from collector.results.backends import open_results_store
from collector.results.postgres import PostgresResultsStore
from collector.results.sqlite import SqliteResultsStore
from collector.results.store import SeriesRecord, StoreError, WindowRow
from collector.storage.checkpoint import dump, load
from tests.collector.aggregation.test_stats import _series_cases
from tests.collector.results.test_resolutions import (
    COARSER,
    FLEET,
    SPANS,
    WINDOW,
    _linear_report,
    _messages,
    _recorder,
    _series,
    _stored,
    late_reports_study,
)
from tests.support.ports import free_port
from tests.support.postgres import (  # noqa: F401 (fixtures)
    postgres,
    postgres_cluster,
    postgres_server,
)

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed: pip install "
                              "'edge-ldp[postgresql]' to test the PostgreSQL results store")


@pytest.fixture
def stores(postgres, tmp_path):
    """A SQLite store and a PostgreSQL store (in the test's own database), both empty."""
    opened = {"sqlite": SqliteResultsStore(tmp_path / "results.sqlite"),
              "postgres": PostgresResultsStore(postgres)}
    yield opened
    for store in opened.values():
        store.close()


def _rows(store, keys) -> list[tuple]:
    """Every window the store holds of the series ``keys``, as plain values."""
    return [(row.series, row.span, row.start, row.count, row.sums, row.point)
            for key in sorted(keys) for span in SPANS
            for row in store.windows(key, span, -10**9, 10**9, 10**6)]


class _Batches:
    """What the recorder reads of an Ingestor: numbered batches of closed windows, pending
    until ``written``."""

    def __init__(self, batches: dict[int, list]):
        self.pending = dict(batches)

    def written(self, upto: int, estimates=None) -> None:
        for batch in [batch for batch in self.pending if batch <= upto]:
            del self.pending[batch]


def _every_kind_in_two_batches():
    """For every kind of series (tests/collector/aggregation/test_stats.py): its windows
    closed in two batches, the second with late reports of windows the first closed
    (deltas, merged with what the store holds); and per series key, the values its reports
    carried."""
    batches, values = {1: [], 2: []}, {}
    for name, (spec, case) in _series_cases().items():
        series = _series(spec, coarser=COARSER, recording=True)
        messages = _messages(case, spec["mechanism"], seed=len(name))
        late = [m for i, m in enumerate(messages) if m[1] < 240.0 and i % 4 == 1]
        on_time = [m for i, m in enumerate(messages) if not (m[1] < 240.0 and i % 4 == 1)]
        series.update_many([m for m in on_time if m[1] < 240.0])
        batches[1] += series.close(now=240.0, grace=0.0)
        series.update_many([m for m in on_time if m[1] >= 240.0] + late)
        batches[2] += series.close(now=10_000.0, grace=0.0)
        values[SeriesRecord.of(series).key] = sum(series.values_in(codes)
                                                  for _, _, codes in messages)
    return batches, values


def test_every_kind_reads_back_from_postgres_as_from_sqlite(stores):
    """The same closed windows, recorded into either store, read back as the same rows:
    series key, span, start, count, sums and estimates, byte for byte; and the same series
    records.  The late reports' windows were merged with what each store held."""
    batches, values = _every_kind_in_two_batches()
    assert any(window.delta for window in batches[2])  # the merges are exercised
    rows, records = {}, {}
    for engine, store in stores.items():
        recorder = _recorder(store, _Batches(batches))
        assert recorder.record() == len(batches[1]) + len(batches[2])
        rows[engine] = _rows(store, values)
        records[engine] = sorted((record.key, record.channel, record.kind, record.description,
                                  newest) for record, newest in store.series_of("c"))
    assert rows["postgres"] == rows["sqlite"]
    assert records["postgres"] == records["sqlite"]
    assert [record[0] for record in records["postgres"]] == sorted(values)  # one per kind
    # Every resolution of every series counts each of its reports once: the late ones were
    # merged into the stored windows, not written over them.
    for key, total in values.items():
        for span in SPANS:
            assert sum(row[3] for row in rows["postgres"]
                       if row[0] == key and row[1] == span) == total > 0, (key, span)


def _late_reports_stored(store) -> tuple[dict, dict, int]:
    """tests/collector/results/test_resolutions.py's late reports, into ``store``: what it
    holds, what a collector that got every report on time and kept every window holds,
    and how many windows were written."""
    ingestor, recorder, reports, late = late_reports_study(store)
    return _stored(store, ingestor), _reference(reports + late), recorder.written_windows


def _reference(reports) -> dict:
    """Every window of one collector that got ``reports`` and never closed a window:
    (span, start) -> (count, sums)."""
    reference = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER,
                         keep_windows=100, recording=True)
    for topic, payload in reports:
        reference.ingest(topic, payload, now=1e9)
    series = next(iter(reference.series["x"].values()))
    return {(series.span(level), start): (series._count(blocks), series.blocks_state(blocks))
            for level, windows in enumerate(series.levels) for start, blocks in windows.items()}


def test_late_reports_are_merged_exactly_on_both_engines(stores):
    found = {engine: _late_reports_stored(store) for engine, store in stores.items()}
    for engine, (stored, expected, written) in found.items():
        assert stored == expected, engine
        # The late reports' windows were written twice: first without them, then merged.
        assert written > len(expected), engine
    assert found["postgres"] == found["sqlite"]


def test_a_batch_is_written_once_on_both_engines(stores):
    """A batch written again (a collector restarted from a checkpoint taken before the
    store said so) is skipped as a whole; the batch numbers are per source, and a write
    without one (the merge view's) is always made."""
    for engine, store in stores.items():
        rng = np.random.default_rng(2)
        ingestor = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER,
                            keep_windows=50, recording=True)
        for seq in range(40):
            ingestor.ingest(*_linear_report(rng, seq, 5.0 * seq), now=1e9)
        batch = ingestor.close_windows(now=150.0, grace=0.0)
        saved = dump(ingestor)  # the checkpoint holds the batch, pending
        assert store.applied("test") == 0
        _recorder(store, ingestor).record()
        written = _stored(store, ingestor)
        assert written and store.applied("test") == batch, engine
        restored, _ = load(saved, recording=True)
        assert list(restored.pending) == [batch]
        assert _recorder(store, restored).record() == 0, engine  # skipped: written already
        assert not restored.pending and _stored(store, restored) == written, engine

        key = SeriesRecord.of(next(iter(ingestor.series["x"].values()))).key
        first = store.windows(key, WINDOW, -10**9, 10**9, 1)[0]
        other = WindowRow(key, first.span, first.start, first.count + 1, b"{}", b"[]")
        for again in (batch, batch - 1):  # at or below the last: nothing is written
            assert store.write("test", again, [], [other], 1.0) is False, engine
        assert _stored(store, ingestor) == written and store.applied("test") == batch, engine
        assert store.write("other", batch, [], [other], 1.0) is True, engine  # its own count
        assert store.applied("other") == batch and store.applied("test") == batch, engine
        assert store.windows(key, WINDOW, first.start, first.start, 1) == [other], engine
        assert store.write("other", None, [], [first], 2.0) is True, engine  # no batch
        assert store.applied("other") == batch, engine
        assert _stored(store, ingestor) == written, engine


def test_retention_deletes_exactly_the_old_windows_on_both_engines(stores):
    deleted_by = {}
    for engine, store in stores.items():
        rng = np.random.default_rng(4)
        ingestor = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER,
                            keep_windows=50, recording=True)
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
        keep = {10.0: 200.0, 30.0: 100.0}
        kept = {(span, start) for span, start in before
                if span == 120.0 or (start + 1) * span > 400.0 - keep[span]}
        assert set(after) == kept and deleted == len(before) - len(kept) > 0, engine
        assert all(after[key] == before[key] for key in kept), engine
        # A window that ends exactly at the limit has ended before it: it goes too.
        ends = sorted((start + 1) * span for span, start in after if span == 10.0)
        assert store.retain(10.0, ends[0]) == 1, engine
        assert store.retain(10.0, ends[1] - 0.5) == 0, engine
        deleted_by[engine] = deleted
    assert deleted_by["postgres"] == deleted_by["sqlite"]


def _record(key: str, channel: str = "c") -> SeriesRecord:
    return SeriesRecord(key, channel, "linear", b'{"mechanism": "%s"}' % key.encode())


def _window(key: str, span: float, start: int) -> WindowRow:
    return WindowRow(key, span, start, start + 1, b'{"sums": %d}' % start,
                     b'{"mean": %d.5}' % start)


def test_series_and_windows_queries_return_the_right_rows_in_order_on_both_engines(stores):
    a, b, c, d = (_record("a" * 32), _record("b" * 32), _record("c" * 32),
                  _record("d" * 32, channel="other"))
    a_windows = [_window(a.key, 10.0, start) for start in (7, 2, 9, 0, 5, 3, 8, 1, 6, 4)]
    b_windows = [_window(b.key, 60.0, start) for start in (2, 0, 1)] + [_window(b.key, 10.0, 3)]
    d_windows = [_window(d.key, 10.0, 50)]
    for engine, store in stores.items():
        assert store.series_of("c") == [], engine
        assert store.write("w", 1, [a, b, c, d], a_windows + b_windows + d_windows, 0.0)
        # Newest first (B ends at 180 s, A at 100 s), a series without windows last.
        assert store.series_of("c") == [(b, 180.0), (a, 100.0), (c, None)], engine
        assert store.series_of("other") == [(d, 510.0)], engine
        assert store.series_of("nothing") == [], engine
        by_start = {row.start: row for row in a_windows}
        # Oldest first, from ``first`` to ``last`` inclusive, at most ``limit``.
        assert store.windows(a.key, 10.0, 2, 5, 100) == [by_start[s] for s in (2, 3, 4, 5)]
        assert store.windows(a.key, 10.0, 2, 5, 2) == [by_start[2], by_start[3]], engine
        assert store.windows(a.key, 10.0, -5, 0, 100) == [by_start[0]], engine
        assert store.windows(a.key, 10.0, 9, 100, 100) == [by_start[9]], engine
        assert store.windows(a.key, 10.0, 6, 5, 100) == [], engine
        assert store.windows(a.key, 60.0, 0, 100, 100) == [], engine  # another resolution
        assert store.windows(b.key, 60.0, 0, 100, 100) == sorted(
            b_windows[:3], key=lambda row: row.start), engine
        assert store.windows(b.key, 10.0, 0, 100, 100) == [b_windows[3]], engine
        assert store.windows(c.key, 10.0, 0, 100, 100) == [], engine
        assert store.read_sums([(a.key, 10.0, 3), (a.key, 10.0, 10), (b.key, 10.0, 3)]) == {
            (a.key, 10.0, 3): b'{"sums": 3}', (b.key, 10.0, 3): b'{"sums": 3}'}, engine
        # A window written again replaces the stored one; the series record stays as it was.
        again = WindowRow(a.key, 10.0, 3, 40, b'{"sums": 40}', b'{"mean": 0.0}')
        changed = SeriesRecord(a.key, "c", "linear", b'{"mechanism": "changed"}')
        assert store.write("w", 2, [changed], [again], 1.0), engine
        assert store.windows(a.key, 10.0, 3, 3, 10) == [again], engine
        assert store.series_of("c")[1] == (a, 100.0), engine


def _count_written(store: PostgresResultsStore) -> int:
    return sum(len(store.windows(key, span, -10**9, 10**9, 10**6)) for key, span in (
        (record.key, span) for record, _ in store.series_of("x") for span in SPANS))


@pytest.mark.e2e  # a cluster of the test's own (tests/conftest.py only sees ``postgres``)
def test_a_store_whose_server_went_away_works_again_once_it_is_back(postgres_server):
    """While the server is down, every call fails (StoreError) and the closed windows wait
    in the checkpoint; once it is back on the same port, the next call works and writes
    them.  Also when the server restarted while the store was idle: its connections are
    lost, found so at the next call, and opened again within that call."""
    rng = np.random.default_rng(8)
    reports = [_linear_report(rng, seq, 4.0 * seq) for seq in range(120)]  # 0 .. 480 s
    store = PostgresResultsStore(postgres_server.url)
    try:
        ingestor = Ingestor(fleet=FLEET, window_seconds=WINDOW, coarser=COARSER,
                            keep_windows=50, recording=True)
        recorder = _recorder(store, ingestor)
        for topic, payload in reports[:40]:
            assert ingestor.ingest(topic, payload, now=1e9) == "accepted"
        first = ingestor.close_windows(now=160.0, grace=0.0)
        assert recorder.record() > 0 and store.applied("test") == first
        written = _stored(store, ingestor)

        for topic, payload in reports[40:80]:
            ingestor.ingest(topic, payload, now=1e9)
        second = ingestor.close_windows(now=320.0, grace=0.0)
        postgres_server.stop()
        with pytest.raises(StoreError, match=r"^results\.url: cannot connect"):
            recorder.record()
        assert list(ingestor.pending) == [second]  # kept, for the checkpoint
        with pytest.raises(StoreError, match=r"^results\.url: cannot connect"):
            store.write("test", second, [], [], 0.0)
        with pytest.raises(StoreError, match=r"^results\.url: cannot connect"):
            store.series_of("x")

        postgres_server.start()  # the same cluster, on the same port
        assert recorder.record() > 0  # the next call: the pending batch is written
        assert not ingestor.pending and store.applied("test") == second
        assert written.items() <= _stored(store, ingestor).items()  # the first batch stays

        # Restarted while the store was idle: its connections (the writer's, this
        # thread's for queries) are stale; the next calls open them again.
        for topic, payload in reports[80:]:
            ingestor.ingest(topic, payload, now=1e9)
        third = ingestor.close_windows(now=10_000.0, grace=0.0)
        postgres_server.stop()
        postgres_server.start()
        assert recorder.record() > 0 and store.applied("test") == third
        assert not ingestor.pending
        assert _stored(store, ingestor) == _reference(reports)  # every window, once
        postgres_server.stop()
        postgres_server.start()
        assert store.retain(10.0, 0.0) == 0  # a write, first after a restart
        postgres_server.stop()
        postgres_server.start()
        # A query from another thread, its connection lost likewise.
        found = []
        thread = threading.Thread(target=lambda: found.append(_count_written(store)))
        thread.start()
        thread.join()
        assert found == [_count_written(store)] and found[0] == len(_reference(reports))
    finally:
        store.close()


def _config(results: dict):
    return parse_collector_config({"fleet": FLEET, "results": results})


def test_open_results_store_connects_with_the_url_and_the_password_file(
        postgres, postgres_cluster, tmp_path):
    """``[results] url`` and ``password_file`` open a PostgreSQL store as that user with
    that password (its tables are the user's); a wrong or missing password is a
    StoreError naming ``results.url``."""
    database = urllib.parse.urlsplit(postgres).path.lstrip("/")
    user = postgres_cluster.create_user(password="s3cret")
    postgres_cluster.execute(f'ALTER DATABASE "{database}" OWNER TO "{user}"')
    url = postgres_cluster.database_url(database, user=user)
    password = tmp_path / "results-password"
    password.write_text("s3cret\n")
    store = open_results_store(_config({"url": url, "password_file": str(password)}))
    try:
        assert isinstance(store, PostgresResultsStore)
        record = _record("e" * 32)
        assert store.write("w", 1, [record], [_window(record.key, 10.0, 4)], 0.0)
        assert store.windows(record.key, 10.0, 0, 10, 10) == [_window(record.key, 10.0, 4)]
        assert store.series_of("c") == [(record, 50.0)]
        with psycopg.connect(postgres) as db:  # as the superuser
            assert db.execute("SELECT DISTINCT tableowner FROM pg_tables WHERE tablename IN "
                              "('series', 'windows', 'applied')").fetchall() == [(user,)]
    finally:
        store.close()
    password.write_text("wrong\n")
    with pytest.raises(StoreError, match=r"^results\.url: cannot connect .*password"):
        open_results_store(_config({"url": url, "password_file": str(password)}))
    with pytest.raises(StoreError, match=r"^results\.url: cannot connect .*password"):
        open_results_store(_config({"url": url}))


def test_a_user_that_may_not_create_the_tables_is_a_store_error(postgres, postgres_cluster):
    """PostgreSQL 15 lets only the database's owner create tables in it by default."""
    database = urllib.parse.urlsplit(postgres).path.lstrip("/")
    url = postgres_cluster.database_url(database, user=postgres_cluster.create_user())
    with pytest.raises(StoreError, match=r"^results\.url: cannot create the results tables "
                                         r"\(.*permission denied"):
        PostgresResultsStore(url)


def test_a_url_without_a_server_is_a_store_error_naming_the_key(tmp_path):
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(StoreError) as raised:
        open_results_store(_config({"url": url}))
    assert str(raised.value).startswith("results.url: cannot connect to PostgreSQL")
    missing = tmp_path / "no-such-password"
    with pytest.raises(StoreError, match=r"^results\.password_file: cannot be read"):
        open_results_store(_config({"url": url, "password_file": str(missing)}))
