"""Writing closed windows to the results store, and applying each resolution's retention.

The collector closes windows at each checkpoint (``Ingestor.close_windows``): the
checkpoint keeps them as a numbered batch (``pending``) until the store has them, so a
closed window is always in the checkpoint or in the store, whatever stops the collector.
The recorder, in its own thread, writes every pending batch in one transaction with its
number, then tells the ingestor (``Ingestor.written``).  A batch written before a crash,
and so still pending after the restart, is recognised by its number and skipped.

A *delta* window (late reports of a window already stored) is merged with the stored sums
here, and estimated from the merge: the stored window is then exactly what one window of
all its reports would be.  Other windows reuse the estimates the live view computed
where they are of the same sums, and are estimated here otherwise (off the collector's
lock, so ingestion goes on meanwhile).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import ClosedWindow
from collector.results.store import ResultsStore, SeriesRecord, WindowRow
from edge_agent.common.memory import release_freed_heap

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0  # after the store failed
RETENTION_SECONDS = 600.0  # how often old windows are deleted


class ResultsRecorder:
    """Writes ``aggregates()``'s pending batches to ``store`` (read under ``lock``), as
    ``source`` (the store's name for this collector), and deletes windows older than
    ``retention`` (seconds per span; infinity: kept for ever)."""

    def __init__(self, store: ResultsStore, *, source: str,
                 aggregates: Callable[[], Ingestor], lock: threading.RLock,
                 retention: dict[float, float], clock: Callable[[], float] = time.time,
                 closed_sums: Callable[[int, int, int], list[bytes]] | None = None):
        """``closed_sums(batch, first, count)``: the sums a checkpoint saved of a batch's
        windows ``first`` to ``first + count - 1`` (``CollectorStore.closed_sums``), for
        windows that no longer hold them (``ClosedWindow.sums`` None)."""
        self.store, self.source = store, source
        self._closed_sums = closed_sums
        self._aggregates, self._lock, self._clock = aggregates, lock, clock
        self.retention = retention
        self.written_windows = 0  # windows written since start (metrics)
        self.failures = 0
        self.deleted = 0
        self._series_written: set[str] = set()  # keys the store holds (never deleted)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retained_at = -float("inf")
        self.period: float | None = None  # passes without a wake-up this often (None: never)
        # The batches up to this number are in a committed checkpoint: only those are
        # written (a batch written before its checkpoint could be closed differently after
        # a crash, under the same number).
        self.durable = 0

    # -- one pass ---------------------------------------------------------------------------
    def record(self) -> int:
        """Write every pending batch (oldest first); how many windows were written."""
        with self._lock:
            batches = sorted((batch, windows) for batch, windows
                             in self._aggregates().pending.items() if batch <= self.durable)
        if not batches:
            return 0
        applied = self.store.applied(self.source)
        written = 0
        for batch, windows in batches:
            estimates = None
            if batch > applied:
                estimates = self._write(batch, windows)
                written += len(windows)
            with self._lock:
                self._aggregates().written(batch, estimates)
        self.written_windows += written
        return written

    def _write(self, batch: int | None, windows: list[ClosedWindow]) \
            -> list[tuple[int, object]]:
        keys = [SeriesRecord.of(window.series).key for window in windows]
        stored = self.store.read_sums([(key, window.span, window.start)
                                       for key, window in zip(keys, windows) if window.delta])
        series_records = {key: SeriesRecord.of(window.series)
                          for key, window in zip(keys, windows)
                          if key not in self._series_written}
        # Estimated first, off the store's transaction; the sums read as the store takes
        # the rows: a batch can close every window of every series (a quarter of a million
        # at the default limits), whose rows and sums need not exist at once.
        estimates, merged = [], {}
        for i, (key, window, encoded) in enumerate(zip(keys, windows, self._sums(batch,
                                                                                 windows))):
            series, point = window.series, window.point
            earlier = stored.get((key, window.span, window.start))
            if earlier is not None or point is None:
                blocks = window.blocks(encoded)
                if earlier is not None:
                    whole = series.blocks_from(earlier, f"results {key}")
                    for name, block in blocks.items():
                        whole[name].merge(block)
                    blocks, point, merged[i] = whole, None, series.blocks_state(whole)
                if point is None:
                    point = series.estimate(blocks, window.span, window.start)
            estimates.append(point)
        rows = (WindowRow(key, window.span, window.start, point[0], merged.get(i, encoded),
                          msgspec.json.encode(point[1]))
                for i, (key, window, encoded, point)
                in enumerate(zip(keys, windows, self._sums(batch, windows), estimates)))
        self.store.write(self.source, batch, list(series_records.values()), rows,
                         self._clock())
        self._series_written.update(series_records)
        return estimates

    def _sums(self, batch: int | None, windows: list[ClosedWindow], chunk: int = 2000):
        """Each window's sums: its own, or read back from the collector store ``chunk`` at
        a time (a checkpoint saved them there: it may do so meanwhile, so each window's
        are taken once)."""
        for first in range(0, len(windows), chunk):
            held = [window.sums for window in windows[first:first + chunk]]
            if any(sums is None for sums in held):
                if self._closed_sums is None or batch is None:
                    raise ValueError("closed windows without their sums, and no store to read")
                stored = self._closed_sums(batch, first, len(held))
                held = [mine if mine is not None else theirs
                        for mine, theirs in zip(held, stored)]
            yield from held

    def retain(self) -> int:
        """Delete every window older than its resolution's retention."""
        now, deleted = self._clock(), 0
        for span, keep in self.retention.items():
            if keep != float("inf"):
                deleted += self.store.retain(span, now - keep)
        self.deleted += deleted
        return deleted

    def collect(self):
        """Its families for /metrics (a prometheus_client collector)."""
        with self._lock:
            pending = self._aggregates().pending
            batches, windows = len(pending), sum(len(w) for w in pending.values())
        yield GaugeMetricFamily("ldp_results_pending_windows", "Closed windows not yet "
                                "written to the results store (kept by the checkpoint).",
                                value=windows)
        yield GaugeMetricFamily("ldp_results_pending_batches", "Batches of closed windows "
                                "not yet written to the results store.", value=batches)
        yield CounterMetricFamily("ldp_results_windows_written_total", "Windows written to "
                                  "the results store.", value=self.written_windows)
        yield CounterMetricFamily("ldp_results_write_failures_total", "Failed writes to the "
                                  "results store (retried).", value=self.failures)
        yield CounterMetricFamily("ldp_results_windows_deleted_total", "Windows deleted by "
                                  "retention.", value=self.deleted)

    # -- the thread --------------------------------------------------------------------------
    def wake(self, durable: int) -> None:
        """Write now: a checkpoint keeps every batch up to number ``durable``."""
        self.durable = max(self.durable, durable)
        self._wake.set()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="collector-results", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop, after a last pass (what the last checkpoint closed)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30.0)
            self._thread = None

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                if self.record():
                    # The estimates' temporaries, freed in this thread's heap.
                    release_freed_heap()
                if self._clock() - self._retained_at >= RETENTION_SECONDS:
                    self.retain()
                    self._retained_at = self._clock()
                delay = None
            except Exception as exc:  # the store is down, full ...: the batches wait
                self.failures += 1
                log.error("writing results failed (%s: %s); the closed windows wait in the "
                          "checkpoint, retrying in %.0f s", type(exc).__name__, exc,
                          RETRY_SECONDS)
                delay = RETRY_SECONDS
            if stopping:
                return
            self._wake.wait(delay if delay is not None else self.period)
            self._wake.clear()


