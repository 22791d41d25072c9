"""Durable collector state: a journal of received messages and a checkpoint of aggregates.

Exactly-once aggregation over at-least-once delivery works like a database
log.  The network process appends every message to the journal, commits in
small groups, and only then acknowledges those messages to the broker.  The
aggregator reads the journal in order; every ``checkpoint_seconds`` it writes
a checkpoint (the ``Ingestor``'s state: aggregates, sequence trackers,
counters) with the id of the last journal row it includes, and the journal up
to there is deleted.  A checkpoint is written in parts (``checkpoint_part``) as
the state is encoded, a series at a time, so that no copy of the whole state
exists at once.  The sums of windows closed for the results store and not
yet written there go to the ``closed`` table in the checkpoint's transaction,
once each, and leave it with the first checkpoint after the results store took
them.

After a crash the collector loads the checkpoint and replays the journal
after it.  Messages not yet committed were never acknowledged, so the broker
delivers them again; messages committed but not yet acknowledged come again
too and are recognised as duplicates by their sequence numbers.

Imports only the standard library: the network process uses it too.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

READ_ROWS = 5000  # journal rows applied at once ...
READ_BYTES = 8 << 20  # ... and their payloads' size (bounds the codes held in memory)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    state BLOB NOT NULL,
    journal_upto INTEGER NOT NULL,
    written REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    received REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoint_part (
    seq INTEGER PRIMARY KEY,        -- a checkpoint written in parts: their order
    data BLOB NOT NULL              -- (the checkpoint row's state is then empty)
);
CREATE TABLE IF NOT EXISTS closed (
    batch INTEGER NOT NULL,         -- the checkpoint state's pending batch number
    seq INTEGER NOT NULL,           -- the window's place in its batch
    sums BLOB NOT NULL,             -- Series.blocks_state
    PRIMARY KEY (batch, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS network (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    subscribed INTEGER NOT NULL,    -- 1 while the network process holds its subscriptions
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS progress (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    position INTEGER NOT NULL       -- last journal id the aggregator has applied
);
"""


