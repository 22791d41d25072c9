"""``edge-collector``: run the collector, check its configuration, watch it live."""

from __future__ import annotations

import json
import logging
import sys

import click

from edge_agent.config import ConfigError

from .config import CollectorConfig, load_collector_config

EXIT_CONFIG = 78  # sysexits EX_CONFIG, as for the agent


def _load(path: str, exit_code: int = 2) -> CollectorConfig:
    try:
        return load_collector_config(path)
    except ConfigError as exc:
        click.echo(f"{path}: invalid configuration:", err=True)
        for line in str(exc).splitlines():
            click.echo(f"  {line}", err=True)
        sys.exit(exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def main(log_level: str) -> None:
    """Fleet-wide aggregates of locally privatised sensor reports."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command("check-config")
@click.argument("file", type=click.Path(dir_okay=False))
def check_config(file: str) -> None:
    """Validate FILE and print the effective configuration (exit 2 if invalid)."""
    config = _load(file)
    effective = config.model_dump(mode="json")
    if config.broker.password is not None:
        effective["broker"]["password"] = "********"
    click.echo(json.dumps(effective, indent=2))


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
def run(config_path: str) -> None:
    """Ingest reports, keep aggregates, serve the dashboard and API until SIGTERM."""
    from .service import CollectorService

    config = _load(config_path, EXIT_CONFIG)
    sys.exit(CollectorService(config).run_forever())


@main.command()
@click.argument("url", default="http://127.0.0.1:8080")
@click.option("--interval", default=2.0, show_default=True, help="seconds between refreshes")
@click.option("--once", is_flag=True, help="print one snapshot and exit")
def watch(url: str, interval: float, once: bool) -> None:
    """A live terminal table of a running collector's aggregates."""
    from .watch import watch as run_watch

    sys.exit(run_watch(url, interval=interval, once=once))


if __name__ == "__main__":  # pragma: no cover
    main()
