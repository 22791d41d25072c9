"""The results store on PostgreSQL (``[results] url``; the ``postgresql`` extra installs
psycopg), for results that outgrow one file, or a scale-out merge view's.

The same tables and SQL as SQLite (``collector.results.store``).  The writer holds one
connection; each querying thread opens its own, so a long query never holds up a write.
A lost connection is opened again at the next call: a connection the server dropped while
it was idle (the server restarted, or failed over) is found lost when a call first uses it,
before that call has changed anything, and that call goes on over a new connection.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterable

from collector.results.store import SCHEMA, SqlResultsStore, StoreError

try:
    import psycopg
except ImportError:  # the postgresql extra is not installed
    psycopg = None

CONNECT_SECONDS = 10
# A query may take this long at most (its windows are bounded; this bounds a sick server).
STATEMENT_MILLISECONDS = 30_000


def _sql(statement: str) -> str:
    return statement.replace("?", "%s")


class PostgresResultsStore(SqlResultsStore):
    def __init__(self, url: str, *, password: str | None = None):
        if psycopg is None:
            raise StoreError("results.url: PostgreSQL needs psycopg: "
                             "pip install 'edge-ldp[postgresql]'")
        self.url, self._password = url, password
        self._lock = threading.Lock()
        self._local = threading.local()
        self._readers: list = []
        self._db = None
        try:
            with self._write_transaction() as cursor:
                for statement in filter(str.strip, SCHEMA.format(blob="BYTEA").split(";")):
                    cursor.execute(statement)
        except psycopg.Error as exc:  # no right to create the tables, say
            self.close()
            raise StoreError(f"results.url: cannot create the results tables ({exc})") from None

    def _connect(self):
        try:
            return psycopg.connect(self.url, password=self._password, autocommit=True,
                                   connect_timeout=CONNECT_SECONDS,
                                   options=f"-c statement_timeout={STATEMENT_MILLISECONDS}")
        except psycopg.Error as exc:
            raise StoreError(f"results.url: cannot connect to PostgreSQL ({exc})") from None

    def _writer(self):
        if self._db is None or self._db.closed:
            self._db = self._connect()
        return self._db

    def _begin(self, transaction: contextlib.ExitStack):
        """The writer's connection, with a transaction begun on it (entered on
        ``transaction``).  A connection found lost at BEGIN (nothing of the transaction
        was sent) is opened again, once."""
        for last in (False, True):
            db = self._writer()
            try:
                transaction.enter_context(db.transaction())
                return db
            except psycopg.OperationalError:
                lost = db.broken
                db.close()
                if last or not lost:
                    raise

    @contextlib.contextmanager
    def _write_transaction(self):
        with self._lock:
            try:
                with contextlib.ExitStack() as transaction:  # rolled back on an exception
                    db = self._begin(transaction)
                    with db.cursor() as cursor:
                        yield _Cursor(cursor)
            except psycopg.OperationalError:
                if self._db is not None:
                    self._db.close()  # opened again at the next call
                raise

    def _reader(self):
        """This thread's connection for queries (a new one if it has none, or lost it)."""
        db = getattr(self._local, "db", None)
        if db is None or db.closed:
            old, db = db, self._connect()
            self._local.db = db
            with self._lock:
                self._readers = [reader for reader in self._readers if reader is not old]
                self._readers.append(db)
        return db

    def _read(self, sql: str, parameters: tuple) -> list[tuple]:
        for last in (False, True):
            db = self._reader()
            try:
                return db.execute(_sql(sql), parameters).fetchall()
            except psycopg.OperationalError:
                lost = db.broken
                db.close()
                if last or not lost:  # not a lost connection: a query that failed
                    raise

    def close(self) -> None:
        with self._lock:
            for db in [*self._readers, self._db]:
                if db is not None:
                    with contextlib.suppress(Exception):
                        db.close()
            self._readers, self._db = [], None


class _Cursor:
    """A psycopg cursor that takes the shared SQL's ``?`` placeholders."""

    def __init__(self, cursor):
        self._cursor = cursor

    def execute(self, sql: str, parameters: tuple = ()):
        return self._cursor.execute(_sql(sql), parameters)

    def executemany(self, sql: str, rows: Iterable):
        rows = iter(rows)
        first = next(rows, None)
        if first is not None:  # none: no statement at all
            self._cursor.executemany(_sql(sql), itertools.chain((first,), rows))

    def fetchone(self):
        return self._cursor.fetchone()

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount
