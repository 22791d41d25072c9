"""Checkpoints: a collector's whole state, saved in its SQLite file and restored at start.

A checkpoint is the typed ``edge_agent.protocol.states.Checkpoint`` (versioned
JSON): the aggregates exactly as a shard publishes them, the sequence
trackers, and a shard's held reports.  It is stored with the journal position
it includes (``store.CollectorStore.checkpoint``); ``restore`` loads it and
replays the journal after it, which gives exactly the committed state.

Checkpoints written before the typed codec (pickles) are migrated on load
(``checkpoint_v0``); anything else that cannot be read stops the collector with
a message saying which file and why, instead of starting empty.
"""

from __future__ import annotations

import logging

from edge_agent.protocol import Rejected, ValidReport, check_report
from edge_agent.protocol.states import TrackerState, decode_checkpoint, encode_checkpoint

from . import checkpoint_v0
from .claims import ClaimBook
from .config import CollectorConfig
from .dedup import SeqTracker
from .ingest import Ingestor
from .registry import ingest_limits
from .stats import StateError
from .store import CollectorStore

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (the message says where and why)."""


def tracker_states(ingestor: Ingestor) -> list[TrackerState]:
    return [tracker.to_state(agent, channel)
            for (agent, channel), tracker in ingestor.trackers.items()]


def with_trackers(ingestor: Ingestor, trackers: list[TrackerState]) -> Ingestor:
    ingestor.trackers = {(state.agent, state.channel): SeqTracker.from_state(state)
                         for state in trackers}
    return ingestor


def dump(ingestor: Ingestor) -> bytes:
    held = ingestor.claims.held_reports() if ingestor.claims is not None else []
    return encode_checkpoint(ingestor.to_state(), tracker_states(ingestor), held)


def load(payload: bytes) -> tuple[Ingestor, list[tuple[ValidReport, float]]]:
    """(the ingestor with its trackers, a shard's held reports with their arrival)."""
    if checkpoint_v0.is_legacy(payload):
        try:
            payload = checkpoint_v0.migrate(payload)
        except Exception as exc:  # whatever an old file holds: say so, never start empty
            raise CheckpointError(f"an old (pickled) checkpoint that cannot be migrated: "
                                  f"{type(exc).__name__}: {exc}") from None
    try:
        checkpoint = decode_checkpoint(payload)
        held = [(check_report(entry.report), entry.received) for entry in checkpoint.held]
        ingestor = Ingestor.from_state(checkpoint.state)
    except Rejected as exc:
        raise CheckpointError(f"{exc.reason}: {exc.detail}") from None
    except StateError as exc:
        raise CheckpointError(str(exc)) from None
    return with_trackers(ingestor, checkpoint.trackers), held


def attach_claims(config: CollectorConfig, ingestor: Ingestor,
                  held: list[tuple[ValidReport, float]]) -> None:
    """Give a shard's ingestor its claim book with the reports it held; a collector that
    is no longer a shard settles what it held alone."""
    if config.shard_name is not None:
        ingestor.claims = ClaimBook(config.shard_name, config.broker.shared_group,
                                    peer_timeout=config.shard.peer_timeout_seconds, held=held)
        return
    ingestor.claims = None
    for report, received in held:
        tracker = ingestor.trackers.get((report.agent, report.channel))
        if tracker is not None and tracker.seen(report.seq):
            ingestor.duplicate(report)
        else:
            ingestor.accept(report, received)


def restore(config: CollectorConfig, store: CollectorStore) -> tuple[Ingestor, int]:
    """The checkpointed ingestor with the journal replayed on top, and its journal position;
    it applies the configuration's limits (and reads the registry file)."""
    limits = ingest_limits(config)
    state, upto = store.load()
    held: list = []
    if state is None:
        ingestor = Ingestor.from_settings(config.fleet, config.aggregate_settings, limits)
    else:
        try:
            ingestor, held = load(state)
        except CheckpointError as exc:
            raise CheckpointError(
                f"{store.path}: the checkpoint cannot be read ({exc}); move the file away to "
                f"start with empty aggregates") from None
        if ingestor.fleet != config.fleet:
            raise ValueError(f"{store.path} holds fleet {ingestor.fleet!r}, the config says "
                             f"{config.fleet!r}: use another storage.path")
        ingestor.limits = limits
    attach_claims(config, ingestor, held)
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
