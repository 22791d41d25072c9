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
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.machine import describe_machine
from collector.config import parse_collector_config
from collector.range.coordinator import RangeCoordinator, RunRequest, connect_client
from tests.support import (
    FleetProcess,
    Mosquitto,
    Subscriber,
    collector_config,
    wait_until,
    write_agent_config,
)

WIDTH = 0.3


def agent_config(path: Path, broker: Mosquitto, csv: Path, state: Path) -> Path:
    return write_agent_config(
        path, broker=broker, agent_id="b", fleet="bench", batch_seconds=1.0, budget=1e6,
        state_dir=state, privacy={"range_epsilon_max": 20.0},
        sources=[{"name": "rec", "type": "csv", "path": str(csv), "pace": "fast",
                  "columns": {"x": "x"}}],
        channels=[{"name": "x", "source": "rec", "field": "x", "kind": "linear",
                   "epsilon": 1.0, "domain": [-1.0, 1.0]}])


def wait_for_fleet(broker: Mosquitto, n: int, timeout: float = 600.0) -> None:
    """Until all N virtual agents have published an online status (start-up is slow at 16k)."""
    online: set[str] = set()

    def on_message(message):
        try:
            if json.loads(message.payload).get("state") == "online":
                online.add(message.topic)
        except ValueError:
            pass

    client = Subscriber(broker, "ldp/v1/bench/+/status", on_message=on_message)
    wait_until(lambda: len(online) >= n, timeout, interval=0.5)
    client.close()
    time.sleep(2.0)  # one more batch: every agent has read its row
    if len(online) < n:
        raise RuntimeError(f"only {len(online)} of {n} agents came online")


def sweep(n: int, runs: int, broker: Mosquitto, tmp: Path, rng) -> list[tuple]:
    x_min = rng.uniform(-1.0, 1.0 - WIDTH)
    values = x_min + WIDTH * rng.random(n)
    csv = tmp / f"rows-{n}.csv"
    csv.write_text("x\n" + "\n".join(f"{v:.9f}" for v in values) + "\n")
    config = agent_config(tmp / f"agent-{n}.toml", broker, csv, tmp / f"state-{n}")
    fleet = FleetProcess(config, tmp / f"fleet-{n}.log", n, "--keep-running").start()
    rows = []
    try:
        wait_for_fleet(broker, n)
        for epsilon in (1.0, 4.0):
            for strategy in ("sequential", "split"):
                settings = parse_collector_config(collector_config(
                    broker, fleet="bench",
                    range_discovery={"epsilon": epsilon, "strategy": strategy,
                                     "alpha_min": 1.0, "join_timeout_seconds": 120,
                                     "round_timeout_seconds": 120, "min_participants": 1,
                                     "window_seconds": 86400}))
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
        fleet.terminate(120)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, \
            Mosquitto(Path(tmp), max_queued_messages=0, verbose=True) as broker:
        for n in args.sizes:
            rows += sweep(n, args.runs, broker, Path(tmp), rng)
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
