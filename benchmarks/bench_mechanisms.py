"""Mechanism throughput, measured side by side in one run.

For every mechanism and both randomness sources (the OS-seeded CSPRNG and a
seeded PCG64) it prints:

* samples/s of ``perturb`` on a large batch;
* the ratio of ``perturb`` time to the time of only generating the random
  words it consumes (goal <= 2.0: the kernel costs no more than the noise);
* the speed-up over a straightforward per-sample Python implementation of
  the same mechanism drawing from the same kind of source: one
  ``secrets.SystemRandom().random()`` or one ``Generator.random()`` call per
  uniform (goal >= 1000x seeded, >= 200x CSPRNG).

Run: ``python -m benchmarks.bench_mechanisms [--n N] [--markdown FILE]``.
"""

from __future__ import annotations

import argparse
import math
import secrets
import time

import numpy as np

from benchmarks.machine import describe_machine, print_table
from edge_agent.mechanisms import (
    PTT,
    BoundedLaplace,
    CircularOGPM,
    ClassicalOGPM,
    Duchi,
    OptimalGaussian,
    PiecewiseMechanism,
    SquareWave,
    TruncatedLaplace,
    UnbiasedOGPM,
)
from edge_agent.mechanisms.randomness import SeededRandom, SystemRandom
from edge_agent.mechanisms.tent import TypeIIPTT
from edge_agent.mechanisms.tpm import CircularThreePiece, ThreePieceMechanism

EPSILON = 1.0


def mechanisms():
    return {
        "OGPM": ClassicalOGPM(epsilon=EPSILON, low=-2.0, high=2.0),
        "OGPM-U": UnbiasedOGPM(epsilon=EPSILON, low=-2.0, high=2.0),
        "OGPM circular": CircularOGPM(epsilon=EPSILON),
        "PM": PiecewiseMechanism(epsilon=EPSILON, low=-2.0, high=2.0),
        "PM-C": PiecewiseMechanism(epsilon=EPSILON, low=-2.0, high=2.0, compressed=True),
        "SW": SquareWave(epsilon=EPSILON, low=-2.0, high=2.0),
        "PTT": PTT(epsilon=EPSILON, low=-2.0, high=2.0),
        "Duchi": Duchi(epsilon=EPSILON, low=-2.0, high=2.0),
        "T-Laplace": TruncatedLaplace(epsilon=EPSILON, low=-2.0, high=2.0),
        "B-Laplace": BoundedLaplace(epsilon=EPSILON, low=-2.0, high=2.0),
        "II-PTT": TypeIIPTT(epsilon=EPSILON, low=-2.0, high=2.0),
        "Opt-GM (δ 1e-6)": OptimalGaussian(epsilon=EPSILON, delta=1e-6, low=-2.0, high=2.0),
    }


# -- straightforward per-sample implementations (the baseline to beat) ----------------

def per_sample(mech, uniform):
    """A per-sample Python sampler of the continuous mechanism, with ``uniform()`` in [0,1)."""
    if isinstance(mech, CircularThreePiece):
        def one(x):
            if uniform() < mech.p_high * mech.length:
                y = x - mech.length / 2 + uniform() * mech.length
            else:
                y = x + mech.length / 2 + uniform() * (mech.period - mech.length)
            return mech.origin + (y - mech.origin) % mech.period
        return one
    if isinstance(mech, ThreePieceMechanism):
        def one(x):
            x = min(max(x, mech.low), mech.high)
            centre = mech._centre_at_low + mech._centre_slope * (x - mech.low)
            left = min(max(centre - mech.length / 2, mech.output_low),
                       mech.output_high - mech.length)
            if uniform() < mech.p_high * mech.length:
                return left + uniform() * mech.length
            v = mech.output_low + uniform() * (mech.output_high - mech.output_low - mech.length)
            return v if v < left else v + mech.length
        return one
    if isinstance(mech, Duchi):
        def one(x):
            up = float(mech._upper_probability(x))
            return mech.output_high if uniform() < up else mech.output_low
        return one
    if isinstance(mech, TypeIIPTT):
        # The tent (two uniforms' sum around the centre, share of the draws) on a floor
        # over the whole output.
        share = float(mech.tent_share)
        mid = 0.5 * (mech.low + mech.high)
        width = mech.half * (mech.output_high - mech.output_low) / mech.ticks

        def one(x):
            x = min(max(x, mech.low), mech.high)
            if uniform() < share:
                # E = share * centre + (1 - share) * mid = x
                return mid + (x - mid) / share + (uniform() + uniform() - 1.0) * width
            return mech.output_low + uniform() * (mech.output_high - mech.output_low)
        return one
    if isinstance(mech, OptimalGaussian):
        def one(x):  # Box-Muller, clamped to the output domain
            x = min(max(x, mech.low), mech.high)
            z = math.sqrt(-2.0 * math.log(1.0 - uniform())) * math.cos(2 * math.pi * uniform())
            return min(max(x + mech.sigma * z, mech.output_low), mech.output_high)
        return one
    bounded = isinstance(mech, BoundedLaplace)

    def one(x):
        x = min(max(x, mech.low), mech.high)
        while True:
            u = uniform() - 0.5
            y = x - mech.scale * math.copysign(math.log1p(-2 * abs(u)), u)
            if not bounded:
                return min(max(y, mech.low), mech.high)
            if mech.low <= y <= mech.high:
                return y
    return one


