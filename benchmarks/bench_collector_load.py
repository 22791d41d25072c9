"""Collector ingest with viewers attached, and its memory after the hostile corpus.

Viewers: ``--messages`` reports of 500 codes are queued on a private Mosquitto for
the collector's offline session; a collector process (``edge-collector run``)
then drains them, once with nobody watching and once with 50 open event streams
and 10 API requests a second (``benchmarks.viewers``, in a process of its own,
started before the collector subscribes), alternating ``--runs`` times.  The
drain is timed from the network process's subscription to the last message
applied (the aggregator's progress in the SQLite file, polled every 20 ms).  Goal:
with viewers, at least 90% of the rate without.  The viewers' request latencies
give the API's median and 95th percentile under that load.

Hostile corpus: a collector next to a 4-agent fleet takes tests/support/hostile.py
(2,000+ messages); its resident memory (main and network processes) before and
after, and the largest API latency meanwhile.

Run: ``python -m benchmarks.bench_collector_load [--messages 40000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.bench_collector import FLEET, make_messages, persistent_session, publish_all
from benchmarks.machine import describe_machine
from tests.support import (
    REPO,
    Mosquitto,
    child_env,
    collector_config,
    free_port,
    hostile,
    write_agent_config,
    write_toml,
)
from tests.support.processes import python_module

STREAMS, REQUESTS_PER_SECOND = 50, 10


def start_collector(broker: Mosquitto, workdir: Path, http_port: int, **tables) -> subprocess.Popen:
    config = write_toml(workdir / "collector.toml", collector_config(
        broker, fleet=tables.pop("fleet", FLEET), broker_settings={"client_id": "collector"},
        http={"host": "127.0.0.1", "port": http_port},
        storage={"path": str(workdir / "collector.sqlite"), "checkpoint_seconds": 10},
        **tables))
    with (workdir / "collector.log").open("ab") as log:
        return subprocess.Popen(python_module("collector", "run", "--config", config),
                                stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO)


def progress(path: Path) -> tuple[int, float | None]:
    """(journal rows applied, when the network process subscribed) from the SQLite file."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return 0, None
    try:
        applied = db.execute("SELECT position FROM progress WHERE id = 1").fetchone()
        network = db.execute("SELECT subscribed, since FROM network WHERE id = 1").fetchone()
    except sqlite3.Error:
        return 0, None
    finally:
        db.close()
    since = network[1] if network and network[0] else None
    return (applied[0] if applied else 0), since


def wait_http(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/channels", timeout=2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the collector's API did not answer")


