"""The ingress's journal: the JetStream stream instead of the SQLite file.

The collector's network process (``collector.broker.network``) appends every message it
receives to a journal, commits, and only then acknowledges the messages to the
MQTT broker.  ``JetStreamJournal`` has the interface of ``CollectorStore`` that
the network process uses, so an ingress is that same process: ``append`` buffers
a message, ``commit`` publishes the buffer to the stream and returns once
JetStream has acknowledged every message (stored on a quorum of its replicas),
or raises, keeping those not stored for the next commit.  A message stored twice
(an ingress that died before its MQTT acknowledgements, an agent resending) has
the same ``Nats-Msg-Id`` and the stream drops it within its duplicate window;
later copies are dropped by the members' sequence trackers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from collector.config import ScaleOutConfig
from collector.scaleout.engine import Engine, open_engine
from collector.scaleout.partitions import agent_of, message_id, partition_of, subject

log = logging.getLogger(__name__)

COMMIT_TIMEOUT = 30.0  # a commit that takes longer fails (the messages stay unacknowledged)
# No acknowledgement at all for this long: the rest of the batch is sent again.  A
# publish that reached a stream leader as it died is never answered; the stream's
# duplicate window drops the copies of those that were stored after all.
STALL_SECONDS = 2.0
MAX_BACKOFF = 2.0  # seconds between attempts while the stream does not store

TOPIC_HEADER = "Ldp-Topic"  # the MQTT topic (the member ingests it as a collector would)
RECEIVED_HEADER = "Ldp-Received"  # when the ingress received it (seconds since the epoch)


@dataclass(frozen=True)
class JetStreamJournalSpec:
    """An ingress's journal as the network process's settings name it (it crosses to
    the child, which opens it: ``collector.broker.network.JournalSpec``)."""

    config: ScaleOutConfig
    fleet: str
    name: str  # the NATS connection's name

    def open(self) -> JetStreamJournal:
        return JetStreamJournal(self.config, self.fleet, self.name)


class JetStreamJournal:
    def __init__(self, config: ScaleOutConfig, fleet: str, name: str):
        self.config, self.fleet = config, fleet
        self._buffer: list[tuple[str, bytes, dict]] = []
        self._backoff, self._retry_at, self._error = 0.0, 0.0, ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="jetstream",
                                        daemon=True)
        self._thread.start()
        self.engine: Engine = self._run(open_engine(config, name), timeout=None)

    def _run(self, coroutine, timeout: float | None = COMMIT_TIMEOUT):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    # -- the CollectorStore interface the network process uses --
    def append(self, topic: str, payload: bytes, received: float) -> None:
        agent = agent_of(topic, self.fleet)
        if agent is None:
            return  # not a fleet message: nothing would count it (acknowledged all the same)
        headers = {TOPIC_HEADER: topic, RECEIVED_HEADER: repr(received)}
        identity = message_id(topic, payload, self.fleet)
        if identity is not None:
            headers["Nats-Msg-Id"] = identity
        self._buffer.append((subject(self.config.stream,
                                     partition_of(agent, self.config.partitions)),
                             payload, headers))

    def commit(self) -> None:
        if not self._buffer:
            return
        if time.monotonic() < self._retry_at:  # the cluster is failing over: wait a little
            raise RuntimeError(f"JetStream unavailable, next attempt in "
                               f"{self._retry_at - time.monotonic():.1f} s")
        batch, self._buffer = self._buffer, []
        try:
            failed = self._run(self._publish(batch))
        except Exception:
            failed = batch
        if failed:
            self._buffer = failed + self._buffer
            self._backoff = min(MAX_BACKOFF, 2 * self._backoff) if self._backoff else 0.2
            self._retry_at = time.monotonic() + self._backoff
            raise RuntimeError(f"JetStream did not store {len(failed)} of {len(batch)} "
                               f"message(s) ({self._error})")
        self._backoff = 0.0

    async def _publish(self, batch: list[tuple[str, bytes, dict]]) -> list:
        """The messages of ``batch`` JetStream did not acknowledge in time.  Published
        with ``publish_async``: one reply subscription for all of them (a request per
        message, ``publish``, cost the ingress 143 µs of CPU per report)."""
        js, timeout = self.engine.js, COMMIT_TIMEOUT / 2
        futures: list[asyncio.Future | BaseException] = []
        for subject_, payload, headers in batch:
            try:
                futures.append(await js.publish_async(
                    subject_, payload, headers=dict(headers), stream=self.config.stream,
                    wait_stall=timeout))
            except Exception as exc:  # stalled, or the connection is down
                futures.append(exc)
        pending = {future for future in futures if isinstance(future, asyncio.Future)}
        deadline = asyncio.get_running_loop().time() + timeout
        while pending:  # as long as acknowledgements keep coming (a loaded cluster is slow)
            left = deadline - asyncio.get_running_loop().time()
            done, pending = await asyncio.wait(pending, timeout=min(STALL_SECONDS, left))
            if not done or left <= STALL_SECONDS:
                break
        failed = []
        for message, future in zip(batch, futures):
            if not isinstance(future, asyncio.Future):
                error: BaseException | None = future
            elif not future.done():
                future.cancel()  # no answer in time (no quorum, a failover)
                error = TimeoutError("no acknowledgement")
            elif future.cancelled():
                error = TimeoutError("cancelled")
            else:
                error = future.exception()
            if error is not None:
                failed.append(message)
                self._error = f"{type(error).__name__}: {error}"[:200]
        return failed

    def backlog(self) -> int:
        return 0  # the members read the stream at their own pace; it keeps max_age_seconds

    def set_network(self, connected: bool) -> None:
        if connected:
            log.info("MQTT subscription up: messages go to stream %s", self.config.stream)

    def close(self) -> None:
        try:
            self._run(self.engine.close(), timeout=10)
        except Exception as exc:
            log.warning("closing the NATS connection: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
