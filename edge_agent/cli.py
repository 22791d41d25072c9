"""``edge-agent``: run the agent, check a configuration, inspect the budget and the local
status, simulate a fleet."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import click

from edge_agent.common.commandline import (
    EXIT_CONFIG,
    add_check_config,
    command_group,
    load_or_exit,
    require_paths,
)
from edge_agent.config import (
    FLEET_MAX_COUNT,
    PLAN_FLEET_MAX,
    AgentConfig,
    ConfigError,
    load_config,
)

# Where a user without root can keep the agent's state (the sample config's default,
# /var/lib/edge-agent, is the service's).
PATH_HINTS = {"privacy.state_dir": "set it to a directory this user can write (e.g. "
                                   "state_dir = \"~/.local/state/edge-agent\" under [privacy])"}


def require_agent_paths(config_path: str, config: AgentConfig) -> None:
    require_paths(config_path, read=config.files_read(), write=config.dirs_written(),
                  hints=PATH_HINTS)


def _load(path: str, exit_code: int = 2) -> AgentConfig:
    return load_or_exit(load_config, path, exit_code)


main = command_group("Local-differential-privacy agent for sensor streams.")


def implied(config: AgentConfig) -> dict:
    """What ``check-config`` adds to the configuration: each channel's mechanism as the
    protocol will announce it (polar splits, vector plans), and how long the budget
    lasts at the configured rates (edge_agent.spending)."""
    from edge_agent.channels import build_channels
    from edge_agent.spending import (
        ChannelSpending,
        budget_plan,
        plan_document,
        reports_per_second,
    )
    from edge_agent.state import DELTA_UNIT, NANO

    channels = build_channels(config, config.agent_id)
    sources = {source.name: source for source in config.sources}
    spending = [ChannelSpending(channel.name,
                                *((1.0 / channel.spacing, True) if channel.spacing else
                                  reports_per_second(channel.config, sources[channel.source])),
                                epsilon_per_report=channel.charge_nano / NANO,
                                delta_per_report=channel.charge_delta / DELTA_UNIT)
                for channel in channels]
    implied = {"mechanisms": describe_channels(channels),
               "budget": budget_plan(config, spending)}
    if config.plan is not None:
        implied["plan"] = plan_document(config)
    return implied


def budget_advice(config: AgentConfig, effective: dict) -> list[str]:
    from edge_agent.spending import budget_lines, memo_lines, plan_lines

    if "plan" in effective:  # the plan states its worst cases; rates would say averages
        lines = [f"What a wearer gets: {effective['budget']['promise']}",
                 *plan_lines(effective["plan"]), *memo_lines(config)]
    else:
        lines = budget_lines(config, effective["budget"]) + memo_lines(config)
    renamed = ([f"Renamed: privacy.plan_slot is now plan_resolution (plan_resolution = "
                f"\"{config.privacy.plan_slot}\" says the same)"]
               if config.privacy.plan_slot is not None else [])
    return ledger_lines(config) + renamed + lines + flat_end_lines(config)


def ledger_lines(config: AgentConfig) -> list[str]:
    """What the agent's ledger, where there is one already, says of the guarantees: a
    window that reaches before the spending it knows (``unknown_past_lines``)."""
    from edge_agent.agent import STATE_FILE
    from edge_agent.spending import unknown_past_lines
    from edge_agent.state import StateStore

    path = Path(config.privacy.state_dir) / STATE_FILE
    try:
        store = StateStore(path, read_only=True)
    except sqlite3.Error:  # no ledger yet (or not readable here): nothing is known of it
        return []
    try:
        clock = store.clock()
    except sqlite3.Error:  # a ledger from before ledger time: converted at the first start
        return []
    finally:
        store.close()
    return [f"Ledger: {line}" for line in unknown_past_lines(clock, config.privacy.horizons)]


# A channel's flat ends are named when more of its readings than this lie in them.
FLAT_SHARE_NAMED = 1e-3


def flat_end_lines(config: AgentConfig) -> list[str]:
    """One line per channel whose mechanism reports the same distribution for every value
    near its domain's ends (classical OGPM, Theorem 3.7) where readings lie: those are
    estimated at the regions' edges, and only the configuration can change that.  Where
    readings lie: a recording's (its first rows), a simulated fleet's for a synthetic
    source, otherwise the plan's fleet (plan_spread around the domain's middle).  A
    polar split that leaves the radius no epsilon is named too."""
    from edge_agent.channels import build_channels, share_in
    from edge_agent.config.planning import FleetShape
    from edge_agent.sources.recordings import MAX_ROWS, recorded_readings
    from edge_agent.sources.synthetic import simulated_readings

    def known(source):
        if source.type == "synthetic":
            return simulated_readings(source), "a simulated fleet of source"
        rows = recorded_readings(source)
        shown = 0 if rows is None else min(len(rows), MAX_ROWS)
        return rows, f"the recording (its first {shown:,} rows) of source"

    readings = {source.name: known(source) for source in config.sources}
    shape = FleetShape(config.privacy.assumed_spread)
    lines = []
    for channel in build_channels(config, config.agent_id):
        rows, what_rows = readings[channel.source]
        for part, (mechanism, regions) in channel.flat_regions().items():
            what = f"{channel.name}'s {part}" if part else channel.name
            if mechanism.epsilon == 0:  # a polar split that leaves the radius nothing
                lines.append(f"No epsilon: {what} gets none of the channel's epsilon (split "
                             f"= \"report\" at this epsilon): its reports say nothing about "
                             f"it; split = \"fleet\" gives it a share")
                continue
            if not regions:
                continue
            names = channel.field_names[:1] if part == "radius" else channel.field_names
            share = None if rows is None else share_in(regions,
                                                       *(rows.column(n) for n in names))
            where = f"of {what_rows} {channel.source!r}"
            if share is None:
                share = shape.share_in(regions, mechanism.low, mechanism.high)
                where = (f"of a fleet spread by plan_spread {shape.spread:g} of the width "
                         f"around the domain's middle")
            if share < FLAT_SHARE_NAMED:
                continue
            lines.append(
                f"Flat ends: {what} ({mechanism.name} at epsilon {mechanism.epsilon:.3g}) "
                f"reports the same distribution "
                f"for every value in {' and '.join(f'[{a:.4g}, {b:.4g}]' for a, b in regions)}"
                f", where {share:.1%} of the readings {where} lie: those are estimated at "
                f"the regions' edges; choose a domain whose ends the readings do not reach, "
                f'or (linear and vector channels) mechanism = "auto", or (polar) '
                f'radius_mechanism = "auto"')
    return lines


add_check_config(main, load_config, implied, budget_advice)


def describe_channels(channels: list) -> dict:
    """Each channel's mechanism, topic and charge, by name."""
    described = {}
    for channel in channels:
        entry = {"topic": channel.topic, "epsilon_per_report": channel.epsilon,
                 "mechanism": channel.describe()}
        if channel.kind == "vector":
            entry["axes_per_report"] = channel.k
            if channel.axis_epsilon is not None:  # duchi-vector: one joint report
                entry["epsilon_per_axis"] = channel.axis_epsilon
        described[channel.name] = entry
    return described


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="agent TOML file")
@click.option("--fleet", type=click.IntRange(1, PLAN_FLEET_MAX),
              help="wearers to state the errors for (default: privacy.plan_fleet)")
