"""The fleet simulator: N virtual agents in one process (``edge-agent fleet``).

Virtual agent i (i = 0 .. N-1) is ``<agent_id>-<i>``.  Each has its own
sources, channels, budget ledger and sequence numbers; they share what can
be shared:

* one process (one numba JIT) and one MQTT connection;
* one SQLite state file in ``state_dir`` (every ledger, seq and spool row
  carries its agent id), and one transaction per batch for all of them
  (``AgentService.tick`` -> ``agent.record_batches``);
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
* ``ble`` with ``assign = "one_per_agent"``: virtual agent i reads
  ``devices[i]`` (one wearable per agent; ``--count`` must equal the number of
  devices).  With ``assign = "this_agent"`` every device belongs to one wearer
  and the source is refused, as is one listing several devices under
  ``edge-agent run`` (``single_agent_problems``).
* ``jsonl``, ``mqtt`` and ``i2c`` read one real stream (stdin, a broker, a
  bus) and are refused: they cannot be split into N agents.

Status: every virtual agent's retained status is published on connect, every
``status_interval`` and as ``offline`` at a clean shutdown.  The MQTT last
will belongs to the one connection: it is an ``offline`` status on the base
id's topic ``ldp/v1/<fleet>/<agent_id>/status`` (an id no virtual agent uses)
carrying ``{"simulator": {"agents": N, ...}}``.  After a crash (``kill -9``,
power loss) that will is all the broker publishes: the virtual agents'
retained statuses keep saying ``online``, with a ``t`` that stops advancing.

``fleet_service`` builds all of this from its own parts and hands them to an
ordinary ``AgentService``; nothing of the agent's own classes knows about the
simulation.  With ``--truth`` it also keeps the true means of what the virtual
agents reported (``TrueMeans``, through ``TruthTap`` channels), for demos and
tests only.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent import protocol
from edge_agent.agent import STOP_SECONDS, AgentCore, AgentService, open_state
from edge_agent.channels import Channel, Selection, build_channels
from edge_agent.config import (
    FLEET_MAX_COUNT,
    NAME_PATTERN,
    AgentConfig,
    BleSourceConfig,
    ConfigError,
    CsvSourceConfig,
    SyntheticSourceConfig,
)
from edge_agent.readings import Readings
from edge_agent.sources import BleSource, CsvSource, SyntheticSource
from edge_agent.sources.base import Source
from edge_agent.sources.synthetic import stable_seed
from edge_agent.transport import PahoTransport

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
    if not 1 <= count <= FLEET_MAX_COUNT:
        problems.append(f"--count: must be in [1, {FLEET_MAX_COUNT}], got {count}")
    for i, source in enumerate(config.sources):
        if source.type == "ble":
            problems += _ble_fleet_problems(i, source, count)
        elif source.type not in FLEET_SOURCE_TYPES:
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


def _ble_fleet_problems(i: int, source: BleSourceConfig, count: int) -> list[str]:
    if source.assign != "one_per_agent":
        return [f"sources[{i}].assign: must be \"one_per_agent\" in a fleet (virtual agent "
                f"k takes devices[k]; \"this_agent\" gives every device to one agent), "
                f"got {source.assign!r}"]
    if len(source.devices) != count:
        return [f"sources[{i}].devices: virtual agent k takes devices[k]: --count {count} "
                f"needs {count} devices, the source lists {len(source.devices)}"]
    return []


def single_agent_problems(config: AgentConfig) -> list[str]:
    """What keeps the config from running as one agent (``edge-agent run``): a ble
    source that splits its devices between the virtual agents of a fleet."""
    return [f"sources[{i}].assign: \"one_per_agent\" gives each virtual agent of "
            f"`edge-agent fleet --count {len(source.devices)}` one of the "
            f"{len(source.devices)} devices; one agent (`edge-agent run`) takes one device, "
            f"or use assign = \"this_agent\" with a prefix per device"
            for i, source in enumerate(config.sources)
            if source.type == "ble" and source.assign == "one_per_agent"
            and len(source.devices) > 1]


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
        elif isinstance(source, BleSourceConfig):  # check_fleet: one device per agent
            sources[source.name] = BleSource(source, devices=[source.devices[index]])
        else:
            raise ConfigError(f"sources: {source.type!r} sources cannot run in a fleet")
    return sources


class TrueMeans:
    """What the simulated agents really measured, for demos and tests only.

    The mean of the readings each linear channel selected for reporting (the
    mean direction of circular ones, the share of each category of categorical
    ones) over the whole fleet: the truth the
    collector's estimates can be checked against.  A real agent never has
    this; with a budget large enough that nothing is refused, the selected
    readings are exactly the reported ones.
    """

    def __init__(self):
        self.sums: dict[str, list[float]] = {}
        self.categories: dict[str, dict[str, int]] = {}  # channel -> label -> readings

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
        elif channel.kind == "categorical":
            oracle = channel.mechanism
            counts = self.categories.setdefault(
                channel.name, dict.fromkeys(map(oracle.label, range(oracle.categories)), 0))
            for number, count in enumerate(np.bincount(values, minlength=oracle.categories)):
                counts[oracle.label(number)] += int(count)

    def document(self) -> dict[str, dict]:
        out = {}
        for name, sums in self.sums.items():
            if len(sums) == 2:
                out[name] = {"n": sums[0], "mean": sums[1] / sums[0]}
            else:
                out[name] = {"n": sums[0], "mean_direction_rad": math.atan2(sums[1], sums[2]),
                             "resultant_length": math.hypot(sums[1], sums[2]) / sums[0]}
        for name, counts in self.categories.items():
            n = sum(counts.values())
            if n:
                out[name] = {"n": n, "shares": {label: count / n
                                                for label, count in counts.items()}}
        return out

    def write(self, path: Path) -> None:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.document()))
        temporary.replace(path)  # readers never see half a file


class TruthTap:
    """A virtual agent's channel that also tells ``TrueMeans`` what it selected.

    Everything else is the channel's own (attributes are looked up there)."""

    def __init__(self, channel: Channel, truth: TrueMeans):
        self._channel = channel
        self._truth = truth

    def __getattr__(self, name: str):
        return getattr(self._channel, name)

    def select(self, readings: Readings, now: float = 0.0, rng: Any = None) -> Selection:
        selection = self._channel.select(readings, now, rng)
        if len(selection):
            self._truth.add(self._channel, selection)
        return selection


