"""Sources: where raw readings come from (Telegraf-style input plugins).

Lifecycle: the constructor validates the (already parsed) config and does
no I/O; ``start()`` opens files, buses or connections; ``poll(now)`` returns
the readings that arrived since the last poll without blocking; ``stop()``
releases everything and may be called twice.  A finite source (a CSV file
without looping, a JSON-lines file, stdin) sets ``finished`` once it has
handed out its last reading.  A source that fails sets ``error`` (a short
description, never containing readings) and ``finished``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..readings import Readings


class Source(ABC):
    #: field names the source provides (used to check channel configs)
    fields: tuple[str, ...] = ()

    def __init__(self, name: str):
        self.name = name
        self.finished = False
        self.error: str | None = None
        #: rows that could not be parsed and were skipped
        self.rejected_rows = 0

    def start(self) -> None:  # noqa: B027 - optional hook
        """Open resources (files, buses, connections)."""

    @abstractmethod
    def poll(self, now: float) -> Readings:
        """Readings that arrived since the last poll; never blocks."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Release resources; idempotent."""

    def fail(self, message: str) -> None:
        self.error = message
        self.finished = True
