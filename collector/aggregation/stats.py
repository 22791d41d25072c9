"""Mergeable streaming statistics over report codes (river ``stats`` style).

Every statistic derives from ``Statistic``: ``update(batch)`` (a numpy array
of codes, or a pair for ``PolarCross``), ``merge(other)`` (the result equals
having seen both streams, which is what lets scale-out partitions be combined),
``get()``, and it pickles.  ``to_state()`` gives its sums as plain JSON values
in the shape of its typed state (``collector.storage.states``) and
``from_state(params, state)`` rebuilds it, checking the types there and here
that the sums fit the parameters (checkpoints and partition states, never
pickles).  Statistics work on the integer codes of the output grid: a code c
stands for the value ``origin + c * step``.  Sums of codes and counts are
exact Python integers, so incremental, batch and merged results are
identical, not merely close; only the trigonometric sums are floats.

All work is vectorised per message: no Python loop per value.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import Any, ClassVar

import msgspec
import numpy as np

from collector.storage.states import (
    AgentSupportState,
    BinsState,
    CountState,
    CrossState,
    MomentsState,
    SupportState,
    TrigState,
)
from edge_agent.mechanisms.categorical import LONGITUDINAL, ORACLES, as_categories


def _sum(array: np.ndarray) -> int:
    # int64 per batch (safe below ~1e9 values of 2**16 codes), then Python int.
    return int(np.sum(array, dtype=np.int64))


class StateError(ValueError):
    """A saved or published state (docs/guides/SCALE_OUT.md) that cannot be loaded; says where and
    why."""


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _equal(a, b) -> bool:
    """Integers and arrays exactly; float sums (trigonometric) up to rounding order."""
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)
    return a == b


class Statistic(ABC):
    """``update(batch)`` is ``add(summarize(batch))``: a collector summarises a
    message once and adds the summary to the cumulative and the window statistic.

    ``state_type`` is the typed form of ``to_state()`` (collector.storage.states)."""

    state_type: ClassVar[Any]
    # Slots, not a __dict__: a collector at its limits holds a quarter of a million
    # windows, each with four or five statistics (docs/benchmarks/BENCHMARKS.md, "Memory").
    __slots__ = ()

    def update(self, batch) -> None:
        self.add(self.summarize(batch))

    @abstractmethod
    def summarize(self, batch):
        """One batch's contribution (what ``add`` takes)."""

    @abstractmethod
    def add(self, summary) -> None:
        ...

    @abstractmethod
    def merge(self, other: Statistic) -> Statistic:
        ...

    @abstractmethod
    def get(self):
        ...

    def _check(self, other: Statistic) -> None:
        if type(other) is not type(self) or other.params() != self.params():
            raise ValueError(f"cannot merge {other!r} into {self!r}: different parameters")

    def params(self) -> tuple:
        return ()

    @abstractmethod
    def to_state(self) -> list:
        """The sums as JSON values (integers exact), without the parameters."""

    @abstractmethod
    def load_state(self, state, where: str = "state") -> None:
        """Set the sums from a typed state; ``StateError`` if they cannot be this
        statistic's (e.g. sums no codes could give)."""

    @classmethod
    def from_state(cls, params: tuple, state, where: str = "state") -> Statistic:
        """Rebuild from ``to_state()`` output (plain JSON values, checked here)."""
        try:
            typed = msgspec.convert(state, cls.state_type)
        except msgspec.ValidationError as exc:
            raise StateError(f"{where}: expected finite sums of the right types ({exc}), "
                             f"got {_show(state)}") from None
        statistic = cls(*params)
        statistic.load_state(typed, where)
        return statistic

    def copy(self) -> Statistic:
        """A detached copy: its sums its own (arrays copied), caches shared (read only)."""
        twin = copy.copy(self)
        for name, value in self.__getstate__().items():
            if isinstance(value, np.ndarray):
                setattr(twin, name, value.copy())
        return twin

    @classmethod
    def _attributes(cls) -> tuple[str, ...]:
        return tuple(name for klass in reversed(cls.__mro__)
                     for name in getattr(klass, "__slots__", ()))

    def __getstate__(self) -> dict:
        """The state without caches (attributes named ``_...`` are derived)."""
        return {name: getattr(self, name) for name in self._attributes()
                if not name.startswith("_") and hasattr(self, name)}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def __eq__(self, other: object) -> bool:
        mine = self.__getstate__()
        if type(other) is not type(self):
            return False
        theirs = other.__getstate__()
        return theirs.keys() == mine.keys() and all(_equal(a, theirs[k])
                                                    for k, a in mine.items())

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.params()}"


