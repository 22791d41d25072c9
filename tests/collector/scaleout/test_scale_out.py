"""Scale-out on NATS JetStream, end to end: a real 3-node cluster, a real Mosquitto,
ingress, aggregation members and the merge view as processes (docs/guides/SCALE_OUT.md).

Whatever is killed (a NATS node, a member, the ingress) and whatever is sent again,
the merged counts equal exactly what was published: nothing lost, nothing twice.
"""

from __future__ import annotations

import asyncio
import time

import nats
import numpy as np
from nats.js.api import AckPolicy, ConsumerConfig

from collector.config import ScaleOutConfig
from collector.scaleout.engine import open_engine
from collector.scaleout.partitions import message_id
from tests.support import CollectorProcess, MqttClient, run_module, wait_until, write_toml
from tests.support import wait_for_api as wait_for
from tests.support.scaleout import (
    DUPLICATE_WINDOW,
    PARTITIONS,
    STREAM,
    Role,
    ingress,
    member,
    pipeline,
)
from tests.support.streams import AGENTS, CHANNELS, Publisher, SteadyStream, comparable


def stored_ids(cluster) -> list[str]:
    """The Nats-Msg-Id of every message in the stream, read with a client of our own."""
    async def read() -> list[str]:
        client = await nats.connect(cluster.urls)
        js = client.jetstream()
        info = await js.stream_info(STREAM)
        ids = []
        subscription = await js.pull_subscribe(f"{STREAM}.*", stream=STREAM, config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, mem_storage=True, num_replicas=1))
        while len(ids) < info.state.messages:
            for message in await subscription.fetch(500, timeout=5):
                ids.append(message.headers["Nats-Msg-Id"])
        await client.close()
        return ids

    for _ in range(60):  # after a restart: until the stream has its leader again
        try:
            return asyncio.run(read())
        except nats.errors.Error:
            time.sleep(0.5)
    return asyncio.run(read())


def ready(process) -> bool:
    """Whether every channel's estimates are of the reports counted."""
    return all(channel["state"] == "ready" for channel in process.api()["channels"].values())


def counts(process) -> dict:
    channels = process.api()["channels"]
    return {name: channels.get(name, {}).get("count") for name in CHANNELS}


def test_counts_stay_exact_through_node_member_and_ingress_kills(tmp_path, mosquitto,
                                                                 nats_cluster):
    started = time.monotonic()
    single = CollectorProcess(tmp_path, mosquitto, name="single").start()
    entry, members, merge = pipeline(tmp_path, mosquitto, nats_cluster)
    publisher = Publisher(mosquitto, np.random.default_rng(13))

    publisher.seqs(range(0, 30))
    nats_cluster.kill(0)  # SIGKILL a NATS node mid-stream (perhaps the stream's leader)
    publisher.seqs(range(30, 60))
    nats_cluster.start_node(0)
    members[1].kill()  # SIGKILL a member: its partitions wait for the lease to expire
    publisher.seqs(range(60, 90))
    entry.kill()  # SIGKILL the ingress: MQTT keeps what it had not acknowledged
    publisher.seqs(range(90, 100))
    entry = ingress(tmp_path, mosquitto, nats_cluster).start()
    members[1] = member(tmp_path, mosquitto, nats_cluster, "m1").start()
    publisher.seqs(range(100, 120))
    time.sleep(DUPLICATE_WINDOW + 0.5)
    publisher.replay(60)  # old reports again, as from agents' spools, after the window

    assert wait_for(lambda: counts(single) == publisher.values, 90), \
        (counts(single), publisher.values)
    assert wait_for(lambda: counts(merge) == publisher.values, 120), \
        (counts(merge), publisher.values, merge.api()["partitions"])
    time.sleep(2)  # nothing more arrives: the counts stay exact
    # Counts first, estimates at the next pushes: compare once both caught up.
    assert wait_for(lambda: ready(single) and ready(merge))
    one, merged = single.api(), merge.api()
    assert merged["ingest"]["messages"] == one["ingest"]["messages"] == len(publisher.sent)
    assert merged["ingest"]["values"] == one["ingest"]["values"] == sum(publisher.values.values())
    # Copies within the stream's duplicate window never reach a member; the rest (the
    # replay, and what a restarted ingress or a retried batch stored again after the
    # 2-s window) are recognised by the partition's sequence trackers.
    assert merged["ingest"]["duplicates"] >= 60
    for name in CHANNELS:
        assert comparable(merged["channels"][name]) == comparable(one["channels"][name]), name
    assert {a: (s["messages"], s["values"]) for a, s in merged["agents"].items()} == \
        {a: (s["messages"], s["values"]) for a, s in one["agents"].items()}
    partitions = merged["partitions"]
    assert len(partitions) <= PARTITIONS and merged["partition_rejects"] == {}
    assert {p["owner"] for p in partitions.values()} <= {"m0", "m1"}
    print(f"\nscale-out: {len(publisher.sent)} reports + {publisher.copies} copies, "
          f"duplicates seen by members {merged['ingest']['duplicates']}, "
          f"owners {sorted(p['owner'] for p in partitions.values())}, "
          f"{time.monotonic() - started:.1f} s")
    for process in (merge, *members, entry, single):
        assert process.terminate() == 0, process.output()[-3000:]


