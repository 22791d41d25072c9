"""Agent and collector configurations as dicts, and the TOML files the programs read.

A test states only what it is about; everything else comes from here.  The dicts
go to ``parse_config`` / ``parse_collector_config`` directly, or through
``write_toml`` to a file for a child process; both paths see the same data.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path

from edge_agent.common.config import toml_value

FLEET = "demo"

# The building blocks most configurations share: a synthetic IMU and the linear
# channel on its x acceleration.
SYNTHETIC_IMU = {"name": "imu", "type": "synthetic"}
AX_CHANNEL = {"name": "ax", "source": "imu", "field": "accel_x", "kind": "linear",
              "epsilon": 1.0, "domain": [-2.0, 2.0]}


# -- TOML -----------------------------------------------------------------------------

def _is_table_array(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(item, Mapping) for item in value)


def to_toml(data: Mapping, prefix: str = "") -> str:
    """``data`` as TOML: keys first, then [tables] and [[arrays of tables]], nested ones
    as [parent.child].  Enough for every configuration the tests write; tomllib reads
    back exactly ``data``."""
    lines, tables = [], []
    for key, value in data.items():
        if isinstance(value, Mapping) or _is_table_array(value):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in tables:
        name = f"{prefix}{key}"
        for item in (value if _is_table_array(value) else [value]):
            lines.append(f"[[{name}]]" if _is_table_array(value) else f"[{name}]")
            body = to_toml(item, f"{name}.")
            if body:
                lines.append(body.rstrip("\n"))
    return "\n".join(lines) + "\n" if lines else ""


def write_toml(path: Path, data: Mapping) -> Path:
    path.write_text(to_toml(data))
    return path


# -- the [broker] table ------------------------------------------------------------------

def broker_table(broker, **settings) -> dict:
    """[broker] for ``broker``: a test broker (anything with ``host`` and ``port``),
    or a ready table (a dict, e.g. a credentials snippet); ``settings`` add keys."""
    table = dict(broker) if isinstance(broker, Mapping) else {"host": broker.host,
                                                              "port": broker.port}
    return {**table, **settings}


# -- the agent ------------------------------------------------------------------------

def agent_config(*, state_dir, broker=None, agent_id: str = "w1", fleet: str = FLEET,
                 budget: float | None = 1e6, period: str | None = None,
                 batch_seconds: float | None = 0.2, sources: Sequence[Mapping] = (SYNTHETIC_IMU,),
                 channels: Sequence[Mapping] = (AX_CHANNEL,),
                 privacy: Mapping | None = None, delivery: Mapping | None = None) -> dict:
    """An agent configuration.  The defaults suit a test: a budget that never runs out
    and 0.2 s batches, so reports arrive within a second; ``None`` leaves a key to the
    agent's own default (``budget=None`` with ``privacy={"guarantees": ...}``).
    ``privacy`` adds keys to [privacy] (``range_epsilon_max``), ``delivery`` is the
    [delivery] table."""
    data = {"agent_id": agent_id, "fleet": fleet}
    if batch_seconds is not None:
        data["batch_seconds"] = batch_seconds
    if broker is not None:
        data["broker"] = broker_table(broker)
    data["privacy"] = {**({"budget_epsilon": budget} if budget is not None else {}),
                       **({"budget_period": period} if period is not None else {}),
                       "state_dir": str(state_dir), **(privacy or {})}
    if delivery is not None:
        data["delivery"] = dict(delivery)
    data["sources"] = copy.deepcopy(list(sources))  # the tests' constants stay untouched
    data["channels"] = copy.deepcopy(list(channels))
    return data


def commented_source(source_type: str) -> dict:
    """The commented ``[[sources]]`` example of ``source_type`` in configs/agent.toml,
    uncommented and parsed (the sample's examples must stay valid)."""
    import tomllib

    from tests.support.paths import REPO

    lines = (REPO / "configs" / "agent.toml").read_text().splitlines()
    for start, line in enumerate(lines):
        block = []
        if line.startswith("# [[sources]]"):
            for comment in lines[start:]:
                if not comment.startswith("#") or comment.strip() == "#":
                    break
                block.append(comment[2:])
            source = tomllib.loads("\n".join(block))["sources"][0]
            if source["type"] == source_type:
                return source
    raise LookupError(f"no commented [[sources]] of type {source_type} in configs/agent.toml")


def write_agent_config(path: Path, **settings) -> Path:
    """``agent_config(**settings)`` written to ``path``, for an agent process."""
    return write_toml(path, agent_config(**settings))


# -- the collector ------------------------------------------------------------------------

def collector_config(broker, *, fleet: str = FLEET, broker_settings: Mapping | None = None,
                     **tables) -> dict:
    """A collector configuration: the fleet, [broker] for ``broker`` (plus
    ``broker_settings``) and whatever other ``tables`` the test needs; the
    collector's defaults for the rest."""
    return {"fleet": fleet, "broker": broker_table(broker, **(broker_settings or {})),
            **copy.deepcopy(tables)}