class _Sums(Statistic):
    """A statistic that is a fixed set of sums, named by ``SUMS``: adding a summary,
    merging, saving and loading are the same for all of them."""
    __slots__ = ()

    SUMS: ClassVar[tuple[str, ...]]

    def add(self, summary) -> None:
        for name, part in zip(self.SUMS, summary):
            setattr(self, name, getattr(self, name) + part)

    def merge(self, other):
        self._check(other)
        for name in self.SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def to_state(self) -> list:
        return [getattr(self, name) for name in self.SUMS]

    def load_state(self, state, where="state") -> None:
        for name, value in zip(self.SUMS, state):
            setattr(self, name, value)


class Count(_Sums):
    """Number of values seen."""
    __slots__ = ('n',)

    state_type = CountState
    SUMS = ("n",)

    def __init__(self):
        self.n = 0

    def summarize(self, batch) -> int:
        return int(np.size(batch))

    def add(self, summary: int) -> None:  # the summary is the count itself
        self.n += summary

    def get(self) -> int:
        return self.n


class CodeMoments(_Sums):
    """Mean and variance of the reported values, from exact sums of codes."""
    __slots__ = ('origin', 'step', 'n', 'sum', 'sum_sq')

    state_type = MomentsState
    SUMS = ("n", "sum", "sum_sq")

    def __init__(self, origin: float, step: float):
        self.origin, self.step = float(origin), float(step)
        self.n = 0
        self.sum = 0  # sum of codes (exact)
        self.sum_sq = 0  # sum of squared codes (exact)

    def params(self):
        return (self.origin, self.step)

    def summarize(self, batch) -> tuple[int, int, int]:
        codes = np.asarray(batch, dtype=np.int64)
        return codes.size, _sum(codes), _sum(codes * codes)

    def load_state(self, state, where="state") -> None:
        n, total, total_sq = state
        # Codes are integers >= 0, so c <= c*c, and (sum c)^2 <= n * sum c^2.
        if total > total_sq or total * total > n * total_sq:
            raise StateError(f"{where}: sums of codes and of their squares are inconsistent")
        super().load_state(state, where)

    def get(self) -> dict:
        if self.n == 0:
            return {"n": 0, "mean": None, "variance": None}
        mean_code = self.sum / self.n
        # Variance of codes from exact integers: (n*S2 - S1**2) / n**2.
        var_code = (self.n * self.sum_sq - self.sum * self.sum) / (self.n * self.n)
        return {"n": self.n, "mean": self.origin + self.step * mean_code,
                "variance": self.step**2 * var_code}


class _PlaneSums(_Sums):
    """A count and the sums of a 2-D vector per value, ``x`` and ``y`` (floats)."""
    __slots__ = ('n', 'x', 'y')

    SUMS = ("n", "x", "y")

    def __init__(self):
        self.n = 0
        self.x = 0.0
        self.y = 0.0


