"""The results store: every closed window at every resolution, with its sums and estimates.

One narrow interface (``ResultsStore``) with two engines behind it: one SQLite file
(``collector.results.sqlite``, the default) and PostgreSQL (``collector.results.postgres``).
Both keep the same two tables:

* ``series``: one row per aggregation series (a channel under one mechanism), keyed by a
  digest of its identity, with its kind and description (JSON);
* ``windows``: one row per (series, resolution in seconds, window number): the count, the
  sums (the series kind's typed block states as JSON, ``collector.storage.states``: exact
  integers, so a window can be merged or estimated again later) and the estimates (the
  kind's history point as JSON), and when it was written;

and ``applied``: per writer (``source``), the last batch of windows written, so that a
batch
written again after a crash is recognised and skipped (``write``).  A query reads one
series' windows of one resolution in a range of window numbers through the primary key's
index: its cost follows the windows returned, never the study's length.
"""

from __future__ import annotations

import functools
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from collector.results.durations import duration_name
from edge_agent.protocol import as_dict


@dataclass(frozen=True)
class SeriesRecord:
    """What the store keeps of a series: ``key`` (a digest of its identity), channel, kind
    and description (mechanism, fields, strategy, unit as JSON)."""

    key: str
    channel: str
    kind: str
    description: bytes

    @classmethod
    def of(cls, series) -> SeriesRecord:
        """The record of a ``collector.aggregation.series.Series`` (made once per identity:
        it is asked for every window closed and at every push)."""
        return _record(series.identity)


# Bounded: [limits] channels x series_per_channel at their defaults, 256 x 16.
@functools.lru_cache(maxsize=4096)
def _record(identity: tuple) -> SeriesRecord:
    """The record of a series of this identity (channel, kind, description, fields,
    strategy, unit: ``collector.aggregation.series.series_identity``)."""
    channel, kind, description, fields, strategy, unit = identity
    described = msgspec.json.encode({
        "mechanism": as_dict(description), "fields": fields,
        "strategy": as_dict(strategy) if strategy is not None else None, "unit": unit})
    key = hashlib.sha256(channel.encode() + b"\0" + kind.encode() + b"\0"
                         + described).hexdigest()[:32]
    return SeriesRecord(key, channel, kind, described)


@dataclass(frozen=True)
class WindowRow:
    """One window: its series' key, resolution (``span`` seconds), number (``start``: the
    window covers [start x span, (start + 1) x span) in Unix seconds), count, sums and
    estimates (JSON)."""

    series: str
    span: float
    start: int
    count: int
    sums: bytes
    point: bytes

    @property
    def resolution(self) -> str:
        return duration_name(self.span)


class StoreError(RuntimeError):
    """The results store cannot be opened or used (the message says which and why)."""


class ResultsStore(ABC):
    """Where closed windows are kept.  One writer (``collector.results.recorder``) calls
    ``applied``, ``read_sums``, ``write`` and ``retain``; queries (any thread) call
    ``series_of`` and ``windows``."""

    @abstractmethod
    def applied(self, source: str) -> int:
        """The last batch number ``source`` wrote (0: none)."""

    @abstractmethod
    def read_sums(self, keys: list[tuple[str, float, int]]) -> dict[tuple[str, float, int],
                                                                    bytes]:
        """The stored sums of the windows (series key, span, start) that the store holds."""

    @abstractmethod
    def write(self, source: str, batch: int | None, series: list[SeriesRecord],
              rows: Iterable[WindowRow], now: float) -> bool:
        """In one transaction: the series (new ones added), the windows (replacing what
        was stored of them; ``rows`` taken one at a time) and, with a ``batch`` number, that
        ``source`` wrote it.  A batch at or below ``applied(source)`` writes nothing (False):
        it was written before."""

    @abstractmethod
    def retain(self, span: float, before: float) -> int:
        """Delete the windows of resolution ``span`` that ended before ``before`` (Unix
        seconds); how many were deleted."""

    @abstractmethod
    def series_of(self, channel: str) -> list[tuple[SeriesRecord, float | None]]:
        """The channel's series with the end of their newest window (None: no window),
        newest first."""

    @abstractmethod
    def windows(self, series: str, span: float, first: int, last: int,
                limit: int) -> list[WindowRow]:
        """The series' windows of resolution ``span`` numbered ``first`` to ``last``
        (inclusive), oldest first, at most ``limit``."""

    @abstractmethod
    def close(self) -> None:
        ...


