"""GET /api/channels/<name>/history?resolution=&start=&end=[&format=csv][&series=]: a
channel's windows at one resolution over a time range, from the results store and, for
the windows still open, from the live view (docs/reference/API.md).

Every parameter is checked before anything is read, and a bad one is named in the error
(``QueryError``: the server answers 400).  A query returns at most ``MAX_POINTS`` windows,
read through the store's index: its cost follows the windows returned, never the study's
length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from collector.estimation.strata import WindowMean, fleet_windows
from collector.results import table
from collector.results.durations import duration_name
from collector.results.store import ResultsStore, StoreError
from collector.storage.states import StoredSeries, decode_stored_series, decode_window_point
from edge_agent.protocol import as_dict, mechanism_of

MAX_POINTS = 10_000  # windows one query may span
DEFAULT_WINDOWS = 60  # without a start: this many windows before the end
PARAMETERS = ("resolution", "start", "end", "format", "series")
FORMATS = ("json", "csv")
MAX_TIME = 1e11  # Unix seconds: about the year 5000
CSV_TYPE = "text/csv; charset=utf-8"
FLEET = "fleet"  # series=fleet: the fleet's mean over a channel's strata


class QueryError(ValueError):
    """A parameter that cannot be answered: ``parameter`` names it."""

    def __init__(self, parameter: str, message: str):
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


@dataclass(frozen=True)
class HistoryRequest:
    resolution: str
    span: float
    start: float
    end: float
    format: str
    series: str | None

    @property
    def first(self) -> int:
        """The number of the first window that overlaps [start, end)."""
        return math.floor(self.start / self.span)

    @property
    def last(self) -> int:
        return math.ceil(self.end / self.span) - 1


def parse_request(params: Mapping[str, str], *, spans: list[float], now: float) \
        -> HistoryRequest:
    """The request's parameters, checked (``QueryError`` naming the first bad one)."""
    for name in params:
        if name not in PARAMETERS:
            raise QueryError(name[:64], f"unknown parameter (expected {', '.join(PARAMETERS)})")
    names = {duration_name(span): span for span in spans}
    resolution = params.get("resolution", duration_name(spans[0]))
    if resolution not in names:
        raise QueryError("resolution", f"expected one of {', '.join(names)}, got "
                                       f"{resolution[:32]!r}")
    span = names[resolution]
    end = _time(params, "end", now)
    start = _time(params, "start", end - DEFAULT_WINDOWS * span)
    if not start < end:
        raise QueryError("start", "must be before end")
    if (end - start) / span > MAX_POINTS:
        raise QueryError("end", f"at most {MAX_POINTS} windows of {resolution} at once: "
                                f"narrow start .. end, or ask a coarser resolution")
    output = params.get("format", "json")
    if output not in FORMATS:
        raise QueryError("format", f"expected one of {', '.join(FORMATS)}")
    series = params.get("series")
    if series is not None and series != FLEET and not (
            len(series) == 32 and all(c in "0123456789abcdef" for c in series)):
        raise QueryError("series", f"expected a series key as the history lists them, or "
                                   f"{FLEET!r}")
    return HistoryRequest(resolution, span, start, end, output, series)


def _time(params: Mapping[str, str], name: str, default: float) -> float:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= MAX_TIME):
        raise QueryError(name, f"expected Unix seconds (0 .. {MAX_TIME:.0f}), got "
                               f"{text[:32]!r}")
    return value


