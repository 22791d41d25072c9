"""Channels: raw readings of one source field (or fields) -> perturbed reports.

A channel (a Telegraf-style processor) does three things per batch:

1. ``select``: drop readings with a NaN or an infinity in any field it reports
   (counted on the device only, ``local['non_finite_dropped']``; such a reading
   is broken, and guessing a value would misreport it), then keep at most one reading per
   ``report_interval`` seconds (the first at or after the previous report
   plus the interval; 0 keeps every reading).  A planned channel (``spacing``,
   ``edge_agent.config.planning``) keeps instead the batch's last reading once ``spacing``
   seconds have passed since its previous report, the first time at a phase drawn
   from the CSPRNG.  Which readings are kept depends only on time, never on values.
2. The state store decides how many of the selected readings the budget
   allows (see ``state.StateStore.record``).
3. ``build_message``: perturb that many readings and encode one message.
   Values outside the domain are clipped (or wrapped) by the mechanism and
   counted in ``local['clipped']``.

``counters`` are published in the agent's status: they count reports and
messages, which the collector sees anyway.  ``local`` counters depend on the
readings and never leave the device (docs/guides/PRIVACY.md).

A channel's privacy map (``privacy_loss``) is the exact loss of one report,
composed from its mechanisms' exact losses; the ledger charges
``charge_nano``, that loss rounded up exactly to integer units.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from edge_agent import protocol
from edge_agent.config import (
    CategoricalChannelConfig,
    CircularChannelConfig,
    LinearChannelConfig,
    PolarChannelConfig,
    VectorChannelConfig,
    period_of,
)
from edge_agent.mechanisms import (
    CircularOGPM,
    ExactLoss,
    linear_mechanism,
    split_epsilon,
)
from edge_agent.mechanisms.multidimensional import random_axes
from edge_agent.mechanisms.randomness import RandomSource, as_random_source
from edge_agent.mechanisms.registry import (
    AUTO,
    AUTO_REPORTS,
    VECTOR,
    mechanism_for_data,
    polar_mechanism,
)
from edge_agent.readings import Readings
from edge_agent.state import NANO, delta_units_up, to_nano_up

# Counters the status publishes (the collector counts the same from the reports) and
# counters that depend on readings, kept on the device (docs/guides/PRIVACY.md).
PUBLISHED_COUNTERS = ("reports", "messages")
LOCAL_COUNTERS = ("non_finite_dropped", "not_a_category", "clipped", "budget_refused",
                  "clock_behind", "errors")


def _composed_loss(mechanism, reports: int) -> ExactLoss:
    one = mechanism.exact_privacy_loss()
    return sum([one] * (reports - 1), one)


# The exact loss takes milliseconds (the layout's worst cell ratio): computed once per
# mechanism, which every virtual agent of a fleet shares with its template.
@lru_cache(maxsize=1024)
def _charge_nano(mechanism, reports: int) -> int:
    if getattr(mechanism, "delta", 0):  # (ε, δ): ε is charged as configured, rounded up
        return to_nano_up(mechanism.epsilon) * reports
    return _composed_loss(mechanism, reports).ceiling(NANO)


@lru_cache(maxsize=1024)
def _charge_delta(mechanism, reports: int) -> int:
    if not getattr(mechanism, "delta", 0):
        return 0
    return delta_units_up(mechanism.exact_delta()) * reports


def flat_ends(mechanism, low: float, high: float) -> list[tuple[float, float]]:
    """The parts of [low, high] where ``mechanism``'s mean is flat (classical OGPM near
    its domain's ends, Theorem 3.7)."""
    affine = mechanism.affine_mean()
    if affine is None:
        return []
    x_lo, x_hi = affine[2], affine[3]
    ends = [(max(low, mechanism.low), min(high, x_lo)),
            (max(low, x_hi), min(high, mechanism.high))]
    # A region of a millionth of the domain is the integer layout's rounding (PM-C's
    # affine range ends a grid tick inside the domain), not a flat end.
    least = 1e-6 * (mechanism.high - mechanism.low)
    return [(a, b) for a, b in ends if b - a > least]


def share_in(regions: list[tuple[float, float]], *columns: np.ndarray) -> float | None:
    """The share of the finite values of ``columns`` inside any of ``regions`` (closed),
    None without any."""
    values = np.concatenate(columns) if columns else np.empty(0)
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    inside = np.zeros(values.size, dtype=bool)
    for a, b in regions:
        inside |= (values >= a) & (values <= b)
    return float(inside.mean())


