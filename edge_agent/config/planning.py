"""The planner (``[privacy] plan = "auto"``): each channel's ε per report and how often
it reports, from the guarantees.  Pure arithmetic on the configuration; no I/O.

What a planned channel does (``edge_agent.channels``)
----------------------------------------------------
It reports one reading at a time, at batch times at least ``spacing`` seconds apart,
from a phase drawn from the CSPRNG at start (never from the readings).  The ledger keeps
a charge until the end of its bucket (``state.bucket_width``), so it counts a report in
a rolling window of length W for W + B(W) seconds: in any window of guarantee h at most

    n_h = ceil((W_h + B_h) / spacing)

of the channel's reports count (spacing between charges >= ``spacing``).  The channel
gets ``plan_weight / sum of weights`` of every guarantee (after range discovery's
reserve), so its ε per report is

    ε(spacing) = min over h of share_h / n_h(spacing)     (in NANO units, rounded down)

and the worst case of any window of guarantee h, all channels together, is at most
the guarantee: exactly it for the guarantee that binds.

Which spacing (the LDP-IDS trade-off, Ren et al., SIGMOD 2022)
--------------------------------------------------------------
A short spacing spreads the window's ε over many reports (budget division: every slot
at ε/k); a long one reports once per window at the full ε, from a sample of the fleet
in each slot (population division).  The planner takes the spacing with the smallest
error of the fleet mean over one slot of ``plan_slot`` seconds, N wearers, a fleet
spread σ (``plan_spread``, a fraction of the domain's width) and V(ε) the worst-case
variance of one report's unbiased estimate (the mechanism's exact closed form):

    each wearer reports m = slot / spacing times a slot;
    m >= 1:  N MSE = V(ε) / m
    m <  1:  a random m N of the N wearers report, once:
             N MSE = V(ε) / m + σ² (1 / m - 1)    (sampling without replacement)
    plus N B(ε)² for a linear channel, B(ε) the worst bias of its bias-removed mean
    over the domain, which no number of reports removes (OGPM's flat ends): the error
    ``mechanism = "auto"`` weighs too, N = 1,000 (PLAN_WEARERS).

The error is in units of the domain's width (a share for a categorical channel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from edge_agent.config.sources import source_rate
from edge_agent.mechanisms import (
    EPSILON_MIN,
    CircularOGPM,
    linear_mechanism,
    split_epsilon,
)
from edge_agent.mechanisms.categorical import ORACLES, LongitudinalGRR, best_oracle
from edge_agent.mechanisms.registry import AUTO_REPORTS, VECTOR, polar_mechanism
from edge_agent.state import NANO, bucket_width, to_nano_down, to_nano_up

# A planned channel's spacing is at least this much over what the counts assume, so a
# ledger clock a little slower than the wall clock (NTP slewing, at most 500 ppm) does
# not make the ledger refuse a report that the plan makes room for.
SPACING_MARGIN = 1e-3
# Most reports per slot the planner considers (more only spreads ε thinner).
MAX_REPORTS_PER_SLOT = 64
# Spacings tried between the shortest and the longest: a geometric grid of this ratio,
# then each snapped down to where its counts change.
GRID_RATIO = 1.15
# Variances are evaluated on grids of this many bits (the error's closed form hardly
# changes beyond; the reports themselves use the channel's grid_bits).
EVAL_GRID_BITS = 10
# The fleet a plan is judged for (and check-config states its error for): the wearers
# whose reports one slot's mean averages, as many as mechanism = "auto" assumes.
PLAN_WEARERS = AUTO_REPORTS


class PlanError(ValueError):
    """A configuration the planner cannot serve; the message names the key."""


@dataclass(frozen=True)
class Horizon:
    """One guarantee as the ledger counts it: ``nano`` ε in every window of ``window``
    seconds, a report counted for ``window + bucket`` seconds."""

    per: str
    nano: int
    window: float
    bucket: float

    @property
    def counted(self) -> Fraction:
        return Fraction(self.window) + Fraction(self.bucket)


@dataclass(frozen=True)
class ChannelPlan:
    name: str
    epsilon: float  # per report (a NANO multiple, the float never above it)
    spacing: float  # seconds, at least, between two reports (charge times)
    counts: tuple[int, ...]  # most of its reports any window of each guarantee counts
    shares: tuple[int, ...]  # its nano-ε of each guarantee
    reports_per_slot: float  # m
    variance: float  # V(epsilon): one report's, in units of the domain's width squared
    slot_error: float  # sqrt(N MSE) of the fleet mean over a slot, in domain widths
    bias: float = 0.0  # B(epsilon)²: the mean's worst squared bias, in widths squared

    def spend(self, horizon_index: int) -> int:
        """Most nano-ε of this channel's reports any window of the guarantee counts."""
        return self.counts[horizon_index] * to_nano_up(self.epsilon)