def fleet_service(config: AgentConfig, *, count: int, truth_path: Path | None = None,
                  rng: Any = None, **options: Any) -> AgentService:
    """``count`` virtual agents, one connection, one state file, one transaction per batch.

    ``options`` go to ``AgentService`` (transport, clock, drain_timeout, keep_running ...);
    ``truth_path``: keep the true means of the reported readings there (simulation only)."""
    check_fleet(config, count)
    agent_ids = virtual_agent_ids(config.agent_id, count)
    store = options.pop("store", None) or open_state(config)
    # A stop publishes every virtual agent's offline status: a second more per thousand
    # (what one connection gets acknowledged), beyond a device's bound.
    options.setdefault("drain_timeout", STOP_SECONDS + count / 1000)
    truth = TrueMeans() if truth_path is not None else None
    # One template per channel config: its mechanism is built (and later JIT-compiled)
    # once and shared by every virtual agent's clone.
    templates = build_channels(config, agent_ids[0])
    cores = []
    for i, agent_id in enumerate(agent_ids):
        channels = [t.for_agent(agent_id, config.fleet) for t in templates]
        if truth is not None:
            channels = [TruthTap(channel, truth) for channel in channels]
        cores.append(AgentCore(config, store, rng=rng, agent_id=agent_id, channels=channels,
                               sources=fleet_sources(config, agent_id, i, count),
                               log_prefix=f"agent {agent_id}: ", log_shared=i == 0))
    if "transport" not in options:
        will = protocol.status(agent=config.agent_id, state="offline", simulator={
            "agents": count, "first": agent_ids[0], "last": agent_ids[-1]})
        options["transport"] = PahoTransport(
            config.broker, client_id=f"{config.agent_id}-fleet",
            will=(protocol.status_topic(config.fleet, config.agent_id), will))
    return AgentService(
        config, store=store, cores=cores, rng=rng,
        outbox_window=max(config.broker.max_inflight, FLEET_OUTBOX_WINDOW),
        after_batch=None if truth is None else lambda: truth.write(truth_path), **options)
