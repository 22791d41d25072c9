"""Estimates of a channel's history in worker processes, on every core the machine gives.

An estimate is mostly numpy and numba work on small arrays, and the Python between the
kernels holds the GIL, so threads would run them about one at a time and take the GIL from
ingestion meanwhile.  Here each job is a window's sums alone (``Series.bare``: a few kB),
sent to a process of a ``concurrent.futures.ProcessPoolExecutor`` that estimates them
(``Series.estimated``); the snapshots take the results at their next push
(``Views.capture``), where the window's sums still count what they are of.  The latest
windows are not sent: each push computes them itself, so a backlog of history never delays
them.

The workers start when there is history to estimate and stop after ``IDLE_SECONDS``
without any (an interpreter with numpy, scipy and numba is about 160 MB): a collector at
rest has none.  A worker gives LLVM's code pages back after its first job and then at most
every ``RELEASE_SECONDS`` (``edge_agent.common.memory``): 67 MB that estimating with the kernels
it loaded never reads, and that would count twice in the collector's summed RSS.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from collector.aggregation.series import Key, Series
from edge_agent.common.memory import release_freed_memory

log = logging.getLogger(__name__)

IDLE_SECONDS = 30.0
PARENT_CHECK_SECONDS = 1.0  # how often a worker looks whether the collector is still there
# Jobs in flight per worker at most: enough to keep a worker busy for about a push period
# (5-10 ms a window), few enough that a window's sums are sent shortly before they are
# estimated (a window that counts more meanwhile is estimated again).
JOBS_PER_WORKER = 128
RELEASE_SECONDS = 10.0  # a worker gives freed memory back at most this often
_released_at = -math.inf  # in a worker: when it last did


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_workers() -> int:
    """``estimate_workers = "auto"``: one per core this process may run on but one, which
    the collector's own process keeps (ingestion, the pushes, the newest windows).  Each
    worker is an interpreter with numpy and numba (about 160 MB); with one fewer (and
    without scipy.stats) the peak at the default limits went from 1,125 to 972 MB on 2
    cores, and a 64-channel burst still completes 4.4 s after its last report."""
    return available_cores() - 1


def _watch_parent(parent: int) -> None:
    """A worker's initializer: end the worker when the collector is gone (killed with
    SIGKILL, nothing tells a worker but its parent changing)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="watch-collector", daemon=True).start()


def _estimate(series: Series, key: Key) -> tuple[tuple[int, Any], float]:
    """The window's estimates, and the seconds they took."""
    global _released_at
    started = time.perf_counter()
    result = series.estimated(key)
    took = time.perf_counter() - started
    if started - _released_at >= RELEASE_SECONDS:  # the first job loaded the kernels
        release_freed_memory()
        _released_at = time.perf_counter()
    return result, took


class EstimateWorkers:
    """``workers`` processes estimating windows sent by ``submit``; ``finished`` gives
    what they estimated.  Thread-safe (futures complete in the executor's thread)."""

    def __init__(self, workers: int, *, idle_seconds: float = IDLE_SECONDS):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.idle_seconds = idle_seconds
        self.errors = 0  # jobs that raised (logged once per streak)
        self.restarts = 0  # pools started
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._in_flight: dict[tuple[tuple, Key], Future] = {}
        self._done: list[tuple[tuple, Key, tuple[int, Any]]] = []
        self._seconds = 0.0  # the workers' time on what ``_done`` holds
        self._last_busy = time.monotonic()
        self._failing = False

    @property
    def capacity(self) -> int:
        """How many more jobs ``submit`` takes now."""
        with self._lock:
            return max(0, self.workers * JOBS_PER_WORKER - len(self._in_flight))

    def in_flight(self) -> set[tuple[tuple, Key]]:
        """(series identity, key) of every job sent and not finished."""
        with self._lock:
            return set(self._in_flight)

    def submit(self, identity: tuple, key: Key, series: Series) -> None:
        """Estimate ``key`` of ``series`` (a ``Series.bare`` copy) in a worker."""
        with self._lock:
            if (identity, key) in self._in_flight:
                return
            if self._pool is None:
                # spawn: a fork of this multi-threaded process could copy a held lock.
                self._pool = ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_watch_parent, initargs=(os.getpid(),))
                self.restarts += 1
            try:
                future = self._pool.submit(_estimate, series, key)
            except BrokenProcessPool:  # a worker died (killed, out of memory): start anew
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
                return
            self._in_flight[(identity, key)] = future
            self._last_busy = time.monotonic()
        future.add_done_callback(lambda done: self._finished(identity, key, done))

    def _finished(self, identity: tuple, key: Key, future: Future) -> None:
        with self._lock:
            self._in_flight.pop((identity, key), None)
            self._last_busy = time.monotonic()
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                result, seconds = future.result()
                self._done.append((identity, key, result))
                self._seconds += seconds
                self._failing = False
                return
            self.errors += 1
            if isinstance(error, BrokenProcessPool):
                self._pool = None
            if not self._failing:
                log.error("estimating %s %s in a worker failed: %r", identity[0], key, error)
            self._failing = True

    def finished(self) -> tuple[list[tuple[tuple, Key, tuple[int, Any]]], float]:
        """What the workers estimated since the last call, (identity, key, result) as
        ``Ingestor.keep_results`` takes them, and the seconds that took them.  Stops the
        workers once idle long enough."""
        with self._lock:
            done, self._done = self._done, []
            seconds, self._seconds = self._seconds, 0.0
            idle = not self._in_flight and time.monotonic() - self._last_busy > self.idle_seconds
            pool = self._pool if idle else None
            if pool is not None:
                self._pool = None
        if pool is not None:
            pool.shutdown(wait=False)
        return done, seconds

    def stop(self) -> None:
        """Stop the workers (jobs not started are dropped: their windows stay to compute)."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._in_flight.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
