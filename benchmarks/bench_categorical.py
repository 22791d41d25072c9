"""Categorical frequency oracles: variance curves (Wang et al. arXiv:1906.01777 Fig. 2),
estimation error against the true shares, and kernel throughput next to its RNG cost.

1. ``categorical_variance.png``: per-report variance of each oracle's estimate of a
   rare category (f -> 0) against ε at δ = 1e-6, from the closed forms (GRR for
   k = 2, 10, 100; OUE, SUE and OLH do not depend on k) and the optimal Gaussian
   mechanism's σ², its closed form beside the variance of the agent's exact
   discrete-Gaussian sampler, measured: the paper's Fig. 2.
2. ``categorical_error.png`` and a table: L1 and max error of the estimated shares
   against the true ones, for each oracle over ε in [0.5, 8] and k = 3, 10, 100
   (n = 20,000 reports of a Zipf-like share vector, the mean over 5 runs), next to the
   closed form's expected L1 error (sum over v of sqrt(2 Var_v / π)).
3. Throughput of each oracle's ``perturb`` (values/s), and of the multi-dimensional
   mechanisms (tuples/s), with the share of it spent drawing CSPRNG words.

Run: ``python -m benchmarks.bench_categorical [--out docs/benchmarks] [--markdown FILE]``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.machine import describe_machine  # noqa: E402
from edge_agent.mechanisms import _kernels  # noqa: E402
from edge_agent.mechanisms.categorical import ORACLES  # noqa: E402
from edge_agent.mechanisms.gaussian import analytic_sigma  # noqa: E402
from edge_agent.mechanisms.multidimensional import DuchiVector, SampledDuchi  # noqa: E402
from edge_agent.mechanisms.randomness import SeededRandom, SystemRandom  # noqa: E402

DELTA = 1e-6
LABELS = {"grr": "GRR", "oue": "OUE (PRR-ALDP)", "sue": "SUE (SPRR-ALDP)", "olh": "OLH"}


def gaussian_sigma(epsilon: float, delta: float) -> float:
    """Opt-GM's σ for a one-hot vector: its L2 sensitivity is √2 (two bits change,
    Wang et al. arXiv:1906.01777 Sec. 5)."""
    return analytic_sigma(epsilon, delta, math.sqrt(2))


def sampled_gaussian_variance(epsilon: float, delta: float, draws: int,
                              rng: np.random.Generator) -> tuple[float, float]:
    """The per-report variance of Opt-GM's estimate of a rare category, measured: a bit
    0 plus discrete-Gaussian noise drawn by the agent's exact sampler (CKS Algorithm 3,
    ``OptimalGaussian``'s kernel) on a lattice of 2**10 steps per unit, σ² = t·m cells²
    at Opt-GM's σ; returns (variance, its standard error)."""
    steps = 1 << 10
    target = gaussian_sigma(epsilon, delta) * steps
    t = math.floor(target) + 1
    m = math.ceil(target * target / t)
    reach = math.ceil(10 * target)
    codes = _kernels.gaussian_cells(np.zeros(draws), SeededRandom(rng), low=0.0, step=1.0,
                                    steps=1, offset=reach, top=2 * reach + 1, t=t, m=m)
    noise = (codes.astype(np.float64) - reach) / steps
    variance = float(noise.var())
    return variance, variance * math.sqrt(2.0 / (draws - 1))


