"""The collector's aggregates as documents: the HTTP API (docs/API.md) and Prometheus metrics.

Computing the documents is slow: every series' EMS reconstruction (with a
parametric bootstrap where the mean is not affine), for the cumulative
statistics and for every kept window, takes about 0.1 s for a handful of
channels when the windows' results are cached and seconds when they are not.
The aggregates are shared with the aggregation loop under one lock, so
computing them per request, under that lock, let every viewer slow ingestion.

``Snapshots`` therefore computes every document once per push period, in its
own thread.  Under the collector's lock it only takes the aggregates' typed
state (``Ingestor.to_state``: a few milliseconds); it rebuilds the aggregates
from that copy and computes outside the lock, reusing the previous copy's
results for the windows that did not change (``Series.adopt_computed``), and
serialises each document once.  The web server (``collector.api.server``) answers
every request and feeds every event stream from the latest snapshot's bytes.

``Views`` is the collector's source of documents: ``capture``/``documents``
for the snapshots, and ``channels_json``/``channel_json`` computed at once
under the lock (for a collector without a web server, and tests).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import Series
from collector.estimation.jsonsafe import to_json
from edge_agent.protocol import as_dict

log = logging.getLogger(__name__)

# An agent counts as online if its retained status says so, or, for agents
# without a status, if it sent a report this recently.
ONLINE_SECONDS = 120.0
STOP_JOIN_SECONDS = 2.0  # how long stop() waits for a computation under way


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

def _mean_point(view: dict) -> dict:
    mean = view.get("mean") or {}
    return {"mean": {key: mean.get(key) for key in ("estimate", "stderr", "ci95")}}


def _direction_point(view: dict) -> dict:
    direction = view.get("direction") or {}
    return {"circular_mean": view.get("circular_mean"),
            "half_width": direction.get("half_width"), "ci95": direction.get("ci95"),
            "resultant_length": (view.get("resultant_length") or {}).get("estimate")}


def history_point(kind: str, window: dict) -> dict:
    """One window of GET /api/channels/<name>: its span, count and estimates with their
    intervals (no histograms), in the shape the channel's entry has them."""
    point = {"start": window["start"], "end": window["end"], "count": window["count"]}
    if kind == "linear":
        point.update(_mean_point(window))
    elif kind == "circular":
        point.update(_direction_point(window))
    elif kind == "polar":
        point["radius"] = _mean_point(window["radius"])
        point["angle"] = _direction_point(window["angle"])
    elif kind == "vector":
        point["axes"] = {axis: {"count": view["count"], **_mean_point(view)}
                         for axis, view in window["axes"].items()}
    else:
        frequencies = window.get("frequencies") or {}
        point["frequencies"] = {key: frequencies.get(key)
                                for key in ("shares", "estimate", "ci95")}
    return point


def history_document(name: str, detail: dict, window_seconds: float, windows_kept: int,
                     t: float) -> dict:
    """GET /api/channels/<name>/history: the channel's windowed estimates over the kept
    windows (``[aggregates] history_seconds``), oldest first.  ``windows_kept``: at most
    that many (the most recent windows with reports), so that a page extending the
    history with each entry's ``window`` keeps what the server keeps."""
    units = {key: detail[key] for key in ("unit", "angle_unit") if key in detail}
    extra = {"labels": (detail.get("frequencies") or {}).get("labels")} \
        if detail["kind"] == "categorical" else {}
    return {"channel": name, "kind": detail["kind"], **units, **extra, "t": t,
            "window_seconds": window_seconds, "windows_kept": windows_kept,
            "points": [history_point(detail["kind"], window) for window in detail["windows"]]}


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
            state = self._get().to_state()
            now = self._clock()
            lock_seconds = time.perf_counter() - held
        context = (self._broker_status(), (self._range_results(), self._range_ignored()),
                   self._extra())
        return Capture(t=now, content=(state, *context), lock_seconds=lock_seconds)

    def documents(self, capture: Capture) -> Documents:
        state, broker, ranges, extra = capture.content
        ingestor = Ingestor.from_state(state)
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
        view["window"] = history_point(series.kind, newest[0]) if newest else None
        return view


# -- Prometheus ---------------------------------------------------------------------------------

