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
from dataclasses import dataclass

from edge_agent.config import AgentConfig


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


def source_rate(source) -> float | None:
    """Readings per second of a source that has a fixed rate, else None."""
    if source.type in ("synthetic", "i2c") or (source.type == "csv" and source.pace == "fixed"):
        return float(source.rate_hz)
    return None


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


def budget_plan(config: AgentConfig, spending: list[ChannelSpending]) -> dict:
    """The ``budget`` section of ``check-config``: per channel and in all, what a budget
    period costs at the configured rates and how long the budget lasts in each period.

    ``lasts_seconds`` equals the period when the budget is enough, is null when a rate
    is unknown; a channel's ``alone_lasts_seconds`` is how long the budget would last
    if that channel were the only one (the budget is shared: every channel stops when
    it runs out)."""
    privacy = config.privacy
    period = privacy.period_seconds
    known = [c for c in spending if c.reports_per_second is not None]
    unknown = [c.name for c in spending if c.reports_per_second is None]
    epsilon_rate = math.fsum(c.epsilon_per_second for c in known)
    delta_rate = math.fsum(c.delta_per_second for c in known)
    channels = {}
    for c in spending:
        entry = {"reports_per_second": c.reports_per_second, "rate_is_upper_bound": c.at_most,
                 "epsilon_per_report": c.epsilon_per_report,
                 "epsilon_per_period": None if c.epsilon_per_second is None
                 else c.epsilon_per_second * period,
                 "alone_lasts_seconds": lasts_seconds(privacy.budget_epsilon,
                                                      c.epsilon_per_second, period)}
        if c.delta_per_report:
            entry["delta_per_report"] = c.delta_per_report
        channels[c.name] = entry
    lasts, limited_by = None, None
    if not unknown:
        lasts, limited_by = lasts_seconds(privacy.budget_epsilon, epsilon_rate, period), \
            "budget_epsilon"
        if delta_rate > 0:
            delta_lasts = lasts_seconds(privacy.budget_delta, delta_rate, period)
            if delta_lasts < lasts:
                lasts, limited_by = delta_lasts, "budget_delta"
    return {"budget_epsilon": privacy.budget_epsilon, "budget_delta": privacy.budget_delta,
            "budget_period": privacy.budget_period,
            "epsilon_per_period": None if unknown else epsilon_rate * period,
            "delta_per_period": None if unknown else delta_rate * period,
            "lasts_seconds": lasts, "whole_period": lasts == period,
            "limited_by": None if lasts == period else limited_by,
            "unknown_rate": unknown, "channels": channels}


def budget_lines(config: AgentConfig, plan: dict) -> list[str]:
    """The plan for a person; the first line starts with WARNING when the budget runs
    out within its period."""
    privacy = config.privacy
    lines = []
    for name, c in plan["channels"].items():
        rate = c["reports_per_second"]
        if rate is None:
            lines.append(f"  {name}: every reading of its source (rate unknown; set "
                         f"report_interval to bound it), ε {c['epsilon_per_report']:g} each")
            continue
        bound = "at most " if c["rate_is_upper_bound"] else ""
        share = c["epsilon_per_period"] / plan["epsilon_per_period"] \
            if plan["epsilon_per_period"] else 0.0
        lines.append(f"  {name}: {bound}{rate_text(rate)} × ε {c['epsilon_per_report']:g} = "
                     f"ε {c['epsilon_per_period']:.6g} per {privacy.budget_period}"
                     + (f" ({share:.0%} of the spending)" if plan["epsilon_per_period"] else ""))
    lasts = plan["lasts_seconds"]
    head = f"budget_epsilon = {privacy.budget_epsilon:g} per {privacy.budget_period}"
    if lasts is None:
        lines.insert(0, f"{head}: how long it lasts depends on how fast the data comes:")
    elif plan["whole_period"]:
        lines.insert(0, f"{head} lasts the whole period at the configured rates "
                        f"(ε {plan['epsilon_per_period']:.6g} spent):")
    else:
        limit = plan["limited_by"]
        spent = (f"ε {plan['epsilon_per_period']:.6g}" if limit == "budget_epsilon"
                 else f"δ {plan['delta_per_period']:.3g}")
        value = privacy.budget_epsilon if limit == "budget_epsilon" else privacy.budget_delta
        lines.insert(0, f"WARNING: {limit} = {value:g} per {privacy.budget_period} runs out "
                        f"{duration_text(lasts)} into each period at the configured rates "
                        f"({spent} asked for); reports then stop until the period rolls on.  "
                        f"Raise report_interval or {limit}:")
    if privacy.range_epsilon_max > 0:
        lines.append(f"  plus at most ε {privacy.range_epsilon_max:g} per range-discovery run "
                     f"this agent joins ([privacy] range_epsilon_max)")
    return lines
