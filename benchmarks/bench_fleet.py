"""The fleet simulator's footprint: RSS, CPU and throughput of ``edge-agent fleet``.

For each ``--count`` N: starts a private Mosquitto on a free port and runs
``edge-agent fleet --count N`` with one linear OGPM channel on a synthetic
source at ``--rate-hz`` (10) in 1 s batches, so N virtual agents want
N x rate reports/s in N messages/s.  After the first committed batch and
``--settle`` seconds it samples /proc for ``--seconds``: resident memory,
CPU (user + system, as a share of one core) of the fleet and of the broker,
and from the state file the reports committed and the messages still in the
spool (committed but not yet acknowledged by the broker).

With ``--demo``, each agent is instead the default ``edge-collector demo``'s wearable
(its generated agent configuration: ten planned channels under the sample's guarantees,
``plan_fleet`` N): what the demo's simulator costs for N wearers.  Reports are then
wanted at the plan's rate, one per channel per spacing per agent.

Run: ``python -m benchmarks.bench_fleet --count 1000 --count 16384``, and
``python -m benchmarks.bench_fleet --demo --count 1000 --count 2000 --seconds 60``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import describe_machine
from collector.tools.demo import Demo
from edge_agent.config import load_config
from edge_agent.spending import plan_document
from tests.support import AX_CHANNEL, FleetProcess, Mosquitto, write_agent_config

CHANNEL = {**AX_CHANNEL, "name": "accel_x"}


def state(path: Path) -> tuple[int, int] | None:
    """(reports committed, messages spooled) or None if there is no state yet."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            reports = db.execute("SELECT COALESCE(SUM(reports), 0) FROM spending").fetchone()[0]
            spooled = db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
            return int(reports), int(spooled)
        finally:
            db.close()
    except sqlite3.Error:
        return None


def proc_sample(pid: int) -> tuple[float, float, float]:
    """(RSS in MB, anonymous RSS in MB, CPU seconds) of a process.

    RssAnon is the process's own memory.  The rest of RSS is pages of mapped
    files (mostly numba's 179 MB libllvmlite.so); how many of those count
    depends on the page cache (a freshly installed venv shows ~60 MB more).
    """
    with open(f"/proc/{pid}/status") as f:
        status = {line.split(":")[0]: line.split(":")[1].split() for line in f}
        status = {key: value[0] for key, value in status.items() if value}
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(status["VmRSS"]) / 1024.0, int(status["RssAnon"]) / 1024.0,
            (int(fields[11]) + int(fields[12])) / ticks)


def measure(count: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp, Mosquitto(Path(tmp)) as broker:
        tmp = Path(tmp)
        if args.demo:
            demo = Demo(agents=count, duration=0, http_port=0, broker=None, workdir=tmp)
            config, _ = demo._write_configs("127.0.0.1", broker.port, "5")
            db = tmp / "agents" / "state.sqlite"
            plan = plan_document(load_config(config), fleet=count)
            wanted = count * sum(1 / c["every_seconds"] for c in plan["channels"].values())
        else:
            config = write_agent_config(
                tmp / "fleet.toml", broker=broker, agent_id="sim", fleet="bench",
                batch_seconds=1.0, budget=1e9, state_dir=tmp / "state",
                sources=[{"name": "imu", "type": "synthetic", "rate_hz": args.rate_hz}],
                channels=[CHANNEL])
            db = tmp / "state" / "state.sqlite"
            wanted = count * args.rate_hz
        start = stop = time.monotonic()
        fleet = FleetProcess(config, tmp / "fleet.log", count, python=args.python,
                             log_level="WARNING").start()
        try:
            while not (state(db) or (0, 0))[0]:
                if not fleet.running():
                    raise SystemExit(f"the fleet exited: {fleet.output()}")
                time.sleep(0.2)
            first_batch = time.monotonic() - start
            time.sleep(args.settle)
            rss0, anon0, cpu0 = proc_sample(fleet.pid)
            _, _, broker_cpu0 = proc_sample(broker.pid)
            t0 = time.monotonic()
            peak, anon_peak = rss0, anon0
            # Commits seen as (time, reports): rates between commits, free of the
            # window's edges (a batch covers whatever time has passed since the last).
            commits = [(t0, state(db)[0])]
            next_sample = t0 + 1.0
            while time.monotonic() - t0 < args.seconds:
                time.sleep(0.1)
                reports = state(db)[0]
                if reports != commits[-1][1]:
                    commits.append((time.monotonic(), reports))
                if time.monotonic() >= next_sample:
                    rss, anon, _ = proc_sample(fleet.pid)
                    peak, anon_peak = max(peak, rss), max(anon_peak, anon)
                    next_sample += 1.0
            rss1, anon1, cpu1 = proc_sample(fleet.pid)
            _, _, broker_cpu1 = proc_sample(broker.pid)
            _, spooled = state(db)
            elapsed = time.monotonic() - t0
            stop = time.monotonic()
        finally:
            code = fleet.terminate(600)
            stopped = time.monotonic() - stop
    return {"count": count, "first_batch": first_batch, "rss": rss0, "peak": peak,
            "anon": anon0, "anon_peak": anon_peak,
            "cpu": 100 * (cpu1 - cpu0) / elapsed,
            "broker_cpu": 100 * (broker_cpu1 - broker_cpu0) / elapsed,
            "reports_per_second": ((commits[-1][1] - commits[1][1])
                                   / (commits[-1][0] - commits[1][0])
                                   if len(commits) > 2 else float("nan")),
            "batch_seconds": ((commits[-1][0] - commits[1][0]) / (len(commits) - 2)
                              if len(commits) > 2 else float("nan")),
            "wanted_per_second": wanted, "spooled": spooled,
            "seconds": elapsed, "exit": code, "stop_seconds": stopped}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, action="append",
                        help="virtual agents (repeatable; default 1000 and 16384)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--rate-hz", type=float, default=10.0)
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the fleet (e.g. a venv with only runtime deps)")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--demo", action="store_true",
                        help="agents as the default demo's wearables (planned channels)")
    args = parser.parse_args()
    rows = [measure(count, args) for count in (args.count or [1000, 16384])]
    lines = [
        f"Machine: {describe_machine()}; fleet interpreter: {args.python}", "",
        ("`edge-agent fleet` of the default demo's wearables (10 planned channels, "
         "synthetic source at demo.STUDY_RATE_HZ)" if args.demo else
         f"`edge-agent fleet`, one linear OGPM channel, synthetic source at {args.rate_hz:g} Hz")
        + f", batches of 1 s, measured for {rows[0]['seconds']:.0f} s after the first batch "
        f"+ {args.settle:g} s:", "",
        "| agents | start-up to first batch | RSS (peak) | of which anonymous (peak) "
        "| CPU (fleet) | CPU (broker) | reports/s committed / wanted | mean batch interval "
        "| spool at end | SIGTERM to exit |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['count']:,} | {r['first_batch']:.1f} s | {r['rss']:.0f} MB "
            f"({r['peak']:.0f} MB) | {r['anon']:.0f} MB ({r['anon_peak']:.0f} MB) | "
            f"{r['cpu']:.0f}% | {r['broker_cpu']:.0f}% | "
            f"{r['reports_per_second']:,.1f} / {r['wanted_per_second']:,.1f} | "
            f"{r['batch_seconds']:.2f} s | "
            f"{r['spooled']:,} | {r['stop_seconds']:.1f} s (exit {r['exit']}) |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
