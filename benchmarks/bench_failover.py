"""Scale-out failover and takeover times, against the bounds the configuration sets.

While 16 agents stream at 10 Hz through an ingress, two members and the merge view (a
real Mosquitto, a real 3-node NATS cluster on loopback, every role a process): SIGKILL
the node leading the stream, then a member (the node stays down).  Each time is from
the kill until the merged API counts every report published before it and in the 3 s
after it.

* the node leading the stream: below ``lease_seconds`` (no lease expires, so no
  partition moves);
* a member: ``lease_seconds`` × 1.25 + ``checkpoint_seconds`` + ``SLACK_SECONDS`` (its
  leases expire, the survivor's next renewal, every ``lease_seconds`` / 4, takes them;
  then its catch-up of their reports, a checkpoint and the merge view's push).

tests/collector/scaleout/test_scale_out.py checks that both happen (no partition moves
in a node failover; the survivor takes every partition); this measures how long they
take, with ``--runs`` runs side by side.

Run: ``python -m benchmarks.bench_failover [--runs 3] [--lease 30]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.machine import describe_machine
from tests.support import Mosquitto, wait_for_api
from tests.support.nats import NatsCluster
from tests.support.scaleout import PARTITIONS, STREAM, ingress, member, merge_view
from tests.support.streams import SteadyStream

CHECKPOINT_SECONDS = 0.5
TRAFFIC_SECONDS = 3.0  # reports published after each kill, counted with those before it
SLACK_SECONDS = 15.0  # a takeover's catch-up and the merge view's push (docs/guides/SCALE_OUT.md)
GUARD_SECONDS = 600.0  # a run that does not catch up in this long is reported as failed


def one_run(workdir: Path, lease: float) -> dict:
    settings = {"lease_seconds": lease, "checkpoint_seconds": CHECKPOINT_SECONDS}
    broker = Mosquitto(workdir).start()
    cluster = NatsCluster(workdir / "nats").start()
    processes, stream = [], None
    try:
        processes.append(ingress(workdir, broker, cluster, **settings).start())
        members = [member(workdir, broker, cluster, f"m{i}", **settings).start()
                   for i in range(2)]
        processes += members
        merge = merge_view(workdir, broker, cluster, **settings)
        processes.append(merge)
        stream = SteadyStream(broker, agents=16, rate=10.0, seed=5).start()

        def caught_up(since: float) -> float:
            """Seconds from ``since`` until the merged view counts every report of a phase
            that ran from before ``since`` to ``TRAFFIC_SECONDS`` after it (reports go on
            during the failover)."""
            time.sleep(max(0.0, since + TRAFFIC_SECONDS - time.monotonic()))
            phase = stream.next_phase()
            if not wait_for_api(lambda: stream.counted(merge.api(), phase)
                                == stream.sent[phase], GUARD_SECONDS):
                raise RuntimeError(f"phase {phase} not counted in {GUARD_SECONDS:.0f} s")
            return time.monotonic() - since

        def owners() -> dict:
            return {name: p["owner"] for name, p in merge.api()["partitions"].items()}

        caught_up(time.monotonic())
        wait_for_api(lambda: len(owners()) == PARTITIONS, GUARD_SECONDS)
        before = owners()
        killed = time.monotonic()
        cluster.kill(cluster.stream_leader(STREAM))
        failover = caught_up(killed)
        moved = sum(owners()[name] != owner for name, owner in before.items())
        killed = time.monotonic()
        members[1].kill()
        takeover = caught_up(killed)
        return {"failover": failover, "moved": moved, "takeover": takeover}
    finally:
        if stream is not None:
            stream.stop()
        for process in processes:
            if process.running():
                process.kill()
        cluster.stop()
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lease", type=float, default=30.0, help="lease_seconds")
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as workdir:
            runs.append(one_run(Path(workdir), args.lease))
        print(f"run {i + 1}: node failover {runs[-1]['failover']:.1f} s "
              f"({runs[-1]['moved']} partitions moved), member takeover "
              f"{runs[-1]['takeover']:.1f} s", flush=True)
    failover_bound = args.lease
    takeover_bound = args.lease * 1.25 + CHECKPOINT_SECONDS + SLACK_SECONDS
    print(f"\nMachine: {describe_machine()}")
    print(f"lease_seconds {args.lease:g}, checkpoint_seconds {CHECKPOINT_SECONDS:g}\n")
    print("| what is killed | bound | measured | within |")
    print("|---|---|---|---|")
    for key, name, bound in (("failover", "the node leading the stream", failover_bound),
                             ("takeover", "a member (the node stays down)", takeover_bound)):
        times = [run[key] for run in runs]
        shown = ", ".join(f"{t:.1f}" for t in times)
        within = sum(t <= bound for t in times)
        print(f"| {name} | {bound:.1f} s | {shown} s | {within} of {len(times)} |")
    print(f"\npartitions moved by a node failover: {[run['moved'] for run in runs]} "
          "(0 expected)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
