"""The network process's settings from a collector's configuration (kept out of
``collector.broker.network``, which the child imports: it stays without pydantic and
msgspec)."""

from __future__ import annotations

import logging

from collector.broker.network import JournalSpec, NetworkSettings, SqliteJournal
from collector.config import CollectorConfig
from edge_agent import protocol

PACKET_OVERHEAD_BYTES = 64 << 10  # an MQTT packet's header, topic and properties, at most


def network_settings(config: CollectorConfig, journal: JournalSpec | None = None) \
        -> NetworkSettings:
    """What the network child subscribes to: every report and status; with ``[broker]
    shared_group`` (several scale-out ingresses, docs/guides/SCALE_OUT.md) the group's share of
    them, and every status directly, since retained messages skip shared subscriptions.
    ``journal``: where it journals (default: ``[storage] path``)."""
    broker, fleet, group = config.broker, config.fleet, config.broker.shared_group
    if group is None:
        subscriptions = [protocol.data_subscription(fleet)]
    else:
        subscriptions = [protocol.shared_subscription(group, protocol.data_subscription(fleet)),
                         protocol.status_subscription(fleet)]
    return NetworkSettings(
        journal=journal or SqliteJournal(str(config.storage.path)),
        endpoint=broker.endpoint(), client_id=broker.client_id,
        session_expiry=broker.session_expiry_seconds,
        ack_interval=config.storage.ack_interval_seconds, subscriptions=subscriptions,
        log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        max_packet_bytes=protocol.MAX_REPORT_BYTES + PACKET_OVERHEAD_BYTES,
        unjournaled_prefix=protocol.collector_topics(fleet))
