"""Re-analysing a recorded stream offline (``edge-collector replay``; ``export`` writes
recordings: ``collector.tools.export``).

A recording is JSON lines, one MQTT message each::

    {"topic": "ldp/v1/<fleet>/<agent>/<channel>", "payload": {... the message ...}}

optionally with ``"received"``, when the collector received it (seconds since the
epoch; ``export`` writes it), and with ``"payload_base64"`` instead of ``payload`` for
a payload that is not a JSON object as it stands: what the journal keeps of messages
that were not JSON (garbage, a cleared status's empty payload), so that an export
loses nothing.  Other keys are ignored.

``replay_lines`` gives each line's payload, byte for byte as it stands in the line,
to the live collector's ``ingest.Ingestor``: every check of the typed protocol,
de-duplication by (agent, channel, seq), the same estimators, and the same
``GET /api/channels`` document (``views.Views``).  What differs from a live collector:

* no receiving clock: reports are not refused as dated too far ahead of it or behind
  it (``future``, ``stale``), since a recording is read at any later time;
* no collector-wide caps (``[limits]`` agents, channels, series, statuses,
  categories): only memory bounds a study (``IngestLimits.offline``).  Every bound of
  a single message applies as always, and ``[registry]`` too if the configuration has
  one;
* the time a message was received is its line's ``received``, else the time the
  replay started; the document's ``t`` is the latest of those of the messages taken
  (accepted, duplicates, statuses: not those refused), or the start without any.

A line that is not a recording line (not JSON, no topic or payload, a wrong type,
longer than ``MAX_LINE_BYTES``) is counted by reason (``line:<reason>``) and changes
nothing else; the ingestor's own outcomes are counted as it returns them
(``accepted``, ``duplicate``, ``status``, ``ignored``, ``rejected:<reason>``).  Memory
does not grow with the number of lines, only with the aggregates (and, as in a live
collector, the sequence trackers: per gap, not per number).

``replay_lines`` does no I/O.  ``bounded_lines`` reads a stream it is handed (a file's
lines with a bound on each, for ``replay_lines``); ``collector.cli`` opens and writes
the files.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import msgspec

from collector.aggregation.ingest import Ingestor
from collector.aggregation.limits import ingest_limits
from collector.api.documents import Views
from collector.config import CollectorConfig, parse_collector_config
from collector.estimation.jsonsafe import json_safe
from collector.storage.states import AggregateSettings
from collector.storage.store import READ_BYTES, READ_ROWS
from edge_agent import protocol

# One line at most, without its end of line: a payload as large as the collector's network
# process takes (the protocol's MAX_REPORT_BYTES plus an MQTT packet's 64 KiB of header and
# topic) written in base64 (4/3 of it), and its topic escaped, with room to spare.  A longer
# line is counted (``line:too_long``) and skipped unread.
MAX_LINE_BYTES = 3 * protocol.MAX_REPORT_BYTES
SKIP_CHUNK_BYTES = 1 << 20  # the rest of a line too long is read in pieces of this size

class ReplayError(ValueError):
    """A recording that cannot be replayed as a whole (the message says why)."""


class _Line(msgspec.Struct):
    """A recording line.  ``payload`` stays the exact bytes of its JSON value: those are
    the message the ingestor checks, as a live collector checks what it received."""

    topic: str
    payload: msgspec.Raw = msgspec.Raw()  # empty: absent (a JSON value is never empty)
    payload_base64: str | None = None
    received: float | None = None


_line_decoder = msgspec.json.Decoder(_Line)


def _line_problem(error: msgspec.ValidationError) -> str:
    text = str(error)
    if text.startswith("Object missing required field `topic`"):
        return "no_topic"
    if text.startswith("Expected `object`") and " - at `$" not in text:
        return "not_an_object"
    return "wrong_type"  # a key of the wrong type (or a number out of range)


@dataclass(frozen=True)
class ReplayResult:
    """What a replay gave: the ``GET /api/channels`` document and the count of every
    line's outcome."""

    channels: dict  # the document of GET /api/channels, as its JSON reads back
    counts: collections.Counter  # per line: the ingestor's outcome, or "line:<reason>"
    lines: int  # lines read
    fleet: str
    settings: AggregateSettings
    first_lines: dict[str, int]  # the number of the first line of each outcome (from 1)
    ingestor: Ingestor = field(repr=False, compare=False)  # the aggregates themselves

    @property
    def accepted(self) -> int:
        return self.counts["accepted"]

    @property
    def duplicates(self) -> int:
        return self.counts["duplicate"]

    @property
    def rejected(self) -> dict[str, int]:
        """Lines refused, by reason: ``line:<reason>`` for what is not a recording line,
        the ingestor's reason (``bad_code``, ``spoofed``, ...) for a refused message."""
        out = {}
        for outcome, count in sorted(self.counts.items()):
            if outcome.startswith("line:"):
                out[outcome] = count
            elif outcome.startswith("rejected:"):
                out[outcome.partition(":")[2]] = count
        return out

    def summary(self) -> str:
        """One paragraph for a person: lines read, accepted, duplicates, rejected by
        reason."""
        counts, rejected = self.counts, self.rejected
        parts = [f"{counts['accepted']:,} accepted", f"{counts['duplicate']:,} duplicates"]
        if counts["status"]:
            parts.append(f"{counts['status']:,} statuses")
        if counts["ignored"]:
            parts.append(f"{counts['ignored']:,} ignored (not a report or status of the "
                         f"fleet)")
        if counts["blank"]:
            parts.append(f"{counts['blank']:,} blank")
        parts.append(f"{sum(rejected.values()):,} rejected")
        text = (f"replayed {self.lines:,} lines of fleet {self.fleet} "
                f"({self.settings.bins} bins, {self.settings.window_seconds:g} s windows): "
                + ", ".join(parts))
        if rejected:
            first = {outcome.removeprefix("rejected:"): line
                     for outcome, line in self.first_lines.items()}
            text += " (by reason: " + "; ".join(
                f"{reason} {count:,}, first on line {first[reason]:,}"
                for reason, count in rejected.items()) + ")"
        return (f"{text}.  Aggregates of {len(self.channels['channels']):,} channels and "
                f"{len(self.channels['agents']):,} agents; not checked offline: report times "
                f"against a clock, and the [limits] caps.")


