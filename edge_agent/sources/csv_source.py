"""Replay a CSV file (phone and wearable exports such as MotionSense).

``columns`` maps field names to CSV header names.  Header names are
stripped of spaces and a UTF-8 byte-order mark; an unnamed column (empty
header name, e.g. the leading index column pandas writes) is simply a column
nobody maps.  The file is read row by row with the stdlib ``csv`` module, only
as far as the current poll needs, so a file of any size costs the same
memory.

Paces:

* ``fixed``: row i (counting across loops) is due at ``start + i / rate_hz``,
  where ``start`` is the first poll's time, and carries that timestamp;
* ``recorded``: a row is due when ``ts - first_ts <= now - start`` (``ts``
  from ``timestamp_column``, seconds) and carries ``start + ts - first_ts``;
  a looped pass continues one ``1 / rate_hz`` after the previous pass ended;
* ``fast``: up to ``MAX_FAST_ROWS`` rows per poll, timestamped
  ``start + i / rate_hz``.

A cell that is not a number becomes NaN; a row with the wrong number of
cells (or an unreadable timestamp in ``recorded`` pace) is skipped and
counted in ``rejected_rows``.  Messages name the file and columns, never the
cells.

Striding (the fleet simulator, ``edge-agent fleet``): ``CsvSource(config,
offset=i, stride=n)`` takes only the data rows numbered i, i + n, i + 2n, ...
(numbered from 0 after the header, every record counting, blank lines not),
so n sources with offsets 0..n-1 split one recording between them.  A taken
row that is invalid is skipped and counted by the source that took it; it is
not replaced by a neighbour.  With the paces:

* ``fixed`` / ``fast``: the source's own rows are numbered j = 0, 1, ... and
  timestamped ``start + j / rate_hz``: each strided source runs at
  ``rate_hz`` (n sources together consume the file n times faster);
* ``recorded``: rows keep their recorded times relative to the first row of
  the *file*, so each strided source sees about 1/n of the rows and the n
  sources together replay the file in real time;
* ``loop``: every pass restarts the numbering at the header, so a source
  takes the same rows in every pass.  In ``recorded`` pace the next pass
  starts one ``1 / rate_hz`` after the last row of the file (anyone's), so
  all strided sources stay on one time line.  A looping source that gets no
  readable row in a pass (e.g. ``offset`` beyond the last row) fails rather
  than spin.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from edge_agent.config import CsvSourceConfig
from edge_agent.readings import Readings, as_text
from edge_agent.sources.base import Source
from edge_agent.sources.derive import apply_derive

MAX_FAST_ROWS = 5000
# Bound on one batch in the real-time paces (an agent that stalled catches up
# over several polls instead of building one huge batch).
MAX_ROWS_PER_POLL = 200_000


# Files replayed by many strided sources (the fleet simulator), read and parsed once
# per process: N open files would exhaust descriptors (paho's select() cannot use a
# socket numbered above 1023), and N sources each parsing every row to keep 1 of N
# cost O(N) per row: 17 s a batch for 1,000 agents.  Keyed by path, size and
# modification time.
_SHARED: dict[tuple[str, int, int], SharedRecording] = {}


class SharedRecording:
    """A CSV file parsed once: its header, and its data records in order (blank lines are
    not records; a line the csv module cannot parse is None).  ``header`` is None for an
    empty file; ``header_error`` is set when the header itself cannot be parsed."""

    def __init__(self, lines: list[str]):
        reader = csv.reader(iter(lines))
        self.header: list[str] | None = None
        self.header_error = False
        self.records: list[list[str] | None] = []
        self._times: dict[tuple[int, int], tuple[float, float] | None] = {}
        try:
            self.header = next(reader, None)
        except csv.Error:
            self.header_error = True
            return
        while True:
            try:
                row = next(reader, None)
            except csv.Error:  # e.g. an over-long field: that line is a bad record
                self.records.append(None)
                continue
            if row is None:
                return
            if row:
                self.records.append(row)

    def time_span(self, ts_index: int, width: int) -> tuple[float, float] | None:
        """(first, largest) finite timestamp of the valid rows (``width`` cells), for the
        recorded pace: every row of a pass counts, own or not, so strided sources share
        one time line; None without any."""
        key = (ts_index, width)
        if key not in self._times:
            stamps = [stamp for row in self.records if row is not None and len(row) == width
                      and math.isfinite(stamp := parse_float(row[ts_index]))]
            self._times[key] = (stamps[0], max(stamps)) if stamps else None
        return self._times[key]


def shared_recording(path: Path) -> SharedRecording:
    info = path.stat()
    key = (str(path.resolve()), info.st_size, info.st_mtime_ns)
    recording = _SHARED.get(key)
    if recording is None:
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as file:
            recording = SharedRecording(file.read().splitlines(keepends=True))
        _SHARED.clear()  # the previous version of a file is not needed any more
        _SHARED[key] = recording
    return recording


def column_positions(header: list[str]) -> dict[str, int]:
    """Each column name's first position in a header row (names stripped)."""
    position: dict[str, int] = {}
    for i, name in enumerate(header):
        position.setdefault(name.strip(), i)
    return position


