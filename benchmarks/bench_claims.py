"""Cost of the shards' claim exchange: claims message size, encode and receive time.

A fleet of ``--agents`` x ``--channels`` (agent, channel) keys reports once a
second per key.  Three shards share it round-robin; this measures one of them
at steady state: every ``--claims-seconds`` it holds the reports that arrived
in the period, applies those of the period before (reports are applied about
two claims periods after arrival), publishes its claims, and checkpoints every
``--checkpoint-seconds``.  A peer's ``ClaimBook`` receives every message, as a
live peer would.  Both sides are the real ``collector.claims.ClaimBook``; only
the broker and the aggregation are left out.

    python -m benchmarks.bench_claims            # the docs/SCALE_OUT.md figures
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

from collector.claims import ClaimBook
from collector.dedup import SeqTracker

from .machine import describe_machine


def run(*, agents: int, channels: int, shards: int, claims_seconds: float,
        checkpoint_seconds: float, seconds: float) -> dict:
    clock = [0.0]
    book = ClaimBook("s1", "g")
    book.configure("s1", "g", peer_timeout=5.0, clock=lambda: clock[0])
    peer = ClaimBook("s2", "g")
    peer.configure("s2", "g", peer_timeout=5.0, clock=lambda: clock[0])
    keys = [(f"wearable-{a:05d}", f"channel-{c}") for a in range(agents) for c in range(channels)]
    trackers = {key: SeqTracker() for key in keys}
    peer_trackers: dict = {}
    periods_per_second = round(1 / claims_seconds)
    checkpoint_every = round(checkpoint_seconds / claims_seconds)
    arriving: list = []
    sizes, encode, receive = [], [], []
    for tick in range(round(seconds / claims_seconds)):
        clock[0] += claims_seconds
        for report in arriving:  # last period's reports are settled now
            del book.held[(report.agent, report.channel, report.seq)]
            trackers[report.agent, report.channel].add(report.seq)
            book.accepted(report)
        arriving = []
        for i, (agent, channel) in enumerate(keys):
            # each key reports once a second; this shard gets every shards-th report
            if (i + tick) % periods_per_second == 0 and (i + tick) % shards == 0:
                report = SimpleNamespace(agent=agent, channel=channel,
                                         seq=tick // periods_per_second)
                book.hold(report, clock[0])
                arriving.append(report)
        if tick % checkpoint_every == checkpoint_every - 1:
            book.promote(book.snapshot())
        started = time.perf_counter()
        payload = book.message(clock[0], trackers)
        encode.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert peer.receive("s1", payload, peer_trackers) == "accepted"
        receive.append(time.perf_counter() - started)
        sizes.append(len(payload))
    warm = slice(2 * checkpoint_every, None)  # past the first checkpoints
    return {"reports_per_second": len(keys) / shards,
            "bytes_mean": statistics.mean(sizes[warm]), "bytes_max": max(sizes[warm]),
            "encode_ms": 1e3 * statistics.mean(encode[warm]),
            "receive_ms": 1e3 * statistics.mean(receive[warm]),
            "bytes_per_second": statistics.mean(sizes[warm]) / claims_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--channels", type=int, default=10)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--claims-seconds", type=float, default=0.5)
    parser.add_argument("--checkpoint-seconds", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    print(f"Machine: {describe_machine()}")
    print(f"{args.shards} shards, {args.channels} channels per agent, one report per second "
          f"per channel, claims every {args.claims_seconds:g} s, checkpoints every "
          f"{args.checkpoint_seconds:g} s\n")
    print("| agents | reports/s per shard | claims message (mean / max) | per second | "
          "encode | receive (one peer) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for agents in args.agents:
        r = run(agents=agents, channels=args.channels, shards=args.shards,
                claims_seconds=args.claims_seconds, checkpoint_seconds=args.checkpoint_seconds,
                seconds=args.seconds)
        print(f"| {agents:,} | {r['reports_per_second']:,.0f} | {r['bytes_mean'] / 1e3:,.0f} kB"
              f" / {r['bytes_max'] / 1e3:,.0f} kB | {r['bytes_per_second'] / 1e3:,.0f} kB/s | "
              f"{r['encode_ms']:.1f} ms | {r['receive_ms']:.1f} ms |")


if __name__ == "__main__":
    main()
