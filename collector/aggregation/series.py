"""A channel's aggregation series: blocks of statistics, cumulative and per window.

A *series* is one channel under one set of mechanism parameters.  When an agent
changes a channel's epsilon or domain its reports start a new series; series are never
mixed.  Each series keeps cumulative statistics and the most recent tumbling windows,
all mergeable (``merge``) and picklable.  One class per channel kind says which blocks
(``collector.aggregation.blocks``) it is made of and how their estimates make the
kind's document:

* linear: one linear block; circular: one circular block; categorical: one block of
  support counts;
* polar: the radius (linear), the angle (circular) and their mean vector;
* vector: one linear block per axis.

Windows come at several resolutions (``[aggregates] resolutions``): level 0 is the
finest (``window_seconds``) and each coarser level's window is a whole number of the
level before's (``coarser``), counted from the finest window's number, so that an hour's
sums are exactly the merge of its minutes'.  Every report's summary is added to the total
and to its window at every level, once.

Without a results store a series keeps the ``keep_windows`` most recent windows of each
level (a scale-out member, an offline replay).  With one (``recording``) it keeps the
windows still open: ``close`` hands every window whose end lies ``grace`` seconds in the
past to the store (``collector.results``) and forgets its sums, and a report arriving for
a window handed over already opens a *delta* window, which the store merges with what it
holds.  The finest level's recent estimates stay (``points``, at most ``keep_windows``)
for the live view.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import numpy as np

from collector.aggregation.blocks import (
    Block,
    CategoricalBlock,
    CircularBlock,
    CrossBlock,
    LinearBlock,
)
from collector.aggregation.stats import (
    StateError,
)
from collector.estimation.jsonsafe import json_safe
from collector.storage.states import (
    POINTS,
    SERIES_BLOCKS,
    SERIES_STATES,
    SUMMARIES,
    SeriesState,
    decode_window_sums,
)
from edge_agent.mechanisms import Mechanism
from edge_agent.mechanisms.categorical import LONGITUDINAL
from edge_agent.mechanisms.registry import VECTOR
from edge_agent.protocol import as_dict, kind_problem, mechanism_of

TOTAL = None  # what ``Series.stale`` calls the total, beside the windows' starts
# Without a store, the coarser levels' windows kept (the finest: ``keep_windows``): the open
# one and the two before, which a scale-out merge view writes once they close.
COARSE_KEPT = 3
# A key (as ``Series.stale`` names what to compute): TOTAL, a finest window's start, or
# (level, start) for a coarser level's window.
Key = int | tuple[int, int] | None


@dataclass(slots=True)
class ClosedWindow:
    """A window handed to the results store: its series, resolution (``span``, seconds) and
    start, its sums encoded as the store keeps them (``Series.blocks_state``) and their
    count, whether the store may hold earlier reports of it (``delta``), and its estimates
    where they are of these sums ((count, point), else None).

    Encoded once, when it closes: a batch can hold every window of every series (a quarter
    of a million at the default limits) until the store has it, and every checkpoint
    meanwhile keeps these bytes; the blocks, with the views an estimate leaves in them,
    are larger.  Once a checkpoint has them in the collector store (``Ingestor.saved``)
    ``sums`` is None and the recorder reads them from there: they were about 280 of the
    450 bytes of a closed one-report window (tracemalloc, docs/benchmarks/BENCHMARKS.md).
    Slots: about 50 bytes less a window than a ``__dict__``."""

    series: Series
    span: float
    start: int
    sums: bytes | None  # None: in the collector store (a checkpoint saved them)
    count: int
    delta: bool
    point: tuple[int, Any] | None = None

    @classmethod
    def of(cls, series: Series, span: float, start: int, blocks: dict, delta: bool,
           point: tuple[int, Any] | None = None) -> ClosedWindow:
        return cls(series, span, start, series.blocks_state(blocks), series._count(blocks),
                   delta, point)

    def blocks(self, sums: bytes | None = None) -> dict:
        """The sums as blocks (decoded: nothing keeps them), from ``sums`` where the
        collector store has them (``sums`` None here)."""
        sums = self.sums if sums is None else sums
        if sums is None:
            raise ValueError("the sums are in the collector store: pass them")
        return self.series.blocks_from(sums, f"closed window {self.span:g} s {self.start}")

    def check(self, sums: bytes, where: str) -> None:
        """``StateError`` unless ``sums`` are sums of this window's kind that count its
        values (as read back from the collector store)."""
        if self.series._count(self.series.blocks_from(sums, where)) != self.count:
            raise StateError(f"{where}: the sums do not count the window's {self.count} values")


def series_identity(channel: str, kind: str, description, fields: tuple | None,
                    strategy, unit: str | None) -> tuple:
    """What makes two reports belong to one aggregation series (hashable, cheap): the
    channel, its kind and the typed mechanism description, fields, strategy and unit
    (values in g and in m/s² are never averaged together)."""
    return (channel, kind, description, fields, strategy, unit)


class Series:
    """One channel under one mechanism: cumulative and windowed statistics.

    One subclass per channel kind (``SERIES_TYPES``, keyed like the protocol's
    ``KINDS``) says what the kind's blocks are, how a message's codes split among them,
    and how their views make the kind's document and history point; everything else
    (windows, merging, states, copies) is here, the same for every kind."""

    kind: ClassVar[str]
    BLOCK_STATES: ClassVar[type]  # the typed form of one set of blocks (states)

    def __init__(self, *, channel: str, description, bins: int = 50,
                 window_seconds: float = 60.0, keep_windows: int = 60,
                 fields: tuple[str, ...] | None = None, strategy=None,
                 unit: str | None = None, coarser: tuple[int, ...] = (),
                 recording: bool = False):
        """``description``: the typed mechanism description its reports carry
        (``edge_agent.protocol``); ``fields`` and ``strategy``: a vector channel's;
        ``unit``: the reports' (``Report.unit``); ``coarser``: each coarser level as a
        multiple of the one before; ``recording``: its closed windows go to a results
        store (``close``)."""
        self.channel = channel
        self.description = description
        self.bins, self.window_seconds, self.keep_windows = bins, window_seconds, keep_windows
        self.fields, self.strategy, self.unit = fields, strategy, unit
        self.coarser, self.recording = tuple(coarser), recording
        self.factors = tuple(math.prod(self.coarser[:level])
                             for level in range(len(self.coarser) + 1))
        self.messages = 0
        self.agents: set[str] = set()
        self.total = self._new_blocks()
        # Each level's windows by start; level 0 (the finest) is also ``windows``.
        self.levels: list[dict[int, dict]] = [{} for _ in self.factors]
        self.windows: dict[int, dict] = self.levels[0]
        # Recording: per level, the first start not yet handed to the store (every window
        # before it was, so a window before it opened since holds only late reports).
        self.sealed: dict[int, int] = {}
        self.overfull = False  # recording: a level holds more than keep_windows windows
        self.opened = 0  # recording: windows opened since the last ``close``
        # What the sums gave, kept until they count more (saved with them): the total's
        # estimates, and each window's history point, each with the count it is of.
        self.summary: tuple[int, dict] | None = None
        self.points: dict[int, tuple[int, Any]] = {}  # start -> (count, POINTS[kind])
        self.coarse_points: dict[tuple[int, int], tuple[int, Any]] = {}  # (level, start) ->
        # The newest finest window when each coarser window's estimates were last kept: an
        # open hour is estimated again at most once per finest window, not at every push.
        self._coarse_at: dict[tuple[int, int], int | None] = {}
        # What changed since it was computed (TOTAL, window starts): what to compute costs
        # what changed, not what the history holds.
        self.changed: set[int | None] = set()
        self._starts: list[int] | None = None  # a detached copy's: every window's start
        self._level_starts: list[list[int]] | None = None  # the same, per level
        self._total_count: int | None = None  # a detached copy's, without the total's sums

    @property
    def mechanism(self) -> Mechanism:
        return mechanism_of(self.description)

    @property
    def identity(self) -> tuple:
        return series_identity(self.channel, self.kind, self.description, self.fields,
                               self.strategy, self.unit)

    # -- what each kind says ---------------------------------------------------------------
    def _new_blocks(self) -> dict[str, Block]:
        """An empty set of the kind's blocks, by name."""
        raise NotImplementedError

    def _split(self, codes) -> dict[str, Any]:
        """One message's codes (as ``ValidReport.codes``) per block."""
        raise NotImplementedError

    def _join(self, group: list):
        """Codes of several messages as one message's."""
        raise NotImplementedError

    def values_in(self, codes) -> int:
        """How many values one message's codes hold."""
        raise NotImplementedError

    def _count(self, blocks: dict) -> int:
        """How many values a set of blocks counted."""
        raise NotImplementedError

    def _view(self, blocks: dict) -> dict:
        """A set of blocks' estimates, as the kind's document has them."""
        raise NotImplementedError

    def units(self) -> dict:
        """``unit``: the values' unit (``Report.unit``)."""
        return {"unit": self.unit}

    def domain(self) -> tuple[float, float] | None:
        """The [low, high] its reports are declared over, where that is one interval of
        readings (linear series: what range discovery searches)."""
        return None

    @staticmethod
    def history_point(window: dict) -> dict:
        """One window of the kind's document reduced to what a chart over time draws:
        its span, count and estimates with their intervals (no histograms)."""
        return {"start": window["start"], "end": window["end"], "count": window["count"]}

    @staticmethod
    def history_header(detail: dict) -> dict:
        """What the kind's history document carries besides its points."""
        return {}

    # -- updates ------------------------------------------------------------------------------
    def update(self, *, agent: str, t: float, codes) -> int:
        """Add one message's codes (already validated); returns the number of values."""
        self.update_many([(agent, t, codes)])
        return self.values_in(codes)

    def update_many(self, messages: list[tuple[str, float, Any]]) -> None:
        """Add several messages' (agent, t, codes) at once.

        Every statistic is a sum, so one summary of the messages' codes joined
        per window equals the messages one by one (integer sums exactly, float
        sums up to rounding order) at one numpy call per statistic and window
        instead of one per message.  The summary is added to the total and to the
        window of every level."""
        by_window: dict[int, list] = {}
        for agent, t, codes in messages:
            by_window.setdefault(int(math.floor(t / self.window_seconds)), []).append(codes)
            self.agents.add(agent)
        self.messages += len(messages)
        self.changed.add(TOTAL)
        for start, group in by_window.items():
            codes = group[0] if len(group) == 1 else self._join(group)
            windows = [self._window_at(level, start // factor)
                       for level, factor in enumerate(self.factors)]
            for name, array in self._split(codes).items():
                summary = self.total[name].summarize(array)
                self.total[name].apply(summary)
                for window in windows:
                    if window is not None:
                        window[name].apply(summary)

    def _window_at(self, level: int, start: int) -> dict | None:
        """The level's window (made if new), marked changed; None where it is older than
        every window a series without a store keeps (it counts in the total alone)."""
        windows = self.levels[level]
        window = windows.get(start)
        if window is None:
            window = windows[start] = self._new_blocks()
            self.opened += self.recording
            self._forget_old_windows(level)
            if start not in windows:
                return None
        self.changed.add(start if level == 0 else (level, start))
        return window

    def _forget_old_windows(self, level: int | None = None) -> None:
        """Without a store: the ``keep_windows`` newest windows of the finest level and the
        ``COARSE_KEPT`` newest of the others.  Recording:
        every window stays until ``close`` hands it over; ``overfull`` says one should."""
        for number in range(len(self.levels)) if level is None else (level,):
            windows = self.levels[number]
            if self.recording:
                self.overfull |= len(windows) > self.keep_windows
                continue
            while len(windows) > (self.keep_windows if number == 0
                                  else min(self.keep_windows, COARSE_KEPT)):
                oldest = min(windows)
                del windows[oldest]
                if number == 0:
                    self.points.pop(oldest, None)
                    self.changed.discard(oldest)
                else:
                    self.coarse_points.pop((number, oldest), None)
                    self._coarse_at.pop((number, oldest), None)
                    self.changed.discard((number, oldest))

    def close(self, now: float, grace: float) -> list[ClosedWindow]:
        """Recording: hand over every window that ended ``grace`` seconds or more before
        ``now`` (forgetting its sums), at every level, with its estimates where they are
        of its sums.  A finest window's estimates stay among the recent ``points``."""
        closed = []
        finest = math.floor((now - grace) / self.window_seconds)
        for level, windows in enumerate(self.levels):
            limit = finest // self.factors[level]
            before = self.sealed.get(level)
            due = [start for start in windows if start < limit]
            due.sort()
            for start in due:
                blocks = windows.pop(start)
                key = start if level == 0 else (level, start)
                delta = before is not None and start < before
                point = self._done(key).get(key)
                # A delta's estimates would be of its late reports alone.
                if delta or point is None or key in self.changed \
                        or point[0] != self._count(blocks):
                    point = None
                if level:  # the store serves closed coarser windows
                    self.coarse_points.pop(key, None)
                    self._coarse_at.pop(key, None)
                elif point is None and not delta:  # estimates of fewer reports
                    self.points.pop(key, None)
                self.changed.discard(key)
                closed.append(ClosedWindow.of(self, self.span(level), start, blocks, delta, point))
            self.sealed[level] = limit if before is None else max(before, limit)
        self.overfull = any(len(windows) > self.keep_windows for windows in self.levels)
        self.opened = 0
        return closed

    def is_delta(self, level: int, start: int) -> bool:
        """Whether the level's window ``start`` opened after it was handed to the store
        (its sums are of late reports alone)."""
        sealed = self.sealed.get(level)
        return sealed is not None and start < sealed

    def recorded(self, window: ClosedWindow, point: tuple[int, Any]) -> None:
        """The store holds ``window`` now, estimated as ``point``: a finest window's
        estimates join the recent ``points`` (where it is recent and not open again)."""
        if window.span == self.window_seconds and window.start not in self.windows:
            self.points[window.start] = point
            self._trim_points()

    def _trim_points(self) -> None:
        """The ``keep_windows`` newest closed finest windows' estimates (and the open ones')."""
        if len(self.points) <= self.keep_windows:
            return
        for start in sorted(self.points)[:-self.keep_windows]:
            if start not in self.windows:
                del self.points[start]

    def relevel(self, coarser: tuple[int, ...], keep_windows: int) -> int:
        """Take other coarser resolutions (and ``keep_windows``), the finest staying: a
        resolution kept keeps its windows, a new one starts empty; how many windows of the
        resolutions no longer wanted were dropped."""
        spans = {self.span(level): level for level in range(len(self.levels))}
        old_levels, old_sealed = self.levels, self.sealed
        old_points, old_changed = self.coarse_points, self.changed
        self.coarser = tuple(coarser)
        self.factors = tuple(math.prod(self.coarser[:level])
                             for level in range(len(self.coarser) + 1))
        moved = {}  # old level -> new level
        for level in range(len(self.factors)):
            if self.span(level) in spans:
                moved[spans[self.span(level)]] = level
        self.levels = [{} for _ in self.factors]
        for old, new in moved.items():
            self.levels[new] = old_levels[old]
        self.windows = self.levels[0]
        self.sealed = {moved[level]: start for level, start in old_sealed.items()
                       if level in moved}
        self.coarse_points = {(moved[level], start): point
                              for (level, start), point in old_points.items() if level in moved}
        self._coarse_at = {}
        self.changed = {key for key in old_changed if not isinstance(key, tuple)}
        self.changed |= {(moved[key[0]], key[1]) for key in old_changed
                         if isinstance(key, tuple) and key[0] in moved}
        self.keep_windows = keep_windows
        self._forget_old_windows()
        return sum(len(windows) for level, windows in enumerate(old_levels)
                   if level not in moved)

    def merge(self, other: Series) -> Series:
        if other.identity != self.identity:
            raise ValueError("cannot merge different series")
        if other.factors != self.factors:
            raise ValueError("cannot merge series of different resolutions")
        for name, block in self.total.items():
            block.merge(other.total[name])
        for level, windows in enumerate(other.levels):
            mine = self.levels[level]
            for start, blocks in windows.items():
                into = mine.get(start)
                if into is None:
                    mine[start] = into = self._new_blocks()
                for name, block in into.items():
                    block.merge(blocks[name])
                self.changed.add(start if level == 0 else (level, start))
        self.changed.add(TOTAL)
        for level, start in other.sealed.items():
            self.sealed[level] = max(start, self.sealed.get(level, start))
        self._forget_old_windows()
        self.messages += other.messages
        self.agents |= other.agents
        return self

    def copy(self) -> Series:
        """A detached copy of the sums and of what they gave so far."""
        return self.detach(None)

    # -- what the sums give, computed once --------------------------------------------------
    @property
    def starts(self) -> list[int]:
        """The finest windows' starts, oldest first: the open ones and, recording, those
        whose recent estimates are kept (a detached copy holds the sums of only some)."""
        if self._starts is not None:
            return self._starts
        return sorted(self.windows.keys() | self.points.keys())

    def level_starts(self, level: int) -> list[int]:
        """The level's open windows' starts, oldest first."""
        if self._level_starts is not None:
            return self._level_starts[level]
        return sorted(self.levels[level])

    def span(self, level: int) -> float:
        """A window's length at ``level``, in seconds."""
        return self.window_seconds * self.factors[level]

    def _blocks_of(self, key: Key) -> dict:
        return self.windows[key] if isinstance(key, int) else self.levels[key[0]][key[1]]

    def window_count(self, key: Key) -> int:
        return self._count(self._blocks_of(key))

    def _has(self, key: Key) -> bool:
        return key in self.windows if isinstance(key, int) else key[1] in self.levels[key[0]]

    def _done(self, key: Key) -> dict:
        """Where the window's estimates are kept."""
        return self.points if isinstance(key, int) else self.coarse_points

    def current(self, key: Key) -> bool:
        """Whether the total's estimates (``TOTAL``) or the window's point are of its sums
        (a detached copy: they were, or were computed since)."""
        computed = self.summary is not None if key is TOTAL else key in self._done(key)
        return computed and key not in self.changed

    def entry(self) -> dict:
        """The channel's entry (docs/reference/API.md): what the series is, and its total's
        estimates (nulls before any were computed), ``state`` "computing" while they are of
        fewer values than its sums hold, else "ready"."""
        view = self._view(self._new_blocks()) if self.summary is None else self.summary[1]
        state = "ready" if self.current(TOTAL) else "computing"
        out = {"kind": self.kind, "mechanism": as_dict(self.description), "count": self.count(),
               "messages": self.messages, "agents": len(self.agents), **self.units(), **view}
        out.update(self._extra_entry())
        out["state"] = state
        return out

    def _extra_entry(self) -> dict:
        return {}

    def stale(self) -> list[Key]:
        """What to compute: ``TOTAL`` and the start of each window whose sums changed since
        they were computed (or were never computed), the total first, then the newest
        finest window first, then the coarser levels' (``(level, start)``).  Costs what
        changed (``changed``), not what the series holds.  A delta window (of late reports
        alone, ``is_delta``) is estimated by the store, with what it holds.

        An open coarser window that was estimated already waits, while finest windows
        change, for the next finest window to begin: a steady stream re-estimates the open
        hour once a minute, not at every push, and it catches up once the stream pauses."""
        keys: list[Key] = [TOTAL] if TOTAL in self.changed else []
        finest = [key for key in self.changed if isinstance(key, int)
                  and not self.is_delta(0, key)]
        newest = max(self.windows, default=None)
        coarse = [key for key in self.changed if isinstance(key, tuple)
                  and not self.is_delta(*key)
                  and (not finest or key not in self.coarse_points
                       or self._coarse_at.get(key) != newest)]
        return keys + sorted(finest, reverse=True) + sorted(coarse, reverse=True)

    def detach(self, keys: list[int | None] | None) -> Series:
        """A copy to compute from outside the collector's lock: the sums of the total and
        windows in ``keys`` (everything: None), what was computed so far, the windows
        there are and the count.  Taking it costs what
        ``keys`` hold, not what the series holds."""
        twin = copy.copy(self)
        twin.agents = set(self.agents)
        if keys is None or TOTAL in keys:
            twin.total = _copy_blocks(self.total)
        else:
            twin.total, twin._total_count = None, self.count()
        if keys is None:
            wanted = [(level, start) for level, windows in enumerate(self.levels)
                      for start in windows]
        else:
            wanted = [(0, key) if isinstance(key, int) else key
                      for key in keys if key is not TOTAL]
        twin.levels = [{} for _ in self.levels]
        for level, start in wanted:
            twin.levels[level][start] = _copy_blocks(self.levels[level][start])
        twin.windows = twin.levels[0]
        twin._starts = self.starts
        twin._level_starts = [self.level_starts(level) for level in range(len(self.levels))]
        twin.points = dict(self.points)
        twin.coarse_points = dict(self.coarse_points)
        twin.sealed = dict(self.sealed)
        twin.changed = set(self.changed)
        return twin

    def compute(self, key: Key) -> None:
        """Compute the total's estimates (``TOTAL``) or a window's point from the sums."""
        if key is TOTAL:
            self.summary = (self.count(), self._view(self.total))
        else:
            level, start = (0, key) if isinstance(key, int) else key
            self._done(key)[key] = self.estimate(self.levels[level][start], self.span(level),
                                                 start)
        self.changed.discard(key)

    def estimate(self, blocks: dict, span: float, start: int) -> tuple[int, Any]:
        """(count, point): the estimates of one window's sums (``blocks``) of ``span``
        seconds, numbered ``start``."""
        view = self._span_view(blocks, span, start)
        point = self.history_point(view)
        point["too_few"] = self.too_few(view)
        return view["count"], msgspec.convert(json_safe(point), POINTS[self.kind])

    def keep(self, computed: Series, keys: list[Key]) -> None:
        """Take what ``computed`` (a detached copy) computed for ``keys``, where these sums
        have not counted more since."""
        for key in keys:
            theirs = computed.summary if key is TOTAL else computed._done(key).get(key)
            if theirs is not None:
                self.keep_result(key, theirs)

    def keep_result(self, key: Key, result: tuple[int, Any]) -> None:
        """Take ``result`` ((count, estimates), as ``estimated`` gives it: computed
        elsewhere, a worker process's) for ``key``, where these sums count what it is of."""
        if key is TOTAL:
            if result[0] == self.count():
                self.summary = result
                self.changed.discard(TOTAL)
            return
        if not self._has(key):
            return
        if result[0] == self.window_count(key):
            self._done(key)[key] = result
            self.changed.discard(key)
        if isinstance(key, tuple):  # an open coarser window's, as of now (stale())
            self.coarse_points[key] = result
            self._coarse_at[key] = max(self.windows, default=None)

    def bare(self, key: Key) -> Series:
        """A copy holding the sums of ``key``'s window alone and nothing computed: what a
        worker process needs to estimate it (``estimated``), small to send."""
        twin = self.detach([key])
        twin.agents, twin.summary, twin.sealed = set(), None, {}
        twin.points, twin.coarse_points, twin._coarse_at = {}, {}, {}
        twin._starts = twin._level_starts = None
        twin.changed = {key}
        return twin

    def estimated(self, key: Key) -> tuple[int, Any]:
        """Compute ``key``'s estimates and give them as ``keep_result`` takes them."""
        self.compute(key)
        return self.summary if key is TOTAL else self._done(key)[key]

    def adopt(self, earlier: Series) -> None:
        """Take what ``earlier`` (the same series, e.g. merged from partitions before they
        changed) computed, where these sums count the same."""
        if earlier.identity == self.identity:
            self.keep(earlier, [TOTAL, *earlier.points, *earlier.coarse_points])

    def __eq__(self, other):
        return (isinstance(other, Series) and other.identity == self.identity
                and other.messages == self.messages and other.agents == self.agents
                and other.total == self.total and other.levels == self.levels)

    # -- saved and exchanged state (collector.storage.states) ------------------------------
    def _blocks_state(self, blocks: dict):
        return self.BLOCK_STATES(**{name: block.to_state() for name, block in blocks.items()})

    def to_state(self, *, computed: bool = True) -> SeriesState:
        """Identity, counters and every block's sums, typed; with ``computed``, what they
        gave (``summary`` and ``points``)."""
        summary, points = None, []
        if computed:
            points = [(start, count, point)
                      for start, (count, point) in sorted(self.points.items())]
        if computed and self.summary is not None:
            summary = (self.summary[0], msgspec.convert(self.summary[1], SUMMARIES[self.kind]))
        coarse_points = []
        if computed:
            coarse_points = [(level, start, count, point) for (level, start), (count, point)
                             in sorted(self.coarse_points.items())]
        return SERIES_STATES[self.kind](
            channel=self.channel, mechanism=self.description, fields=self.fields,
            strategy=self.strategy, unit=self.unit, messages=self.messages,
            agents=sorted(self.agents), total=self._blocks_state(self.total),
            windows=[(start, self._blocks_state(of)) for start, of in sorted(self.windows.items())],
            summary=summary, points=points,
            coarse=[(level, start, self._blocks_state(of))
                    for level, windows in enumerate(self.levels[1:], 1)
                    for start, of in sorted(windows.items())],
            coarse_points=coarse_points, sealed=sorted(self.sealed.items()))

    def blocks_state(self, blocks: dict) -> bytes:
        """A window's sums as JSON (what the results store keeps)."""
        return msgspec.json.encode(self._blocks_state(blocks))

    def blocks_from(self, payload: bytes, where: str = "blocks") -> dict:
        """A window's sums from ``blocks_state`` (``StateError`` if they are not the kind's
        or not sums these reports could have given)."""
        try:
            state = decode_window_sums(self.kind, payload)
        except msgspec.DecodeError as exc:
            raise StateError(f"{where}: {exc}") from None
        blocks = self._new_blocks()
        self._load_blocks(blocks, state, where)
        return blocks

    @staticmethod
    def from_state(state: SeriesState | dict, *, bins: int, window_seconds: float,
                   keep_windows: int, coarser: tuple[int, ...] = (),
                   recording: bool = False, where: str = "series") -> Series:
        """A series from ``to_state()`` (typed, or as plain JSON values, which are checked
        here); ``StateError`` if it is not one these reports could have given."""
        if not isinstance(state, SeriesState.__args__):
            try:
                state = msgspec.convert(state, SeriesState)
            except msgspec.ValidationError as exc:
                raise StateError(f"{where}: {exc}") from None
        kind = state.__struct_config__.tag
        try:
            mechanism = mechanism_of(state.mechanism)
        except (TypeError, ValueError) as exc:
            raise StateError(f"{where}.mechanism: invalid mechanism: {exc}") from None
        problem = kind_problem(kind, mechanism, state.fields, state.strategy)
        if problem is not None:
            raise StateError(f"{where}: {problem[1]}")
        series = SERIES_TYPES[kind](
            channel=state.channel, description=state.mechanism, bins=bins,
            window_seconds=window_seconds, keep_windows=keep_windows, fields=state.fields,
            strategy=state.strategy, unit=state.unit, coarser=coarser, recording=recording)
        series.messages = state.messages
        series.agents = set(state.agents)
        series._load_blocks(series.total, state.total, f"{where}.total")
        # A recording series holds its open windows, which a late report's may join between
        # closes; one without a store keeps keep_windows per level.
        most = keep_windows if not recording else 2 * keep_windows + 8
        windows = [(0, start, blocks) for start, blocks in state.windows] + list(state.coarse)
        if len(state.windows) > most or len(state.points) > keep_windows:
            raise StateError(f"{where}.windows: expected at most {most} windows")
        for i, (level, start, blocks) in enumerate(windows):
            within = f"{where}.windows[{i}]" if level == 0 else \
                f"{where}.coarse[{i - len(state.windows)}]"
            if level >= len(series.levels):
                raise StateError(f"{within}: level {level} beyond the {len(series.levels)} "
                                 f"resolutions")
            if abs(start) > 2**1024 or start in series.levels[level]:
                raise StateError(f"{within}: start must be a new integer")
            if len(series.levels[level]) >= most:
                raise StateError(f"{within}: expected at most {most} windows a level")
            series.levels[level][start] = series._new_blocks()
            series._load_blocks(series.levels[level][start], blocks, within)
        for level, start in state.sealed:
            if level < len(series.levels):
                series.sealed[level] = start
        # What the sums gave, where it is of these sums (an estimate of other counts is
        # computed again, and one of a window not kept is dropped); recording, a closed
        # window's recent estimates stay.
        if state.summary is not None and state.summary[0] == series.count():
            series.summary = (state.summary[0], msgspec.to_builtins(state.summary[1]))
        for start, count, point in state.points:
            if count == (series.window_count(start) if start in series.windows else count) \
                    and (start in series.windows or recording):
                series.points[start] = (count, point)
        for level, start, count, point in state.coarse_points:
            key = (level, start)
            if level < len(series.levels) and series._has(key) \
                    and count == series.window_count(key):
                series.coarse_points[key] = (count, point)
        series.changed = {TOTAL} if series.summary is None else set()
        series.changed |= {start for start in series.windows if start not in series.points}
        series.changed |= {(level, start) for level, windows in enumerate(series.levels)
                           if level for start in windows
                           if (level, start) not in series.coarse_points}
        series._forget_old_windows()
        return series

    def _load_blocks(self, blocks: dict, state, where: str) -> None:
        for name, block in blocks.items():
            block.load_state(getattr(state, name), f"{where}.{name}")

    # -- the API view -----------------------------------------------------------------------
    def count(self) -> int:
        return self._total_count if self.total is None else self._count(self.total)

    def get(self, *, windows: bool = False) -> dict:
        out = {"kind": self.kind, "mechanism": as_dict(self.description), "count": self.count(),
               "messages": self.messages, "agents": len(self.agents), **self.units()}
        out.update(self._view(self.total))
        if windows:
            out["windows"] = [self.window_view(start) for start in sorted(self.windows)]
        return out

    def window_view(self, start: int, level: int = 0, blocks: dict | None = None) -> dict:
        """The level's window numbered ``start`` (its span in seconds, count and
        statistics), of ``blocks`` (default: the window's own)."""
        blocks = self.levels[level][start] if blocks is None else blocks
        return self._span_view(blocks, self.span(level), start)

    def _span_view(self, blocks: dict, span: float, start: int) -> dict:
        return {"start": start * span, "end": (start + 1) * span,
                "count": self._count(blocks), **self._view(blocks)}

    def too_few(self, view: dict) -> bool:
        """Whether a window's estimates (``window_view``) are too uncertain to be read as a
        measurement: some 95% interval spans more than ``TOO_FEW_SHARE`` of what the value
        can be (the domain's width, half the circle, a share's [0, 1]), or is missing."""
        return any(width is None or width > TOO_FEW_SHARE
                   for width in self._interval_shares(view))

    def _interval_shares(self, view: dict) -> list[float | None]:
        """Each primary estimate's 95% interval as a share of what the value can span."""
        raise NotImplementedError


# A window whose interval spans more than this share of the domain has too few reports to
# be read as a measurement (the dashboard marks it, the CSV says so).
TOO_FEW_SHARE = 0.5


def _linear_share(view: dict, low: float, high: float) -> float | None:
    interval = (view.get("mean") or {}).get("ci95")
    return None if interval is None else (interval[1] - interval[0]) / (high - low)


def _unit_share(interval) -> float | None:
    """An interval of a value in [0, 1] (a share, a resultant length), as its width."""
    return None if interval is None else interval[1] - interval[0]


def _circular_share(view: dict) -> float | None:
    """An angle's information is its resultant length's: its interval, of [0, 1].  (The
    direction's interval is missing wherever the directions are spread evenly, however
    many reports there are.)"""
    return _unit_share((view.get("resultant_length") or {}).get("ci95"))


def _copy_blocks(blocks: dict) -> dict:
    return {name: block.copy() for name, block in blocks.items()}


def _without_count(view: dict) -> dict:
    view = dict(view)
    view.pop("count", None)
    return view


def _mean_point(view: dict) -> dict:
    mean = view.get("mean") or {}
    return {"mean": {key: mean.get(key) for key in ("estimate", "stderr", "ci95")}}


def _direction_point(view: dict) -> dict:
    direction = view.get("direction") or {}
    return {"circular_mean": view.get("circular_mean"),
            "half_width": direction.get("half_width"), "ci95": direction.get("ci95"),
            "resultant_length": (view.get("resultant_length") or {}).get("estimate")}


def _angle_unit(period: float) -> str | None:
    """An angle's unit is its mechanism's period: 360 degrees, 2 pi radians (any other
    period a sender may choose: null)."""
    return {360.0: "deg", 2.0 * math.pi: "rad"}.get(period)


class _OneBlockSeries(Series):
    """A kind whose reports feed one block, ``value``."""

    BLOCK: ClassVar[type[Block]]

    def _new_blocks(self) -> dict[str, Block]:
        return {"value": self.BLOCK(self.description, self.bins)}

    def _split(self, codes) -> dict[str, Any]:
        return {"value": codes}

    def _join(self, group: list):
        return np.concatenate(group)

    def values_in(self, codes) -> int:
        return int(np.size(codes))

    def _count(self, blocks: dict) -> int:
        return blocks["value"].count.get()

    def _view(self, blocks: dict) -> dict:
        return _without_count(blocks["value"].get())


class LinearSeries(_OneBlockSeries):
    """A linear channel: the raw and reconstructed histograms and the mean, chosen by
    estimated error, with an interval (``collector.estimation.estimators``)."""

    kind = "linear"
    BLOCK = LinearBlock
    BLOCK_STATES = SERIES_BLOCKS["linear"]

    def domain(self) -> tuple[float, float]:
        return self.mechanism.low, self.mechanism.high

    @staticmethod
    def history_point(window: dict) -> dict:
        return {**Series.history_point(window), **_mean_point(window)}

    def _interval_shares(self, view: dict) -> list[float | None]:
        return [_linear_share(view, *self.domain())]


class CircularSeries(_OneBlockSeries):
    """A circular channel: mean direction and resultant length with their intervals
    (``collector.estimation.circular``), circular standard deviation, histograms
    (wrapping)."""

    kind = "circular"
    BLOCK = CircularBlock
    BLOCK_STATES = SERIES_BLOCKS["circular"]

    def units(self) -> dict:
        """A circular channel's unit is its angle's, its mechanism's period."""
        return {"unit": _angle_unit(self.mechanism.period)}

    @staticmethod
    def history_point(window: dict) -> dict:
        return {**Series.history_point(window), **_direction_point(window)}

    def _interval_shares(self, view: dict) -> list[float | None]:
        return [_circular_share(view)]


class CategoricalSeries(_OneBlockSeries):
    """A categorical channel: how many reports support each category, turned into
    unbiased shares with standard errors and 95% intervals, and consistent shares
    (``collector.estimation.frequencies``).

    A memoized channel's total (an oracle of ``LONGITUDINAL``) also counts them per agent:
    an agent's reports share a memo, so the total's intervals take each agent's reports
    together (cluster-robust).  Its windows do not (they would hold a row per agent each)."""

    kind = "categorical"
    BLOCK = CategoricalBlock
    BLOCK_STATES = SERIES_BLOCKS["categorical"]

    def __init__(self, **settings):
        super().__init__(**settings)
        if self.mechanism.name in LONGITUDINAL:
            self.total["value"].keep_reports_per_agent()

    def update_many(self, messages: list[tuple[str, float, Any]]) -> None:
        super().update_many(messages)
        total = self.total["value"]
        if total.agents is not None and messages:
            group = [codes for _, _, codes in messages]
            agents = np.repeat(np.array([agent for agent, _, _ in messages]),
                               [self.values_in(codes) for codes in group])
            total.count_per_agent((agents, group[0] if len(group) == 1 else self._join(group)))

    def _load_blocks(self, blocks: dict, state, where: str) -> None:
        super()._load_blocks(blocks, state, where)
        per_agent = blocks["value"].agents
        if per_agent is not None and not per_agent.agents() <= self.agents:
            raise StateError(f"{where}.value.agents: reports of an agent the series does "
                             f"not list")

    def _join(self, group: list):
        if not isinstance(group[0], tuple):  # grr: the reported categories
            return np.concatenate(group)
        # Per part of an oracle's reports (olh and unary: pairs).
        return tuple(np.concatenate(part) for part in zip(*group))

    def values_in(self, codes) -> int:
        return len(codes[0]) if isinstance(codes, tuple) else len(codes)

    @staticmethod
    def history_point(window: dict) -> dict:
        frequencies = window.get("frequencies") or {}
        return {**Series.history_point(window),
                "frequencies": {key: frequencies.get(key)
                                for key in ("shares", "estimate", "ci95")}}

    @staticmethod
    def history_header(detail: dict) -> dict:
        return {"labels": (detail.get("frequencies") or {}).get("labels")}

    def _interval_shares(self, view: dict) -> list[float | None]:
        return [_unit_share(interval)
                for interval in (view.get("frequencies") or {}).get("ci95") or [None]]


class PolarSeries(Series):
    """A polar channel: the radius as a linear block, the angle as a circular one, and
    their mean vector."""

    kind = "polar"
    BLOCK_STATES = SERIES_BLOCKS["polar"]

    def _new_blocks(self) -> dict[str, Block]:
        return {"radius": LinearBlock(self.description, self.bins, component=0),
                "angle": CircularBlock(self.description, self.bins, component=1),
                "cross": CrossBlock(self.description)}

    def _split(self, codes) -> dict[str, Any]:
        return {"radius": codes[0], "angle": codes[1], "cross": codes}

    def _join(self, group: list):
        return [np.concatenate(part) for part in zip(*group)]

    def values_in(self, codes) -> int:
        return int(np.size(codes[0]))

    def _count(self, blocks: dict) -> int:
        return blocks["radius"].count.get()

    def _view(self, blocks: dict) -> dict:
        return {"radius": _without_count(blocks["radius"].get()),
                "angle": _without_count(blocks["angle"].get()),
                "mean_vector": blocks["cross"].mean_vector(blocks["angle"])}

    def units(self) -> dict:
        """A polar channel's ``unit`` is its radius's and ``angle_unit`` its angle's."""
        return {"unit": self.unit,
                "angle_unit": _angle_unit(self.mechanism.components[1].period)}

    @staticmethod
    def history_point(window: dict) -> dict:
        return {**Series.history_point(window), "radius": _mean_point(window["radius"]),
                "angle": _direction_point(window["angle"])}

    def _interval_shares(self, view: dict) -> list[float | None]:
        radius = self.mechanism.components[0]
        return [_linear_share(view["radius"], radius.low, radius.high),
                _circular_share(view["angle"])]


class VectorSeries(Series):
    """A vector channel: one linear block per axis (field).  A mechanism of whole
    vectors (duchi-vector, sampled-duchi) has the scalar distribution each axis' codes
    follow as its one component (``AxisMarginal``): every axis' block is of that."""

    kind = "vector"
    BLOCK_STATES = dict  # VectorBlocks: a block per field, by name

    def _new_blocks(self) -> dict[str, Block]:
        component = 0 if self.mechanism.name in VECTOR else None
        return {field: LinearBlock(self.description, self.bins, component=component)
                for field in self.fields}

    def _split(self, codes) -> dict[str, Any]:
        return dict(zip(self.fields, codes))

    def _join(self, group: list):
        return [np.concatenate(part) for part in zip(*group)]

    def values_in(self, codes) -> int:
        return int(sum(np.size(c) for c in codes))

    def _count(self, blocks: dict) -> int:
        return sum(block.count.get() for block in blocks.values())

    def _view(self, blocks: dict) -> dict:
        return {"axes": {field: blocks[field].get() for field in self.fields}}

    def get(self, *, windows: bool = False) -> dict:
        out = super().get(windows=windows)
        out["strategy"] = as_dict(self.strategy)
        return out

    def _extra_entry(self) -> dict:
        return {"strategy": as_dict(self.strategy)}

    def _load_blocks(self, blocks: dict, state, where: str) -> None:
        if set(state) != set(blocks):  # the axes
            raise StateError(f"{where}: expected the blocks {list(blocks)}")
        for name, block in blocks.items():
            block.load_state(state[name], f"{where}.{name}")

    @staticmethod
    def history_point(window: dict) -> dict:
        return {**Series.history_point(window),
                "axes": {axis: {"count": view["count"], **_mean_point(view)}
                         for axis, view in window["axes"].items()}}

    @staticmethod
    def history_header(detail: dict) -> dict:
        return {"fields": list(detail.get("axes") or {})}

    def _interval_shares(self, view: dict) -> list[float | None]:
        low, high = self._axis_domain()
        return [_linear_share(axis, low, high) for axis in view["axes"].values()]

    def _axis_domain(self) -> tuple[float, float]:
        block = next(iter(self._new_blocks().values()))
        return block.mechanism.low, block.mechanism.high


SERIES_TYPES: dict[str, type[Series]] = {
    cls.kind: cls for cls in (LinearSeries, CircularSeries, PolarSeries, VectorSeries,
                              CategoricalSeries)}


def series_type(kind: str) -> type[Series]:
    """The series class of a channel kind (``ValueError`` for a kind the protocol lacks)."""
    try:
        return SERIES_TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown kind {kind!r}") from None


def new_series(*, kind: str, **settings) -> Series:
    """An empty series of ``kind`` (``Series``' keyword arguments)."""
    return series_type(kind)(**settings)


