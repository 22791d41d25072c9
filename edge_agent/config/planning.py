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
error of the fleet mean over one window of ``plan_resolution`` (the resolution a study
reads: the collector estimates minutes, hours and days), N = ``plan_fleet`` wearers, a
fleet spread σ (``plan_spread``, a fraction of the domain's width) and V(ε) the variance
of one report's unbiased estimate (the mechanism's exact closed form):

    each wearer reports m = resolution / spacing times a window;
    m >= 1:  MSE = V(ε) / (m N)
    m <  1:  a random m N of the N wearers report, once:
             MSE = V(ε) / (m N) + σ² (1 / m - 1) / N    (sampling without replacement)
    plus B(ε)² for a linear channel, B(ε) the bias of its bias-removed mean, which no
    number of reports removes (OGPM's flat ends).

The plan is chosen for the worst case, V and B the largest over where readings may lie
(the plan must serve a fleet wherever it is; B the error ``mechanism = "auto"`` weighs
too).  What a study can expect is stated beside it: V and B averaged over a fleet whose
readings are spread by σ around the domain's middle (``FleetShape``), the error the
collector's unbiased estimate of the mean makes, and the fleet size that reaches a
target error (``plan_target``).

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
from edge_agent.mechanisms.registry import VECTOR, polar_mechanism
from edge_agent.state import NANO, bucket_width, to_nano_down, to_nano_up

# A planned channel's spacing is at least this much over what the counts assume, so a
# ledger clock a little slower than the wall clock (NTP slewing, at most 500 ppm) does
# not make the ledger refuse a report that the plan makes room for.
SPACING_MARGIN = 1e-3
# Most reports per window of the plan's resolution the planner considers (more only
# spreads ε thinner).
MAX_REPORTS_PER_WINDOW = 64
# Spacings tried between the shortest and the longest: a geometric grid of this ratio,
# then each snapped down to where its counts change.
GRID_RATIO = 1.15
# Each horizon's counts tried exactly, from one report per window up to this many.
BREAKPOINTS = 512
# Variances are evaluated on grids of this many bits (the error's closed form hardly
# changes beyond; the reports themselves use the channel's grid_bits).
EVAL_GRID_BITS = 10
# The resolutions check-config and ``edge-agent plan`` state errors at: the collector's
# defaults (its windows, and the hours and days its results store keeps).
STATED_RESOLUTIONS = {"1m": 60.0, "1h": 3600.0, "1d": 86400.0}
# The comparison the plan is stated beside: every wearer reports once a minute (the
# collector's finest window by default) at what the guarantees allow (budget division).
EVERY_MINUTE = 60.0
# Points of the domain the expected error averages over.
EXPECTED_GRID = 513


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
class FleetShape:
    """Where a fleet's readings lie, for the error a study can expect: a normal of
    standard deviation ``spread`` x the domain's width around ``centre`` (a fraction of
    the way from the domain's low end to its high end), cut to the domain."""

    spread: float
    centre: float = 0.5

    def share_in(self, regions: list[tuple[float, float]], low: float, high: float) -> float:
        """The share of readings on [low, high] shaped so that lie in ``regions``."""
        width = high - low

        def below(x: float) -> float:  # the normal's CDF, before cutting to the domain
            z = (x - low - self.centre * width) / (self.spread * width)
            return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))

        inside = below(high) - below(low)
        return sum(below(b) - below(a) for a, b in regions) / inside


@dataclass(frozen=True)
class ChannelPlan:
    name: str
    epsilon: float  # per report (a NANO multiple, the float never above it)
    spacing: float  # seconds, at least, between two reports (charge times)
    counts: tuple[int, ...]  # most of its reports any window of each guarantee counts
    shares: tuple[int, ...]  # its nano-ε of each guarantee
    # One report's V(ε) and the mean's B(ε)², in units of the domain's width squared: the
    # worst over where readings may lie (what the plan is chosen for) ...
    variance: float
    bias: float
    # ... and averaged over the fleet's readings (``FleetShape``: what a study can expect).
    expected_variance: float
    expected_bias: float
    error: float  # worst-case RMSE of the fleet's mean per plan resolution (plan fleet)

    def spend(self, horizon_index: int) -> int:
        """Most nano-ε of this channel's reports any window of the guarantee counts."""
        return self.counts[horizon_index] * to_nano_up(self.epsilon)

    def reports_per(self, resolution: float) -> float:
        """m: how many times each wearer reports in a window of ``resolution`` seconds."""
        return resolution / self.spacing


