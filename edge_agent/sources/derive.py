"""Derived fields every source adds to its batches, per ``config.derive``.

"horizontal": ``accel_h_mag = hypot(accel_x, accel_y)`` and
``accel_h_dir = atan2(accel_y, accel_x)`` wrapped into [0, 2pi) - the
magnitude/direction pair a polar channel reports.

"tilt": ``roll = atan2(accel_y, accel_z)`` and
``pitch = atan2(-accel_x, hypot(accel_y, accel_z))``, the attitude of a
device at rest from the gravity it measures (roll in (-pi, pi], pitch in
[-pi/2, pi/2]).

A derived value never overrides what the source measured itself: it fills a
field the batch does not have, and the rows where the batch's own value is
NaN.  Deciding per row (not per batch) keeps a mixed stream consistent: a
JSON-lines or MQTT batch that happens to contain one device reporting its
own roll does not take the tilt estimate away from the other devices' rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from edge_agent.config import DERIVED_FIELDS
from edge_agent.readings import Readings

TWO_PI = 2.0 * math.pi


def wrap_2pi(angle: np.ndarray) -> np.ndarray:
    """Angles into [0, 2pi)."""
    wrapped = np.mod(angle, TWO_PI)
    # np.mod of a tiny negative angle rounds up to exactly 2pi.
    return np.where(wrapped >= TWO_PI, 0.0, wrapped)


def wrap_pi(angle: np.ndarray) -> np.ndarray:
    """Angles into (-pi, pi]."""
    wrapped = math.pi - np.mod(math.pi - np.asarray(angle, dtype=np.float64), TWO_PI)
    # The same rounding can land on -pi, which belongs to +pi here.
    return np.where(wrapped <= -math.pi, wrapped + TWO_PI, wrapped)


def horizontal(accel_x: np.ndarray, accel_y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(magnitude, direction in [0, 2pi)) of the horizontal acceleration."""
    return np.hypot(accel_x, accel_y), wrap_2pi(np.arctan2(accel_y, accel_x))


def tilt(accel_x: np.ndarray, accel_y: np.ndarray,
         accel_z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(roll, pitch) of a device at rest, from the gravity vector it measures."""
    roll = wrap_pi(np.arctan2(accel_y, accel_z))
    pitch = np.arctan2(-accel_x, np.hypot(accel_y, accel_z))
    return roll, pitch


def derived_names(derive: Iterable[str]) -> tuple[str, ...]:
    """Field names the given derive items add."""
    names: list[str] = []
    for item in derive:
        names.extend(n for n in DERIVED_FIELDS[item] if n not in names)
    return tuple(names)


def with_derived(base: Iterable[str], derive: Iterable[str]) -> tuple[str, ...]:
    """A source's field list: its own fields, then the derived ones it lacks."""
    names = list(dict.fromkeys(base))
    names.extend(n for n in derived_names(derive) if n not in names)
    return tuple(names)


def apply_derive(readings: Readings, derive: Iterable[str]) -> Readings:
    """Add the derived fields to ``readings`` (in place) and return it."""
    items = set(derive)
    if not items:
        return readings
    if "horizontal" in items:
        mag, direction = horizontal(readings.column("accel_x"), readings.column("accel_y"))
        _fill(readings, "accel_h_mag", mag)
        _fill(readings, "accel_h_dir", direction)
    if "tilt" in items:
        roll, pitch = tilt(readings.column("accel_x"), readings.column("accel_y"),
                           readings.column("accel_z"))
        _fill(readings, "roll", roll)
        _fill(readings, "pitch", pitch)
    return readings


def _fill(readings: Readings, name: str, derived: np.ndarray) -> None:
    own = readings.fields.get(name)
    readings.fields[name] = derived if own is None else np.where(np.isnan(own), derived, own)
