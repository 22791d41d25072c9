"""The agent's configuration file: ``AgentConfig`` and the tables only the agent has
(privacy budget, spool, delivery), checked across tables (channels name sources that
provide their fields), loaded from TOML.

``load_config(path)`` returns an ``AgentConfig`` or raises ``ConfigError`` naming
every problem's key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from edge_agent.common.config import (
    BrokerConfig,
    ConfigError,
    Model,
    Name,
    Period,
    format_validation_error,
    parse_period,
    read_toml,
)
from edge_agent.config.channels import ChannelConfig, mechanism_problem
from edge_agent.config.planning import make_plan
from edge_agent.config.sources import SourceConfig, source_fields
from edge_agent.mechanisms import EPSILON_MAX
from edge_agent.mechanisms.registry import AUTO_REPORTS
from edge_agent.protocol.statuses import MAX_AGENT_CHANNELS, MAX_GUARANTEES

# Most virtual agents ``edge-agent fleet`` runs in one process.
FLEET_MAX_COUNT = 100_000
# Most wearers a plan is stated for (a nation's worth).
PLAN_FLEET_MAX = 10**9
# The fleet's spread (standard deviation / domain width) a plan assumes unless told: a
# fleet whose readings fill the middle of the domain.
PLAN_SPREAD_ASSUMED = 0.15


class Guarantee(Model):
    """At most ``epsilon`` (and ``delta``) spent on any wearer's data over every rolling
    window of ``per`` (docs/guides/PRIVACY.md, "What ε means for a wearer")."""

    epsilon: Annotated[float, Field(gt=0, le=1e6, description=(
        "most epsilon spent on a wearer's data in any rolling window of `per`"))]
    per: Annotated[Period, Field(description=(
        "the window: 10m, 1h, 1d, 1w ... (at least a minute), rolling on the ledger clock"))]
    # With (epsilon, delta)-LDP channels: the delta allowed in the same windows (basic
    # composition); 0: only pure epsilon-LDP reports.
    delta: Annotated[float, Field(ge=0, le=1)] = 0.0

    @property
    def seconds(self) -> float:
        return parse_period(self.per)


class PrivacyConfig(Model):
    # What every wearer is promised: each guarantee holds over every rolling window of
    # its length, all channels and range discovery together, e.g.
    # [{epsilon = 4, per = "10m"}, {epsilon = 120, per = "1d"}].
    guarantees: Annotated[list[Guarantee], Field(min_length=1, max_length=MAX_GUARANTEES)] \
        | None = None
    # The shorthand for one guarantee: budget_epsilon (and budget_delta) per budget_period.
    budget_epsilon: Annotated[float, Field(gt=0)] | None = None
    # Total delta this agent may spend in any rolling period, all channels together
    # ((epsilon, delta)-LDP channels; basic composition, docs/guides/PRIVACY.md "δ"); 0: only
    # pure epsilon-LDP reports.
    budget_delta: Annotated[float, Field(ge=0, le=1)] = 0.0
    budget_period: Period = "1d"
    state_dir: Path = Path("/var/lib/edge-agent")
    # Most epsilon one range-discovery run may take from this agent (0 = never).  Left
    # out: 4, or with plan = "auto" a quarter of the shortest guarantee's epsilon (at most
    # 4), which the planner keeps free in every window of every guarantee.
    range_epsilon_max: Annotated[float, Field(ge=0, le=EPSILON_MAX)] | None = None
    # "auto": the planner sets every channel's epsilon per report and when it reports,
    # for the least error of the fleet's mean under the guarantees (docs/guides/PRIVACY.md, "The
    # planner"); "manual": each channel's epsilon and report_interval.  Left out: "auto"
    # when no channel gives its epsilon, else "manual".
    plan: Literal["auto", "manual"] | None = None
    # What the planner makes accurate: the fleet's mean over each window of
    # plan_resolution (one of the collector's resolutions: its minutes, hours or days),
    # for plan_fleet wearers whose readings spread with a standard deviation of
    # plan_spread x the domain's width.  plan_target: the error of that mean a study
    # needs, as a share of the domain's width: check-config and `edge-agent plan` state
    # how many wearers reach it.  plan_spread = "auto": plan for PLAN_SPREAD_ASSUMED and
    # plan_fleet until the collector's snapshots tell the fleet's spread and size, then
    # each linear channel plans its schedule again with them when a budget period
    # begins (never its share of the guarantees).
    plan_resolution: Period = "1h"
    plan_fleet: Annotated[int, Field(ge=1, le=PLAN_FLEET_MAX)] = AUTO_REPORTS
    plan_target: Annotated[float, Field(gt=0, lt=1)] | None = None
    plan_spread: Annotated[float, Field(gt=0, le=0.5)] | Literal["auto"] = PLAN_SPREAD_ASSUMED
    # plan_resolution's former name (a minute by default then): still read, and
    # check-config says to rename it.
    plan_slot: Period | None = None

    @field_validator("state_dir")
    @classmethod
    def _home(cls, value: Path) -> Path:
        return value.expanduser()  # "~/..." for a user without root

    @model_validator(mode="after")
    def _one_way_to_say_it(self):
        if self.guarantees is None and self.budget_epsilon is None:
            raise ValueError("privacy.guarantees: missing: set guarantees = [{epsilon = ..., per = "
                             "\"...\"}, ...], or its shorthand budget_epsilon (and "
                             "budget_period)")
        if self.guarantees is not None:
            given = sorted(self.model_fields_set & {"budget_epsilon", "budget_delta",
                                                     "budget_period"})
            if given:
                raise ValueError(f"privacy.{given[0]}: the shorthand for one guarantee; with "
                                 f"guarantees, give each guarantee's epsilon, per and delta "
                                 f"there instead")
            _consistent(self.guarantees)
        if self.plan_slot is not None and "plan_resolution" in self.model_fields_set:
            raise ValueError("privacy.plan_slot: the former name of plan_resolution; give "
                             "only plan_resolution")
        return self

    @property
    def horizons(self) -> list[Guarantee]:
        """Every guarantee, shortest window first (the shorthand's one)."""
        if self.guarantees is None:
            return [Guarantee(epsilon=self.budget_epsilon, per=self.budget_period,
                              delta=self.budget_delta)]
        return sorted(self.guarantees, key=lambda g: g.seconds)

    @property
    def longest(self) -> Guarantee:
        return self.horizons[-1]

    @property
    def shortest(self) -> Guarantee:
        return self.horizons[0]

    @property
    def period_seconds(self) -> float:
        """The longest guarantee's window (a discovered range is adopted when one begins,
        UTC-aligned)."""
        return self.longest.seconds

    @property
    def assumed_spread(self) -> float:
        """The fleet's spread the plan starts from (``plan_spread``; "auto": until the
        fleet's own is known)."""
        return PLAN_SPREAD_ASSUMED if self.plan_spread == "auto" else self.plan_spread

    @property
    def plan_resolution_seconds(self) -> float:
        """The plan's resolution (plan_slot, its former name, where that is given)."""
        return parse_period(self.plan_slot or self.plan_resolution)

    @property
    def delta_allowed(self) -> bool:
        """Whether any report may cost delta (every guarantee allows some)."""
        return all(g.delta > 0 for g in self.horizons)


def _consistent(guarantees: list[Guarantee]) -> None:
    """Guarantees that say the same twice, or one that another already implies, are a
    mistake in the configuration: ``ValueError`` naming the guarantee."""
    order = sorted(range(len(guarantees)), key=lambda i: guarantees[i].seconds)
    for shorter, longer in zip(order, order[1:]):
        a, b = guarantees[shorter], guarantees[longer]
        if a.seconds == b.seconds:
            raise ValueError(f"privacy.guarantees[{longer}].per: {b.per} is also "
                             f"guarantees[{shorter}]'s window: give each window once")
    for i in order:
        for j in order:
            a, b = guarantees[i], guarantees[j]
            if a.seconds < b.seconds and a.epsilon >= b.epsilon and a.delta >= b.delta:
                raise ValueError(
                    f"privacy.guarantees[{i}]: implied by guarantees[{j}]: any {a.per} lies within "
                    f"a {b.per}, where epsilon <= {b.epsilon:g} already holds; remove it, or "
                    f"raise guarantees[{j}].epsilon above {a.epsilon:g}")
            if a.seconds > b.seconds and (a.delta > 0) != (b.delta > 0):
                raise ValueError(
                    f"privacy.guarantees[{i}].delta: {a.delta:g} per {a.per}, but guarantees[{j}] "
                    f"allows delta {b.delta:g} per {b.per}: (epsilon, delta) channels need "
                    f"a delta in every guarantee, pure epsilon-LDP none in any")


class SpoolConfig(Model):
    # Perturbed messages kept on disk while the broker is unreachable (and, with
    # [delivery] confirm = "collector", until a collector confirms them); past
    # this the oldest are dropped (and counted).
    max_messages: Annotated[int, Field(ge=10, le=100_000_000)] = 200_000


class DeliveryConfig(Model):
    """When a spooled report may leave the spool (docs/guides/DEPLOYMENT.md, "Delivery")."""

    # "broker": on the broker's acknowledgement.  "collector": once a collector confirms
    # it counted the report durably (ldp/v1/<fleet>/_confirm/<agent>); nothing is then
    # lost by a broker restarted without persistence, or a collector that lost its disk.
    confirm: Literal["broker", "collector"] = "broker"
    # A report acknowledged by the broker but not confirmed this long is sent again
    # (the wait doubles with each resend of it, up to 64 times); also after a reconnect.
    resend_seconds: Annotated[float, Field(ge=1, le=86400)] = 120.0


# -- the agent ---------------------------------------------------------------------

class AgentConfig(Model):
    agent_id: Name  # also the MQTT client id and topic level
    fleet: Name
    broker: BrokerConfig = BrokerConfig()
    privacy: PrivacyConfig
    spool: SpoolConfig = SpoolConfig()
    delivery: DeliveryConfig = DeliveryConfig()
    batch_seconds: Annotated[float, Field(ge=0.05, le=3600)] = 1.0
    sources: Annotated[list[SourceConfig], Field(min_length=1, max_length=MAX_AGENT_CHANNELS)]
    channels: Annotated[list[ChannelConfig], Field(min_length=1, max_length=MAX_AGENT_CHANNELS)]
    # plan = "auto": the planner's choice; ``channels`` then carry its epsilon per report.
    _plan: Any = PrivateAttr(None)

    @property
    def planned(self) -> bool:
        """Whether the planner sets the channels' epsilon and schedule."""
        plan = self.privacy.plan
        return self._plan is not None or plan == "auto" or (
            plan is None and all(c.epsilon is None for c in self.channels))

    @property
    def plan(self):
        """The planner's ``edge_agent.config.planning.Plan`` (None with plan = "manual")."""
        return self._plan

    @property
    def range_epsilon_limit(self) -> float:
        """``[privacy] range_epsilon_max``, or its default (see there)."""
        if self.privacy.range_epsilon_max is not None:
            return self.privacy.range_epsilon_max
        return min(4.0, self.privacy.shortest.epsilon / 4) if self.planned else 4.0

    @model_validator(mode="after")
    def _references(self):
        _unique("sources", [s.name for s in self.sources])
        _unique("channels", [c.name for c in self.channels])
        sources = {s.name: s for s in self.sources}
        planned = self.planned
        for i, channel in enumerate(self.channels):
            source = sources.get(channel.source)
            if source is None:
                raise ValueError(f"channels[{i}].source: no source named {channel.source!r} "
                                 f"(have: {', '.join(sources)})")
            if planned:
                _plannable(i, channel, self.privacy.plan)
            elif channel.epsilon is None:
                raise ValueError(
                    f"channels[{i}].epsilon: missing: give every channel its epsilon per report"
                    f" (privacy.plan = \"manual\"), or none and the planner sets them all "
                    f"(privacy.plan = \"auto\")")
            else:
                problem = mechanism_problem(channel)
                if problem:
                    raise ValueError(f"channels[{i}]: its mechanism refuses it: {problem}")
                shortest = self.privacy.shortest
                if channel.epsilon > shortest.epsilon:
                    raise ValueError(
                        f"channels[{i}].epsilon: {channel.epsilon:g} per report is more than "
                        f"the privacy guarantee allows in any {shortest.per} "
                        f"({shortest.epsilon:g}): this channel could never report")
            if getattr(channel, "delta", 0.0) > 0 and not self.privacy.delta_allowed:
                raise ValueError(f"channels[{i}].delta: {channel.delta:g} needs a delta "
                                 f"budget: set privacy.budget_delta, or each guarantee's "
                                 f"delta (basic composition: each report spends delta)")
            available = source_fields(source)
            wanted = [channel.field] if hasattr(channel, "field") else list(channel.fields)
            if available is not None:
                for name in wanted:
                    if name not in available:
                        raise ValueError(
                            f"channels[{i}]: source {source.name!r} has no field {name!r} "
                            f"(it has: {', '.join(sorted(available))})")
        return self

    @model_validator(mode="after")
    def _http_requests_outwait_a_batch(self):
        for i, source in enumerate(self.sources):
            if source.type == "http" and source.commit_timeout_seconds <= self.batch_seconds:
                raise ValueError(
                    f"sources[{i}].commit_timeout_seconds: must exceed batch_seconds "
                    f"({self.batch_seconds:g}): a request waits for the batch that takes its "
                    f"readings, got {source.commit_timeout_seconds:g}")
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _make_plan(cls, data: Any, handler):
        """With plan = "auto", the channels as the planner sets them (epsilon per report),
        their mechanisms checked like configured ones.  Defined after the other
        validators, so that it wraps them: they see the configuration as written."""
        config = handler(data)
        if not config.planned or config._plan is not None:
            return config
        plan = make_plan(config)
        channels = [c.model_copy(update={"epsilon": p.epsilon})
                    for c, p in zip(config.channels, plan.channels)]
        for i, channel in enumerate(channels):
            problem = mechanism_problem(channel)
            if problem:
                raise ValueError(f"channels[{i}]: its mechanism refuses the planned epsilon "
                                 f"{channel.epsilon:g}: {problem}")
        planned = config.model_copy(update={"channels": channels})
        planned._plan = plan
        return planned

    def source(self, name: str):
        return next(s for s in self.sources if s.name == name)

    def files_read(self) -> dict[str, Path]:
        """Every file the agent reads, by configuration key (checked at start-up)."""
        files = self.broker.files()
        for i, source in enumerate(self.sources):
            if source.type == "csv" or (source.type == "jsonl" and source.path != "-"):
                files[f"sources[{i}].path"] = Path(source.path)
            if source.type == "http":
                files[f"sources[{i}].token_file"] = source.token_file
        return files

    def dirs_written(self) -> dict[str, Path]:
        """Every directory the agent writes, by configuration key."""
        return {"privacy.state_dir": self.privacy.state_dir}


def _plannable(i: int, channel, plan: str | None) -> None:
    """What the planner sets must not be configured too (``ValueError`` naming the key)."""
    why = ('with privacy.plan = "auto"' if plan == "auto" else
           "while no channel gives its epsilon (the planner sets them all)")
    if channel.epsilon is not None:
        raise ValueError(f"channels[{i}].epsilon: set by the planner {why}: leave it out, or "
                         f"set privacy.plan = \"manual\" and give every channel its epsilon")
    if channel.report_interval > 0:
        raise ValueError(f"channels[{i}].report_interval: the planner sets when a channel "
                         f"reports {why}: leave it out, or set privacy.plan = \"manual\"")
    if getattr(channel, "delta", 0.0) > 0:
        raise ValueError(f"channels[{i}].delta: the planner plans pure epsilon-LDP channels: "
                         f"set privacy.plan = \"manual\" to give this one its epsilon and "
                         f"report_interval")


def _unique(what: str, names: list[str]) -> None:
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ValueError(f"{what}[{i}].name: {name!r} is used twice")
        seen.add(name)


def parse_config(data: dict[str, Any]) -> AgentConfig:
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None



def load_config(path: str | Path) -> AgentConfig:
    return parse_config(read_toml(path))