@dataclass(frozen=True)
class Plan:
    horizons: tuple[Horizon, ...]
    reserve_nano: int  # kept for range discovery in every window
    resolution: float  # seconds: the window whose mean the plan makes accurate
    fleet: int  # wearers the plan is chosen for (plan_fleet)
    shape: FleetShape
    target: float | None  # the error per resolution a study needs (plan_target)
    channels: tuple[ChannelPlan, ...]

    def channel(self, name: str) -> ChannelPlan:
        return next(c for c in self.channels if c.name == name)

    def error(self, planned: ChannelPlan, resolution: float | None = None,
              fleet: int | None = None, *, expected: bool = True) -> float:
        """RMSE of the fleet's mean over a window of ``resolution`` seconds (the plan's)
        for ``fleet`` wearers (the plan's), in domain widths: expected for the plan's
        fleet shape, or the worst case over where readings lie."""
        variance, bias = self._error_terms(planned, expected)
        return mean_error(variance, planned.reports_per(resolution or self.resolution),
                          self.shape.spread, bias, fleet or self.fleet)

    def fleet_for(self, planned: ChannelPlan, target: float | None = None,
                  resolution: float | None = None, *, expected: bool = True) -> int | None:
        """The fewest wearers whose mean over a window of ``resolution`` seconds errs by
        at most ``target`` (the plan's); None where the bias alone errs by more."""
        target = target or self.target
        if target is None:
            raise ValueError("target: give one, or plan_target in [privacy]")
        variance, bias = self._error_terms(planned, expected)
        return fleet_for(variance, planned.reports_per(resolution or self.resolution),
                         self.shape.spread, bias, target)

    @staticmethod
    def _error_terms(planned: ChannelPlan, expected: bool) -> tuple[float, float]:
        return ((planned.expected_variance, planned.expected_bias) if expected
                else (planned.variance, planned.bias))


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


def _wearer_variance(variance: float, reports: float, spread: float) -> float:
    """N times the variance of N wearers' mean over a window in which each reports
    ``reports`` (m) times (module docstring)."""
    return variance / reports + spread ** 2 * max(0.0, 1.0 / reports - 1.0)


def mean_error(variance: float, reports: float, spread: float, bias: float,
               fleet: int) -> float:
    """RMSE of ``fleet`` wearers' mean over a window in which each reports ``reports``
    times (m; fewer than one: that share of the wearers reports once), one report's
    variance V, the fleet's spread σ and squared bias B² (module docstring)."""
    return math.sqrt(_wearer_variance(variance, reports, spread) / fleet + bias)


def fleet_for(variance: float, reports: float, spread: float, bias: float,
              target: float) -> int | None:
    """The fewest wearers whose ``mean_error`` is at most ``target`` and whose window
    holds a report (m N >= 1); None where the bias alone errs by more."""
    if bias >= target ** 2:
        return None
    fleet = max(1, math.ceil(_wearer_variance(variance, reports, spread)
                             / (target ** 2 - bias)), math.ceil(1.0 / reports))
    while mean_error(variance, reports, spread, bias, fleet) > target:  # float rounding
        fleet += 1
    return fleet


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
        return (kind, channel.radius_max, channel.weight, channel.radius_mechanism,
                channel.split)
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
                                    radius=key[3], split=key[4])
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


def expected_report_error(channel, epsilon: float, shape: FleetShape) -> tuple[float, float]:
    """(V(ε), B(ε)²) averaged over a fleet's readings shaped ``shape``: one report's
    variance of its unbiased estimate, and the squared bias of the fleet's mean (the
    flat ends' biases of readings on either side partly cancel in it).  A linear channel
    and a vector channel's axes (whose error depends on where readings lie); the other
    kinds' errors do not, or are stated at their worst."""
    if channel.kind == "linear":
        return _linear_expected(channel.mechanism, epsilon, *channel.start_domain,
                                shape.centre, shape.spread)
    if channel.kind == "vector" and channel.mechanism not in VECTOR:
        d = len(channel.fields)
        fixed = {"split": d, "sample": channel.k}.get(channel.strategy)
        variance = min(_linear_expected(channel.mechanism, split_epsilon(epsilon, k),
                                        *channel.domain, shape.centre, shape.spread)[0] * d / k
                       for k in ([fixed] if fixed else range(1, d + 1))
                       if split_epsilon(epsilon, k) >= EPSILON_MIN)
        return variance, 0.0
    return report_variance(channel, epsilon), report_bias(channel, epsilon)


@lru_cache(maxsize=4096)
def _linear_expected(name: str, epsilon: float, low: float, high: float, centre: float,
                     spread: float) -> tuple[float, float]:
    mechanism = linear_mechanism(name, epsilon=epsilon, low=low, high=high,
                                 grid_bits=EVAL_GRID_BITS)
    width = high - low
    x = np.linspace(low, high, EXPECTED_GRID)
    weights = np.exp(-0.5 * ((x - low - centre * width) / (spread * width)) ** 2)
    weights /= weights.sum()
    affine = mechanism.affine_mean()
    if affine is None:  # nothing to invert: the raw mean, its squared error
        return float(weights @ mechanism.expected_error(x, 2)) / width ** 2, 0.0
    variance = float(weights @ mechanism.variance(x)) / affine[0] ** 2
    bias = float(weights @ mechanism.inversion_bias(x))
    return variance / width ** 2, bias ** 2 / width ** 2


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

