"""Recordings of a collector's journal (``edge-collector export``), for ``replay``.

Each journaled message becomes one recording line (``collector.tools.replay``): its
payload as it stands if it is a JSON object, else in ``payload_base64``, so that an
export loses nothing.  The journal is read as of one instant, read-only: a running
collector goes on meanwhile.  By default the journal holds only what came after the
last checkpoint (a checkpoint deletes the messages it includes, unless ``[storage]
keep_journal``); the summary says since when.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from collector.storage.store import CollectorStore
from collector.tools.replay import MAX_LINE_BYTES


class JournalExport:
    """The journal of the collector store at ``path`` as recording lines, read-only and as
    of one instant: ``with JournalExport(path) as export: for line in export.lines()``;
    ``sqlite3.Error`` if it cannot be read.  ``summary()`` says what was written."""

    def __init__(self, path: Path):
        self.path = path
        self.counts: collections.Counter = collections.Counter()
        self._store = CollectorStore(path, read_only=True)
        self._stack = contextlib.ExitStack()
        self._stack.callback(self._store.close)

    def __enter__(self) -> JournalExport:
        with self._stack:
            self._stack.enter_context(self._store.reading())  # checkpoint and journal alike
            # The last journal id the last checkpoint includes and when it was written
            # (None: no checkpoint), and the journal's first id (None: empty).
            self.checkpoint_position, self.checkpoint_written = \
                self._store.checkpoint_position()
            self.first_id = self._store.first_journal_id()
            self._stack = self._stack.pop_all()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def lines(self) -> Iterator[bytes]:
        return journal_lines(self._store, self.counts)

    def summary(self) -> str:
        counts = self.counts
        text = f"exported {counts['exported']:,} messages from {self.path}"
        if counts["base64"]:
            text += f" ({counts['base64']:,} of them not JSON objects, as payload_base64)"
        if counts["too_long"]:
            text += (f"; left out {counts['too_long']:,} longer than a replay reads (far "
                     f"past the protocol's size limit, so refused by any collector)")
        # Journal ids count from 1; an empty journal after a checkpoint lost all up to it.
        trimmed = self.checkpoint_position if self.first_id is None else self.first_id - 1
        if self.checkpoint_written is None:
            text += "; no checkpoint yet, so the journal holds every message received"
        elif trimmed == 0:
            text += "; the journal holds every message received ([storage] keep_journal)"
        else:
            when = time.strftime("%Y-%m-%d %H:%M:%S %z",
                                 time.localtime(self.checkpoint_written))
            text += (f"; only those received since the checkpoint of {when}: the "
                     f"{trimmed:,} messages journaled before it are in its aggregates and "
                     f"no longer in the journal ([storage] keep_journal keeps them)")
        return text + "."


def _json_object(payload: bytes) -> bool:
    """Whether ``payload`` can stand in a line as it is: one JSON object, nothing around
    it, on one line (so that a replay hands the ingestor these very bytes)."""
    if not (payload.startswith(b"{") and payload.endswith(b"}")) \
            or b"\n" in payload or b"\r" in payload:
        return False
    try:
        return isinstance(msgspec.json.decode(payload), dict)
    except (msgspec.DecodeError, UnicodeDecodeError):  # or nested too deep
        return False


def export_line(topic: str, payload: bytes, received: float | None = None) -> bytes | None:
    """One message as a recording line, ending in a newline: the payload as it stands if
    it is a JSON object, else in ``payload_base64``; None if the line would be longer than
    a replay reads (``MAX_LINE_BYTES``: only a payload far past the protocol's size limit,
    which any collector refuses, can make it so)."""
    return _line_of(topic, payload, received, as_json=_json_object(payload))


def _line_of(topic: str, payload: bytes, received: float | None, *, as_json: bool) \
        -> bytes | None:
    parts = [b'{"topic":', msgspec.json.encode(topic)]
    if as_json:
        parts += [b',"payload":', payload]
    else:
        parts += [b',"payload_base64":"', base64.b64encode(payload), b'"']
    if received is not None:
        parts += [b',"received":', msgspec.json.encode(received)]
    parts.append(b"}\n")
    line = b"".join(parts)
    return line if len(line) - 1 <= MAX_LINE_BYTES else None


def journal_lines(store: CollectorStore, counts: collections.Counter) -> Iterator[bytes]:
    """Every message of ``store``'s journal, oldest first, as a recording line, from one
    consistent state of the file (a running collector may append and checkpoint
    meanwhile), read in bounded groups.  ``counts``: ``exported``, of which ``base64``
    (payloads that are not a JSON object), and ``too_long`` (left out).

    The journal holds only what came after the last checkpoint: a checkpoint deletes the
    rows it includes (``store.checkpoint_position``)."""
    with store.reading():
        position, more = 0, True
        while more:
            rows, more = store.read_journal(position)
            for row_id, topic, payload, received in rows:
                position = row_id
                as_json = _json_object(payload)
                line = _line_of(topic, payload, received, as_json=as_json)
                if line is None:
                    counts["too_long"] += 1
                    continue
                counts["exported"] += 1
                counts["base64"] += not as_json
                yield line
