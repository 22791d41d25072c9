"""Scale-out end to end: real Mosquitto, three collector shards on a shared subscription,
one ordinary collector on the same stream, and the merge view (docs/SCALE_OUT.md)."""

from __future__ import annotations

import math
import time

import numpy as np

from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM, UnbiasedOGPM
from tests.support import CollectorProcess, MqttClient, session_present
from tests.support import wait_for_api as wait_until  # every wait here asks the API

AGENTS = [f"d{i}" for i in range(6)]
CHANNELS = {
    "x": (ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0), "linear"),
    "xu": (UnbiasedOGPM(epsilon=2.0, low=-2.0, high=2.0), "linear"),
    "yaw": (CircularOGPM(epsilon=1.0), "circular"),
}
SEQS = 120
SHARD = {"claims_seconds": 0.2, "peer_timeout_seconds": 2, "state_seconds": 1}


class Publisher:
    """Reports of several agents, re-published copies and late replays, all remembered."""

    def __init__(self, broker, rng):
        self.rng = rng
        self.sent: list[tuple[str, bytes]] = []
        self.values: dict[str, int] = {name: 0 for name in CHANNELS}
        self.copies = 0
        self.client = MqttClient(broker, v5=False).connect()
        self.t0 = time.time() - 3600  # report times within what a collector accepts

    def publish(self, topic, payload):
        self.client.publish(topic, payload)

    def seqs(self, seqs):
        for seq in seqs:
            for agent in AGENTS:
                for channel, (mechanism, kind) in CHANNELS.items():
                    truth = self.rng.uniform(-1.9, 1.9, 20) if kind == "linear" else \
                        self.rng.vonmises(1.0, 2.0, 20)
                    codes = mechanism.perturb_codes(truth, self.rng).tolist()
                    message = (protocol.data_topic("demo", agent, channel),
                               protocol.report(agent=agent, channel=channel, kind=kind, seq=seq,
                                               t=self.t0 + seq, dt=1.0,
                                               mechanism=mechanism.describe(), codes=codes))
                    self.publish(*message)
                    self.sent.append(message)
                    self.values[channel] += len(codes)
                    if self.rng.random() < 0.1:  # a re-send right away, as after a reconnect
                        self.publish(*message)
                        self.copies += 1
            time.sleep(0.01)
        self.flush()

    def replay(self, n):
        """Old reports again (an agent re-sending its spool after a restart)."""
        for i in self.rng.choice(len(self.sent), n, replace=False):
            self.publish(*self.sent[i])
        self.copies += n
        self.flush()

    def flush(self):
        self.client.flush(30)


def comparable(channel):
    """A channel's API entry; the float sums of angles depend on the order of summation."""
    channel = dict(channel)
    if channel["kind"] == "circular":
        for key in ("circular_mean", "resultant_length", "circular_std"):
            channel.pop(key)
    return channel