def candidate_spacings(horizons: tuple[Horizon, ...], shortest: float,
                       resolution: float) -> list[float]:
    """Spacings worth trying: from ``shortest`` (or MAX_REPORTS_PER_WINDOW a window of
    ``resolution`` or of the shortest guarantee, whichever is shorter: more reports than
    that at the ε the shortest guarantee allows only spread it thinner) to one report
    per longest window, each snapped to where its counts change."""
    low = max(shortest, min(resolution, horizons[0].window) / MAX_REPORTS_PER_WINDOW)
    high = float(horizons[-1].counted)
    if low >= high:
        return [snapped(high, horizons)]
    steps = math.ceil(math.log(high / low) / math.log(GRID_RATIO))
    grid = [low * GRID_RATIO ** i for i in range(steps)] + [high]
    # the exact breakpoints of each horizon's counts (one, two, ... per window), every one
    # up to BREAKPOINTS: where a count changes, ε per report jumps
    grid += [float(h.counted / n) for h in horizons
             for n in range(1, min(BREAKPOINTS, math.floor(h.counted / Fraction(low))) + 1)
             if low <= h.counted / n <= high]
    out = {snapped(spacing, horizons) for spacing in grid}
    return sorted(s for s in out if s >= low)


def plan_channel(channel, shares: tuple[int, ...], horizons: tuple[Horizon, ...], *,
                 shortest: float, resolution: float, fleet: int,
                 shape: FleetShape) -> ChannelPlan | None:
    """The spacing and ε of least worst-case error of the fleet's mean per ``resolution``
    for a channel given ``shares`` (nano-ε of each guarantee); None if no spacing gives
    it an ε its mechanism takes."""
    best = None
    for spacing in candidate_spacings(horizons, shortest, resolution):
        n = counts(spacing, horizons)
        nano = min(share // count for share, count in zip(shares, n))
        epsilon = epsilon_of_nano(nano)
        if epsilon < EPSILON_MIN:
            continue
        variance = report_variance(channel, epsilon)
        if variance is None:
            continue
        bias = report_bias(channel, epsilon)
        spaced = spacing * (1 + SPACING_MARGIN)
        error = mean_error(variance, resolution / spaced, shape.spread, bias, fleet)
        if best is None or error < best[0]:
            best = (error, epsilon, spaced, n, variance, bias)
    if best is None:
        return None
    error, epsilon, spacing, n, variance, bias = best
    return ChannelPlan(channel.name, epsilon, spacing, n, shares, variance, bias,
                       *expected_report_error(channel, epsilon, shape), error)


def every_minute_error(channel, plan: Plan, planned: ChannelPlan,
                       fleet: int | None = None) -> float | None:
    """The worst-case error per plan resolution of the natural configuration, for
    comparison: every wearer reports once a minute at what the channel's shares allow
    (budget division: ε / w for w minutes a window, ideally: without the ledger's
    bucket)."""
    n = tuple(math.ceil(Fraction(h.window) / Fraction(EVERY_MINUTE)) for h in plan.horizons)
    epsilon = epsilon_of_nano(min(share // count for share, count in zip(planned.shares, n)))
    variance = report_variance(channel, epsilon) if epsilon >= EPSILON_MIN else None
    if variance is None:
        return None
    return mean_error(variance, plan.resolution / EVERY_MINUTE, plan.shape.spread,
                      report_bias(channel, epsilon), fleet or plan.fleet)


def _shortest(config, channel) -> float:
    """The shortest spacing a channel can keep: a batch, or its source's sample period."""
    rate = source_rate(config.source(channel.source))
    return max(config.batch_seconds, 1.0 / rate if rate else 0.0)


def replan_channel(config, name: str, *, spread: float, fleet: int) -> ChannelPlan | None:
    """The planned channel ``name`` of an ``AgentConfig`` planned again for a fleet of
    ``fleet`` wearers spread by ``spread`` (a fraction of the domain's width): the same
    shares of the guarantees, so the same ε per window at most, at the spacing of least
    error for that fleet (``plan_spread = "auto"``).  None where nothing fits (never
    for a channel the first plan served: its spacing is still a candidate)."""
    plan = config.plan
    planned = plan.channel(name)
    channel = next(c for c in config.channels if c.name == name)
    return plan_channel(channel, planned.shares, plan.horizons,
                        shortest=_shortest(config, channel), resolution=plan.resolution,
                        fleet=fleet, shape=FleetShape(spread))


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
    resolution, fleet = privacy.plan_resolution_seconds, privacy.plan_fleet
    shape = FleetShape(privacy.assumed_spread)
    planned = []
    for i, channel in enumerate(config.channels):
        weight = Fraction(channel.plan_weight) / total
        shares = tuple(math.floor((h.nano - reserve) * weight) for h in horizons)
        plan = plan_channel(channel, shares, horizons, shortest=_shortest(config, channel),
                            resolution=resolution, fleet=fleet, shape=shape)
        if plan is None:
            given = ", ".join(f"{s / NANO:.4g} per {h.per}" for s, h in zip(shares, horizons))
            raise PlanError(
                f"channels[{i}].plan_weight: its share of the guarantees ({given}) is too "
                f"small for its mechanism to report even once per {horizons[-1].per}: raise "
                f"its plan_weight or the guarantees")
        planned.append(plan)
    return Plan(horizons, reserve, resolution, fleet, shape, privacy.plan_target,
                tuple(planned))
