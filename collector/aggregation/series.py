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
"""

from __future__ import annotations

import copy
import math
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
)
from edge_agent.mechanisms import Mechanism
from edge_agent.mechanisms.categorical import LONGITUDINAL
from edge_agent.mechanisms.registry import VECTOR
from edge_agent.protocol import as_dict, kind_problem, mechanism_of

TOTAL = None  # what ``Series.stale`` calls the total, beside the windows' starts


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
                 unit: str | None = None):
        """``description``: the typed mechanism description its reports carry
        (``edge_agent.protocol``); ``fields`` and ``strategy``: a vector channel's;
        ``unit``: the reports' (``Report.unit``)."""
        self.channel = channel
        self.description = description
        self.bins, self.window_seconds, self.keep_windows = bins, window_seconds, keep_windows
        self.fields, self.strategy, self.unit = fields, strategy, unit
        self.messages = 0
        self.agents: set[str] = set()
        self.total = self._new_blocks()
        self.windows: dict[int, dict] = {}
        # What the sums gave, kept until they count more (saved with them): the total's
        # estimates, and each window's history point, each with the count it is of.
        self.summary: tuple[int, dict] | None = None
        self.points: dict[int, tuple[int, Any]] = {}  # start -> (count, POINTS[kind])
        # What changed since it was computed (TOTAL, window starts): what to compute costs
        # what changed, not what the history holds.
        self.changed: set[int | None] = set()
        self._starts: list[int] | None = None  # a detached copy's: every window's start
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
        instead of one per message."""
        by_window: dict[int, list] = {}
        for agent, t, codes in messages:
            by_window.setdefault(int(math.floor(t / self.window_seconds)), []).append(codes)
            self.agents.add(agent)
        self.messages += len(messages)
        self.changed.add(TOTAL)
        for start, group in by_window.items():
            codes = group[0] if len(group) == 1 else self._join(group)
            window = self._window_at(start)
            if start in self.windows:  # not older than every kept window (then dropped)
                self.changed.add(start)
            for name, array in self._split(codes).items():
                summary = self.total[name].summarize(array)
                self.total[name].apply(summary)
                window[name].apply(summary)

    def _window_at(self, start: int) -> dict:
        window = self.windows.get(start)
        if window is None:
            window = self.windows[start] = self._new_blocks()
            self._forget_old_windows()
        return window

    def _forget_old_windows(self) -> None:
        while len(self.windows) > self.keep_windows:
            oldest = min(self.windows)
            del self.windows[oldest]
            self.points.pop(oldest, None)
            self.changed.discard(oldest)

    def merge(self, other: Series) -> Series:
        if other.identity != self.identity:
            raise ValueError("cannot merge different series")
        for name, block in self.total.items():
            block.merge(other.total[name])
        for start, blocks in other.windows.items():
            mine = self.windows.get(start)
            if mine is None:
                self.windows[start] = mine = self._new_blocks()
            for name, block in mine.items():
                block.merge(blocks[name])
        self.changed |= {TOTAL, *other.windows}
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
        """The windows' starts, oldest first (a detached copy holds the sums of only some
        of them)."""
        return sorted(self.windows) if self._starts is None else self._starts

    def window_count(self, start: int) -> int:
        return self._count(self.windows[start])

    def current(self, key: int | None) -> bool:
        """Whether the total's estimates (``TOTAL``) or the window's point are of its sums
        (a detached copy: they were, or were computed since)."""
        computed = self.summary is not None if key is TOTAL else key in self.points
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

    def stale(self) -> list[int | None]:
        """What to compute: ``TOTAL`` and the start of each window whose sums changed since
        they were computed (or were never computed), the total first, then the newest
        window first.  Costs what changed (``changed``), not what the series holds."""
        keys: list[int | None] = [TOTAL] if TOTAL in self.changed else []
        return keys + sorted((key for key in self.changed if key is not TOTAL), reverse=True)

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
        wanted = self.windows if keys is None else [key for key in keys if key is not TOTAL]
        twin.windows = {start: _copy_blocks(self.windows[start]) for start in wanted}
        twin._starts = self.starts
        twin.points = dict(self.points)
        twin.changed = set(self.changed)
        return twin

    def compute(self, key: int | None) -> None:
        """Compute the total's estimates (``TOTAL``) or a window's point from the sums."""
        if key is TOTAL:
            self.summary = (self.count(), self._view(self.total))
        else:
            view = self.window_view(key)
            point = msgspec.convert(json_safe(self.history_point(view)), POINTS[self.kind])
            self.points[key] = (view["count"], point)
        self.changed.discard(key)

    def keep(self, computed: Series, keys: list[int | None]) -> None:
        """Take what ``computed`` (a detached copy) computed for ``keys``, where these sums
        have not counted more since."""
        for key in keys:
            if key is TOTAL:
                if computed.summary is not None and computed.summary[0] == self.count():
                    self.summary = computed.summary
                    self.changed.discard(TOTAL)
            elif key in self.windows and key in computed.points \
                    and computed.points[key][0] == self.window_count(key):
                self.points[key] = computed.points[key]
                self.changed.discard(key)

    def adopt(self, earlier: Series) -> None:
        """Take what ``earlier`` (the same series, e.g. merged from partitions before they
        changed) computed, where these sums count the same."""
        if earlier.identity == self.identity:
            self.keep(earlier, [TOTAL, *earlier.points])

    def __eq__(self, other):
        return (isinstance(other, Series) and other.identity == self.identity
                and other.messages == self.messages and other.agents == self.agents
                and other.total == self.total and other.windows == self.windows)

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
        return SERIES_STATES[self.kind](
            channel=self.channel, mechanism=self.description, fields=self.fields,
            strategy=self.strategy, unit=self.unit, messages=self.messages,
            agents=sorted(self.agents), total=self._blocks_state(self.total),
            windows=[(start, self._blocks_state(of)) for start, of in sorted(self.windows.items())],
            summary=summary, points=points)

    @staticmethod
    def from_state(state: SeriesState | dict, *, bins: int, window_seconds: float,
                   keep_windows: int, where: str = "series") -> Series:
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
            strategy=state.strategy, unit=state.unit)
        series.messages = state.messages
        series.agents = set(state.agents)
        series._load_blocks(series.total, state.total, f"{where}.total")
        if len(state.windows) > keep_windows:
            raise StateError(f"{where}.windows: expected at most {keep_windows} windows")
        for i, (start, blocks) in enumerate(state.windows):
            if abs(start) > 2**1024 or start in series.windows:
                raise StateError(f"{where}.windows[{i}]: start must be a new integer")
            series.windows[start] = series._new_blocks()
            series._load_blocks(series.windows[start], blocks, f"{where}.windows[{i}]")
        # What the sums gave, where it is of these sums (an estimate of other counts is
        # computed again, and one of a window not kept is dropped).
        if state.summary is not None and state.summary[0] == series.count():
            series.summary = (state.summary[0], msgspec.to_builtins(state.summary[1]))
        for start, count, point in state.points:
            if start in series.windows and count == series.window_count(start):
                series.points[start] = (count, point)
        series.changed = {TOTAL} if series.summary is None else set()
        series.changed |= {start for start in series.windows if start not in series.points}
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

    def window_view(self, start: int) -> dict:
        """The window numbered ``start`` (its span in seconds, count and statistics)."""
        blocks = self.windows[start]
        return {"start": start * self.window_seconds, "end": (start + 1) * self.window_seconds,
                "count": self._count(blocks), **self._view(blocks)}


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


