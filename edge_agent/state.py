"""The agent's durable state: budget ledger, sequence numbers and spool, in one SQLite file.

Why one file: a report's privacy charge, its sequence number and the
perturbed message that carries it are written in *one* transaction, which the
agent drives (``with store.transaction() as tx: tx.charge(...);
tx.take_seq(...); tx.spool(...)``).  Either all three are on disk or none is,
so a crash can never publish a value whose epsilon (or delta) was not charged,
and a restart neither reuses a sequence number nor resets the budget.  A crash
after the commit but before the broker's acknowledgement costs budget (the
message is still sent from the spool at the next start), never the reverse.

A spooled report leaves the spool on the broker's acknowledgement, or with
``[delivery] confirm = "collector"`` only once a collector confirms it has
counted it durably (``confirm``): until then the broker's acknowledgement
just marks it sent (``acked``), and it is sent again after a reconnect or
when the confirmation is overdue (``requeue``).  A broker restarted without
persistence, or a collector that lost its disk, then loses nothing an agent
still holds.

Only perturbed data is ever stored: message payloads are grid codes.

The budget only moves forward (docs/guides/PRIVACY.md, "The budget")
--------------------------------------------------------------
Spending is kept per agent and channel against the *ledger time*, a clock of
our own that never goes back and never jumps: between two charges it advances
by the wall clock's advance, at most the monotonic clock's within one boot (a
clock stepped back stands still, a clock stepped forward moves at the
monotonic clock's pace, restarts of the agent included); across a reboot by
the wall clock's advance past the latest time it ever showed (never less than
zero).
The budget holds over every *rolling* window of ``budget_period`` of ledger
time: a charge at ledger time t is allowed only if everything charged after
``t - period`` plus it stays within the budget.  Spending is never forgotten
(``_keep``): what no window in force counts any more moves into coarser
buckets (hours, after a month days), which only ever count a charge *later*
than it was made, so a window lengthened or added by a configuration change
counts everything spent before the change, on the safe side; nothing in the
config, the clock or a restart gives spent epsilon back.  Files of earlier
versions, which deleted spending older than their longest period, know their
past only from ``known_since`` on: a window reaching before it counts the
unknown stretch as fully spent (``LedgerClock.reaches_unknown``).  While the
wall clock is behind the latest time it has shown (a Pi without a real-time
clock before NTP), nothing is reported.
Charges are integers (``NANO`` units of epsilon), rounded up exactly from the
channel's privacy map; budgets are rounded down.

Delta: an (epsilon, delta)-LDP channel's report also costs its exact delta,
charged in integer ``DELTA_UNIT`` units (1e-15, rounded up; budgets down) next
to its epsilon, in the same row.  Under basic composition (Dwork & Roth, "The
Algorithmic Foundations of Differential Privacy", Theorem 3.16) reports at
(eps_i, delta_i) compose to (sum eps_i, sum delta_i), so the same rolling windows
bound both sums: a charge is allowed only if the window stays within
``budget_epsilon`` *and* within ``budget_delta``.  Pure epsilon-LDP reports cost
delta 0; a report that costs any delta is never allowed under a budget of delta 0.

The file is in WAL mode with ``synchronous=FULL``, so a committed batch
survives ``kill -9`` and power loss.  Several virtual agents (the fleet
simulator) can share one file: every row carries its agent id.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spending (    -- the budget ledger
    agent TEXT NOT NULL,
    channel TEXT NOT NULL,
    until REAL NOT NULL,                -- ledger time by which these charges were made
    spent_nano INTEGER NOT NULL,        -- epsilon spent, in units of 1e-9, rounded up
    reports INTEGER NOT NULL,
    spent_delta INTEGER NOT NULL DEFAULT 0,  -- delta spent, in units of 1e-15, rounded up
    PRIMARY KEY (agent, channel, until)
);
CREATE INDEX IF NOT EXISTS spending_until ON spending (until);
CREATE TABLE IF NOT EXISTS ledger_clock (  -- one row
    id INTEGER PRIMARY KEY CHECK (id = 0),
    ledger_time REAL NOT NULL,          -- never decreases
    wall REAL NOT NULL,                 -- the wall clock at that ledger time
    wall_high REAL NOT NULL,            -- the latest wall-clock time ever seen
    retain_seconds REAL NOT NULL,       -- the longest budget period ever used
    boot_id TEXT NOT NULL,              -- the boot (kernel boot_id) of the last charge
    since_boot REAL NOT NULL,           -- and the monotonic clock then
    known_since REAL                    -- spending is known from this ledger time on
                                        -- (NULL: all of it; set for earlier versions' files)
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
CREATE TABLE IF NOT EXISTS memos (     -- memoized categories: drawn once, kept for good
    agent TEXT NOT NULL,
    channel TEXT NOT NULL,
    domain TEXT NOT NULL,               -- the categories and memo_epsilon it was drawn for
    value TEXT NOT NULL,                -- the category's label
    memo INTEGER NOT NULL,              -- the category number it is reported as
    memo_nano INTEGER NOT NULL,         -- what it reveals about the value, for good (1e-9)
    created REAL NOT NULL,
    reported REAL,                      -- when first reported (NULL: never; it reveals nothing)
    PRIMARY KEY (agent, channel, domain, value)
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""

_SPOOL_COLUMNS = {"lane": "INTEGER NOT NULL DEFAULT 0", "agent": "TEXT", "channel": "TEXT",
                  "seq": "INTEGER", "acked": "REAL", "resends": "INTEGER NOT NULL DEFAULT 0"}
# State files from before delta accounting spent none.
_SPENDING_COLUMNS = {"spent_delta": "INTEGER NOT NULL DEFAULT 0"}
# Files from before spending was kept for good deleted what was older than the longest
# period they had seen (retain_seconds) before their last charge: their spending is
# known from there on.  Nothing was deleted by a file that never charged (retain 0).
_KNOWN_SINCE_OF_EARLIER_FILES = ("CASE WHEN retain_seconds > 0 THEN ledger_time - retain_seconds "
                                 "END")
MAX_RESEND_DOUBLINGS = 6  # an unconfirmed report waits at most 64 x resend_seconds

NANO = 10**9
# Delta is charged in units of 1e-15: an (epsilon, delta) mechanism's delta is far
# smaller than epsilon (well below 1/n), so it needs a finer unit than NANO.
DELTA_UNIT = 10**15
# Spool lanes: reports go out in order; range-discovery replies are answers to a
# round with a deadline, so they overtake a backlog of reports.
REPORTS, RANGE_REPLIES = 0, 1
LANES = (RANGE_REPLIES, REPORTS)  # the order the outbox serves them


# Spending is kept in buckets of ledger time: at most this many per period (a charge
# counts until its bucket's end, so a window counts at most one bucket more than it
# must: 1/1440 of a period, on the safe side).
BUCKETS_PER_PERIOD = 1440
# The wall clock may be this far behind its latest time before reporting stops
# (NTP corrects small offsets by stepping too).
CLOCK_TOLERANCE = 5.0
HOUR, DAY = 3600.0, 86400.0
LEGACY_RETAIN = 7 * DAY  # the longest period a ledger from before ledger time counted
# Spending that no window in force counts any more is kept in buckets of an hour, and
# after HOURLY_SECONDS in buckets of a day, for good: about 744 + 365 rows a channel for a
# year, and a window lengthened later counts at most one such bucket (an hour, or a day
# for windows beyond a month) more than it must.
HOURLY_SECONDS = 31 * DAY


def to_nano_up(epsilon: float | Fraction) -> int:
    """Charges round up, exactly (the float 0.1 is a little more than 1/10)."""
    return math.ceil(Fraction(epsilon) * NANO)


def to_nano_down(epsilon: float | Fraction) -> int:
    """Budgets round down, for the same reason."""
    return math.floor(Fraction(epsilon) * NANO)


def delta_units_up(delta: float | Fraction | Decimal) -> int:
    """A report's delta in ``DELTA_UNIT`` units, rounded up exactly (``Fraction`` of a
    float or a ``Decimal`` is its exact value)."""
    return math.ceil(Fraction(delta) * DELTA_UNIT)


def delta_units_down(delta: float | Fraction | Decimal) -> int:
    """A delta budget in ``DELTA_UNIT`` units, rounded down exactly."""
    return math.floor(Fraction(delta) * DELTA_UNIT)


def period_start(now: float, period_seconds: float) -> int:
    """The UTC-aligned period holding ``now`` (when ``domain = "auto"`` adopts a range)."""
    return int(math.floor(now / period_seconds) * period_seconds)


def boot_clock() -> float:
    """Seconds since boot, suspend included where the OS counts it (CLOCK_BOOTTIME)."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


