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

Holding acknowledgements also bounds memory: messages are committed (and their
memory freed) as soon as ``MAX_BUFFERED_BYTES`` of them wait, and the broker
sends at most ``receive_maximum`` unacknowledged ones.

The parent tells the child to stop through a pipe, never a shared lock or
event: a child killed while holding a ``multiprocessing.Event``'s lock left
the parent's ``set()`` blocked for ever.  The pipe also ends the child when
the parent dies (end of file), as does ``PR_SET_PDEATHSIG``.

This module imports only the standard library and paho (no numpy or numba),
so the process starts fast and stays small.  The journal is named by a small
value that opens it in the child (``SqliteJournal``; an ingress's
``collector.scaleout.journal.JetStreamJournalSpec``): the child imports only the
journal it writes.  ``collector.broker.settings`` builds the settings from the
configuration.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

from collector.broker.lifetime import die_with_parent
from collector.storage.store import CollectorStore
from edge_agent.common.mqtt_client import Endpoint, MqttClient, Session

log = logging.getLogger("collector.broker.network")

RECEIVE_MAXIMUM = 4096
MAX_BACKLOG = 50_000
MAX_BUFFERED_BYTES = 16 << 20  # journal at once past this much, not at the next interval


class Journal(Protocol):
    """What the network process writes to (``CollectorStore``'s part of it)."""

    def append(self, topic: str, payload: bytes, received: float) -> None: ...
    def commit(self) -> None: ...
    def backlog(self) -> int: ...
    def set_network(self, connected: bool) -> None: ...
    def close(self) -> None: ...


class JournalSpec(Protocol):
    """A journal named by a plain value: it crosses to the child, which opens it."""

    def open(self) -> Journal: ...


@dataclass(frozen=True)
class SqliteJournal:
    """The single collector's journal: its SQLite file."""

    path: str

    def open(self) -> CollectorStore:
        return CollectorStore(self.path)


@dataclass(frozen=True)
class NetworkSettings:
    """What the network process needs (a plain value: it crosses to the child)."""

    journal: JournalSpec
    endpoint: Endpoint
    client_id: str
    session_expiry: int
    ack_interval: float
    subscriptions: list[str]
    log_level: str = "INFO"
    max_backlog: int = MAX_BACKLOG
    # MQTT 5: the broker drops anything larger for us (bounds a message's memory).
    max_packet_bytes: int | None = None
    # Topics acknowledged without being journaled: the collectors' own (retained
    # snapshots and confirmations), which the subscription matches and nothing counts.
    unjournaled_prefix: str | None = None


def run(settings: NetworkSettings, control: Connection) -> None:
    """Entry point of the child process (``multiprocessing`` spawn).  Anything arriving
    on ``control``, or its end of file (the parent died), stops it."""
    die_with_parent()  # no orphan may keep our MQTT session (also: the pipe's end of file)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = settings.journal.open()
    store.set_network(False)
    lock = threading.Lock()
    # (mid, qos) of messages received, not yet journaled; journaled, not yet acknowledged
    received: list[tuple[int, int]] = []
    journaled: list[tuple[int, int]] = []
    flush = threading.Event()  # set by paho's thread: enough is buffered to commit now
    stopping = threading.Event()

    def on_connected(client, flags):
        log.info("connected to %s (session present: %s)", client.where, flags.session_present)

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
        if not stopping.is_set():
            log.warning("disconnected from the broker: %s", reason_code)

    buffered = [0]  # payload bytes received since the last commit

    skip = settings.unjournaled_prefix

    def on_message(client, userdata, message):
        with lock:
            # Acknowledged in order with the others, once those are journaled.
            received.append((message.mid, message.qos))
            if skip is not None and message.topic.startswith(skip):
                return
            store.append(message.topic, message.payload, time.time())
            buffered[0] += len(message.payload)
            if buffered[0] >= MAX_BUFFERED_BYTES:
                flush.set()

    # MQTT 3.1.1 (e.g. the demo's embedded amqtt broker): a persistent session is
    # clean_session=False; its expiry is the broker's setting, not ours.
    client = MqttClient(settings.endpoint, settings.client_id, log=log, manual_ack=True,
                        session=Session(settings.session_expiry, RECEIVE_MAXIMUM,
                                        settings.max_packet_bytes),
                        subscriptions=settings.subscriptions, on_connected=on_connected)
    client.on_disconnect = on_disconnect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.start()

    failures = [0]  # commits failed in a row (logged once, and when they work again)

    def journal() -> None:
        """Commit what arrived.  If that fails nothing becomes acknowledgeable: the
        messages stay buffered for the next attempt (collector.storage.store)."""
        with lock:
            try:
                store.commit()
            except Exception as exc:
                failures[0] += 1
                log.log(logging.ERROR if failures[0] == 1 else logging.DEBUG,
                        "journal commit failed (%s: %s); %d message(s) stay unacknowledged "
                        "and are retried", type(exc).__name__, exc, len(received))
                return
            if failures[0]:
                log.info("journal commits work again, after %d failed attempt(s)",
                         failures[0])
                failures[0] = 0
            journaled.extend(received)
            received.clear()
            buffered[0] = 0
            flush.clear()

    def acknowledge() -> int:
        """Acknowledge every journaled message (and only those)."""
        with lock:
            batch = list(journaled)
            journaled.clear()
        for mid, qos in batch:
            if qos > 0:
                client.ack(mid, qos)
        return len(batch)

    try:
        while True:
            if control.poll(0 if flush.is_set() else settings.ack_interval):
                stopping.set()
            journal()
            # Behind by more than max_backlog: hold the acks (the broker pauses at
            # RECEIVE_MAXIMUM), while journaling keeps our memory bounded.
            if stopping.is_set() or store.backlog() <= settings.max_backlog:
                acknowledge()
            if stopping.is_set():
                break
    finally:
        time.sleep(0.1)  # let paho send the last acks
        journal()  # what arrived meanwhile
        if acknowledge():
            time.sleep(0.1)
        client.stop()
        store.close()


class NetworkProcess:
    """The network child as the main process sees it: start, restart if it died, stop.

    Spawned, not forked: the child imports no numpy or numba, and starts fast.
    Start it from a thread that lives as long as it should (``PR_SET_PDEATHSIG``
    fires when the starting thread ends)."""

    def __init__(self, settings: NetworkSettings):
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")
        self._process = None
        self._control: Connection | None = None
        self._stopping = False

    def start(self) -> None:
        reader, self._control = self._context.Pipe(duplex=False)
        self._process = self._context.Process(
            target=run, name="collector-network", daemon=True, args=(self.settings, reader))
        self._process.start()
        reader.close()  # the child's end: its end of file must follow our death

    def supervise(self) -> None:
        """Restart the child if it died without being asked to stop."""
        if self._process is not None and not self._process.is_alive() and not self._stopping:
            log.error("the network process exited (code %s); restarting it",
                      self._process.exitcode)
            self._control.close()
            self.start()

    def stop(self, timeout: float = 15.0) -> None:
        """The child commits, acknowledges and leaves (killed after ``timeout``).  Never
        blocks on a dead child: the pipe write fails at once."""
        self._stopping = True
        if self._process is None:
            return
        try:
            self._control.send_bytes(b"stop")
        except OSError:  # the child is gone already
            pass
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._control.close()