class TrigMoments(_PlaneSums):
    """Sums of cos (``x``) and sin (``y``) of reported angles: the mean direction and
    resultant length; and of cos 2θ (``x2``) and sin 2θ (``y2``), the second
    trigonometric moments that give the exact sample covariance of the reports' unit
    vectors (``collector.estimation.circular``).

    A state saved before the doubled-angle sums existed has only n, x and y: loaded,
    ``doubled_known`` is False and stays so through updates and merges (the sums
    would cover part of the angles only), and ``get()`` gives ``x2 = y2 = None``, for
    which ``collector.estimation.circular`` bounds the covariance instead."""
    __slots__ = ('origin', 'step', 'period', 'x2', 'y2', 'doubled_known')

    state_type = TrigState
    SUMS = ("n", "x", "y", "x2", "y2")

    def __init__(self, origin: float, step: float, period: float):
        super().__init__()
        self.origin, self.step, self.period = float(origin), float(step), float(period)
        self.x2 = 0.0
        self.y2 = 0.0
        self.doubled_known = True

    def params(self):
        return (self.origin, self.step, self.period)

    def radians(self, codes: np.ndarray) -> np.ndarray:
        return (self.origin + self.step * np.asarray(codes, dtype=np.float64)) * (
            2.0 * math.pi / self.period)

    def summarize(self, batch) -> tuple[int, float, float, float, float]:
        theta = self.radians(batch)
        c, s = np.cos(theta), np.sin(theta)
        # cos 2θ = c² − s², sin 2θ = 2cs: no further trigonometric call per value.
        return (theta.size, float(c.sum()), float(s.sum()),
                float(np.dot(c, c) - np.dot(s, s)), 2.0 * float(np.dot(c, s)))

    def _forget_doubled(self) -> None:
        self.doubled_known = False
        self.x2 = self.y2 = 0.0

    def add(self, summary) -> None:
        super().add(summary)
        if not self.doubled_known:
            self.x2 = self.y2 = 0.0

    def merge(self, other):
        super().merge(other)
        if not (self.doubled_known and other.doubled_known):
            self._forget_doubled()
        return self

    def to_state(self) -> list:
        state = [self.n, self.x, self.y]
        return state + [[self.x2, self.y2]] if self.doubled_known else state

    def load_state(self, state, where="state") -> None:
        if isinstance(state, TrigState):
            n, x, y, doubled = state.n, state.x, state.y, state.doubled
        else:  # to_state()'s plain list, not through a codec
            n, x, y, doubled = (*state, None)[:4]
        self.n, self.x, self.y = n, x, y
        if math.hypot(x, y) > n * (1 + 1e-9) + 1e-9:
            raise StateError(f"{where}: resultant longer than the number of angles")
        if doubled is None:
            self._forget_doubled()
            return
        self.doubled_known = True
        self.x2, self.y2 = doubled
        if math.hypot(self.x2, self.y2) > n * (1 + 1e-9) + 1e-9:
            raise StateError(f"{where}: doubled-angle resultant longer than the number of "
                             f"angles")
        # The angles' second moments about their mean are a covariance: positive
        # semi-definite (up to rounding of the float sums).
        if n:
            xx = (n + self.x2) / 2 - x * x / n
            yy = (n - self.x2) / 2 - y * y / n
            xy = self.y2 / 2 - x * y / n
            tolerance = 1e-9 * (n + 1)
            if min(xx, yy) < -tolerance or xx * yy - xy * xy < -tolerance * (n + 1):
                raise StateError(f"{where}: the sums of cos 2θ and sin 2θ are inconsistent "
                                 f"with those of cos θ and sin θ")

    def get(self) -> dict:
        x2, y2 = (self.x2, self.y2) if self.doubled_known else (None, None)
        if self.n == 0:
            return {"n": 0, "direction": None, "resultant": None, "x": None, "y": None,
                    "x2": None, "y2": None}
        direction = math.atan2(self.y, self.x)  # radians, in (-pi, pi]
        return {"n": self.n, "direction": direction,
                "resultant": math.hypot(self.x, self.y) / self.n,
                "x": self.x, "y": self.y, "x2": x2, "y2": y2}


# A histogram's counts are kept in the narrowest of these that holds its largest bin,
# widened as it grows: a window of a few thousand reports needs 16 bits, not 64 (a
# collector at its limits holds a quarter of a million windows; docs/benchmarks/BENCHMARKS.md).
_COUNT_TYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32),
                np.dtype(np.int64))


def _widened(counts: np.ndarray, largest: int) -> np.ndarray:
    """``counts``, in a wider type if ``largest`` does not fit in its own."""
    if largest <= np.iinfo(counts.dtype).max:
        return counts
    for kind in _COUNT_TYPES:
        if largest <= np.iinfo(kind).max:
            return counts.astype(kind)
    raise OverflowError(f"a histogram bin would count {largest} values, beyond 2**63 - 1")


