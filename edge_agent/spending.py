"""How fast a configuration spends its privacy budget, and how long the budget lasts.

``edge-agent check-config`` prints this so that a user sees, before starting a
service, that a configuration reporting every second at ε = 1 against a budget
of 500 a day stops reporting after 8 minutes.  Pure arithmetic on the
configuration and each channel's exact charge per report (what the ledger
charges, ``Channel.charge_nano``); no I/O.

A channel reports at most one reading every ``report_interval`` seconds, and at
most every reading its source produces: ``rate_hz`` for the sources that have a
fixed one (synthetic, i2c, csv paced ``fixed``).  Other sources (jsonl, mqtt,
csv ``recorded`` or ``fast``) report at the pace the data arrives: with a
``report_interval`` the rate is bounded by it, without one it is unknown.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from edge_agent.common.config import period_parts
from edge_agent.config import AgentConfig
from edge_agent.config.sources import source_rate


@dataclass(frozen=True)
class ChannelSpending:
    """One channel's reports per second and what each costs."""

    name: str
    reports_per_second: float | None  # None: the source has no fixed rate (unknown)
    at_most: bool  # the rate is an upper bound (report_interval on a source of unknown rate)
    epsilon_per_report: float  # the ledger's exact charge, rounded up to 1e-9
    delta_per_report: float = 0.0

    @property
    def epsilon_per_second(self) -> float | None:
        if self.reports_per_second is None:
            return None
        return self.reports_per_second * self.epsilon_per_report

    @property
    def delta_per_second(self) -> float | None:
        if self.reports_per_second is None:
            return None
        return self.reports_per_second * self.delta_per_report


def reports_per_second(channel, source) -> tuple[float | None, bool]:
    """(rate, at_most) of one channel config reading from ``source``'s config."""
    readings = source_rate(source)
    by_interval = 1.0 / channel.report_interval if channel.report_interval > 0 else None
    if readings is None:
        return by_interval, by_interval is not None
    return (readings if by_interval is None else min(readings, by_interval)), False


def lasts_seconds(budget: float, per_second: float | None, period: float) -> float | None:
    """How long ``budget`` lasts at ``per_second`` within each ``period`` (seconds): the
    whole period when it is enough, None when the rate is unknown."""
    if per_second is None:
        return None
    if per_second <= 0 or budget >= per_second * period:
        return period
    return budget / per_second


def duration_text(seconds: float) -> str:
    """'8.3 s', '1 min 22 s', '1 h 23 min', '2 d 4 h': the two largest units."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    for (unit, size), (next_unit, next_size) in zip(units, units[1:] + (("", 1),)):
        if whole >= size:
            first, second = divmod(whole, size)
            second //= next_size
            return f"{first} {unit}" + (f" {second} {next_unit}" if second and next_unit
                                        else "")
    return "0 s"


def rate_text(per_second: float) -> str:
    """A rate in the largest unit that makes it at least 1: '1/s', '6/min', '24/h'."""
    for unit, size in (("s", 1), ("min", 60), ("h", 3600)):
        if per_second * size >= 1:
            return f"{per_second * size:.3g}/{unit}"
    return f"{per_second * 86400:.3g}/d"


_PERIOD_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week"}


def period_words(per: str) -> str:
    """'10m' -> '10 minutes', '1d' -> 'day', '1.5h' -> '1.5 hours'."""
    number, unit = period_parts(per)
    word = _PERIOD_WORDS[unit]
    return word if number == 1 else f"{number:g} {word}s"


def guarantee_text(guarantees) -> str:
    """What a wearer gets, in words: 'any 10 minutes of a wearer's data: ε ≤ 4; any day:
    ε ≤ 120' (``guarantees``: ``PrivacyConfig.horizons``)."""
    parts = []
    for g in guarantees:
        delta = f", δ ≤ {g.delta:g}" if g.delta > 0 else ""
        parts.append(f"any {period_words(g.per)} of a wearer's data: ε ≤ {g.epsilon:g}{delta}")
    return "; ".join(parts)


def _guarantee_plan(guarantee, epsilon_rate: float | None, delta_rate: float | None) -> dict:
    """One guarantee at the configured rates (None: a rate is unknown)."""
    period = guarantee.seconds
    out = {"epsilon": guarantee.epsilon, "delta": guarantee.delta, "per": guarantee.per,
           "epsilon_per_period": None, "delta_per_period": None, "lasts_seconds": None,
           "whole_period": False, "limited_by": None}
    if epsilon_rate is None:
        return out
    lasts, limited_by = lasts_seconds(guarantee.epsilon, epsilon_rate, period), "epsilon"
    if delta_rate:
        delta_lasts = lasts_seconds(guarantee.delta, delta_rate, period)
        if delta_lasts < lasts:
            lasts, limited_by = delta_lasts, "delta"
    out.update(epsilon_per_period=epsilon_rate * period, delta_per_period=delta_rate * period,
               lasts_seconds=lasts, whole_period=lasts == period,
               limited_by=None if lasts == period else limited_by)
    return out


