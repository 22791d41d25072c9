"""The collector's aggregates as documents: the HTTP API (docs/API.md).

Computing the documents is slow: every series' EMS reconstruction (with a
parametric bootstrap where the mean is not affine), for the cumulative
statistics and for every kept window, takes about 0.1 s for a handful of
channels when the windows' results are cached and seconds when they are not.
The aggregates are shared with the aggregation loop under one lock, so
computing them per request, under that lock, let every viewer slow ingestion.

``Snapshots`` (``collector.api.snapshots``) therefore computes every document
once per push period, in its own thread.  Under the collector's lock it only
copies the aggregates (``Ingestor.copy_aggregates``: their sums, a few
milliseconds); it computes outside the lock, reusing the previous copy's results
for the windows that did not change (``Series.adopt_computed``), and serialises
each document once.  The web server (``collector.api.server``) answers
every request and feeds every event stream from the latest snapshot's bytes.

``Views`` is the collector's source of documents: ``capture``/``documents``
for the snapshots, and ``channels_json``/``channel_json`` computed at once
under the lock (for a collector without a web server, and tests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import Series, series_type
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


class SnapshotSource(Protocol):
    """What ``Snapshots`` (and so ``collector.api.server.WebServer``) serves from."""

    def capture(self) -> Capture:
        """Quick, under the source's lock: a copy of what the documents need."""
        ...

    def documents(self, capture: Capture) -> Documents:
        """Slow, without the lock: every document, from ``capture`` alone."""
        ...


def range_document(results: dict, ignored: dict, t: float) -> dict:
    """GET /api/range: the latest range-discovery result per channel and side, and how
    many results were not shown, by reason."""
    return {"t": t, "channels": {name: {side: sides.get(side) for side in ("min", "max")}
                                 for name, sides in sorted(results.items())},
            "ignored": dict(sorted(ignored.items()))}


# -- the history: each kept window's estimates, reduced to what a chart over time draws ---------

def history_document(name: str, detail: dict, window_seconds: float, windows_kept: int,
                     t: float) -> dict:
    """GET /api/channels/<name>/history: the channel's windowed estimates over the kept
    windows (``[aggregates] history_seconds``), oldest first, each reduced by the kind's
    series class (``Series.history_point``).  ``windows_kept``: at most that many (the
    most recent windows with reports), so that a page extending the history with each
    entry's ``window`` keeps what the server keeps."""
    kind = series_type(detail["kind"])
    units = {key: detail[key] for key in ("unit", "angle_unit") if key in detail}
    return {"channel": name, "kind": detail["kind"], **units, **kind.history_header(detail),
            "t": t, "window_seconds": window_seconds, "windows_kept": windows_kept,
            "points": [kind.history_point(window) for window in detail["windows"]]}


class Views:
    """The documents of an ``Ingestor`` (``get_ingestor()``, read under ``lock``)."""

    def __init__(self, get_ingestor: Callable[[], Ingestor], lock: threading.RLock | None = None,
                 clock: Callable[[], float] = time.time,
                 broker_status: Callable[[], dict] | None = None,
                 range_results: Callable[[], dict] | None = None,
                 range_ignored: Callable[[], dict] | None = None,
                 extra: Callable[[], dict] | None = None):
        """``extra``: more top-level fields for /api/channels (the merge view's
        ``partitions`` and ``partition_rejects``, docs/API.md).  ``broker_status``,
        ``range_results`` and ``extra`` keep their own locks: snapshots ask them
        without holding ``lock``."""
        self._get = get_ingestor
        self._extra = extra or dict
        self._lock = lock or threading.RLock()
        self._clock = clock
        self._broker_status = broker_status or (lambda: {"connected": None, "since": None})
        self._range_results = range_results or dict
        self._range_ignored = range_ignored or dict
        self._earlier: dict[tuple, Series] = {}  # the last documents' series, by identity

    # -- snapshots (SnapshotSource) ------------------------------------------------------------
    def capture(self) -> Capture:
        with self._lock:
            held = time.perf_counter()
            aggregates = self._get().copy_aggregates()
            now = self._clock()
            lock_seconds = time.perf_counter() - held
        context = (self._broker_status(), (self._range_results(), self._range_ignored()),
                   self._extra())
        return Capture(t=now, content=(aggregates, *context), lock_seconds=lock_seconds)

    def documents(self, capture: Capture) -> Documents:
        ingestor, broker, ranges, extra = capture.content
        series = {identity: one for by_identity in ingestor.series.values()
                  for identity, one in by_identity.items()}
        for identity, one in series.items():
            earlier = self._earlier.get(identity)
            if earlier is not None:
                one.adopt_computed(earlier)
        details = {name: self._channel(ingestor, name, windows=True)
                   for name in sorted(ingestor.series)}
        histories = {name: history_document(name, detail, ingestor.window_seconds,
                                            ingestor.keep_windows, capture.t)
                     for name, detail in details.items()}
        # An entry of /api/channels is its detail without the windows (computed once).
        entries = {name: {key: value for key, value in detail.items() if key != "windows"}
                   for name, detail in details.items()}
        self._earlier = series
        return Documents(
            channels=self._document(ingestor, capture.t, broker, ranges, extra, entries),
            channel_details=details, histories=histories,
            range=range_document(*ranges, capture.t), dead_letters=list(ingestor.dead_letters))

    # -- documents at once, under the lock --------------------------------------------------------
    def channels_json(self) -> dict:
        with self._lock:
            ingestor = self._get()
            entries = {name: self._channel(ingestor, name, windows=False)
                       for name in sorted(ingestor.series)}
            return self._document(ingestor, self._clock(), self._broker_status(),
                                  (self._range_results(), self._range_ignored()),
                                  self._extra(), entries)

    def channel_json(self, name: str) -> dict | None:
        with self._lock:
            ingestor = self._get()
            if name not in ingestor.series:
                return None
            return self._channel(ingestor, name, windows=True)

    # -- building them ----------------------------------------------------------------------
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

    @staticmethod
    def _channel(ingestor: Ingestor, name: str, *, windows: bool) -> dict:
        by_identity = ingestor.series[name]
        latest = ingestor.latest[name]
        series = by_identity[latest]
        view = series.get(windows=windows)
        view["other_series"] = [{"mechanism": as_dict(s.description), "count": s.count()}
                                for identity, s in by_identity.items() if identity != latest]
        # The latest point of the channel's history: the dashboard extends its chart with it.
        newest = view["windows"][-1:] if windows else \
            [series.window_view(max(series.windows))] if series.windows else []
        view["window"] = series.history_point(newest[0]) if newest else None
        return view