def drain(broker: Mosquitto, messages, workdir: Path, viewers: bool) -> tuple[float, dict | None]:
    """Seconds to drain ``messages`` (and what the viewers measured)."""
    workdir.mkdir()
    persistent_session(broker, "collector")
    publish_all(broker, messages)
    http_port = free_port()
    collector = start_collector(broker, workdir, http_port)
    viewer = None
    try:
        wait_http(http_port)
        if viewers:
            out = workdir / "viewers.json"
            viewer = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.viewers", "--port", str(http_port),
                 "--streams", str(STREAMS), "--rate", str(REQUESTS_PER_SECOND),
                 "--out", str(out)], cwd=REPO, env=child_env())
            time.sleep(2)  # streams open, requests flowing
        database = workdir / "collector.sqlite"
        while True:
            applied, since = progress(database)
            if applied >= len(messages):
                break
            time.sleep(0.02)
        elapsed = time.time() - since
        measured = None
        if viewer is not None:
            time.sleep(2)
            viewer.send_signal(signal.SIGTERM)
            viewer.wait(60)
            measured = json.loads(out.read_text())
        return elapsed, measured
    finally:
        if viewer is not None and viewer.poll() is None:
            viewer.kill()
        collector.send_signal(signal.SIGTERM)
        collector.wait(60)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def family(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        return [pid, *map(int, listed.read().split())]


def api_seconds(port: int, path: str = "/api/channels") -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        response.read()
    return time.perf_counter() - started


def hostile_memory(broker: Mosquitto, workdir: Path) -> dict:
    """RSS before and after the corpus, next to a fleet, and the API's worst latency."""
    from tests.support import FleetProcess, MqttClient

    workdir.mkdir()
    registry = workdir / "agents.txt"
    registry.write_text("\n".join(hostile.REGISTRY) + "\n")
    http_port = free_port()
    collector = start_collector(broker, workdir, http_port, fleet=hostile.FLEET,
                                limits=hostile.LIMITS,
                                registry={"agents": "registered", "file": str(registry)})
    fleet = FleetProcess(write_agent_config(
        workdir / "fleet.toml", agent_id="w", broker=broker, state_dir=workdir / "fleet",
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50, "duration": 30.0}],
        channels=list(hostile.FLEET_CHANNELS.values())), workdir / "fleet.log", 4).start()
    attacker = MqttClient(broker, v5=False).connect()
    try:
        wait_http(http_port)
        time.sleep(8)  # the fleet reporting, first checkpoint written
        pids = family(collector.pid)
        before = sum(map(rss_kb, pids))
        corpus = hostile.build(time.time(), [])
        worst = 0.0
        for i, entry in enumerate(corpus):
            attacker.publish(entry.topic, entry.payload, retain=entry.retain)
            if i % 100 == 0:
                worst = max(worst, api_seconds(http_port))
        attacker.flush(120)
        time.sleep(5)
        worst = max(worst, api_seconds(http_port))
        after = sum(map(rss_kb, pids))
        return {"messages": len(corpus), "kinds": len({e.kind for e in corpus}),
                "before_mb": before / 1024, "after_mb": after / 1024, "worst_api_s": worst}
    finally:
        attacker.close()
        fleet.kill()
        collector.send_signal(signal.SIGTERM)
        collector.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    messages = make_messages(args.messages, 500)
    rates: dict[bool, list[float]] = {False: [], True: []}
    latencies: list[float] = []
    events, failures = [], []
    with tempfile.TemporaryDirectory() as tmp, \
            Mosquitto(Path(tmp), max_queued_messages=0) as broker:
        for run in range(args.runs):
            for viewers in (False, True):
                seconds, measured = drain(broker, messages,
                                          Path(tmp) / f"run{run}-{int(viewers)}", viewers)
                rates[viewers].append(args.messages / seconds)
                if measured is not None:
                    latencies += measured["latencies"]
                    events.append(min(measured["events"]))
                    failures += measured["failures"]
        corpus = hostile_memory(broker, Path(tmp) / "hostile")
    print(f"Machine: {describe_machine()}, {os.cpu_count()} cores\n")
    print(f"{args.messages:,} reports of 500 codes drained by a collector process, "
          f"alternating, {args.runs} runs each:\n")
    print("| viewers | messages/s (each run) | median | share of none |")
    print("|---|---|---:|---:|")
    none = statistics.median(rates[False])
    for viewers, label in ((False, "none"),
                           (True, f"{STREAMS} event streams + {REQUESTS_PER_SECOND} "
                                  "requests/s")):
        median = statistics.median(rates[viewers])
        print(f"| {label} | {', '.join(f'{r:,.0f}' for r in rates[viewers])} | "
              f"{median:,.0f} | {median / none:.0%} |")
    ms = sorted(1000 * s for s in latencies)
    print(f"\nAPI under that load ({len(ms)} requests, 1 in 5 a channel's detail): median "
          f"{statistics.median(ms):.1f} ms, 95th percentile {ms[int(0.95 * (len(ms) - 1))]:.1f}"
          f" ms, max {ms[-1]:.1f} ms; {len(failures)} failed; every stream received at "
          f"least {min(events)} events per run.")
    for failure, times in collections.Counter(failures).most_common():
        print(f"- failed {times}×: {failure}")
    print(f"\nHostile corpus ({corpus['messages']:,} messages, {corpus['kinds']} kinds) next to "
          f"a 4-agent fleet: collector RSS {corpus['before_mb']:.1f} MB before, "
          f"{corpus['after_mb']:.1f} MB after (+{corpus['after_mb'] - corpus['before_mb']:.1f}"
          f" MB); slowest API answer meanwhile {1000 * corpus['worst_api_s']:.0f} ms.")


if __name__ == "__main__":
    main()
