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

import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable

from edge_agent.readings import Readings
from edge_agent.sources.derive import with_derived


def keep_newest(queue: deque, records: Iterable) -> int:
    """Append ``records`` to ``queue``, a deque with a ``maxlen``: past it the oldest go
    (memory never grows with what a sender chooses).  How many were dropped."""
    records = list(records)
    dropped = max(0, len(queue) + len(records) - queue.maxlen)
    queue.extend(records)
    return dropped


class Source(ABC):
    #: field names the source provides (used to check channel configs)
    fields: tuple[str, ...] = ()

    def __init__(self, name: str, *, derive: Iterable[str] = (), base_fields: Iterable[str] = ()):
        """``derive``: the derived fields it adds (``[[sources]] derive``); ``base_fields``:
        the fields it provides before those (none: whatever the data carries)."""
        self.name = name
        self.derive = tuple(derive)
        self.fields = with_derived(base_fields, self.derive)
        self.finished = False
        self.error: str | None = None
        #: rows that could not be parsed and were skipped
        self.rejected_rows = 0

    def __repr__(self) -> str:  # names where readings come from, never a reading
        details = "".join(f", {key}={value}" for key, value in self.origin().items())
        return f"{type(self).__name__}({self.name!r}{details})"

    def origin(self) -> dict[str, object]:
        """Where the readings come from (shown by ``repr``)."""
        return {}

    def start(self) -> None:  # noqa: B027 - optional hook
        """Open resources (files, buses, connections)."""

    @abstractmethod
    def poll(self, now: float) -> Readings:
        """Readings that arrived since the last poll; never blocks."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Release resources; idempotent."""

    #: whether ``committed`` does anything (the agent calls it only then: a fleet of
    #: many virtual agents pays nothing for it)
    acknowledges = False

    def committed(self) -> None:  # noqa: B027 - optional hook
        """Called by the agent after every tick, once the batch of that tick is committed
        to the state file (also when the tick selected nothing, or the budget or
        report_interval dropped what it polled): every reading ``poll`` handed out
        before this call is handled for good.  A source that answers its senders (the
        http source) acknowledges them here.  A tick whose commit failed calls nothing:
        a ``poll`` with no ``committed`` since the previous one means the readings of
        the previous one were not recorded."""

    def local_counters(self) -> dict[str, object]:
        """Device-only counters of the source (they depend on what arrived): in the
        local status, never published."""
        return {}

    def fail(self, message: str) -> None:
        self.error = message
        self.finished = True


class ThreadedSource(Source):
    """A source that reads on a thread of its own (a bus, a file, standard input)."""

    def __init__(self, name: str, **fields):
        super().__init__(name, **fields)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _start_reading(self, target: Callable[..., None], *args, kind: str) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=target, args=args, name=f"{kind}-{self.name}",
                                        daemon=True)
        self._thread.start()

    def _stop_reading(self, join_seconds: float) -> None:
        """Ask the thread to stop and wait for it (a thread blocked in a read is a daemon:
        it does not hold the process)."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=join_seconds)