def parse_float(cell: str) -> float:
    """A cell as a float; anything that is not a number is NaN."""
    try:
        return float(cell)
    except ValueError:
        return math.nan


def parse_cell(cell: str) -> float | str:
    """A value cell: a float, or a word for a categorical channel (``as_text``), else NaN."""
    try:
        return float(cell)
    except ValueError:
        word = as_text(cell)
        return math.nan if word is None else word


class CsvSource(Source):
    def __init__(self, config: CsvSourceConfig, *, offset: int = 0, stride: int = 1):
        super().__init__(config.name, derive=config.derive, base_fields=config.columns)
        if not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride: must be an integer >= 1, got {stride!r}")
        if not isinstance(offset, int) or not 0 <= offset < stride:
            raise ValueError(f"offset: must be an integer in [0, {stride - 1}], got {offset!r}")
        self.offset, self.stride = offset, stride
        self.config = config
        self.path = Path(config.path)
        self.pace = config.pace
        self.rate_hz = float(config.rate_hz)
        self.loop = config.loop
        self.names = tuple(config.columns)
        self._file: io.TextIOBase | None = None
        self._shared: SharedRecording | None = None  # strided: the file, parsed once
        self._reader = None
        self._indices: list[int] = []
        self._ts_index: int | None = None
        self._width = 0
        # next own row, read ahead: (values, offset from the first poll; NaN unless recorded)
        self._pending: tuple[list[float], float] | None = None
        self._eof = False
        self._t0: float | None = None
        self._emitted = 0  # rows handed out (fixed/fast timestamps count these)
        self._pass_rows = 0  # valid rows read in the current pass (loop guard)
        self._record = 0  # number of the next data record in the pass (striding)
        # recorded pace: first timestamp of the pass (of any row, own or not),
        # where the pass starts relative to the first poll, and the latest
        # offset seen in the pass
        self._first_ts: float | None = None
        self._pass_offset = 0.0
        self._last_offset = -math.inf

    def origin(self) -> dict[str, object]:
        strided = {"offset": self.offset, "stride": self.stride} if self.stride > 1 else {}
        return {"path": repr(str(self.path)), "pace": repr(self.pace), **strided}

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        try:
            self._open()
        except FileNotFoundError:
            self.fail(f"csv source {self.name!r}: no such file: {self.path}")
            return
        except OSError as exc:
            self.stop()
            self.fail(f"csv source {self.name!r}: cannot read {self.path}: {exc.strerror}")
            return
        except _HeaderError as exc:
            self.stop()
            self.fail(f"csv source {self.name!r}: {self.path}: {exc}")
            return
        self._advance()

    def stop(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._shared = None
        self._reader = None

    def _open(self) -> None:
        # utf-8-sig drops the byte-order mark phone apps like to write;
        # undecodable bytes end up in a cell, which then parses as NaN.
        if self.stride > 1:  # one of many virtual agents: no file handle of its own
            self._shared = shared_recording(self.path)
            self._reader = iter(())  # rows are taken from the shared records by number
            if self._shared.header_error:
                raise _HeaderError("the header row cannot be parsed as CSV")
            header = self._shared.header
        else:
            self._file = open(self.path, newline="", encoding="utf-8-sig", errors="replace")
            self._reader = csv.reader(self._file)
            try:
                header = next(self._reader, None)
            except csv.Error:
                raise _HeaderError("the header row cannot be parsed as CSV") from None
        if not header:
            raise _HeaderError("the file is empty (no header row)")
        position = column_positions(header)
        missing = [column for column in self.config.columns.values() if column not in position]
        if missing:
            # Only the count of columns: in a file without a header, the
            # "header" is a data row.
            raise _HeaderError(
                "column(s) " + ", ".join(repr(c) for c in missing) + " not in the header "
                f"(it has {len(header)} columns)")
        self._indices = [position[self.config.columns[name]] for name in self.names]
        self._width = len(header)
        if self.pace == "recorded":
            column = self.config.timestamp_column
            if column not in position:
                raise _HeaderError(f"timestamp_column {column!r} not in the header")
            self._ts_index = position[column]

    def _rewind(self) -> None:
        """Back to the first data row for another pass (loop = true)."""
        self._record = 0
        if self._shared is not None:
            return
        self._file.seek(0)
        self._reader = csv.reader(self._file)
        next(self._reader, None)  # the header

    # -- reading rows ----------------------------------------------------------------
    def _read_row(self) -> tuple[list[float], float] | None:
        """The next valid own row as (values, offset or NaN); None at the end of the pass."""
        if self._shared is not None:
            return self._read_shared_row()
        while True:
            mine = self._record % self.stride == self.offset
            try:
                row = next(self._reader, None)
            except csv.Error:  # e.g. an over-long field: skip that line
                self._record += 1
                self.rejected_rows += mine
                continue
            if row is None:
                return None
            if not row:
                continue  # a blank line is not a row
            self._record += 1
            if len(row) != self._width:
                self.rejected_rows += mine
                continue
            offset = math.nan
            if self._ts_index is not None:
                offset = self._place(parse_float(row[self._ts_index]))
                if not math.isfinite(offset):
                    self.rejected_rows += mine  # cannot be placed in time
                    continue
            if mine:
                return [parse_cell(row[i]) for i in self._indices], offset

    def _read_shared_row(self) -> tuple[list[float], float] | None:
        """``_read_row`` of a strided source: its own records taken by number (records
        ``offset``, ``offset + stride``, ...) from the file parsed once, the recorded
        pace placed on the time line of every row of the pass, as ``_read_row`` does."""
        records = self._shared.records
        span = None
        if self._ts_index is not None:
            span = self._shared.time_span(self._ts_index, self._width)
        # The next own record: the first at or after ``_record`` (the records read).
        index = self._record + (self.offset - self._record) % self.stride
        while index < len(records):
            row = records[index]
            self._record = index + 1
            index += self.stride
            if row is None or len(row) != self._width:
                self.rejected_rows += 1
                continue
            offset = math.nan
            if span is not None:
                stamp = parse_float(row[self._ts_index])
                offset = self._pass_offset + (stamp - span[0])  # NaN without a stamp
                if not math.isfinite(offset):
                    self.rejected_rows += 1  # cannot be placed in time
                    continue
            return [parse_cell(row[i]) for i in self._indices], offset
        self._record = len(records)  # the pass is over: every row of it placed
        if span is not None:
            self._first_ts = span[0]
            self._last_offset = max(self._last_offset, self._pass_offset + span[1] - span[0])
        return None

    def _place(self, timestamp: float) -> float:
        """recorded pace: a row's offset from the first poll (NaN if it has no timestamp).

        Every row of the pass counts, own or not, so strided sources share one time line.
        """
        if not math.isfinite(timestamp):
            return math.nan
        if self._first_ts is None:
            self._first_ts = timestamp
        offset = self._pass_offset + (timestamp - self._first_ts)
        self._last_offset = max(self._last_offset, offset)
        return offset

    def _advance(self) -> None:
        """Read the next row into ``_pending``, looping back at the end if configured."""
        try:
            self._advance_or_raise()
        except OSError as exc:  # the disk, not the data: give up on the file
            self.stop()
            self.fail(f"csv source {self.name!r}: reading {self.path} failed: {exc.strerror}")
            self._pending, self._eof = None, True

    def _advance_or_raise(self) -> None:
        row = self._read_row()
        if row is None and self.loop:
            if self._pass_rows == 0:  # looping over nothing would spin forever
                self.stop()
                mine = (f" among rows {self.offset}, {self.offset + self.stride}, ... "
                        f"(offset {self.offset}, stride {self.stride}; the file has "
                        f"{self._record} data rows)" if self.stride > 1 else "")
                self.fail(f"csv source {self.name!r}: {self.path}: no readable data rows"
                          f"{mine} to loop over")
                self._pending, self._eof = None, True
                return
            self._pass_rows = 0
            self._start_next_pass()
            self._rewind()
            row = self._read_row()
        if row is None:
            self._pending, self._eof = None, True
            return
        self._pass_rows += 1
        self._pending = row

    def _start_next_pass(self) -> None:
        if self._first_ts is not None:
            self._pass_offset = self._last_offset + 1.0 / self.rate_hz
            self._first_ts = None

    # -- polling -----------------------------------------------------------------------
    def poll(self, now: float) -> Readings:
        if self.finished or self._reader is None:
            return Readings.empty(self.fields)
        if self._t0 is None:
            self._t0 = now
        elapsed = now - self._t0
        if self.pace == "recorded":
            rows, times = self._take_recorded(elapsed)
        else:
            rows, times = self._take_counted(elapsed)
        if self._eof:
            self.finished = True  # the rows returned now are the last ones
            self.stop()
        return self._batch(rows, times)

    def _take_counted(self, elapsed: float) -> tuple[list[list[float]], np.ndarray]:
        """fixed / fast pace: rows numbered i, timestamped start + i / rate_hz."""
        if self.pace == "fast":
            wanted = MAX_FAST_ROWS
        else:
            due = math.floor(elapsed * self.rate_hz + 1e-6) + 1  # rows with i / rate <= elapsed
            wanted = min(due - self._emitted, MAX_ROWS_PER_POLL)
        rows: list[list[float]] = []
        while len(rows) < wanted and self._pending is not None:
            rows.append(self._pending[0])
            self._advance()
        first = self._emitted
        self._emitted += len(rows)
        times = self._t0 + np.arange(first, self._emitted) / self.rate_hz
        return rows, times

    def _take_recorded(self, elapsed: float) -> tuple[list[list[float]], np.ndarray]:
        """recorded pace: rows whose recorded offset has been reached."""
        rows: list[list[float]] = []
        offsets: list[float] = []
        while self._pending is not None and len(rows) < MAX_ROWS_PER_POLL:
            values, offset = self._pending
            # The tolerance absorbs the rounding of now - start at epoch magnitudes.
            if offset > elapsed + 1e-6:
                break
            rows.append(values)
            offsets.append(offset)
            self._advance()
        return rows, self._t0 + np.asarray(offsets, dtype=np.float64)

    def _batch(self, rows: list[list[float]], times: np.ndarray) -> Readings:
        if not rows:
            return Readings.empty(self.fields)
        try:
            values = np.asarray(rows, dtype=np.float64)
            text = {}
        except ValueError:  # words among the numbers: text fields (categories)
            cells = np.array(rows, dtype=object)
            is_word = np.vectorize(lambda cell: isinstance(cell, str), otypes=[bool])(cells)
            values = np.where(is_word, np.nan, cells).astype(np.float64)
            words = np.where(is_word, cells, None)
            text = {name: words[:, j] for j, name in enumerate(self.names) if is_word[:, j].any()}
        readings = Readings(times, {name: values[:, j] for j, name in enumerate(self.names)},
                            text)
        return apply_derive(readings, self.derive)


class _HeaderError(ValueError):
    """The header does not fit the configuration (message names columns only)."""
