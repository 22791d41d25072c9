"""A member's leases on a real NATS cluster, the member in this process (so that its
takeovers can be slowed down or made to hang): renewals never wait for takeovers, a
takeover that hangs gives its partition back for a later round, and a slow sweep of
state objects holds up no takeover."""

from __future__ import annotations

import asyncio

from collector.config import CollectorConfig, ScaleOutConfig
from collector.scaleout.engine import open_engine
from collector.scaleout.member import Member
from collector.scaleout.state_objects import StateObjects
from tests.support import collector_config
from tests.support.scaleout import PARTITIONS, scale_out

# Seconds.  Renewals give each request a quarter of it: 2.5 s, room for a loaded machine.
LEASE = 10.0
HANG_GUARD = 300.0


def new_member(tmp_path, mosquitto, nats_cluster) -> Member:
    settings = scale_out(nats_cluster, member="m0", lease_seconds=LEASE, checkpoint_seconds=1)
    return Member(CollectorConfig.model_validate(collector_config(
        mosquitto, broker_settings={"client_id": "m0"}, scale_out=settings,
        storage={"path": str(tmp_path / "m0.sqlite")})))


async def leave_partitions_to_a_dead_member(nats_cluster, numbers) -> None:
    """Leases of a member that is gone: announced once and never renewed, so they
    expire after a lease."""
    engine = await open_engine(ScaleOutConfig.model_validate(scale_out(
        nats_cluster, member="gone", lease_seconds=LEASE, checkpoint_seconds=1)), "gone")
    try:
        await engine.leases.put("m.gone", b"gone")
        for number in numbers:
            await engine.leases.create(f"p.{number}", b"gone")
    finally:
        await engine.close()


async def lease_holders(member: Member) -> dict[int, bytes]:
    holders = {}
    for number in range(PARTITIONS):
        try:
            holders[number] = (await member.engine.leases.get(f"p.{number}")).value
        except Exception:
            holders[number] = None
    return holders


def run_until(member: Member, done, *, hold: float = 0.0) -> dict[int, bytes | None]:
    """Run the member until ``done()``, then ``hold`` seconds more; who holds each lease
    then (read before the member stops and gives them back)."""
    async def run() -> dict[int, bytes | None]:
        stop = asyncio.Event()
        running = asyncio.create_task(member.run(stop))
        try:
            async with asyncio.timeout(HANG_GUARD):
                while not (member.engine is not None and done()):
                    if running.done():
                        running.result()
                    await asyncio.sleep(0.1)
                await asyncio.sleep(hold)
                return await lease_holders(member)
        finally:
            stop.set()
            await running

    return asyncio.run(run())


def record_drops(member: Member) -> list[tuple[int, str]]:
    drops, drop = [], member._drop

    async def recorded(partition, why):
        drops.append((partition.number, why))
        await drop(partition, why)

    member._drop = recorded
    return drops


def test_slow_takeovers_do_not_let_our_own_leases_expire(tmp_path, mosquitto, nats_cluster):
    """Taking over a dead member's four partitions takes 1.6 leases here (0.4 each, as on
    a loaded cluster whose requests wait on a dead node): the partitions we already own
    are renewed meanwhile, so none is dropped in the lease that follows, and we own all."""
    theirs = range(PARTITIONS // 2, PARTITIONS)
    asyncio.run(leave_partitions_to_a_dead_member(nats_cluster, theirs))
    member = new_member(tmp_path, mosquitto, nats_cluster)
    drops = record_drops(member)
    take = member._take

    async def slow_take(number, lease_revision):
        await take(number, lease_revision)
        if number in theirs:
            await asyncio.sleep(0.4 * LEASE)

    member._take = slow_take
    holders = run_until(member, lambda: len(member.partitions) == PARTITIONS, hold=LEASE)
    assert drops == []
    assert set(holders.values()) == {b"m0"}, holders


def test_a_takeover_that_hangs_gives_its_partition_back_and_is_tried_again(
        tmp_path, mosquitto, nats_cluster):
    """Loading one partition's state hangs the first time (a request no node answers):
    the take is given up after half a lease, its lease deleted, and the next round takes
    the partition; the other partitions are taken meanwhile."""
    member = new_member(tmp_path, mosquitto, nats_cluster)
    load, loads = member._load, []

    async def hanging_once(number, entry, lease_revision):
        loads.append(number)
        if number == 5 and loads.count(5) == 1:
            await asyncio.Event().wait()  # never set
        return await load(number, entry, lease_revision)

    member._load = hanging_once
    holders = run_until(member, lambda: len(member.partitions) == PARTITIONS)
    assert loads.count(5) == 2
    assert set(holders.values()) == {b"m0"}, holders


def test_a_slow_sweep_of_state_objects_holds_up_no_takeover(tmp_path, mosquitto, nats_cluster,
                                                           monkeypatch):
    """Each takeover's sweep of stale state objects waits until every partition is taken
    (as a listing that waits on a dead node would, for longer): the sweeps run beside the
    takeovers, so none holds the next one up (or is cut short with it), and each ends."""
    member = new_member(tmp_path, mosquitto, nats_cluster)
    everything_taken, swept = asyncio.Event(), []

    async def waits_for_every_takeover(store, number, keep):
        await everything_taken.wait()
        swept.append(number)
        return 0

    monkeypatch.setattr(StateObjects, "sweep", waits_for_every_takeover)

    def done() -> bool:
        if len(member.partitions) == PARTITIONS:
            everything_taken.set()
        return len(swept) == PARTITIONS

    holders = run_until(member, done)
    assert sorted(swept) == list(range(PARTITIONS))
    assert set(holders.values()) == {b"m0"}, holders
