"""Blocks of statistics: one scalar mechanism's codes (a channel, a polar component, a
vector's axis) and the estimates the mechanism's closed forms give from them.

* ``LinearBlock``: the raw and reconstructed histograms and the mean, chosen by
  estimated error, with an interval (``collector.estimation.estimators``);
* ``CircularBlock``: mean direction and resultant length with their intervals
  (``collector.estimation.circular``), circular standard deviation, histograms
  (wrapping);
* ``CategoricalBlock``: how many reports support each category, turned into unbiased
  shares with standard errors and 95% intervals, and consistent shares
  (``collector.estimation.frequencies``);
* ``CrossBlock``: a polar pair's mean vector.

A block names its mechanism by a typed description rather than holding it, so it
pickles small and compares by value; its computed view is cached until its sums change.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache

import numpy as np

from collector.aggregation.stats import (
    AgentSupportCounts,
    BinCounts,
    CodeMoments,
    Count,
    PolarCross,
    StateError,
    SupportCounts,
    TrigMoments,
)
from collector.estimation import circular, ems
from collector.estimation.estimators import LinearModel, circular_histogram, linear_estimates
from collector.estimation.frequencies import cluster_robust_variance, frequency_summary
from collector.estimation.jsonsafe import finite, json_safe
from collector.storage.states import (
    CategoricalBlockState,
    CircularBlockState,
    CrossBlockState,
    LinearBlockState,
)
from edge_agent.mechanisms import Mechanism
from edge_agent.protocol import mechanism_of

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


@lru_cache(maxsize=256)
def _transition(description, component: int | None, in_edges: tuple, out_edges: tuple,
                circular: bool) -> np.ndarray:
    mechanism = _component(mechanism_of(description), component)
    return ems.transition_matrix(mechanism, np.array(in_edges), np.array(out_edges),
                                 circular=circular)


def _component(mechanism: Mechanism, component: int | None) -> Mechanism:
    """The mechanism itself, or one component of a pair (polar: 0 radius, 1 angle)."""
    return mechanism if component is None else mechanism.components[component]


class Block:
    """Statistics of one scalar mechanism's codes (a channel, a polar component, an axis).

    The mechanism is named by a typed description (``component``: which of a pair's)
    rather than held, so a block pickles small and compares by value."""

    STATE_NAMES: tuple[str, ...]
    # Slots, not a __dict__: a collector at its limits holds a quarter of a million
    # windows, each with its blocks (docs/benchmarks/BENCHMARKS.md, "Memory").
    __slots__ = ("description", "component", "bins", "count", "_cache")

    def __init__(self, description, bins: int, component: int | None = None):
        self.description = description
        self.component = component
        self.bins = bins
        self.count = Count()
        self._cache = None
        self._setup()

    @property
    def mechanism(self) -> Mechanism:
        return _component(mechanism_of(self.description), self.component)

    def _transition(self, in_edges: np.ndarray, out_edges: np.ndarray,
                    circular: bool) -> np.ndarray:
        return _transition(self.description, self.component, tuple(in_edges), tuple(out_edges),
                           circular)

    def _setup(self) -> None:
        raise NotImplementedError

    def update(self, codes: np.ndarray) -> None:
        self.apply(self.summarize(codes))

    def summarize(self, codes: np.ndarray) -> tuple:
        """One message's contribution, computed once for the total and the window."""
        return tuple(statistic.summarize(codes) for statistic in self._statistics())

    def apply(self, summary: tuple) -> None:
        self._cache = None
        for statistic, part in zip(self._statistics(), summary):
            if part is not None:  # None: a statistic shared with an earlier one
                statistic.add(part)

    def merge(self, other: Block) -> Block:
        if (other.description, other.component, other.bins) != (self.description,
                                                                self.component, self.bins):
            raise ValueError("cannot merge blocks of different mechanisms")
        self._cache = None
        merged = set()
        for mine, theirs in zip(self._statistics(), other._statistics()):
            if id(mine) not in merged:  # a statistic shared by two names, once
                merged.add(id(mine))
                mine.merge(theirs)
        return self

    def _statistics(self):
        raise NotImplementedError

    def to_state(self):
        return self.STATE_TYPE(*(statistic.to_state() for statistic in self._statistics()))

    def load_state(self, state, where: str) -> None:
        self._cache = None
        _load_block(self, state, where)

    def __getstate__(self):
        state = _slot_values(self)
        state["_cache"] = None  # derived, recomputed on demand
        return state

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def copy(self) -> Block:
        """A detached copy of the statistics (fixed parts shared, no computed view)."""
        return copy_statistics(self)

    def __eq__(self, other):
        return (type(other) is type(self) and other.description == self.description
                and other.component == self.component
                and tuple(self._statistics()) == tuple(other._statistics()))

    def get(self) -> dict:
        if self._cache is None:
            self._cache = self._compute()
        return self._cache



class LinearBlock(Block):
    STATE_TYPE = LinearBlockState
    __slots__ = ("in_edges", "out_edges", "moments", "raw", "out")

    def _setup(self) -> None:
        m = self.mechanism
        origin, step = m.grid_values
        width = (m.high - m.low) / self.bins
        self.in_edges, self.out_edges = _linear_edges(self.description, self.component,
                                                      self.bins)
        self.moments = CodeMoments(origin, step)
        out_width = float(self.out_edges[1] - self.out_edges[0])
        self.out = BinCounts(origin, step, float(self.out_edges[0]), out_width,
                             self.out_edges.size - 1, outside="clip")
        # Where the output bins are the input bins (classical OGPM, the compressed forms)
        # every report lies inside the domain: one histogram is both (a saved state still
        # names it twice).
        self.raw = self.out if self.out_edges is self.in_edges else BinCounts(
            origin, step, m.low, width, self.bins, outside="drop")

    STATE_NAMES = ("count", "moments", "raw", "out")

    def _statistics(self):
        return (self.count, self.moments, self.raw, self.out)

    def summarize(self, codes: np.ndarray) -> tuple:
        if self.raw is self.out:  # bin once, count once
            return (self.count.summarize(codes), self.moments.summarize(codes),
                    self.out.summarize(codes), None)
        return super().summarize(codes)

    def model(self) -> LinearModel:
        return _linear_model(self.description, self.component, self.bins)

    def _compute(self) -> dict:
        n = self.count.get()
        raw_counts = self.raw.get()
        histogram = {"edges": self.in_edges.tolist(),
                     "raw": (raw_counts / n).tolist() if n else [0.0] * self.bins,
                     "estimate": None, "method": None, "smoothing": None}
        if n == 0:
            return {"count": 0, "mean": {"raw": None, "estimate": None, "stderr": None,
                                         "bias_bound": None, "ci95": None, "method": None,
                                         "candidates": None, "note": None},
                    "histogram": histogram, "quantiles": None}
        moments = self.moments.get()
        found = linear_estimates(self.model(), out_counts=self.out.get(),
                                 raw_mean=moments["mean"], report_variance=moments["variance"],
                                 n=n)
        shown = found["histogram"]
        histogram.update(estimate=shown.tolist(), method=found["histogram_method"],
                         smoothing=found["smoothing"])
        return {"count": n, "mean": json_safe(found["mean"]), "histogram": histogram,
                "quantiles": ems.quantiles(self.in_edges, shown, QUANTILES),
                "spread": json_safe(found["spread"])}


@lru_cache(maxsize=256)
def _linear_edges(description, component: int | None, bins: int) -> tuple[np.ndarray, ...]:
    """A linear block's input and output bin edges (read-only: shared by every block of
    the mechanism, a window's included)."""
    m = _component(mechanism_of(description), component)
    in_edges = np.linspace(m.low, m.high, bins + 1)
    width = (m.high - m.low) / bins
    if m.name == "duchi":  # two atoms: the output "bins" are the two codes
        out_edges = np.array([m.output_low, 0.5 * (m.output_low + m.output_high),
                              m.output_high])
    elif getattr(m, "atoms", False):  # an axis of a vector mechanism: a bin per atom
        origin, step = m.grid_values
        out_edges = origin + step * (np.arange(m.n_cells + 1) - 0.5)
    elif (m.output_low, m.output_high) == (m.low, m.high):
        out_edges = in_edges
    else:
        n_out = max(1, math.ceil((m.output_high - m.output_low) / width - 1e-9))
        out_edges = m.output_low + width * np.arange(n_out + 1)
    for edges in (in_edges, out_edges):
        edges.flags.writeable = False
    return in_edges, out_edges


@lru_cache(maxsize=256)
def _linear_model(description, component: int | None, bins: int) -> LinearModel:
    """A block's fixed parts, shared by a series' total and every window and copy."""
    block = LinearBlock(description, bins, component)
    return LinearModel(block.mechanism, block.in_edges, block.out_edges,
                       block._transition(block.in_edges, block.out_edges, False))


class CircularBlock(Block):
    STATE_TYPE = CircularBlockState
    __slots__ = ("edges", "trig", "hist")

    def _setup(self) -> None:
        m = self.mechanism
        origin, step = m.grid_values
        self.edges = np.linspace(m.origin, m.origin + m.period, self.bins + 1)
        self.trig = TrigMoments(origin, step, m.period)
        self.hist = BinCounts(origin, step, m.origin, m.period / self.bins, self.bins,
                              outside="wrap")

    STATE_NAMES = ("count", "trig", "hist")

    def _statistics(self):
        return (self.count, self.trig, self.hist)

    def _compute(self) -> dict:
        m, n = self.mechanism, self.count.get()
        counts = self.hist.get()
        histogram = {"edges": self.edges.tolist(),
                     "raw": (counts / n).tolist() if n else [0.0] * self.bins,
                     "estimate": None, "method": None, "smoothing": None}
        if n:
            shown = circular_histogram(counts, self._transition(self.edges, self.edges, True))
            histogram.update(shown, estimate=shown["estimate"].tolist())
        trig = self.trig.get()
        stats = circular.summary(n, trig["x"], trig["y"], trig["x2"], trig["y2"],
                                 rho=m.mean_resultant_length(),
                                 rho2=self._noise(self.description, self.component),
                                 period=m.period, origin=m.origin)
        return {"count": n, **stats, "histogram": histogram}

    @staticmethod
    @lru_cache(maxsize=256)
    def _noise(description, component: int | None) -> float:
        """The mechanism's E[cos 2(θ' − x)] (once per mechanism, not per window)."""
        return circular.noise_second_moment(_component(mechanism_of(description), component))


class CategoricalBlock(Block):
    """A frequency oracle's reports: how many support each category (exact counts), and,
    in a memoized channel's total (``keep_reports_per_agent``), how many per agent.

    ``agents`` is None where reports are not kept per agent: a window, a channel that does
    not memoize, or a memoized total restored from (or merged with) a state written before
    they were kept, which would leave some of its reports out; the shares' intervals then
    take the reports as independent."""

    STATE_TYPE = CategoricalBlockState
    STATE_NAMES = ("count", "support", "agents")
    __slots__ = ("support", "agents")

    def _setup(self) -> None:
        oracle = self.mechanism
        self.support = SupportCounts(oracle.name, oracle.epsilon, oracle.categories,
                                     oracle.delta, getattr(oracle, "memo_epsilon", None))
        self.agents: AgentSupportCounts | None = None

    def keep_reports_per_agent(self) -> None:
        """Count reports per agent too (before any is counted: a memoized channel's total)."""
        self.agents = AgentSupportCounts(*self.support.params())

    def count_per_agent(self, batch) -> None:
        """Add (the agent of each report, the reports) to the counts per agent; the reports
        themselves reach the block through ``apply``."""
        self._cache = None
        self.agents.update(batch)

    def _statistics(self):
        if self.agents is None:
            return (self.count, self.support)
        return (self.count, self.support, self.agents)

    def summarize(self, reports) -> tuple:
        support = self.support.summarize(reports)
        return support[1], support  # the count is the support's number of reports

    def merge(self, other: CategoricalBlock) -> CategoricalBlock:
        if other.agents is None:  # our counts per agent would miss its reports
            self.agents = None
        return super().merge(other)

    def load_state(self, state, where: str) -> None:
        if state.agents is None:
            self.agents = None
        elif self.agents is None:
            raise StateError(f"{where}.agents: only a memoized channel's total counts "
                             f"reports per agent")
        super().load_state(state, where)
        if self.agents is not None and self.agents.n:
            by_agent = self.agents.get()["support"].sum(axis=0)
            if not np.array_equal(by_agent, self.support.counts):
                raise StateError(f"{where}.agents: the agents' support counts do not add "
                                 f"up to the block's")

    def _compute(self) -> dict:
        oracle, n = self.mechanism, self.count.get()
        counts = self.support.counts
        cluster_variance = None
        if self.agents is not None and n:
            per_agent = self.agents.get()
            cluster_variance = cluster_robust_variance(oracle, per_agent["support"],
                                                       per_agent["reports"])
        shares = frequency_summary(oracle, counts, n, cluster_variance=cluster_variance)
        del shares["n"]
        return {"count": n, "frequencies": {
            "labels": [oracle.label(v) for v in range(oracle.categories)],
            "raw": (counts / n).tolist() if n else [None] * oracle.categories, **shares}}


def _slot_values(block) -> dict:
    """A slotted object's attributes, by name."""
    return {name: getattr(block, name) for klass in type(block).__mro__
            for name in getattr(klass, "__slots__", ()) if hasattr(block, name)}


def copy_statistics(block):
    twin = copy.copy(block)
    copies = {}  # a statistic shared by two names stays shared
    for name, statistic in zip(block.STATE_NAMES, block._statistics()):
        if id(statistic) not in copies:
            copies[id(statistic)] = statistic.copy()
        setattr(twin, name, copies[id(statistic)])
    if hasattr(twin, "_cache"):
        twin._cache = None
    return twin


def _load_block(block, state, where: str) -> None:
    """Load every statistic of a block (a typed block state), then check they counted the
    same values."""
    loaded = {}
    for name, statistic in zip(block.STATE_NAMES, block._statistics()):
        first = loaded.setdefault(id(statistic), name)
        if first == name:
            statistic.load_state(getattr(state, name), f"{where}.{name}")
        elif getattr(state, name) != getattr(state, first):
            # One statistic under two names (a linear block whose output bins are its
            # input bins): a state saying two things is no collector's.
            raise StateError(f"{where}.{name}: counts differ from {first}'s, whose bins "
                             f"are the same")
    n = block.count.n
    for name, statistic in zip(block.STATE_NAMES, block._statistics()):
        # Python integers: an int64 sum of hostile bins could wrap around to n.
        seen = (sum(statistic.counts.tolist()) + statistic.outside_count
                if isinstance(statistic, BinCounts) else statistic.n)
        if seen != n:
            raise StateError(f"{where}.{name}: counts {seen} values, the block {n}")
        if isinstance(statistic, CodeMoments):
            # Codes lie in [0, n_cells): sums beyond that are not from reports, and
            # absurd ones would overflow floats when the mean is read.
            top = block.mechanism.n_cells - 1
            if statistic.sum > n * top or statistic.sum_sq > n * top * top:
                raise StateError(f"{where}.{name}: sums beyond {n} codes of at most {top}")


class CrossBlock:
    """Polar mean vector: E[r' e^{i t'}] = m_r(r) rho e^{i t}, the components being
    independent."""

    STATE_NAMES = ("count", "cross")
    STATE_TYPE = CrossBlockState
    __slots__ = ("description", "cross", "count")

    def __init__(self, description):
        self.description = description
        r, a = mechanism_of(description).components
        r_origin, r_step = r.grid_values
        a_origin, a_step = a.grid_values
        self.cross = PolarCross(r_origin, r_step, a_origin, a_step, a.period)
        self.count = Count()

    def update(self, codes) -> None:
        self.apply(self.summarize(codes))

    def summarize(self, codes) -> tuple:
        return self.cross.summarize(codes), self.count.summarize(codes[0])

    def apply(self, summary) -> None:
        self.cross.add(summary[0])
        self.count.add(summary[1])

    def merge(self, other: CrossBlock) -> CrossBlock:
        self.cross.merge(other.cross)
        self.count.merge(other.count)
        return self

    def _statistics(self):
        return (self.count, self.cross)

    def to_state(self) -> CrossBlockState:
        return CrossBlockState(*(statistic.to_state() for statistic in self._statistics()))

    def load_state(self, state, where: str) -> None:
        _load_block(self, state, where)

    def copy(self) -> CrossBlock:
        return copy_statistics(self)

    def __eq__(self, other):
        return isinstance(other, CrossBlock) and other.cross == self.cross

    def mean_vector(self, angle_block: CircularBlock) -> dict:
        r_mech, a_mech = mechanism_of(self.description).components
        cross = self.cross.get()
        trig = angle_block.trig
        rho = a_mech.mean_resultant_length()
        affine = r_mech.affine_mean()
        if cross["n"] == 0 or rho <= 0 or affine is None or affine[0] <= 0:
            return {"x": None, "y": None, "magnitude": None, "direction": None}
        a, b = affine[0], affine[1]
        # E[r e^{it}] = (mean(r' e^{it'}) / rho - b mean(e^{it'}) / rho) / a
        mean_cos, mean_sin = trig.x / trig.n, trig.y / trig.n
        x = (cross["x"] / rho - b * mean_cos / rho) / a
        y = (cross["y"] / rho - b * mean_sin / rho) / a
        unit = a_mech.period / (2.0 * math.pi)
        direction = circular.wrap(math.atan2(y, x) * unit, a_mech.origin, a_mech.period)
        return {"x": finite(x), "y": finite(y), "magnitude": finite(math.hypot(x, y)),
                "direction": finite(direction)}
