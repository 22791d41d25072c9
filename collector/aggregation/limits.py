"""The limits an ingestor applies, from ``[limits]`` and the device registry file.

With ``[registry] agents = "registered"`` only the agent ids listed in the
registry file (``config.load_registry``) may report or publish a status.  The
service re-reads the file on SIGHUP; a file that cannot be read then keeps the
registry in force and says why.
"""

from __future__ import annotations

from collector.aggregation.ingest import IngestLimits
from collector.config import CollectorConfig, load_registry

__all__ = ["ingest_limits", "load_registry"]


def ingest_limits(config: CollectorConfig) -> IngestLimits:
    """``[limits]`` and ``[registry]`` as the ingestor applies them (reads the registry)."""
    limits, registry = config.limits, config.registry
    max_age = limits.max_age_seconds
    if max_age is None:
        max_age = config.broker.session_expiry_seconds + limits.future_seconds
    return IngestLimits(
        agents=limits.agents, channels=limits.channels,
        series_per_channel=limits.series_per_channel, statuses=limits.statuses,
        categories=limits.categories,
        future_seconds=limits.future_seconds, max_age_seconds=max_age,
        registry=load_registry(registry.file) if registry.agents == "registered" else None)
