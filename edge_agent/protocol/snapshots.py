"""Aggregate snapshots: a channel's cumulative estimates, retained by the collector on
ldp/v1/<fleet>/_aggregates/<channel> (docs/reference/API.md)."""

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, Struct

from edge_agent.protocol.codec import Rejected, decode_checked, define, encode
from edge_agent.protocol.descriptions import MechanismDescription
from edge_agent.protocol.fields import CategoryLabel, Count, Finite, Name, Text, Unit
from edge_agent.protocol.reports import Strategy

# -- aggregate snapshots (retained on ldp/v1/<fleet>/_aggregates/<channel>; docs/reference/API.md) -

Estimate = float | None  # None where the data cannot tell (or the value is not finite)


# How a linear channel's mean was estimated (docs/reference/API.md "How the mean is estimated");
# "unbiased", "affine" and "ems" are the names older collectors published.
MeanMethod = Literal["raw", "inversion", "reconstruction", "shrinkage", "unbiased", "affine",
                     "ems"]


class MeanCandidate(Struct, forbid_unknown_fields=True):
    """One estimator the collector considered, and its estimated root mean squared error."""

    estimate: Estimate
    rmse: Estimate


class MeanEstimate(Struct, forbid_unknown_fields=True, kw_only=True):
    raw: Estimate
    estimate: Estimate
    stderr: Estimate
    bias_bound: Estimate
    ci95: tuple[Estimate, Estimate] | None
    method: MeanMethod | None
    candidates: dict[Literal["raw", "inversion", "reconstruction", "shrinkage"],
                     MeanCandidate] | None = None
    note: Text | None = None


class Histogram(Struct, forbid_unknown_fields=True, kw_only=True):
    edges: list[float]
    raw: list[float]
    estimate: list[float] | None
    # What ``estimate`` is: the EM reconstruction (with ``smoothing``, 1 = EMS, 0 =
    # maximum likelihood) or the raw histogram where that is expected to be closer.
    method: Literal["reconstruction", "raw"] | None = None
    smoothing: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None


class Spread(Struct, forbid_unknown_fields=True, kw_only=True):
    """How widely the readings spread: the standard deviation of the reconstructed
    histogram (in the values' unit), with a 95% interval; what an agent's planner reads
    (``[privacy] plan_spread = "auto"``)."""

    estimate: Estimate
    ci95: tuple[Estimate, Estimate] | None


