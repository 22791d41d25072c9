"""What the two command lines (``edge-agent``, ``edge-collector``) share."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from edge_agent.common.config import ConfigError

# sysexits EX_CONFIG: the units' RestartPreventExitStatus=78 stops systemd from
# restarting a service whose configuration cannot work.
EXIT_CONFIG = 78
Config = TypeVar("Config")


def command_group(help_text: str, *, needs: tuple[str, ...] = (),
                  extra: str | None = None) -> click.Group:
    """The top command: ``--log-level`` sets up logging for every subcommand.  ``needs``:
    modules of an optional extra (``extra``) that every subcommand needs: without them the
    command says in one line what to install, and exits 1."""

    @click.group(context_settings={"help_option_names": ["-h", "--help"]}, help=help_text)
    @click.option("--log-level", default="INFO", show_default=True,
                  type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                    case_sensitive=False))
    @click.pass_context
    def group(context: click.Context, log_level: str) -> None:
        missing = [name for name in needs if importlib.util.find_spec(name) is None]
        if missing:
            click.echo(f"{context.info_name}: {', '.join(missing)} not installed: install "
                       f"the {extra} extra, pip install 'edge-ldp[{extra}]'", err=True)
            sys.exit(1)
        logging.basicConfig(level=log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    return group


def add_check_config(group: click.Group, load: Callable[[str], Config],
                     more: Callable[[Config], dict] | None = None,
                     advice: Callable[[Config, dict], list[str]] | None = None) -> None:
    """``check-config FILE``: validate and print the effective configuration (exit 2 if
    invalid); ``more`` adds what else the configuration implies, ``advice`` lines for a
    person (on stderr, so that stdout stays JSON) from the printed document."""

    @group.command("check-config")
    @click.argument("file", type=click.Path(dir_okay=False))
    def check_config(file: str) -> None:
        """Validate FILE and print the effective configuration (exit 2 if invalid)."""
        config = load_or_exit(load, file)
        effective = config.model_dump(mode="json")
        if config.broker.password is not None:
            effective["broker"]["password"] = "********"
        if more is not None:
            effective.update(more(config))
        click.echo(json.dumps(effective, indent=2, ensure_ascii=False))
        for line in advice(config, effective) if advice is not None else ():
            click.echo(line, err=True)


def load_or_exit(load: Callable[[str], Config], path: str, exit_code: int = 2) -> Config:
    """The configuration in ``path``, or every problem in it on stderr and ``exit_code``
    (2 for a check, ``EXIT_CONFIG`` for a service)."""
    try:
        return load(path)
    except ConfigError as exc:
        click.echo(f"{path}: invalid configuration:", err=True)
        for line in str(exc).splitlines():
            click.echo(f"  {line}", err=True)
        sys.exit(exit_code)


def require_paths(config_path: str, *, read: dict[str, Path], write: dict[str, Path],
                  hints: dict[str, str] | None = None, exit_code: int = EXIT_CONFIG) -> None:
    """Exit ``exit_code`` with one line per problem, naming its key, unless every file in
    ``read`` can be read and every directory in ``write`` exists (or can be made) and
    takes a new file: a service should say which setting is wrong at start-up, not fail
    with a traceback at its first use.  ``hints``: what to do, by key."""
    problems = []
    for key, path in read.items():
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            problems.append((key, f"cannot read {path} ({exc.strerror or type(exc).__name__})"))
    for key, directory in write.items():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as exc:
            problems.append((key, f"cannot write {directory} "
                                  f"({exc.strerror or type(exc).__name__})"))
    for key, problem in problems:
        hint = (hints or {}).get(key, "")
        click.echo(f"{config_path}: invalid configuration: {key}: {problem}"
                   + (f"; {hint}" if hint else ""), err=True)
    if problems:
        sys.exit(exit_code)
