"""A recorded source's readings read ahead, for ``check-config`` to say where they lie
(e.g. in a mechanism's flat ends) before anything is reported.  Only CSV and JSON-lines
files: the other sources have nothing recorded to read.  What is read stays on the
device (check-config prints to the local terminal)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from edge_agent.readings import Readings
from edge_agent.sources.csv_source import column_positions, parse_float, shared_recording
from edge_agent.sources.derive import apply_derive
from edge_agent.sources.jsonl import decode_line, records_to_readings

# Rows read at most: enough to place a recording's range, bounded whatever the file.
MAX_ROWS = 200_000
# Files beyond this are not read (a CSV is parsed whole).
MAX_BYTES = 64 << 20


def recorded_readings(source) -> Readings | None:
    """Up to MAX_ROWS readings of a CSV or JSON-lines source's file (derived fields
    included), or None when there is no file to read (another type, standard input,
    missing, unreadable or over MAX_BYTES)."""
    path = getattr(source, "path", None)
    if source.type not in ("csv", "jsonl") or path is None or str(path) == "-":
        return None
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        readings = _csv(source, path) if source.type == "csv" else _jsonl(source, path)
    except (OSError, UnicodeError, ValueError):
        return None
    return None if readings is None else apply_derive(readings, source.derive)


def _csv(source, path: Path) -> Readings | None:
    recording = shared_recording(path)
    if not recording.header:
        return None
    position = column_positions(recording.header)
    rows = [row for row in itertools.islice(recording.records, MAX_ROWS)
            if row is not None and len(row) == len(recording.header)]
    fields = {field: np.array([parse_float(row[position[column]]) for row in rows])
              for field, column in source.columns.items() if column in position}
    return Readings(np.zeros(len(rows)), fields)


def _jsonl(source, path: Path) -> Readings:
    with open(path, encoding="utf-8", errors="replace") as file:
        records = [decode_line(line, None, 0.0) for line in itertools.islice(file, MAX_ROWS)]
    return records_to_readings(record for record in records if record is not None)