# Both engines speak this SQL (``?`` placeholders; PostgreSQL's are substituted).
SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    key TEXT PRIMARY KEY,
    channel TEXT NOT NULL,
    kind TEXT NOT NULL,
    description {blob} NOT NULL
);
CREATE INDEX IF NOT EXISTS series_by_channel ON series (channel);
CREATE TABLE IF NOT EXISTS windows (
    series TEXT NOT NULL REFERENCES series (key),
    span DOUBLE PRECISION NOT NULL,
    start BIGINT NOT NULL,
    count BIGINT NOT NULL,
    sums {blob} NOT NULL,
    point {blob} NOT NULL,
    written DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (series, span, start)
);
CREATE TABLE IF NOT EXISTS applied (
    source TEXT PRIMARY KEY,
    batch BIGINT NOT NULL
);
"""

UPSERT_SERIES = ("INSERT INTO series (key, channel, kind, description) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT (key) DO NOTHING")
UPSERT_WINDOW = ("INSERT INTO windows (series, span, start, count, sums, point, written) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (series, span, start) DO UPDATE SET "
                 "count = excluded.count, sums = excluded.sums, point = excluded.point, "
                 "written = excluded.written")
UPSERT_APPLIED = ("INSERT INTO applied (source, batch) VALUES (?, ?) ON CONFLICT (source) "
                  "DO UPDATE SET batch = excluded.batch")
SELECT_APPLIED = "SELECT batch FROM applied WHERE source = ?"
SELECT_SUMS = "SELECT sums FROM windows WHERE series = ? AND span = ? AND start = ?"
# A window [start x span, (start + 1) x span) ended before ``before`` where start + 1 <=
# before / span.
DELETE_OLD = "DELETE FROM windows WHERE span = ? AND start + 1 <= ? / span"
SELECT_SERIES = ("SELECT s.key, s.channel, s.kind, s.description, "
                 "(SELECT MAX((w.start + 1) * w.span) FROM windows w WHERE w.series = s.key) "
                 "FROM series s WHERE s.channel = ?")
SELECT_WINDOWS = ("SELECT series, span, start, count, sums, point FROM windows WHERE series = ? "
                  "AND span = ? AND start >= ? AND start <= ? ORDER BY start LIMIT ?")


class SqlResultsStore(ResultsStore):
    """The SQL both engines share; an engine gives ``_write_transaction`` (a cursor in a
    transaction that commits or rolls back) and ``_read`` (rows of a query)."""

    def _write_transaction(self):
        raise NotImplementedError

    def _read(self, sql: str, parameters: tuple) -> list[tuple]:
        raise NotImplementedError

    def applied(self, source: str) -> int:
        rows = self._read(SELECT_APPLIED, (source,))
        return int(rows[0][0]) if rows else 0

    def read_sums(self, keys):
        found = {}
        for key in keys:
            rows = self._read(SELECT_SUMS, key)
            if rows:
                found[key] = bytes(rows[0][0])
        return found

    def write(self, source, batch, series, rows, now) -> bool:
        with self._write_transaction() as cursor:
            if batch is not None:
                cursor.execute(SELECT_APPLIED, (source,))
                done = cursor.fetchone()
                if done is not None and batch <= done[0]:
                    return False
            cursor.executemany(UPSERT_SERIES, [(record.key, record.channel, record.kind,
                                                record.description) for record in series])
            cursor.executemany(UPSERT_WINDOW, ((row.series, row.span, row.start, row.count,
                                                row.sums, row.point, now) for row in rows))
            if batch is not None:
                cursor.execute(UPSERT_APPLIED, (source, batch))
        return True

    def retain(self, span: float, before: float) -> int:
        with self._write_transaction() as cursor:
            cursor.execute(DELETE_OLD, (span, before))
            return max(cursor.rowcount, 0)

    def series_of(self, channel: str):
        found = [(SeriesRecord(key, name, kind, bytes(description)), newest)
                 for key, name, kind, description, newest
                 in self._read(SELECT_SERIES, (channel,))]
        return sorted(found, key=lambda item: -(item[1] if item[1] is not None else -1e300))

    def windows(self, series, span, first, last, limit):
        return [WindowRow(key, width, start, count, bytes(sums), bytes(point))
                for key, width, start, count, sums, point
                in self._read(SELECT_WINDOWS, (series, span, first, last, limit))]
