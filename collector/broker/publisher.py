"""The collector's own clean-session MQTT client: retained snapshots out, what it follows in.

A collector (and the merge view) publishes every channel's aggregates, retained,
on ``ldp/v1/<fleet>/_aggregates/<channel>`` (typed: ``protocol.ChannelSnapshot``),
and follows the retained range results.  This client is separate from the network
process's persistent session, which carries only the report stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec

from collector.config import CollectorConfig
from collector.estimation.jsonsafe import json_safe
from edge_agent import protocol
from edge_agent.common.mqtt_client import MqttClient

log = logging.getLogger(__name__)

Handler = Callable[[object, object, object], None]  # paho's (client, userdata, message)


class CollectorClient:
    """``follow``: topic filter -> handler of the messages on it (set before ``start``)."""

    def __init__(self, config: CollectorConfig, *, role: str, label: str,
                 follow: dict[str, Handler]):
        broker = config.broker
        self.fleet = config.fleet
        self.label = label
        self.since: float | None = None  # when it last connected or lost the connection
        self.mqtt = MqttClient(broker.endpoint(), f"{broker.client_id}-{role}", log=log,
                               label=label, subscriptions=list(follow),
                               on_connected=lambda client, flags: self._changed())
        self.mqtt.on_disconnect = self._on_disconnect
        for topic, handler in follow.items():
            self.mqtt.message_callback_add(topic, handler)
        self._stopping = False

    def _changed(self) -> None:
        self.since = time.time()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self._changed()
        if not self._stopping:
            log.warning("%s disconnected from the broker: %s", self.label, reason_code)

    @property
    def connected(self) -> bool:
        return self.mqtt.is_connected()

    def status(self) -> dict:
        """``broker`` of ``/api/channels``: connected, and since when."""
        return {"connected": self.connected, "since": self.since}

    def start(self) -> None:
        self.mqtt.start()

    def stop(self) -> None:
        self._stopping = True
        self.mqtt.stop()

    def publish(self, topic: str, payload: bytes, *, retain: bool = True):
        return self.mqtt.publish(topic, payload, qos=1, retain=retain)

    def publish_snapshots(self, document: dict) -> None:
        """Every channel's aggregates of an /api/channels ``document``, retained.  A
        channel whose entry its typed snapshot refuses is logged and left out, never the
        channels after it."""
        for name, channel in document["channels"].items():
            try:
                payload = protocol.snapshot(json_safe(channel), channel=name, t=document["t"])
            except msgspec.ValidationError as exc:
                log.error("channel %s: no snapshot published: %s", name, exc)
                continue
            self.publish(protocol.aggregates_topic(self.fleet, name), payload)
