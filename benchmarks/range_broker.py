"""Range discovery through a real broker: error and duration against N.

The whole path: a private Mosquitto, ``edge-agent fleet --count N`` (N virtual
agents replaying one CSV, one row each), and the collector's
``RangeCoordinator``.  Fixed data (the paper's "fixed data setting"): the
values are uniform on [x_min, x_min + 0.3] inside [-1, 1]; each run has a
new run id, so new randomized-response noise and a new split assignment.
Alpha is taken as known >= 1 (Corollary 1).

Run: ``python -m benchmarks.range_broker [--runs 4] [--sizes 256 1024 4096 16384]``.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from collector.config import parse_collector_config
from collector.range import RangeCoordinator, RunRequest, connect_client

from .broker import local_mosquitto
from .machine import describe_machine

REPO = Path(__file__).resolve().parents[1]
WIDTH = 0.3


def agent_config(path: Path, port: int, csv: Path, state: Path) -> Path:
    path.write_text(f"""agent_id = "b"
fleet = "bench"
batch_seconds = 1.0
[broker]
host = "127.0.0.1"
port = {port}
[privacy]
budget_epsilon = 1000000.0
state_dir = "{state}"
range_epsilon_max = 20.0
[[sources]]
name = "rec"
type = "csv"
path = "{csv}"
pace = "fast"
columns = {{ x = "x" }}
[[channels]]
name = "x"
source = "rec"
field = "x"
kind = "linear"
epsilon = 1.0
domain = [-1.0, 1.0]
""")
    return path


def wait_for_fleet(port: int, n: int, timeout: float = 600.0) -> None:
    """Until all N virtual agents have published an online status (start-up is slow at 16k)."""
    import json

    import paho.mqtt.client as mqtt

    online: set[str] = set()

    def on_message(client, userdata, message):
        try:
            if json.loads(message.payload).get("state") == "online":
                online.add(message.topic)
        except ValueError:
            pass

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.subscribe("ldp/v1/bench/+/status", qos=1)
    client.loop_start()
    deadline = time.monotonic() + timeout
    while len(online) < n and time.monotonic() < deadline:
        time.sleep(0.5)
    client.loop_stop()
    client.disconnect()
    time.sleep(2.0)  # one more batch: every agent has read its row
    if len(online) < n:
        raise RuntimeError(f"only {len(online)} of {n} agents came online")


def sweep(n: int, runs: int, port: int, tmp: Path, rng) -> list[tuple]:
    x_min = rng.uniform(-1.0, 1.0 - WIDTH)
    values = x_min + WIDTH * rng.random(n)
    csv = tmp / f"rows-{n}.csv"
    csv.write_text("x\n" + "\n".join(f"{v:.9f}" for v in values) + "\n")
    config = agent_config(tmp / f"agent-{n}.toml", port, csv, tmp / f"state-{n}")
    log = (tmp / f"fleet-{n}.log").open("wb")
    fleet = subprocess.Popen([sys.executable, "-m", "edge_agent", "fleet", "--config",
                              str(config), "--count", str(n), "--keep-running"],
                             stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    rows = []
    try:
        wait_for_fleet(port, n)
        for epsilon in (1.0, 4.0):
            for strategy in ("sequential", "split"):
                settings = parse_collector_config({
                    "fleet": "bench", "broker": {"host": "127.0.0.1", "port": port},
                    "range_discovery": {"epsilon": epsilon, "strategy": strategy,
                                        "alpha_min": 1.0, "join_timeout_seconds": 120,
                                        "round_timeout_seconds": 120, "min_participants": 1,
                                        "window_seconds": 86400}})
                client = connect_client(settings, f"bench-{n}-{epsilon}-{strategy}")
                coordinator = RangeCoordinator(client, fleet="bench",
                                               settings=settings.range_discovery)
                errors, seconds, participants = [], [], []
                for _ in range(runs):
                    started = time.monotonic()
                    result = coordinator.run(RunRequest("x", "min", -1.0, 1.0),
                                             expected_agents=n)
                    seconds.append(time.monotonic() - started)
                    participants.append(result.get("participants", 0))
                    errors.append(abs(result["estimate"] - values.min())
                                  if result["status"] == "done" else math.nan)
                client.disconnect()
                client.loop_stop()
                rows.append((n, epsilon, strategy, float(np.mean(errors)),
                             float(np.mean(seconds)), min(participants)))
                print(f"N={n} eps={epsilon:g} {strategy}: MAE {rows[-1][3]:.4f}, "
                      f"{rows[-1][4]:.1f} s per run, {rows[-1][5]} participants", flush=True)
    finally:
        fleet.send_signal(signal.SIGTERM)
        fleet.wait(120)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_CACHE_DIR", str(REPO / ".venv" / "numba-cache"))
    rng = np.random.default_rng(7)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, local_mosquitto(Path(tmp)) as port:
        for n in args.sizes:
            rows += sweep(n, args.runs, port, Path(tmp), rng)
    print(f"\nMachine: {describe_machine()}\n")
    print(f"Through Mosquitto with `edge-agent fleet`, {args.runs} runs per row "
          "(fixed data, alpha >= 1):\n")
    print("| N | eps | strategy | MAE of the minimum | seconds per run | participants |")
    print("|---:|---:|---|---:|---:|---:|")
    for n, epsilon, strategy, mae, seconds, participants in rows:
        print(f"| {n:,} | {epsilon:g} | {strategy} | {mae:.4f} | {seconds:.1f} | "
              f"{participants:,} |")


if __name__ == "__main__":
    main()