class Replay:
    """A replay under way: ``feed`` lines (in any number of calls), then ``result``."""

    def __init__(self, config: CollectorConfig | None = None, *,
                 started: float | None = None):
        """``config``: its fleet, ``[aggregates]`` and ``[registry]``; None: the fleet of
        the lines' topics (all must be of one fleet) and the defaults for the rest.
        ``started``: the time a message without ``received`` counts as received."""
        self.started = time.time() if started is None else started
        self.inferred = config is None
        self.ingestor = None if config is None else self._ingestor(config)
        self.counts: collections.Counter = collections.Counter()
        self.first_lines: dict[str, int] = {}
        self.lines = 0
        # When the latest message the aggregates hold (not one refused) was received.
        self.as_of: float | None = None

    @staticmethod
    def _ingestor(config: CollectorConfig) -> Ingestor:
        return Ingestor.from_settings(config.fleet, config.aggregate_settings,
                                      ingest_limits(config).offline())

    def feed(self, lines: Iterable[str | bytes]) -> None:
        """Replay ``lines``, aggregating their codes in groups of at most ``READ_ROWS``
        lines and ``READ_BYTES`` of payloads (``Ingestor.batch``: what a group holds is
        bounded), as the live collector applies its journal.  ``ReplayError`` if they
        mix fleets without a configuration."""
        iterator = iter(lines)
        while self._feed_group(iterator):
            pass

    def _feed_group(self, iterator: Iterator) -> bool:
        """Lines up to a group's bounds; False once they ran out."""
        batching = self.ingestor is not None
        with self.ingestor.batch() if batching else contextlib.nullcontext():
            size = 0
            for _ in range(READ_ROWS):
                line = next(iterator, None)
                if line is None:
                    return False
                size += self._line(line)
                if size >= READ_BYTES or (not batching and self.ingestor is not None):
                    break  # full, or the first line of the fleet: batch from the next
        return True

    def _count(self, outcome: str) -> int:
        self.counts[outcome] += 1
        self.first_lines.setdefault(outcome, self.lines)
        return 0

    def _line(self, line: str | bytes) -> int:
        """Replay one line; the size of the payload it gave the ingestor."""
        self.lines += 1
        if isinstance(line, str):
            if len(line) > MAX_LINE_BYTES:  # more bytes still in UTF-8
                return self._count("line:too_long")
            try:
                line = line.encode()
            except UnicodeEncodeError:  # a lone surrogate: no file holds that
                return self._count("line:not_json")
        end = 2 if line.endswith(b"\r\n") else 1 if line.endswith(b"\n") else 0
        if len(line) - end > MAX_LINE_BYTES:
            return self._count("line:too_long")
        if not line or line.isspace():
            return self._count("blank")
        try:
            message = _line_decoder.decode(line)
        except msgspec.ValidationError as exc:
            return self._count(f"line:{_line_problem(exc)}")
        except (msgspec.DecodeError, UnicodeDecodeError):  # msgspec's error for a string
            return self._count("line:not_json")            # that is not UTF-8
        payload = self._payload(message)
        if isinstance(payload, str):
            return self._count(f"line:{payload}")
        if message.received is not None and not math.isfinite(message.received):
            return self._count("line:wrong_type")
        fleet = protocol.topic_fleet(message.topic)
        if self.ingestor is None:
            if fleet is None:  # not a topic of any fleet: every ingestor ignores it
                return self._count("ignored")
            self.ingestor = self._ingestor(parse_collector_config({"fleet": fleet}))
        elif self.inferred and fleet is not None and fleet != self.ingestor.fleet:
            raise ReplayError(
                f"line {self.lines} is a message of fleet {fleet!r}, earlier lines of fleet "
                f"{self.ingestor.fleet!r}: a replay aggregates one fleet; name the one to "
                f"replay in a configuration ([fleet]; the other fleets' lines are then "
                f"ignored), or split the file")
        now = self.started if message.received is None else message.received
        outcome = self.ingestor.ingest(message.topic, payload, now)
        if outcome in ("accepted", "duplicate", "status"):  # what the aggregates hold
            self.as_of = now if self.as_of is None else max(self.as_of, now)
        self._count(outcome)
        return len(payload)

    @staticmethod
    def _payload(message: _Line) -> bytes | str:
        """The message's payload, or why the line has none."""
        raw, encoded = bytes(message.payload), message.payload_base64
        if raw and encoded is not None:
            return "two_payloads"
        if raw:
            return raw if raw.startswith(b"{") else "wrong_type"
        if encoded is None:
            return "no_payload"
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):  # ValueError: a character beyond ASCII
            return "bad_base64"

    def result(self) -> ReplayResult:
        """The aggregates as ``GET /api/channels`` shows them, as of the latest message
        received (``views.Views``, the live collector's own document); ``ReplayError``
        if no configuration was given and no line named a fleet."""
        if self.ingestor is None:
            raise ReplayError("no line is a message of a fleet (ldp/v1/<fleet>/...): "
                              "nothing tells which fleet to replay; name it in a "
                              "configuration")
        as_of = self.started if self.as_of is None else self.as_of
        document = Views(lambda: self.ingestor, clock=lambda: as_of).channels_json()
        return ReplayResult(channels=json_safe(document), counts=collections.Counter(self.counts),
                            lines=self.lines, fleet=self.ingestor.fleet,
                            settings=self.ingestor.settings(),
                            first_lines=dict(self.first_lines), ingestor=self.ingestor)


def replay_lines(lines: Iterable[str | bytes],
                 config: CollectorConfig | None = None) -> ReplayResult:
    """Replay a recording's ``lines`` (text or bytes, each with or without its end of
    line) through the live collector's validation, de-duplication and estimators; see the
    module's docstring.  ``config``: its fleet, ``[aggregates]`` and ``[registry]``
    (None: the lines' one fleet and the defaults).  ``ReplayError`` for lines that mix
    fleets without a ``config``, or that name none.

    Read a file through ``bounded_lines``: iterating over a file object reads each line
    whole, however long."""
    replay = Replay(config)
    replay.feed(lines)
    return replay.result()


def bounded_lines(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a binary stream, read with a bounded ``readline``: a line longer than
    ``limit`` bytes is given as its first ``limit + 1`` (so that ``replay_lines`` counts it
    too long) and the rest of it is skipped unread into memory."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            while True:  # the rest of this line, piece by piece
                rest = stream.readline(SKIP_CHUNK_BYTES)
                if not rest or rest.endswith(b"\n"):
                    break
        yield line