@click.option("--target", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="error of the fleet's mean per plan_resolution a study needs, as a share "
                   "of the domain's width: the wearers that reach it (default: "
                   "privacy.plan_target)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def plan(config_path: str, fleet: int | None, target: float | None, as_json: bool) -> None:
    """The planner's schedule per channel and the error of the fleet's mean it gives per
    minute, hour and day (privacy.plan = "auto")."""
    from edge_agent.spending import plan_document, plan_lines

    config = _load(config_path)
    if config.plan is None:
        click.echo(f"{config_path}: privacy.plan is \"manual\" (every channel gives its "
                   f"epsilon): nothing is planned; check-config states what it spends",
                   err=True)
        sys.exit(2)
    document = plan_document(config, fleet=fleet, target=target)
    if as_json:
        click.echo(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        for line in plan_lines(document):
            click.echo(line)


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="agent TOML file")
def run(config_path: str) -> None:
    """Run the agent until SIGTERM or until every finite source has ended."""
    from edge_agent.agent import AgentService
    from edge_agent.fleet import single_agent_problems

    config = _load(config_path, EXIT_CONFIG)
    problems = single_agent_problems(config)
    if problems:  # e.g. a ble source that splits its devices between a fleet's agents
        click.echo(f"{config_path}: cannot run as one agent:", err=True)
        for line in problems:
            click.echo(f"  {line}", err=True)
        sys.exit(EXIT_CONFIG)
    require_agent_paths(config_path, config)
    service = AgentService(config)
    service.install_signal_handlers()
    sys.exit(service.run())


@main.command("warm-up")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="agent TOML file")
def warm_up(config_path: str) -> None:
    """Compile the kernels the channels use into NUMBA_CACHE_DIR (what `run` does before
    it reports), so that the service's first start loads them.  No broker, no ledger."""
    import os

    from edge_agent.channels import build_channels

    config = _load(config_path, EXIT_CONFIG)
    began = time.monotonic()
    channels = build_channels(config, config.agent_id)
    for channel in channels:
        channel.warm_up()
    cache = os.environ.get("NUMBA_CACHE_DIR") or "numba's default cache (next to the sources)"
    click.echo(f"{len(channels)} channel(s) warmed up in {time.monotonic() - began:.1f} s; "
               f"kernels cached in {cache}")


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="agent TOML file (agent_id, broker, budget, sources and channels of each "
                   "virtual agent)")
