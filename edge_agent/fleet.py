"""The fleet simulator: N virtual agents in one process (``edge-agent fleet``).

Virtual agent i (i = 0 .. N-1) is ``<agent_id>-<i>``.  Each has its own
sources, channels, budget ledger and sequence numbers; they share what can
be shared:

* one process (one numba JIT) and one MQTT connection;
* one SQLite state file in ``state_dir`` (every ledger, seq and spool row
  carries its agent id), and one transaction per batch for all of them
  (``AgentService.tick`` -> ``agent.commit_batches``);
* the mechanism objects: every virtual agent's channels are clones of one
  template (``Channel.for_agent``), and a mechanism is immutable.

Sources:

* ``synthetic``: seeded by agent id, so every virtual agent has its own
  stream.  A configured ``seed`` is combined with the agent id (the fleet
  stays reproducible and the agents still differ).
* ``csv``: virtual agent i replays rows i, i + N, i + 2N, ... of the file
  (``CsvSource(offset=i, stride=N)``, all reading one in-memory copy of the
  file; see ``sources.csv_source`` for how
  ``pace`` and ``loop`` interact with striding).
* ``jsonl``, ``mqtt`` and ``i2c`` read one real stream (stdin, a broker, a
  bus) and are refused: they cannot be split into N agents.

Status: every virtual agent's retained status is published on connect, every
``status_interval`` and as ``offline`` at a clean shutdown.  The MQTT last
will belongs to the one connection: it is an ``offline`` status on the base
id's topic ``ldp/v1/<fleet>/<agent_id>/status`` (an id no virtual agent uses)
carrying ``{"simulator": {"agents": N, ...}}``.  After a crash (``kill -9``,
power loss) that will is all the broker publishes: the virtual agents'
retained statuses keep saying ``online``, with a ``t`` that stops advancing.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from . import protocol
from .agent import AgentCore, AgentService
from .channels import build_channel
from .cli import FLEET_MAX_COUNT as MAX_COUNT
from .config import NAME_PATTERN, AgentConfig, ConfigError, CsvSourceConfig, \
    SyntheticSourceConfig
from .sources import CsvSource, SyntheticSource
from .sources.base import Source
from .sources.synthetic import stable_seed
from .transport import PahoTransport, Transport

log = logging.getLogger(__name__)

FLEET_SOURCE_TYPES = ("synthetic", "csv")
# Spool rows handed to paho at once.  One agent's 100 (broker.max_inflight)
# caps a fleet at ~2,000 messages/s (the loop pumps every 50 ms); paho still
# keeps at most max_inflight unacknowledged on the wire and queues the rest.
FLEET_OUTBOX_WINDOW = 20_000


def virtual_agent_ids(agent_id: str, count: int) -> list[str]:
    return [f"{agent_id}-{i}" for i in range(count)]


def check_fleet(config: AgentConfig, count: int) -> None:
    """Raise ``ConfigError`` (every problem, key path and allowed range) if the
    config cannot run as a fleet of ``count`` virtual agents."""
    problems = []
    if not 1 <= count <= MAX_COUNT:
        problems.append(f"--count: must be in [1, {MAX_COUNT}], got {count}")
    for i, source in enumerate(config.sources):
        if source.type not in FLEET_SOURCE_TYPES:
            problems.append(f"sources[{i}].type: must be one of "
                            f"{', '.join(map(repr, FLEET_SOURCE_TYPES))} in a fleet "
                            f"(one {source.type} stream cannot be split into agents), "
                            f"got {source.type!r}")
    last = f"{config.agent_id}-{max(count, 1) - 1}"
    if not re.match(NAME_PATTERN, last):
        room = 64 - len(f"-{max(count, 1) - 1}")
        problems.append(f"agent_id: the virtual agent ids run up to {last!r}, longer than 64 "
                        f"characters; with --count {count} agent_id must be at most {room} "
                        f"characters, got {len(config.agent_id)}")
    if problems:
        raise ConfigError("\n".join(problems))


def fleet_sources(config: AgentConfig, agent_id: str, index: int,
                  count: int) -> dict[str, Source]:
    """Virtual agent ``index``'s sources (constructed, not started)."""
    sources: dict[str, Source] = {}
    for source in config.sources:
        if isinstance(source, SyntheticSourceConfig):
            if source.seed is not None:  # the fleet is reproducible, its agents differ
                source = source.model_copy(
                    update={"seed": stable_seed(f"{source.seed}\x00{agent_id}", source.name)})
            sources[source.name] = SyntheticSource(source, agent_id=agent_id)
        elif isinstance(source, CsvSourceConfig):
            sources[source.name] = CsvSource(source, offset=index, stride=count)
        else:
            raise ConfigError(f"sources: {source.type!r} sources cannot run in a fleet")
    return sources