@dataclass
class Selection:
    """Readings chosen for release (raw, in memory only)."""

    times: np.ndarray
    values: tuple[np.ndarray, ...]

    def __len__(self) -> int:
        return int(self.times.size)

    def __repr__(self) -> str:
        return f"Selection({len(self)} readings)"


class Channel:
    kind: str

    def __init__(self, config, *, agent_id: str, fleet: str, spacing: float | None = None):
        """``spacing``: the planner's seconds between reports (None: ``report_interval``)."""
        self.config = config
        self.name = config.name
        self.source = config.source
        self.epsilon = config.epsilon  # charged per report
        self.agent_id = agent_id
        self.topic = protocol.data_topic(fleet, agent_id, config.name)
        self.report_interval = config.report_interval
        self.spacing = spacing
        self._next_due = -math.inf
        self.counters = dict.fromkeys(PUBLISHED_COUNTERS, 0)
        self.local = dict.fromkeys(LOCAL_COUNTERS, 0)

    def for_agent(self, agent_id: str, fleet: str) -> Channel:
        """This channel for another agent: same config and (immutable, shared) mechanism,
        its own topic, counters and report_interval state (the fleet simulator's clones)."""
        clone = copy.copy(self)
        clone.agent_id = agent_id
        clone.topic = protocol.data_topic(fleet, agent_id, self.name)
        clone._next_due = -math.inf
        clone.counters = dict.fromkeys(PUBLISHED_COUNTERS, 0)
        clone.local = dict.fromkeys(LOCAL_COUNTERS, 0)
        return clone

    @property
    def field_names(self) -> tuple[str, ...]:
        return (self.config.field,) if hasattr(self.config, "field") else tuple(self.config.fields)

    def describe(self) -> dict[str, Any]:
        return self.mechanism.describe()

    @property
    def unit(self) -> str | None:
        """The reported values' unit (``Report.unit``): the channel's ``unit`` key."""
        return self.config.unit

    # -- the privacy map -------------------------------------------------------------------
    # Mechanism reports per reading (a vector channel: its k axes).
    reports_per_reading = 1

    def privacy_loss(self) -> ExactLoss:
        """The exact privacy loss of one report (all its values): the mechanism's, times
        the reports per reading (sequential composition)."""
        return _composed_loss(self.mechanism, self.reports_per_reading)

    @property
    def charge_nano(self) -> int:
        """What the ledger charges for one report: ``privacy_loss`` rounded up exactly to
        units of 1e-9 (per mechanism: ``domain = "auto"`` replaces it).  An (ε, δ)
        mechanism's guarantee is (ε, ``exact_delta`` at ε): ε is charged, rounded up."""
        return _charge_nano(self.mechanism, self.reports_per_reading)

    @property
    def charge_delta(self) -> int:
        """The δ the ledger charges for one report, in units of ``DELTA_UNIT``: an (ε, δ)
        mechanism's exact δ at ε (the largest hockey-stick divergence of what it releases,
        at most its configured δ), rounded up; 0 for pure ε-LDP ones."""
        return _charge_delta(self.mechanism, self.reports_per_reading)

    def flat_regions(self) -> dict[str, tuple[Any, list[tuple[float, float]]]]:
        """Where in its domain each scalar part of the channel's mechanism has a flat mean,
        by part ("" the value, "radius", "each axis"): (that part's mechanism, regions);
        nothing for most mechanisms."""
        return {}

    # -- step 1 --------------------------------------------------------------------------
    def select(self, readings: Readings, now: float = 0.0, rng: Any = None) -> Selection:
        """What of ``readings`` (a batch at time ``now``) this channel would report;
        ``rng`` draws a planned channel's first phase (None: the CSPRNG)."""
        columns, ok = self._read(readings)
        if self.spacing is not None:
            return self._select_planned(columns, ok, readings.times, now, rng)
        index = np.flatnonzero(ok)
        times = readings.times[index]
        if self.report_interval > 0 and index.size:
            index = index[self._subsample(times)]
            times = readings.times[index]
        return Selection(times, tuple(column[index] for column in columns))

    def _select_planned(self, columns, ok, times, now: float, rng: Any) -> Selection:
        if self._next_due == -math.inf:
            # A random phase, so that each slot of the fleet's windows holds a random
            # share of the wearers (population division), drawn at every start: the
            # ledger holds a report back until the previous one has left its windows.
            uniform = float(as_random_source(rng).words(1)[0]) / 2.0 ** 64
            self._next_due = now + uniform * self.spacing
        index = np.flatnonzero(ok)
        if now < self._next_due or not index.size:
            return Selection(times[:0], tuple(column[:0] for column in columns))
        last = index[-1:]
        return Selection(times[last], tuple(column[last] for column in columns))

    def reported(self, now: float) -> None:
        """A planned channel's report was charged at batch time ``now``: the next one is
        due ``spacing`` later (a report the ledger refused stays due)."""
        if self.spacing is not None:
            self._next_due = now + self.spacing

    def _read(self, readings: Readings) -> tuple[list[np.ndarray], np.ndarray]:
        """The channel's columns, and which rows can be reported (finite in every one)."""
        columns = [readings.column(name) for name in self.field_names]
        ok = np.ones(len(readings), dtype=bool)
        for column in columns:
            ok &= np.isfinite(column)
        self.local["non_finite_dropped"] += int(len(readings) - np.count_nonzero(ok))
        return columns, ok

    def _subsample(self, times: np.ndarray) -> np.ndarray:
        """Positions of the readings kept by report_interval (one per report, not per value)."""
        order = np.argsort(times, kind="stable")
        ordered = times[order]
        keep = []
        i = int(np.searchsorted(ordered, self._next_due))
        while i < ordered.size:
            keep.append(order[i])
            self._next_due = ordered[i] + self.report_interval
            i = int(np.searchsorted(ordered, self._next_due))
        return np.array(keep, dtype=np.int64)

    # -- step 3 --------------------------------------------------------------------------
    def memoized(self, selection: Selection, allowed: int, tx, rng: Any = None) -> Selection:
        """The ``allowed`` readings to report, as the channel's mechanism takes them (a
        memoized channel: their memos, drawn with ``rng`` and kept in the transaction
        ``tx``)."""
        return selection

    def build_message(self, selection: Selection, *, seq: int, allowed: int, t: float,
                      dt: float, rng: Any = None) -> tuple[str, bytes]:
        source = as_random_source(rng)
        codes, clipped = self._perturb(tuple(v[:allowed] for v in selection.values), source)
        self.local["clipped"] += clipped
        self.counters["reports"] += allowed
        self.counters["messages"] += 1
        extra = self._extra()
        if isinstance(codes, dict):  # codes and other parts (olh: seeds)
            extra.update(codes)
            codes = extra.pop("codes")
        payload = protocol.report(agent=self.agent_id, channel=self.name, kind=self.kind,
                                  seq=seq, t=t, dt=dt, mechanism=self.describe(), codes=codes,
                                  unit=self.unit, **extra)
        return self.topic, payload

    def _perturb(self, values: tuple[np.ndarray, ...], source: RandomSource):
        codes, clipped = self.mechanism.perturb_codes(values[0], source, return_clipped=True)
        return codes.tolist(), clipped

    def _extra(self) -> dict[str, Any]:
        return {}

    def warm_up(self) -> None:
        """Run each kernel once so numba compiles, and compute the exact charge, before
        the service says READY (not in the first batch)."""
        self._perturb(self._probe(), as_random_source(None))
        self.charge_nano  # noqa: B018 (computed and cached now)

    def _probe(self) -> tuple[np.ndarray, ...]:
        return tuple(np.zeros(4) for _ in self.field_names)


