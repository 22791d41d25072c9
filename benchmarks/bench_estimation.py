"""Estimation accuracy: the collector's mean and histogram estimates against baselines.

For eps in {0.5, 1, 2, 4} and four data sets on the domain [-2, 2]
(uniform; near the lower edge, Beta(1.3, 9); bimodal 70/30; a wearable's
vertical acceleration from the synthetic source, 100 simulated wearers x
200 readings at 1 Hz, clipped to the domain as the agent clips), each
repetition draws N = 20,000 true values and perturbs them with every
mechanism (seeded numpy generators: the run is reproducible).  The reports
are fed to the collector's ``Series`` in 40 messages of 500 codes, as the
collector aggregates them, and scored against the true values' own mean:

* mean: mean absolute error of
  (a) classical OGPM + the collector's estimate (``Series.get()["mean"]["estimate"]``),
  (b) classical OGPM, raw average of the reports,
  (c) PM-C raw average, (d) SW-C raw average,
  (e) PM-C and SW-C + the collector's estimate (it debiases them too),
  (f) OGPM-U (unbiased), plain average;
* distribution (OGPM): L1 and Wasserstein-1 distance from the true values'
  histogram (the collector's 50 bins) of the raw reports' histogram and of
  the collector's EMS reconstruction;
* the share of the collector's 95% intervals that cover the true mean.

Prints markdown tables and writes ``estimation_mean_error.png`` and
``estimation_histogram.png``.

Run: ``python -m benchmarks.bench_estimation [--repetitions 40] [--jobs 2]
[--out docs/benchmarks]``.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.machine import describe_machine  # noqa: E402
from collector.aggregation.series import new_series  # noqa: E402
from edge_agent import protocol  # noqa: E402
from edge_agent.config import SyntheticSourceConfig  # noqa: E402
from edge_agent.mechanisms import (  # noqa: E402
    ClassicalOGPM,
    PiecewiseMechanism,
    SquareWave,
    UnbiasedOGPM,
)
from edge_agent.sources.synthetic import SyntheticSource  # noqa: E402

LOW, HIGH = -2.0, 2.0
N = 20_000
MESSAGES = 40
BINS = 50
EPSILONS = [0.5, 1.0, 2.0, 4.0]
WEARERS, READINGS_PER_WEARER = 100, 200


# -- data sets ---------------------------------------------------------------------------

def uniform(rng):
    return rng.uniform(LOW, HIGH, N)


def near_edge(rng):
    return LOW + (HIGH - LOW) * rng.beta(1.3, 9.0, N)


def bimodal(rng):
    first = int(0.7 * N)
    return np.clip(np.concatenate([rng.normal(-1.3, 0.25, first),
                                   rng.normal(0.9, 0.3, N - first)]), LOW, HIGH)


def wearable(rng):
    """accel_z (g) of 100 simulated wearers, 200 readings each at 1 Hz."""
    parts = []
    for seed in rng.integers(0, 2**63 - 1, WEARERS):
        source = SyntheticSource(SyntheticSourceConfig(name="imu", type="synthetic",
                                                       rate_hz=1.0, seed=int(seed)),
                                 agent_id="bench")
        source.start()
        # The clock starts at the first poll: samples at t = 0, 1, ..., 199 s.
        first = source.poll(0.0).fields["accel_z"]
        rest = source.poll(READINGS_PER_WEARER - 1.0).fields["accel_z"]
        parts += [first, rest]
    x = np.clip(np.concatenate(parts), LOW, HIGH)
    assert x.size == N, x.size
    return x


DATASETS = {
    "uniform": uniform,
    "near edge": near_edge,
    "bimodal": bimodal,
    "wearable accel_z": wearable,
}

# -- methods ----------------------------------------------------------------------------

MECHANISMS = {
    "OGPM": lambda e: ClassicalOGPM(epsilon=e, low=LOW, high=HIGH),
    "PM-C": lambda e: PiecewiseMechanism(epsilon=e, low=LOW, high=HIGH, compressed=True),
    "SW-C": lambda e: SquareWave(epsilon=e, low=LOW, high=HIGH, compressed=True),
    "OGPM-U": lambda e: UnbiasedOGPM(epsilon=e, low=LOW, high=HIGH),
}
COLLECTED = ("OGPM", "PM-C", "SW-C")  # scored through the collector's Series
# Mean-error columns: (label, mechanism, which number).
COLUMNS = [
    ("(a) OGPM + collector", "OGPM", "estimate"),
    ("(b) OGPM raw avg", "OGPM", "raw"),
    ("(c) PM-C raw avg", "PM-C", "raw"),
    ("(d) SW-C raw avg", "SW-C", "raw"),
    ("(e) PM-C + collector", "PM-C", "estimate"),
    ("(e) SW-C + collector", "SW-C", "estimate"),
    ("(f) OGPM-U avg", "OGPM-U", "raw"),
]


def collect(mechanism, x, rng) -> dict:
    series = new_series(channel="c", kind="linear", description=protocol.describe(mechanism),
                        bins=BINS)
    codes = mechanism.perturb_codes(x, rng)
    for part in np.array_split(codes, MESSAGES):
        series.update(agent="a", t=0.0, codes=part)
    return series.get()


def distances(p: np.ndarray, q: np.ndarray, width: float) -> tuple[float, float]:
    """(L1, Wasserstein-1) between two histograms on the same equal-width bins."""
    return float(np.abs(p - q).sum()), float(np.abs(np.cumsum(p - q)).sum() * width)


def one_run(task: tuple[int, int, int]) -> dict:
    """One repetition of one (data set, epsilon): every mechanism on the same values."""
    d, e, rep = task
    name, epsilon = list(DATASETS)[d], EPSILONS[e]
    rng = np.random.default_rng([20_250, d, e, rep])
    x = DATASETS[name](rng)
    truth = float(x.mean())
    out = {"data": name, "epsilon": epsilon, "errors": {}, "covered": {}, "method": {}}
    for label, make in MECHANISMS.items():
        mechanism = make(epsilon)
        if label not in COLLECTED:
            reports = mechanism.from_codes(mechanism.perturb_codes(x, rng))
            out["errors"][(label, "raw")] = abs(float(reports.mean()) - truth)
            continue
        view = collect(mechanism, x, rng)
        mean = view["mean"]
        out["errors"][(label, "raw")] = abs(mean["raw"] - truth)
        out["errors"][(label, "estimate")] = abs(mean["estimate"] - truth)
        out["covered"][label] = mean["ci95"][0] <= truth <= mean["ci95"][1]
        out["method"][label] = mean["method"]
        if label == "OGPM":
            edges = np.array(view["histogram"]["edges"])
            counts, _ = np.histogram(x, bins=edges)
            target = counts / counts.sum()
            width = float(edges[1] - edges[0])
            out["histogram"] = {
                "raw": distances(np.array(view["histogram"]["raw"]), target, width),
                "ems": distances(np.array(view["histogram"]["estimate"]), target, width),
            }
            if rep == 0:
                out["example"] = {"edges": edges, "true": target,
                                  "raw": np.array(view["histogram"]["raw"]),
                                  "ems": np.array(view["histogram"]["estimate"])}
    return out


# -- reporting ---------------------------------------------------------------------------

def summarise(runs: list[dict]) -> dict:
    cells: dict = {}
    for run in runs:
        cell = cells.setdefault((run["data"], run["epsilon"]), {
            "errors": {}, "histogram": {"raw": [], "ems": []}, "covered": {}, "method": {}})
        for key, value in run["errors"].items():
            cell["errors"].setdefault(key, []).append(value)
        for key in ("raw", "ems"):
            cell["histogram"][key].append(run["histogram"][key])
        for key, value in run["covered"].items():
            cell["covered"].setdefault(key, []).append(value)
        for key, value in run["method"].items():
            cell["method"].setdefault(key, []).append(value)
        if "example" in run:
            cell["example"] = run["example"]
    return cells


def mean_table(cells) -> str:
    head = "| data | ε | " + " | ".join(label for label, _, _ in COLUMNS) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(COLUMNS)]
    for (data, epsilon), cell in cells.items():
        values = [float(np.mean(cell["errors"][(m, which)])) for _, m, which in COLUMNS]
        best = min(values)
        text = [f"**{v:.4f}**" if v == best else f"{v:.4f}" for v in values]
        lines.append(f"| {data} | {epsilon:g} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def histogram_table(cells) -> str:
    lines = ["| data | ε | L1 raw | L1 EMS | W1 raw | W1 EMS | EMS / raw (L1) | EMS / raw (W1) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (data, epsilon), cell in cells.items():
        raw = np.mean(cell["histogram"]["raw"], axis=0)
        ems = np.mean(cell["histogram"]["ems"], axis=0)
        lines.append(f"| {data} | {epsilon:g} | {raw[0]:.3f} | {ems[0]:.3f} | {raw[1]:.4f} | "
                     f"{ems[1]:.4f} | {ems[0] / raw[0]:.2f} | {ems[1] / raw[1]:.2f} |")
    return "\n".join(lines)


def coverage_table(cells) -> str:
    datasets = list(dict.fromkeys(data for data, _ in cells))
    lines = ["| data | " + " | ".join(f"{m} coverage" for m in COLLECTED)
             + " | OGPM method (runs) |",
             "|---|" + "---:|" * len(COLLECTED) + "---|"]
    for data in datasets:
        mine = [cell for (d, _), cell in cells.items() if d == data]
        shares = []
        for m in COLLECTED:
            covered = [c for cell in mine for c in cell["covered"][m]]
            shares.append(f"{np.mean(covered):.0%} of {len(covered)}")
        methods = [x for cell in mine for x in cell["method"]["OGPM"]]
        counts = ", ".join(f"{k} {methods.count(k)}" for k in sorted(set(methods)))
        lines.append(f"| {data} | " + " | ".join(shares) + f" | {counts} |")
    return "\n".join(lines)


STYLES = {
    "(a) OGPM + collector": dict(color="C0", linestyle="-", linewidth=2.4, marker="o"),
    "(b) OGPM raw avg": dict(color="C0", linestyle=":", marker="o"),
    "(c) PM-C raw avg": dict(color="C1", linestyle=":", marker="s"),
    "(d) SW-C raw avg": dict(color="C2", linestyle=":", marker="^"),
    "(e) PM-C + collector": dict(color="C1", linestyle="-", marker="s"),
    "(e) SW-C + collector": dict(color="C2", linestyle="-", marker="^"),
    "(f) OGPM-U avg": dict(color="C3", linestyle="--", marker="D"),
}


def plot_mean(cells, path: Path, repetitions: int) -> None:
    datasets = list(dict.fromkeys(data for data, _ in cells))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 4.2), sharey=True)
    for ax, data in zip(axes, datasets):
        for label, m, which in COLUMNS:
            values = [np.mean(cells[(data, e)]["errors"][(m, which)]) for e in EPSILONS]
            ax.plot(EPSILONS, values, label=label, markersize=4, **STYLES[label])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(EPSILONS, [f"{e:g}" for e in EPSILONS])
        ax.set_title(data)
        ax.set_xlabel("ε")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"mean absolute error of the mean\n(N = {N:,}, {repetitions} runs)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(COLUMNS), fontsize=9)
    fig.suptitle("Mean estimate on [-2, 2]: collector estimate vs raw averages")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_histogram(cells, path: Path, repetitions: int, example_epsilon: float = 1.0) -> None:
    datasets = list(dict.fromkeys(data for data, _ in cells))
    fig, axes = plt.subplots(2, len(datasets), figsize=(4.2 * len(datasets), 7.5))
    for col, data in enumerate(datasets):
        example = cells[(data, example_epsilon)]["example"]
        centres = 0.5 * (example["edges"][:-1] + example["edges"][1:])
        width = example["edges"][1] - example["edges"][0]
        ax = axes[0, col]
        ax.bar(centres, example["true"], width=width, color="0.8", label="true values")
        ax.step(centres, example["raw"], where="mid", color="C1", label="raw reports")
        ax.step(centres, example["ems"], where="mid", color="C0", linewidth=2,
                label="EMS reconstruction")
        ax.set_title(f"{data}, OGPM ε = {example_epsilon:g} (one run)")
        ax.set_xlabel("value")
        ax = axes[1, col]
        for key, label, color in (("raw", "raw reports", "C1"), ("ems", "EMS", "C0")):
            values = np.array([np.mean(cells[(data, e)]["histogram"][key], axis=0)
                               for e in EPSILONS])
            ax.plot(EPSILONS, values[:, 0], "-o", color=color, label=f"L1, {label}")
            ax.plot(EPSILONS, values[:, 1], "--s", color=color, label=f"W1, {label}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(EPSILONS, [f"{e:g}" for e in EPSILONS])
        ax.set_xlabel("ε")
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].set_ylabel("share of values per bin")
    axes[0, -1].legend(fontsize=8)
    axes[1, 0].set_ylabel(f"distance to the true histogram ({repetitions} runs)")
    axes[1, -1].legend(fontsize=8)
    fig.suptitle("OGPM: raw report histogram vs the collector's EMS reconstruction "
                 f"({BINS} bins)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="docs/benchmarks")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    tasks = [(d, e, rep) for d in range(len(DATASETS)) for e in range(len(EPSILONS))
             for rep in range(args.repetitions)]
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            runs = list(pool.map(one_run, tasks, chunksize=4))
    else:
        runs = [one_run(task) for task in tasks]
    elapsed = time.perf_counter() - started
    cells = summarise(runs)
    print(f"Machine: {describe_machine()}")
    print(f"N = {N:,} reports on [{LOW:g}, {HIGH:g}], {args.repetitions} repetitions per "
          f"cell, {args.jobs} processes, {elapsed:.0f} s\n")
    print("Mean absolute error of the mean (best of each row in bold):\n")
    print(mean_table(cells))
    print("\nOGPM histogram: distance to the true values' histogram (mean over runs):\n")
    print(histogram_table(cells))
    print("\nCollector's 95% intervals covering the true mean, all ε together:\n")
    print(coverage_table(cells))
    plot_mean(cells, out / "estimation_mean_error.png", args.repetitions)
    plot_histogram(cells, out / "estimation_histogram.png", args.repetitions)
    print(f"\nwrote {out / 'estimation_mean_error.png'} and {out / 'estimation_histogram.png'}")


if __name__ == "__main__":
    main()
