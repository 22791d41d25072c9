"""What taking a series' smoothing choice again costs in accuracy, and saves in time.

The collector chooses a histogram's smoothing by cross-validation (16 EM fits, about half
of one window's estimate) and its next estimates of similar counts take that choice again
(``collector.estimation.estimators.SmoothingMemo``).  This benchmark estimates streams of
windows from the real recordings of ``bench_accuracy`` (BasicMotions) both ways, each
window through the collector's own blocks, and compares them window by window:

* ``steady``: every window draws from the whole recording;
* ``changing``: the wearers change activity every 7 windows (standing, walking, running,
  badminton, in turn), out of step with the choice's refresh.

Scores per (data set, mechanism, epsilon, N): the reconstructed histogram's L1 distance
to the window's true histogram and the chosen mean's absolute error, averaged over the
windows of ``--repetitions`` streams, with the memo against fresh choices; and the CPU
time of each.

Run: ``python -m benchmarks.bench_smoothing [--windows 42] [--repetitions 3]
[--sizes 500 2500 20000]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from benchmarks.bench_accuracy import GRID_BITS, LINEAR
from benchmarks.machine import describe_machine
from benchmarks.recordings import GYRO_FULL_SCALE, load_basic_motions
from collector.aggregation.blocks import LinearBlock
from collector.estimation.estimators import SmoothingMemo
from edge_agent import protocol
from edge_agent.mechanisms import linear_mechanism

SEED = 20_261
BINS = 50  # [aggregates] histogram_bins' default
ACTIVITIES = ("Standing", "Walking", "Running", "Badminton")
CHANGE_EVERY = 7


@lru_cache(maxsize=1)
def pools() -> dict[str, tuple[float, float, dict[str, np.ndarray]]]:
    """Data set -> (low, high, activity -> readings); "" holds every reading."""
    r = load_basic_motions()
    signals = {"rotation rate": (np.sqrt((r.gyro ** 2).sum(axis=1)), 0.0),
               "pitch rate": (r.gyro[:, 1], -GYRO_FULL_SCALE)}
    out = {}
    for name, (signal, low) in signals.items():
        by_activity = {a: np.clip(signal[r.cases(a)].ravel(), low, GYRO_FULL_SCALE)
                       for a in ACTIVITIES}
        by_activity[""] = np.clip(signal.ravel(), low, GYRO_FULL_SCALE)
        out[name] = (low, GYRO_FULL_SCALE, by_activity)
    return out


def stream(by_activity: dict, regime: str, windows: int, n: int,
           rng: np.random.Generator) -> list[np.ndarray]:
    def pool(w: int) -> np.ndarray:
        if regime == "steady":
            return by_activity[""]
        return by_activity[ACTIVITIES[(w // CHANGE_EVERY) % len(ACTIVITIES)]]
    return [rng.choice(pool(w), size=n, replace=True) for w in range(windows)]


def estimate_windows(description, xs, codes, *, memo: SmoothingMemo | None):
    """Per window: (histogram L1 to the truth, |mean error|, chosen smoothing) and the CPU
    seconds of all of them, estimated in time order."""
    scores = []
    started = time.process_time()
    for x, c in zip(xs, codes):
        block = LinearBlock(description, BINS)
        block.update(c)
        view = block.get(memo)
        truth = np.histogram(x, bins=np.asarray(view["histogram"]["edges"]))[0] / x.size
        l1 = float(np.abs(np.asarray(view["histogram"]["estimate"]) - truth).sum())
        scores.append((l1, abs(view["mean"]["estimate"] - float(x.mean())),
                       view["histogram"]["smoothing"]))
    return scores, time.process_time() - started


def cell(name: str, d: int, regime: str, label: str, epsilon: float, n: int,
         args) -> dict:
    """One (data set, regime, mechanism, epsilon, N): ``args.repetitions`` streams of
    ``args.windows`` windows, estimated with fresh choices and with the memo."""
    low, high, by_activity = pools()[name]
    mechanism = linear_mechanism(LINEAR[label], epsilon=epsilon, low=low, high=high,
                                 grid_bits=GRID_BITS)
    description = protocol.describe(mechanism)
    fresh, kept, fresh_cpu, kept_cpu = [], [], 0.0, 0.0
    for rep in range(args.repetitions):
        rng = np.random.default_rng([SEED, d, len(regime), round(1000 * epsilon), n,
                                     list(LINEAR).index(label), rep])
        xs = stream(by_activity, regime, args.windows, n, rng)
        codes = [mechanism.perturb_codes(x, rng) for x in xs]
        scores, cpu = estimate_windows(description, xs, codes, memo=None)
        fresh, fresh_cpu = fresh + scores, fresh_cpu + cpu
        scores, cpu = estimate_windows(description, xs, codes, memo=SmoothingMemo())
        kept, kept_cpu = kept + scores, kept_cpu + cpu
    return {"l1": np.mean([k[0] for k in kept]) / np.mean([f[0] for f in fresh]),
            "mean": np.mean([k[1] for k in kept]) / np.mean([f[1] for f in fresh]),
            "cpu": kept_cpu / fresh_cpu,
            "differ": sum(k[2] != f[2] for k, f in zip(kept, fresh)), "windows": len(kept)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=42)
    parser.add_argument("--repetitions", type=int, default=3, help="streams per cell")
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 2500, 20000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--mechanisms", nargs="+", default=["OGPM", "PM-C", "SW-C"])
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args()
    lines = ["| data | regime | mechanism | eps | N | histogram L1, memo / fresh | mean error, "
             "memo / fresh | windows whose smoothing differs | CPU, memo / fresh |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    print(*lines, sep="\n")
    warm = linear_mechanism("ogpm", epsilon=1.0, low=0.0, high=1.0, grid_bits=GRID_BITS)
    x = np.full(100, 0.5)  # compiles the kernels before any timing
    estimate_windows(protocol.describe(warm), [x],
                     [warm.perturb_codes(x, np.random.default_rng(SEED))], memo=None)
    ratios = {"l1": [], "mean": [], "cpu": []}
    for (d, name), regime, label, epsilon, n in itertools.product(
            enumerate(pools()), ("steady", "changing"), args.mechanisms, args.epsilons,
            args.sizes):
        r = cell(name, d, regime, label, epsilon, n, args)
        for key, values in ratios.items():
            values.append(r[key])
        lines.append(f"| {name} | {regime} | {label} | {epsilon:g} | {n:,} | {r['l1']:.3f} | "
                     f"{r['mean']:.3f} | {r['differ']} of {r['windows']} | {r['cpu']:.2f} |")
        print(lines[-1], flush=True)
    lines.append("")
    for key, values in ratios.items():
        values = np.asarray(values)
        lines.append(f"{key}: median {np.median(values):.3f}, geometric mean "
                     f"{math.exp(np.log(values).mean()):.3f}, worst {values.max():.3f}, "
                     f"best {values.min():.3f}")
        print(lines[-1])
    if args.markdown:
        args.markdown.write_text(f"Machine: {describe_machine()}\n\n" + "\n".join(lines)
                                 + "\n")


if __name__ == "__main__":
    main()
