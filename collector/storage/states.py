"""A collector's state as typed structs: one versioned codec for what is saved and exchanged.

The same types serve

* the **checkpoint** a collector writes to its SQLite file (``Checkpoint``:
  aggregates and sequence trackers), and
* the **partition state** a scale-out member writes to the NATS KV bucket for
  the next owner and the merge view (``PartitionState``, docs/guides/SCALE_OUT.md).

Both are JSON (msgspec): sums of codes are exact integers of any size, which
msgpack cannot carry.  Decoding checks every type and bound; what depends on
parameters (a block counting the same values in every statistic, sums a grid
could produce) is checked where the statistics are rebuilt
(``collector.aggregation.stats``, ``collector.aggregation.series``).  Totals are not
stored: they are sums over the agents (and over the series), which must agree.
"""

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, Struct

from edge_agent.mechanisms.categorical import MAX_CATEGORIES
from edge_agent.protocol.codec import Rejected, decode_checked, define, encode
from edge_agent.protocol.descriptions import MechanismDescription
from edge_agent.protocol.fields import (
    MAX_FIELDS,
    SEQ_LIMIT,
    Count,
    Fields,
    Finite,
    Name,
    NonNegative,
    Seq,
    Text,
    Unit,
)
from edge_agent.protocol.reports import Report, Strategy
from edge_agent.protocol.snapshots import (
    CategoricalSummary,
    CircularSummary,
    Estimate,
    LinearSummary,
    PolarSummary,
)
from edge_agent.protocol.statuses import MAX_GUARANTEES, BudgetStatus

CHECKPOINT_VERSION = 2  # 1 kept a tracker's numbers as a bitmap (read, migrated on load)
# One partition's state: written as the KV value itself when small, else as an object
# (collector.scaleout.state_objects).  256 MB holds a partition at every default [limits]
# (256 channels x 16 series x 61 windows, about 0.5 kB a linear window: 125 MB).
MAX_PARTITION_STATE_BYTES = 256 << 20
MAX_PARTITIONS = 1024  # [scale_out] partitions
MAX_TRACKER_RUNS = 1024  # collector.aggregation.dedup.MAX_RUNS
DEAD_LETTERS = 200  # recent rejects a collector keeps (and a state may carry)
MAX_REJECT_REASONS = 256

