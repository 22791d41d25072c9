"""The optimal piecewise mechanisms of Zheng, Mishra and Hu (OGPM): "Optimal Piecewise-based
Mechanism for Collecting Bounded Numerical Data under Local Differential Privacy", PoPETs,
arXiv:2505.15483.

Throughout, s = exp(eps / 2), so exp(eps) = s**2 (docs/guides/FIELD_NOTES.md, "Closed
forms, with values to test against").
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from edge_agent.mechanisms import _validate
from edge_agent.mechanisms.base import GOLDEN, ExactLoss
from edge_agent.mechanisms.baselines import PiecewiseMechanism, SquareWave
from edge_agent.mechanisms.randomness import as_random_source
from edge_agent.mechanisms.tpm import CircularThreePiece, ThreePieceMechanism

TWO_PI = 2.0 * math.pi


def worst_case_mse_unit(epsilon: float) -> float:
    """Worst-case MSE of classical OGPM on [0, 1] (App. B.5 at x = 0), simplified.

    (p/3)(2C)**3 + (p/(3 s**2))(1 - (2C)**3) with p = s and 2C = 1/(s + 1)
    reduces to (s + 3) / (3 (s + 1)**2).  Circular OGPM on a circle of length
    P has MSE (P/2)**2 times the same function (Theorem 4.4).
    """
    s = math.exp(epsilon / 2.0)
    return (s + 3.0) / (3.0 * (s + 1.0) ** 2)


def _worst_case_mse_slope(epsilon: float) -> float:
    """d/d(eps) of worst_case_mse_unit: -s (s + 5) / (6 (s + 1)**3), increasing in eps."""
    s = math.exp(epsilon / 2.0)
    return -s * (s + 5.0) / (6.0 * (s + 1.0) ** 3)


class ClassicalOGPM(ThreePieceMechanism):
    """Optimal piecewise mechanism on [low, high] -> [low, high] (Theorem 3.7).

    Density p = s / w on the central piece and p / s**2 elsewhere (w = high -
    low).  The piece has length 2C with C = w / (2 (s + 1)); it is [x - C, x + C)
    and is pushed inside the domain near the ends ([low, low + 2C) and
    [high - 2C, high)).  Scaling from [0, 1] follows Theorem 3.6.  Reports stay
    in the input domain, so the mean is biased towards the middle; see
    ``mean_output`` and ``bias_inverse``.
    """

    name = "ogpm"

    def __init__(self, *, epsilon: float, low: float, high: float, grid_bits: int = 16):
        epsilon = _validate.epsilon(epsilon)
        low, high = _validate.interval(low, high)
        self._build(epsilon, low, high, _validate.grid_bits(grid_bits))

    def _build(self, epsilon: float, low: float, high: float, grid_bits: int) -> None:
        s = math.exp(epsilon / 2.0)
        self.half_width = (high - low) / (2.0 * (s + 1.0))  # C of Theorem 3.7, scaled
        self._set_pieces(epsilon=epsilon, low=low, high=high, output_low=low, output_high=high,
                         length=2.0 * self.half_width, centre_at_low=low, centre_slope=1.0,
                         grid_bits=grid_bits)

    @classmethod
    def _uniform_share(cls, low: float, high: float, grid_bits: int) -> ClassicalOGPM:
        """The epsilon = 0 limit (uniform report), for a zero PolarOGPM share."""
        self = cls.__new__(cls)
        self._build(0.0, low, high, grid_bits)
        return self

    def bias_inverse(self, mean: Any) -> np.ndarray:
        """x with E[M(x)] = mean, valid where x lies in [low + C, high - C].

        E[M(x)] = (1 - 1/s) x + (1/(2s)) on [0, 1] (docs/guides/FIELD_NOTES.md, classical
        OGPM), scaled; means
        outside the image of that range are clipped to the domain.
        """
        s = math.exp(self.epsilon / 2.0)
        w = self.high - self.low
        unit = (np.asarray(mean, dtype=np.float64) - self.low) / w
        return self.low + w * np.clip((unit - 0.5 / s) / (1.0 - 1.0 / s), 0.0, 1.0)


class UnbiasedOGPM(ThreePieceMechanism):
    """Unbiased optimal piecewise mechanism (Theorem 5.1): E[M(x)] = x exactly.

    On [0, 1] the output domain is [-C, 1 + C] with C = (s + 1) / (s - 1),
    p = s / (2C + 1) and central piece [l, r) with
    l = (C + 1)/2 x - (3C + 1)(C - 1)/(4C),  r = (C + 1)/2 x + (C + 1)(C - 1)/(4C).
    """

    name = "ogpm-unbiased"
    unbiased = True

    def __init__(self, *, epsilon: float, low: float, high: float, grid_bits: int = 16):
        epsilon = _validate.epsilon(epsilon)
        low, high = _validate.interval(low, high)
        grid_bits = _validate.grid_bits(grid_bits)
        s = math.exp(epsilon / 2.0)
        c = (s + 1.0) / (s - 1.0)
        w = high - low
        left0 = -(3.0 * c + 1.0) * (c - 1.0) / (4.0 * c)  # l(0) on [0, 1]
        length = (2.0 * c + 1.0) / (s + 1.0)  # r - l on [0, 1]
        self.enlargement = c
        self._set_pieces(epsilon=epsilon, low=low, high=high, output_low=low - c * w,
                         output_high=high + c * w, length=length * w,
                         centre_at_low=low + w * (left0 + length / 2.0),
                         centre_slope=(c + 1.0) / 2.0, grid_bits=grid_bits)


class CircularOGPM(CircularThreePiece):
    """Optimal piecewise mechanism on a circle (Theorem 4.2).

    Density s / P on the arc x +- P / (2 (s + 1)) (taken modulo the period P)
    and 1 / (P s) elsewhere; with P = 2 pi this is the paper's s/(2 pi) on
    x +- pi / (s + 1).  Works in any unit: radians (period=2*pi) or degrees
    (period=360).  Values are wrapped onto [origin, origin + period).
    """

    name = "ogpm-circular"
    unbiased = True

    def __init__(self, *, epsilon: float, period: float = TWO_PI, origin: float = 0.0,
                 grid_bits: int = 16):
        epsilon = _validate.epsilon(epsilon)
        period, origin = _validate.circle(period, origin)
        self._build(epsilon, period, origin, _validate.grid_bits(grid_bits))

    def _build(self, epsilon: float, period: float, origin: float, grid_bits: int) -> None:
        s = math.exp(epsilon / 2.0)
        self._set_circle(epsilon=epsilon, period=period, origin=origin,
                         length=period / (s + 1.0), grid_bits=grid_bits)


def optimal_polar_split(epsilon: float, radius_max: float, *, weight: float = 1.0,
                        period: float = TWO_PI) -> tuple[float, float]:
    """(eps_radius, eps_angle) minimising weight*MSE_r + MSE_angle (Sec. 6, App. B.6).

    MSE_r(e) = radius_max**2 g(e) and MSE_angle(e) = (period/2)**2 g(e) with
    g = worst_case_mse_unit, which is convex and decreasing in e.  The
    objective is therefore convex in eps_radius and its derivative is solved
    to machine precision by bisection (the paper's script used a 100-point
    grid, hence its 1.32 where the optimum is 1.299).  A boundary optimum
    (one share 0) is returned as such: that component then reports uniform
    noise at no privacy cost.

    The minimum is over the splits the mechanisms can run: each share is 0 or
    at least EPSILON_MIN (the integer sampler has no layout for, e.g., the
    2e-12 that weight 7.76 at epsilon 1 asks of the radius).  When the free
    optimum leaves a side less than that, the objective, being convex, is
    smallest over the allowed shares at one of the ends of their gaps (0,
    EPSILON_MIN, epsilon - EPSILON_MIN, epsilon), so the split returned is
    still the exact optimum of what can be run.
    """
    epsilon = _validate.epsilon(epsilon)
    radius_max = _validate.positive("radius_max", radius_max)
    weight = _validate.positive("weight", weight)
    period = _validate.positive("period", period)
    alpha = weight * radius_max**2
    beta = (period / 2.0) ** 2

    def slope(e1: float) -> float:
        return alpha * _worst_case_mse_slope(e1) - beta * _worst_case_mse_slope(epsilon - e1)

    if slope(0.0) >= 0.0:
        return 0.0, epsilon
    if slope(epsilon) <= 0.0:
        return epsilon, 0.0
    lo, hi = 0.0, epsilon
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if slope(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    e1 = 0.5 * (lo + hi)
    e2 = epsilon - e1
    least = _validate.EPSILON_MIN
    if min(e1, e2) < least:
        def objective(split: tuple[float, float]) -> float:
            return alpha * worst_case_mse_unit(split[0]) + beta * worst_case_mse_unit(split[1])

        splits = [(0.0, epsilon), (epsilon, 0.0)]
        if epsilon - least >= least:
            splits += [(least, epsilon - least), (epsilon - least, least)]
        e1, e2 = min(splits, key=objective)
    return _within(epsilon, e1, e2)


def _within(epsilon: float, e1: float, e2: float) -> tuple[float, float]:
    """(e1, e2) with e1 + e2 <= epsilon exactly, not just in floats (sequential
    composition).  The angle's share gives way, unless it is pinned at EPSILON_MIN (then
    e1 is the larger)."""
    least = _validate.EPSILON_MIN
    while Fraction(e1) + Fraction(e2) > Fraction(epsilon):
        if e2 == least < e1:
            e1 = math.nextafter(e1, 0.0)
        else:
            e2 = math.nextafter(e2, 0.0)
    return e1, e2


def unbiased_variance_unit(epsilon: float) -> float:
    """The worst-case variance of one classical OGPM report on [0, 1] inverted through
    its affine mean, Var[M(x)] / a² over the inputs where E[M(x)] = a x + b (Theorem
    3.7: a = 1 - 1/s, x in [C, 1 - C]).  The density is 1/s on [0, 1] plus s - 1/s on
    [x - C, x + C), so E[M] = 1/(2s) + a x and E[M²] = 1/(3s) + a (x² + C²/3); the
    variance is convex in x, largest at the affine region's ends, x = C."""
    s = math.exp(epsilon / 2.0)
    c = 1.0 / (2.0 * (s + 1.0))
    a = 1.0 - 1.0 / s
    variance = 1.0 / (3.0 * s) + a * (c * c + c * c / 3.0) - (1.0 / (2.0 * s) + a * c) ** 2
    return variance / (a * a)


