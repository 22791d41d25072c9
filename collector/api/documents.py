"""The collector's aggregates as documents: the HTTP API (docs/reference/API.md).

An estimate (a series' total, or one window's history point) costs EM fits and a
bootstrap, 10-30 ms for a window of a few thousand reports (docs/benchmarks/BENCHMARKS.md),
and is computed once: when its sums change (a window closes, a late report arrives),
and never again for the same sums.  What the sums gave is kept with them
(``Series.summary``, ``Series.points``) and saved with the checkpoint, so a
restarted collector serves its documents at once.

``Snapshots`` (``collector.api.snapshots``) builds the documents once per push
period, in its own thread.  Under the collector's lock it only copies the
aggregates (``Ingestor.copy_aggregates``: what was computed, and the sums of what
changed); it computes outside the lock, most urgent first and within a budget
(``compute``), gives back what it computed (``Ingestor.keep``), and serialises
each document once.  The web server (``collector.api.server``) answers every
request and feeds every event stream from the latest snapshot's bytes; a
document not computed yet says so (``"state": "computing"``).

``Views`` is the collector's source of documents: ``capture``/``documents``
for the snapshots, and ``channels_json``/``channel_json`` computed at once
under the lock (for a collector without a web server, and tests).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import TOTAL, series_type
from collector.api.workers import EstimateWorkers
from collector.estimation.strata import (
    StratumMean,
    WindowMean,
    fleet_windows,
    stratified_mean,
    stratum_weights,
)
from collector.results.durations import duration_name
from collector.results.store import SeriesRecord
from edge_agent.protocol import as_dict

# An agent counts as online if its retained status says so, or, for agents
# without a status, if it sent a report this recently.
ONLINE_SECONDS = 120.0


@dataclass(frozen=True)
class Capture:
    """What a snapshot is computed from, taken quickly under the source's lock."""

    t: float  # the aggregates' time on the source's clock: every document is as of it
    content: Any  # the source's own copy, detached from what keeps changing
    lock_seconds: float = 0.0  # how long taking it held the collector's lock


@dataclass(frozen=True)
class Documents:
    """Every document of the API, computed from one ``Capture``."""

    channels: dict  # GET /api/channels
    channel_details: dict[str, dict]  # GET /api/channels/<name>: the entry plus "windows"
    histories: dict[str, dict]  # GET /api/channels/<name>/history
    range: dict  # GET /api/range
    dead_letters: list[dict]  # GET /api/rejects, as "recent"
    estimates: Estimates | None = None  # what computing them has cost so far (metrics)
    # Per channel, per resolution (seconds): the points of its newest series' windows the
    # live view has (the open ones; the finest level's recent ones), for history queries
    # of the results store (collector.results.query), which has the closed ones.
    open_windows: dict[str, dict[float, list]] = field(default_factory=dict)
    # Per channel with strata (``Strata.open``): the same of each, with its weight, for
    # history queries of the fleet's mean.
    fleet_open: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class Estimates:
    """The estimates a ``Views`` has computed since it started (/metrics)."""

    computed: int  # totals and windows estimated
    seconds: float  # the time that took
    pending: int  # changed, not computed yet (for a later push's budget, or the workers)
    by_workers: int = 0  # of ``computed``, by the worker processes


class SnapshotSource(Protocol):
    """What ``Snapshots`` (and so ``collector.api.server.WebServer``) serves from."""

    def capture(self) -> Capture:
        """Quick, under the source's lock: a copy of what the documents need."""
        ...

    def documents(self, capture: Capture) -> Documents:
        """Slow, without the lock: every document, from ``capture`` alone."""
        ...


# Distinct promises /api/channels lists (the agents' statuses say what they are
# configured with; a fleet normally has one or two, a hostile one could send many).
MAX_PROMISES = 8