class LinearChannel(Channel):
    kind = "linear"

    def __init__(self, config: LinearChannelConfig, **kw):
        super().__init__(config, **kw)
        self.auto_domain = config.domain == "auto"
        self._adopted: tuple[float, float, int] | None = None  # adopt_range's last arguments
        self._build_mechanism()

    def _build_mechanism(self) -> None:
        """The mechanism at the configured (or planned) ε, over the range it adopted."""
        low, high = self.config.start_domain
        self.mechanism = linear_mechanism(self.config.mechanism, epsilon=self.config.epsilon,
                                          low=low, high=high, grid_bits=self.config.grid_bits,
                                          delta=self.config.delta)
        if self._adopted is not None:
            low, high, reports = self._adopted
            self.adopt_range(low, high, reports=reports)

    def replan(self, spacing: float, epsilon: float) -> bool:
        """A planned channel's new schedule (``plan_spread = "auto"``, when a budget period
        begins): a report every ``spacing`` seconds at ``epsilon``, both from the same
        shares of the guarantees.  Its first report under it comes ``spacing`` after the
        old schedule's next: with that gap after the last old report (s_old + s_new), a
        window holding a of the old reports and b of the new spans at least
        a s_old + b s_new - (s_old + s_new) + gap, so a ε_old + b ε_new stays within the
        share each schedule keeps alone.  Whether anything changed."""
        if self.spacing is None or (spacing, epsilon) == (self.spacing, self.epsilon):
            return False
        if self._next_due != -math.inf:
            self._next_due += spacing
        self.spacing, self.epsilon = spacing, epsilon
        self.config = self.config.model_copy(update={"epsilon": epsilon})
        self._build_mechanism()
        return True

    def adopt_range(self, low: float, high: float, *, reports: int = AUTO_REPORTS) -> bool:
        """The fleet's discovered range [low, high] (range discovery's outer ends).

        ``domain = "auto"``: report over it from now on, widened by ``domain_margin`` x
        its width on each side, and further where the mechanism's mean is flat near
        the ends (OGPM), so that the data stay out of them; inside ``initial_domain``.
        ``mechanism = "auto"``: choose again for a fleet of ``reports`` there
        (``mechanism_for_data``).  Returns whether the mechanism changed (its
        parameters make the collector start a new series).
        """
        if not (math.isfinite(low) and math.isfinite(high)) or high < low \
                or not (self.auto_domain or self.config.mechanism == AUTO):
            return False
        self._adopted = (low, high, reports)
        mechanism = mechanism_for_data(
            self.config.mechanism, epsilon=self.config.epsilon, data=(low, high),
            bounds=self.config.start_domain, grid_bits=self.config.grid_bits,
            margin=self.config.domain_margin if self.auto_domain else None,
            reports=max(1, reports), delta=self.config.delta)
        if mechanism == self.mechanism:
            return False
        self.mechanism = mechanism
        return True

    def flat_ends(self, low: float, high: float) -> list[tuple[float, float]]:
        """The parts of [low, high] where the mechanism's mean is flat (classical OGPM
        near the domain's ends, Theorem 3.7): a fleet there is estimated at their edge."""
        return flat_ends(self.mechanism, low, high)

    def flat_regions(self) -> dict[str, tuple[Any, list[tuple[float, float]]]]:
        return {"": (self.mechanism, self.flat_ends(self.mechanism.low, self.mechanism.high))}


