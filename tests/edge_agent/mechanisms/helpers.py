"""Catalogue of every mechanism and the goodness-of-fit machinery for the tests."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal, localcontext

import numpy as np

from edge_agent.mechanisms import CircularOGPM, Duchi, TypeIIPTT
from edge_agent.mechanisms.registry import CIRCULAR, LINEAR
from edge_agent.mechanisms.tent import ii_ptt_geometry

FALSE_ALARM = 1e-6
# The delta of the (epsilon, delta) mechanisms in the catalogue (Opt-GM).
EXAMPLE_DELTA = 1e-6


def make(kind: str, epsilon: float, low: float = 0.0, high: float = 1.0, grid_bits: int = 16):
    """Every scalar mechanism by its name in the registry (edge_agent.mechanisms.registry):
    a linear mechanism's configuration name on [low, high], or circular OGPM's wire name
    with [low, high) as one turn."""
    if kind == CIRCULAR:
        return CircularOGPM(epsilon=epsilon, period=high - low, origin=low, grid_bits=grid_bits)
    choice = LINEAR[kind]
    return choice.build(epsilon=epsilon, low=low, high=high, grid_bits=grid_bits,
                        delta=EXAMPLE_DELTA if choice.delta else 0.0)


KINDS = [*LINEAR, CIRCULAR]
# The pure epsilon-LDP ones (Opt-GM is (epsilon, delta): test_gaussian.py).
PURE_KINDS = [kind for kind in KINDS if not (kind in LINEAR and LINEAR[kind].delta)]
LAPLACE_KINDS = ["laplace", "bounded-laplace"]
PIECEWISE_KINDS = [kind for kind in KINDS if kind not in ("duchi", *LAPLACE_KINDS)]


def dkw_threshold(n: int, alpha: float = FALSE_ALARM) -> float:
    """t with P(sup|F_n - F| > t) <= alpha for *any* F (Dvoretzky-Kiefer-Wolfowitz-Massart).

    Valid for discrete distributions too, so it tests grid codes directly.
    """
    return math.sqrt(math.log(2.0 / alpha) / (2.0 * n))


def ks_statistic(codes: np.ndarray, cdf: np.ndarray) -> float:
    """sup over codes k of |empirical P[code <= k] - cdf[k]|."""
    counts = np.bincount(codes.ravel().astype(np.int64), minlength=cdf.size)
    empirical = np.cumsum(counts) / codes.size
    return float(np.max(np.abs(empirical - cdf)))


def continuous_cdf_at_cells(mech, x: float) -> np.ndarray:
    """The paper's closed-form CDF at the upper edge of every grid cell."""
    if isinstance(mech, Duchi):
        return np.array([float(mech.cdf(x, mech.output_low)), 1.0])
    edges = mech.cell_edges()[1:]
    if isinstance(mech, TypeIIPTT):  # its cdf is the discrete mechanism's own
        return ii_ptt_paper_cdf(mech, x, edges)
    return np.asarray(mech.cdf(x, edges), dtype=np.float64)


def ii_ptt_paper_cdf(mech, x: float, y: np.ndarray) -> np.ndarray:
    """The CDF of OPTT's continuous II-PTT (Theorem 6, at the mechanism's η) on its domain:
    density p / e^ε on [-B, B] plus a tent rising to p at k u, u the input on [-1, 1],
    and back to p / e^ε at k u ± a; p = e^ε / (a k (e^ε - 1)), B = η a."""
    k, a = ii_ptt_geometry(mech.epsilon, mech.eta)
    e = math.exp(mech.epsilon)
    p, bound = e / (a * k * (e - 1)), mech.eta * a
    mid, half = 0.5 * (mech.low + mech.high), 0.5 * (mech.high - mech.low)
    u = (min(max(x, mech.low), mech.high) - mid) / half
    z = np.clip((np.asarray(y, dtype=np.float64) - mid) / half, -bound, bound)
    d = np.clip((z - k * u) / a, -1.0, 1.0)
    triangle = np.where(d <= 0, (1 + d) ** 2 / 2, 1 - (1 - d) ** 2 / 2)
    return p / e * (z + bound) + (p - p / e) * a * triangle


def hockey_stick(pmfs, epsilon: float) -> Decimal:
    """The standard δ of a mechanism at ε from its exact output distributions, one per
    input (lists or dicts of Fractions by output): the largest over ordered pairs of
    inputs of sum_y max(0, P[y|u] - e^ε P[y|v]), to 80 digits."""
    with localcontext() as ctx:
        ctx.prec = 80
        e = Decimal(epsilon).exp()
        worst = Decimal(0)
        for a, b in itertools.permutations(pmfs, 2):
            outputs = a.keys() if isinstance(a, dict) else range(len(a))
            total = sum((max(Decimal(0), Decimal(a[y].numerator) / a[y].denominator
                             - e * Decimal(b[y].numerator) / b[y].denominator)
                         for y in outputs), Decimal(0))
            worst = max(worst, total)
        return worst