@click.option("--count", required=True, type=click.IntRange(1, FLEET_MAX_COUNT),
              help=f"number of virtual agents, in [1, {FLEET_MAX_COUNT}]; "
                   "their ids are <agent_id>-0 .. <agent_id>-<count-1>")
@click.option("--keep-running", is_flag=True,
              help="stay connected after every finite source has ended, until SIGTERM/SIGINT")
@click.option("--truth", "truth_path", type=click.Path(dir_okay=False), default=None,
              help="simulation only: keep the true means of the reported readings in this "
                   "JSON file (to check the collector's estimates against)")
def fleet(config_path: str, count: int, keep_running: bool, truth_path: str | None) -> None:
    """Simulate COUNT agents in one process (one MQTT connection, one state file).

    Synthetic sources are seeded per virtual agent; a CSV source is split
    between them (agent i replays rows i, i+COUNT, i+2*COUNT, ...).
    """
    from edge_agent.fleet import check_fleet, fleet_service

    config = _load(config_path)
    try:
        check_fleet(config, count)
    except ConfigError as exc:
        click.echo(f"{config_path}: cannot run as a fleet:", err=True)
        for line in str(exc).splitlines():
            click.echo(f"  {line}", err=True)
        sys.exit(2)
    require_agent_paths(config_path, config)
    service = fleet_service(config, count=count, keep_running=keep_running,
                            truth_path=Path(truth_path) if truth_path else None)
    service.install_signal_handlers()
    sys.exit(service.run())


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
@click.option("--agent", "agent_id", default=None, metavar="ID",
              help="agent whose ledger to show (default: agent_id of the config; "
                   "a fleet's virtual agents are <agent_id>-<i>)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def budget(config_path: str, agent_id: str | None, as_json: bool) -> None:
    """Epsilon (and delta, with a delta budget) spent in the rolling window of each
    guarantee that ends now, per channel."""
    from edge_agent.agent import STATE_FILE
    from edge_agent.state import NANO, StateStore

    config = _load(config_path)
    agent_id = agent_id or config.agent_id
    path = Path(config.privacy.state_dir) / STATE_FILE
    guarantees = config.privacy.horizons
    rows: list[dict[str, tuple[int, int, int]]] = [{} for _ in guarantees]
    behind, memoized = False, {}
    if not path.exists():
        click.echo(f"no ledger yet at {path}: nothing has been spent", err=True)
    else:
        store = StateStore(path, read_only=True)
        try:
            now = time.time()
            rows = [store.budget_report(agent_id, g.seconds, now) for g in guarantees]
            behind = store.clock(now).behind(now)
            memoized = store.memo_account(agent_id)
        except sqlite3.OperationalError:
            raise click.ClickException(f"{path}: a ledger from an earlier version; start the "
                                       f"agent once to convert it") from None
        finally:
            store.close()
    windows = [_spent_in_window(g, of) for g, of in zip(guarantees, rows)]
    # The longest guarantee's at the top, as before guarantees; every one under it.
    summary = {"agent": agent_id, **windows[-1], "clock_behind": behind,
               "guarantees": windows,
               # memoize = true: values memoized and what their reports reveal about them
               # at most, for good (device only: it depends on the readings)
               "memoized": {channel: {"values": count, "epsilon": nano / NANO}
                            for channel, (count, nano) in memoized.items()}}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"agent {agent_id}:")
    if behind:
        click.echo("  the clock is behind the latest time the agent saw: nothing is reported")
    for window in windows:
        click.echo(f"  ε {window['budget_epsilon']:g} in every rolling {window['period']}: "
                   f"spent {window['spent']:.6g}, remaining {window['remaining']:.6g}")
        if "budget_delta" in window:
            click.echo(f"    delta: budget {window['budget_delta']:.6g}; spent "
                       f"{window['spent_delta']:.6g}, remaining "
                       f"{window['remaining_delta']:.6g}")
        for channel, entry in sorted(window["channels"].items()):
            line = f"    {channel:<24} {entry['spent']:>12.6g}  ({entry['reports']} reports)"
            if "delta" in entry:
                line += f"  delta {entry['delta']:.6g}"
            click.echo(line)
    for channel, entry in summary["memoized"].items():
        click.echo(f"  {channel}: {entry['values']} value(s) memoized; their reports reveal "
                   f"ε ≤ {entry['epsilon']:.6g} about them, for good")