def fleet_guarantees(agents: dict) -> dict:
    """What the online agents' statuses say they promise every wearer (configuration
    only, docs/guides/PRIVACY.md): each distinct set of guarantees (shortest window first) with
    how many agents state it, the most common first, at most MAX_PROMISES of them
    (``others``: agents stating one not listed).  An agent from before guarantees states
    its one budget."""
    counts: dict[tuple, int] = {}
    for stats in agents.values():
        status = stats.status
        if status.state != "online":
            continue
        stated = status.guarantees or ([status.budget] if status.budget is not None else [])
        if stated:
            promise = tuple((g.epsilon, g.period, g.delta or 0.0) for g in stated)
            counts[promise] = counts.get(promise, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    listed = [{"agents": count,
               "guarantees": [{"epsilon": epsilon, "per": per,
                               **({"delta": delta} if delta else {})}
                              for epsilon, per, delta in promise]}
              for promise, count in ranked[:MAX_PROMISES]]
    return {"promises": listed, "others": sum(count for _, count in ranked[MAX_PROMISES:])}


def range_document(results: dict, ignored: dict, t: float) -> dict:
    """GET /api/range: the latest range-discovery result per channel and side, and how
    many results were not shown, by reason."""
    return {"t": t, "channels": {name: {side: sides.get(side) for side in ("min", "max")}
                                 for name, sides in sorted(results.items())},
            "ignored": dict(sorted(ignored.items()))}


# -- what to compute, in which order --------------------------------------------------------

# A channel reported by fewer agents than this (a name one device invented, say) waits for
# the others' estimates: it cannot delay them.
FEW_AGENTS = 2
# Compute time a push may spend on estimates, as a share of the push period: the first
# tier (every fleet channel's total and newest window) always completes, the rest goes on
# until this much time has passed since the push began, and what does not fit waits for
# the next push.  With the documents' own time (0.1-0.25 s for 225 channels of an hour's
# history each, measured) a push stays within half its period, so that history left to
# compute does not stretch the period: ``Snapshots`` waits as long as a push worked once
# it worked more than half of it, which made a fleet channel's update wait 3 s behind a
# device flooding invented channels when this was 0.5 s after the first tier.
ESTIMATE_SHARE = 0.3
LATER_AT_LEAST = 32  # later estimates a push copies, whatever the last ones cost


@dataclass
class Plan:
    """What one push computes, in order (``plan``): (series identity, key) pairs, keys as
    ``Series.stale`` names them."""

    first: list[tuple[tuple, int | None]]  # always computed
    later: list[tuple[tuple, int | None]]  # as far as the budget goes
    left: int  # changed, and left for a later push

    def keys(self) -> dict[tuple, list]:
        """The keys per series identity: what ``Ingestor.copy_aggregates`` takes."""
        by_identity: dict[tuple, list] = {}
        for identity, key in (*self.first, *self.later):
            by_identity.setdefault(identity, []).append(key)
        return by_identity


@dataclass
class Work:
    """What one computation did: ``done``, the keys computed per series identity, and
    how long each part took."""

    done: dict[tuple, list] = field(default_factory=dict)
    first_seconds: float = 0.0  # the plan's first part
    later_seconds: float = 0.0  # the rest, within the budget
    left: int = 0  # changed and not computed (at a later push)
    # The later part past the budget (counted in ``left``): what worker processes may take.
    beyond: list[tuple[tuple, Any]] = field(default_factory=list)


def plan(ingestor: Ingestor, later_limit: int | None,
         elsewhere: set[tuple[tuple, Any]] = frozenset()) -> Plan:
    """What to compute of ``ingestor`` (taken under the collector's lock: it costs what
    changed, ``Series.stale``, not what the history holds), most urgent first:

    1. every channel's total and newest window, channels with the most agents first;
    2. the same for channels of fewer than ``FEW_AGENTS`` agents;
    3. older windows, newest first, of the channels of many agents, then of the others.

    The first part is 1; the later part is 2 and 3, at most ``later_limit`` keys (None:
    no limit), none of those computed ``elsewhere`` (worker processes: (identity, key)).
    Of a channel's series only its newest and the strata of its fleet's mean (``strata``)
    are computed (the others show only their counts)."""
    latest = sorted((series for name in ingestor.series for series in strata(ingestor, name)),
                    key=lambda series: -len(series.agents))
    stale = [(series, series.stale()) for series in latest]
    many = [(series, keys) for series, keys in stale if len(series.agents) >= FEW_AGENTS]
    few = [(series, keys) for series, keys in stale if len(series.agents) < FEW_AGENTS]

    def split(series, keys) -> tuple[list, list]:
        newest = max(series.starts, default=None)
        urgent = [key for key in keys if key is TOTAL or key == newest]
        return urgent, [key for key in keys if key is not TOTAL and key != newest]

    first, later, rest = [], [], []
    for series, keys in many:
        urgent, older = split(series, keys)
        first += [(series.identity, key) for key in urgent]
        rest += [(series.identity, key) for key in older]
    for series, keys in few:
        urgent, older = split(series, keys)
        later += [(series.identity, key) for key in urgent]
    later += rest
    for series, keys in few:
        later += [(series.identity, key) for key in split(series, keys)[1]]
    if elsewhere:
        later = [item for item in later if item not in elsewhere]
    total = len(first) + len(later)
    if later_limit is not None:
        later = later[:later_limit]
    return Plan(first=first, later=later, left=total - len(first) - len(later))


def compute(ingestor: Ingestor, work_plan: Plan, budget: float | None) -> Work:
    """Compute ``work_plan`` on ``ingestor`` (a detached copy holding the sums it names):
    its first part to the end, its later part until ``budget`` seconds have passed since
    the first began (None: no limit)."""
    work = Work(left=work_plan.left)

    def run(identity: tuple, key: int | None) -> None:
        ingestor.series[identity[0]][identity].compute(key)
        work.done.setdefault(identity, []).append(key)

    started = time.perf_counter()
    for identity, key in work_plan.first:
        run(identity, key)
    work.first_seconds = time.perf_counter() - started
    deadline = None if budget is None else started + budget
    for i, (identity, key) in enumerate(work_plan.later):
        if deadline is not None and time.perf_counter() > deadline:
            work.beyond = work_plan.later[i:]
            work.left += len(work.beyond)
            break
        run(identity, key)
    work.later_seconds = time.perf_counter() - started - work.first_seconds
    return work


# -- the documents --------------------------------------------------------------------------

def strata(ingestor: Ingestor, name: str) -> list:
    """The series of channel ``name`` that measure what its newest does, newest first: a
    linear channel's in the unit of its newest, whatever their mechanism, ε or domain
    (wearers with guarantees of their own, PRIVACY.md "Wearers' own guarantees"; a domain
    range discovery moved), each a stratum of the fleet's mean (``fleet_mean``); the
    newest alone for the other kinds."""
    by_identity = ingestor.series[name]
    newest = by_identity[ingestor.latest[name]]
    if newest.kind != "linear":
        return [newest]
    return [newest, *(series for series in by_identity.values() if series is not newest
                      and series.kind == "linear" and series.unit == newest.unit)]


@dataclass(frozen=True)
class Strata:
    """A channel's strata (``strata``, two or more), each with its share of the wearers
    (``collector.estimation.strata.stratum_weights``), and the domain of the one of most
    wearers, which every stratum's mean is kept in: a sender may state any domain in its
    own series, and moves the mean of all wearers no more than one wearer can."""

    members: list
    weights: list[float]
    low: float
    high: float

    @classmethod
    def of(cls, ingestor: Ingestor, name: str) -> Strata | None:
        members = strata(ingestor, name)
        if len(members) < 2:
            return None
        weights = stratum_weights([series.agents for series in members])
        low, high = members[weights.index(max(weights))].domain()
        return cls(members, weights, low, high)

    def mean(self) -> dict:
        """The channel's ``fleet_mean``: the totals' (``state`` "computing" while a
        stratum's total is not estimated yet: it is then left out) and each stratum's."""
        described, totals = [], []
        for series, weight in zip(self.members, self.weights):
            mean = (series.summary[1].get("mean") or {}) if series.summary is not None else {}
            estimate = mean.get("estimate")
            totals.append(StratumMean(weight, math.nan, math.nan, math.nan, 0)
                          if estimate is None else
                          StratumMean(weight, estimate, mean["stderr"], mean["bias_bound"],
                                      series.count()))
            described.append({"series": SeriesRecord.of(series).key,
                              "mechanism": as_dict(series.description),
                              "agents": len(series.agents), "weight": weight,
                              "count": series.count(), "estimate": estimate,
                              "stderr": mean.get("stderr"), "bias_bound": mean.get("bias_bound")})
        return {"mean": stratified_mean(totals, low=self.low, high=self.high),
                "strata": described,
                "state": "ready" if all(series.current(TOTAL) for series in self.members)
                else "computing"}

    def windows(self) -> list[dict]:
        """The channel's ``fleet_windows``: each kept window's fleet mean, oldest first."""
        return fleet_windows([(weight, window_means(series.points[start][1]
                                                    for start in series.starts
                                                    if start in series.points))
                              for series, weight in zip(self.members, self.weights)],
                             low=self.low, high=self.high)

    def open(self) -> dict:
        """What a history query of the fleet's mean takes from the live view
        (``collector.results.query``): each stratum's series key, weight and open windows."""
        return {"low": self.low, "high": self.high,
                "strata": [{"series": SeriesRecord.of(series).key, "weight": weight,
                            "open": open_windows(series)}
                           for series, weight in zip(self.members, self.weights)]}


def window_means(points) -> list[WindowMean]:
    """Linear history points (``LinearPoint``) as ``fleet_windows`` takes them."""
    return [WindowMean(point.start, point.end, point.count, point.mean.estimate,
                       point.mean.stderr, point.mean.ci95) for point in points]


def channel_detail(ingestor: Ingestor, name: str, layers: Strata | None = None) -> dict:
    """GET /api/channels/<name>: the channel's entry (its newest series' total estimates
    and latest history point, ``state`` "computing" while they are older than its sums)
    and its kept windows' history points (``windows``); with ``layers``, the channel's
    strata, also the fleet's mean (``fleet_mean``, and ``fleet_windows`` per window)."""
    by_identity = ingestor.series[name]
    latest = ingestor.latest[name]
    series = by_identity[latest]
    detail = series.entry()
    detail["other_series"] = [{"mechanism": as_dict(s.description), "count": s.count()}
                              for identity, s in by_identity.items() if identity != latest]
    newest = max(series.starts, default=None)
    if not all(series.current(start) for start in series.starts):  # the history's
        detail["state"] = "computing"
    # The latest point of the channel's history: the dashboard extends its chart with it.
    detail["window"] = msgspec.to_builtins(series.points[newest][1]) \
        if newest is not None and newest in series.points else None
    detail["windows"] = [series.points[start][1] for start in series.starts
                         if start in series.points]
    detail["series"] = SeriesRecord.of(series).key
    detail["resolutions"] = [duration_name(series.span(level))
                             for level in range(len(series.levels))]
    if layers is not None:
        detail["fleet_mean"], detail["fleet_windows"] = layers.mean(), layers.windows()
        # the latest, for the dashboard to extend its chart of the fleet's mean with
        detail["fleet_window"] = detail["fleet_windows"][-1] if detail["fleet_windows"] \
            else None
    return detail


def open_windows(series) -> dict[float, list]:
    """The points of a series' windows the live view holds, by resolution: the finest
    level's recent ones, and the coarser levels' open ones computed so far."""
    found = {series.span(0): [series.points[start][1] for start in series.starts
                              if start in series.points]}
    for level in range(1, len(series.levels)):
        found[series.span(level)] = [series.coarse_points[(level, start)][1]
                                     for start in series.level_starts(level)
                                     if (level, start) in series.coarse_points]
    return found


def history_document(name: str, detail: dict, window_seconds: float, windows_kept: int,
                     t: float) -> dict:
    """GET /api/channels/<name>/history: the channel's windowed estimates over the kept
    windows (``[aggregates] history_seconds``), oldest first: each window's history point
    (``Series.history_point``).  ``windows_kept``: at most that many (the most recent
    windows with reports), so that a page extending the history with each entry's
    ``window`` keeps what the server keeps.  A channel with strata: also the fleet's mean
    per window (``fleet_points``, extended with each entry's ``fleet_window``)."""
    kind = series_type(detail["kind"])
    units = {key: detail[key] for key in ("unit", "angle_unit") if key in detail}
    return {"channel": name, "kind": detail["kind"], **units, **kind.history_header(detail),
            "t": t, "window_seconds": window_seconds, "windows_kept": windows_kept,
            "state": detail["state"], "series": detail.get("series"), "points": detail["windows"],
            **({"fleet_points": detail["fleet_windows"]} if "fleet_windows" in detail else {})}


class Views:
    """The documents of an ``Ingestor`` (``get_ingestor()``, read under ``lock``).

    What the sums give is computed once and kept with them (``Series.summary`` and
    ``Series.points``, saved with the checkpoint): each push computes what changed, in
    order of priority (``compute``), and the documents are assembled from what is kept.
    ``budget_seconds``: the compute time a push may spend on estimates, the first tier
    included (which always completes; None: no limit); ``ServingFront`` gives
    ESTIMATE_SHARE of the push period."""

    def __init__(self, get_ingestor: Callable[[], Ingestor], lock: threading.RLock | None = None,
                 clock: Callable[[], float] = time.time,
                 broker_status: Callable[[], dict] | None = None,
                 range_results: Callable[[], dict] | None = None,
                 range_ignored: Callable[[], dict] | None = None,
                 extra: Callable[[], dict] | None = None,
                 budget_seconds: float | None = ESTIMATE_SHARE,
                 workers: EstimateWorkers | None = None):
        """``extra``: more top-level fields for /api/channels (the merge view's
        ``partitions`` and ``partition_rejects``, docs/reference/API.md).  ``broker_status``,
        ``range_results`` and ``extra`` keep their own locks: snapshots ask them
        without holding ``lock``.  ``workers``: the history a push's budget leaves goes to
        these processes (started only then: a collector whose pushes keep up has none;
        ``stop`` stops them)."""
        self._get = get_ingestor
        self._extra = extra or dict
        self._lock = lock or threading.RLock()
        self._clock = clock
        self._broker_status = broker_status or (lambda: {"connected": None, "since": None})
        self._range_results = range_results or dict
        self._range_ignored = range_ignored or dict
        self.budget_seconds = budget_seconds
        self.workers = workers
        self.last_work: Work | None = None  # what the latest computation did
        self.estimates = Estimates(computed=0, seconds=0.0, pending=0)

    # -- snapshots (SnapshotSource) ------------------------------------------------------------
    def capture(self) -> Capture:
        with self._lock:
            held = time.perf_counter()
            live = self._get()
            elsewhere = frozenset()
            if self.workers is not None:
                results, seconds = self.workers.finished()
                live.keep_results(results)
                self._count_estimates(len(results), seconds)
                self.estimates = dataclasses.replace(
                    self.estimates, by_workers=self.estimates.by_workers + len(results))
                elsewhere = self.workers.in_flight()
            work_plan = plan(live, self._later_limit(), elsewhere)
            aggregates = live.copy_aggregates(work_plan.keys())
            now = self._clock()
            lock_seconds = time.perf_counter() - held
        context = (self._broker_status(), (self._range_results(), self._range_ignored()),
                   self._extra())
        return Capture(t=now, content=(aggregates, work_plan, *context),
                       lock_seconds=lock_seconds)

    def _later_limit(self) -> int | None:
        """How many of the later estimates a push copies: what its budget is likely to
        compute, twice over (at least ``LATER_AT_LEAST``), and as many as the workers take
        more, so that the copy taken under the lock costs what will be computed."""
        if self.budget_seconds is None:
            return None
        within = LATER_AT_LEAST
        if self.estimates.computed:
            per_estimate = self.estimates.seconds / self.estimates.computed
            within = max(within, math.ceil(2 * self.budget_seconds / max(per_estimate, 1e-4)))
        return within + (self.workers.capacity if self.workers is not None else 0)

    def documents(self, capture: Capture) -> Documents:
        ingestor, work_plan, broker, ranges, extra = capture.content
        self.last_work = work = compute(ingestor, work_plan, self.budget_seconds)
        if self.workers is not None:  # what the budget left, to the workers
            for identity, key in work.beyond:
                self.workers.submit(identity, key,
                                    ingestor.series[identity[0]][identity].bare(key))
            work.left -= len(work.beyond)
        with self._lock:  # kept where the sums have not counted more meanwhile
            self._get().keep(ingestor, work.done)
        self._count_estimates(sum(len(keys) for keys in work.done.values()),
                              work.first_seconds + work.later_seconds)
        pending = work.left + (len(self.workers.in_flight()) if self.workers else 0)
        self.estimates = dataclasses.replace(self.estimates, pending=pending)
        return self._documents(ingestor, capture.t, broker, ranges, extra, self.estimates)

    def _count_estimates(self, computed: int, seconds: float) -> None:
        self.estimates = dataclasses.replace(
            self.estimates, computed=self.estimates.computed + computed,
            seconds=self.estimates.seconds + seconds)

    def stop(self) -> None:
        """Stop the worker processes, if any."""
        if self.workers is not None:
            self.workers.stop()

    # -- documents at once, under the lock --------------------------------------------------------
    def channels_json(self) -> dict:
        """GET /api/channels now, everything computed (for a collector without a web
        server, tools and tests)."""
        return self._at_once().channels

    def channel_json(self, name: str) -> dict | None:
        return self._at_once().channel_details.get(name)

    def _at_once(self) -> Documents:
        with self._lock:
            live = self._get()
            work_plan = plan(live, None)
            ingestor = live.copy_aggregates(work_plan.keys())
            live.keep(ingestor, compute(ingestor, work_plan, None).done)
            return self._documents(ingestor, self._clock(), self._broker_status(),
                                   (self._range_results(), self._range_ignored()),
                                   self._extra())

    # -- building them ----------------------------------------------------------------------
    def _documents(self, ingestor: Ingestor, t: float, broker: dict, ranges: tuple[dict, dict],
                   extra: dict, estimates: Estimates | None = None) -> Documents:
        layered = {name: Strata.of(ingestor, name) for name in ingestor.series}
        details = {name: channel_detail(ingestor, name, layered[name])
                   for name in sorted(ingestor.series)}
        histories = {name: history_document(name, detail, ingestor.window_seconds,
                                            ingestor.keep_windows, t)
                     for name, detail in details.items()}
        windows = {name: open_windows(ingestor.series[name][ingestor.latest[name]])
                   for name in details}
        # An entry of /api/channels is its detail without the windows.
        entries = {name: {key: value for key, value in detail.items()
                          if key not in ("windows", "fleet_windows")}
                   for name, detail in details.items()}
        return Documents(
            channels=self._document(ingestor, t, broker, ranges, extra, entries),
            channel_details=details, histories=histories,
            range=range_document(*ranges, t), dead_letters=list(ingestor.dead_letters),
            estimates=estimates, open_windows=windows,
            fleet_open={name: layers.open() for name, layers in layered.items()
                        if layers is not None})

    def _document(self, ingestor: Ingestor, now: float, broker: dict,
                  ranges: tuple[dict, dict], extra: dict, entries: dict) -> dict:
        """GET /api/channels, with the channels' ``entries`` already computed."""
        return {
            "fleet": ingestor.fleet, "t": now, "broker": broker,
            "agents_online": sum(self.online(s, now) for s in ingestor.agents.values()),
            "agents": {name: {"online": self.online(s, now), "messages": s.messages,
                              "values": s.values, "last_seen": s.last_seen,
                              "rejects": s.rejects, "duplicates": s.duplicates}
                       for name, s in sorted(ingestor.agents.items())},
            "ingest": {**ingestor.counters, "rejects": dict(ingestor.rejects)},
            "guarantees": fleet_guarantees(ingestor.agents),
            "channels": entries,
            "range": range_document(*ranges, now)["channels"],
            "range_ignored": dict(ranges[1]),
            **extra,
        }

    @staticmethod
    def online(stats, now: float) -> bool:
        if stats.online is not None:
            return stats.online
        return stats.last_seen is not None and now - stats.last_seen < ONLINE_SECONDS