def test_acknowledged_to_mqtt_implies_stored_in_the_stream(tmp_path, mosquitto, nats_cluster):
    """Without a JetStream quorum the ingress acknowledges nothing: the reports stay
    queued in its MQTT session, through a SIGKILL of the ingress, until stored; and the
    stream's duplicate window keeps one copy of each."""
    window = {"duplicate_window_seconds": 120}
    entry = ingress(tmp_path, mosquitto, nats_cluster, **window).start()
    publisher = Publisher(mosquitto, np.random.default_rng(3))
    publisher.seqs(range(0, 5))
    before = {f"{agent}/{channel}/{seq}" for agent in AGENTS for channel in CHANNELS
              for seq in range(5)}
    assert wait_until(lambda: set(stored_ids(nats_cluster)) == before, 30)
    nats_cluster.kill(1)
    nats_cluster.kill(2)  # one node of three: no quorum, nothing can be stored
    publisher.seqs(range(5, 10))
    time.sleep(3)
    entry.kill()  # what it holds unacknowledged stays in its MQTT session
    # Which reports did the ingress not acknowledge?  Its session gives them to us.
    probe = MqttClient(mosquitto, client_id="ingress", persistent=True, manual_ack=True)
    probe.connect()
    time.sleep(2)
    unacknowledged = {message_id(topic, payload, "demo") for topic, payload, _ in
                      probe.messages}
    probe.close()  # without acknowledging: the session keeps them for the next ingress
    everything = {f"{agent}/{channel}/{seq}" for agent in AGENTS for channel in CHANNELS
                  for seq in range(10)}
    assert everything - before <= unacknowledged <= everything  # (a batch is acknowledged
    # once all of it is stored: the first may still have been waiting for a retry)
    nats_cluster.start_node(1)
    nats_cluster.start_node(2)
    # Every acknowledged report is stored (an unacknowledged one may be too: the stream
    # leader had it in its log when the quorum came back).
    assert everything - unacknowledged <= set(stored_ids(nats_cluster))
    entry = ingress(tmp_path, mosquitto, nats_cluster, **window).start()
    assert wait_until(lambda: set(stored_ids(nats_cluster)) == everything, 60), \
        entry.output()[-3000:]
    assert len(stored_ids(nats_cluster)) == len(everything)  # each once
    assert entry.terminate() == 0


def test_a_role_refuses_a_stream_made_with_another_partition_count(tmp_path, mosquitto,
                                                                   nats_cluster):
    async def make_stream() -> None:
        engine = await open_engine(ScaleOutConfig(servers=nats_cluster.urls, partitions=8),
                                   "test")
        await engine.close()

    asyncio.run(make_stream())
    for command in ("member", "ingress"):
        role = Role(tmp_path, mosquitto, nats_cluster, command, command, "",
                    partitions=4).start_raw()
        assert role.wait(60) == 78
        assert "was created with 8 partitions, [scale_out] partitions says 4" in role.output()
    config = write_toml(tmp_path / "plain.toml", {"fleet": "demo"})
    done = run_module("collector", "member", "--config", config)
    assert done.returncode == 78 and "scale_out: the member needs a [scale_out] table" \
        in done.stderr


