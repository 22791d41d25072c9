"""Range discovery: mean absolute error of the private minimum against N.

The paper's setting (Fukuchi et al., Sec. 6.1, Fig. 1 and 2): values uniform
on [x_min, x_min + 0.3] inside the domain [-1, 1] (alpha = 1), x_min drawn
anew for every run.  For eps in {1, 4} and N = 2^8 .. 2^14 it runs the same
``RangeSearch`` and ``RandomizedResponse`` the coordinator and the agents
use (in memory, every agent answering), with both strategies and both
parameter choices (alpha known >= 1, Corollary 1; alpha unknown,
Corollary 2), against the paper's baseline (each agent adds Laplace(2/eps),
the server takes the minimum).  The rate lines are Corollary 1's
(ln^3 N / (eps^2 N))^(1/2), scaled to the first point.

The MQTT path (coordinator, agents, broker) is exercised with a real
Mosquitto and the fleet simulator in tests/collector/range/test_e2e_range.py.

Run: ``python -m benchmarks.range_error [--runs 200] [--out docs/benchmarks]``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from benchmarks.machine import describe_machine
from edge_agent.mechanisms.rangefind import plan_search, simulate

NS = [2 ** k for k in range(8, 15)]
EPSILONS = [1.0, 4.0]
WIDTH = 0.3


def draw(rng, n):
    x_min = rng.uniform(-1.0, 1.0 - WIDTH)
    return x_min + WIDTH * rng.random(n)


def mae_search(n, epsilon, strategy, alpha_min, runs, rng):
    plan = plan_search(participants=n, epsilon=epsilon, strategy=strategy, alpha_min=alpha_min)
    errors = []
    for run in range(runs):
        values = draw(rng, n)
        search = simulate(values, low=-1.0, high=1.0, side="min", plan=plan, rng=rng,
                          run_id=f"run-{run}")
        errors.append(abs(search.estimate() - values.min()))
    return float(np.mean(errors)), plan.rounds


def mae_laplace(n, epsilon, runs, rng):
    errors = []
    for _ in range(runs):
        values = draw(rng, n)
        errors.append(abs((values + rng.laplace(0.0, 2.0 / epsilon, n)).min() - values.min()))
    return float(np.mean(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = parser.parse_args()
    rng = np.random.default_rng(2026)
    variants = [("sequential", 1.0), ("split", 1.0), ("sequential", None), ("split", None)]
    table = {}
    for epsilon in EPSILONS:
        for strategy, alpha in variants:
            table[(epsilon, strategy, alpha)] = [mae_search(n, epsilon, strategy, alpha,
                                                            args.runs, rng) for n in NS]
        table[(epsilon, "laplace", None)] = [(mae_laplace(n, epsilon, args.runs, rng), 0)
                                             for n in NS]
    print(f"Machine: {describe_machine()}\n")
    print(f"Mean absolute error of the minimum over {args.runs} runs per point "
          f"(domain [-1, 1], data uniform on a width-{WIDTH} interval):\n")
    print("| eps | method | " + " | ".join(f"N=2^{int(math.log2(n))}" for n in NS) + " |")
    print("|---|---|" + "---:|" * len(NS))
    for (epsilon, strategy, alpha), row in table.items():
        label = strategy if strategy == "laplace" else \
            f"{strategy}, {'alpha>=1 (Cor. 1)' if alpha else 'alpha unknown (Cor. 2)'}"
        print(f"| {epsilon:g} | {label} | " + " | ".join(
            f"{mae:.4f}" + (f" (L={rounds})" if rounds else "") for mae, rounds in row) + " |")
    slopes = {key: np.polyfit(np.log(NS), np.log([m for m, _ in row]), 1)[0]
              for key, row in table.items() if key[1] != "laplace"}
    predicted = np.polyfit(np.log(NS), np.log([math.sqrt(math.log(n) ** 3 / n) for n in NS]),
                           1)[0]
    print(f"\nLog-log slope of the error against N (Corollary 1 predicts {predicted:.3f} "
          "over this range):")
    for (epsilon, strategy, alpha), slope in slopes.items():
        print(f"  eps={epsilon:g} {strategy:10s} alpha {'>=1' if alpha else 'unknown'}: "
              f"{slope:.3f}")
    plot(table, args.out / "range_error.png")
    print(f"\nwrote {args.out / 'range_error.png'}")


def plot(table, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    styles = {("sequential", 1.0): ("C0", "-o"), ("split", 1.0): ("C1", "-s"),
              ("sequential", None): ("C0", "--o"), ("split", None): ("C1", "--s"),
              ("laplace", None): ("C3", ":x")}
    for ax, epsilon in zip(axes, EPSILONS):
        for (eps, strategy, alpha), row in table.items():
            if eps != epsilon:
                continue
            color, style = styles[(strategy, alpha)]
            label = "Laplace(2/eps), min" if strategy == "laplace" else \
                f"{strategy}, {'alpha>=1' if alpha else 'alpha unknown'}"
            ax.loglog(NS, [m for m, _ in row], style, color=color, label=label, base=2)
        first = table[(epsilon, "sequential", 1.0)][0][0]
        rate = [math.sqrt(math.log(n) ** 3 / n) for n in NS]
        ax.loglog(NS, [first * r / rate[0] for r in rate], color="grey", lw=1,
                  label="Cor. 1 rate (ln^3 N / N)^1/2", base=2)
        ax.set_title(f"eps = {epsilon:g}")
        ax.set_xlabel("agents N")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("mean absolute error of the minimum")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
