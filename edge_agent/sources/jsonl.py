"""JSON lines from a file or standard input: one object of fields per line.

A daemon thread reads lines into a bounded queue (a full queue makes the
reader wait, so a large file is not pulled into memory faster than the agent
consumes it); ``poll`` drains the queue without blocking.  Each line's
numbers become fields and its short strings text fields (categories, e.g.
``"activity": "walk"``; ``readings.as_text``); any other value (null, a
boolean, a nested object) is NaN for that row, and a line that is not a JSON
object is skipped and counted in ``rejected_rows``.  The timestamp is the
``timestamp_field`` value (seconds since the epoch; a line without a usable
one is rejected) or the time the line was read.  At the end of the input the
source is ``finished`` once every line read has been handed out.

The record helpers here are shared with the MQTT source.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import time
from collections.abc import Iterable
from typing import IO, Any

import numpy as np

from edge_agent.config import JsonlSourceConfig
from edge_agent.readings import Readings, as_text
from edge_agent.sources.base import ThreadedSource
from edge_agent.sources.derive import apply_derive

MAX_LINE_CHARS = 1 << 20  # longer lines are skipped (and counted) unread
QUEUE_ROWS = 50_000
MAX_ROWS_PER_POLL = 50_000
_EOF = object()

Record = tuple[float, dict[str, float | str]]


# -- records shared with the MQTT source ---------------------------------------------

def to_number(value: Any) -> float:
    """A JSON value as a float: numbers only (not booleans), anything else NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range
        return math.nan


def to_value(value: Any) -> float | str:
    """A JSON value as a number, or a word (``as_text``) for a categorical channel."""
    if isinstance(value, str):
        word = as_text(value)
        return math.nan if word is None else word
    return to_number(value)


def parse_record(obj: Any, timestamp_field: str | None, arrival: float) -> Record | None:
    """(timestamp, fields) from a decoded JSON value; None if it is not usable."""
    if not isinstance(obj, dict):
        return None
    fields = {str(key): to_value(value) for key, value in obj.items()}
    if timestamp_field is None:
        return arrival, fields
    timestamp = fields.pop(timestamp_field, math.nan)
    if isinstance(timestamp, str) or not math.isfinite(timestamp):
        return None
    return timestamp, fields


def decode_line(line: str | bytes, timestamp_field: str | None,
                arrival: float) -> Record | None:
    """A line's record; None for a blank line, invalid JSON or UTF-8, absurd nesting or a
    value ``parse_record`` cannot use."""
    if not line.strip():
        return None
    try:
        return parse_record(json.loads(line), timestamp_field, arrival)
    except (ValueError, RecursionError):
        return None


def records_to_readings(records: Iterable[Record]) -> Readings:
    """A batch from records; a field a record lacks is NaN in its row."""
    records = list(records)
    if not records:
        return Readings.empty()
    names = dict.fromkeys(name for _, fields in records for name in fields)
    times = np.fromiter((t for t, _ in records), dtype=np.float64, count=len(records))
    columns, text = {}, {}
    for name in names:
        values = [fields.get(name, math.nan) for _, fields in records]
        if any(isinstance(value, str) for value in values):
            text[name] = np.array([v if isinstance(v, str) else None for v in values],
                                  dtype=object)
            values = [math.nan if isinstance(v, str) else v for v in values]
        columns[name] = np.fromiter(values, dtype=np.float64, count=len(records))
    return Readings(times, columns, text)


# -- the source ---------------------------------------------------------------------

class JsonlSource(ThreadedSource):
    def __init__(self, config: JsonlSourceConfig, *, stream: IO | None = None):
        """``stream``: read this file-like object (text or bytes) instead of ``path``."""
        # Whatever the lines carry: only the derived names are known up front.
        super().__init__(config.name, derive=config.derive)
        self.config = config
        self.path = config.path
        self.timestamp_field = config.timestamp_field
        self._stream = stream
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_ROWS)
        self._read_error: str | None = None

    def origin(self) -> dict[str, object]:
        return {"path": repr(self.path)}

    def start(self) -> None:
        if self._thread is not None:
            return
        owned = False
        stream = self._stream
        if stream is None and self.path == "-":
            stream = sys.stdin
        elif stream is None:
            try:
                stream = open(self.path, "rb")
            except OSError as exc:
                what = "no such file" if isinstance(exc, FileNotFoundError) else exc.strerror
                self.fail(f"jsonl source {self.name!r}: {what}: {self.path}")
                return
            owned = True
        self._start_reading(self._read, stream, owned, kind="jsonl")

    def stop(self) -> None:
        self._stop_reading(join_seconds=0.5)  # a read blocked on stdin cannot be interrupted

    # -- the reader thread -----------------------------------------------------------
    def _read(self, stream: IO, owned: bool) -> None:
        try:
            while not self._stopping.is_set():
                line = stream.readline(MAX_LINE_CHARS)
                if not line:
                    break
                arrival = time.time()
                if not _ends_line(line) and len(line) >= MAX_LINE_CHARS:
                    self._skip_rest_of_line(stream)
                    self.rejected_rows += 1
                    continue
                self._handle_line(line, arrival)
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed under us
            if not self._stopping.is_set():
                self._read_error = f"jsonl source {self.name!r}: read failed: " \
                                   f"{getattr(exc, 'strerror', None) or type(exc).__name__}"
        finally:
            if owned:
                stream.close()
            self._put(_EOF)

    def _handle_line(self, line: str | bytes, arrival: float) -> None:
        if not line.strip():
            return  # blank lines are not rows
        record = decode_line(line, self.timestamp_field, arrival)
        if record is None:
            self.rejected_rows += 1
        else:
            self._put(record)

    @staticmethod
    def _skip_rest_of_line(stream: IO) -> None:
        while True:
            chunk = stream.readline(MAX_LINE_CHARS)
            if not chunk or _ends_line(chunk):
                return

    def _put(self, item) -> None:
        """Wait for room in the queue, but give up when the source stops."""
        while not self._stopping.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    # -- polling -----------------------------------------------------------------------
    def poll(self, now: float) -> Readings:
        records: list[Record] = []
        ended = False
        while len(records) < MAX_ROWS_PER_POLL:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _EOF:
                ended = True
                break
            records.append(item)
        readings = apply_derive(records_to_readings(records), self.derive)
        if ended:
            if self._read_error:
                self.fail(self._read_error)
            self.finished = True
        return readings


def _ends_line(line: str | bytes) -> bool:
    return line.endswith(b"\n" if isinstance(line, bytes) else "\n")