def boot_id() -> str:
    """This boot's id (Linux); elsewhere one per process, so every start counts as a boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"process-{os.getpid()}-{time.time()}"


def bucket_width(window_seconds: float) -> float:
    """The ledger-time buckets spending is kept in for a rolling window of this length."""
    return min(3600.0, max(1.0, window_seconds / BUCKETS_PER_PERIOD))


@dataclass(frozen=True)
class Limit:
    """At most ``nano`` units of epsilon and ``delta`` units (``DELTA_UNIT``) of delta in
    every rolling window of ``window_seconds`` (basic composition): one guarantee."""

    nano: int
    window_seconds: float
    delta: int = 0

    def allows(self, wanted: int, cost: int, delta_cost: int,
               spent: tuple[int, int]) -> int:
        """How many of ``wanted`` reports at ``cost`` and ``delta_cost`` fit after
        ``spent`` (nano-epsilon, delta units) in the window."""
        allowed = min(wanted, max(0, self.nano - spent[0]) // cost)
        if delta_cost:  # a budget of delta 0 allows no report that costs delta
            allowed = min(allowed, max(0, self.delta - spent[1]) // delta_cost)
        return int(allowed)


@dataclass(frozen=True)
class Budget:
    """Every guarantee at once (``limits``, shortest window first): a charge is allowed
    only where it keeps every rolling window of every limit within it."""

    limits: tuple[Limit, ...]

    def __post_init__(self):
        if not self.limits:
            raise ValueError("limits: at least one")
        windows = [limit.window_seconds for limit in self.limits]
        if windows != sorted(set(windows)):
            raise ValueError(f"limits: windows must be distinct and ascending, got {windows}")

    @classmethod
    def of(cls, epsilon: float, window_seconds: float, delta: float = 0.0) -> Budget:
        """One guarantee."""
        return cls.of_guarantees([(epsilon, window_seconds, delta)])

    @classmethod
    def of_guarantees(cls, guarantees) -> Budget:
        """(epsilon, window_seconds, delta) per guarantee, in any order; budgets round
        down exactly."""
        return cls(tuple(Limit(to_nano_down(epsilon), float(seconds), delta_units_down(delta))
                         for epsilon, seconds, delta in sorted(guarantees,
                                                               key=lambda g: g[1])))

    @property
    def window_seconds(self) -> float:
        """The longest window: spending is kept that long."""
        return self.limits[-1].window_seconds

    @property
    def bucket_seconds(self) -> float:
        """The shortest window's buckets: a new charge counts at most one of them more
        than it must in any window."""
        return bucket_width(self.limits[0].window_seconds)

    def bucket_end(self, ledger_time: float) -> float:
        width = self.bucket_seconds
        return (math.floor(ledger_time / width) + 1) * width


@dataclass(frozen=True)
class LedgerClock:
    """The persisted ledger clock (see the module's docstring)."""

    ledger_time: float
    wall: float
    wall_high: float
    retain_seconds: float
    boot_id: str
    since_boot: float
    known_since: float | None = None  # None: every charge since the file began is known

    def behind(self, now: float) -> bool:
        """Whether the wall clock is behind the latest time it has shown."""
        return now < self.wall_high - CLOCK_TOLERANCE

    def reaches_unknown(self, window_seconds: float) -> bool:
        """Whether the window ending now begins before the spending this file knows (a
        file of an earlier version, which deleted older spending): such a window counts
        the unknown stretch as fully spent, so its guarantee allows nothing until
        ``counts_fully_from``."""
        return self.known_since is not None and self.ledger_time - window_seconds < \
            self.known_since

    def counts_fully_from(self, window_seconds: float) -> float:
        """The wall-clock time from which a window of this length lies wholly in known
        spending (now, for a window that does already)."""
        if not self.reaches_unknown(window_seconds):
            return self.wall
        return self.wall + (self.known_since + window_seconds - self.ledger_time)

    def wall_of(self, ledger_time: float) -> float:
        """The wall-clock time of a ledger time (the two advance together from now on)."""
        return self.wall - (self.ledger_time - ledger_time)


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
        # agent -> window -> (nano-epsilon, delta units) spent (as read, plus this
        # transaction's charges)
        self._spent: dict[str, dict[float, tuple[int, int]]] = {}
        # While a savepoint is open: (agent, its windows before the part's first charge).
        self._undo: list[tuple[str, dict[float, tuple[int, int]]]] | None = None
        self._clock: LedgerClock | None = None
        self._kept: set[Budget] = set()  # budgets whose old spending was coarsened

    # -- the ledger --
    @property
    def clock(self) -> LedgerClock:
        """The ledger clock advanced to ``now`` (persisted with this transaction)."""
        if self._clock is None:
            self._clock = self._store._advance(self._db, self.now)
        return self._clock

    def _spending(self, agent: str, window_seconds: float) -> tuple[int, int]:
        windows = self._spent.setdefault(agent, {})
        if window_seconds not in windows:
            windows[window_seconds] = self._store._spending(self._db, agent, window_seconds,
                                                            self.clock.ledger_time)
        return windows[window_seconds]

    def spent(self, agent: str, window_seconds: float) -> int:
        """Epsilon ``agent`` spent in the rolling window ending now (nano)."""
        return self._spending(agent, window_seconds)[0]

    def spent_delta(self, agent: str, window_seconds: float) -> int:
        """Delta ``agent`` spent in the rolling window ending now (``DELTA_UNIT``)."""
        return self._spending(agent, window_seconds)[1]

    def charge(self, agent: str, channel: str, *, cost: int, wanted: int,
               budget: Budget, delta_cost: int = 0) -> int:
        """Charge as many of ``wanted`` reports at ``cost`` (nano-epsilon) and
        ``delta_cost`` (``DELTA_UNIT``) each as the rolling window's budget still allows,
        in epsilon and in delta (basic composition); returns how many (none while the
        wall clock is behind its latest time)."""
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
            raise ValueError(f"cost: must be a positive integer (nano-epsilon), got {cost!r}")
        if isinstance(delta_cost, bool) or not isinstance(delta_cost, int) or delta_cost < 0:
            raise ValueError(f"delta_cost: must be a non-negative integer (units of 1e-15), "
                             f"got {delta_cost!r}")
        clock = self.clock
        if clock.behind(self.now):
            return 0
        allowed = wanted
        for limit in budget.limits:
            if clock.reaches_unknown(limit.window_seconds):
                return 0
            allowed = limit.allows(allowed, cost, delta_cost,
                                   self._spending(agent, limit.window_seconds))
        if allowed:
            windows = self._spent[agent]
            if self._undo is not None:
                self._undo.append((agent, dict(windows)))
            for window, (nano, delta) in windows.items():  # every window read grows
                windows[window] = (nano + cost * allowed, delta + delta_cost * allowed)
            if budget not in self._kept:  # once per transaction
                self._kept.add(budget)
                self._store._keep(self._db, clock, budget)
            self._db.execute(
                "INSERT INTO spending (agent, channel, until, spent_nano, reports, spent_delta) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (agent, channel, until) DO UPDATE SET "
                "spent_nano = spent_nano + excluded.spent_nano, "
                "reports = reports + excluded.reports, "
                "spent_delta = spent_delta + excluded.spent_delta",
                (agent, channel, budget.bucket_end(clock.ledger_time), cost * allowed, allowed,
                 delta_cost * allowed))
        return allowed

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """A part of the transaction that an error undoes alone (one channel's batch)."""
        self._db.execute("SAVEPOINT part")
        spooled, self._undo = self._store._spooled, []
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK TO part")
            self._db.execute("RELEASE part")
            for agent, windows in reversed(self._undo):  # only what the part charged
                self._spent[agent] = windows
            self._store._spooled = spooled
            raise
        finally:
            self._undo = None
        self._db.execute("RELEASE part")

    # -- memoized categories --
    def memo_table(self, agent: str, channel: str, domain: str, labels: tuple[str, ...],
                   draw: Callable[[np.ndarray], np.ndarray], memo_nano: int) -> np.ndarray:
        """Every category's memo for ``domain`` (the category numbers of ``labels``):
        drawn with ``draw`` for all that have none yet, at once, and kept with this
        transaction: a category is memoized once, whatever restarts or upgrades follow,
        and when it is drawn says nothing about which values the wearer has.
        ``memo_nano``: what each memo reveals about its value once reported (the
        lifetime account, ``memo_account``)."""
        known = dict(self._db.execute(
            "SELECT value, memo FROM memos WHERE agent = ? AND channel = ? AND domain = ?",
            (agent, channel, domain)).fetchall())
        new = np.array([v for v, label in enumerate(labels) if label not in known],
                       dtype=np.int64)
        if new.size:
            for value, memo in zip(new, draw(new)):
                known[labels[value]] = int(memo)
                self._db.execute("INSERT INTO memos (agent, channel, domain, value, memo, "
                                 "memo_nano, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (agent, channel, domain, labels[value], int(memo),
                                  memo_nano, self.now))
        return np.array([known[label] for label in labels], dtype=np.int64)

    def memoize(self, agent: str, channel: str, domain: str, labels: tuple[str, ...],
                values: np.ndarray, draw: Callable[[np.ndarray], np.ndarray],
                memo_nano: int) -> np.ndarray:
        """The memos of category numbers ``values`` (``memo_table``), each value marked
        reported from its first report on (what ``memo_account`` counts)."""
        table = self.memo_table(agent, channel, domain, labels, draw, memo_nano)
        self._db.executemany(
            "UPDATE memos SET reported = ? WHERE agent = ? AND channel = ? AND domain = ? "
            "AND value = ? AND reported IS NULL",
            [(self.now, agent, channel, domain, labels[v]) for v in np.unique(values)])
        return table[values]

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
    # The delta spent, as SQL: its column, or "0" when a file from before delta accounting
    # is only read (edge-agent budget), which must not migrate it.
    _delta_sql = "spent_delta"
    # Likewise the ledger time spending is known from: its column, or what a file from
    # before spending was kept for good implies (read only).
    _known_since_sql = "known_since"
    # And when a memo was first reported: a file from before memos were drawn ahead drew
    # each when its value was first reported.
    _reported_sql = "reported"

    def __init__(self, path: str | Path, *, max_messages: int = 200_000,
                 read_only: bool = False, monotonic: Callable[[], float] = boot_clock,
                 boot_id: Callable[[], str] = boot_id):
        """``monotonic`` and ``boot_id``: the clock that paces the ledger clock within a
        boot, and which boot this is (tests that simulate days pass their own)."""
        self.path = Path(path)
        self.max_messages = max_messages
        self.monotonic = monotonic
        self.boot_id = boot_id()
        # (window, bucket width) -> the ledger time up to which spending was coarsened.
        self._coarsened: dict[tuple[float, float], float] = {}
        # One connection per store; the agent loop is its only user, but keep a
        # lock so a stray thread cannot interleave transactions.
        self._lock = threading.RLock()
        if read_only:  # inspection (edge-agent budget) must not create or change state
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                       isolation_level=None, check_same_thread=False)
            self._spooled = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
            # A file from before delta accounting, not yet migrated: it spent no delta.
            if "spent_delta" not in self._columns("spending"):
                self._delta_sql = "0"
            if "known_since" not in self._columns("ledger_clock"):
                self._known_since_sql = _KNOWN_SINCE_OF_EARLIER_FILES
            if "reported" not in self._columns("memos"):
                self._reported_sql = "created"
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.executescript(_SCHEMA)
        columns = self._columns("spool")
        # State files from before range discovery, and before confirmations (their
        # spooled rows name no report: they leave on the broker's acknowledgement).
        for column, declaration in _SPOOL_COLUMNS.items():
            if column not in columns:
                self._db.execute(f"ALTER TABLE spool ADD COLUMN {column} {declaration}")
        # State files from before delta accounting: their spending keeps its epsilon.
        columns = self._columns("spending")
        for column, declaration in _SPENDING_COLUMNS.items():
            if column not in columns:
                self._db.execute(f"ALTER TABLE spending ADD COLUMN {column} {declaration}")
        if "reported" not in self._columns("memos"):  # each was drawn at its first report
            self._db.execute("ALTER TABLE memos ADD COLUMN reported REAL")
            self._db.execute("UPDATE memos SET reported = created")
        if "known_since" not in self._columns("ledger_clock"):
            self._db.execute("ALTER TABLE ledger_clock ADD COLUMN known_since REAL")
            self._db.execute(f"UPDATE ledger_clock SET known_since = "
                             f"{_KNOWN_SINCE_OF_EARLIER_FILES}")
        self._db.execute("CREATE INDEX IF NOT EXISTS spool_report ON spool (agent, channel, seq)")
        self._spooled = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
        self._migrate_ledger()

    def _columns(self, table: str) -> set[str]:
        return {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}

    def _migrate_ledger(self) -> None:
        """A ledger from before ledger time (spending per UTC-aligned period): what the
        last week's periods spent is charged now, in full (it stays counted for a whole
        period from now: more than it must, never less)."""
        if not self._db.execute("SELECT name FROM sqlite_master WHERE type='table' AND "
                                "name='ledger'").fetchone():
            return
        now = time.time()
        with self.transaction(now):
            self._db.execute(
                "INSERT INTO spending (agent, channel, until, spent_nano, reports) SELECT "
                "agent, channel, ?, SUM(spent_nano), SUM(reports) FROM ledger "
                "WHERE period_start > ? GROUP BY agent, channel",
                (now + 1.0, now - LEGACY_RETAIN))
            clock = self._advance(self._db, now)
            # It kept the last week: what lies before is not known.
            self._db.execute("UPDATE ledger_clock SET known_since = ? WHERE id = 0",
                             (clock.ledger_time - LEGACY_RETAIN,))
            self._keep(self._db, clock, Budget((Limit(0, LEGACY_RETAIN),)))
            self._db.execute("DROP TABLE ledger")

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

    # -- the ledger clock and spending ---------------------------------------------
    def _stored_clock(self, db: sqlite3.Connection) -> LedgerClock | None:
        row = db.execute(f"SELECT ledger_time, wall, wall_high, retain_seconds, boot_id, "
                         f"since_boot, {self._known_since_sql} FROM ledger_clock "
                         f"WHERE id = 0").fetchone()
        return LedgerClock(*row) if row else None

    def _paced_clock(self, db: sqlite3.Connection, now: float) -> LedgerClock:
        """The ledger clock at wall-clock ``now``, not yet persisted: it advances by the
        wall clock's advance since the last charge, at most the monotonic clock's within
        one boot; across a reboot (only the wall clock can tell) by the wall clock's
        advance past the latest time it ever showed."""
        since_boot = self.monotonic()
        stored = self._stored_clock(db)
        if stored is None:
            return LedgerClock(now, now, now, 0.0, self.boot_id, since_boot)
        if stored.boot_id == self.boot_id:
            advance = min(max(0.0, now - stored.wall), max(0.0, since_boot - stored.since_boot))
        else:  # from the latest time the wall clock showed: never more than really passed
            advance = max(0.0, now - stored.wall_high)
        return LedgerClock(stored.ledger_time + advance, now, max(stored.wall_high, now),
                           stored.retain_seconds, self.boot_id, since_boot, stored.known_since)

    def _advance(self, db: sqlite3.Connection, now: float) -> LedgerClock:
        clock = self._paced_clock(db, now)
        db.execute("INSERT INTO ledger_clock VALUES (0, ?, ?, ?, ?, ?, ?, NULL) ON CONFLICT (id) "
                   "DO UPDATE SET ledger_time = excluded.ledger_time, wall = excluded.wall, "
                   "wall_high = excluded.wall_high, boot_id = excluded.boot_id, "
                   "since_boot = excluded.since_boot",
                   (clock.ledger_time, clock.wall, clock.wall_high, clock.retain_seconds,
                    clock.boot_id, clock.since_boot))
        return clock

    def _keep(self, db: sqlite3.Connection, clock: LedgerClock, budget: Budget) -> None:
        """Keep every charge, for good, in buckets as coarse as the windows still counting
        it allow: what only longer windows of ``budget`` count in theirs (``_coarsen``);
        what none counts in hours, and after ``HOURLY_SECONDS`` in days.  Nothing is
        deleted: a window lengthened or added by a later configuration counts it all."""
        retain = max(clock.retain_seconds, budget.window_seconds)
        if retain > clock.retain_seconds:  # the longest period ever used (for the record)
            db.execute("UPDATE ledger_clock SET retain_seconds = ? WHERE id = 0", (retain,))
        for shorter, longer in zip(budget.limits, budget.limits[1:]):
            self._coarsen(db, clock.ledger_time, shorter.window_seconds,
                          bucket_width(longer.window_seconds))
        longest = budget.window_seconds
        self._coarsen(db, clock.ledger_time, longest, HOUR)
        self._coarsen(db, clock.ledger_time, max(longest, HOURLY_SECONDS), DAY)

    def _coarsen(self, db: sqlite3.Connection, ledger_time: float, window_seconds: float,
                 width: float) -> None:
        """Move spending that no window of ``window_seconds`` or shorter counts any more
        into buckets of ``width`` (the next longer window's), so that a day's spending
        under a ten-minute guarantee is not kept in one-second rows.

        A row's ``until`` only moves later (to its bucket's end), so it counts in every
        window it counted in before, and more: the ledger stays on the safe side.  Only
        rows with ``until`` at least ``width`` before the shorter window's start move, so
        none enters a window of ``window_seconds`` or shorter again.  Each transaction
        moves what passed that point since the previous one (this store's first: all)."""
        cut = ledger_time - window_seconds - width
        done = self._coarsened.get((window_seconds, width), -math.inf)
        if cut <= done:
            return
        self._coarsened[(window_seconds, width)] = cut
        rows = db.execute(
            "SELECT agent, channel, until, spent_nano, reports, spent_delta FROM spending "
            "WHERE until <= ? AND until > ?", (cut, done)).fetchall()
        for agent, channel, until, nano, reports, delta in rows:
            end = math.ceil(until / width) * width
            if end == until:
                continue
            db.execute("DELETE FROM spending WHERE agent = ? AND channel = ? AND until = ?",
                       (agent, channel, until))
            db.execute(
                "INSERT INTO spending (agent, channel, until, spent_nano, reports, spent_delta) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (agent, channel, until) DO UPDATE SET "
                "spent_nano = spent_nano + excluded.spent_nano, "
                "reports = reports + excluded.reports, "
                "spent_delta = spent_delta + excluded.spent_delta",
                (agent, channel, float(end), nano, reports, delta))

    def _spending(self, db: sqlite3.Connection, agent: str, window_seconds: float,
                  ledger_time: float) -> tuple[int, int]:
        """(nano-epsilon, delta units) ``agent`` spent in the window ending at
        ``ledger_time``."""
        row = db.execute(f"SELECT COALESCE(SUM(spent_nano), 0), "
                         f"COALESCE(SUM({self._delta_sql}), 0) FROM spending WHERE agent = ? "
                         f"AND until > ?", (agent, ledger_time - window_seconds)).fetchone()
        return int(row[0]), int(row[1])

    # -- reads -----------------------------------------------------------------------
    def clock(self, now: float | None = None) -> LedgerClock:
        """The ledger clock as a charge at ``now`` would see it (nothing is written)."""
        with self._lock:
            return self._paced_clock(self._db, time.time() if now is None else now)

    def spent(self, agent: str, window_seconds: float, now: float | None = None) -> int:
        """Epsilon ``agent`` has spent in the rolling window that ends at ``now`` (nano)."""
        return self._spent_in(agent, window_seconds, now)[0]

    def spent_delta(self, agent: str, window_seconds: float, now: float | None = None) -> int:
        """Delta ``agent`` has spent in the rolling window that ends at ``now``
        (``DELTA_UNIT``)."""
        return self._spent_in(agent, window_seconds, now)[1]

    def epsilon_room(self, agent: str, budget: Budget, now: float | None = None) -> int:
        """Nano-epsilon ``agent`` may still spend now under every limit of ``budget`` (none
        under one whose window reaches before the spending the file knows)."""
        clock = self.clock(now)
        return min(0 if clock.reaches_unknown(limit.window_seconds)
                   else limit.nano - self.spent(agent, limit.window_seconds, now)
                   for limit in budget.limits)

    def _spent_in(self, agent: str, window_seconds: float,
                  now: float | None) -> tuple[int, int]:
        with self._lock:
            ledger_time = self._paced_clock(self._db, time.time() if now is None else now) \
                .ledger_time
            return self._spending(self._db, agent, window_seconds, ledger_time)

    def memo_account(self, agent: str) -> dict[str, tuple[int, int]]:
        """Per channel of ``agent``: (values reported with their memos, nano-epsilon those
        memos reveal at most, for good; memos drawn but never reported reveal nothing).
        It depends on the readings (how many distinct values a wearer had): kept on the
        device (``edge-agent status``), never published."""
        with self._lock:
            try:
                rows = self._db.execute(
                    f"SELECT channel, COUNT(*), SUM(memo_nano) FROM memos WHERE agent = ? "
                    f"AND {self._reported_sql} IS NOT NULL GROUP BY channel ORDER BY channel",
                    (agent,)).fetchall()
            except sqlite3.OperationalError:  # read-only, from before memoization: none
                rows = []
        return {channel: (int(count), int(nano)) for channel, count, nano in rows}

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

    def budget_report(self, agent: str, window_seconds: float,
                      now: float | None = None) -> dict[str, tuple[int, int, int]]:
        """Per channel of ``agent``: (nano-epsilon, reports, delta units) in the rolling
        window ending at ``now`` (range-discovery answers under ``_range:<channel>``)."""
        with self._lock:
            ledger_time = self._paced_clock(self._db, time.time() if now is None else now) \
                .ledger_time
            rows = self._db.execute(
                f"SELECT channel, SUM(spent_nano), SUM(reports), SUM({self._delta_sql}) "
                f"FROM spending WHERE agent = ? AND until > ? GROUP BY channel "
                f"ORDER BY channel", (agent, ledger_time - window_seconds)).fetchall()
        return {channel: (int(nano), int(reports), int(delta))
                for channel, nano, reports, delta in rows}

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

    def pending(self, after_id: int, limit: int, lane: int = REPORTS,
                up_to: int | None = None) -> list[tuple[int, str, bytes, int]]:
        """Spooled messages of one lane with after_id < id (<= ``up_to``) not yet
        acknowledged by the broker, oldest first."""
        with self._lock:
            return self._db.execute(
                "SELECT id, topic, payload, qos FROM spool WHERE lane = ? AND id > ? "
                "AND id <= ? AND acked IS NULL ORDER BY id LIMIT ?",
                (lane, after_id, 2**63 - 1 if up_to is None else up_to, limit)).fetchall()

    def last_spooled(self) -> int:
        """The id of the latest message spooled (ids only grow: AUTOINCREMENT)."""
        with self._lock:
            return self._db.execute("SELECT COALESCE(MAX(id), 0) FROM spool").fetchone()[0]

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
