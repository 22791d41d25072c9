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
revision; a refused write means another member owns the partition, and ours is
dropped.  State and position are always written together, so whoever continues
counts every stored message once: the trackers know what the state counted.

Failovers: every KV operation is given up after ``lease_seconds / 4`` (a request
can go unanswered while the cluster elects a leader), renewals, takeovers and
checkpoints run on separate clocks, a takeover is given up after half a lease, and a
compare-and-set refused because our own timed-out write was applied after all is
recognised (the key holds exactly what we wrote), so a node failover shorter than
``lease_seconds`` moves no partition.

After each written state, the agents of that partition get their delivery
confirmations over MQTT (docs/guides/HARDENING.md), as from a single collector.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
import zlib
from dataclasses import dataclass, field

import natsext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError

from collector.aggregation.ingest import Ingestor
from collector.aggregation.limits import ingest_limits
from collector.broker.publisher import CollectorClient
from collector.config import CollectorConfig
from collector.scaleout.engine import Engine, open_engine, rewrite_seconds
from collector.scaleout.journal import RECEIVED_HEADER, TOPIC_HEADER
from collector.scaleout.partition_state import PartitionStateRejected, decode_partition
from collector.scaleout.partitions import subject
from collector.scaleout.state_objects import StateObjectMissing
from collector.storage.checkpoint import tracker_states, with_trackers
from collector.storage.states import MAX_PARTITION_STATE_BYTES, encode_partition_state
from edge_agent import protocol

log = logging.getLogger(__name__)

FETCH_BATCH = 500  # messages applied at once (~40 ms of work: lease renewals stay on time)
FETCH_TIMEOUT = 2.0  # a batch is answered in milliseconds, or its replica died meanwhile
IDLE_POLL = 0.25  # seconds between reads of a partition that had nothing new
BUSY_POLL = 0.05  # ... that had something, and now has nothing more
RETRY_SECONDS = 0.2


class DirectBatch:
    """How a batch direct get ended: its last reply, with an empty body and a ``Status``
    header (204 end of batch, 404 nothing new, anything else an error)."""

    def __init__(self):
        self.status: str | None = None
        self.pending = 0

    def ends(self, message) -> bool:
        headers = message.headers or {}
        if message.data or "Status" not in headers:
            return False
        self.status = headers["Status"]
        self.pending = int(headers.get("Nats-Num-Pending", 0))
        return True

    def check(self) -> int:
        """How many more the replica had; raises for an error status.  No status: the
        reply stopped coming (its replica died), and what arrived was ingested."""
        if self.status not in (None, "204", "404"):
            raise RuntimeError(f"direct get answered {self.status}")
        return self.pending


