"""The limits an ingestor applies, from the configuration and the device registry file.

With ``[registry] agents = "registered"`` only the agent ids listed in the
registry file may report or publish a status: one id per line, blank lines
and ``#`` comments ignored.  The service re-reads the file on SIGHUP; a file
that cannot be read then keeps the registry in force and says why.
"""

from __future__ import annotations

from pathlib import Path

from edge_agent.config import ConfigError
from edge_agent.protocol import is_name

from .config import CollectorConfig
from .ingest import IngestLimits

MAX_REGISTRY_BYTES = 64 << 20


def load_registry(path: str | Path) -> frozenset[str]:
    """The agent ids of a registry file, or ``ConfigError`` naming the file and line."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_REGISTRY_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_REGISTRY_BYTES >> 20} MB")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
    agents = set()
    for number, line in enumerate(text.splitlines(), 1):
        agent = line.split("#", 1)[0].strip()
        if not agent:
            continue
        if not is_name(agent):
            raise ConfigError(f"{path}, line {number}: {agent[:80]!r} is not an agent id "
                              f"(letters, digits, . _ -, at most 64, not starting with . _ -)")
        agents.add(agent)
    return frozenset(agents)


def ingest_limits(config: CollectorConfig) -> IngestLimits:
    """``[limits]`` and ``[registry]`` as the ingestor applies them (reads the registry)."""
    limits, registry = config.limits, config.registry
    max_age = limits.max_age_seconds
    if max_age is None:
        max_age = config.broker.session_expiry_seconds + limits.future_seconds
    return IngestLimits(
        agents=limits.agents, channels=limits.channels,
        series_per_channel=limits.series_per_channel, statuses=limits.statuses,
        future_seconds=limits.future_seconds, max_age_seconds=max_age,
        registry=load_registry(registry.file) if registry.agents == "registered" else None)
