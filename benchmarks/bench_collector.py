"""Collector ingest throughput against a bare paho subscriber, and end-to-end latency.

Throughput: ``--messages`` reports of ``--batch`` codes each are queued on a
private Mosquitto for an offline persistent session, then a subscriber
connects and drains the queue; the time from connecting to the last message
is measured (for the collector, from its network process's subscription;
the one-off process start-up is shown separately).  Once for a bare paho
subscriber that only counts messages (QoS 1, automatic acks), once for the
collector (validation, dedup, series updates, journal commits, manual acks
after each commit), same broker, same messages.  Goals: the collector at >= 90%
of the bare rate and >= 1 million values/s with 500-value batches.

Latency: one report is published at a time and the API is polled until it
counts it; the agent's own batching (``batch_seconds``) comes on top.

Run: ``python -m benchmarks.bench_collector [--messages 10000]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from benchmarks.machine import describe_machine
from collector.config import parse_collector_config
from collector.service import CollectorService
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import Mosquitto, MqttClient, collector_config, free_port

FLEET = "bench"


def make_messages(count: int, batch: int, agents: int = 20) -> list[tuple[str, bytes]]:
    mech = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
    rng = np.random.default_rng(0)
    t0 = time.time() - 3600  # within the collector's [limits] (an hour old, 1 ms apart)
    messages = []
    for i in range(count):
        agent = f"a{i % agents}"
        codes = rng.integers(0, 1 << 16, batch).tolist()
        payload = protocol.report(agent=agent, channel="x", kind="linear", seq=i // agents,
                                  t=t0 + i * 1e-3, dt=1.0, mechanism=mech.describe(),
                                  codes=codes)
        messages.append((protocol.data_topic(FLEET, agent, "x"), payload))
    return messages


def persistent_session(broker: Mosquitto, client_id: str) -> None:
    """Create the offline session the messages will be queued for."""
    client = MqttClient(broker, client_id=client_id, persistent=True).connect()
    client.subscribe(protocol.data_subscription(FLEET))
    client.close()


def publish_all(broker: Mosquitto, messages) -> None:
    client = MqttClient(broker)
    client.client.max_inflight_messages_set(1000)
    client.connect()
    for topic, payload in messages:
        client.publish(topic, payload)
    client.flush(60 + len(messages) / 100)
    client.close()


def drain_bare(port: int, count: int) -> float:
    """A paho subscriber that only counts: the baseline, kept free of any bookkeeping."""
    done = threading.Event()
    received = [0]
    started = [0.0]

    def on_message(client, userdata, message):
        received[0] += 1
        if received[0] == count:
            done.set()

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bare",
                         protocol=mqtt.MQTTv5)
    client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    properties.ReceiveMaximum = 65535
    started[0] = time.perf_counter()
    client.connect("127.0.0.1", port, clean_start=False, properties=properties)
    client.loop_start()
    done.wait(600)
    elapsed = time.perf_counter() - started[0]
    client.disconnect()
    client.loop_stop()
    return elapsed


def bench_collector_config(broker: Mosquitto, path: Path, http_port: int = 0):
    return parse_collector_config(collector_config(
        broker, fleet=FLEET, broker_settings={"client_id": "collector"},
        http={"host": "127.0.0.1", "port": http_port},
        storage={"path": str(path), "checkpoint_seconds": 10},
        snapshots={"interval_seconds": 0}))


def drain_collector(broker: Mosquitto, count: int, path: Path) -> tuple[float, float]:
    """Seconds from start() and from the network process's subscription to the last message.

    The first includes spawning the network process (a one-off at service
    start); the second is the steady-state drain comparable to the bare client.
    """
    service = CollectorService(bench_collector_config(broker, path), web=False)
    started = time.perf_counter()
    service.start()
    while service.ingestor.counters["messages"] < count:
        time.sleep(0.002)
    finished_wall, elapsed = time.time(), time.perf_counter() - started
    subscribed_at = service.store.network()["since"]
    service.stop()
    return elapsed, finished_wall - subscribed_at


def latency(broker: Mosquitto, path: Path, trials: int) -> list[float]:
    http_port = free_port()
    service = CollectorService(bench_collector_config(broker, path, http_port), web=True)
    service.start()
    deadline = time.monotonic() + 10
    while not service.connected and time.monotonic() < deadline:
        time.sleep(0.01)
    client = MqttClient(broker, v5=False).connect()
    mech = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
    url = f"http://127.0.0.1:{http_port}/api/channels"
    samples = []
    for seq in range(trials):
        payload = protocol.report(agent="lat", channel="y", kind="linear", seq=seq, t=time.time(),
                                  dt=1.0, mechanism=mech.describe(), codes=[1, 2, 3])
        started = time.perf_counter()
        client.publish(protocol.data_topic(FLEET, "lat", "y"), payload)
        while True:
            with urllib.request.urlopen(url) as response:
                document = json.loads(response.read())
            if document["channels"].get("y", {}).get("count", 0) >= 3 * (seq + 1):
                break
        samples.append(time.perf_counter() - started)
    client.close()
    service.stop()
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--latency-trials", type=int, default=50)
    args = parser.parse_args()
    messages = make_messages(args.messages, args.batch)
    values = args.messages * args.batch
    with tempfile.TemporaryDirectory() as tmp, \
            Mosquitto(Path(tmp), max_queued_messages=0, verbose=True) as broker:
        tmp = Path(tmp)
        persistent_session(broker, "bare")
        publish_all(broker, messages)
        bare = drain_bare(broker.port, args.messages)
        persistent_session(broker, "collector")
        publish_all(broker, messages)
        ours_total, ours = drain_collector(broker, args.messages, tmp / "state.sqlite")
        lat = latency(broker, tmp / "latency.sqlite", args.latency_trials)
    print(f"Machine: {describe_machine()}\n")
    print(f"{args.messages:,} reports of {args.batch} codes ({values:,} values), queued on a "
          "local Mosquitto, drained by:\n")
    print("| subscriber | seconds | messages/s | values/s | share of bare |")
    print("|---|---:|---:|---:|---:|")
    print(f"| bare paho (counts only) | {bare:.2f} | {args.messages / bare:,.0f} | "
          f"{values / bare:,.0f} | 100% |")
    print(f"| collector (validate, dedup, aggregate, journal, ack) | {ours:.2f} | "
          f"{args.messages / ours:,.0f} | {values / ours:,.0f} | {bare / ours:.0%} |")
    print(f"| collector, including its {ours_total - ours:.1f} s start-up | {ours_total:.2f} | "
          f"{args.messages / ours_total:,.0f} | {values / ours_total:,.0f} | "
          f"{bare / ours_total:.0%} |")
    lat_ms = sorted(1000 * s for s in lat)
    print(f"\nLatency from publishing a report to the API counting it ({len(lat_ms)} trials): "
          f"median {statistics.median(lat_ms):.1f} ms, "
          f"95th percentile {lat_ms[int(0.95 * (len(lat_ms) - 1))]:.1f} ms "
          "(plus the agent's batch_seconds).")


if __name__ == "__main__":
    main()
