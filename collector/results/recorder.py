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
import threading
import time
from collections.abc import Callable

import msgspec

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import ClosedWindow
from collector.results.store import ResultsStore, SeriesRecord, WindowRow

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0  # after the store failed
RETENTION_SECONDS = 600.0  # how often old windows are deleted


class ResultsRecorder:
    """Writes ``aggregates()``'s pending batches to ``store`` (read under ``lock``), as
    ``source`` (the store's name for this collector), and deletes windows older than
    ``retention`` (seconds per span; infinity: kept for ever)."""

    def __init__(self, store: ResultsStore, *, source: str,
                 aggregates: Callable[[], Ingestor], lock: threading.RLock,
                 retention: dict[float, float], clock: Callable[[], float] = time.time):
        self.store, self.source = store, source
        self._aggregates, self._lock, self._clock = aggregates, lock, clock
        self.retention = retention
        self.written_windows = 0  # windows written since start (metrics)
        self.failures = 0
        self.deleted = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retained_at = -float("inf")
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
                self._aggregates().written(batch, {batch: estimates} if estimates else None)
        self.written_windows += written
        return written

    def _write(self, batch: int, windows: list[ClosedWindow]) -> list[tuple[int, object]]:
        records = {id(window.series): SeriesRecord.of(window.series) for window in windows}
        stored = self.store.read_sums([(records[id(window.series)].key, window.span,
                                        window.start) for window in windows if window.delta])
        rows, estimates = [], []
        for window in windows:
            series, key = window.series, records[id(window.series)].key
            blocks, point = window.blocks, window.point
            earlier = stored.get((key, window.span, window.start))
            if earlier is not None:
                blocks = series.blocks_from(earlier, f"results {key}")
                for name, block in blocks.items():
                    block.merge(window.blocks[name])
                point = None
            if point is None:
                point = series.estimate(blocks, window.span, window.start)
            estimates.append(point)
            rows.append(WindowRow(key, window.span, window.start, point[0],
                                  series.blocks_state(blocks), msgspec.json.encode(point[1])))
        self.store.write(self.source, batch, list(records.values()), rows, self._clock())
        return estimates

    def retain(self) -> int:
        """Delete every window older than its resolution's retention."""
        now, deleted = self._clock(), 0
        for span, keep in self.retention.items():
            if keep != float("inf"):
                deleted += self.store.retain(span, now - keep)
        self.deleted += deleted
        return deleted

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
                self.record()
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
            self._wake.wait(delay)
            self._wake.clear()
