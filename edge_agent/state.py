"""The agent's durable state: budget ledger, sequence numbers and spool, in one SQLite file.

Why one file: a report's privacy charge, its sequence number and the
perturbed message that carries it are written in *one* transaction.  Either
all three are on disk or none is, so a crash can never publish a value whose
epsilon was not charged, and a restart neither reuses a sequence number nor
resets the budget.  A crash after the commit but before the broker's
acknowledgement costs budget (the message is still sent from the spool at the
next start), never the reverse.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

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
    lane INTEGER NOT NULL DEFAULT 0     -- 0 reports (in order), 1 range replies (first)
);
CREATE TABLE IF NOT EXISTS range_runs (  -- range-discovery runs an agent has joined
    agent TEXT NOT NULL,
    run TEXT NOT NULL,
    terms TEXT NOT NULL,                -- what was agreed at join (JSON): channel, side, epsilon, ...
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


@dataclass
class Charge:
    """A request to release up to ``wanted`` reports of ``channel`` at ``epsilon`` each.

    ``build(first_seq, allowed)`` is called inside the transaction once the
    affordable number is known; it perturbs that many readings and returns
    the (topic, payload) of the one message carrying them, or None.
    """

    agent: str
    channel: str
    epsilon: float
    wanted: int
    build: Callable[[int, int], tuple[str, bytes] | None]


@dataclass
class ChargeResult:
    channel: str
    allowed: int
    seq: int | None  # sequence number of the message written, if any
    exhausted: bool  # the budget stopped some or all reports


@dataclass
class RangeAnswer:
    """One agent's privatised answer to one round, to charge and spool atomically."""

    agent: str
    run: str
    round: int
    rounds: int  # L announced with the round; must match what this agent answered before
    answers_allowed: int  # per run: L (sequential) or 1 (split)
    ledger_channel: str
    epsilon: float  # of this answer
    message: tuple[str, bytes]


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
        if "lane" not in columns:  # a state file from before range discovery
            self._db.execute("ALTER TABLE spool ADD COLUMN lane INTEGER NOT NULL DEFAULT 0")
        self._spooled = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self):
        """One write transaction under the lock; on any error nothing of it stays."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._spooled = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
                raise

    # -- the ledger ------------------------------------------------------------------
    def spent(self, agent: str, start: int) -> int:
        row = self._db.execute(
            "SELECT COALESCE(SUM(spent_nano), 0) FROM ledger WHERE agent=? AND period_start=?",
            (agent, start)).fetchone()
        return int(row[0])

    def record(self, charges: Iterable[Charge], *, start: int, budget_epsilon: float,
               now: float | None = None) -> list[ChargeResult]:
        """Charge, number and spool a batch atomically; see ``Charge``."""
        now = time.time() if now is None else now
        budget = to_nano_down(budget_epsilon)
        results = []
        with self._transaction():
            spent = {}
            for charge in charges:
                if charge.agent not in spent:
                    spent[charge.agent] = self.spent(charge.agent, start)
                cost = to_nano_up(charge.epsilon)
                affordable = max(0, budget - spent[charge.agent]) // cost if cost else 0
                allowed = int(min(charge.wanted, affordable))
                seq = None
                if allowed:
                    seq = self._next_seq(charge.agent, charge.channel)
                    message = charge.build(seq, allowed)
                    if message is None:  # nothing released, nothing charged
                        results.append(ChargeResult(charge.channel, 0, None, False))
                        continue
                    self._spool(message, now)
                    self._bump_seq(charge.agent, charge.channel, seq + 1)
                    spent[charge.agent] += cost * allowed
                    self._charge(charge.agent, start, charge.channel, cost * allowed, allowed)
                results.append(ChargeResult(charge.channel, allowed, seq,
                                            allowed < charge.wanted))
            self._enforce_cap()
        return results

    def _charge(self, agent: str, start: int, channel: str, nano: int, reports: int) -> None:
        self._db.execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?) ON CONFLICT (agent, period_start, channel) "
            "DO UPDATE SET spent_nano = spent_nano + excluded.spent_nano, "
            "reports = reports + excluded.reports", (agent, start, channel, nano, reports))

    # -- range discovery --------------------------------------------------------------
    def join_range(self, joins: Iterable[tuple[str, str, str, tuple[str, bytes]]], *,
                   now: float) -> list[bool]:
        """Record (agent, run, terms JSON, join reply) and spool the reply, atomically.

        Returns per join whether it is new (an agent joins a run at most once).
        """
        results = []
        with self._transaction():
            for agent, run, terms, message in joins:
                cursor = self._db.execute(
                    "INSERT OR IGNORE INTO range_runs VALUES (?, ?, ?, NULL, ?)",
                    (agent, run, terms, now))
                if cursor.rowcount:
                    self._spool(message, now, lane=RANGE_REPLIES)
                results.append(bool(cursor.rowcount))
        return results

    def range_terms(self, agent: str, run: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT terms FROM range_runs WHERE agent=? AND run=?",
                                   (agent, run)).fetchone()
        return row[0] if row else None

    def answer_range(self, answers: Iterable[RangeAnswer], *, start: int,
                     budget_epsilon: float, now: float) -> list[str]:
        """Charge and spool range answers in one transaction; an outcome per answer.

        ``answered``; or, with nothing charged or sent: ``not_joined``,
        ``duplicate`` (this round was answered already: replays never make an
        agent answer twice), ``rounds_changed`` (a round announcing another L
        than the one answered before), ``run_complete`` (the run's answers
        are used up) or ``exhausted`` (the period budget would be exceeded).
        """
        budget = to_nano_down(budget_epsilon)
        outcomes = []
        with self._transaction():
            spent: dict[str, int] = {}
            for answer in answers:
                outcome = self._answer_range(answer, start, budget, spent, now)
                outcomes.append(outcome)
            self._enforce_cap()
        return outcomes

    def _answer_range(self, answer: RangeAnswer, start: int, budget: int,
                      spent: dict[str, int], now: float) -> str:
        key = (answer.agent, answer.run)
        row = self._db.execute("SELECT rounds FROM range_runs WHERE agent=? AND run=?",
                               key).fetchone()
        if row is None:
            return "not_joined"
        if self._db.execute("SELECT 1 FROM range_answers WHERE agent=? AND run=? AND round=?",
                            (*key, answer.round)).fetchone():
            return "duplicate"
        if row[0] is not None and row[0] != answer.rounds:
            return "rounds_changed"
        given = self._db.execute("SELECT COUNT(*) FROM range_answers WHERE agent=? AND run=?",
                                 key).fetchone()[0]
        if given >= answer.answers_allowed:
            return "run_complete"
        if answer.agent not in spent:
            spent[answer.agent] = self.spent(answer.agent, start)
        cost = to_nano_up(answer.epsilon)
        if spent[answer.agent] + cost > budget:
            return "exhausted"
        spent[answer.agent] += cost
        self._db.execute("UPDATE range_runs SET rounds=? WHERE agent=? AND run=?",
                         (answer.rounds, *key))
        self._db.execute("INSERT INTO range_answers VALUES (?, ?, ?)", (*key, answer.round))
        self._charge(answer.agent, start, answer.ledger_channel, cost, 1)
        self._spool(answer.message, now, lane=RANGE_REPLIES)
        return "answered"

    def _next_seq(self, agent: str, channel: str) -> int:
        row = self._db.execute("SELECT next FROM seq WHERE agent=? AND channel=?",
                               (agent, channel)).fetchone()
        return row[0] if row else 0

    def _bump_seq(self, agent: str, channel: str, value: int) -> None:
        self._db.execute("INSERT INTO seq VALUES (?, ?, ?) ON CONFLICT (agent, channel) "
                         "DO UPDATE SET next = excluded.next", (agent, channel, value))

    def next_seq(self, agent: str, channel: str) -> int:
        with self._lock:
            return self._next_seq(agent, channel)

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
    def _spool(self, message: tuple[str, bytes], now: float, qos: int = 1,
               lane: int = REPORTS) -> None:
        topic, payload = message
        self._db.execute("INSERT INTO spool (topic, payload, qos, created, lane) "
                         "VALUES (?, ?, ?, ?, ?)", (topic, payload, qos, now, lane))
        self._spooled += 1

    def enqueue(self, topic: str, payload: bytes, *, qos: int = 1, lane: int = REPORTS) -> None:
        """Spool a message that carries no privacy charge (e.g. a range refusal)."""
        with self._transaction():
            self._spool((topic, payload), time.time(), qos, lane)
            self._enforce_cap()

    def _enforce_cap(self) -> None:
        excess = self._spooled - self.max_messages
        if excess > 0:
            self._db.execute("DELETE FROM spool WHERE id IN "
                             "(SELECT id FROM spool ORDER BY id LIMIT ?)", (excess,))
            self._spooled -= excess
            self._add_counter("spool_dropped", excess)

    def pending(self, after_id: int, limit: int,
                lane: int = REPORTS) -> list[tuple[int, str, bytes, int]]:
        """Spooled messages of one lane with id > after_id, oldest first."""
        with self._lock:
            return self._db.execute(
                "SELECT id, topic, payload, qos FROM spool WHERE lane = ? AND id > ? "
                "ORDER BY id LIMIT ?", (lane, after_id, limit)).fetchall()

    def acknowledge(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        if not ids:
            return
        with self._transaction():
            cursor = self._db.executemany("DELETE FROM spool WHERE id=?", [(i,) for i in ids])
            self._spooled -= cursor.rowcount

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