def best_time(fn, repeats):
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


class CountingSource:
    """Wraps a source to learn how many words a call consumes."""

    def __init__(self, inner):
        self.inner, self.count = inner, 0

    def words(self, n):
        self.count += n
        return self.inner.words(n)


def batched(fn, x, batch):
    """Call fn on consecutive slices of x: the way the agent and collector use it."""
    slices = [x[i:i + batch] for i in range(0, x.size, batch)]
    return lambda: [fn(part) for part in slices]


def run(n: int, n_python: int, repeats: int, batch: int):
    rows = []
    x = np.random.default_rng(0).uniform(-2.0, 2.0, n)
    x_python = x[:n_python].tolist()
    # Warm the CPU, the allocator and the CSPRNG before the first timed row.
    best_time(lambda: [SystemRandom().words(batch) for _ in range(200)], 5)
    for name, mech in mechanisms().items():
        if isinstance(mech, CircularOGPM):
            xs, xs_python = (x + 2.0) * (np.pi / 2.0), [(v + 2.0) * np.pi / 2 for v in x_python]
        else:
            xs, xs_python = x, x_python
        mech.perturb(xs[:1000], np.random.default_rng(1))  # JIT warm-up
        for source_name in ("CSPRNG", "seeded"):
            if source_name == "CSPRNG":
                make_source = SystemRandom
                uniform = secrets.SystemRandom().random
            else:
                make_source = lambda: SeededRandom(np.random.default_rng(123))  # noqa: E731
                uniform = np.random.default_rng(123).random  # the same kind of seeded source
            counter = CountingSource(make_source())
            mech.perturb(xs[:batch], counter)
            words = counter.count
            source = make_source()
            t_perturb = best_time(batched(lambda part: mech.perturb(part, source), xs, batch),
                                  repeats)
            t_rng = best_time(batched(lambda part: source.words(words), xs, batch), repeats)
            t_large = best_time(lambda: mech.perturb(xs, source), max(2, repeats // 3))
            one = per_sample(mech, uniform)
            t_python = best_time(lambda: [one(v) for v in xs_python], 1) * n / n_python
            rows.append({
                "mechanism": name, "source": source_name,
                "msamples_per_s": n / t_perturb / 1e6,
                "msamples_per_s_large": n / t_large / 1e6,
                "words_per_sample": words / batch,
                "ratio_to_rng": t_perturb / t_rng,
                "speedup_vs_python": t_python / t_perturb,
                "ns_per_sample": t_perturb / n * 1e9,
            })
    return rows


def markdown(rows, n, batch) -> str:
    lines = [
        f"{n:,} inputs in batches of {batch:,}, epsilon = {EPSILON}; best of several runs. "
        f"'one batch' is all {n:,} at once.",
        "",
        "| mechanism | randomness | M samples/s | ns/sample | M samples/s, one batch "
        "| words/sample | perturb / RNG time | speed-up vs per-sample Python |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mechanism']} | {r['source']} | {r['msamples_per_s']:.1f} | "
            f"{r['ns_per_sample']:.1f} | {r['msamples_per_s_large']:.1f} | "
            f"{r['words_per_sample']:.2f} | {r['ratio_to_rng']:.2f} | "
            f"{r['speedup_vs_python']:,.0f}x |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000_000)
    parser.add_argument("--n-python", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    rows = run(args.n, args.n_python, args.repeats, args.batch)
    table = f"Machine: {describe_machine()}\n\n" + markdown(rows, args.n, args.batch)
    print_table(table, args.markdown)


if __name__ == "__main__":
    main()