class CircularChannel(Channel):
    kind = "circular"
    unit = None  # the mechanism's period says it (config unit "rad" or "deg")

    def __init__(self, config: CircularChannelConfig, **kw):
        super().__init__(config, **kw)
        self.mechanism = CircularOGPM(epsilon=config.epsilon, period=period_of(config.unit),
                                      origin=config.origin, grid_bits=config.grid_bits)


class PolarChannel(Channel):
    kind = "polar"

    def __init__(self, config: PolarChannelConfig, **kw):
        super().__init__(config, **kw)
        self.mechanism = polar_mechanism(epsilon=config.epsilon, radius_max=config.radius_max,
                                         weight=config.weight, period=period_of(config.unit),
                                         origin=config.origin, grid_bits=config.grid_bits,
                                         radius=config.radius_mechanism,
                                         split=config.split)

    def _perturb(self, values, source):
        (radius, angle), clipped = self.mechanism.perturb_codes(values[0], values[1], source,
                                                                return_clipped=True)
        return [radius.tolist(), angle.tolist()], clipped

    def flat_regions(self) -> dict[str, tuple[Any, list[tuple[float, float]]]]:
        radius = self.mechanism.radius_mechanism
        return {"radius": (radius, flat_ends(radius, radius.low, radius.high))}

    @property
    def unit(self) -> str | None:
        """The radius's (the angle's is the period's)."""
        return self.config.radius_unit


