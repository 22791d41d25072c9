"""Windows as a table: one row per window, a column per estimate (CSV, Parquet).

Columns: ``start`` and ``end`` (Unix seconds), ``count``, ``too_few`` (the interval spans
most of the domain: too few reports to read the window as a measurement), then the kind's
estimates with their 95% interval bounds (``_low``, ``_high``).  An estimate that cannot be
given (too few reports for an interval) is an empty cell.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable

Column = tuple[str, Callable[[dict], object]]


def _at(*path) -> Callable[[dict], object]:
    """The value at ``path`` in a point (None where a part is missing)."""
    def get(point: dict):
        value = point
        for part in path:
            if isinstance(part, int):
                value = value[part] if isinstance(value, (list, tuple)) and part < len(value) \
                    else None
            else:
                value = value.get(part) if isinstance(value, dict) else None
        return value
    return get


def _mean(prefix: str, *path) -> list[Column]:
    return [(f"{prefix}", _at(*path, "mean", "estimate")),
            (f"{prefix}_stderr", _at(*path, "mean", "stderr")),
            (f"{prefix}_low", _at(*path, "mean", "ci95", 0)),
            (f"{prefix}_high", _at(*path, "mean", "ci95", 1))]


def _direction(prefix: str, *path) -> list[Column]:
    return [(f"{prefix}circular_mean", _at(*path, "circular_mean")),
            (f"{prefix}half_width", _at(*path, "half_width")),
            (f"{prefix}circular_mean_low", _at(*path, "ci95", 0)),
            (f"{prefix}circular_mean_high", _at(*path, "ci95", 1)),
            (f"{prefix}resultant_length", _at(*path, "resultant_length"))]


def columns(kind: str, *, fields: list[str] | None = None,
            labels: list[str] | None = None) -> list[Column]:
    """The table's columns for a kind (``fields``: a vector's axes; ``labels``: a
    categorical channel's categories)."""
    head = [("start", _at("start")), ("end", _at("end")), ("count", _at("count")),
            ("too_few", lambda point: bool(point.get("too_few", False)))]
    if kind == "linear":
        return head + _mean("mean")
    if kind == "circular":
        return head + _direction("")
    if kind == "polar":
        return head + _mean("radius_mean", "radius") + _direction("angle_", "angle")
    if kind == "vector":
        return head + [column for axis in fields or []
                       for column in [(f"{axis}_count", _at("axes", axis, "count")),
                                      *_mean(f"{axis}_mean", "axes", axis)]]
    if kind == "categorical":
        return head + [column for i, label in enumerate(labels or [])
                       for column in [(f"share_{label}", _at("frequencies", "shares", i)),
                                      (f"estimate_{label}", _at("frequencies", "estimate", i)),
                                      (f"share_{label}_low", _at("frequencies", "ci95", i, 0)),
                                      (f"share_{label}_high", _at("frequencies", "ci95", i, 1))]]
    raise ValueError(f"unknown kind {kind!r}")


def rows(points: Iterable[dict], table: list[Column]) -> list[list]:
    return [[get(point) for _, get in table] for point in points]


def to_csv(points: Iterable[dict], table: list[Column]) -> str:
    """A CSV text with a header row (empty cells for missing estimates)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([name for name, _ in table])
    for row in rows(points, table):
        writer.writerow(["" if value is None else _cell(value) for value in row])
    return out.getvalue()


def _cell(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def to_parquet(points: Iterable[dict], table: list[Column], path) -> None:
    """A Parquet file (the ``parquet`` extra: pyarrow), one typed column per estimate."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError("Parquet needs pyarrow: pip install 'edge-ldp[parquet]'") from None
    values = rows(points, table)
    arrays = {}
    for i, (name, _) in enumerate(table):
        column = [row[i] for row in values]
        kind = pa.int64() if name == "count" or name.endswith("_count") else \
            pa.bool_() if name == "too_few" else pa.float64()
        arrays[name] = pa.array(column, type=kind)
    pq.write_table(pa.table(arrays), path)
