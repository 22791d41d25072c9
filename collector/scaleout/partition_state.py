"""A partition's state as an ``Ingestor``: decoded and checked, for its next owner and for
the merge view alike (``collector.storage.states.PartitionState``)."""

from __future__ import annotations

from collector.aggregation.ingest import Ingestor
from collector.aggregation.stats import StateError
from collector.storage.states import AggregateSettings, PartitionState, decode_partition_state
from edge_agent.protocol import Rejected


class PartitionStateRejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def partition_of_key(key: str) -> int | None:
    """The partition a key of the state bucket names (``p.<n>``), or None."""
    prefix, _, number = key.partition(".")
    if prefix != "p" or not number.isdigit() or len(number) > 4:
        return None
    return int(number)


def decode_partition(payload: bytes, *, partition: int, fleet: str,
                     settings: AggregateSettings) -> tuple[PartitionState, Ingestor]:
    """A scale-out partition's state (docs/guides/SCALE_OUT.md) and its ``Ingestor`` (without
    the sequence trackers), or ``PartitionStateRejected``."""
    try:
        document = decode_partition_state(payload, partition)
    except Rejected as exc:
        raise PartitionStateRejected(exc.reason, exc.detail) from None
    if document.state.fleet != fleet:
        raise PartitionStateRejected("fleet", f"not a state of fleet {fleet!r}")
    if document.state.settings != settings:
        raise PartitionStateRejected("settings", f"aggregates settings "
                                                 f"{document.state.settings} differ from "
                                                 f"ours {settings}"[:300])
    try:
        return document, Ingestor.from_state(document.state)
    except StateError as exc:
        raise PartitionStateRejected("schema", str(exc)[:300]) from None
    except (RecursionError, MemoryError, OverflowError, TypeError, ValueError,
            AttributeError, KeyError, IndexError) as exc:
        raise PartitionStateRejected("schema",
                                     f"{type(exc).__name__}: {str(exc)[:200]}") from None