def test_shards_merged_equal_one_collector_through_a_kill(tmp_path, mosquitto):
    started = time.monotonic()
    single = CollectorProcess(tmp_path, mosquitto, name="single").start()
    shards = [CollectorProcess(tmp_path, mosquitto, name=f"s{i}", checkpoint_seconds=1.0,
                               broker_settings={"client_id": f"shard-{i}", "shared_group": "g"},
                               shard={**SHARD, "name": f"s{i}", **(
                                   {"serve_merged": True} if i == 0 else {})}).start()
              for i in range(3)]
    merge = CollectorProcess(tmp_path, mosquitto, name="merge", command="merge",
                             broker_settings={"client_id": "merge", "shared_group": "g"}).start()
    publisher = Publisher(mosquitto, np.random.default_rng(11))

    publisher.seqs(range(0, 40))
    shards[1].kill()  # SIGKILL mid-stream
    publisher.seqs(range(40, 80))
    # The broker keeps round-robining to the dead shard's persistent session: its
    # share waits there, so the merged view lags the single collector meanwhile.
    values_so_far = sum(publisher.values.values())
    assert wait_until(lambda: single.api()["ingest"]["values"] == values_so_far, 60)
    time.sleep(3)
    lagging = merge.api()["ingest"]["values"]
    assert 0 < lagging < values_so_far
    shards[1].start()
    publisher.seqs(range(80, SEQS))
    publisher.replay(60)

    def counts(process):
        channels = process.api()["channels"]
        return {name: channels.get(name, {}).get("count") for name in CHANNELS}

    assert wait_until(lambda: counts(single) == publisher.values, 60), \
        (counts(single), publisher.values)
    assert wait_until(lambda: counts(merge) == publisher.values, 60), \
        (counts(merge), publisher.values, merge.api()["shards"])
    time.sleep(2)  # nothing more arrives: counts stay exact
    one, merged = single.api(), merge.api()
    assert merged["ingest"]["messages"] == one["ingest"]["messages"] == len(publisher.sent)
    assert merged["ingest"]["values"] == one["ingest"]["values"] == sum(publisher.values.values())
    assert one["ingest"]["duplicates"] == publisher.copies
    # Copies on other shards are dropped there; redeliveries to the killed shard too.
    assert merged["ingest"]["duplicates"] >= publisher.copies
    for name in CHANNELS:
        assert comparable(merged["channels"][name]) == comparable(one["channels"][name]), name
    yaw, yaw_one = merged["channels"]["yaw"], one["channels"]["yaw"]
    assert math.isclose(yaw["circular_mean"], yaw_one["circular_mean"], rel_tol=1e-12)
    assert math.isclose(yaw["resultant_length"]["raw"], yaw_one["resultant_length"]["raw"],
                        rel_tol=1e-12)
    for name in ("x", "xu"):  # the windows too
        assert merge.api(f"/api/channels/{name}") == single.api(f"/api/channels/{name}") | {
            "windows": merge.api(f"/api/channels/{name}")["windows"]}
        assert merge.api(f"/api/channels/{name}")["windows"] == \
            single.api(f"/api/channels/{name}")["windows"]
    assert {a: (s["messages"], s["values"]) for a, s in merged["agents"].items()} == \
        {a: (s["messages"], s["values"]) for a, s in one["agents"].items()}
    # Per-shard freshness; every shard got a share and holds nothing back.
    assert set(merged["shards"]) == {"s0", "s1", "s2"} and merged["shard_rejects"] == {}
    assert all(s["messages"] > 0 and s["age"] < 10 and not s["stale"]
               for s in merged["shards"].values())
    assert sum(s["messages"] for s in merged["shards"].values()) == len(publisher.sent)
    for shard in shards:
        document = shard.api()
        assert document["shard"]["held"] == 0
        assert all(peer["live"] for peer in document["shard"]["peers"].values())
    # A shard with serve_merged shows the merged view as well.
    served = shards[0].api()
    assert {name: served["channels"][name]["count"] for name in CHANNELS} == publisher.values
    assert comparable(served["channels"]["x"]) == comparable(one["channels"]["x"])
    print(f"\nscale-out e2e: {len(publisher.sent)} reports + {publisher.copies} copies, "
          f"merged duplicates {merged['ingest']['duplicates']}, "
          f"state bytes {[s['bytes'] for s in merged['shards'].values()]}, "
          f"{time.monotonic() - started:.1f} s")
    for process in (merge, *shards, single):
        assert process.terminate() == 0


def test_a_retiring_shard_drains_its_queue_and_leaves_the_group(tmp_path, mosquitto):
    """Mosquitto round-robins to a dead member's session and loses that share when the
    session expires; retiring takes the queued share, then ends the session."""
    def shard(i, **extra):
        return CollectorProcess(tmp_path, mosquitto, name=f"s{i}", checkpoint_seconds=1.0,
                                broker_settings={"client_id": f"shard-{i}", "shared_group": "g"},
                                shard={**SHARD, "name": f"s{i}", **extra})

    s0, s1 = shard(0).start(), shard(1).start()
    merge = CollectorProcess(tmp_path, mosquitto, name="merge", command="merge",
                             broker_settings={"client_id": "merge"}).start()
    publisher = Publisher(mosquitto, np.random.default_rng(5))
    publisher.seqs(range(0, 10))
    s1.kill()
    publisher.seqs(range(10, 30))  # half of these wait in s1's session
    total = sum(publisher.values.values())
    time.sleep(3)
    assert merge.api()["ingest"]["values"] < total
    s1 = shard(1, retiring=True).start()  # same client id: the same session
    assert wait_until(lambda: merge.api()["ingest"]["values"] == total, 60)
    assert s1.api()["shard"]["retiring"] is True
    # The API's documents are snapshots: wait for s1's to show what the merge view has.
    assert wait_until(lambda: s1.api()["ingest"]["messages"]
                      == merge.api()["shards"]["s1"]["messages"] > 0, 10)
    s1_messages = s1.api()["ingest"]["messages"]
    publisher.seqs(range(30, 40))  # s1 left the group: everything goes to s0
    assert s1.terminate() == 0  # and its session ends
    assert session_present(mosquitto, "shard-1") is False
    publisher.seqs(range(40, 50))
    total = sum(publisher.values.values())
    assert wait_until(lambda: merge.api()["ingest"]["values"] == total, 60), \
        (merge.api()["ingest"], total)
    shards = merge.api()["shards"]
    assert shards["s1"]["messages"] == s1_messages  # its last state stays in the merge
    assert shards["s0"]["messages"] + shards["s1"]["messages"] == len(publisher.sent)
    for process in (merge, s0):
        assert process.terminate() == 0
    assert session_present(mosquitto, "shard-0") is True  # an ordinary stop keeps it