class BinCounts(Statistic):
    """Counts of reports per histogram bin (exact).

    ``outside``: what happens to values beyond the bins: ``clip`` into the end
    bins, ``drop`` them (counted in ``outside_count``), or ``wrap`` (a circle).
    """
    __slots__ = ('origin', 'step', 'edge0', 'width', 'bins', 'outside', 'counts', 'outside_count')

    state_type = BinsState

    def __init__(self, origin: float, step: float, edge0: float, width: float, bins: int,
                 outside: str = "clip"):
        if outside not in ("clip", "drop", "wrap"):
            raise ValueError(f"outside must be clip, drop or wrap, got {outside!r}")
        self.origin, self.step = float(origin), float(step)
        self.edge0, self.width, self.bins = float(edge0), float(width), int(bins)
        self.outside = outside
        self.counts = np.zeros(self.bins, dtype=_COUNT_TYPES[0])
        self.outside_count = 0

    def params(self):
        return (self.origin, self.step, self.edge0, self.width, self.bins, self.outside)

    def bin_of(self, codes) -> np.ndarray:
        """The bin of each code; with ``drop``, -1 or ``bins`` beyond the ends."""
        values = self.origin + self.step * np.asarray(codes, dtype=np.float64)
        index = np.floor((values - self.edge0) / self.width).astype(np.int64)
        if self.outside == "wrap":
            return index % self.bins
        if self.outside == "clip":
            return np.clip(index, 0, self.bins - 1)
        return index

    def _lookup(self, max_code: int) -> np.ndarray:
        """Codes -> bin, precomputed for codes 0 .. 2^k - 1 (``bins`` = outside).

        Codes are validated grid indices, so one gather replaces the float
        arithmetic per value.  A table of 16-bit codes is 256 kB: one per set of
        parameters, shared by every series of a mechanism (``_bin_table``), not one
        per statistic (4,096 series at the default limits held 2 GB of them)."""
        size = 1 << max(int(max_code).bit_length(), 8)
        return _bin_table(*self.params(), size)

    def summarize(self, batch) -> tuple[np.ndarray, int]:
        batch = np.asarray(batch)
        if not batch.size:
            return np.zeros(self.bins, dtype=np.int64), 0
        if batch.dtype.kind in "iu" and batch.min() >= 0:
            counts = np.bincount(self._lookup(int(batch.max()))[batch], minlength=self.bins + 1)
            return counts[:self.bins], int(counts[self.bins])
        index = self.bin_of(batch)
        outside = 0
        if self.outside == "drop":
            inside = (index >= 0) & (index < self.bins)
            outside = int(index.size - np.count_nonzero(inside))
            index = index[inside]
        return np.bincount(index, minlength=self.bins), outside

    def add(self, summary) -> None:
        counts, outside = summary
        self._add(counts)
        self.outside_count += outside

    def merge(self, other):
        self._check(other)
        self._add(other.counts)
        self.outside_count += other.outside_count
        return self

    def _add(self, counts: np.ndarray) -> None:
        if counts.size:
            self.counts = _widened(self.counts, int(self.counts.max()) + int(counts.max()))
            np.add(self.counts, counts, out=self.counts, casting="unsafe")  # fits: widened

    def get(self) -> np.ndarray:
        return self.counts.astype(np.int64)

    def to_state(self) -> list:
        return [self.counts.tolist(), self.outside_count]

    def load_state(self, state, where="state") -> None:
        counts, outside = state
        if len(counts) != self.bins:
            raise StateError(f"{where}[0]: expected a list of {self.bins} counts, "
                             f"got {len(counts)}")
        if outside and self.outside != "drop":
            raise StateError(f"{where}[1]: only bins with outside='drop' count values outside")
        counts = np.array(counts, dtype=np.int64)  # BinCount: 0 <= count < 2**53
        self.counts = _widened(np.zeros(self.bins, dtype=_COUNT_TYPES[0]),
                               int(counts.max(initial=0)))
        self.counts[:] = counts
        self.outside_count = outside


