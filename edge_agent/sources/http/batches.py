"""What the http source accepts: request bodies parsed into readings, and the tickets that
carry a request's readings to the spool (``http_source``, ``http_server``).

Formats (``format``):

* ``records``: ``{"readings": [{...}, ...]}`` or a bare list of readings, each an
  object with its time at ``timestamp_field`` (default ``time``; seconds since the
  epoch, or ``timestamp_unit`` ms / us / ns) and the fields at the paths of
  ``[sources.fields]`` (``heart_rate = "hr"``, ``accel_x = "acc.x"``: a key, or a
  dotted path into nested objects; a key that itself holds dots is found too).
* ``sensor-logger``: the HTTP push of the Sensor Logger app (Android, iOS and its
  watch apps), documented with its TypeScript schema in PUSHING.md of
  https://github.com/tszheichoi/awesome-sensor-logger ("Typescript Payload
  Schema"): ``{"messageId", "sessionId", "deviceId", "payload": [{"name":
  "accelerometer", "time": <ns since the epoch>, "values": {"x", "y", "z"}}, ...]}``.
  A field's path is ``<name>.<values key>`` (``accelerometer.x``,
  ``wrist motion.accelerationX``); each payload entry is one reading.

A reading that carries none of the configured fields (another sensor: battery,
location) is skipped and counted; one that carries some has NaN for the others.
A value at a configured path must be a finite number.  Nothing of a request is
taken unless all of it is valid: a bad request changes nothing but a counter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_agent.config import HttpSourceConfig
from edge_agent.readings import Readings

PATH = "/readings"
# Times a reading may carry (seconds since the epoch): 2000-01-01 .. 2100-01-01.  A time
# in the wrong unit (ms read as s, s read as ns) falls outside, and is refused rather
# than let one reading far in the future hold back a report_interval for years.
EARLIEST, LATEST = 946_684_800.0, 4_102_444_800.0
UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

# What became of a request's readings (``Ticket.settle``).
RECORDED = "recorded"          # committed with the agent's batch: 200
NOT_RECORDED = "not_recorded"  # the agent's batch was not committed: 503, resend
STOPPING = "stopping"          # the agent stopped before taking them: 503, resend


class Refused(Exception):
    """A request refused: its status, the reason counted and a short message (never a
    reading's value)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


class Ticket:
    """One request's readings on their way to the spool; ``on_settle`` is called once,
    with RECORDED, NOT_RECORDED or STOPPING, from whichever thread settles it."""

    __slots__ = ("count", "on_settle", "outcome")

    def __init__(self, count: int, on_settle: Callable[[str], None]):
        self.count = count
        self.on_settle = on_settle
        self.outcome: str | None = None

    def settle(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.on_settle(outcome)


# -- parsing (in the server's thread) ------------------------------------------------------------

def _path_parts(path: str) -> list[tuple[str, str]]:
    """Where a dotted path may split: (head, rest) at each dot, leftmost first."""
    return [(path[:i], path[i + 1:]) for i, char in enumerate(path) if char == "."]


def resolve(obj: Any, path: str) -> Any:
    """The value at ``path`` in nested objects, or ``_MISSING``: the key itself if the
    object has it, else the first split ``head.rest`` whose head holds an object that
    has ``rest``."""
    if not isinstance(obj, dict):
        return _MISSING
    if path in obj:
        return obj[path]
    for head, rest in _path_parts(path):
        inner = obj.get(head)
        if isinstance(inner, dict):
            value = resolve(inner, rest)
            if value is not _MISSING:
                return value
    return _MISSING


_MISSING = object()


def _number(value: Any) -> float | None:
    """A JSON number as a finite float, else None (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float range
        return None
    return number if math.isfinite(number) else None


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's json would take them


def decode(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError):  # invalid JSON or UTF-8, absurd nesting
        raise Refused(400, "bad_json", "the body is not JSON") from None


class Parser:
    """A request body -> (readings, readings skipped), or ``Refused``."""

    def __init__(self, config: HttpSourceConfig):
        self.format = config.format
        self.fields = dict(config.fields)
        self.max_readings = config.max_readings
        self.time_path = config.time_path
        self.time_scale = UNITS[config.time_unit]
        self.time_unit = config.time_unit
        # sensor-logger: per sensor name, (field, values key) of the fields it carries
        self.sensors: dict[str, list[tuple[str, str]]] = {}
        for field, path in self.fields.items():
            name, _, key = path.strip(".").rpartition(".")
            self.sensors.setdefault(name, []).append((field, key))

    def parse(self, body: bytes) -> tuple[Readings, int]:
        document = decode(body)
        if self.format == "sensor-logger":
            items = document.get("payload") if isinstance(document, dict) else None
            shape = 'an object with a "payload" list'
        else:
            items = document.get("readings") if isinstance(document, dict) else document
            shape = 'a list of readings, or an object with a "readings" list'
        if not isinstance(items, list):
            raise Refused(400, "bad_shape", f"the body must be {shape}")
        if len(items) > self.max_readings:
            raise Refused(413, "too_many_readings",
                          f"at most {self.max_readings} readings per request, got {len(items)}")
        rows = self._sensor_logger(items) if self.format == "sensor-logger" \
            else self._records(items)
        skipped = len(items) - len(rows)
        return self._readings(rows), skipped

    def _records(self, items: list) -> list[tuple[float, dict[str, float]]]:
        rows = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise Refused(400, "bad_shape", f"reading {i} is not an object")
            values = self._values(i, ((field, resolve(item, path))
                                      for field, path in self.fields.items()))
            if values:
                rows.append((self._time(i, resolve(item, self.time_path)), values))
        return rows

    def _sensor_logger(self, items: list) -> list[tuple[float, dict[str, float]]]:
        rows = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise Refused(400, "bad_shape", f"reading {i} is not an object")
            wanted = self.sensors.get(item.get("name")) if isinstance(item.get("name"), str) \
                else None
            if not wanted:
                continue  # a sensor no field maps: not looked at
            values = item.get("values")
            if not isinstance(values, dict):
                raise Refused(400, "bad_shape", f'reading {i}: "values" is not an object')
            found = self._values(i, ((field, values.get(key, _MISSING))
                                     for field, key in wanted))
            if found:
                rows.append((self._time(i, item.get("time", _MISSING)), found))
        return rows

    @staticmethod
    def _values(i: int, pairs) -> dict[str, float]:
        values = {}
        for field, value in pairs:
            if value is _MISSING or value is None:
                continue  # this reading does not carry the field
            number = _number(value)
            if number is None:
                raise Refused(400, "bad_value",
                              f"reading {i}: field {field!r} is not a finite number")
            values[field] = number
        return values

    def _time(self, i: int, value: Any) -> float:
        number = _number(value)
        if number is None:
            raise Refused(400, "bad_timestamp", f"reading {i}: no time (a number at "
                                                f"{self.time_path!r})")
        # int / int is correctly rounded: ns since the epoch (19 digits) lose nothing
        # before the division, as they would as a float.
        seconds = (value if isinstance(value, int) else number) / self.time_scale
        if not EARLIEST <= seconds <= LATEST:
            raise Refused(400, "bad_timestamp",
                          f"reading {i}: its time is not between 2000 and 2100 in "
                          f"{self.time_unit} since the epoch (check the unit)")
        return seconds

    def _readings(self, rows: list[tuple[float, dict[str, float]]]) -> Readings:
        if not rows:
            return Readings.empty()
        times = np.fromiter((t for t, _ in rows), dtype=np.float64, count=len(rows))
        present = {field for _, values in rows for field in values}
        columns = {field: np.fromiter((values.get(field, math.nan) for _, values in rows),
                                      dtype=np.float64, count=len(rows))
                   for field in self.fields if field in present}
        return Readings(times, columns)
