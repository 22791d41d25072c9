"""A batch of raw readings, as sources hand them to channels.

Raw readings exist only in the agent's memory: nothing in this module
persists, logs or prints values, and ``__repr__`` shows only the shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Longest text value a source keeps (a category label); longer ones are not readings.
MAX_TEXT_CHARS = 40


def as_text(value: object) -> str | None:
    """A source's value as text for a categorical channel: a string of 1-40 characters
    (spaces around it removed), else None."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value if 0 < len(value) <= MAX_TEXT_CHARS else None


@dataclass
class Readings:
    """Timestamps (seconds since the epoch), one float64 array per numeric field and one
    object array of strings per text field (categories such as an activity class).

    Every array has the length of ``times``.  A numeric field a row does not carry is
    NaN in that row, a text field None.  A field can be both: a JSON or CSV source
    puts a number in ``fields`` and a word in ``text``.
    """

    times: np.ndarray
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    text: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        self.times = np.asarray(self.times, dtype=np.float64)
        for columns, dtype in ((self.fields, np.float64), (self.text, object)):
            for name, values in columns.items():
                values = np.asarray(values, dtype=dtype)
                if values.shape != self.times.shape:
                    raise ValueError(f"field {name!r} has {values.shape} values for "
                                     f"{self.times.shape} timestamps")
                columns[name] = values

    def __len__(self) -> int:
        return int(self.times.size)

    def __repr__(self) -> str:  # never show values
        text = f", text={sorted(self.text)}" if self.text else ""
        return f"Readings({len(self)} rows, fields={sorted(self.fields)}{text})"

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
        text = {
            n: np.concatenate([p.text.get(n, np.full(len(p), None, dtype=object))
                               for p in parts])
            for n in sorted(set().union(*(p.text for p in parts)))
        }
        return cls(times, fields, text)

    def column(self, name: str) -> np.ndarray:
        """Values of one field (all NaN if the source never carries it)."""
        values = self.fields.get(name)
        return np.full(len(self), np.nan) if values is None else values

    def text_column(self, name: str) -> np.ndarray:
        """Words of one field (all None if the source never carries text in it)."""
        values = self.text.get(name)
        return np.full(len(self), None, dtype=object) if values is None else values

    def take(self, index: np.ndarray) -> Readings:
        return Readings(self.times[index], {n: v[index] for n, v in self.fields.items()},
                        {n: v[index] for n, v in self.text.items()})
