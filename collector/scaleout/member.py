"""An aggregation member: owns some partitions at a time, and counts their reports exactly.

Ownership is a lease per partition in the ``<stream>_leases`` KV bucket (key
``p.<n>``, value the member's name), created with ``create`` (fails if another
member holds it) and renewed with compare-and-set; the bucket's TTL
(``lease_seconds``) ends the lease of a member that stopped renewing.  Live members
announce themselves (``m.<name>``) in the same bucket, and each takes up to its fair
share, ``ceil(partitions / live members)``, giving back what is above it.

Owning a partition: read its state (``<stream>_state``, key ``p.<n>``: aggregates,
sequence trackers and the last stream sequence they include), write it back
at once as ours with compare-and-set (from then on an earlier owner's write
fails: it has been fenced off), then read the partition's subject from the
next stream sequence and ingest exactly as a single collector does.  Every
``checkpoint_seconds`` the state is written with compare-and-set on our last
revision; a failed write means another member owns the partition, and ours is
dropped.  State and position are always written together, so whoever continues
counts every stored message once: the trackers know what the state counted.

After each written state, the agents of that partition get their delivery
confirmations over MQTT (docs/HARDENING.md), as from a single collector.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
import zlib
from dataclasses import dataclass, field

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError

from edge_agent import protocol
from edge_agent.protocol.states import encode_partition_state

from ..checkpoint import tracker_states, with_trackers
from ..config import CollectorConfig
from ..ingest import Ingestor
from ..publisher import CollectorClient
from ..registry import ingest_limits
from .engine import Engine, open_engine
from .journal import RECEIVED_HEADER, TOPIC_HEADER
from .partition_state import PartitionStateRejected, decode_partition
from .partitions import subject

log = logging.getLogger(__name__)

IDLE_WRITES = 5  # a partition without news is written every this many checkpoint periods
FETCH_BATCH = 500  # messages applied at once (~40 ms of work: lease renewals stay on time)
FETCH_WAIT = 1.0


class LostPartition(Exception):
    """Another member owns the partition now (our lease or state write was refused)."""


@dataclass
class Partition:
    number: int
    ingestor: Ingestor
    sequence: int  # the last stream sequence applied
    lease_revision: int
    state_revision: int | None = None  # our last write of its state (the fence)
    written: int = -1  # the sequence of that write
    written_at: float = -math.inf  # when (monotonic)
    reader: asyncio.Task | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"p.{self.number}"


class Member:
    def __init__(self, config: CollectorConfig, *, clock=time.time):
        if config.scale_out is None:
            raise ValueError("scale_out: a member needs the [scale_out] table")
        self.config, self.scale, self.clock = config, config.scale_out, clock
        self.name = config.member_name
        self.limits = ingest_limits(config)
        self.partitions: dict[int, Partition] = {}
        self.engine: Engine | None = None
        self.client = CollectorClient(config, role="member", label="member", follow={})
        # Where this member starts looking for free partitions: members spread out.
        self._offset = zlib.crc32(self.name.encode()) % self.scale.partitions

    # -- ownership --------------------------------------------------------------------------
    async def _members(self) -> int:
        try:
            keys = await self.engine.leases.keys()
        except NoKeysError:
            keys = []
        return max(1, sum(key.startswith("m.") for key in keys))

    async def balance(self) -> None:
        """Renew our leases, then take or give back partitions towards our fair share."""
        leases = self.engine.leases
        await leases.put(f"m.{self.name}", self.name.encode())
        for partition in list(self.partitions.values()):
            try:
                partition.lease_revision = await leases.update(
                    partition.key, self.name.encode(), last=partition.lease_revision)
            except KeyWrongLastSequenceError:
                await self._drop(partition, "its lease expired and was taken")
            except KeyNotFoundError:
                await self._drop(partition, "its lease expired")
        count = self.scale.partitions
        share = math.ceil(count / await self._members())
        for i in range(count):
            if len(self.partitions) >= share:
                break
            number = (self._offset + i) % count
            if number in self.partitions:
                continue
            try:
                revision = await leases.create(f"p.{number}", self.name.encode())
            except KeyWrongLastSequenceError:
                continue  # owned by another member
            await self._take(number, revision)
        while len(self.partitions) > share:
            await self.release(max(self.partitions))

    async def _take(self, number: int, lease_revision: int) -> None:
        """Load the partition's state and fence off any earlier owner."""
        key, states = f"p.{number}", self.engine.states
        for _ in range(5):
            try:
                entry = await states.get(key)
            except KeyNotFoundError:
                entry = None
            try:
                partition = self._load(number, entry, lease_revision)
            except (PartitionStateRejected, ValueError) as exc:
                log.error("partition %d: its state cannot be read (%s); not taken (move "
                          "the key %s of bucket %s_state away to start it afresh)", number,
                          exc, key, self.scale.stream)
                await self.engine.leases.delete(key, last=lease_revision)
                return
            try:
                await self._write(partition)
            except KeyWrongLastSequenceError:
                continue  # the earlier owner wrote meanwhile: read again
            break
        else:
            log.warning("partition %d: could not take its state over; trying later", number)
            await self.engine.leases.delete(key, last=lease_revision)
            return
        self.partitions[number] = partition
        partition.reader = asyncio.create_task(self._read(partition),
                                               name=f"partition-{number}")
        log.info("took partition %d at stream sequence %d (%d messages counted)", number,
                 partition.sequence, partition.ingestor.counters["messages"])

    def _load(self, number: int, entry, lease_revision: int) -> Partition:
        if entry is None or not entry.value:
            ingestor = Ingestor.from_settings(self.config.fleet, self.config.aggregate_settings,
                                              self.limits)
            return Partition(number, ingestor, 0, lease_revision,
                             state_revision=entry.revision if entry else None)
        document, ingestor = decode_partition(entry.value, partition=number,
                                              fleet=self.config.fleet,
                                              settings=self.config.aggregate_settings)
        if document.partitions != self.scale.partitions:
            raise ValueError(f"written for {document.partitions} partitions")
        with_trackers(ingestor, document.trackers)
        ingestor.limits = self.limits
        return Partition(number, ingestor, document.sequence, lease_revision,
                         state_revision=entry.revision, written=document.sequence)

    async def _drop(self, partition: Partition, why: str) -> None:
        """Stop counting a partition another member owns now (what we counted since our
        last write is that member's to count again from the stream)."""
        self.partitions.pop(partition.number, None)
        if partition.reader is not None:
            partition.reader.cancel()
            await asyncio.gather(partition.reader, return_exceptions=True)
        log.warning("partition %d dropped: %s", partition.number, why)

    async def release(self, number: int) -> None:
        """Give a partition back: its last state written, then its lease deleted."""
        partition = self.partitions.pop(number)
        if partition.reader is not None:
            partition.reader.cancel()
            await asyncio.gather(partition.reader, return_exceptions=True)
        try:
            await self._write(partition)
            await self.engine.leases.delete(partition.key, last=partition.lease_revision)
            log.info("released partition %d at stream sequence %d", number, partition.sequence)
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            log.warning("partition %d was taken before we released it", number)

    # -- reading ----------------------------------------------------------------------------
    async def _read(self, partition: Partition) -> None:
        """Ingest the partition's messages in stream order, from the one after its state.
        A gap in the consumer's sequence (a message the client dropped) or a consumer
        lost in a failover: subscribe again from the last applied message."""
        js = self.engine.js
        while True:
            start = partition.sequence + 1
            try:
                subscription = await js.pull_subscribe(
                    subject(self.scale.stream, partition.number), stream=self.scale.stream,
                    config=ConsumerConfig(
                        ack_policy=AckPolicy.NONE, inactive_threshold=60.0,
                        mem_storage=True, num_replicas=1,
                        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                        opt_start_seq=start))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("partition %d: subscribing failed (%r); again", partition.number, exc)
                await asyncio.sleep(1.0)
                continue
            try:
                await self._consume(partition, subscription)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("partition %d: reading again from %d (%s)", partition.number,
                         partition.sequence + 1, exc or type(exc).__name__)
                await asyncio.sleep(0.2)
            finally:
                try:
                    await subscription.unsubscribe()
                except Exception:  # the connection or the consumer is gone already
                    pass

    async def _consume(self, partition: Partition, subscription) -> None:
        expected = 1
        while True:
            try:
                messages = await subscription.fetch(FETCH_BATCH, timeout=FETCH_WAIT)
            except TimeoutError:
                continue
            ingestor = partition.ingestor
            with ingestor.batch():
                for message in messages:
                    sequence = message.metadata.sequence
                    if sequence.consumer != expected:
                        raise RuntimeError(f"gap: consumer sequence {sequence.consumer}, "
                                           f"expected {expected}")
                    expected += 1
                    headers = message.headers or {}
                    ingestor.ingest(headers.get(TOPIC_HEADER, ""), message.data,
                                    _received(headers.get(RECEIVED_HEADER)))
                    partition.sequence = sequence.stream
            await asyncio.sleep(0)  # let the lease renewals and checkpoints run

    # -- checkpoints ------------------------------------------------------------------------
    async def _write(self, partition: Partition) -> None:
        """The partition's state, with compare-and-set on our last revision."""
        ingestor, now = partition.ingestor, self.clock()
        payload = encode_partition_state(
            ingestor.to_state(), tracker_states(ingestor), partition=partition.number,
            partitions=self.scale.partitions, owner=self.name, now=now,
            every=IDLE_WRITES * self.scale.checkpoint_seconds, sequence=partition.sequence)
        sequence, states = partition.sequence, self.engine.states
        if partition.state_revision is None:
            partition.state_revision = await states.create(partition.key, payload)
        else:
            partition.state_revision = await states.update(partition.key, payload,
                                                           last=partition.state_revision)
        partition.written, partition.written_at = sequence, time.monotonic()

    async def checkpoint(self) -> None:
        idle = IDLE_WRITES * self.scale.checkpoint_seconds
        for partition in list(self.partitions.values()):
            if partition.sequence == partition.written and not partition.ingestor.unconfirmed \
                    and time.monotonic() - partition.written_at < idle:
                continue  # nothing new (written now and then: the merge view sees us alive)
            confirmations = partition.ingestor.confirmations(self.clock())
            try:
                await self._write(partition)
            except KeyWrongLastSequenceError:
                await self._drop(partition, "another member wrote its state")
                continue
            except Exception as exc:  # the cluster is failing over: next time
                partition.ingestor.unconfirmed.update(confirmations)
                log.warning("partition %d: state not written (%r)", partition.number, exc)
                continue
            self._confirm(partition, confirmations)

    def _confirm(self, partition: Partition, confirmations: dict[str, bytes]) -> None:
        if not self.config.storage.confirmations:
            return
        if not self.client.connected:
            partition.ingestor.unconfirmed.update(confirmations)
            return
        for agent, payload in confirmations.items():
            self.client.publish(protocol.confirm_topic(self.config.fleet, agent), payload)

    # -- life -------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self.engine = await open_engine(self.scale, f"{self.name}-member")
        self.client.start()
        log.info("member %s: %d partitions in stream %s", self.name, self.scale.partitions,
                 self.scale.stream)
        next_balance = next_checkpoint = 0.0
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                now = loop.time()
                if now >= next_balance:
                    try:
                        await self.balance()
                    except Exception as exc:  # a failover: renew at the next round
                        log.warning("leases not renewed (%r)", exc)
                    next_balance = now + self.scale.lease_seconds / 4
                if now >= next_checkpoint:
                    await self.checkpoint()
                    next_checkpoint = now + self.scale.checkpoint_seconds
                try:
                    await asyncio.wait_for(stop.wait(), 0.1)
                except TimeoutError:
                    pass
        finally:
            await self._leave()

    async def _leave(self) -> None:
        """A clean stop: every partition's last state, leases given back at once."""
        for number in sorted(self.partitions):
            try:
                await self.release(number)
            except Exception as exc:
                log.warning("partition %d not released (%r): its lease expires in %.0f s",
                            number, exc, self.scale.lease_seconds)
        try:
            await self.engine.leases.delete(f"m.{self.name}")
        except Exception:
            pass
        self.client.stop()
        await self.engine.close()

    def run_forever(self) -> int:
        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            await self.run(stop)

        asyncio.run(main())
        return 0


def _received(header: str | None) -> float:
    try:
        value = float(header)
    except (TypeError, ValueError):
        return time.time()
    return value if math.isfinite(value) else time.time()