def unit_vector_variance(epsilon: float) -> float:
    """E|e^{iM}/ρ - e^{ix}|² = 1/ρ² - 1 for circular OGPM (Theorem 4.2), ρ = E[cos(M -
    x)] = ((s - 1/s)/π) sin(π/(s + 1)): the variance of the unbiased estimate of a
    reading's unit vector, about its angle's in rad² where small."""
    s = math.exp(epsilon / 2.0)
    rho = (s - 1.0 / s) / math.pi * math.sin(math.pi / (s + 1.0))
    return 1.0 / (rho * rho) - 1.0


def fleet_polar_split(epsilon: float, radius_max: float, *, weight: float = 1.0,
                      period: float = TWO_PI) -> tuple[float, float]:
    """(eps_radius, eps_angle) minimising weight * V_r + V_angle, the variances a fleet's
    means are estimated with, each as a share of its range squared: V_r =
    ``unbiased_variance_unit`` (the radius's mean inverts classical OGPM's affine mean,
    in units of radius_max²), V_angle = ``unit_vector_variance`` / (2π)² (the mean
    direction averages unit vectors; about the angle's variance in rad², over the
    circle's 2π squared).  Shares of the ranges, as the planner measures every channel,
    so neither radius_max nor the angle's unit (``period``) moves the split; ``weight``
    alone trades the radius for the direction.  Each term grows without bound as its
    share goes to 0, so both always get one (``optimal_polar_split`` minimises one
    report's worst-case error, which stays bounded at a share of 0 and at small epsilon
    gives one part everything).  The sum is convex in eps_radius (each term is convex
    and decreasing in its share): golden-section search to machine precision, shares at
    least EPSILON_MIN."""
    epsilon = _validate.epsilon(epsilon)
    _validate.positive("radius_max", radius_max)
    weight = _validate.positive("weight", weight)
    _validate.positive("period", period)
    least = _validate.EPSILON_MIN
    if epsilon < 2 * least:  # no split leaves both parts a share any mechanism takes
        return optimal_polar_split(epsilon, radius_max, weight=weight, period=period)

    def objective(e1: float) -> float:
        return (weight * unbiased_variance_unit(e1)
                + unit_vector_variance(epsilon - e1) / TWO_PI ** 2)

    lo, hi = least, epsilon - least
    for _ in range(200):
        if hi - lo <= 4 * math.ulp(hi):
            break
        m1, m2 = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
        if objective(m1) <= objective(m2):
            hi = m2
        else:
            lo = m1
    e1 = 0.5 * (lo + hi)
    return _within(epsilon, e1, epsilon - e1)