class StateTooLarge(Exception):
    """A partition's state over the size any reader accepts (its message names the keys)."""


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
    attempted: bytes | None = None  # a write that failed (it may have been applied)
    # State objects (state_objects.py) this owner put or took over, oldest first, and the
    # one its last write named; what no reference names is deleted after the next write.
    objects: list[str] = field(default_factory=list)
    named: str | None = None
    writing: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
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
        self._leasing = asyncio.Lock()
        self._sweeps: set[asyncio.Task] = set()  # of state objects, after takeovers
        self.client = CollectorClient(config, role="member", label="member", follow={})
        # Where this member starts looking for free partitions: members spread out.
        self._offset = zlib.crc32(self.name.encode()) % self.scale.partitions

    # -- ownership --------------------------------------------------------------------------
    async def _members(self) -> int:
        """Live members: the ``m.<name>`` keys of the lease bucket, listed from the
        stream's subjects and read one by one (``KeyValue.keys`` makes a consumer,
        which a cluster that lost a node sometimes places on the dead one: it then
        hangs for the client's whole timeout)."""
        bucket = f"{self.scale.stream}_leases"
        prefix = f"$KV.{bucket}."
        info = await self._kv(self.engine.js.stream_info(f"KV_{bucket}",
                                                         subjects_filter=f"{prefix}m.>"))
        live = 0
        for name in info.state.subjects or {}:
            try:
                await self._kv(self.engine.leases.get(name.removeprefix(prefix)))
            except (KeyNotFoundError, KeyDeletedError):
                continue  # a member that left (its delete marker expires with the TTL)
            live += 1
        return max(1, live)

    async def _kv(self, operation):
        """One KV operation, given up after ``lease_seconds / 4``: during a cluster
        failover a request can go unanswered for the client's whole timeout, and one
        renewal round must not outlast the next."""
        return await asyncio.wait_for(operation, self.scale.lease_seconds / 4)

    async def _ours(self, bucket, key: str, value: bytes) -> int | None:
        """After a compare-and-set was refused: the key's revision if it holds ``value``
        (our own write, which had timed out but was applied), else None."""
        try:
            entry = await self._kv(bucket.get(key))
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return entry.revision if entry.value == value else None

    async def renew(self) -> None:
        """Announce ourselves and renew every lease we hold, all at once.

        On its own clock, apart from taking partitions over: a takeover can take seconds
        a partition on a loaded cluster, and four of them in a row once outlasted the
        lease and lost three of the partitions we already had."""
        leases = self.engine.leases
        async with self._leasing:  # not beside a release's delete of its lease
            await self._kv(leases.put(f"m.{self.name}", self.name.encode()))
            failures = [result for result in await asyncio.gather(
                *(self._renew(partition) for partition in list(self.partitions.values())),
                return_exceptions=True) if isinstance(result, Exception)]
        if failures:
            raise failures[0]

    async def _renew(self, partition: Partition) -> None:
        leases, mine = self.engine.leases, self.name.encode()
        try:
            partition.lease_revision = await self._kv(leases.update(
                partition.key, mine, last=partition.lease_revision))
        except KeyWrongLastSequenceError:
            revision = await self._ours(leases, partition.key, mine)
            if revision is None:
                await self._drop(partition, "its lease expired and was taken")
            else:
                partition.lease_revision = revision
        except KeyNotFoundError:
            await self._drop(partition, "its lease expired")

    async def balance(self) -> None:
        """Take or give back partitions towards our fair share."""
        leases, mine = self.engine.leases, self.name.encode()
        count = self.scale.partitions
        share = math.ceil(count / await self._members())
        for i in range(count):
            if len(self.partitions) >= share:
                break
            number = (self._offset + i) % count
            if number in self.partitions:
                continue
            try:
                revision = await self._kv(leases.create(f"p.{number}", mine))
            except KeyWrongLastSequenceError:
                # Owned by another member, or ours: a create that timed out but was
                # applied, a take that failed, or our previous run's (restarted under the
                # same name).  The state's compare-and-set fences any earlier owner.
                revision = await self._ours(leases, f"p.{number}", mine)
                if revision is None:
                    continue
            await self._take_within_lease(number, revision)
        while len(self.partitions) > share:
            await self.release(max(self.partitions))

    async def _take_within_lease(self, number: int, lease_revision: int) -> None:
        """``_take``, given up after half a lease (the lease it took is not renewed before
        the partition is ours): a take that hangs (a request to a dead node) or fails must
        not keep the partition from everyone, nor the next partitions from us."""
        try:
            await asyncio.wait_for(self._take(number, lease_revision),
                                   self.scale.lease_seconds / 2)
        except Exception as exc:
            if number in self.partitions:
                return  # ours and read
            log.warning("partition %d: not taken over (%r); trying later", number, exc)
            try:
                await self._kv(self.engine.leases.delete(f"p.{number}", last=lease_revision))
            except Exception:  # then it expires with the bucket's TTL
                pass

    async def _take(self, number: int, lease_revision: int) -> None:
        """Load the partition's state and fence off any earlier owner."""
        key, states = f"p.{number}", self.engine.states
        for _ in range(5):
            try:
                entry = await self._kv(states.get(key))
            except KeyNotFoundError:
                entry = None
            try:
                partition = await self._load(number, entry, lease_revision)
            except StateObjectMissing:
                continue  # replaced while we read it: read the newer one
            except (PartitionStateRejected, ValueError) as exc:
                log.error("partition %d: its state cannot be read (%s); not taken (move "
                          "the key %s of bucket %s_state away to start it afresh)", number,
                          exc, key, self.scale.stream)
                await self._kv(self.engine.leases.delete(key, last=lease_revision))
                return
            try:
                await self._write(partition)
            except KeyWrongLastSequenceError:
                continue  # the earlier owner wrote meanwhile: read again
            break
        else:
            log.warning("partition %d: could not take its state over; trying later", number)
            await self._kv(self.engine.leases.delete(key, last=lease_revision))
            return
        self.partitions[number] = partition
        partition.reader = asyncio.create_task(self._read(partition),
                                               name=f"partition-{number}")
        log.info("took partition %d at stream sequence %d (%d messages counted)", number,
                 partition.sequence, partition.ingestor.counters["messages"])
        # Objects our fence write left unnamed: an earlier owner's failed attempts.  In the
        # background: listing the store makes a consumer, whose request can wait out the
        # client's 10-s timeout on a cluster with a dead node (takeovers were seen 10 s
        # apart), and the next partition's takeover must not wait for it.
        sweep = asyncio.create_task(self.engine.state_objects.sweep(number,
                                                                    set(partition.objects)),
                                    name=f"sweep-{number}")
        self._sweeps.add(sweep)
        sweep.add_done_callback(self._sweeps.discard)

    async def _load(self, number: int, entry, lease_revision: int) -> Partition:
        if entry is None or not entry.value:
            ingestor = Ingestor.from_settings(self.config.fleet, self.config.aggregate_settings,
                                              self.limits)
            return Partition(number, ingestor, 0, lease_revision,
                             state_revision=entry.revision if entry else None)
        payload, named = await self.engine.state_objects.resolve(number, entry.value)
        document, ingestor = decode_partition(payload, partition=number,
                                              fleet=self.config.fleet,
                                              settings=self.config.aggregate_settings)
        if document.partitions != self.scale.partitions:
            raise ValueError(f"written for {document.partitions} partitions")
        with_trackers(ingestor, document.trackers)
        ingestor.limits = self.limits
        return Partition(number, ingestor, document.sequence, lease_revision,
                         state_revision=entry.revision, written=document.sequence,
                         objects=[named] if named else [], named=named)

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
            async with self._leasing:  # no renewal of it in flight
                await self._kv(self.engine.leases.delete(partition.key,
                                                         last=partition.lease_revision))
            log.info("released partition %d at stream sequence %d", number, partition.sequence)
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            log.warning("partition %d was taken before we released it", number)

    # -- reading ----------------------------------------------------------------------------
    async def _read(self, partition: Partition) -> None:
        """Ingest the partition's messages in stream order, from the one after its state,
        until cancelled (the partition was dropped or released)."""
        while True:
            try:
                read, pending = await self._read_batch(partition)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no replica answers (an election), a gap, a bad reply
                log.debug("partition %d: reading from %d failed (%r); again",
                          partition.number, partition.sequence + 1, exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            # More waiting: at once (after letting lease renewals and checkpoints run).
            await asyncio.sleep(0 if pending else BUSY_POLL if read else IDLE_POLL)

    async def _read_batch(self, partition: Partition) -> tuple[int, int]:
        """Up to ``FETCH_BATCH`` messages of the partition after its sequence, ingested:
        (how many, how many more the replica that answered has).

        Read with the stream's batch direct get (ADR-31), which any replica answers: no
        consumer to create or to lose with a node (the server places some consumers on a
        dead node for over a minute after it died, and their creation is never
        answered).  A replica that is behind answers with what it has, a prefix of the
        stream; each message names the one before it, so a message the client lost is a
        gap that is refused, never skipped.

        The whole batch is received first and then ingested without a pause: a checkpoint
        (which runs whenever this task awaits) must never see the position advanced past
        messages whose aggregates the batch has not applied yet."""
        batch = DirectBatch()
        request = (b'{"batch":%d,"seq":%d,"next_by_subj":"%s"}'
                   % (FETCH_BATCH, partition.sequence + 1,
                      subject(self.scale.stream, partition.number).encode()))
        received, previous = [], 0
        async for message in natsext.request_many(
                self.engine.nc, f"$JS.API.DIRECT.GET.{self.scale.stream}", request,
                sentinel=batch.ends, timeout=FETCH_TIMEOUT):
            headers = message.headers or {}
            sequence = int(headers["Nats-Sequence"])
            if int(headers["Nats-Last-Sequence"]) != previous:
                raise RuntimeError(f"gap before stream sequence {sequence}")
            received.append((headers, message.data))
            previous = sequence
        ingestor = partition.ingestor
        with ingestor.batch():  # no await in here
            for headers, data in received:
                ingestor.ingest(headers.get(TOPIC_HEADER, ""), data,
                                _received(headers.get(RECEIVED_HEADER)))
        if received:
            partition.sequence = previous
        return len(received), batch.check()

    # -- checkpoints ------------------------------------------------------------------------
    async def _write(self, partition: Partition) -> None:
        """The partition's state, with compare-and-set on our last revision (one write of
        a partition at a time)."""
        async with partition.writing:
            ingestor, now = partition.ingestor, self.clock()
            state = encode_partition_state(
                ingestor.to_state(computed=False, encoded=True), tracker_states(ingestor),
                partition=partition.number,
                partitions=self.scale.partitions, owner=self.name, now=now,
                every=rewrite_seconds(self.scale), sequence=partition.sequence)
            if len(state) > MAX_PARTITION_STATE_BYTES:
                raise StateTooLarge(
                    f"partition {partition.number}'s state is {len(state) >> 20} MB, over "
                    f"{MAX_PARTITION_STATE_BYTES >> 20} MB: lower [limits] channels or series "
                    f"or [aggregates] history_seconds, or raise [scale_out] partitions")
            sequence, states = partition.sequence, self.engine.states
            payload, named = await self.engine.state_objects.value_for(partition.number, state)
            if named is not None:
                partition.objects.append(named)
            try:
                if partition.state_revision is None:
                    revision = await self._kv(states.create(partition.key, payload))
                else:
                    revision = await self._kv(states.update(partition.key, payload,
                                                            last=partition.state_revision))
            except KeyWrongLastSequenceError:
                # Another member's write, or our previous one that timed out but was
                # applied (then the bucket holds exactly what we wrote last).
                if partition.attempted is None:
                    raise
                revision = await self._ours(states, partition.key, partition.attempted)
                if revision is None:
                    raise
                partition.state_revision = revision
                revision = await self._kv(states.update(partition.key, payload, last=revision))
            except BaseException:
                partition.attempted = payload
                raise
            partition.state_revision, partition.attempted = revision, None
            partition.written, partition.written_at = sequence, time.monotonic()
            await self._forget_objects(partition, named)

    async def _forget_objects(self, partition: Partition, named: str | None) -> None:
        """After a write that named ``named`` (None: inline), delete our objects that no
        reference names, but the one named before (a reader may be fetching it)."""
        keep = {named, partition.named}
        stale = [name for name in partition.objects if name not in keep]
        partition.objects = [name for name in partition.objects if name in keep]
        partition.named = named
        await self.engine.state_objects.delete(stale)

    async def _checkpoint(self, partition: Partition) -> None:
        idle = rewrite_seconds(self.scale)
        if partition.sequence == partition.written and not partition.ingestor.unconfirmed \
                and time.monotonic() - partition.written_at < idle:
            return  # nothing new (written now and then: the merge view sees us alive)
        confirmations = partition.ingestor.confirmations(self.clock())
        try:
            await self._write(partition)
        except KeyWrongLastSequenceError:
            await self._drop(partition, "another member wrote its state")
            return
        except Exception as exc:  # the cluster is failing over: next time
            partition.ingestor.unconfirmed.update(confirmations)
            log.warning("partition %d: state not written (%r)", partition.number, exc)
            return
        self._confirm(partition, confirmations)

    async def checkpoint(self) -> None:
        """Every partition's state, written concurrently (a write that waits out a
        failover does not hold up the others)."""
        await asyncio.gather(*(self._checkpoint(partition)
                               for partition in list(self.partitions.values())))

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
        # Renewals, takeovers and checkpoints on their own clocks: neither a checkpoint
        # waiting out a failover nor a slow takeover may delay the renewals that keep our
        # partitions.  Announced first, so that the first balance counts us.
        try:
            await self.renew()
        except Exception as exc:
            log.warning("leases not renewed (%r)", exc)
        loops = [asyncio.create_task(self._every(self.scale.lease_seconds / 4, self.renew,
                                                 "leases not renewed"), name="leases"),
                 asyncio.create_task(self._every(self.scale.lease_seconds / 4, self.balance,
                                                 "partitions not balanced"), name="balance"),
                 asyncio.create_task(self._every(self.scale.checkpoint_seconds,
                                                 self.checkpoint, "checkpoint failed"),
                                     name="checkpoints")]
        try:
            await stop.wait()
        finally:
            for task in (*loops, *self._sweeps):
                task.cancel()
            await asyncio.gather(*loops, *self._sweeps, return_exceptions=True)
            await self._leave()

    @staticmethod
    async def _every(period: float, work, failure: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failover: again at the next round
                log.warning("%s (%r)", failure, exc)
            await asyncio.sleep(max(0.0, began + period - loop.time()))

    async def _leave(self) -> None:
        """A clean stop: every partition's last state, leases given back at once."""
        for number in sorted(self.partitions):
            try:  # bounded: a stop must end even while the cluster is failing over
                await asyncio.wait_for(self.release(number), self.scale.lease_seconds / 2)
            except Exception as exc:
                log.warning("partition %d not released (%r): its lease expires in %.0f s",
                            number, exc, self.scale.lease_seconds)
        try:
            await self._kv(self.engine.leases.delete(f"m.{self.name}"))
        except Exception:
            pass
        self.client.stop()
        try:
            await asyncio.wait_for(self.engine.close(), self.scale.lease_seconds / 2)
        except Exception as exc:
            log.warning("closing the NATS connection: %r", exc)

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
