"""Checkpoints: a collector's whole state, saved in its SQLite file and restored at start.

A checkpoint is the typed ``collector.storage.states.Checkpoint`` (versioned
JSON): the aggregates exactly as a scale-out partition's state carries them,
and the sequence trackers.  It is stored with the journal position it
includes (``store.CollectorStore.checkpoint``); ``restore`` loads it and
replays the journal after it, which gives exactly the committed state.

Checkpoints of the removed collector shards may also hold reports the shard
had kept aside uncounted (``held``); ``restore`` applies each once.

A checkpoint that cannot be read (among them the pickles of collectors before the
typed codec, which no release wrote) stops the collector with a message saying
which file and why, instead of starting empty.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import msgspec

from collector.aggregation.dedup import SeqTracker
from collector.aggregation.ingest import Ingestor
from collector.aggregation.limits import ingest_limits
from collector.aggregation.stats import StateError
from collector.config import CollectorConfig
from collector.storage.states import TrackerState, decode_checkpoint, encode_checkpoint
from collector.storage.store import CollectorStore
from edge_agent.protocol import Rejected, ValidReport, check_report

log = logging.getLogger(__name__)


# What a pickle (protocol 2 and later) starts with.
PICKLE_PROTOCOL = b"\x80"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (the message says where and why)."""


def tracker_states(ingestor: Ingestor) -> list[TrackerState]:
    return [tracker.to_state(agent, channel)
            for (agent, channel), tracker in ingestor.trackers.items()]


def with_trackers(ingestor: Ingestor, trackers: list[TrackerState]) -> Ingestor:
    ingestor.trackers = {(state.agent, state.channel): SeqTracker.from_state(state)
                         for state in trackers}
    return ingestor


# Where the series and the pending windows go in the encoded checkpoint: a NUL byte and a
# SOH byte, which msgspec's JSON never holds (it escapes control characters inside
# strings), so each is found exactly once.
_SERIES_MARK = msgspec.Raw(b"\x00")
_PENDING_MARK = msgspec.Raw(b"\x01")
PART_BYTES = 1 << 20  # the checkpoint is written in parts of about this size


def dump_parts(ingestor: Ingestor, part_bytes: int = PART_BYTES) -> Iterator[bytes]:
    """The checkpoint's JSON in parts of about ``part_bytes`` (their concatenation is
    ``dump``'s), each series and each batch of pending windows encoded as the parts are
    taken: no copy of the whole state exists at once (at the default limits three of about
    40 MB did: the series', the state's, and SQLite's; and a burst's quarter of a million
    pending windows were 9 MB of JSON, copied three times over).  Take them while
    ``ingestor`` does not change."""
    envelope = encode_checkpoint(
        ingestor.to_state(series_mark=_SERIES_MARK, pending_mark=_PENDING_MARK),
        tracker_states(ingestor), held=[])
    pieces = {bytes(_SERIES_MARK): ingestor.encoded_series(),
              bytes(_PENDING_MARK): ingestor.encoded_pending()}
    part, at = bytearray(), 0
    for mark_at in sorted(envelope.index(mark) for mark in pieces):
        part += envelope[at:mark_at]
        for i, piece in enumerate(pieces[envelope[mark_at:mark_at + 1]]):
            if i:
                part += b","
            part += piece
            if len(part) >= part_bytes:
                yield bytes(part)
                part.clear()
        at = mark_at + 1
    part += envelope[at:]
    yield bytes(part)


def dump(ingestor: Ingestor) -> bytes:
    return b"".join(dump_parts(ingestor))


def load(payload: bytes, *, recording: bool = False) \
        -> tuple[Ingestor, list[tuple[ValidReport, float]]]:
    """(the ingestor with its trackers, the reports an old shard's checkpoint held, with
    their arrival; none in checkpoints written since)."""
    if payload[:1] == PICKLE_PROTOCOL:
        raise CheckpointError("a pickled checkpoint of a collector before the typed codec "
                              "(no release wrote one): not read")
    try:
        checkpoint = decode_checkpoint(payload)
        held = [(check_report(entry.report), entry.received) for entry in checkpoint.held]
        ingestor = Ingestor.from_state(checkpoint.state, recording=recording)
    except Rejected as exc:
        raise CheckpointError(f"{exc.reason}: {exc.detail}") from None
    except StateError as exc:
        raise CheckpointError(str(exc)) from None
    return with_trackers(ingestor, checkpoint.trackers), held


def apply_held(ingestor: Ingestor, held: list[tuple[ValidReport, float]]) -> None:
    """Count the reports an old shard's checkpoint held (it had not counted them), or
    count a duplicate for each the trackers have seen; the next checkpoint holds none."""
    for report, received in held:
        tracker = ingestor.trackers.get((report.agent, report.channel))
        if tracker is not None and tracker.seen(report.seq):
            ingestor.duplicate(report)
        else:
            ingestor.accept(report, received)


def restore(config: CollectorConfig, store: CollectorStore, *,
            recording: bool = False) -> tuple[Ingestor, int]:
    """The checkpointed ingestor with the journal replayed on top, and its journal position;
    it applies the configuration's limits (and reads the registry file) and its
    resolutions (``Ingestor.adapt``).  ``recording``: closed windows go to a results store."""
    limits = ingest_limits(config)
    state, upto = store.load()
    held: list = []
    if state is None:
        ingestor = Ingestor.from_settings(config.fleet, config.aggregate_settings, limits,
                                          recording=recording)
    else:
        try:
            ingestor, held = load(state, recording=recording)
            for batch, windows in ingestor.pending.items():  # their sums: the closed table
                if any(window.sums is None for window in windows):
                    ingestor.check_saved(batch, store.closed_rows(batch))
        except StateError as exc:
            raise CheckpointError(
                f"{store.path}: the checkpoint's closed windows cannot be read ({exc}); move "
                f"the file away to start with empty aggregates") from None
        except CheckpointError as exc:
            raise CheckpointError(
                f"{store.path}: the checkpoint cannot be read ({exc}); move the file away to "
                f"start with empty aggregates") from None
        if ingestor.fleet != config.fleet:
            raise ValueError(f"{store.path} holds fleet {ingestor.fleet!r}, the config says "
                             f"{config.fleet!r}: use another storage.path")
        ingestor.limits = limits
        ingestor.adapt(config.aggregate_settings)
    apply_held(ingestor, held)
    position, replayed = upto, 0
    while True:
        rows, more = store.read_journal(position)
        with ingestor.batch():
            for row_id, topic, payload, received in rows:
                ingestor.ingest(topic, payload, received)
                position = row_id
        replayed += len(rows)
        if not more:
            break
    if state is not None or replayed:
        log.info("restored %d message(s): checkpoint plus %d journaled",
                 ingestor.counters["messages"], replayed)
    return ingestor, position
