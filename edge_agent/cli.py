"""``edge-agent``: run the agent, check a configuration, inspect the budget, simulate a fleet."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from .commandline import EXIT_CONFIG, add_check_config, command_group, load_or_exit
from .config import FLEET_MAX_COUNT, AgentConfig, ConfigError, load_config


def _load(path: str, exit_code: int = 2) -> AgentConfig:
    return load_or_exit(load_config, path, exit_code)


main = command_group("Local-differential-privacy agent for sensor streams.")
add_check_config(main, load_config, lambda config: {"mechanisms": describe_channels(config)})


def describe_channels(config: AgentConfig) -> dict:
    """Each channel's mechanism as the protocol will announce it (polar splits, vector plans)."""
    from .channels import build_channel

    described = {}
    for channel_config in config.channels:
        channel = build_channel(channel_config, agent_id=config.agent_id, fleet=config.fleet)
        entry = {"topic": channel.topic, "epsilon_per_report": channel.epsilon,
                 "mechanism": channel.describe()}
        if channel.kind == "vector":
            entry["axes_per_report"] = channel.k
            entry["epsilon_per_axis"] = channel.axis_epsilon
        described[channel.name] = entry
    return described


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="agent TOML file")
def run(config_path: str) -> None:
    """Run the agent until SIGTERM or until every finite source has ended."""
    from .agent import AgentService

    config = _load(config_path, EXIT_CONFIG)
    service = AgentService(config)
    service.install_signal_handlers()
    sys.exit(service.run())


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
    from .fleet import check_fleet, fleet_service

    config = _load(config_path)
    try:
        check_fleet(config, count)
    except ConfigError as exc:
        click.echo(f"{config_path}: cannot run as a fleet:", err=True)
        for line in str(exc).splitlines():
            click.echo(f"  {line}", err=True)
        sys.exit(2)
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
    """Epsilon spent and remaining, per budget period and per channel."""
    from .agent import STATE_FILE
    from .state import StateStore, period_start

    config = _load(config_path)
    agent_id = agent_id or config.agent_id
    path = Path(config.privacy.state_dir) / STATE_FILE
    if not path.exists():
        click.echo(f"no ledger yet at {path}: nothing has been spent", err=True)
        rows = []
    else:
        store = StateStore(path, read_only=True)
        rows = store.budget_report(agent_id)
        store.close()
    total = config.privacy.budget_epsilon
    current = period_start(time.time(), config.privacy.period_seconds)
    periods: dict[int, dict] = {}
    for _, start, channel, spent, reports in rows:
        period = periods.setdefault(start, {"period_start": start, "channels": {}, "spent": 0.0})
        period["channels"][channel] = {"spent": spent, "reports": reports}
        period["spent"] += spent
    for period in periods.values():
        period["remaining"] = max(0.0, total - period["spent"])
        period["current"] = period["period_start"] == current
    if as_json:
        click.echo(json.dumps({"agent": agent_id, "budget_epsilon": total,
                               "period": config.privacy.budget_period,
                               "periods": list(periods.values())}, indent=2))
        return
    click.echo(f"agent {agent_id}: budget {total:g} per {config.privacy.budget_period}")
    if current not in periods:
        click.echo(f"  current period (from {_utc(current)}): spent 0, remaining {total:g}")
    for start, period in periods.items():
        label = "current period" if period["current"] else "period"
        click.echo(f"  {label} from {_utc(start)}: spent {period['spent']:.6g}, "
                   f"remaining {period['remaining']:.6g}")
        for channel, entry in sorted(period["channels"].items()):
            click.echo(f"    {channel:<24} {entry['spent']:>12.6g}  ({entry['reports']} reports)")


def _utc(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


if __name__ == "__main__":  # pragma: no cover
    main()
