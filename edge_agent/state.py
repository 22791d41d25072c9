"""The agent's durable state: budget ledger, sequence numbers and spool, in one SQLite file.

Why one file: a report's privacy charge, its sequence number and the
perturbed message that carries it are written in *one* transaction, which the
agent drives (``with store.transaction() as tx: tx.charge(...);
tx.take_seq(...); tx.spool(...)``).  Either all three are on disk or none is,
so a crash can never publish a value whose epsilon was not charged, and a
restart neither reuses a sequence number nor resets the budget.  A crash after
the commit but before the broker's acknowledgement costs budget (the message
is still sent from the spool at the next start), never the reverse.

A spooled report leaves the spool on the broker's acknowledgement, or with
``[delivery] confirm = "collector"`` only once a collector confirms it has
counted it durably (``confirm``): until then the broker's acknowledgement
just marks it sent (``acked``), and it is sent again after a reconnect or
when the confirmation is overdue (``requeue``).  A broker restarted without
persistence, or a collector that lost its disk, then loses nothing an agent
still holds.

Only perturbed data is ever stored: message payloads are grid codes.

The file is in WAL mode with ``synchronous=FULL``, so a committed batch
survives ``kill -9`` and power loss.  Several virtual agents (the fleet
simulator) can share one file: every row carries its agent id.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    agent TEXT NOT NULL,
    period_start INTEGER NOT NULL,      -- seconds since the epoch, UTC-aligned
    channel TEXT NOT NULL,
    spent_nano INTEGER NOT NULL,        -- epsilon spent, in units of 1e-9, rounded up
    reports INTEGER NOT NULL,
    PRIMARY KEY (agent, period_start, channel)
);
CREATE TABLE IF NOT EXISTS seq (
    agent TEXT NOT NULL,
    channel TEXT NOT NULL,
    next INTEGER NOT NULL,
    PRIMARY KEY (agent, channel)
);
CREATE TABLE IF NOT EXISTS spool (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    created REAL NOT NULL,
    lane INTEGER NOT NULL DEFAULT 0,    -- 0 reports (in order), 1 range replies (first)
    agent TEXT,                         -- a report's (agent, channel, seq); NULL otherwise
    channel TEXT,
    seq INTEGER,
    acked REAL,                         -- when the broker acknowledged it (confirm mode)
    resends INTEGER NOT NULL DEFAULT 0  -- sent again for want of a confirmation
);
CREATE TABLE IF NOT EXISTS range_runs (  -- range-discovery runs an agent has joined
    agent TEXT NOT NULL,
    run TEXT NOT NULL,
    terms TEXT NOT NULL,                -- agreed at join (JSON): channel, side, epsilon, ...
    rounds INTEGER,                     -- L, fixed by the first round answered
    joined REAL NOT NULL,
    PRIMARY KEY (agent, run)
);
CREATE TABLE IF NOT EXISTS range_answers (
    agent TEXT NOT NULL,
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    PRIMARY KEY (agent, run, round)
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""

_SPOOL_COLUMNS = {"lane": "INTEGER NOT NULL DEFAULT 0", "agent": "TEXT", "channel": "TEXT",
                  "seq": "INTEGER", "acked": "REAL", "resends": "INTEGER NOT NULL DEFAULT 0"}
MAX_RESEND_DOUBLINGS = 6  # an unconfirmed report waits at most 64 x resend_seconds

NANO = 10**9
# Spool lanes: reports go out in order; range-discovery replies are answers to a
# round with a deadline, so they overtake a backlog of reports.
REPORTS, RANGE_REPLIES = 0, 1
LANES = (RANGE_REPLIES, REPORTS)  # the order the outbox serves them


def to_nano_up(epsilon: float) -> int:
    """Charges round up, so the integer ledger never under-counts."""
    return math.ceil(epsilon * NANO)


def to_nano_down(epsilon: float) -> int:
    """Budgets round down, for the same reason."""
    return math.floor(epsilon * NANO)


def period_start(now: float, period_seconds: float) -> int:
    return int(math.floor(now / period_seconds) * period_seconds)


@dataclass(frozen=True)
class RangeRun:
    """What an agent agreed to for one range-discovery run, and what it has answered."""

    terms: str  # the run's terms as agreed at join (JSON), compared with every round
    rounds: int | None  # L, fixed by the first round answered
    answered: frozenset[int]  # rounds answered


class Transaction:
    """One write transaction of the state store (``StateStore.transaction``).

    The agent decides and this records: charges, sequence numbers and spooled
    messages written through one transaction are on disk together or not at all."""

    def __init__(self, db: sqlite3.Connection, store: StateStore, now: float):
        self._db, self._store, self.now = db, store, now
        self._spent: dict[tuple[str, int], int] = {}  # (agent, period) -> nano-epsilon

    # -- the ledger --
    def spent(self, agent: str, start: int) -> int:
        """Epsilon spent by ``agent`` in the period starting at ``start`` (nano)."""
        key = (agent, start)
        if key not in self._spent:
            self._spent[key] = self._store.spent(agent, start)
        return self._spent[key]

    def charge(self, agent: str, channel: str, *, epsilon: float, wanted: int, start: int,
               budget_epsilon: float) -> int:
        """Charge as many of ``wanted`` reports at ``epsilon`` each as the period's budget
        still allows (charges round up, the budget down); returns how many."""
        cost = to_nano_up(epsilon)
        room = max(0, to_nano_down(budget_epsilon) - self.spent(agent, start))
        allowed = int(min(wanted, room // cost)) if cost else 0
        if allowed:
            self._spent[(agent, start)] += cost * allowed
            self._db.execute(
                "INSERT INTO ledger VALUES (?, ?, ?, ?, ?) ON CONFLICT (agent, period_start, "
                "channel) DO UPDATE SET spent_nano = spent_nano + excluded.spent_nano, "
                "reports = reports + excluded.reports",
                (agent, start, channel, cost * allowed, allowed))
        return allowed

    # -- sequence numbers --
    def take_seq(self, agent: str, channel: str) -> int:
        """The next sequence number of (agent, channel), now used up."""
        seq = self._store.next_seq(agent, channel)
        self._db.execute("INSERT INTO seq VALUES (?, ?, ?) ON CONFLICT (agent, channel) "
                         "DO UPDATE SET next = excluded.next", (agent, channel, seq + 1))
        return seq

    # -- the spool --
    def spool(self, topic: str, payload: bytes, *, qos: int = 1, lane: int = REPORTS,
              report: tuple[str, str, int] | None = None) -> None:
        """Spool a message; ``report``: its (agent, channel, seq), which a collector's
        confirmation names."""
        agent, channel, seq = report if report is not None else (None, None, None)
        self._db.execute("INSERT INTO spool (topic, payload, qos, created, lane, agent, "
                         "channel, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (topic, payload, qos, self.now, lane, agent, channel, seq))
        self._store._spooled += 1

    # -- range discovery --
    def join_range(self, agent: str, run: str, terms: str) -> bool:
        """Record that ``agent`` joined ``run`` on ``terms``; False if it had already."""
        cursor = self._db.execute("INSERT OR IGNORE INTO range_runs VALUES (?, ?, ?, NULL, ?)",
                                  (agent, run, terms, self.now))
        return bool(cursor.rowcount)

    def range_run(self, agent: str, run: str) -> RangeRun | None:
        """The run as ``agent`` joined it, or None if it did not."""
        row = self._db.execute("SELECT terms, rounds FROM range_runs WHERE agent=? AND run=?",
                               (agent, run)).fetchone()
        if row is None:
            return None
        answered = self._db.execute("SELECT round FROM range_answers WHERE agent=? AND run=?",
                                    (agent, run)).fetchall()
        return RangeRun(row[0], row[1], frozenset(r[0] for r in answered))

    def answer_range(self, agent: str, run: str, round_index: int, rounds: int) -> None:
        """Record that ``agent`` answered ``round_index`` of ``run`` (of ``rounds``)."""
        self._db.execute("UPDATE range_runs SET rounds=? WHERE agent=? AND run=?",
                         (rounds, agent, run))
        self._db.execute("INSERT INTO range_answers VALUES (?, ?, ?)", (agent, run, round_index))


class StateStore:
    def __init__(self, path: str | Path, *, max_messages: int = 200_000,
                 read_only: bool = False):
        self.path = Path(path)
        self.max_messages = max_messages
        # One connection per store; the agent loop is its only user, but keep a
        # lock so a stray thread cannot interleave transactions.
        self._lock = threading.RLock()
        if read_only:  # inspection (edge-agent budget) must not create or change state
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                       isolation_level=None, check_same_thread=False)
            self._spooled = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(spool)")}
        # State files from before range discovery, and before confirmations (their
        # spooled rows name no report: they leave on the broker's acknowledgement).
        for column, declaration in _SPOOL_COLUMNS.items():
            if column not in columns:
                self._db.execute(f"ALTER TABLE spool ADD COLUMN {column} {declaration}")
        self._db.execute("CREATE INDEX IF NOT EXISTS spool_report ON spool (agent, channel, seq)")
        self._spooled = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def transaction(self, now: float | None = None) -> Iterator[Transaction]:
        """One write transaction under the lock; on any error nothing of it stays.

        The spool cap is enforced at the end, inside the transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield Transaction(self._db, self, time.time() if now is None else now)
                self._enforce_cap()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._spooled = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
                raise

    # -- reads -----------------------------------------------------------------------
    def spent(self, agent: str, start: int) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(spent_nano), 0) FROM ledger "
                "WHERE agent=? AND period_start=?", (agent, start)).fetchone()
        return int(row[0])

    def range_terms(self, agent: str, run: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT terms FROM range_runs WHERE agent=? AND run=?",
                                   (agent, run)).fetchone()
        return row[0] if row else None

    def next_seq(self, agent: str, channel: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT next FROM seq WHERE agent=? AND channel=?",
                                   (agent, channel)).fetchone()
        return row[0] if row else 0

    def budget_report(self, agent: str | None = None) -> list[tuple[str, int, str, float, int]]:
        """(agent, period_start, channel, epsilon spent, reports), newest period first."""
        with self._lock:
            query = "SELECT agent, period_start, channel, spent_nano, reports FROM ledger"
            args: tuple = ()
            if agent is not None:
                query += " WHERE agent=?"
                args = (agent,)
            rows = self._db.execute(query + " ORDER BY period_start DESC, agent, channel",
                                    args).fetchall()
        return [(a, p, c, n / NANO, r) for a, p, c, n, r in rows]

    # -- the spool -------------------------------------------------------------------
    def enqueue(self, topic: str, payload: bytes, *, qos: int = 1, lane: int = REPORTS) -> None:
        """Spool a message that carries no privacy charge (e.g. a range refusal)."""
        with self.transaction() as tx:
            tx.spool(topic, payload, qos=qos, lane=lane)

    def _enforce_cap(self) -> None:
        excess = self._spooled - self.max_messages
        if excess > 0:
            self._db.execute("DELETE FROM spool WHERE id IN "
                             "(SELECT id FROM spool ORDER BY id LIMIT ?)", (excess,))
            self._spooled -= excess
            self._add_counter("spool_dropped", excess)

    def pending(self, after_id: int, limit: int,
                lane: int = REPORTS) -> list[tuple[int, str, bytes, int]]:
        """Spooled messages of one lane with id > after_id not yet acknowledged by the
        broker, oldest first."""
        with self._lock:
            return self._db.execute(
                "SELECT id, topic, payload, qos FROM spool WHERE lane = ? AND id > ? "
                "AND acked IS NULL ORDER BY id LIMIT ?", (lane, after_id, limit)).fetchall()

    def acknowledge(self, ids: Iterable[int], *, until_confirmed: bool = False,
                    now: float | None = None) -> None:
        """The broker acknowledged these rows: they leave the spool, except reports that
        wait for a collector's confirmation (``until_confirmed``)."""
        ids = list(ids)
        if not ids:
            return
        now = time.time() if now is None else now
        with self.transaction():
            if until_confirmed:
                self._db.executemany("UPDATE spool SET acked = ? WHERE id = ? AND seq IS NOT NULL",
                                     [(now, i) for i in ids])
            cursor = self._db.executemany("DELETE FROM spool WHERE id = ? AND acked IS NULL",
                                          [(i,) for i in ids])
            self._spooled -= cursor.rowcount

    def confirm(self, agent: str, channels: dict[str, list[tuple[int, int]]]) -> int:
        """A collector has durably counted these runs of sequence numbers: those reports
        leave the spool.  Returns how many did."""
        removed = 0
        with self.transaction():
            for channel, runs in channels.items():
                cursor = self._db.executemany(
                    "DELETE FROM spool WHERE agent = ? AND channel = ? AND seq BETWEEN ? AND ?",
                    [(agent, channel, first, last) for first, last in runs])
                removed += cursor.rowcount
            self._spooled -= removed
        return removed

    def requeue(self, *, acked_before: float | None = None, resend_seconds: float | None = None,
                now: float | None = None) -> int:
        """Make unconfirmed reports pending again: those the broker acknowledged before
        ``acked_before`` (a reconnect: the broker may have lost them), or those whose
        confirmation is overdue: ``resend_seconds``, doubled with each resend of the
        report (up to 64 times), since the broker acknowledged them.  Returns how many."""
        now = time.time() if now is None else now
        with self.transaction():
            if acked_before is not None:
                cursor = self._db.execute("UPDATE spool SET acked = NULL WHERE acked < ?",
                                          (acked_before,))
            else:
                cursor = self._db.execute(
                    "UPDATE spool SET acked = NULL, resends = resends + 1 WHERE acked IS NOT NULL"
                    " AND acked + ? * (1 << MIN(resends, ?)) <= ?",
                    (resend_seconds, MAX_RESEND_DOUBLINGS, now))
            return cursor.rowcount

    def unconfirmed(self) -> int:
        """Reports the broker acknowledged that no collector has confirmed yet."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM spool WHERE acked IS NOT NULL") \
                .fetchone()[0]

    @property
    def spooled(self) -> int:
        return self._spooled

    # -- counters ------------------------------------------------------------------------
    def _add_counter(self, name: str, amount: int) -> None:
        self._db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT (name) "
                         "DO UPDATE SET value = value + excluded.value", (name, amount))

    def counter(self, name: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM counters WHERE name=?", (name,)).fetchone()
        return int(row[0]) if row else 0
