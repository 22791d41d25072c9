"""Worst-case error against epsilon, the shape of the OGPM paper's Figures 9 and 11.

Classical domain [0, 1]: OGPM, PM-C, SW-C and the Laplace variants, all from
their closed forms.  Circular domain [0, 2 pi): OGPM against PM-C and SW-C
applied to the flattened circle, scored with the circular distance (integrals
of the closed-form densities, piecewise constant, so a fine trapezoid rule is
exact to plotting accuracy) and, dotted, with the linear distance, which is
what reproduces the paper's Figure 11 averages.

Run: ``python -m benchmarks.plot_errors [--out docs/benchmarks]``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from edge_agent.mechanisms import (  # noqa: E402
    BoundedLaplace,
    CircularOGPM,
    ClassicalOGPM,
    PiecewiseMechanism,
    SquareWave,
    TruncatedLaplace,
)

EPSILONS = np.linspace(0.2, 8.0, 40)


def classical_curves(p: int) -> dict[str, np.ndarray]:
    makers = {
        "OGPM": lambda e: ClassicalOGPM(epsilon=e, low=0, high=1),
        "PM-C": lambda e: PiecewiseMechanism(epsilon=e, low=0, high=1, compressed=True),
        "SW-C": lambda e: SquareWave(epsilon=e, low=0, high=1, compressed=True),
        "T-Laplace": lambda e: TruncatedLaplace(epsilon=e, low=0, high=1),
        "B-Laplace": lambda e: BoundedLaplace(epsilon=e, low=0, high=1),
    }
    return {name: np.array([make(float(e)).worst_case_error(p) for e in EPSILONS])
            for name, make in makers.items()}


def flattened_circular_error(mech, p: int, n_x: int = 181, n_y: int = 20001) -> float:
    """max over x of E[d_circ(Y, x)**p] for a linear mechanism on [0, 2 pi]."""
    y = np.linspace(mech.output_low, mech.output_high, n_y)
    xs = np.linspace(0.0, 2 * math.pi, n_x)[:, None]
    d = np.mod(y[None, :] - xs, 2 * math.pi)
    d = np.minimum(d, 2 * math.pi - d) ** p
    density = mech.pdf(xs, y[None, :])
    return float(np.max(np.trapezoid(d * density, y, axis=1)))


def circular_curves(p: int) -> dict[str, np.ndarray]:
    two_pi = 2 * math.pi
    return {
        "OGPM": np.array([CircularOGPM(epsilon=float(e)).worst_case_error(p) for e in EPSILONS]),
        "PM-C": np.array([flattened_circular_error(
            PiecewiseMechanism(epsilon=float(e), low=0, high=two_pi, compressed=True), p)
            for e in EPSILONS]),
        "SW-C": np.array([flattened_circular_error(
            SquareWave(epsilon=float(e), low=0, high=two_pi, compressed=True), p)
            for e in EPSILONS]),
        # Scored with the linear |y - x| on the flattened circle: this reproduces the
        # paper's Sec. 7.1.1 averages (22.4% / 15.4% of PM-C / SW-C at p = 2).
        "PM-C, linear distance": np.array([PiecewiseMechanism(
            epsilon=float(e), low=0, high=two_pi, compressed=True).worst_case_error(p)
            for e in EPSILONS]),
        "SW-C, linear distance": np.array([SquareWave(
            epsilon=float(e), low=0, high=two_pi, compressed=True).worst_case_error(p)
            for e in EPSILONS]),
    }


def plot(curves_by_p, title: str, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (p, curves) in zip(axes, curves_by_p.items()):
        for name, values in curves.items():
            style = "-" if name == "OGPM" else (":" if "linear" in name else "--")
            ax.plot(EPSILONS, values, style, label=name, linewidth=2 if name == "OGPM" else 1.3)
        ax.set_xlabel("epsilon")
        ax.set_ylabel(f"worst-case E|y - x|^{p}")
        ax.set_title(f"{title}, L = |y - x|^{p}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    classical = {p: classical_curves(p) for p in (1, 2)}
    circular = {p: circular_curves(p) for p in (1, 2)}
    plot(classical, "Classical [0, 1]", out / "worst_case_error_classical.png")
    plot(circular, "Circular [0, 2 pi)", out / "worst_case_error_circular.png")
    # Average ratios over the epsilon range, as the paper reports them (Sec. 7.1.1).
    for label, curves_by_p in (("classical", classical), ("circular", circular)):
        for p, curves in curves_by_p.items():
            ratios = ", ".join(f"{name} {np.mean(curves['OGPM'] / values):.1%}"
                               for name, values in curves.items() if name != "OGPM")
            print(f"{label} p={p}: OGPM's worst-case error as a share of: {ratios}")


if __name__ == "__main__":
    main()
