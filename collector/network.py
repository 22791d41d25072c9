"""The collector's network process: MQTT in, journal out, acknowledge once durable.

It does what a bare subscriber does plus one buffered SQLite write per
``ack_interval_seconds``: every message is appended to the journal, the
journal is committed, and only then are those messages acknowledged to the
broker.  Aggregation happens in the main process, which tails the journal
(see ``service.py``); splitting the two lets ingest use a second core, which
a single Python process cannot.

Backpressure: when the aggregator is more than ``max_backlog`` messages
behind, acknowledgements wait, and the broker stops sending once
``receive_maximum`` messages are unacknowledged.

This module imports only the standard library and paho (no numpy or numba),
so the process starts fast and stays small.  It exits when its parent dies.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("collector.network")

RECEIVE_MAXIMUM = 4096
MAX_BACKLOG = 50_000


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies, so no orphan keeps our MQTT session."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the parent-pid check in the loop still ends us
        pass


def run(settings: dict, stop: "threading.Event | object", parent_pid: int) -> None:
    """Entry point of the child process (``multiprocessing`` spawn)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    logging.basicConfig(level=settings.get("log_level", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from .store import CollectorStore

    store = CollectorStore(settings["path"])
    store.set_network(False)
    lock = threading.Lock()
    buffer: list[tuple[int, int]] = []  # (mid, qos) of journaled, unacknowledged messages

    def on_connect(client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            log.error("broker refused the connection: %s", reason_code)
            return
        last_error[0] = None
        log.info("connected to %s:%s (session present: %s)", settings["host"], settings["port"],
                 flags.session_present)
        if settings.get("unsubscribe"):  # a retiring shard leaves its shared group
            client.unsubscribe(settings["unsubscribe"])
        client.subscribe([(topic, 1) for topic in settings["subscriptions"]])

    def on_subscribe(client, userdata, mid, reason_codes, properties):
        if any(code.is_failure for code in reason_codes):
            log.error("the broker refused a subscription: %s", reason_codes)
            return
        with lock:
            store.set_network(True)

    last_error: list[str | None] = [None]

    def on_connect_fail(client, userdata):
        # paho retries a failed TCP/TLS connect silently; this runs inside its
        # ``except OSError``: log the reason (e.g. certificate verify failed)
        # when it changes, the retries at debug level.
        reason = str(sys.exc_info()[1] or "unknown error")
        log.log(logging.DEBUG if reason == last_error[0] else logging.WARNING,
                "cannot connect to broker %s:%s: %s", settings["host"], settings["port"], reason)
        last_error[0] = reason

    def on_disconnect(client, userdata, flags, reason_code, properties):
        # Unacknowledged messages come again; those already journaled are then
        # recognised as duplicates by their sequence numbers.
        with lock:
            store.set_network(False)
        if not stop.is_set():
            log.warning("disconnected from the broker: %s", reason_code)

    def on_message(client, userdata, message):
        with lock:
            store.append(message.topic, message.payload, time.time())
            buffer.append((message.mid, message.qos))

    v5 = settings.get("mqtt_version", "5") == "5"
    # MQTT 3.1.1 (e.g. the demo's embedded amqtt broker): a persistent session is
    # clean_session=False; its expiry is the broker's setting, not ours.
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=settings["client_id"],
                         protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                         clean_session=None if v5 else False, manual_ack=True)
    if settings.get("username") is not None:
        client.username_pw_set(settings["username"], settings.get("password"))
    tls = settings.get("tls")
    if tls is not None:
        import ssl

        client.tls_set(ca_certs=tls.get("ca"), certfile=tls.get("cert"), keyfile=tls.get("key"),
                       cert_reqs=ssl.CERT_REQUIRED)
        client.tls_insecure_set(bool(tls.get("insecure")))
    client.reconnect_delay_set(min_delay=1, max_delay=30)
    client.on_connect, client.on_disconnect = on_connect, on_disconnect
    client.on_connect_fail = on_connect_fail
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    if v5:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = settings["session_expiry"]
        properties.ReceiveMaximum = RECEIVE_MAXIMUM
        client.connect_async(settings["host"], settings["port"], settings["keepalive"],
                             clean_start=False, properties=properties)
    else:
        client.connect_async(settings["host"], settings["port"], settings["keepalive"])
    client.loop_start()
    interval = settings["ack_interval"]

    def commit_then_ack() -> int:
        with lock:
            store.commit()  # durable first ...
            batch, buffer[:] = list(buffer), []
        for mid, qos in batch:  # ... then acknowledged
            if qos > 0:
                client.ack(mid, qos)
        return len(batch)

    try:
        while True:
            stopping = stop.wait(interval) or os.getppid() != parent_pid
            if store.backlog() > settings.get("max_backlog", MAX_BACKLOG) and not stopping:
                continue  # hold the acks: the broker will pause at RECEIVE_MAXIMUM
            commit_then_ack()
            if stopping:
                break
    finally:
        time.sleep(0.1)  # let paho send the last acks
        # What arrived meanwhile: a retired shard's session (and queue) ends now.
        if commit_then_ack():
            time.sleep(0.1)
        if settings.get("end_session") and v5:  # a retired shard: the broker drops the session
            ended = Properties(PacketTypes.DISCONNECT)
            ended.SessionExpiryInterval = 0
            client.disconnect(properties=ended)
        else:
            client.disconnect()
        client.loop_stop()
        store.close()
