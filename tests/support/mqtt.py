"""A paho client for tests: it records what a test asserts on.

``MqttClient`` keeps the CONNACK, every SUBACK, the reason code of every PUBACK
and every message received, so a test can wait for any of them; it speaks MQTT 5
or 3.1.1, plain or TLS with an account (the production broker of tests/deploy),
with a clean or a persistent session.  ``Subscriber`` is one already subscribed
to a topic filter, as the end-to-end tests use it; ``session_present`` asks the
broker whether it still keeps a session.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.ports import wait_until


class MqttClient:
    """One paho connection to ``broker`` (anything with ``host`` and ``port``).

    ``username``: log in with that account, its password from ``password`` or else
    ``broker.password(username)``.  ``tls``: trust ``ca`` (default
    ``broker.certs["ca"]``); by default on when the broker has certificates.
    ``persistent``: a session that outlives the connection (MQTT 5: ``session_expiry``
    seconds).  ``on_message(message)`` is called for every message, after it is
    recorded (on paho's network thread).  Messages and acknowledgements are kept in
    order; reconnects are quick and resubscribe, so a broker restart costs a test
    well under a second."""

    def __init__(self, broker, username: str | None = None, *, password: str | None = None,
                 client_id: str = "", v5: bool = True, tls: bool | None = None,
                 ca: Path | None = None, persistent: bool = False, session_expiry: int = 3600,
                 manual_ack: bool = False, on_message: Callable | None = None):
        self.broker = broker
        self.v5 = v5
        self.persistent = persistent
        self.session_expiry = session_expiry
        self.on_message = on_message
        self.connack = None
        self.session_present = None
        self.connected_event = threading.Event()
        self.messages: list[tuple[str, bytes, bool]] = []
        self.subacks: list = []
        self.pubacks: dict[int, int] = {}  # mid -> reason code value
        self._subscriptions: list[tuple[str, int]] = []
        self._unflushed: list[mqtt.MQTTMessageInfo] = []
        self._lock = threading.Lock()
        kwargs = {} if v5 else {"clean_session": not persistent}
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                  manual_ack=manual_ack, **kwargs)
        if username is not None:
            self.client.username_pw_set(
                username, password if password is not None else broker.password(username))
        if tls if tls is not None else hasattr(broker, "certs"):
            self.client.tls_set(ca_certs=str(ca or broker.certs["ca"]),
                                cert_reqs=ssl.CERT_REQUIRED)
        self.client.reconnect_delay_set(0.1, 1)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda c, u, mid, codes, p: self.subacks.append(codes)
        self.client.on_publish = self._on_publish

    # -- paho's callbacks ------------------------------------------------------------

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if self.connack is None:
            self.connack = reason_code
            self.session_present = flags.session_present
        elif not reason_code.is_failure and self._subscriptions:
            client.subscribe(list(self._subscriptions))  # a reconnect: subscribe again
        self.connected_event.set()

    def _on_message(self, client, userdata, message):
        with self._lock:
            self.messages.append((message.topic, message.payload, bool(message.retain)))
        if self.on_message is not None:
            self.on_message(message)

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        with self._lock:
            self.pubacks[mid] = reason_code.value

    # -- what a test does ----------------------------------------------------------------

    def connect(self, timeout: float = 10, *, receive_maximum: int | None = None) -> MqttClient:
        """Connect and wait for the CONNACK (accepted or not: see ``connack``);
        ``receive_maximum`` is announced in CONNECT (MQTT 5), as the collector does."""
        properties = None
        if self.v5 and (self.persistent or receive_maximum):
            properties = Properties(PacketTypes.CONNECT)
            if self.persistent:
                properties.SessionExpiryInterval = self.session_expiry
            if receive_maximum:
                properties.ReceiveMaximum = receive_maximum
        extra = {"clean_start": not self.persistent, "properties": properties} \
            if properties is not None else {}
        self.client.connect(self.broker.host, self.broker.port, keepalive=30, **extra)
        self.client.loop_start()
        assert self.connected_event.wait(timeout), "no CONNACK"
        return self

    def subscribe(self, *topics: str, qos: int = 1) -> None:
        """Subscribe and wait for the SUBACK (its codes: ``subacks[-1]``)."""
        before = len(self.subacks)
        self._subscriptions += [(topic, qos) for topic in topics]
        self.client.subscribe([(topic, qos) for topic in topics])
        assert wait_until(lambda: len(self.subacks) > before, 5), "no SUBACK"

    def publish(self, topic: str, payload: bytes | str, *, retain: bool = False) -> int:
        """Publish at QoS 1 without waiting; the message id, for ``acked``."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS
        with self._lock:
            self._unflushed.append(info)
        return info.mid

    def acked(self, mid: int, timeout: float = 5) -> int:
        """Wait for the PUBACK of ``mid``; its reason code (0: accepted)."""
        assert wait_until(lambda: mid in self.pubacks, timeout), f"no PUBACK for {mid}"
        return self.pubacks[mid]

    def flush(self, timeout: float = 30) -> None:
        """Wait until the broker has acknowledged everything published so far."""
        with self._lock:
            pending, self._unflushed = self._unflushed, []
        assert wait_until(lambda: all(info.is_published() for info in pending), timeout), \
            f"{sum(not info.is_published() for info in pending)} messages not acknowledged"

    def topics(self) -> list[str]:
        with self._lock:
            return [topic for topic, _, _ in self.messages]

    def reports(self, channel: str | None = None) -> list[dict]:
        """The agents' reports received (status messages left out), parsed."""
        with self._lock:
            items = list(self.messages)
        out = []
        for topic, payload, _ in items:
            if topic.endswith("/status"):
                continue
            message = json.loads(payload)
            if channel is None or message["channel"] == channel:
                out.append(message)
        return out

    def statuses(self) -> list[dict]:
        """The agents' status messages received, parsed."""
        with self._lock:
            return [json.loads(p) for t, p, _ in self.messages if t.endswith("/status")]

    def wait_for(self, predicate, timeout: float) -> bool:
        return wait_until(predicate, timeout, interval=0.05)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Subscriber(MqttClient):
    """An MQTT 3.1.1 client subscribed to ``topic`` at QoS 1, as a dashboard or a
    collector would be; with a ``client_id`` its session is persistent, so the
    broker queues for it while it is away."""

    def __init__(self, broker, topic: str, *, client_id: str | None = None, **options):
        options.setdefault("v5", False)
        super().__init__(broker, client_id=client_id or "", persistent=client_id is not None,
                         **options)
        self.topic = topic
        self.connect()
        self.subscribe(topic)


def session_present(broker, client_id: str) -> bool:
    """Whether the broker still keeps a session for ``client_id`` (the CONNACK flag).

    Connecting takes the session over (and would take its queued messages): only
    ask about a session whose owner is stopped.  The session is kept for a minute
    more for its owner."""
    client = MqttClient(broker, client_id=client_id, persistent=True, session_expiry=60)
    try:
        return client.connect().session_present
    finally:
        client.close()