CHANNEL_GAUGES = {
    "ldp_channel_count": ("Values accepted per channel.", lambda c: c["count"]),
    "ldp_channel_mean_estimate": ("Estimated true mean (linear channels).",
                                  lambda c: (c.get("mean") or {}).get("estimate")),
    "ldp_channel_mean_stderr": ("Standard error of the mean estimate.",
                                lambda c: (c.get("mean") or {}).get("stderr")),
    "ldp_channel_resultant_length": ("Estimated mean resultant length (circular channels; "
                                     "bias-corrected, over rho, may exceed 1 by noise).",
                                     lambda c: (c.get("resultant_length") or {}).get("estimate")),
    "ldp_channel_resultant_length_stderr": (
        "Standard error of the mean resultant length estimate (circular channels).",
        lambda c: (c.get("resultant_length") or {}).get("stderr")),
    "ldp_channel_circular_mean": ("Mean direction (circular channels), in the channel's unit.",
                                  lambda c: c.get("circular_mean")),
    "ldp_channel_circular_mean_half_width": (
        "Half-width of the mean direction's 95% interval (circular channels; absent where "
        "the reports give no direction).",
        lambda c: (c.get("direction") or {}).get("half_width")),
    # A polar channel's two components: the radius as a linear channel, the angle as a
    # circular one.
    "ldp_channel_radius_mean_estimate": (
        "Estimated true mean of the radius (polar channels).",
        lambda c: ((c.get("radius") or {}).get("mean") or {}).get("estimate")),
    "ldp_channel_radius_mean_stderr": (
        "Standard error of the radius mean estimate (polar channels).",
        lambda c: ((c.get("radius") or {}).get("mean") or {}).get("stderr")),
    "ldp_channel_angle_circular_mean": (
        "Mean direction of the angle (polar channels), in its unit.",
        lambda c: (c.get("angle") or {}).get("circular_mean")),
    "ldp_channel_angle_circular_mean_half_width": (
        "Half-width of the angle's mean direction 95% interval (polar channels).",
        lambda c: ((c.get("angle") or {}).get("direction") or {}).get("half_width")),
    "ldp_channel_angle_resultant_length": (
        "Estimated mean resultant length of the angle (polar channels).",
        lambda c: ((c.get("angle") or {}).get("resultant_length") or {}).get("estimate")),
}
# A vector channel's axes: (help, the key in the axis's "mean").
AXIS_GAUGES = {
    "ldp_channel_axis_mean_estimate": ("Estimated true mean of each axis (vector channels).",
                                       "estimate"),
    "ldp_channel_axis_mean_stderr": ("Standard error of each axis's mean estimate.", "stderr"),
}


def document_metrics(document: dict) -> list[Metric]:
    """The metric families of an /api/channels document (names in docs/API.md).

    A counter family is named with its ``_total``: prometheus_client takes the
    suffix off the family and puts it back on the sample and its HELP/TYPE."""
    ingest = document["ingest"]
    families: list[Metric] = [
        CounterMetricFamily("ldp_ingest_messages_total", "Report messages accepted.",
                            value=ingest["messages"]),
        CounterMetricFamily("ldp_ingest_values_total", "Perturbed values accepted.",
                            value=ingest["values"]),
        CounterMetricFamily("ldp_ingest_duplicates_total",
                            "Redelivered or replayed messages ignored.",
                            value=ingest["duplicates"]),
        _labelled(CounterMetricFamily, "ldp_ingest_rejects_total",
                  "Messages rejected, by reason.", "reason", ingest["rejects"]),
    ]
    families.append(_labelled(CounterMetricFamily, "ldp_range_results_ignored_total",
                              "Range results not shown, by reason.", "reason",
                              document.get("range_ignored", {})))
    connected = document["broker"]["connected"]
    if connected is not None:
        families.append(GaugeMetricFamily("ldp_broker_connected",
                                          "1 while the collector holds its subscription.",
                                          value=int(connected)))
    families.append(GaugeMetricFamily("ldp_agents_online", "Agents online.",
                                      value=document["agents_online"]))
    if "partitions" in document:  # the merge view
        families += [
            _labelled(GaugeMetricFamily, "ldp_partition_state_age_seconds",
                      "Age of each partition's latest state.", "partition",
                      {name: partition["age"]
                       for name, partition in document["partitions"].items()}),
            _labelled(CounterMetricFamily, "ldp_partition_state_rejects_total",
                      "Partition states rejected, by reason.", "reason",
                      document["partition_rejects"]),
        ]
    for metric, (help_text, extract) in CHANNEL_GAUGES.items():
        families.append(_labelled(GaugeMetricFamily, metric, help_text, "channel",
                                  {name: extract(channel)
                                   for name, channel in document["channels"].items()}))
    families += category_metrics(document["channels"])
    families += axis_metrics(document["channels"])
    families.append(info_metric(document["channels"]))
    return families


def info_metric(channels: dict) -> Metric:
    """``ldp_channel_info{channel,kind,unit,angle_unit} 1``: what each channel's values
    are measured in, to join on (label values: bounded names and units from reports)."""
    family = GaugeMetricFamily("ldp_channel_info", "Each channel's kind and units (always 1).",
                               labels=["channel", "kind", "unit", "angle_unit"])
    for name, channel in sorted(channels.items()):
        family.add_metric([name, channel["kind"], channel.get("unit") or "",
                           channel.get("angle_unit") or ""], 1)
    return family


