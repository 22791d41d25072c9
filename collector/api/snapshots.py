"""Snapshots: every document of the API computed once per push period, in a thread of its
own, and serialised once for every request and event stream.

Under the collector's lock a snapshot only takes a copy of the aggregates
(``SnapshotSource.capture``); it computes the documents outside the lock
(``SnapshotSource.documents``), so no number of viewers slows ingestion.

A channel's history points, most of its documents' bytes, are serialised once: each is
computed once and kept (the same object from push to push while its sums stay), so the
JSON of a channel's points is kept with the points it was written from and written again
only when one of them is another object (``_points_json``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from prometheus_client.core import Metric

from collector.api.documents import Documents, SnapshotSource
from collector.api.metrics import document_metrics
from collector.estimation.jsonsafe import to_json

log = logging.getLogger(__name__)

STOP_JOIN_SECONDS = 2.0  # how long stop() waits for a computation under way


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
    one succeeds) and is logged once per failing streak.  Every callback given to
    ``subscribe`` is called after every attempt, from the computing thread."""

    def __init__(self, source: SnapshotSource, *, push_seconds: float):
        if not push_seconds > 0:
            raise ValueError(f"push_seconds must be > 0, got {push_seconds}")
        self.source = source
        self.push_seconds = float(push_seconds)
        self._subscribers: list[Callable[[], None]] = []
        self.latest: Snapshot | None = None
        self.failing = False
        self.errors = 0  # failed computations
        self._computing = threading.Lock()  # one computation at a time
        # Per channel: the history points last serialised (held, so that each is the
        # object it was while compared by identity) and their JSON.
        self._points: dict[str, tuple[tuple, msgspec.Raw]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every attempt (set before ``start``)."""
        self._subscribers.append(callback)

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
                details = {name: self._with_points(name, detail, "windows")
                           for name, detail in documents.channel_details.items()}
                histories = {name: self._with_points(name, history, "points")
                             for name, history in documents.histories.items()}
                self._points = {name: self._points[name] for name in self._points
                                if name in details or name in histories}
                snapshot = Snapshot(
                    t=capture.t, channels=to_json(documents.channels),
                    channel_details=details, histories=histories,
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
        for callback in self._subscribers:
            callback()
        return snapshot

    def _with_points(self, name: str, document: dict, key: str) -> bytes:
        """The JSON of a channel's ``document``, its history points (under ``key``) from
        ``_points_json``."""
        if not isinstance(document.get(key), list):
            return to_json(document)
        return to_json({**document, key: self._points_json(name, document[key])})

    def _points_json(self, name: str, points: list) -> msgspec.Raw:
        """The JSON of a channel's history points (its detail's ``windows``, its history's
        ``points``: the same list), written again only where a point is not the object
        last written."""
        kept = self._points.get(name)
        if kept is not None and len(kept[0]) == len(points) and all(
                old is new for old, new in zip(kept[0], points)):
            return kept[1]
        raw = msgspec.Raw(to_json(points))
        self._points[name] = (tuple(points), raw)
        return raw