def budget_plan(config: AgentConfig, spending: list[ChannelSpending]) -> dict:
    """The ``budget`` section of ``check-config``: what a wearer is promised (``promise``),
    and per guarantee and channel what each rolling window costs at the configured rates
    and how long the guarantee lets them report in each window.

    A guarantee's ``lasts_seconds`` equals its window when the rates fit in it, is null
    when a rate is unknown; a channel's ``alone_lasts_seconds`` (per guarantee) is how
    long that guarantee would last if the channel were the only one (every guarantee is
    shared: every channel stops when one runs out)."""
    guarantees = config.privacy.horizons
    known = [c for c in spending if c.reports_per_second is not None]
    unknown = [c.name for c in spending if c.reports_per_second is None]
    epsilon_rate = None if unknown else math.fsum(c.epsilon_per_second for c in known)
    delta_rate = None if unknown else math.fsum(c.delta_per_second for c in known)
    channels = {}
    for c in spending:
        rate = c.epsilon_per_second
        entry = {"reports_per_second": c.reports_per_second, "rate_is_upper_bound": c.at_most,
                 "epsilon_per_report": c.epsilon_per_report,
                 "epsilon_per_period": {g.per: None if rate is None else rate * g.seconds
                                        for g in guarantees},
                 "alone_lasts_seconds": {g.per: lasts_seconds(g.epsilon, rate, g.seconds)
                                         for g in guarantees}}
        if c.delta_per_report:
            entry["delta_per_report"] = c.delta_per_report
        channels[c.name] = entry
    return {"promise": guarantee_text(guarantees),
            "guarantees": [_guarantee_plan(g, epsilon_rate, delta_rate) for g in guarantees],
            "unknown_rate": unknown, "channels": channels}


def budget_lines(config: AgentConfig, plan: dict) -> list[str]:
    """The plan for a person: what a wearer gets, then each guarantee (a line starting
    with WARNING when it runs out within its window), then the channels."""
    lines = [f"What a wearer gets: {plan['promise']}"]
    for g in plan["guarantees"]:
        head = f"ε ≤ {g['epsilon']:g}" + (f", δ ≤ {g['delta']:g}" if g["delta"] else "") \
            + f" per {g['per']}"
        lasts = g["lasts_seconds"]
        if lasts is None:
            lines.append(f"{head}: how long it lasts depends on how fast the data comes")
        elif g["whole_period"]:
            lines.append(f"{head} lasts the whole window at the configured rates "
                         f"(ε {g['epsilon_per_period']:.6g} spent)")
        else:
            spent = (f"ε {g['epsilon_per_period']:.6g}" if g["limited_by"] == "epsilon"
                     else f"δ {g['delta_per_period']:.3g}")
            lines.append(f"WARNING: {head} runs out {duration_text(lasts)} into each "
                         f"{g['per']} at the configured rates ({spent} asked for); reports "
                         f"then stop until earlier spending leaves the rolling window.  Raise "
                         f"report_interval or the guarantee's {g['limited_by']}")
    for name, c in plan["channels"].items():
        rate = c["reports_per_second"]
        if rate is None:
            lines.append(f"  {name}: every reading of its source (rate unknown; set "
                         f"report_interval to bound it), ε {c['epsilon_per_report']:g} each")
            continue
        bound = "at most " if c["rate_is_upper_bound"] else ""
        per_window = ", ".join(f"ε {spent:.6g} per {per}"
                               for per, spent in c["epsilon_per_period"].items())
        lines.append(f"  {name}: {bound}{rate_text(rate)} × ε {c['epsilon_per_report']:g} = "
                     f"{per_window}")
    range_max = config.range_epsilon_limit
    if range_max > 0:
        lines.append(f"  plus at most ε {range_max:g} per range-discovery run this agent "
                     f"joins ([privacy] range_epsilon_max)")
    return lines


def plan_document(config: AgentConfig, *, fleet: int | None = None,
                  target: float | None = None) -> dict:
    """The ``plan`` section of ``check-config`` and ``edge-agent plan`` (``[privacy] plan
    = "auto"``): per channel its ε per report, spacing, the most reports and ε any window
    of each guarantee counts, and at each resolution the collector reads (and the plan's)
    how often each wearer reports and the error of the fleet's mean for ``fleet`` wearers
    (the plan's): expected for the plan's fleet shape, and the most wherever readings
    lie; the wearers a ``target`` error per plan resolution needs; and the error of
    reporting every minute at ε / w beside it."""
    from edge_agent.config.planning import NANO, STATED_RESOLUTIONS, every_minute_error

    plan = config.plan
    fleet = fleet or plan.fleet
    target = target or plan.target
    chosen = config.privacy.plan_slot or config.privacy.plan_resolution
    resolutions = {name: seconds for name, seconds in STATED_RESOLUTIONS.items()}
    if plan.resolution not in resolutions.values():
        resolutions[chosen] = plan.resolution
    resolutions = dict(sorted(resolutions.items(), key=lambda item: item[1]))
    channels = {}
    for channel, planned in zip(config.channels, plan.channels):
        every_minute = every_minute_error(channel, plan, planned, fleet)
        channels[planned.name] = {
            "epsilon_per_report": planned.epsilon, "every_seconds": planned.spacing,
            "reports_in_any": {h.per: n for h, n in zip(plan.horizons, planned.counts)},
            "epsilon_in_any": {h.per: planned.spend(i) / NANO
                               for i, h in enumerate(plan.horizons)},
            "reports_per_wearer": {name: planned.reports_per(seconds)
                                   for name, seconds in resolutions.items()},
            "relative_rmse": {name: plan.error(planned, seconds, fleet)
                              for name, seconds in resolutions.items()},
            "worst_relative_rmse": {name: plan.error(planned, seconds, fleet, expected=False)
                                    for name, seconds in resolutions.items()},
            "fleet_for_target": None if target is None else plan.fleet_for(planned, target),
            "every_minute_relative_rmse": every_minute}
    return {"resolution": chosen, "resolution_seconds": plan.resolution, "fleet": fleet,
            "spread": plan.shape.spread, "target": target,
            "range_discovery_epsilon": plan.reserve_nano / NANO, "channels": channels}