class PolarCross(_PlaneSums):
    """Sums of r' cos(theta') (``x``) and r' sin(theta') (``y``) over paired radius and
    angle codes."""
    __slots__ = ('r_origin', 'r_step', 'angle')

    state_type = CrossState

    def __init__(self, r_origin: float, r_step: float, a_origin: float, a_step: float,
                 period: float):
        super().__init__()
        self.r_origin, self.r_step = float(r_origin), float(r_step)
        self.angle = TrigMoments(a_origin, a_step, period)

    def params(self):
        return (self.r_origin, self.r_step) + self.angle.params()

    def summarize(self, batch) -> tuple[int, float, float]:
        radius_codes, angle_codes = batch
        r = self.r_origin + self.r_step * np.asarray(radius_codes, dtype=np.float64)
        theta = self.angle.radians(angle_codes)
        return r.size, float((r * np.cos(theta)).sum()), float((r * np.sin(theta)).sum())

    def get(self) -> dict:
        if self.n == 0:
            return {"n": 0, "x": None, "y": None}
        return {"n": self.n, "x": self.x / self.n, "y": self.y / self.n}


@lru_cache(maxsize=256)  # bounded; oracles are immutable, and building one searches weights
def _oracle(name: str, epsilon: float, categories: int, delta: float,
            memo_epsilon: float | None):
    """The oracle whose support probabilities a statistic uses: one per parameters, shared
    by a series' total and every window (and every copy the API's snapshots make)."""
    if name in LONGITUDINAL:
        return LONGITUDINAL[name](epsilon=epsilon, memo_epsilon=memo_epsilon,
                                  categories=categories, delta=delta)
    return ORACLES[name](epsilon=epsilon, categories=categories, delta=delta)


class _OracleStatistic(Statistic):
    """A statistic of a categorical frequency oracle's reports: the oracle is its parameter."""
    __slots__ = ('oracle',)

    def __init__(self, oracle: str, epsilon: float, categories: int, delta: float = 0.0,
                 memo_epsilon: float | None = None):
        if oracle not in ORACLES and oracle not in LONGITUDINAL:
            known = ", ".join([*ORACLES, *LONGITUDINAL])
            raise ValueError(f"oracle must be one of {known}, got {oracle!r}")
        self.oracle = _oracle(oracle, epsilon, categories, delta, memo_epsilon)

    def params(self):
        o = self.oracle
        return (o.name, o.epsilon, o.categories, o.delta, getattr(o, "memo_epsilon", None))


class SupportCounts(_OracleStatistic):
    """How many reports of a categorical frequency oracle support each category, and how
    many reports there were (exact): what ``collector.estimation.frequencies`` turns into shares.

    A batch is what the oracle's ``perturb`` returns: GRR codes, OLH (seeds, buckets),
    unary (n, k) bits."""
    __slots__ = ('counts', 'n')

    state_type = SupportState

    def __init__(self, oracle: str, epsilon: float, categories: int, delta: float = 0.0,
                 memo_epsilon: float | None = None):
        super().__init__(oracle, epsilon, categories, delta, memo_epsilon)
        self.counts = np.zeros(categories, dtype=np.int64)
        self.n = 0

    def summarize(self, batch) -> tuple[np.ndarray, int]:
        n = len(batch[0]) if isinstance(batch, tuple) else len(batch)
        return self.oracle.support(batch), n

    def add(self, summary) -> None:
        counts, n = summary
        self.counts += counts
        self.n += n

    def merge(self, other):
        self._check(other)
        self.counts += other.counts
        self.n += other.n
        return self

    def get(self) -> dict:
        return {"n": self.n, "counts": self.counts.copy() if self.n else None}

    def to_state(self) -> list:
        return [self.counts.tolist(), self.n]

    def load_state(self, state, where="state") -> None:
        counts, n = state
        if len(counts) != self.oracle.categories:
            raise StateError(f"{where}[0]: expected {self.oracle.categories} counts, "
                             f"got {len(counts)}")
        if any(c > n for c in counts):
            raise StateError(f"{where}[0]: a category supported by more reports than {n}")
        # GRR supports one category per report, unary and OLH any number of them.
        if self.oracle.report_form == "category" and sum(counts) != n:
            raise StateError(f"{where}: GRR counts add up to the reports ({n}), "
                             f"got {sum(counts)}")
        self.counts = np.array(counts, dtype=np.int64)
        self.n = n