def vector_plan(config: VectorChannelConfig) -> tuple[int, float]:
    """(k, epsilon per axis report) for a vector channel.

    'split' is k = d.  'auto' picks the k in 1..d minimising the worst-case
    MSE of one axis' mean: each axis gets k/d of the readings at epsilon/k
    (the k-of-d strategy of Wang et al., Algorithm 3 / Lemma 5, with pure
    epsilon; the collector averages the reports an axis received, so no d/k
    rescaling is needed), so the error is proportional to MSE(eps/k) * d / k.
    Which k wins depends on how the mechanism's error scales with epsilon:

    * error ~ 1/eps**2 (PM, OGPM-U): MSE(eps/k) d/k ~ k d / eps**2, so k = 1;
    * error that saturates at small eps (reports inside the domain: OGPM,
      T-Laplace) favours splitting there, and exponential decay at large eps
      favours k = 1;
    * error with a floor at large eps (Duchi: variance -> 1 - x**2) favours
      splitting there.
    """
    d = len(config.fields)
    if config.strategy == "split":
        return d, split_epsilon(config.epsilon, d)
    if config.strategy == "sample":
        return config.k, split_epsilon(config.epsilon, config.k)

    def score(k: int) -> float:
        mech = linear_mechanism(config.mechanism, epsilon=split_epsilon(config.epsilon, k),
                                low=config.domain[0], high=config.domain[1],
                                grid_bits=min(config.grid_bits, 10))
        return mech.worst_case_error(2) * d / k

    best = min(range(1, d + 1), key=score)
    return best, split_epsilon(config.epsilon, best)


class VectorChannel(Channel):
    """d fields of one source, reported per reading with a scalar mechanism on k of the
    axes (``vector_plan``), or with a mechanism of whole vectors (duchi-vector,
    sampled-duchi: ``edge_agent.mechanisms.multidimensional``), whose own k and (ε, δ)
    are the reading's."""

    kind = "vector"

    def __init__(self, config: VectorChannelConfig, **kw):
        super().__init__(config, **kw)
        self.whole = config.mechanism in VECTOR
        if self.whole:
            self.mechanism = config.build_vector_mechanism()
            self.k = getattr(self.mechanism, "k", len(config.fields))
            axis = getattr(self.mechanism, "axis", None)  # sampled-duchi: each axis' share
            self.axis_epsilon = None if axis is None else axis.epsilon
            return
        self.k, self.axis_epsilon = vector_plan(config)
        self.mechanism = linear_mechanism(config.mechanism, epsilon=self.axis_epsilon,
                                          low=config.domain[0], high=config.domain[1],
                                          grid_bits=config.grid_bits)

    def flat_regions(self) -> dict[str, tuple[Any, list[tuple[float, float]]]]:
        if self.whole:  # every axis' mean is the value itself (unbiased): nothing flat
            return {}
        mechanism = self.mechanism
        return {"each axis": (mechanism, flat_ends(mechanism, mechanism.low, mechanism.high))}

    def _perturb(self, values, source):
        if self.whole:
            codes, clipped = self.mechanism.perturb_codes(np.column_stack(values), source,
                                                          return_clipped=True)
            return [part.tolist() for part in codes], clipped
        d = len(values)
        n = values[0].size
        if self.k == d:
            chosen = np.ones((n, d), dtype=bool)
        else:  # k distinct axes per reading, exactly uniformly
            chosen = random_axes(n, d, self.k, source)
        codes, clipped = [], 0
        for axis in range(d):
            axis_codes, axis_clipped = self.mechanism.perturb_codes(
                values[axis][chosen[:, axis]], source, return_clipped=True)
            codes.append(axis_codes.tolist())
            clipped += axis_clipped
        return codes, clipped

    @property
    def reports_per_reading(self) -> int:
        """k axis reports of the scalar mechanism; one report of a whole-vector one (its
        loss is already the reading's)."""
        return 1 if self.whole else self.k

    def _extra(self):
        return {"fields": list(self.field_names),
                "strategy": {"k": self.k, "d": len(self.field_names),
                             "epsilon": self.epsilon}}