# The ways a polar channel splits its epsilon: "report", the paper's (one report's worst
# error); "fleet", the fleet means' (``fleet_polar_split``).
POLAR_SPLITS = {"report": optimal_polar_split, "fleet": fleet_polar_split}


class PolarOGPM:
    """Polar pairs (r, theta) in [0, radius_max] x circle (Sec. 6, App. B.6).

    Splits epsilon into ``epsilon_radius + epsilon_angle`` exactly minimising
    ``weight * MSE_r + MSE_theta`` (worst cases, in the units given), then
    applies ClassicalOGPM to r and CircularOGPM to theta.  The pair is
    epsilon-LDP by sequential composition; ``privacy_loss`` is the exact sum
    of the two components' losses.  A larger ``weight`` buys radius accuracy
    with angle accuracy.  Radii outside [0, radius_max] are clipped, angles
    wrapped.

    ``radius`` "pm-c" or "sw-c" reports the radius with compressed PM or SW at the
    same share instead: classical OGPM's mean is flat near 0 (Theorem 3.7), where the
    magnitudes of a resting wearer's motion crowd, and theirs is affine over the whole
    range.
    """

    name = "ogpm-polar"

    def __init__(self, *, epsilon: float, radius_max: float, weight: float = 1.0,
                 period: float = TWO_PI, origin: float = 0.0, grid_bits: int = 16,
                 radius: str | None = "ogpm", split: str | None = "report"):
        self.epsilon = _validate.epsilon(epsilon)
        self.radius_max = _validate.positive("radius_max", radius_max)
        _validate.interval(0.0, self.radius_max, names="radius_max")
        self.weight = _validate.positive("weight", weight)
        period, origin = _validate.circle(period, origin)
        self.grid_bits = _validate.grid_bits(grid_bits)
        split = "report" if split is None else split  # None: the wire's absent field
        if not isinstance(split, str):
            raise TypeError(f"split must be a str, got {type(split).__name__}")
        if split not in POLAR_SPLITS:
            raise ValueError(f"split: must be one of {', '.join(POLAR_SPLITS)}, got {split!r}")
        self.split = split
        self.epsilon_radius, self.epsilon_angle = POLAR_SPLITS[split](
            self.epsilon, self.radius_max, weight=self.weight, period=period
        )
        radius = "ogpm" if radius is None else radius  # None: the wire's absent field
        if not isinstance(radius, str):
            raise TypeError(f"radius must be a str, got {type(radius).__name__}")
        if radius not in RADIUS_MECHANISMS:
            raise ValueError(f"radius: must be one of {', '.join(RADIUS_MECHANISMS)}, "
                             f"got {radius!r}")
        self.radius = radius
        if self.epsilon_radius > 0.0:
            self.radius_mechanism = RADIUS_MECHANISMS[radius](
                epsilon=self.epsilon_radius, low=0.0, high=self.radius_max,
                grid_bits=grid_bits)
        else:
            self.radius_mechanism = ClassicalOGPM._uniform_share(0.0, self.radius_max, grid_bits)
        self.angle_mechanism = CircularOGPM.__new__(CircularOGPM)
        self.angle_mechanism._build(self.epsilon_angle, period, origin, self.grid_bits)

    @property
    def period(self) -> float:
        return self.angle_mechanism.period

    @property
    def origin(self) -> float:
        return self.angle_mechanism.origin

    @property
    def components(self) -> tuple[ClassicalOGPM, CircularOGPM]:
        return self.radius_mechanism, self.angle_mechanism

    def perturb_codes(self, radius: Any, angle: Any, rng: Any = None, *,
                      return_clipped: bool = False):
        source = as_random_source(rng)
        r_codes, r_clipped = self.radius_mechanism.perturb_codes(radius, source,
                                                                 return_clipped=True)
        a_codes, a_wrapped = self.angle_mechanism.perturb_codes(angle, source,
                                                                return_clipped=True)
        if r_codes.shape != a_codes.shape:
            raise ValueError(f"radius and angle shapes differ: {r_codes.shape} vs {a_codes.shape}")
        if return_clipped:
            return (r_codes, a_codes), r_clipped + a_wrapped
        return r_codes, a_codes

    def perturb(self, radius: Any, angle: Any, rng: Any = None) -> tuple[np.ndarray, np.ndarray]:
        return self.from_codes(*self.perturb_codes(radius, angle, rng))

    def to_codes(self, radius: Any, angle: Any) -> tuple[np.ndarray, np.ndarray]:
        return self.radius_mechanism.to_codes(radius), self.angle_mechanism.to_codes(angle)

    def from_codes(self, radius_codes: Any, angle_codes: Any) -> tuple[np.ndarray, np.ndarray]:
        return (self.radius_mechanism.from_codes(radius_codes),
                self.angle_mechanism.from_codes(angle_codes))

    def pdf(self, x: tuple[Any, Any], y: tuple[Any, Any]) -> np.ndarray:
        """Joint density: the components are independent given the input."""
        return self.radius_mechanism.pdf(x[0], y[0]) * self.angle_mechanism.pdf(x[1], y[1])

    def mean_output(self, x: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
        return self.radius_mechanism.mean_output(x[0]), self.angle_mechanism.mean_output(x[1])

    def variance(self, x: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
        return self.radius_mechanism.variance(x[0]), self.angle_mechanism.variance(x[1])

    def expected_error(self, x: tuple[Any, Any], p: int = 2) -> np.ndarray:
        """E[L_2D] = E|r' - r|**p + E d(theta', theta)**p (Sec. 6)."""
        return (self.radius_mechanism.expected_error(x[0], p)
                + self.angle_mechanism.expected_error(x[1], p))

    def worst_case_error(self, p: int = 2) -> float:
        return self.radius_mechanism.worst_case_error(p) + self.angle_mechanism.worst_case_error(p)

    def grid_pmf(self, x: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
        return self.radius_mechanism.grid_pmf(x[0]), self.angle_mechanism.grid_pmf(x[1])

    def exact_privacy_loss(self) -> ExactLoss:
        """Sequential composition: the two components' exact losses add."""
        return (self.radius_mechanism.exact_privacy_loss()
                + self.angle_mechanism.exact_privacy_loss())

    def privacy_loss(self) -> float:
        return float(self.exact_privacy_loss())

    def describe(self) -> dict[str, Any]:
        # "radius" only when not OGPM: the reports of every earlier release stay the same.
        radius = {} if self.radius == "ogpm" else {"radius": self.radius}
        split = {} if self.split == "report" else {"split": self.split}  # likewise
        return {"name": self.name, "epsilon": self.epsilon, "radius_max": self.radius_max,
                "weight": self.weight, "period": self.period, "origin": self.origin,
                "grid_bits": self.grid_bits, "epsilon_radius": self.epsilon_radius,
                "epsilon_angle": self.epsilon_angle, **radius, **split}

    def __repr__(self) -> str:
        return (f"PolarOGPM(epsilon={self.epsilon!r}, radius_max={self.radius_max!r}, "
                f"weight={self.weight!r}, epsilon_radius={self.epsilon_radius:.6g}, "
                f"epsilon_angle={self.epsilon_angle:.6g})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolarOGPM) and other.describe() == self.describe()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.describe().items())))


def _compressed(cls):
    def build(*, epsilon: float, low: float, high: float, grid_bits: int):
        return cls(epsilon=epsilon, low=low, high=high, grid_bits=grid_bits, compressed=True)
    return build


# A polar channel's radius mechanism, by configuration name (registry.LINEAR's names).
RADIUS_MECHANISMS = {"ogpm": ClassicalOGPM, "pm-c": _compressed(PiecewiseMechanism),
                     "sw-c": _compressed(SquareWave)}