def _spent_in_window(guarantee, rows: dict[str, tuple[int, int, int]]) -> dict:
    """One guarantee's window as ``budget`` shows it (``rows``: the ledger's per channel)."""
    from edge_agent.state import DELTA_UNIT, NANO, delta_units_down

    # Delta only where there is any: a budget for it, or delta spent under an earlier one.
    spent_delta = sum(delta for _, _, delta in rows.values())  # exact, in units
    show_delta = guarantee.delta > 0 or spent_delta > 0
    channels = {name: {"spent": nano / NANO, "reports": reports,
                       **({"delta": delta / DELTA_UNIT} if show_delta else {})}
                for name, (nano, reports, delta) in rows.items()}
    spent = sum(entry["spent"] for entry in channels.values())
    out = {"budget_epsilon": guarantee.epsilon, "period": guarantee.per, "spent": spent,
           "remaining": max(0.0, guarantee.epsilon - spent), "channels": channels}
    if show_delta:
        out.update(budget_delta=guarantee.delta, spent_delta=spent_delta / DELTA_UNIT,
                   remaining_delta=max(0, delta_units_down(guarantee.delta) - spent_delta)
                   / DELTA_UNIT)
    return out


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
def status(config_path: str) -> None:
    """The running agent's device-only status (counters that depend on readings, which
    are never published), as it last wrote it to the state directory."""
    from edge_agent.agent import LOCAL_STATUS_FILE

    config = _load(config_path)
    path = Path(config.privacy.state_dir) / LOCAL_STATUS_FILE
    try:
        click.echo(path.read_text())
    except FileNotFoundError:
        raise click.ClickException(f"{path}: no status yet (the agent writes it every "
                                   f"30 s while it runs)") from None


if __name__ == "__main__":  # pragma: no cover
    main()
