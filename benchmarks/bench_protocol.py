"""Decoding a report: the typed protocol (msgspec) against the hand-written parser it replaced.

Both decode the same payloads, side by side in one run: the previous parser
(orjson, then hand-written checks; ``benchmarks.baseline_parse``) and
``edge_agent.protocol.decode_report`` (msgspec decodes and checks the types in
one pass, then the cross-field checks).  Both end with the codes as int64
arrays and the mechanism object, which is what the collector aggregates.
Rounds alternate between the two and the best of ``--rounds`` is kept, so a
busy machine slows both alike.

Run: ``python -m benchmarks.bench_protocol [--markdown docs/benchmarks/bench_protocol.md]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks import baseline_parse
from benchmarks.machine import describe_machine
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM, PolarOGPM, UnbiasedOGPM

FLEET = "bench"


def cases() -> dict[str, tuple[str, bytes]]:
    rng = np.random.default_rng(0)
    linear = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
    polar = PolarOGPM(epsilon=4.0, radius_max=2.0)
    vector = UnbiasedOGPM(epsilon=0.5, low=-1.0, high=1.0)

    def report(channel, kind, mechanism, codes, **extra):
        return (protocol.data_topic(FLEET, "wearable-17", channel),
                protocol.report(agent="wearable-17", channel=channel, kind=kind, seq=123456,
                                t=1.7e9, dt=1.0, mechanism=mechanism.describe(), codes=codes,
                                **extra))

    def codes(n):
        return rng.integers(0, 1 << 16, n).tolist()

    bad = report("x", "linear", linear, codes(499) + [70000])
    vector_report = report("v", "vector", vector, [codes(100), codes(100), codes(100)],
                           fields=["x", "y", "z"], strategy={"k": 3, "d": 3, "epsilon": 1.5})
    return {
        "linear, 500 codes": report("x", "linear", linear, codes(500)),
        "linear, 20 codes": report("x", "linear", linear, codes(20)),
        "polar, 2 x 250 codes": report("p", "polar", polar, [codes(250), codes(250)]),
        "vector, 3 x 100 codes": vector_report,
        "rejected: last code outside the grid": bad,
        "rejected: not JSON (the last 40 bytes cut off)": (bad[0], bad[1][:-40]),
        # The worst cut: right after the last inner object, so it still ends with "}".
        "rejected: vector cut after its strategy": (vector_report[0], vector_report[1][:-1]),
    }


def per_message(decode, topic: str, payload: bytes, iterations: int) -> float:
    """Microseconds per decode (rejections included: they cost as much to find)."""
    started = time.perf_counter()
    for _ in range(iterations):
        try:
            decode(topic, payload, FLEET)
        except (protocol.Rejected, baseline_parse.Rejected):
            pass
    return (time.perf_counter() - started) / iterations * 1e6


def run(rounds: int, iterations: int) -> list[tuple[str, float, float]]:
    rows = []
    for name, (topic, payload) in cases().items():
        baseline, typed = [], []
        for _ in range(rounds):  # alternate, keep the best of each
            baseline.append(per_message(baseline_parse.parse_report, topic, payload, iterations))
            typed.append(per_message(protocol.decode_report, topic, payload, iterations))
        rows.append((name, min(baseline), min(typed)))
    return rows


def markdown(rows, machine: str) -> str:
    lines = [f"Machine: {machine}", "",
             "| report | hand-written parser (µs) | typed protocol (µs) | typed / hand-written |",
             "|---|---:|---:|---:|"]
    lines += [f"| {name} | {old:.1f} | {new:.1f} | {new / old:.2f} |" for name, old, new in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args()
    text = markdown(run(args.rounds, args.iterations), describe_machine())
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
