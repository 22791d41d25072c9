"""Scale-out on NATS JetStream: each tier's rate and CPU per message, members 1/2/4, latency.

On one machine (a real Mosquitto, a real 3-node NATS cluster on loopback, every role
a process, as in production):

1. **Single collector** (reference): ``--messages`` reports of 500 codes, queued for
   its offline MQTT session, drained by ``edge-collector run`` (as
   ``bench_collector_load``).
2. **Ingress**: the same reports queued for the ingress's session, drained into the
   stream: from its subscription until the stream holds them all.  CPU of the ingress
   (both its processes) and of the three NATS servers over that time.
3. **Members**: 1, 2 and 4 ``edge-collector member`` started on the full stream (the
   partition states cleared before each run), with the merge view; from the first
   report the merge view counts to the last.  CPU of the members, NATS and the merge
   view over that time.
4. **Latency**: with the ingress, 2 members and the merge view running, one report at
   a time is published and the merge view's API polled until it counts it; the same
   for a single collector.

CPU is user + system time from /proc, divided by the messages: µs per message per
tier, the figure that extrapolates to more cores and machines (docs/guides/SCALE_OUT.md).

Run: ``python -m benchmarks.bench_scale_out [--messages 40000] [--agents 400]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import nats

from benchmarks.bench_collector import FLEET, make_messages, persistent_session, publish_all
from benchmarks.bench_collector_load import drain as drain_single
from benchmarks.machine import describe_machine
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import (
    REPO,
    Mosquitto,
    MqttClient,
    child_env,
    collector_config,
    free_port,
    write_toml,
)
from tests.support.nats import NatsCluster
from tests.support.processes import python_module

STREAM, PARTITIONS = "bench_reports", 32
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their children so far (0 once gone)."""
    total = 0.0
    for pid in pids:
        for task in [pid, *_children(pid)]:
            try:
                with open(f"/proc/{task}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / TICKS
            except OSError:
                continue
    return total


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listed:
            return [int(child) for child in listed.read().split()]
    except OSError:
        return []


class Role:
    """``edge-collector <command>`` with ``[scale_out]``, its log in the work dir."""

    def __init__(self, workdir: Path, broker: Mosquitto, cluster: NatsCluster, command: str,
                 name: str, http_port: int | None = None):
        tables = {"scale_out": {"servers": cluster.urls, "stream": STREAM,
                                "partitions": PARTITIONS, "member": name,
                                "checkpoint_seconds": 0.5}}
        if http_port is not None:
            tables["http"] = {"host": "127.0.0.1", "port": http_port, "push_seconds": 0.25}
        self.config = write_toml(workdir / f"{name}.toml", collector_config(
            broker, fleet=FLEET, broker_settings={"client_id": name}, **tables))
        self.log = workdir / f"{name}.log"
        self.command, self.url = command, f"http://127.0.0.1:{http_port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> Role:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                python_module("collector", self.command, "--config", self.config),
                stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO)
        return self

    def said(self, text: str) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(self.log.read_text()[-3000:])
        return text in self.log.read_text(errors="replace")

    def messages(self) -> int:
        with urllib.request.urlopen(self.url + "/api/channels", timeout=5) as response:
            return json.loads(response.read())["ingest"]["messages"]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def wait(predicate, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("benchmark step did not finish")


def stream_messages(cluster: NatsCluster) -> int:
    try:
        return cluster.stream_info(STREAM).state.messages
    except nats.errors.Error:
        return 0


def clear_states(cluster: NatsCluster) -> None:
    """Members start from stream sequence 0 again: no partition state, no lease."""
    async def clear() -> None:
        client = await nats.connect(cluster.urls)
        js = client.jetstream()
        for bucket in (f"{STREAM}_state", f"{STREAM}_leases"):
            try:
                await js.delete_key_value(bucket)
            except nats.js.errors.NotFoundError:
                pass
        await client.close()

    asyncio.run(clear())


def ingress_phase(workdir: Path, broker: Mosquitto, cluster: NatsCluster, messages) -> dict:
    persistent_session(broker, "ingress")
    publish_all(broker, messages)
    ingress = Role(workdir, broker, cluster, "ingress", "ingress").start()
    nodes = [server.pid for server in cluster.servers]
    try:
        wait(lambda: ingress.said("MQTT subscription up"), 120)
        started, cpu_ingress, cpu_nats = time.monotonic(), cpu_seconds([ingress.process.pid]), \
            cpu_seconds(nodes)
        wait(lambda: stream_messages(cluster) >= len(messages), 600, interval=0.1)
        seconds = time.monotonic() - started
        return {"rate": len(messages) / seconds,
                "ingress_us": 1e6 * (cpu_seconds([ingress.process.pid]) - cpu_ingress)
                / len(messages),
                "nats_us": 1e6 * (cpu_seconds(nodes) - cpu_nats) / len(messages)}
    finally:
        ingress.stop()


def members_phase(workdir: Path, broker: Mosquitto, cluster: NatsCluster, count: int,
                  total: int) -> dict:
    clear_states(cluster)
    merge = Role(workdir, broker, cluster, "merge", f"merge-{count}", free_port()).start()
    members = []
    nodes = [server.pid for server in cluster.servers]
    try:
        wait(lambda: merge.messages() >= 0, 120)  # its API answers
        cpu_before = {"members": 0.0, "nats": cpu_seconds(nodes),
                      "merge": cpu_seconds([merge.process.pid])}
        members = [Role(workdir, broker, cluster, "member", f"m{count}-{i}").start()
                   for i in range(count)]
        first = wait(lambda: (n := merge.messages()) > 0 and (time.monotonic(), n), 300,
                     interval=0.05)
        last = wait(lambda: merge.messages() >= total and time.monotonic(), 600, interval=0.05)
        members_cpu = cpu_seconds([m.process.pid for m in members])
        return {"members": count, "rate": (total - first[1]) / max(1e-9, last - first[0]),
                "members_us": 1e6 * members_cpu / total,
                "nats_us": 1e6 * (cpu_seconds(nodes) - cpu_before["nats"]) / total,
                "merge_us": 1e6 * (cpu_seconds([merge.process.pid]) - cpu_before["merge"])
                / total}
    finally:
        for role in (*members, merge):
            role.stop()


def latency(publish_to: Mosquitto, counted, trials: int) -> list[float]:
    """Seconds from publishing one report to ``counted()`` including it."""
    mechanism = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
    client = MqttClient(publish_to).connect()
    delays = []
    t0 = time.time() - 60
    try:
        for seq in range(trials):
            before = counted()
            payload = protocol.report(agent="latency", channel="x", kind="linear", seq=seq,
                                      t=t0 + seq * 1e-3, dt=1.0,
                                      mechanism=mechanism.describe(), codes=[1, 2, 3])
            started = time.monotonic()
            client.publish(protocol.data_topic(FLEET, "latency", "x"), payload)
            wait(lambda: counted() > before, 60, interval=0.01)
            delays.append(time.monotonic() - started)
    finally:
        client.close()
    return delays


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--agents", type=int, default=400)
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    messages = make_messages(args.messages, 500, agents=args.agents)
    with tempfile.TemporaryDirectory() as tmp, \
            Mosquitto(Path(tmp), max_queued_messages=0) as broker:
        workdir = Path(tmp)
        single_seconds, _ = drain_single(broker, messages, workdir / "single", viewers=False)
        cluster = NatsCluster(workdir / "nats").start()
        try:
            ingress = ingress_phase(workdir, broker, cluster, messages)
            members = [members_phase(workdir, broker, cluster, count, len(messages))
                       for count in (1, 2, 4)]
            # latency through the whole scale-out path, then a single collector
            entry = Role(workdir, broker, cluster, "ingress", "ingress-latency").start()
            running = [Role(workdir, broker, cluster, "member", f"lat-{i}").start()
                       for i in range(2)]
            merge = Role(workdir, broker, cluster, "merge", "merge-latency", free_port()).start()
            try:
                wait(lambda: entry.said("MQTT subscription up"), 120)
                wait(lambda: merge.messages() >= len(messages), 300)
                scaled = latency(broker, merge.messages, args.trials)
            finally:
                for role in (merge, *running, entry):
                    role.stop()
        finally:
            cluster.stop()
    print(f"Machine: {describe_machine()}\n")
    print(f"{args.messages:,} reports of 500 codes from {args.agents} agents, "
          f"{PARTITIONS} partitions, R3 file storage:\n")
    print("| tier | reports/s | CPU µs per report |")
    print("|---|---:|---|")
    print(f"| single collector (`run`), reference | {args.messages / single_seconds:,.0f} | |")
    print(f"| ingress: MQTT → stream | {ingress['rate']:,.0f} | ingress "
          f"{ingress['ingress_us']:.0f}, NATS (3 nodes) {ingress['nats_us']:.0f} |")
    for run in members:
        print(f"| {run['members']} member(s): stream → partition states → merge view | "
              f"{run['rate']:,.0f} | members {run['members_us']:.0f}, NATS "
              f"{run['nats_us']:.0f}, merge view {run['merge_us']:.0f} |")
    print(f"\nPublish to the merged API ({args.trials} reports, ingress + 2 members + merge "
          f"view, checkpoint_seconds 0.5, push_seconds 0.25): median "
          f"{1000 * statistics.median(scaled):.0f} ms, p95 {1000 * percentile(scaled, 0.95):.0f}"
          f" ms.")


if __name__ == "__main__":
    main()
