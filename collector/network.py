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
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from edge_agent.mqtt_client import Endpoint, MqttClient, Session

from .store import CollectorStore

log = logging.getLogger("collector.network")

RECEIVE_MAXIMUM = 4096
MAX_BACKLOG = 50_000


@dataclass(frozen=True)
class NetworkSettings:
    """What the network process needs (a plain value: it crosses to the child)."""

    path: str  # the SQLite journal
    endpoint: Endpoint
    client_id: str
    session_expiry: int
    ack_interval: float
    subscriptions: list[str]
    # A retiring shard leaves its shared group, and ends its session when stopped.
    unsubscribe: list[str] = field(default_factory=list)
    end_session: bool = False
    log_level: str = "INFO"
    max_backlog: int = MAX_BACKLOG


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies, so no orphan keeps our MQTT session."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the parent-pid check in the loop still ends us
        pass


def run(settings: NetworkSettings, stop: threading.Event, parent_pid: int) -> None:
    """Entry point of the child process (``multiprocessing`` spawn)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = CollectorStore(settings.path)
    store.set_network(False)
    lock = threading.Lock()
    buffer: list[tuple[int, int]] = []  # (mid, qos) of journaled, unacknowledged messages

    def on_connected(client, flags):
        log.info("connected to %s (session present: %s)", client.where, flags.session_present)
        if settings.unsubscribe:  # a retiring shard leaves its shared group
            client.unsubscribe(settings.unsubscribe)

    def on_subscribe(client, userdata, mid, reason_codes, properties):
        if any(code.is_failure for code in reason_codes):
            log.error("the broker refused a subscription: %s", reason_codes)
            return
        with lock:
            store.set_network(True)

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

    # MQTT 3.1.1 (e.g. the demo's embedded amqtt broker): a persistent session is
    # clean_session=False; its expiry is the broker's setting, not ours.
    client = MqttClient(settings.endpoint, settings.client_id, log=log, manual_ack=True,
                        session=Session(settings.session_expiry, RECEIVE_MAXIMUM),
                        subscriptions=settings.subscriptions, on_connected=on_connected)
    client.on_disconnect = on_disconnect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.start()

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
            stopping = stop.wait(settings.ack_interval) or os.getppid() != parent_pid
            if store.backlog() > settings.max_backlog and not stopping:
                continue  # hold the acks: the broker will pause at RECEIVE_MAXIMUM
            commit_then_ack()
            if stopping:
                break
    finally:
        time.sleep(0.1)  # let paho send the last acks
        # What arrived meanwhile: a retired shard's session (and queue) ends now.
        if commit_then_ack():
            time.sleep(0.1)
        client.stop(end_session=settings.end_session)
        store.close()


class NetworkProcess:
    """The network child as the main process sees it: start, restart if it died, stop.

    Spawned, not forked: the child imports no numpy or numba, and starts fast."""

    def __init__(self, settings: NetworkSettings):
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")
        self._stop = self._context.Event()
        self._process = None

    def start(self) -> None:
        self._process = self._context.Process(
            target=run, name="collector-network", daemon=True,
            args=(self.settings, self._stop, os.getpid()))
        self._process.start()

    def supervise(self) -> None:
        """Restart the child if it died without being asked to stop."""
        if self._process is not None and not self._process.is_alive() \
                and not self._stop.is_set():
            log.error("the network process exited (code %s); restarting it",
                      self._process.exitcode)
            self.start()

    def stop(self, timeout: float = 15.0) -> None:
        """The child commits, acknowledges and leaves (killed after ``timeout``)."""
        self._stop.set()
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