class HistoryQuery:
    """Answers history requests from ``store`` and the live view."""

    def __init__(self, store: ResultsStore, spans: list[float]):
        self.store, self.spans = store, spans

    def run(self, channel: str, request: HistoryRequest, live: dict | None) \
            -> tuple[bytes, str] | None:
        """(body, media type), or None if no series of the channel is known.  ``live``: the
        live history document of the channel (its series key, kind, units, labels and
        open windows' points by span), if the collector has the channel."""
        found = self.select(channel, request, live)
        if found is None:
            return None
        header, points, others = found
        if request.format == "csv":
            return table.to_csv(points, table_columns(header)).encode(), CSV_TYPE
        document = {"channel": channel, **header, "resolution": request.resolution,
                    "window_seconds": request.span, "start": request.start,
                    "end": request.end, "other_series": others, "points": points}
        return msgspec.json.encode(document), "application/json"

    def select(self, channel: str, request: HistoryRequest, live: dict | None) \
            -> tuple[dict, list[dict], list[dict]] | None:
        """(the series' header: kind, units, labels, fields and key; its windows' points,
        oldest first; the channel's other series), or None if it has none.  ``series``
        "fleet": the fleet's mean over the channel's strata (``fleet``)."""
        known = self.store.series_of(channel)
        if request.series == FLEET:
            return self.fleet(request, live, known)
        key = request.series or (live or {}).get("series") or \
            (known[0][0].key if known else None)
        record = next((record for record, _ in known if record.key == key), None)
        if key is None or (record is None and (live is None or live.get("series") != key)):
            if request.series is not None:
                raise QueryError("series", "not a series of the channel")
            return None
        is_live = live is not None and live.get("series") == key
        # the windows still open from the live view (the store has the closed ones): the
        # newest series', or a stratum's of the fleet's mean
        opened = live.get("open", {}) if is_live else next(
            (stratum["open"] for stratum in ((live or {}).get("fleet") or {}).get("strata", [])
             if stratum["series"] == key), {})
        points = self._points(record, request, opened.get(request.span, []))
        header = {**_header(live if is_live else None, record), "series": key}
        return header, points, _others(known, key)

    def fleet(self, request: HistoryRequest, live: dict | None, known: list) \
            -> tuple[dict, list[dict], list[dict]]:
        """The fleet's mean of each window over the channel's strata, weighed as the live
        view weighs them now (``collector.api.documents.Strata``; the weights come from
        the agents each series has heard, which the store does not keep)."""
        if live is None:
            raise QueryError("series", "the fleet's mean comes from a running collector "
                                       "(GET /api/channels/<name>/history?series=fleet): the "
                                       "results store does not keep the agents that weigh it")
        fleet = live.get("fleet")
        if fleet is None:
            raise QueryError("series", "no fleet mean: the channel's wearers report under one "
                                       "guarantee, or this collector does not hold the channel")
        records = {record.key: record for record, _ in known}
        strata = []
        for stratum in fleet["strata"]:
            points = self._points(records.get(stratum["series"]), request,
                                  stratum["open"].get(request.span, []))
            strata.append((stratum["weight"], [
                WindowMean(point["start"], point["end"], point["count"],
                           point["mean"]["estimate"], point["mean"]["stderr"],
                           point["mean"]["ci95"]) for point in points]))
        header = {"kind": "linear", "series": FLEET,
                  **({"unit": live["unit"]} if "unit" in live else {})}
        return header, fleet_windows(strata, low=fleet["low"], high=fleet["high"]), \
            _others(known, None)

    def _points(self, record, request: HistoryRequest, open_points: list) -> list[dict]:
        """A series' windows in the request's range, oldest first: the store's (``record``
        None: none) and then those of ``open_points`` (live, still open) it lacks."""
        points = {} if record is None else {
            row.start: _stored_point(record.kind, row.point)
            for row in self.store.windows(record.key, request.span, request.first,
                                          request.last, MAX_POINTS + 1)}
        for point in open_points:
            point = msgspec.to_builtins(point)
            start = round(point["start"] / request.span)
            if request.first <= start <= request.last:
                points.setdefault(start, point)
        return [points[start] for start in sorted(points)]


def _others(known: list, key: str | None) -> list[dict]:
    """The channel's stored series but ``key``."""
    return [{"series": other.key, "mechanism": as_dict(_stored_series(other).mechanism),
             "newest_end": newest} for other, newest in known if other.key != key]


def table_columns(header: dict) -> list[table.Column]:
    """The table's columns for a series (``HistoryQuery.select``'s header)."""
    return table.columns(header["kind"], fields=header.get("fields"),
                         labels=header.get("labels"))


def _header(live: dict | None, record) -> dict:
    """The kind, units, labels and fields of the series (from the live document, or from
    the store's description of it)."""
    if live is not None:
        return {name: live[name] for name in ("kind", "unit", "angle_unit", "labels", "fields")
                if name in live}
    description = _stored_series(record)
    header = {"kind": record.kind, "unit": description.unit}
    if description.fields:
        header["fields"] = list(description.fields)
    if record.kind == "categorical":
        oracle = mechanism_of(description.mechanism)
        header["labels"] = [oracle.label(v) for v in range(oracle.categories)]
    return header


def _stored_series(record) -> StoredSeries:
    try:
        return decode_stored_series(record.description)
    except msgspec.DecodeError as exc:
        raise StoreError(f"series {record.key}: {exc}") from None


def _stored_point(kind: str, payload: bytes) -> dict:
    try:
        return msgspec.to_builtins(decode_window_point(kind, payload))
    except msgspec.DecodeError as exc:
        raise StoreError(f"a {kind} window's estimates: {exc}") from None