class CategoricalChannel(Channel):
    """Categories of one field (words, integers or bins of a number), reported with a
    frequency oracle (``edge_agent.mechanisms.categorical``)."""

    kind = "categorical"

    def __init__(self, config: CategoricalChannelConfig, **kw):
        super().__init__(config, **kw)
        self.mechanism = config.build_oracle()
        self._unknown = -1 if config.unknown == "drop" else config.labels.index(config.unknown)
        if config.bin_edges is None:
            # Sorted words (or integers) and their category numbers: one searchsorted.
            keys = np.array(config.categories, dtype=object if config.text else np.float64)
            order = np.argsort(keys)
            self._keys, self._numbers = keys[order], order.astype(np.int64)
        if config.memoize:
            # What a memo was drawn for: a change of the categories or of memo_epsilon
            # memoizes every value again (and the lifetime account counts both).
            self._memo_domain = json.dumps({"categories": list(config.labels),
                                            "memo_epsilon": config.memo_epsilon})
            # What one memo reveals about its value, for good (rounded up, as charges).
            self.memo_nano = self.mechanism.memo_loss().ceiling(NANO)

    def _read(self, readings: Readings) -> tuple[list[np.ndarray], np.ndarray]:
        """Category numbers of the rows (``unknown``'s, or -1 where a reading is none of
        them); numbers beyond the bin edges go to the end bins (counted as clipped)."""
        config = self.config
        if config.bin_edges is not None:
            values = readings.column(config.field)
            finite = np.isfinite(values)
            edges = np.asarray(config.bin_edges)
            self.local["clipped"] += int(np.count_nonzero(
                finite & ((values < edges[0]) | (values > edges[-1]))))
            numbers = np.clip(np.searchsorted(edges, values, side="right") - 1, 0,
                              config.count - 1)
            numbers[values == edges[-1]] = config.count - 1
            numbers = np.where(finite, numbers, self._unknown)
        else:
            if config.text:
                values = readings.text_column(config.field)  # words, None where absent
                known = np.not_equal(values, None).astype(bool)
                values = np.where(known, values, "")
            else:
                values = readings.column(config.field)
                known = np.isfinite(values)
            place = np.searchsorted(self._keys, values)
            place = np.minimum(place, self._keys.size - 1)
            known &= self._keys[place] == values
            numbers = np.where(known, self._numbers[place], self._unknown)
        ok = numbers >= 0
        self.local["not_a_category"] += int(numbers.size - np.count_nonzero(ok))
        return [numbers.astype(np.int64)], ok

    def draw_memos(self, tx, rng: Any = None) -> None:
        """Every category's memo, drawn (once, for good) when the categories are
        configured rather than when a value first appears: when a memo is drawn says
        nothing about the wearer's values."""
        if self.config.memoize:
            tx.memo_table(self.agent_id, self.name, self._memo_domain, self.config.labels,
                          lambda new: self.mechanism.memoize(new, rng), self.memo_nano)

    def memoized(self, selection: Selection, allowed: int, tx, rng: Any = None) -> Selection:
        if not self.config.memoize:
            return selection
        values = selection.values[0][:allowed]
        memos = tx.memoize(self.agent_id, self.name, self._memo_domain, self.config.labels,
                           values, lambda new: self.mechanism.memoize(new, rng),
                           self.memo_nano)
        return Selection(selection.times[:allowed], (memos,))

    def _perturb(self, values, source):
        if self.config.memoize:  # values are memos: the instantaneous layer
            return self.mechanism.respond(values[0], source).tolist(), 0
        reports = self.mechanism.perturb(values[0], source)
        if self.mechanism.report_form == "hashed":
            seeds, buckets = reports
            return {"codes": buckets.tolist(), "seeds": seeds.tolist()}, 0
        if self.mechanism.report_form == "category":
            return reports.tolist(), 0
        ones, categories = self.mechanism.sparse(reports)  # unary: the categories per value
        ends = np.cumsum(ones)
        return [categories[end - n:end].tolist() for n, end in zip(ones, ends)], 0

    def _probe(self) -> tuple[np.ndarray, ...]:
        return (np.zeros(4, dtype=np.int64),)


_KINDS = {"linear": LinearChannel, "circular": CircularChannel, "polar": PolarChannel,
          "vector": VectorChannel, "categorical": CategoricalChannel}


def build_channel(config, *, agent_id: str, fleet: str, spacing: float | None = None) -> Channel:
    return _KINDS[config.kind](config, agent_id=agent_id, fleet=fleet, spacing=spacing)


def build_channels(config, agent_id: str) -> list[Channel]:
    """Every channel of an ``AgentConfig``, planned ones with the planner's spacing."""
    plan = config.plan
    return [build_channel(c, agent_id=agent_id, fleet=config.fleet,
                          spacing=plan.channel(c.name).spacing if plan else None)
            for c in config.channels]