class TrueMeans:
    """What the simulated agents really measured, for demos and tests only.

    The mean of the readings each linear channel selected for reporting (and
    the mean direction of circular ones) over the whole fleet: the truth the
    collector's estimates can be checked against.  A real agent never has
    this; with a budget large enough that nothing is refused, the selected
    readings are exactly the reported ones.
    """

    def __init__(self):
        self.sums: dict[str, list[float]] = {}

    def add(self, channel, selection) -> None:
        values = selection.values[0]
        if channel.kind == "linear":
            n, total = self.sums.get(channel.name, (0, 0.0))
            self.sums[channel.name] = [n + values.size, total + float(values.sum())]
        elif channel.kind == "circular":
            radians = values * (2 * np.pi / channel.mechanism.period)
            n, s, c = self.sums.get(channel.name, (0, 0.0, 0.0))
            self.sums[channel.name] = [n + values.size, s + float(np.sin(radians).sum()),
                                       c + float(np.cos(radians).sum())]

    def document(self) -> dict[str, dict]:
        out = {}
        for name, sums in self.sums.items():
            if len(sums) == 2:
                out[name] = {"n": sums[0], "mean": sums[1] / sums[0]}
            else:
                out[name] = {"n": sums[0], "mean_direction_rad": math.atan2(sums[1], sums[2]),
                             "resultant_length": math.hypot(sums[1], sums[2]) / sums[0]}
        return out

    def write(self, path: Path) -> None:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.document()))
        temporary.replace(path)  # readers never see half a file


class FleetService(AgentService):
    """``count`` virtual agents, one connection, one state file, one transaction per batch."""

    def __init__(self, config: AgentConfig, *, count: int, truth_path: Path | None = None,
                 **kwargs: Any):
        check_fleet(config, count)
        self.count = count
        self.agent_ids = virtual_agent_ids(config.agent_id, count)
        super().__init__(config, **kwargs)
        self.truth_path = truth_path
        if truth_path is not None:
            self.truth = TrueMeans()
            for core in self.cores:
                core.truth = self.truth

    def tick(self, now: float) -> None:
        super().tick(now)
        if self.truth_path is not None:
            self.truth.write(self.truth_path)

    def _build_cores(self, rng: Any) -> list[AgentCore]:
        config = self.config
        # One template per channel config: its mechanism is built (and later
        # JIT-compiled) once and shared by every virtual agent's clone.
        templates = [build_channel(c, agent_id=self.agent_ids[0], fleet=config.fleet)
                     for c in config.channels]
        return [AgentCore(config, self.store, rng=rng, agent_id=agent_id,
                          sources=fleet_sources(config, agent_id, i, self.count),
                          channels=[t.for_agent(agent_id, config.fleet) for t in templates])
                for i, agent_id in enumerate(self.agent_ids)]

    def _build_transport(self) -> Transport:
        config = self.config
        will = protocol.status(agent=config.agent_id, state="offline", simulator={
            "agents": self.count, "first": self.agent_ids[0], "last": self.agent_ids[-1]})
        return PahoTransport(config.broker, client_id=f"{config.agent_id}-fleet",
                             will=(self.status_topic, will))

    def _outbox_window(self) -> int:
        return max(self.config.broker.max_inflight, FLEET_OUTBOX_WINDOW)
