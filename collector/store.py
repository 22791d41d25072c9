"""Durable collector state: a checkpoint of all aggregates and a journal of messages since.

Exactly-once aggregation over at-least-once delivery works like a database
log.  Every message is appended to the journal; the journal is committed in
small groups, and only then are the messages acknowledged to the broker.  A
full checkpoint (the pickled ``Ingestor``: aggregates, sequence trackers,
counters) is written every ``checkpoint_seconds`` together with the id of the
last journal row it includes, and the journal up to there is deleted.

After a crash the collector loads the checkpoint and replays the journal in
order: the state is exactly what it was at the last commit.  Messages that
were processed but not committed were never acknowledged, so the broker
delivers them again; messages committed but not yet acknowledged come again
too and are recognised as duplicates by their sequence numbers.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

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
            self._db.executescript(_SCHEMA)
        self._open = False
        self.appended = 0

    def close(self) -> None:
        with self._lock:
            self.commit()
            self._db.close()

    def load(self) -> tuple[bytes | None, list[tuple[int, str, bytes, float]]]:
        """(checkpoint state or None, journal rows after it, oldest first)."""
        with self._lock:
            row = self._db.execute("SELECT state, journal_upto FROM checkpoint WHERE id=1") \
                .fetchone()
            state, upto = (row[0], row[1]) if row else (None, 0)
            rows = self._db.execute("SELECT id, topic, payload, received FROM journal "
                                    "WHERE id > ? ORDER BY id", (upto,)).fetchall()
        return state, rows

    def append(self, topic: str, payload: bytes, received: float) -> None:
        """Journal one message (committed by the next ``commit``)."""
        with self._lock:
            if not self._open:
                self._db.execute("BEGIN")
                self._open = True
            self._db.execute("INSERT INTO journal (topic, payload, received) VALUES (?, ?, ?)",
                             (topic, payload, received))
            self.appended += 1

    def commit(self) -> bool:
        """Make appended messages durable; True if there was anything to commit."""
        with self._lock:
            if not self._open:
                return False
            self._db.execute("COMMIT")
            self._open = False
            return True

    def checkpoint(self, state: bytes) -> None:
        """Store ``state`` (which includes every journaled message) and trim the journal."""
        with self._lock:
            self.commit()
            self._db.execute("BEGIN")
            upto = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM journal").fetchone()[0]
            self._db.execute("INSERT INTO checkpoint VALUES (1, ?, ?, ?) ON CONFLICT (id) DO "
                             "UPDATE SET state=excluded.state, journal_upto=excluded.journal_upto,"
                             " written=excluded.written", (state, upto, time.time()))
            self._db.execute("DELETE FROM journal WHERE id <= ?", (upto,))
            self._db.execute("COMMIT")

    def journal_length(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM journal").fetchone()[0]