@dataclass(frozen=True)
class Plan:
    horizons: tuple[Horizon, ...]
    reserve_nano: int  # kept for range discovery in every window
    slot: float
    spread: float
    channels: tuple[ChannelPlan, ...]

    def channel(self, name: str) -> ChannelPlan:
        return next(c for c in self.channels if c.name == name)


def horizons_of(guarantees) -> tuple[Horizon, ...]:
    """``PrivacyConfig.horizons`` as the ledger enforces them (budgets rounded down)."""
    return tuple(Horizon(g.per, to_nano_down(g.epsilon), g.seconds, bucket_width(g.seconds))
                 for g in guarantees)


def counts(spacing: float, horizons: tuple[Horizon, ...]) -> tuple[int, ...]:
    """Most reports ``spacing`` apart (at least) any window of each horizon counts:
    ceil((W + B) / spacing), exactly."""
    step = Fraction(spacing)
    return tuple(math.ceil(h.counted / step) for h in horizons)


def snapped(spacing: float, horizons: tuple[Horizon, ...]) -> float:
    """The least spacing with the same counts as ``spacing`` (a float whose exact
    counts are those)."""
    wanted = counts(spacing, horizons)
    least = max(float(h.counted / n) for h, n in zip(horizons, wanted))
    while counts(least, horizons) != wanted:
        least = math.nextafter(least, math.inf)
    return least


def epsilon_of_nano(nano: int) -> float:
    """The largest float not above nano / NANO (what is charged never exceeds it)."""
    value = nano / NANO
    while Fraction(value) > Fraction(nano, NANO):
        value = math.nextafter(value, 0.0)
    return value


def slot_error(variance: float, spacing: float, slot: float, spread: float,
               bias: float = 0.0) -> float:
    """sqrt(N MSE) of the fleet mean over one slot (module docstring), N = PLAN_WEARERS."""
    m = slot / spacing
    sampling = spread ** 2 * max(0.0, 1.0 / m - 1.0)
    return math.sqrt(variance / m + sampling + PLAN_WEARERS * bias)


# -- one report's variance, per kind ---------------------------------------------------

def report_variance(channel, epsilon: float) -> float | None:
    """V(ε): the worst-case variance of one report's unbiased estimate of a reading, in
    units of the domain's width squared (a category's share for a categorical channel);
    None where no mechanism of the channel takes ``epsilon``."""
    try:
        return _variance(_variance_key(channel), epsilon)
    except (ValueError, OverflowError):
        return None


def report_bias(channel, epsilon: float) -> float:
    """B²(ε): the worst squared bias of a linear channel's bias-removed fleet mean over its
    domain, in units of its width squared, which no number of reports removes: where
    classical OGPM's mean is flat near an end (Theorem 3.7) a fleet is estimated at the
    flat region's edge.  The same error ``mechanism = "auto"`` weighs (``averaged_error``),
    so that the planner and the choice agree; 0 for the other kinds."""
    if channel.kind != "linear":
        return 0.0
    try:
        return _linear_bias(channel.mechanism, epsilon, *channel.start_domain)
    except (ValueError, OverflowError):
        return 0.0


@lru_cache(maxsize=65536)
def _linear_bias(name: str, epsilon: float, low: float, high: float) -> float:
    mechanism = linear_mechanism(name, epsilon=epsilon, low=low, high=high,
                                 grid_bits=EVAL_GRID_BITS)
    bias = mechanism.inversion_bias(np.linspace(low, high, 257))
    return float(np.max(bias**2)) / (high - low) ** 2