class AgentSupportCounts(_OracleStatistic):
    """Per agent, how many of its reports support each category and how many reports it
    sent (exact).  A memoized channel's total keeps them: an agent's reports of one value
    share one permanent memo, so they are not independent, and
    ``collector.estimation.frequencies.cluster_robust_variance`` makes the shares'
    variance of them, an agent's reports taken together.

    A batch is (the agent of each report, the reports), for an oracle whose report is one
    category (L-GRR, every oracle of ``LONGITUDINAL``).  ``rows`` maps an agent to its
    support counts followed by its number of reports (int64).  Their size is one row per
    agent that reported, of categories + 1 integers: ``[limits] agents`` by ``[limits]
    categories`` at most, per memoized series."""
    __slots__ = ('rows', 'n')

    state_type = AgentSupportState

    def __init__(self, oracle: str, epsilon: float, categories: int, delta: float = 0.0,
                 memo_epsilon: float | None = None):
        super().__init__(oracle, epsilon, categories, delta, memo_epsilon)
        if self.oracle.report_form != "category":
            raise ValueError(f"reports are counted per agent for oracles whose report is one "
                             f"category, not {oracle!r}")
        self.rows: dict[str, np.ndarray] = {}
        self.n = 0

    def summarize(self, batch) -> tuple[list[str], np.ndarray]:
        """The batch's agents (sorted) and their rows: one bincount over (agent, category)."""
        agents, reports = batch
        k = self.oracle.categories
        codes = as_categories(reports, k)
        agents = np.asarray(agents, dtype=str)
        if agents.shape != codes.shape:
            raise ValueError("batch: one agent per report")
        names, agent_of = np.unique(agents, return_inverse=True)
        rows = np.bincount(agent_of * (k + 1) + codes,
                           minlength=names.size * (k + 1)).reshape(names.size, k + 1)
        rows[:, k] = np.bincount(agent_of, minlength=names.size)
        return names.tolist(), rows

    def add(self, summary) -> None:
        names, rows = summary
        self._add_rows(zip(names, rows))

    def merge(self, other):
        self._check(other)
        self._add_rows(other.rows.items())
        return self

    def _add_rows(self, rows) -> None:
        """Add (agent, row) pairs: per agent, never per report."""
        for name, row in rows:
            mine = self.rows.get(name)
            if mine is None:
                self.rows[name] = row.astype(np.int64)  # a copy: the row is not ours
            else:
                mine += row
            self.n += int(row[-1])

    def agents(self) -> set[str]:
        return set(self.rows)

    def get(self) -> dict:
        """``support`` (agents by categories) and ``reports`` per agent, agents sorted."""
        if not self.rows:
            return {"n": self.n, "agents": None, "support": None, "reports": None}
        names = sorted(self.rows)
        table = np.array([self.rows[name] for name in names])
        return {"n": self.n, "agents": names, "support": table[:, :-1],
                "reports": table[:, -1]}

    def to_state(self) -> dict:
        return {name: [int(row[-1]), row[:-1].tolist()]
                for name, row in sorted(self.rows.items())}

    def load_state(self, state, where="state") -> None:
        k = self.oracle.categories
        rows = {}
        for name, (reports, counts) in state.items():
            if len(counts) != k:
                raise StateError(f"{where}.{name}: expected {k} counts, got {len(counts)}")
            # A report of one category supports that one category.
            if sum(counts) != reports:
                raise StateError(f"{where}.{name}: counts add up to {sum(counts)}, not to "
                                 f"the agent's {reports} reports")
            rows[name] = np.array([*counts, reports], dtype=np.int64)
        self.rows = rows
        self.n = sum(int(row[-1]) for row in rows.values())

    def copy(self) -> AgentSupportCounts:
        twin = copy.copy(self)
        twin.rows = {name: row.copy() for name, row in self.rows.items()}
        return twin

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other.params() == self.params()
                and other.n == self.n and other.rows.keys() == self.rows.keys()
                and all(np.array_equal(row, other.rows[name])
                        for name, row in self.rows.items()))


@lru_cache(maxsize=64)
def _bin_table(origin: float, step: float, edge0: float, width: float, bins: int,
               outside: str, size: int) -> np.ndarray:
    """``BinCounts._lookup``'s table for codes 0 .. size - 1 (read-only: shared)."""
    counts = BinCounts(origin, step, edge0, width, bins, outside)
    index = counts.bin_of(np.arange(size))
    if outside == "drop":
        index = np.where((index >= 0) & (index < bins), index, bins)
    table = index.astype(np.int32)
    table.flags.writeable = False
    return table
