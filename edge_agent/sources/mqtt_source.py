"""Readings from a local MQTT broker: the gateway pattern.

Wearables publish raw readings to a broker on the gateway itself (raw data
never leaves the local network); this source subscribes to ``topic`` and the
agent perturbs what arrives before anything is sent upstream.  A payload is
a JSON object of fields or a JSON list of such objects (see
``jsonl.parse_record`` for how values and timestamps are read).  A payload
that is not valid JSON, or an item that is not an object, is dropped and
counted in ``rejected_rows``.

paho's network thread receives messages and appends parsed records to a
buffer; ``poll`` swaps the buffer out under a lock, so it never blocks on the
network.  The client (``edge_agent.common.mqtt_client``) reconnects by itself and
renews the subscription on every connection.  The source never finishes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque

from edge_agent.common.mqtt_client import MqttClient
from edge_agent.config import MqttSourceConfig
from edge_agent.readings import Readings
from edge_agent.sources.base import Source, keep_newest
from edge_agent.sources.derive import apply_derive
from edge_agent.sources.jsonl import Record, parse_record, records_to_readings

# Records kept while the agent does not poll; past this the oldest are dropped
# (and counted in ``dropped_rows``), bounding memory.
MAX_BUFFERED_ROWS = 200_000

log = logging.getLogger(__name__)


class MqttSource(Source):
    def __init__(self, config: MqttSourceConfig, *, agent_id: str = "edge-agent"):
        # Whatever the payloads carry: only the derived names are known up front.
        super().__init__(config.name, derive=config.derive)
        self.config = config
        self.topic = config.topic
        self.timestamp_field = config.timestamp_field
        # Distinct from the agent's own upstream client id, which may use the
        # same broker.
        self.client_id = f"{agent_id}-src-{config.name}"
        self.connected = False
        self.subscribed = False  # the broker acknowledged the subscription
        #: records dropped because the agent did not poll in time
        self.dropped_rows = 0
        self._buffer: deque[Record] = deque(maxlen=MAX_BUFFERED_ROWS)
        self._lock = threading.Lock()
        self._client: MqttClient | None = None

    def origin(self) -> dict[str, object]:
        return {"broker": f"{self.config.host}:{self.config.port}", "topic": repr(self.topic)}

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._client is not None:
            return
        # Connects asynchronously: the network thread keeps retrying if the broker is
        # not up yet, so a gateway can start before its broker.
        client = MqttClient(self.config.endpoint(), self.client_id, log=log,
                            label=f"mqtt source {self.name!r}",
                            on_connected=self._on_connected)
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        try:
            client.start()
        except (OSError, ValueError) as exc:
            self.fail(f"mqtt source {self.name!r}: cannot connect to "
                      f"{self.config.host}:{self.config.port}: {exc}")
            return
        self._client = client

    def stop(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        client.stop()
        self.connected = self.subscribed = False

    # -- paho callbacks (network thread) -------------------------------------------
    def _on_connected(self, client, flags) -> None:
        self.connected = True
        try:
            client.subscribe(self.topic, qos=1)
        except ValueError:  # raising here would end paho's network thread
            self.fail(f"mqtt source {self.name!r}: invalid topic filter {self.topic!r}")

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        if any(code.is_failure for code in reason_codes):
            # Persistent (an ACL or a malformed topic filter): say so rather
            # than wait forever for readings that cannot come.
            self.fail(f"mqtt source {self.name!r}: the broker refused the subscription "
                      f"to {self.topic!r}")
            return
        self.subscribed = True

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connected = self.subscribed = False

    def _on_message(self, client, userdata, message) -> None:
        arrival = time.time()
        records, rejected = parse_payload(message.payload, self.timestamp_field, arrival)
        with self._lock:
            self.rejected_rows += rejected
            self.dropped_rows += keep_newest(self._buffer, records)

    # -- polling -----------------------------------------------------------------------
    def poll(self, now: float) -> Readings:
        with self._lock:
            records, self._buffer = self._buffer, deque(maxlen=MAX_BUFFERED_ROWS)
        return apply_derive(records_to_readings(records), self.derive)


def parse_payload(payload: bytes, timestamp_field: str | None,
                  arrival: float) -> tuple[list[Record], int]:
    """(records, number rejected) from one message's payload."""
    try:
        decoded = json.loads(payload)
    except (ValueError, RecursionError):  # invalid JSON / UTF-8, absurd nesting
        return [], 1
    items = decoded if isinstance(decoded, list) else [decoded]
    records = [parse_record(item, timestamp_field, arrival) for item in items]
    good = [r for r in records if r is not None]
    return good, len(records) - len(good)