def _variance_key(channel) -> tuple:
    kind = channel.kind
    if kind == "linear":
        return (kind, channel.mechanism, *channel.start_domain)
    if kind == "vector" and channel.mechanism in VECTOR:
        return (kind, channel.mechanism, len(channel.fields), channel.k)
    if kind == "vector":
        fixed = {"split": len(channel.fields), "sample": channel.k}.get(channel.strategy)
        return (kind, channel.mechanism, *channel.domain, len(channel.fields), fixed)
    if kind == "circular":
        return (kind,)
    if kind == "polar":
        return (kind, channel.radius_max, channel.weight, channel.radius_mechanism)
    return (kind, channel.count, channel.oracle, channel.memo_epsilon)


@lru_cache(maxsize=65536)
def _variance(key: tuple, epsilon: float) -> float:
    kind = key[0]
    if kind == "linear":
        return _linear_variance(key[1], epsilon, key[2], key[3])
    if kind == "vector" and key[1] in VECTOR:
        _, name, d, k = key
        mechanism = VECTOR[name](epsilon=epsilon, dimensions=d,
                                 **({} if k is None else {"k": k}))
        # An axis' mean averages the reports it got: all n readings' (duchi-vector), or
        # k/d of them (sampled-duchi), each of variance B² - x² on [-1, 1] (width 2).
        share = getattr(mechanism, "k", d) / d
        return float(mechanism.components[0].variance(0.0)) / 4.0 / share
    if kind == "vector":
        _, name, low, high, d, fixed = key
        # Each axis gets k/d of the readings at ε/k (edge_agent.channels.vector_plan).
        # What the channel's check needs (every k <= d then takes its share too).
        if split_epsilon(epsilon, fixed or d) < EPSILON_MIN:
            raise ValueError("epsilon per axis below the least a mechanism takes")
        return min(_linear_variance(name, split_epsilon(epsilon, k), low, high) * d / k
                   for k in ([fixed] if fixed else range(1, d + 1)))
    if kind == "circular":
        return _circular_variance(CircularOGPM(epsilon=epsilon, grid_bits=EVAL_GRID_BITS))
    if kind == "polar":
        mechanism = polar_mechanism(epsilon=epsilon, radius_max=key[1], weight=key[2],
                                    period=2 * math.pi, origin=0.0, grid_bits=EVAL_GRID_BITS,
                                    radius=key[3])
        angle = mechanism.angle_mechanism
        # The split may give one part no epsilon: its raw error then (nothing to invert).
        return (_unbiased_variance(mechanism.radius_mechanism)
                + (_circular_variance(angle) if angle.epsilon > 0
                   else angle.worst_case_error(2) / angle.period ** 2))
    _, categories, oracle, memo_epsilon = key
    if memo_epsilon is not None:  # memoized: the two layers' effective GRR
        frequency_oracle = LongitudinalGRR(epsilon=epsilon, memo_epsilon=memo_epsilon,
                                           categories=categories)
    else:
        name = best_oracle(epsilon=epsilon, categories=categories) if oracle == "auto" \
            else oracle
        frequency_oracle = ORACLES[name](epsilon=epsilon, categories=categories)
    return float(np.max(frequency_oracle.variance(np.array([0.0, 0.5, 1.0]), 1)))


def _linear_variance(name: str, epsilon: float, low: float, high: float) -> float:
    return _unbiased_variance(linear_mechanism(name, epsilon=epsilon, low=low, high=high,
                                               grid_bits=EVAL_GRID_BITS))


def _unbiased_variance(mechanism) -> float:
    """max Var[M(x)] / a² over the inputs where E[M(x)] = a x + b (what the collector
    inverts), else the worst-case squared error; over the domain's width squared."""
    affine = mechanism.affine_mean() if mechanism.epsilon > 0 else None
    if affine is None:
        worst = mechanism.worst_case_error(2)
    else:
        a, _, x_lo, x_hi = affine
        worst = float(np.max(mechanism.variance(np.linspace(x_lo, x_hi, 257)))) / a ** 2
    return worst / (mechanism.high - mechanism.low) ** 2


def _circular_variance(mechanism) -> float:
    """E|e^{iM}/ρ - e^{ix}|² = 1/ρ² - 1 (E[e^{iM(x)}] = ρ e^{ix}, ρ the mean resultant
    length): the variance of the unbiased estimate of a reading's unit vector, about its
    angle's in rad² where small; over (2π)², as a share of the circle."""
    rho = mechanism.mean_resultant_length()
    return (1.0 / rho ** 2 - 1.0) / (2 * math.pi) ** 2


# -- the plan --------------------------------------------------------------------------