class CollectorStore:
    def __init__(self, path: str | Path, *, read_only: bool = False):
        self.path = Path(path)
        self._lock = threading.RLock()
        if read_only:
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                       isolation_level=None, check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: an acknowledged message must survive power loss, not just a crash.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=10000")  # two processes write this file
            self._db.executescript(_SCHEMA)
        self._buffer: list[tuple[str, bytes, float]] = []
        self.appended = 0

    def close(self) -> None:
        with self._lock:
            self.commit()
            self._db.close()

    def load(self) -> tuple[bytes | None, int]:
        """(checkpoint state or None, the journal id it includes)."""
        with self._lock, self.reading():
            row = self._db.execute("SELECT state, journal_upto FROM checkpoint WHERE id=1") \
                .fetchone()
            if row is None:
                return None, 0
            state = row[0]
            if not state:  # written in parts
                state = b"".join(part for part, in self._db.execute(
                    "SELECT data FROM checkpoint_part ORDER BY seq"))
        return state, row[1]

    def read_journal(self, after: int, rows: int = READ_ROWS, size: int = READ_BYTES) \
            -> tuple[list[tuple[int, str, bytes, float]], bool]:
        """(committed journal rows with id > ``after``, oldest first, whether more may
        follow): at most ``rows`` of them, and no more after the payloads reach ``size``
        bytes, so what is read at once is bounded whatever senders put in their messages."""
        batch, total = [], 0
        with self._lock:
            cursor = self._db.execute("SELECT id, topic, payload, received FROM journal "
                                      "WHERE id > ? ORDER BY id LIMIT ?", (after, rows))
            for row in cursor:  # rows are fetched as iterated: stop early on size
                batch.append(row)
                total += len(row[2])
                if total >= size:
                    cursor.close()
                    return batch, True
        return batch, len(batch) == rows

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Reads inside see one state of the file, whatever another process commits or
        trims meanwhile (one read transaction; in WAL mode writers go on): ``edge-collector
        export`` reads the journal of a running collector with it.  Nested: the outer one's."""
        with self._lock:
            if self._db.in_transaction:
                yield
                return
            self._db.execute("BEGIN")
            try:
                yield
            finally:
                self._db.execute("ROLLBACK")  # nothing was written

    def checkpoint_position(self) -> tuple[int, float | None]:
        """(the last journal id the checkpoint includes, when it was written): the journal
        holds no row up to that id any more.  (0, None) without a checkpoint."""
        with self._lock:
            row = self._db.execute("SELECT journal_upto, written FROM checkpoint WHERE id=1") \
                .fetchone()
        return (row[0], row[1]) if row else (0, None)

    def first_journal_id(self) -> int | None:
        """The oldest journal row's id (1 if nothing was ever trimmed), None if empty."""
        with self._lock:
            return self._db.execute("SELECT MIN(id) FROM journal").fetchone()[0]

    def set_progress(self, position: int) -> None:
        with self._lock:
            self._db.execute("INSERT INTO progress VALUES (1, ?) ON CONFLICT (id) DO UPDATE "
                             "SET position = excluded.position", (position,))

    def set_network(self, subscribed: bool) -> None:
        with self._lock:
            self._db.execute("INSERT INTO network VALUES (1, ?, ?) ON CONFLICT (id) DO UPDATE "
                             "SET subscribed = excluded.subscribed, since = excluded.since",
                             (int(subscribed), time.time()))

    def network(self) -> dict:
        with self._lock:
            row = self._db.execute("SELECT subscribed, since FROM network WHERE id = 1").fetchone()
        return {"connected": bool(row and row[0]), "since": row[1] if row else None}

    def backlog(self) -> int:
        """Journal rows the aggregator has not applied yet."""
        with self._lock:
            row = self._db.execute(
                "SELECT (SELECT COALESCE(MAX(id), 0) FROM journal) - "
                "COALESCE((SELECT position FROM progress WHERE id = 1), 0)").fetchone()
        return int(row[0])

    def append(self, topic: str, payload: bytes, received: float) -> None:
        """Journal one message; it is durable after the next ``commit``."""
        with self._lock:
            self._buffer.append((topic, payload, received))
            self.appended += 1

    @contextlib.contextmanager
    def _transaction(self, begin: str = "BEGIN") -> Iterator[None]:
        """A write transaction that is committed, or rolled back whatever fails (a
        statement, or COMMIT itself: a full disk, a lock held too long).  Left open, it
        would make every later BEGIN on this connection fail."""
        self._db.execute(begin)
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def commit(self) -> bool:
        """Write buffered messages in one transaction; True if there were any.  If that
        fails, they stay buffered (and unacknowledged) for the next call."""
        with self._lock:
            if not self._buffer:
                return False
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO journal (topic, payload, received) VALUES (?, ?, ?)",
                    self._buffer)
            self._buffer = []
            return True

    def checkpoint(self, state: bytes | Iterable[bytes], upto: int, *, trim: bool = True,
                   closed: Iterable[tuple[int, int, bytes]] = (),
                   pending: Collection[int] | None = None) -> None:
        """Store ``state`` (which includes journal rows up to ``upto``; bytes, or parts
        whose concatenation it is, each written as it is taken) and, with ``trim``,
        delete those rows: all of it, or (raising) nothing.  Without ``trim`` (``[storage]
        keep_journal``) the journal keeps the whole stream; a restart still replays only
        the rows after ``upto``.

        ``closed``: closed windows' sums to keep, as (batch, seq, sums) (read as they are
        written: each encoded once, never all at once); ``pending``: the batches the state
        still holds (the others' sums are deleted; None: kept)."""
        with self._lock, self._transaction("BEGIN IMMEDIATE"):
            self._db.execute("DELETE FROM checkpoint_part")
            if not isinstance(state, bytes):
                self._db.executemany("INSERT INTO checkpoint_part VALUES (?, ?)",
                                     enumerate(state))
                state = b""
            elif not state:
                raise ValueError("an empty checkpoint")
            self._db.execute("INSERT INTO checkpoint VALUES (1, ?, ?, ?) ON CONFLICT (id) DO "
                             "UPDATE SET state=excluded.state, journal_upto=excluded.journal_upto,"
                             " written=excluded.written", (state, upto, time.time()))
            self._db.executemany("INSERT OR REPLACE INTO closed VALUES (?, ?, ?)", closed)
            if pending is not None:
                self._db.execute("DELETE FROM closed WHERE batch NOT IN "
                                 "(SELECT value FROM json_each(?))",
                                 (json.dumps(sorted(pending)),))
            if trim:
                self._db.execute("DELETE FROM journal WHERE id <= ?", (upto,))
            self._db.execute("INSERT INTO progress VALUES (1, ?) ON CONFLICT (id) DO UPDATE "
                             "SET position = MAX(position, excluded.position)", (upto,))

    def closed_sums(self, batch: int, first: int, count: int) -> list[bytes]:
        """The sums of windows ``first`` to ``first + count - 1`` of closed ``batch``, in
        order (``ValueError`` if one is missing: the checkpoint said they were here)."""
        with self._lock:
            rows = self._db.execute("SELECT sums FROM closed WHERE batch = ? AND seq >= ? "
                                    "AND seq < ? ORDER BY seq",
                                    (batch, first, first + count)).fetchall()
        if len(rows) != count:
            raise ValueError(f"{self.path}: closed batch {batch} lacks windows of "
                             f"{first}..{first + count - 1}")
        return [row[0] for row in rows]

    def closed_rows(self, batch: int, rows: int = READ_ROWS) -> Iterator[tuple[int, bytes]]:
        """Every (seq, sums) of closed ``batch``, in order, read ``rows`` at a time."""
        after = -1
        while True:
            with self._lock:
                chunk = self._db.execute("SELECT seq, sums FROM closed WHERE batch = ? AND "
                                         "seq > ? ORDER BY seq LIMIT ?",
                                         (batch, after, rows)).fetchall()
            yield from chunk
            if len(chunk) < rows:
                return
            after = chunk[-1][0]

    def journal_length(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM journal").fetchone()[0]