def plan_lines(plan: dict) -> list[str]:
    """The plan for a person: a few lines per channel."""
    chosen = period_words(plan["resolution"])
    lines = [f"Plan (privacy.plan = \"auto\"), chosen for the fleet's mean per {chosen} "
             f"(plan_resolution): its expected error for {plan['fleet']:,} wearers whose "
             f"readings spread by {plan['spread']:g} of the domain's width around its "
             f"middle, relative to that width (in brackets: the most, wherever the readings "
             f"lie):"]
    for name, c in plan["channels"].items():
        windows = ", ".join(f"{n} in any {period_words(per)} (ε {c['epsilon_in_any'][per]:.6g})"
                            for per, n in c["reports_in_any"].items())
        lines.append(f"  {name}: one report every {duration_text(c['every_seconds'])} at "
                     f"ε {c['epsilon_per_report']:.6g} (a random phase per wearer); at most "
                     f"{windows}")
        errors = ", ".join(f"per {period_words(r)} {c['relative_rmse'][r]:.2g} "
                           f"({c['worst_relative_rmse'][r]:.2g})" for r in c["relative_rmse"])
        m = c["reports_per_wearer"][plan["resolution"]]
        who = (f"{m:.1%} of the wearers report in each {chosen}" if m < 1
               else f"each wearer reports {m:.3g} times {_a_window(chosen)}")
        line = f"    {errors}; {who}"
        if c["every_minute_relative_rmse"] is not None:
            worst = c["worst_relative_rmse"][plan["resolution"]]
            line += (f"; every wearer every minute at ε/w: {c['every_minute_relative_rmse']:.2g}"
                     f" per {chosen} at most, {c['every_minute_relative_rmse'] / worst:.1f}x")
        lines.append(line)
        if plan["target"] is not None:
            needed = c["fleet_for_target"]
            lines.append(f"    for {plan['target']:g} per {chosen}: " + (
                f"{needed:,} wearers" if needed is not None else
                "no fleet size: the mechanism's bias at this epsilon alone errs by more"))
    if plan["range_discovery_epsilon"]:
        lines.append(f"  range discovery: ε {plan['range_discovery_epsilon']:g} kept free in "
                     f"every window ([privacy] range_epsilon_max)")
    return lines


def _a_window(words: str) -> str:
    """'an hour', 'a day', 'every 10 minutes'."""
    if words[0].isdigit():
        return f"every {words}"
    return f"an {words}" if words == "hour" else f"a {words}"


def memo_lines(config: AgentConfig) -> list[str]:
    """What memoized channels promise over a wearer's whole life (configuration only)."""
    lines = []
    for channel in config.channels:
        if getattr(channel, "memoize", False):
            lines.append(
                f"  {channel.name}: memoized: over a wearer's whole life its reports reveal "
                f"ε ≤ {channel.memo_epsilon:g} about each value they had (at most "
                f"{channel.count} × {channel.memo_epsilon:g} = "
                f"{channel.count * channel.memo_epsilon:g} in all), given when it changed; "
                f"reports of an unchanged value are linked (docs/guides/PRIVACY.md)")
    return lines


def unknown_past_lines(clock, guarantees) -> list[str]:
    """One line per guarantee whose window reaches before the spending the ledger knows
    (``clock``: ``StateStore.clock()``; a file of an earlier version, which deleted what
    was older than its longest period): the ledger counts that stretch as fully spent,
    so the guarantee allows no report until its window lies wholly in known spending."""
    lines = []
    for guarantee in guarantees:
        if not clock.reaches_unknown(guarantee.seconds):
            continue
        since = clock.wall_of(clock.known_since)
        lines.append(
            f"the {period_words(guarantee.per)} guarantee starts counting from "
            f"{utc_text(since)}: earlier spending is not known (an earlier version of the "
            f"agent kept less), so it is counted as fully spent and this guarantee allows "
            f"no report until {utc_text(clock.counts_fully_from(guarantee.seconds))}")
    return lines


def utc_text(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