def candidate_spacings(horizons: tuple[Horizon, ...], shortest: float, slot: float) -> list[float]:
    """Spacings worth trying: from ``shortest`` (or slot / MAX_REPORTS_PER_SLOT) to one
    report per longest window, each snapped to where its counts change."""
    low = max(shortest, slot / MAX_REPORTS_PER_SLOT)
    high = float(horizons[-1].counted)
    if low >= high:
        return [snapped(high, horizons)]
    steps = math.ceil(math.log(high / low) / math.log(GRID_RATIO))
    grid = [low * GRID_RATIO ** i for i in range(steps)] + [high]
    # the exact breakpoints of each horizon's first counts (one, two, ... per window)
    grid += [float(h.counted / n) for h in horizons for n in range(1, 9)
             if low <= h.counted / n <= high]
    out = {snapped(spacing, horizons) for spacing in grid}
    return sorted(s for s in out if s >= low)


def plan_channel(channel, shares: tuple[int, ...], horizons: tuple[Horizon, ...], *,
                 shortest: float, slot: float, spread: float) -> ChannelPlan | None:
    """The spacing and ε of least slot error for a channel given ``shares`` (nano-ε of
    each guarantee); None if no spacing gives it an ε its mechanism takes."""
    best = None
    for spacing in candidate_spacings(horizons, shortest, slot):
        n = counts(spacing, horizons)
        nano = min(share // count for share, count in zip(shares, n))
        epsilon = epsilon_of_nano(nano)
        if epsilon < EPSILON_MIN:
            continue
        variance = report_variance(channel, epsilon)
        if variance is None:
            continue
        bias = report_bias(channel, epsilon)
        error = slot_error(variance, spacing, slot, spread, bias)
        if best is None or error < best.slot_error:
            best = ChannelPlan(channel.name, epsilon, spacing * (1 + SPACING_MARGIN), n,
                               shares, slot / spacing, variance, error, bias)
    return best


def every_slot_error(channel, plan: ChannelPlan, horizons: tuple[Horizon, ...],
                     slot: float, spread: float) -> float | None:
    """The slot error of the natural configuration for comparison: every wearer reports
    once per slot, at what the channel's shares allow (budget division: ε / w for w
    slots a window, ideally: without the ledger's bucket)."""
    n = tuple(math.ceil(Fraction(h.window) / Fraction(slot)) for h in horizons)
    epsilon = epsilon_of_nano(min(share // count for share, count in zip(plan.shares, n)))
    variance = report_variance(channel, epsilon) if epsilon >= EPSILON_MIN else None
    return None if variance is None else slot_error(variance, slot, slot, spread,
                                                    report_bias(channel, epsilon))


def make_plan(config) -> Plan:
    """The plan for an ``AgentConfig`` whose channels give no epsilon: ``PlanError``
    naming the key when a channel cannot be served."""
    privacy = config.privacy
    horizons = horizons_of(privacy.horizons)
    has_range = any(c.kind == "linear" for c in config.channels)
    reserve = to_nano_up(config.range_epsilon_limit) if has_range else 0
    for h in horizons:
        if h.nano <= reserve:
            raise PlanError(
                f"privacy.range_epsilon_max: {config.range_epsilon_limit:g} kept for range "
                f"discovery leaves nothing of the guarantee of {h.nano / NANO:g} per {h.per} "
                f"for the channels: lower it, or 0 to never join range discovery")
    total = Fraction(math.fsum(c.plan_weight for c in config.channels))
    slot, spread = privacy.plan_slot_seconds, privacy.plan_spread
    planned = []
    for i, channel in enumerate(config.channels):
        weight = Fraction(channel.plan_weight) / total
        shares = tuple(math.floor((h.nano - reserve) * weight) for h in horizons)
        rate = source_rate(config.source(channel.source))
        shortest = max(config.batch_seconds, 1.0 / rate if rate else 0.0)
        plan = plan_channel(channel, shares, horizons, shortest=shortest, slot=slot,
                            spread=spread)
        if plan is None:
            given = ", ".join(f"{s / NANO:.4g} per {h.per}" for s, h in zip(shares, horizons))
            raise PlanError(
                f"channels[{i}].plan_weight: its share of the guarantees ({given}) is too "
                f"small for its mechanism to report even once per {horizons[-1].per}: raise "
                f"its plan_weight or the guarantees")
        planned.append(plan)
    return Plan(horizons, reserve, slot, spread, tuple(planned))