class LinearSummary(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    mean: MeanEstimate
    histogram: Histogram
    quantiles: dict[str, Estimate] | None
    count: Count | None = None  # per axis of a vector channel
    spread: Spread | None = None  # None: no reports, or published by an older collector


class ResultantLength(Struct, forbid_unknown_fields=True, kw_only=True):
    """The reports' mean resultant length (``raw``) and the readings' (``estimate``:
    bias-corrected, divided by rho(eps), not clipped, so noise can take it above 1),
    its standard error and 95% interval (within [0, 1]); collector.estimation.circular."""

    raw: Estimate
    estimate: Estimate
    stderr: Estimate = None
    ci95: tuple[Estimate, Estimate] | None = None


class DirectionInterval(Struct, forbid_unknown_fields=True, kw_only=True):
    """The mean direction's standard error and 95% interval, circular_mean ± half_width
    (``ci95`` runs counter-clockwise from its first end to its second, through the
    origin where the first is larger); null, with ``reason``, where the reports cannot
    give a direction."""

    stderr: Estimate
    half_width: Estimate
    ci95: tuple[Estimate, Estimate] | None
    reason: Text | None


class CircularSummary(Struct, forbid_unknown_fields=True, kw_only=True):
    circular_mean: Estimate
    direction: DirectionInterval | None = None  # None: published by an older collector
    resultant_length: ResultantLength
    circular_std: Estimate
    circular_std_reason: Text | None = None
    # The covariance behind the intervals: the reports' sample covariance, or a bound
    # (aggregates restored from a state without the doubled-angle sums).
    covariance: Literal["sample", "bound"] | None = None
    histogram: Histogram


class MeanVector(Struct, forbid_unknown_fields=True):
    x: Estimate
    y: Estimate
    magnitude: Estimate
    direction: Estimate


class PolarSummary(Struct, forbid_unknown_fields=True, kw_only=True):
    radius: LinearSummary
    angle: CircularSummary
    mean_vector: MeanVector


class VectorSummary(Struct, forbid_unknown_fields=True, kw_only=True):
    axes: dict[Name, LinearSummary]
    strategy: Strategy


class Frequencies(Struct, forbid_unknown_fields=True):
    """Per category (in ``labels`` order): the share of reports supporting it, the
    unbiased share, its standard error and 95% interval, and the consistent share
    (non-negative, summing to 1: Norm-Sub).  ``cluster_stderr``: a memoized channel's
    total's standard error with each agent's reports taken together (cluster-robust;
    ``stderr`` is never below it); null elsewhere."""

    labels: list[CategoryLabel]
    raw: list[Estimate]
    estimate: list[Estimate]
    stderr: list[Estimate]
    ci95: list[tuple[Estimate, Estimate] | None]
    shares: list[Estimate]
    cluster_stderr: list[Estimate] | None = None


class CategoricalSummary(Struct, forbid_unknown_fields=True, kw_only=True):
    frequencies: Frequencies


class OtherSeries(Struct, forbid_unknown_fields=True):
    mechanism: MechanismDescription
    count: Count


# A channel's snapshot (its entry of GET /api/channels): what the channel is, then its
# kind's summary, side by side in one object.
_SNAPSHOT_HEADER = [("channel", Name), ("t", Finite), ("mechanism", MechanismDescription),
                    ("count", Count), ("messages", Count), ("agents", Count),
                    ("other_series", list[OtherSeries]), ("unit", Unit | None, None),
                    ("angle_unit", Literal["rad", "deg"] | None, None)]
SNAPSHOTS: dict[str, type[Struct]] = {
    kind: define(__name__, f"{kind.title()}Snapshot", summary, kind, _SNAPSHOT_HEADER,
                 tag_field="kind")
    for kind, summary in (("linear", LinearSummary), ("circular", CircularSummary),
                          ("polar", PolarSummary), ("vector", VectorSummary),
                          ("categorical", CategoricalSummary))}
ChannelSnapshot = Union[tuple(SNAPSHOTS.values())]  # noqa: UP007


API_ONLY = ("window", "state", "series", "resolutions", "fleet_mean", "fleet_window")


def snapshot(view: dict, *, channel: str, t: float) -> bytes:
    """A channel's API entry (``Views``) as its typed snapshot message: the cumulative
    aggregates of its series (the entry's latest ``window``, its ``state``, the results
    store's ``series`` key and ``resolutions`` for history queries, and the mean of all
    wearers over the channel's series, ``fleet_mean`` and ``fleet_window``, are the
    API's, left out)."""
    summary = {key: value for key, value in view.items() if key not in API_ONLY}
    return encode(msgspec.convert({**summary, "channel": channel, "t": t}, ChannelSnapshot))


# -- what an agent's planner reads of a snapshot ([privacy] plan_spread = "auto") ------------

# Most bytes of a snapshot an agent decodes: a channel's histogram of up to 1,000 bins, its
# estimates and other series fit many times over; anything larger is refused unread.
MAX_SNAPSHOT_BYTES = 1 << 20


class FleetSpread(Struct, kw_only=True):
    """The part of a channel's snapshot a planner uses: its kind, how many agents reported
    it, and (a linear channel's) how widely the readings spread.  Every other field is
    skipped unread."""

    kind: Literal["linear", "circular", "polar", "vector", "categorical"]
    agents: Count
    spread: Spread | None = None


_fleet_spread_decoder = msgspec.json.Decoder(FleetSpread)


def decode_fleet_spread(payload: bytes) -> FleetSpread | None:
    """A snapshot's ``FleetSpread``, None for an empty payload (a cleared retained
    message); ``Rejected`` for an oversized or malformed one."""
    if not payload:
        return None
    if len(payload) > MAX_SNAPSHOT_BYTES:
        raise Rejected("oversized", f"{len(payload)} bytes")
    return decode_checked(_fleet_spread_decoder, payload, {})
