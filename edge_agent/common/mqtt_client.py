"""The one MQTT client constructor of agent and collector.

``MqttClient`` is a paho-mqtt 2.x client (so ``publish``, ``ack``,
``message_callback_add`` ... work as documented by paho) built with this
product's connection policy in one place:

* TLS with the configured CA, client certificate and key, verification on;
* username and password;
* the protocol version, a clean or a persistent session (MQTT 5: clean start
  off plus a session expiry; 3.1.1: ``clean_session`` off), receive maximum;
* the last will and the in-flight window;
* reconnecting with back-off (1 to 30 s), and re-subscribing on every
  connection (a clean session forgets subscriptions);
* one way of logging a refused or failed connection: a warning when the
  reason changes, the retries at debug level, on the owner's logger.

Callers set ``on_message``, ``on_disconnect``, ``on_publish`` and
``on_subscribe`` as on any paho client, and pass ``on_connected`` instead of
``on_connect``, which the policy keeps for itself.

This module imports only the standard library and paho: the collector's
network process uses it and stays small.
"""

from __future__ import annotations

import logging
import ssl
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

RECONNECT_MIN_SECONDS = 1
RECONNECT_MAX_SECONDS = 30


@dataclass(frozen=True)
class TlsFiles:
    ca: str | None = None  # CA bundle; None: the system's
    cert: str | None = None  # client certificate (mutual TLS)
    key: str | None = None
    insecure: bool = False  # skip the host name check (testing only)


@dataclass(frozen=True)
class Endpoint:
    """Where a broker is and how to log in; a plain value (it crosses to the network
    process)."""

    host: str
    port: int
    keepalive: int = 30
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TlsFiles | None = None
    version: str = "3.1.1"  # or "5"

    @property
    def v5(self) -> bool:
        return self.version == "5"


@dataclass(frozen=True)
class Session:
    """A persistent session: the broker keeps subscriptions and queues messages while the
    client is away (MQTT 5: for ``expiry_seconds``; 3.1.1: as the broker is set up)."""

    expiry_seconds: int
    receive_maximum: int | None = None  # MQTT 5: unacknowledged messages the broker may send
    # MQTT 5: the broker drops (and never sends) messages larger than this for us.
    maximum_packet_size: int | None = None


class MqttClient(mqtt.Client):
    def __init__(self, endpoint: Endpoint, client_id: str, *, log: logging.Logger,
                 label: str = "", session: Session | None = None, manual_ack: bool = False,
                 will: tuple[str, bytes] | None = None, max_inflight: int | None = None,
                 subscriptions: list[str] | tuple[str, ...] = (),
                 on_connected: Callable[[MqttClient, object], None] | None = None):
        """``label`` names the client in log lines ("snapshot publisher cannot connect
        ..."); ``subscriptions`` are (re)subscribed at QoS 1 on every connection, before
        ``on_connected(client, flags)`` runs."""
        super().__init__(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=mqtt.MQTTv5 if endpoint.v5 else mqtt.MQTTv311,
                         clean_session=None if endpoint.v5 else session is None,
                         manual_ack=manual_ack)
        self.endpoint, self.session = endpoint, session
        self.log, self.label = log, f"{label} " if label else ""
        self.subscriptions = list(subscriptions)
        self.on_connected = on_connected
        self._last_problem: str | None = None
        self._connected = threading.Event()
        if endpoint.username is not None:
            self.username_pw_set(endpoint.username, endpoint.password)
        if endpoint.tls is not None:
            tls = endpoint.tls
            self.tls_set(ca_certs=tls.ca, certfile=tls.cert, keyfile=tls.key,
                         cert_reqs=ssl.CERT_REQUIRED)
            self.tls_insecure_set(tls.insecure)
        if will is not None:
            self.will_set(will[0], will[1], qos=1, retain=True)
        if max_inflight is not None:
            self.max_inflight_messages_set(max_inflight)
        self.reconnect_delay_set(min_delay=RECONNECT_MIN_SECONDS, max_delay=RECONNECT_MAX_SECONDS)
        self.on_connect = self._handle_connect  # the policy's; callers use on_connected
        self.on_connect_fail = self._handle_connect_fail

    @property
    def where(self) -> str:
        return f"{self.endpoint.host}:{self.endpoint.port}"

    # -- paho's network thread --
    def _handle_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self._problem(f"broker {self.where} refused the connection: {reason_code}")
            return
        self._last_problem = None
        self._connected.set()
        if self.subscriptions:
            self.subscribe(self._with_options(self.subscriptions))
        if self.on_connected is not None:
            self.on_connected(self, flags)

    def _handle_connect_fail(self, client, userdata) -> None:
        # paho retries a failed TCP/TLS connect silently; it calls this from inside its
        # ``except OSError``, so the reason (refused, certificate verify failed, host
        # name mismatch ...) is the exception being handled.
        self._problem(f"cannot connect to broker {self.where}: "
                      f"{sys.exc_info()[1] or 'unknown error'}")

    def _problem(self, text: str) -> None:
        level = logging.DEBUG if text == self._last_problem else logging.WARNING
        self._last_problem = text
        self.log.log(level, "%s%s", self.label, text)

    # -- lifecycle --
    def follow(self, topics: list[str]) -> None:
        """Subscribe to ``topics`` now (if connected) and on every later connection."""
        self.subscriptions = list(topics)
        if self.is_connected() and topics:
            self.subscribe(self._with_options(topics))

    def _with_options(self, topics: list[str]) -> list[tuple[str, object]]:
        """QoS 1.  In a persistent MQTT 5 session, retained messages only when the
        subscription is new: a reconnect that finds the session re-subscribes, and
        must not be sent every retained message again (what changed meanwhile was
        queued in the session)."""
        if not (self.endpoint.v5 and self.session is not None):
            return [(topic, 1) for topic in topics]
        options = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
        return [(topic, options) for topic in topics]

    def start(self) -> MqttClient:
        """Connect in the background (retrying with back-off) and run paho's loop."""
        endpoint, properties, clean_start = self.endpoint, None, mqtt.MQTT_CLEAN_START_FIRST_ONLY
        if endpoint.v5 and self.session is not None:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = self.session.expiry_seconds
            if self.session.receive_maximum is not None:
                properties.ReceiveMaximum = self.session.receive_maximum
            if self.session.maximum_packet_size is not None:
                properties.MaximumPacketSize = self.session.maximum_packet_size
            clean_start = False
        if endpoint.v5:
            self.connect_async(endpoint.host, endpoint.port, endpoint.keepalive,
                               clean_start=clean_start, properties=properties)
        else:
            self.connect_async(endpoint.host, endpoint.port, endpoint.keepalive)
        self.loop_start()
        return self

    def start_and_wait(self, timeout: float = 15.0) -> MqttClient:
        """``start``, then wait for the broker to accept us, or raise ``ConnectionError``."""
        self.start()
        if not self._connected.wait(timeout):
            problem = self._last_problem or "no answer"
            self.stop()
            raise ConnectionError(f"broker {self.where} refused or did not answer: {problem}")
        return self

    def stop(self) -> None:
        """Disconnect and stop the loop."""
        self.disconnect()
        self.loop_stop()