def axis_metrics(channels: dict) -> list[Metric]:
    families = []
    for metric, (help_text, key) in AXIS_GAUGES.items():
        family = GaugeMetricFamily(metric, help_text, labels=["channel", "axis"])
        for name, channel in sorted(channels.items()):
            for axis, view in sorted((channel.get("axes") or {}).items()):
                value = (view.get("mean") or {}).get(key)
                if value is not None:
                    family.add_metric([name, axis], value)
        families.append(family)
    return families


# Per category of a categorical channel: (help, the key in its "frequencies").
CATEGORY_GAUGES = {
    "ldp_channel_category_share": ("Consistent share of each category (non-negative, "
                                   "summing to 1).", "shares"),
    "ldp_channel_category_estimate": ("Unbiased estimate of each category's share.",
                                      "estimate"),
    "ldp_channel_category_stderr": ("Standard error of the unbiased share.", "stderr"),
}
# A channel with more categories is left out of /metrics (one series per category).
METRIC_CATEGORIES_MAX = 64


def category_metrics(channels: dict) -> list[Metric]:
    families = []
    for metric, (help_text, key) in CATEGORY_GAUGES.items():
        family = GaugeMetricFamily(metric, help_text, labels=["channel", "category"])
        for name, channel in sorted(channels.items()):
            frequencies = channel.get("frequencies")
            if not frequencies or len(frequencies["labels"]) > METRIC_CATEGORIES_MAX:
                continue
            for label, value in zip(frequencies["labels"], frequencies[key]):
                if value is not None:
                    family.add_metric([name, label], value)
        families.append(family)
    return families


def _labelled(family_type, name: str, help_text: str, label: str, values: dict) -> Metric:
    """A family with one sample per label value (sorted), leaving out None values."""
    family = family_type(name, help_text, labels=[label])
    for key, value in sorted(values.items()):
        if value is not None:
            family.add_metric([key], value)
    return family


# -- snapshots ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """Every document as of ``t``, serialised once for every request and event stream."""

    t: float  # the aggregates' time (the source's clock)
    channels: bytes  # JSON of GET /api/channels
    channel_details: dict[str, bytes]  # JSON of GET /api/channels/<name>, by name
    histories: dict[str, bytes]  # JSON of GET /api/channels/<name>/history, by name
    range: bytes  # JSON of GET /api/range
    rejects: bytes  # JSON of GET /api/rejects
    metrics: tuple[Metric, ...]  # the documents' families for /metrics
    documents: Documents  # what they were serialised from (the retained MQTT snapshots)
    lock_seconds: float  # how long taking it held the collector's lock
    compute_seconds: float  # taking, computing and serialising it
    taken: float = field(default_factory=time.monotonic)  # when it was ready (monotonic)


class Snapshots:
    """The latest ``Snapshot`` of a source, refreshed every ``push_seconds`` in a thread.

    A failing computation keeps the previous snapshot (``failing`` is set until
    one succeeds) and is logged once per failing streak.  ``on_publish`` is
    called after every attempt, from the computing thread."""

    def __init__(self, source: SnapshotSource, *, push_seconds: float,
                 on_publish: Callable[[], None] | None = None):
        self.source = source
        self.push_seconds = push_seconds
        self.on_publish = on_publish
        self.latest: Snapshot | None = None
        self.failing = False
        self.errors = 0  # failed computations
        self._computing = threading.Lock()  # one computation at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Compute the first snapshot now, then every push period, in a thread."""
        if self._thread is not None:
            raise RuntimeError("Snapshots already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="collector-snapshots",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(STOP_JOIN_SECONDS)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.refresh()
            busy = time.monotonic() - started
            # At most half the time busy: a computation longer than the push period
            # would otherwise run back to back and keep a core from ingestion.
            self._stop.wait(max(self.push_seconds - busy, busy))

    def refresh(self) -> Snapshot | None:
        """Compute a snapshot now; the new one, or None if that failed."""
        with self._computing:
            started = time.perf_counter()
            try:
                capture = self.source.capture()
                documents = self.source.documents(capture)
                snapshot = Snapshot(
                    t=capture.t, channels=to_json(documents.channels),
                    channel_details={name: to_json(detail)
                                     for name, detail in documents.channel_details.items()},
                    histories={name: to_json(history)
                               for name, history in documents.histories.items()},
                    range=to_json(documents.range),
                    rejects=to_json({"recent": documents.dead_letters}),
                    metrics=tuple(document_metrics(documents.channels)),
                    documents=documents, lock_seconds=capture.lock_seconds,
                    compute_seconds=time.perf_counter() - started)
            except Exception:
                self.errors += 1
                if not self.failing:
                    log.exception("computing the API documents failed; the previous ones "
                                  "are served until it succeeds")
                self.failing, snapshot = True, None
            else:
                if self.failing:
                    log.info("the API documents are computed again")
                self.latest, self.failing = snapshot, False
        if self.on_publish is not None:
            self.on_publish()
        return snapshot