class MergedResultsRecorder(ResultsRecorder):
    """The scale-out merge view's recorder (``collector.scaleout.merge``): its aggregates
    are merged afresh from the partitions' states, which keep each level's recent windows
    (``keep_windows``), so it writes every window of them that has closed (``grace``
    seconds after its end) and whose count it has not written yet, whole (no batches: a
    whole window written again is the same row).  A window the members stopped keeping
    before the merge view saw it closed (a merge view down longer than the history) is
    not written."""

    PERIOD = 5.0  # seconds between passes

    def __init__(self, store: ResultsStore, *, source: str,
                 aggregates: Callable[[], Ingestor], grace: float,
                 retention: dict[float, float], clock: Callable[[], float] = time.time):
        super().__init__(store, source=source, aggregates=aggregates, lock=threading.RLock(),
                         retention=retention, clock=clock)
        self.grace, self.period = grace, self.PERIOD
        self.recorded: dict[tuple, int] = {}  # (series key, span, start) -> count written

    def record(self) -> int:
        ingestor, now = self._aggregates(), self._clock()
        closed, seen = [], set()
        for by_identity in list(ingestor.series.values()):
            for series in list(by_identity.values()):
                key = SeriesRecord.of(series).key
                finest = math.floor((now - self.grace) / series.window_seconds)
                for level, windows in enumerate(series.levels):
                    limit, span = finest // series.factors[level], series.span(level)
                    done = series.points if level == 0 else series.coarse_points
                    for start, blocks in list(windows.items()):
                        if start >= limit:
                            continue
                        seen.add((key, span, start))
                        count = series._count(blocks)
                        if self.recorded.get((key, span, start)) == count:
                            continue
                        point = done.get(start if level == 0 else (level, start))
                        closed.append(ClosedWindow.of(series, span, start, blocks, False,
                                                      point if point and point[0] == count
                                                      else None))
        if closed:
            self._write(None, closed)
            for window in closed:
                self.recorded[(SeriesRecord.of(window.series).key, window.span,
                               window.start)] = window.count
        self.recorded = {key: count for key, count in self.recorded.items() if key in seen}
        self.written_windows += len(closed)
        return len(closed)