def test_a_node_failover_moves_no_partition_and_a_dead_members_are_taken_over(
        request, tmp_path, mosquitto, nats_cluster):
    """While reports stream in: SIGKILL the stream's leader node, then a member.

    A node failover is the cluster's (it elects new leaders) and moves no partition:
    the leases outlast it, so every partition keeps its owner (members read with direct
    gets, which any replica answers).  A dead member's partitions are taken over once
    its leases expire, by the survivor; the killed node stays down meanwhile.  After
    each kill the merged view counts everything published before it.  How long each
    takes is measured by benchmarks/bench_failover.py, against the bounds the
    configuration sets (docs/benchmarks/BENCHMARKS.md)."""
    # Longer than a node failover on a loaded machine (23 s seen with a CPU-bound process
    # beside three other test workers; 4-9 s idle), so that no lease expires during one.
    settings = {"lease_seconds": 30.0, "checkpoint_seconds": 0.5}
    entry, members, merge = pipeline(tmp_path, mosquitto, nats_cluster, **settings)
    stream = SteadyStream(mosquitto, agents=16, rate=10.0, seed=5).start()
    request.addfinalizer(stream.stop)

    def caught_up(phase: int) -> None:
        """The merged view counts every report of ``phase`` (a takeover waits out a
        lease: the guard allows several)."""
        assert wait_for(lambda: stream.counted(merge.api(), phase) == stream.sent[phase],
                        300), (stream.counted(merge.api(), phase), stream.sent[phase])

    def owners() -> dict[str, str]:
        return {name: p["owner"] for name, p in merge.api()["partitions"].items()}

    def traffic() -> int:
        """A phase of reports that runs on a while (through a failover, say), ended."""
        time.sleep(3)
        return stream.next_phase()

    caught_up(traffic())
    assert wait_for(lambda: len(owners()) == PARTITIONS)
    before = owners()
    assert set(before.values()) == {"m0", "m1"}

    nats_cluster.kill(nats_cluster.stream_leader(STREAM))
    caught_up(traffic())
    assert owners() == before  # no lease expired: no partition moved

    members[1].kill()
    caught_up(traffic())
    assert set(owners().values()) == {"m0"}

    stream.stop()
    last = len(stream.sent) - 1
    caught_up(last)
    merged = merge.api()["ingest"]
    assert merged["messages"] == sum(stream.sent), (merged, stream.sent)
    for process in (merge, members[0], entry):
        assert process.terminate() == 0, process.output()[-3000:]


def state_objects(cluster) -> list[str]:
    """The names of the objects in the state object store, read with a client of our own."""
    async def read() -> list[str]:
        client = await nats.connect(cluster.urls)
        try:
            store = await client.jetstream().object_store(f"{STREAM}_state_objects")
            try:
                return sorted(info.name for info in await store.list(ignore_deletes=True))
            except nats.js.errors.NotFoundError:
                return []
        finally:
            await client.close()

    return asyncio.run(read())


def test_states_larger_than_a_kv_value_are_written_as_objects_and_taken_over(
        tmp_path, mosquitto, nats_cluster):
    """With ``inline_state_bytes`` at its least (1 kB), every partition state goes to the
    object store, named by its KV value: the merge view reads them, a member killed
    with SIGKILL is taken over from them, the counts stay exact, and each partition
    keeps at most its current object and the one before."""
    settings = {"inline_state_bytes": 1024}
    single = CollectorProcess(tmp_path, mosquitto, name="single").start()
    entry, members, merge = pipeline(tmp_path, mosquitto, nats_cluster, **settings)
    publisher = Publisher(mosquitto, np.random.default_rng(17))
    publisher.seqs(range(0, 30))
    members[1].kill()  # its partitions are taken over from their objects
    publisher.seqs(range(30, 60))

    assert wait_for(lambda: counts(merge) == publisher.values, 120), \
        (counts(merge), publisher.values, merge.api()["partitions"])
    assert wait_for(lambda: counts(single) == publisher.values, 90)
    assert wait_for(lambda: ready(single) and ready(merge))
    one, merged = single.api(), merge.api()
    for name in CHANNELS:
        assert comparable(merged["channels"][name]) == comparable(one["channels"][name]), name
    partitions = merged["partitions"]
    assert {p["owner"] for p in partitions.values()} == {"m0"}
    assert merged["partition_rejects"] == {}
    # The partitions with agents hold more than 1 kB (an empty one may hold less, inline).
    large = {str(int(name.removeprefix("p"))) for name, p in partitions.items()
             if p["bytes"] > 1024}
    assert large and large == {str(int(name.removeprefix("p")))
                               for name, p in partitions.items() if p["messages"]}, partitions
    # Every write of a large state made an object; the owner deleted all but the current
    # and the previous one (the dead member's leftovers were swept when m0 took over).
    def per_partition() -> dict[str, list[str]]:
        kept: dict[str, list[str]] = {}
        for name in state_objects(nats_cluster):
            kept.setdefault(name.split(".")[1], []).append(name)
        return kept

    # The owner deletes a replaced object after writing the new one: on a busy machine
    # the newest deletion may still be on its way.
    assert wait_for(lambda: all(len(kept) <= 2 for kept in per_partition().values()), 30), \
        per_partition()
    assert set(per_partition()) == large, (per_partition(), partitions)
    for process in (merge, members[0], entry, single):
        assert process.terminate() == 0, process.output()[-3000:]
