"""The results store in one SQLite file (the default; ``collector.results.store``).

Written in WAL mode with ``synchronous=FULL``: a batch the store says it wrote survives a
crash and a power loss, since the collector's checkpoint stops keeping it after that.
Queries read through a connection of their own per thread (WAL: readers never wait for
the writer, nor it for them).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

from collector.results.store import SCHEMA, SqlResultsStore, StoreError

BUSY_MILLISECONDS = 10_000
# The write-ahead log is cut back to this once checkpointed: a day's retention deletes
# (92,160 windows at 64 channels) grew it to 62 MB, which SQLite otherwise keeps.
WAL_LIMIT_BYTES = 8 * 2**20


class SqliteResultsStore(SqlResultsStore):
    def __init__(self, path: str | Path, *, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.Lock()  # the writer's connection
        self._local = threading.local()  # each reading thread's connection
        self._readers: list[sqlite3.Connection] = []
        self._db: sqlite3.Connection | None = None
        try:
            if not read_only:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, isolation_level=None,
                                           check_same_thread=False)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
                self._db.execute(f"PRAGMA busy_timeout={BUSY_MILLISECONDS}")
                self._db.executescript(SCHEMA.format(blob="BLOB"))
            elif not self.path.exists():
                raise StoreError(f"{self.path}: no results store here")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: cannot open the results store ({exc})") from None

    @contextlib.contextmanager
    def _write_transaction(self):
        if self._db is None:
            raise StoreError(f"{self.path}: opened read-only")
        with self._lock:
            cursor = self._db.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                yield cursor
                cursor.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    cursor.execute("ROLLBACK")
                raise

    def _reader(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None,
                                 check_same_thread=False)
            db.execute(f"PRAGMA busy_timeout={BUSY_MILLISECONDS}")
            self._local.db = db
            with self._lock:
                self._readers.append(db)
        return db

    def _read(self, sql: str, parameters: tuple) -> list[tuple]:
        return self._reader().execute(sql, parameters).fetchall()

    def size_bytes(self) -> int:
        """The file's size with its write-ahead log."""
        return sum(path.stat().st_size for path in (self.path, Path(f"{self.path}-wal"))
                   if path.exists())

    def close(self) -> None:
        with self._lock:
            for db in [*self._readers, self._db]:
                if db is not None:
                    with contextlib.suppress(sqlite3.Error):
                        db.close()
            self._readers, self._db = [], None
