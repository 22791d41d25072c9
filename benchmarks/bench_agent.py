"""The agent's footprint: RSS after warm-up and CPU use at 50 Hz x 10 channels.

Starts a private Mosquitto on a free port, runs ``edge-agent run`` with a
synthetic 50 Hz source feeding 10 channels (linear, circular, polar and
vector, reporting every reading), waits for the warm-up, then samples
/proc/<pid> for ``--seconds``: resident memory and CPU time (user + system)
as a share of one core.  Goals on the reference machine: <= 160 MB RSS and
<= 5% of one core.

Run: ``python -m benchmarks.bench_agent [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from benchmarks.machine import describe_machine
from tests.support import AgentProcess, Mosquitto, write_agent_config

CHANNELS = tomllib.loads("""
[[channels]]
name = "accel_x"
source = "imu"
field = "accel_x"
kind = "linear"
epsilon = 1.0
domain = [-2.0, 2.0]
[[channels]]
name = "accel_y"
source = "imu"
field = "accel_y"
kind = "linear"
mechanism = "ogpm-unbiased"
epsilon = 1.0
domain = [-2.0, 2.0]
[[channels]]
name = "accel_z"
source = "imu"
field = "accel_z"
kind = "linear"
mechanism = "pm"
epsilon = 1.0
domain = [-2.0, 2.0]
[[channels]]
name = "roll"
source = "imu"
field = "roll"
kind = "circular"
epsilon = 1.0
[[channels]]
name = "pitch"
source = "imu"
field = "pitch"
kind = "circular"
epsilon = 1.0
[[channels]]
name = "yaw"
source = "imu"
field = "yaw"
kind = "circular"
epsilon = 1.0
[[channels]]
name = "accel_polar"
source = "imu"
fields = ["accel_h_mag", "accel_h_dir"]
kind = "polar"
epsilon = 3.0
radius_max = 2.0
[[channels]]
name = "accel"
source = "imu"
fields = ["accel_x", "accel_y", "accel_z"]
kind = "vector"
epsilon = 2.0
domain = [-2.0, 2.0]
strategy = "sample"
k = 1
[[channels]]
name = "mag"
source = "imu"
field = "accel_h_mag"
kind = "linear"
mechanism = "sw"
epsilon = 1.0
domain = [0.0, 2.0]
[[channels]]
name = "accel_x_laplace"
source = "imu"
field = "accel_x"
kind = "linear"
mechanism = "laplace"
epsilon = 1.0
domain = [-2.0, 2.0]
""")["channels"]


def first_batch_committed(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return db.execute("SELECT COUNT(*) FROM spending").fetchone()[0] > 0
        finally:
            db.close()
    except sqlite3.Error:
        return False


def proc_sample(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds) of a process."""
    with open(f"/proc/{pid}/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss_kb / 1024.0, (int(fields[11]) + int(fields[12])) / ticks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate-hz", type=float, default=50.0)
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the agent (e.g. a venv with only runtime deps)")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Mosquitto(Path(tmp)) as broker:
        tmp = Path(tmp)
        config = write_agent_config(
            tmp / "agent.toml", broker=broker, agent_id="bench", fleet="bench",
            batch_seconds=1.0, budget=1e9, state_dir=tmp / "state",
            sources=[{"name": "imu", "type": "synthetic", "rate_hz": args.rate_hz}],
            channels=CHANNELS)
        start = time.monotonic()
        agent = AgentProcess(config, tmp / "agent.log", python=args.python,
                             log_level="WARNING").start()
        try:
            # Warm-up is over once the first batch is in the ledger.
            while not first_batch_committed(tmp / "state" / "state.sqlite"):
                if not agent.running():
                    raise SystemExit(f"the agent exited: {agent.output()}")
                time.sleep(0.05)
            first_batch = time.monotonic() - start
            time.sleep(3.0)
            rss0, cpu0 = proc_sample(agent.pid)
            t0 = time.monotonic()
            peak = rss0
            while time.monotonic() - t0 < args.seconds:
                time.sleep(1.0)
                peak = max(peak, proc_sample(agent.pid)[0])
            rss1, cpu1 = proc_sample(agent.pid)
            elapsed = time.monotonic() - t0
        finally:
            agent.terminate(60)
    values_per_second = args.rate_hz * 10
    table = "\n".join([
        f"Machine: {describe_machine()}; agent interpreter: {args.python}",
        "",
        f"Agent, synthetic source at {args.rate_hz:g} Hz, 10 channels "
        f"({values_per_second:g} readings/s reported), batches of 1 s, "
        f"measured for {elapsed:.0f} s after warm-up:",
        "",
        "| measure | value | goal |",
        "|---|---:|---:|",
        f"| start-up to first committed batch (numba cache warm) | {first_batch:.1f} s | |",
        f"| RSS after warm-up | {rss0:.0f} MB | <= 160 MB |",
        f"| RSS peak during the run | {peak:.0f} MB | <= 160 MB |",
        f"| CPU | {100 * (cpu1 - cpu0) / elapsed:.2f}% of one core | <= 5% |",
    ])
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