def variance_figure(out: Path) -> None:
    epsilons = np.linspace(0.1, 10.0, 60)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k in (2, 10, 100):
        ax.plot(epsilons, [ORACLES["grr"](epsilon=e, categories=k, delta=DELTA)
                           .variance(0.0, 1) for e in epsilons], label=f"GRR, k = {k}")
    for name in ("oue", "sue", "olh"):
        ax.plot(epsilons, [ORACLES[name](epsilon=e, categories=100, delta=DELTA)
                           .variance(0.0, 1) for e in epsilons], label=LABELS[name],
                linestyle="--")
    # Opt-GM: each bit of the one-hot vector plus N(0, σ²); the count's variance is σ² per
    # report (Wang et al. arXiv:1906.01777 Sec. 5): the closed form, and the agent's exact
    # discrete-Gaussian sampler measured beside it (20,000 draws a point, 3 standard errors
    # as bars).
    line, = ax.plot(epsilons, [gaussian_sigma(e, DELTA) ** 2 for e in epsilons],
                    label="Opt-GM (closed form)", linestyle=":")
    rng = np.random.default_rng(2020)
    sampled_at = epsilons[::5]
    measured = [sampled_gaussian_variance(e, DELTA, 20_000, rng) for e in sampled_at]
    ax.errorbar(sampled_at, [v for v, _ in measured], yerr=[3 * se for _, se in measured],
                fmt="o", markersize=3, color=line.get_color(),
                label="Opt-GM sampled (exact discrete Gaussian)")
    ax.set_yscale("log")
    ax.set_xlabel("ε")
    ax.set_ylabel("variance per report (f → 0)")
    ax.set_title(f"Categorical oracles at δ = {DELTA:g} (Wang et al., arXiv:1906.01777, Fig. 2)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "categorical_variance.png", dpi=120)
    plt.close(fig)


def shares(k: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, k + 1)
    return weights / weights.sum()


def estimation_errors(n: int, runs: int) -> list[tuple]:
    rows, rng = [], np.random.default_rng(2026)
    for k in (3, 10, 100):
        truth = shares(k)
        values = np.repeat(np.arange(k), np.round(truth * n).astype(int))
        truth = np.bincount(values, minlength=k) / values.size
        for epsilon in (0.5, 1.0, 2.0, 4.0, 8.0):
            for name in ORACLES:
                if name in ("oue", "sue") and k > 100:
                    continue
                oracle = ORACLES[name](epsilon=epsilon, categories=k)
                l1, worst = [], []
                for _ in range(runs):
                    estimate = oracle.estimate(oracle.support(oracle.perturb(values, rng)),
                                               values.size)
                    l1.append(np.abs(estimate - truth).sum())
                    worst.append(np.abs(estimate - truth).max())
                expected = np.sqrt(2 * oracle.variance(truth, values.size) / math.pi).sum()
                rows.append((k, epsilon, name, float(np.mean(l1)), float(np.mean(worst)),
                             float(expected)))
    return rows


def error_figure(rows, out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for ax, k in zip(axes, (3, 10, 100)):
        for name in ORACLES:
            points = [(e, l1, expected) for kk, e, n, l1, _, expected in rows
                      if kk == k and n == name]
            if not points:
                continue
            e, l1, expected = zip(*points)
            line, = ax.plot(e, l1, marker="o", label=f"{LABELS[name]} measured")
            ax.plot(e, expected, linestyle=":", color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"k = {k}")
        ax.set_xlabel("ε")
    axes[0].set_ylabel("L1 error of the shares (dotted: closed form)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "categorical_error.png", dpi=120)
    plt.close(fig)


def throughput(n: int = 200_000) -> list[tuple]:
    rows, values = [], np.random.default_rng(1).integers(0, 10, n)
    source = SystemRandom()
    for name, cls in ORACLES.items():
        oracle = cls(epsilon=2.0, categories=10)
        oracle.perturb(values[:10])  # compile
        started = time.perf_counter()
        oracle.perturb(values, source)
        took = time.perf_counter() - started
        words = n * (10 if name in ("oue", "sue") else 2 if name == "olh" else 1)
        started = time.perf_counter()
        source.words(words)
        rng_took = time.perf_counter() - started
        rows.append((LABELS[name], n / took, rng_took / took))
    tuples = np.random.default_rng(2).uniform(-1, 1, (n, 5))
    for label, mechanism, words in (
            ("Duchi vector, d = 5", DuchiVector(epsilon=2.0, dimensions=5), n * 8),
            ("k of d (Mechanism-2), d = 5", SampledDuchi(epsilon=2.0, dimensions=5), n * 7)):
        mechanism.perturb(tuples[:10])  # compile
        started = time.perf_counter()
        mechanism.perturb(tuples, source)
        took = time.perf_counter() - started
        started = time.perf_counter()
        source.words(words)  # about what it draws (rejection varies)
        rows.append((label, n / took, (time.perf_counter() - started) / took))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--reports", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    variance_figure(args.out)
    rows = estimation_errors(args.reports, args.runs)
    error_figure(rows, args.out)
    lines = [f"Machine: {describe_machine()}", "",
             f"Estimation error of the shares, n = {args.reports:,} reports of Zipf-like "
             f"shares, mean of {args.runs} runs (pure ε):", "",
             "| k | ε | oracle | L1 error | max error | L1 expected (closed form) |",
             "|---:|---:|---|---:|---:|---:|"]
    lines += [f"| {k} | {e:g} | {LABELS[n]} | {l1:.4f} | {mx:.4f} | {ex:.4f} |"
              for k, e, n, l1, mx, ex in rows]
    lines += ["", "Throughput at ε = 2, k = 10 (one process; OS CSPRNG):", "",
              "| mechanism | values (tuples) /s | share of the time spent drawing CSPRNG words |",
              "|---|---:|---:|"]
    lines += [f"| {label} | {rate:,.0f} | {share:.0%} |" for label, rate, share in throughput()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
