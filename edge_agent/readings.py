"""A batch of raw readings, as sources hand them to channels.

Raw readings exist only in the agent's memory: nothing in this module
persists, logs or prints values, and ``__repr__`` shows only the shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Readings:
    """Timestamps (seconds since the epoch) and one float64 array per field.

    Every field array has the length of ``times``.  A field a row does not
    carry is NaN in that row.
    """

    times: np.ndarray
    fields: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        self.times = np.asarray(self.times, dtype=np.float64)
        for name, values in self.fields.items():
            values = np.asarray(values, dtype=np.float64)
            if values.shape != self.times.shape:
                raise ValueError(f"field {name!r} has {values.shape} values for "
                                 f"{self.times.shape} timestamps")
            self.fields[name] = values

    def __len__(self) -> int:
        return int(self.times.size)

    def __repr__(self) -> str:  # never show values
        return f"Readings({len(self)} rows, fields={sorted(self.fields)})"

    @classmethod
    def empty(cls, names=()) -> Readings:
        return cls(np.empty(0), {n: np.empty(0) for n in names})

    @classmethod
    def concat(cls, parts: list[Readings]) -> Readings:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        names = sorted(set().union(*(p.fields for p in parts)))
        times = np.concatenate([p.times for p in parts])
        fields = {
            n: np.concatenate([p.fields.get(n, np.full(len(p), np.nan)) for p in parts])
            for n in names
        }
        return cls(times, fields)

    def column(self, name: str) -> np.ndarray:
        """Values of one field (all NaN if the source never carries it)."""
        values = self.fields.get(name)
        return np.full(len(self), np.nan) if values is None else values

    def take(self, index: np.ndarray) -> Readings:
        return Readings(self.times[index], {n: v[index] for n, v in self.fields.items()})