BigCount = Annotated[int, Meta(ge=0)]  # an exact sum (of codes, of squared codes)
# A bin's count.  The merge view sums one per partition in int64: bounded so that any
# MAX_PARTITIONS states sum without overflow, whatever a state claims (9.0e15 reports in
# one bin, 285 years at a million a second).
BinCount = Annotated[int, Meta(ge=0, le=(2**63 - 1) // MAX_PARTITIONS)]
# floor(t / window_seconds) for a finite t: below 2**1024 in size, beyond what msgspec's
# bounds take; Series.load_state checks it.
WindowStart = int

# -- statistics (collector.aggregation.stats): their sums, without their parameters ----------------
CountState = tuple[Count]
MomentsState = tuple[Count, BigCount, BigCount]  # n, sum of codes, sum of squared codes


class TrigState(Struct, array_like=True, forbid_unknown_fields=True):
    """n, sum of cos, sum of sin, then [sum of cos 2θ, sum of sin 2θ] (the second
    trigonometric moments, for the exact covariance of the mean resultant vector).
    States written before the doubled-angle sums existed are the first three alone
    (``doubled`` null): collector.estimation.circular then bounds the covariance instead."""

    n: Count
    x: Finite
    y: Finite
    doubled: tuple[Finite, Finite] | None = None


BinsState = tuple[list[BinCount], Count]  # counts per bin, values outside (drop)
CrossState = tuple[Count, Finite, Finite]  # n, sum of r cos, sum of r sin
SupportState = tuple[list[BinCount], Count]  # reports supporting each category, reports
# A memoized channel's total, per agent: (its reports, how many of them support each
# category), by agent id (collector.aggregation.stats.AgentSupportCounts).
AgentSupportState = dict[Name, tuple[Count, Annotated[list[BinCount],
                                                     Meta(max_length=MAX_CATEGORIES)]]]


class LinearBlockState(Struct, forbid_unknown_fields=True):
    count: CountState
    moments: MomentsState
    raw: BinsState
    out: BinsState


class CircularBlockState(Struct, forbid_unknown_fields=True):
    count: CountState
    trig: TrigState
    hist: BinsState


class CrossBlockState(Struct, forbid_unknown_fields=True):
    count: CountState
    cross: CrossState


class CategoricalBlockState(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``agents``: the reports per agent, which only a memoized channel's total keeps
    (absent from windows, other channels and states written before they were kept, so
    that these are written as before)."""

    count: CountState
    support: SupportState
    agents: AgentSupportState | None = None


class ScalarBlocks(Struct, forbid_unknown_fields=True):
    value: LinearBlockState


class CircularBlocks(Struct, forbid_unknown_fields=True):
    value: CircularBlockState


class PolarBlocks(Struct, forbid_unknown_fields=True):
    radius: LinearBlockState
    angle: CircularBlockState
    cross: CrossBlockState


class CategoricalBlocks(Struct, forbid_unknown_fields=True):
    value: CategoricalBlockState


VectorBlocks = dict[Name, LinearBlockState]


# -- series (collector.aggregation.series): one channel under one mechanism ------------------------

class _SeriesState(Struct, forbid_unknown_fields=True, tag_field="kind", kw_only=True):
    channel: Name
    mechanism: MechanismDescription
    fields: Fields | None = None
    strategy: Strategy | None = None
    unit: Unit | None = None  # the reports' (absent from states written before units)
    messages: Count
    agents: list[Name]


# A series' blocks of statistics, by kind: cumulative (``total``) and per tumbling window.
SERIES_BLOCKS = {"linear": ScalarBlocks, "circular": CircularBlocks, "polar": PolarBlocks,
                 "vector": VectorBlocks, "categorical": CategoricalBlocks}


# -- what a series' sums gave: its estimates, computed once and kept with them ----------------

class MeanPoint(Struct, forbid_unknown_fields=True):
    estimate: Estimate
    stderr: Estimate
    ci95: tuple[Estimate, Estimate] | None


class _Point(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """One window's estimates as a chart over time draws them (GET /api/channels/<name>/
    history: docs/reference/API.md): its span in seconds, its count, and the kind's estimates.
    ``too_few``: its interval spans most of the domain (``collector.aggregation.series``,
    ``too_few``): too few reports to be read as a measurement (absent: false)."""

    start: Finite
    end: Finite
    count: Count
    too_few: bool = False


class DirectionPoint(Struct, forbid_unknown_fields=True, kw_only=True):
    circular_mean: Estimate
    half_width: Estimate
    ci95: tuple[Estimate, Estimate] | None
    resultant_length: Estimate


class RadiusPoint(Struct, forbid_unknown_fields=True):
    mean: MeanPoint


class AxisPoint(Struct, forbid_unknown_fields=True):
    count: Count
    mean: MeanPoint


class SharesPoint(Struct, forbid_unknown_fields=True):
    shares: Annotated[list[Estimate], Meta(max_length=MAX_CATEGORIES)]
    estimate: Annotated[list[Estimate], Meta(max_length=MAX_CATEGORIES)]
    ci95: Annotated[list[tuple[Estimate, Estimate] | None], Meta(max_length=MAX_CATEGORIES)]


class LinearPoint(_Point):
    mean: MeanPoint


class CircularPoint(_Point):
    circular_mean: Estimate
    half_width: Estimate
    ci95: tuple[Estimate, Estimate] | None
    resultant_length: Estimate


class PolarPoint(_Point):
    radius: RadiusPoint
    angle: DirectionPoint


class VectorPoint(_Point):
    axes: Annotated[dict[Name, AxisPoint], Meta(max_length=MAX_FIELDS)]


class CategoricalPoint(_Point):
    frequencies: SharesPoint


class AxesSummary(Struct, forbid_unknown_fields=True):
    """A vector series' cumulative estimates: one linear summary per axis."""

    axes: Annotated[dict[Name, LinearSummary], Meta(max_length=MAX_FIELDS)]


# By kind: a window's point, and the cumulative estimates (the protocol's summaries).
POINTS: dict[str, type[Struct]] = {
    "linear": LinearPoint, "circular": CircularPoint, "polar": PolarPoint,
    "vector": VectorPoint, "categorical": CategoricalPoint}
SUMMARIES: dict[str, type[Struct]] = {
    "linear": LinearSummary, "circular": CircularSummary, "polar": PolarSummary,
    "vector": AxesSummary, "categorical": CategoricalSummary}

# Each kind's series: identity, counters, sums (``total``, ``windows``) and what they gave
# (``summary``: the total's estimates, ``points``: each window's), each with the count it
# was computed at (recomputed when the sums have counted more since).
#
# The coarser resolutions' open windows (``coarse``: level, start, sums), their estimates
# (``coarse_points``) and, with a results store, how far each level has been handed to it
# (``sealed``: level, first window start not handed over) are absent from states written
# before resolutions.
Level = Annotated[int, Meta(ge=0, le=8)]  # 0: the finest resolution
SERIES_STATES: dict[str, type[Struct]] = {
    kind: define(__name__, f"{kind.title()}SeriesState", _SeriesState, kind,
                 [("total", blocks), ("windows", list[tuple[WindowStart, blocks]]),
                  ("summary", tuple[Count, SUMMARIES[kind]] | None, None),
                  ("points", list[tuple[WindowStart, Count, POINTS[kind]]], []),
                  ("coarse", list[tuple[Level, WindowStart, blocks]], []),
                  ("coarse_points", list[tuple[Level, WindowStart, Count, POINTS[kind]]], []),
                  ("sealed", list[tuple[Level, WindowStart]], [])])
    for kind, blocks in SERIES_BLOCKS.items()}
SeriesState = Union[tuple(SERIES_STATES.values())]  # noqa: UP007


# -- what the results store keeps of a series and its closed windows (collector.results) -------

class StoredSeries(Struct, forbid_unknown_fields=True):
    """A series' description in the results store (``collector.results.store.SeriesRecord``)."""
    mechanism: MechanismDescription
    fields: Fields | None
    strategy: Strategy | None
    unit: Unit | None


_stored_series_decoder = msgspec.json.Decoder(StoredSeries)
_window_sums_decoders = {kind: msgspec.json.Decoder(blocks)
                         for kind, blocks in SERIES_BLOCKS.items()}
_window_point_decoders = {kind: msgspec.json.Decoder(point) for kind, point in POINTS.items()}


def decode_stored_series(payload: bytes) -> StoredSeries:
    """A stored series' description (``msgspec.DecodeError`` if it is not one)."""
    return _stored_series_decoder.decode(payload)


def decode_window_sums(kind: str, payload: bytes):
    """A stored window's sums, the kind's ``SERIES_BLOCKS`` (``msgspec.DecodeError``)."""
    return _window_sums_decoders[kind].decode(payload)


def decode_window_point(kind: str, payload: bytes):
    """A stored window's estimates, the kind's ``POINTS`` (``msgspec.DecodeError``)."""
    return _window_point_decoders[kind].decode(payload)


# -- a whole collector (collector.aggregation.ingest.Ingestor) -------------------------------------

MAX_LEVELS = 8  # resolutions ([aggregates] resolutions)


class AggregateSettings(Struct, frozen=True, forbid_unknown_fields=True):
    """What collectors must share to merge their aggregates ([aggregates] of the config).

    ``coarser``: each coarser resolution as a multiple of the one before (1m, 1h, 1d:
    60 and 24), so that a coarser window is exactly the merge of its finer ones; absent
    from states written before resolutions (the finest alone)."""

    bins: Annotated[int, Meta(ge=4, le=1000)]
    window_seconds: Annotated[float, Meta(ge=1.0, le=86400.0)]
    keep_windows: Annotated[int, Meta(ge=1, le=10_000)]
    coarser: Annotated[tuple[Annotated[int, Meta(ge=2, le=100_000)], ...],
                       Meta(max_length=MAX_LEVELS - 1)] = ()


class StatusSummary(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What a collector keeps of an agent's latest status."""

    state: Literal["online", "offline"] | None = None
    budget: BudgetStatus | None = None
    t: Finite | None = None
    # The agent's privacy guarantees as its status states them (configuration only).
    guarantees: Annotated[list[BudgetStatus], Meta(max_length=MAX_GUARANTEES)] | None = None


class AgentState(Struct, forbid_unknown_fields=True):
    messages: Count
    values: Count
    duplicates: Count
    rejects: Count
    last_seen: Finite | None
    online: bool | None
    status: StatusSummary


class DeadLetter(Struct, forbid_unknown_fields=True):
    """A rejected message, truncated (``GET /api/rejects``)."""

    t: Finite
    topic: Text
    reason: Text
    detail: Text
    payload: Text


IN_THE_STORE = msgspec.Raw(b"null")  # a PendingWindow's ``blocks``: in the ``closed`` table


class PendingWindow(Struct, array_like=True, forbid_unknown_fields=True):
    """A closed window on its way to the results store: its series (an index into the
    state's ``series``), resolution, start, whether the store may hold earlier reports of it
    (``delta``: a late report's window, merged with them there), and its sums (the
    series kind's blocks, checked when loaded).

    A checkpoint keeps the sums in the collector store's ``closed`` table instead, once,
    beside the state rather than in it (``blocks`` then JSON ``null``, with their
    ``count``): a quarter of a million windows' sums were encoded into every checkpoint,
    one a minute, until the results store had them (``collector.storage.store``)."""

    series: Count
    span: Annotated[float, Meta(ge=1.0)]  # the window's length in seconds (its resolution)
    start: WindowStart
    delta: bool
    blocks: msgspec.Raw  # null: in the collector store's ``closed`` table
    count: Count | None = None  # how many values the sums count (where they are not here)


class PendingBatch(Struct, array_like=True, forbid_unknown_fields=True):
    flush: Count
    windows: list[PendingWindow]


class IngestorState(Struct, forbid_unknown_fields=True):
    fleet: Name
    settings: AggregateSettings
    rejects: Annotated[dict[Name, Count], Meta(max_length=MAX_REJECT_REASONS)]
    agents: dict[Name, AgentState]
    series: list[SeriesState]
    # channel -> (index of its newest series in ``series``, when it was last reported)
    latest: dict[Name, tuple[Count, Finite | None]]
    dead_letters: Annotated[list[DeadLetter], Meta(max_length=DEAD_LETTERS)]
    # Windows closed and handed to the results store, not yet confirmed written there
    # (collector.results): a checkpoint keeps them until it is.
    pending: list[PendingBatch] = []
    flushes: Count = 0  # the last batch number given (each batch is written once)
    # The name its batches are written under (the store keeps the last one per name): made
    # once, and kept with the checkpoint that numbers them.
    source: Name | None = None


# -- the checkpoint (collector.storage.checkpoint) -------------------------------------------------

SeqOrNone = Annotated[int, Meta(ge=-1, lt=SEQ_LIMIT)]  # -1: none yet


class TrackerState(Struct, array_like=True, forbid_unknown_fields=True):
    """A sequence tracker (collector.aggregation.dedup): numbers up to ``floor`` counted, up to
    ``skipped`` given up on, and the runs [start, end] seen past the larger (checkpoint
    v1: a little-endian bitmap of them instead)."""

    agent: Name
    channel: Name
    floor: SeqOrNone
    skipped: SeqOrNone
    runs: Union[Annotated[list[tuple[Seq, Seq]], Meta(max_length=MAX_TRACKER_RUNS)], bytes]


class HeldReport(Struct, array_like=True, forbid_unknown_fields=True):
    """A report a checkpoint kept aside uncounted: only checkpoints written by the removed
    collector shards have any (``held``); ``collector.storage.checkpoint.restore`` applies them
    once.  New checkpoints write an empty list."""

    report: Report
    received: Finite


class Checkpoint(Struct, forbid_unknown_fields=True):
    v: Literal[1, 2]
    type: Literal["collector-checkpoint"]
    state: IngestorState
    trackers: list[TrackerState]
    held: list[HeldReport]


_checkpoint_decoder = msgspec.json.Decoder(Checkpoint)


def encode_checkpoint(state: IngestorState, trackers: list[TrackerState],
                      held: list[HeldReport]) -> bytes:
    return encode(Checkpoint(v=CHECKPOINT_VERSION, type="collector-checkpoint", state=state,
                             trackers=trackers, held=held))


def decode_checkpoint(payload: bytes) -> Checkpoint:
    return decode_checked(_checkpoint_decoder, payload, {"v": "version", "type": "version"})


# -- a scale-out partition's state (collector.scaleout, docs/guides/SCALE_OUT.md) ------------------

PARTITION_STATE_VERSION = 1


class PartitionState(Struct, forbid_unknown_fields=True):
    """One partition's aggregates and sequence trackers with the stream sequence they
    include, the value of key ``p.<partition>`` in the ``<stream>_state`` KV bucket.
    Written by the partition's owner with compare-and-set (a stale owner's write
    fails); read by the next owner and by the merge view."""

    v: Literal[1]
    type: Literal["partition-state"]
    partition: Annotated[int, Meta(ge=0, lt=MAX_PARTITIONS)]
    partitions: Annotated[int, Meta(ge=1, le=MAX_PARTITIONS)]
    owner: Name  # the member that wrote it
    t: NonNegative  # when (the member's clock)
    every: NonNegative  # how often its owner writes it
    sequence: Annotated[int, Meta(ge=0)]  # the last stream sequence applied
    state: IngestorState
    trackers: list[TrackerState]


_partition_state_decoder = msgspec.json.Decoder(PartitionState)
_PARTITION_STATE_REASONS = {"v": "version", "type": "version"}


def encode_partition_state(state: IngestorState, trackers: list[TrackerState], *,
                           partition: int, partitions: int, owner: str, now: float,
                           every: float, sequence: int) -> bytes:
    return encode(PartitionState(v=PARTITION_STATE_VERSION, type="partition-state",
                                 partition=partition, partitions=partitions, owner=owner,
                                 t=now, every=every, sequence=sequence, state=state,
                                 trackers=trackers))


class PartitionStateObject(Struct, forbid_unknown_fields=True):
    """The value of key ``p.<partition>`` when the state is larger than ``[scale_out]
    inline_state_bytes``: the object of bucket ``<stream>_state_objects`` that holds it
    (each write makes a new one, so an object never changes once a reference names it;
    the reference is written with compare-and-set like an inline state)."""

    v: Literal[1]
    type: Literal["partition-state-object"]
    partition: Annotated[int, Meta(ge=0, lt=MAX_PARTITIONS)]
    object: Annotated[str, Meta(pattern=r"^p\.[0-9]{1,4}\.[0-9a-f]{32}$")]
    size: Annotated[int, Meta(ge=0, le=MAX_PARTITION_STATE_BYTES)]


MAX_REFERENCE_BYTES = 512  # a PartitionStateObject, encoded, is far smaller
_state_object_decoder = msgspec.json.Decoder(PartitionStateObject)


def encode_state_object(*, partition: int, name: str, size: int) -> bytes:
    return encode(PartitionStateObject(v=1, type="partition-state-object",
                                       partition=partition, object=name, size=size))


def decode_state_object(payload: bytes, partition: int) -> PartitionStateObject | None:
    """The object a KV value names, or None where the value is the state itself (or not
    a reference at all: the state's decoder then says why)."""
    if len(payload) > MAX_REFERENCE_BYTES or b'"partition-state-object"' not in payload:
        return None
    try:
        reference = _state_object_decoder.decode(payload)
    except msgspec.DecodeError:
        return None
    if reference.partition != partition:
        raise Rejected("topic", "the reference's partition differs from the key's")
    return reference


def decode_partition_state(payload: bytes, partition: int) -> PartitionState:
    """The typed state of ``partition`` (the number its key gives), or ``Rejected``."""
    if len(payload) > MAX_PARTITION_STATE_BYTES:
        raise Rejected("oversized", f"{len(payload)} bytes")
    document = decode_checked(_partition_state_decoder, payload, _PARTITION_STATE_REASONS)
    if document.partition != partition:
        raise Rejected("topic", "the partition differs from the key's")
    return document
