"""Partition states larger than a KV value may be: objects, named by the KV value.

A partition's state grows with what its agents report (channels, series, a window each
minute of the history): at the default ``[limits]`` one partition may hold 125 MB,
while a NATS server takes messages of 1 MB unless told otherwise (``max_payload``), and
a KV value is one message.  So a state larger than ``[scale_out] inline_state_bytes``
is written to the JetStream object store ``<stream>_state_objects`` (the client cuts
it into 128 kB chunks and checks their sha256 on reading) under a name used once, and
the KV value ``p.<n>`` names it (``collector.storage.states.PartitionStateObject``).

Ownership stays where it was: the reference is written with the same compare-and-set
as an inline state, and an object never changes once a reference names it.  The owner
deletes its objects that no reference names any more, keeping the one named before the
current one (a merge view may still be reading it); a new owner deletes the objects of
its partition that its first write left unnamed (an earlier owner's failed attempts).
"""

from __future__ import annotations

import asyncio
import io
import logging
import uuid

from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from collector.scaleout.partition_state import PartitionStateRejected
from collector.storage.states import decode_state_object, encode_state_object
from edge_agent.protocol import Rejected

log = logging.getLogger(__name__)

READ_TIMEOUT = 60.0  # one object's chunks (tens of MB on a loaded cluster)


class StateObjectMissing(Exception):
    """The object a reference names is gone: a newer state replaced it (read that one)."""


def object_name(partition: int) -> str:
    return f"p.{partition}.{uuid.uuid4().hex}"


def _partition_of(name: str) -> int | None:
    prefix, number, _ = (name.split(".") + ["", ""])[:3]
    return int(number) if prefix == "p" and number.isdigit() else None


class StateObjects:
    """The object store behind the partition states, with the size from which a state
    is written there rather than inline."""

    def __init__(self, store: ObjectStore, inline_bytes: int):
        self.store, self.inline_bytes = store, inline_bytes

    async def value_for(self, partition: int, state: bytes) -> tuple[bytes, str | None]:
        """The KV value that stands for ``state``: the state itself, or a reference to a
        new object holding it (put now), with that object's name."""
        if len(state) <= self.inline_bytes:
            return state, None
        name = object_name(partition)
        await self.store.put(name, state)
        return encode_state_object(partition=partition, name=name, size=len(state)), name

    async def resolve(self, partition: int, value: bytes) -> tuple[bytes, str | None]:
        """(the state a KV value stands for, the object it was read from or None);
        ``StateObjectMissing`` when that object is gone, ``PartitionStateRejected`` for
        a reference to another partition's or an object of another size."""
        try:
            reference = decode_state_object(value, partition)
        except Rejected as exc:
            raise PartitionStateRejected(exc.reason, exc.detail) from None
        if reference is None:
            return value, None
        buffer = io.BytesIO()  # chunks appended in place (not bytes += chunk)
        try:
            # Its size first: what is read is never more than the reference's bounded size.
            info = await asyncio.wait_for(self.store.get_info(reference.object),
                                          READ_TIMEOUT / 4)
            if info.size != reference.size:
                raise PartitionStateRejected("oversized", f"object {reference.object}: "
                                             f"{info.size} bytes, not {reference.size}")
            await asyncio.wait_for(self.store.get(reference.object, writeinto=buffer),
                                   READ_TIMEOUT)
        except (ObjectNotFoundError, NotFoundError):
            raise StateObjectMissing(reference.object) from None
        state = buffer.getvalue()
        if len(state) != reference.size:
            raise PartitionStateRejected("oversized", f"object {reference.object}: "
                                         f"{len(state)} bytes, not {reference.size}")
        return state, reference.object

    async def delete(self, names) -> None:
        """Delete objects no reference names (best effort: what fails is deleted by the
        next sweep)."""
        for name in names:
            try:
                await asyncio.wait_for(self.store.delete(name), READ_TIMEOUT / 4)
            except (ObjectNotFoundError, NotFoundError):
                pass
            except Exception as exc:
                log.debug("object %s not deleted (%r)", name, exc)

    async def sweep(self, partition: int, keep: set[str]) -> int:
        """Delete the partition's objects other than ``keep``; how many."""
        try:
            infos = await asyncio.wait_for(self.store.list(ignore_deletes=True),
                                           READ_TIMEOUT / 4)
        except (NotFoundError, ObjectNotFoundError):
            return 0  # an empty store
        except Exception as exc:
            log.debug("listing the state objects failed (%r)", exc)
            return 0
        stale = [info.name for info in infos
                 if _partition_of(info.name) == partition and info.name not in keep]
        await self.delete(stale)
        return len(stale)
