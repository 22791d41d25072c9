"""The one registry of mechanism names: configuration, channels, protocol and tests use it.

Two kinds of name:

* the **wire name** a mechanism announces in every report (``describe()["name"]``,
  the class attribute ``name``), from which ``from_description`` rebuilds it;
* the **configuration name** a linear or vector channel chooses in
  ``agent.toml`` (``mechanism = "pm-c"``).  Most are the wire name; ``pm-c``
  and ``sw-c`` are PM and SW with ``compressed = true``.

Which mechanisms a channel kind may carry follows from these tables too
(``kind_accepts``): circular channels carry circular OGPM, polar channels the
polar pair, categorical channels a frequency oracle (``ORACLES``: GRR, OUE,
SUE, OLH), linear and vector channels every other mechanism, and vector channels also
the mechanisms that report a whole vector at once (``VECTOR``: Duchi et al.'s
d-dimensional mechanism and its k-of-d sampling, Wang, Zhao, Yang and Ren, "Locally
Differentially Private Data Collection and Analysis", arXiv:1906.01777, Algorithms 1 and 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from edge_agent.mechanisms.base import Mechanism
from edge_agent.mechanisms.baselines import PTT, Duchi, PiecewiseMechanism, SquareWave
from edge_agent.mechanisms.categorical import LONGITUDINAL, ORACLES, FrequencyOracle
from edge_agent.mechanisms.gaussian import OptimalGaussian
from edge_agent.mechanisms.laplace import BoundedLaplace, TruncatedLaplace
from edge_agent.mechanisms.multidimensional import DuchiVector, SampledDuchi
from edge_agent.mechanisms.ogpm import (
    POLAR_SPLITS,
    CircularOGPM,
    ClassicalOGPM,
    PolarOGPM,
    UnbiasedOGPM,
)
from edge_agent.mechanisms.tent import TypeIIPTT

# Wire name -> class.
MECHANISMS: dict[str, type[Mechanism]] = {
    cls.name: cls
    for cls in (ClassicalOGPM, UnbiasedOGPM, CircularOGPM, PolarOGPM, PiecewiseMechanism,
                SquareWave, PTT, Duchi, TruncatedLaplace, BoundedLaplace, OptimalGaussian,
                TypeIIPTT)
}
CIRCULAR = CircularOGPM.name
POLAR = PolarOGPM.name
# Wire name (= configuration name) -> class: mechanisms of a whole d-vector per reading,
# for vector channels only (their k-of-d sampling is their own, not the channel's).
VECTOR = {cls.name: cls for cls in (DuchiVector, SampledDuchi)}


@dataclass(frozen=True)
class LinearChoice:
    """A configuration name of a scalar mechanism on [low, high]."""

    cls: type[Mechanism]
    options: dict[str, Any] = field(default_factory=dict)
    grid: bool = True  # takes grid_bits (Duchi reports one of two atoms instead)
    delta: bool = False  # (epsilon, delta)-LDP: takes delta (> 0)

    def build(self, *, epsilon: float, low: float, high: float, grid_bits: int,
              delta: float = 0.0) -> Mechanism:
        extra = {"grid_bits": grid_bits} if self.grid else {}
        if self.delta:
            extra["delta"] = delta
        elif delta:
            raise ValueError(f"delta: {self.cls.name} is pure epsilon-LDP; only the "
                             f"(epsilon, delta) mechanisms ({', '.join(DELTA_MECHANISMS)}) "
                             "take a delta")
        return self.cls(epsilon=epsilon, low=low, high=high, **self.options, **extra)


# Configuration name -> how to build it, in the order the documentation lists them.
LINEAR: dict[str, LinearChoice] = {
    "ogpm": LinearChoice(ClassicalOGPM),
    "ogpm-unbiased": LinearChoice(UnbiasedOGPM),
    "pm": LinearChoice(PiecewiseMechanism),
    "pm-c": LinearChoice(PiecewiseMechanism, {"compressed": True}),
    "sw": LinearChoice(SquareWave),
    "sw-c": LinearChoice(SquareWave, {"compressed": True}),
    "duchi": LinearChoice(Duchi, grid=False),
    "laplace": LinearChoice(TruncatedLaplace),
    "bounded-laplace": LinearChoice(BoundedLaplace),
    "ptt": LinearChoice(PTT),
    "opt-gm": LinearChoice(OptimalGaussian, delta=True),
    "ii-ptt": LinearChoice(TypeIIPTT),
}
# Configuration names whose mechanisms are (epsilon, delta)-LDP (a channel's ``delta``).
DELTA_MECHANISMS = tuple(name for name, choice in LINEAR.items() if choice.delta)
# ``mechanism = "auto"``: the one of these whose fleet mean errs least where the data lies
# (``mechanism_for_data``): OGPM, optimal in the worst case over the whole domain, and the two
# compressed baselines, which have no flat ends (where OGPM reports the same
# distribution for every value, Theorem 3.7, a fleet near an end is estimated at the flat
# region's edge however many report).
AUTO = "auto"
AUTO_CANDIDATES = ("ogpm", "pm-c", "sw-c")
# The reports an estimate averages when nothing says how many (a thousand wearers).
AUTO_REPORTS = 1000
# Points of the data's range the worst case is taken over.
_AUTO_POINTS = 257
# Wire names a linear or vector channel may announce ("auto" announces what it chose).
LINEAR_WIRE_NAMES = frozenset(choice.cls.name for choice in LINEAR.values())
# Configuration names of each channel kind (the circular and polar channels'
# ``mechanism`` key allows only "ogpm", the paper's mechanism for them; a vector channel's
# axes share its epsilon, not a delta: the scalar (epsilon, delta) ones are for linear
# channels, and a vector channel's delta is for its mechanisms of whole vectors, VECTOR).
KIND_CONFIG_NAMES = {"linear": (*LINEAR, AUTO),
                     "vector": (*(name for name in LINEAR if not LINEAR[name].delta), AUTO,
                                *VECTOR),
                     "circular": ("ogpm",), "polar": ("ogpm",)}


def linear_mechanism(name: str, *, epsilon: float, low: float, high: float,
                     grid_bits: int, delta: float = 0.0) -> Mechanism:
    """The scalar mechanism a linear or vector channel configures as ``name`` on [low, high]
    (``delta`` for the (epsilon, delta) ones); "auto": ``mechanism_for_data``'s choice for a
    fleet anywhere in the domain."""
    if name == AUTO:
        if delta:
            raise ValueError('delta: "auto" chooses among pure epsilon-LDP mechanisms')
        return mechanism_for_data(AUTO, epsilon=epsilon, data=(low, high), bounds=(low, high),
                                  grid_bits=grid_bits)
    try:
        choice = LINEAR[name]
    except KeyError:
        raise ValueError(f"unknown linear mechanism {name!r}; known: "
                         f"{', '.join(KIND_CONFIG_NAMES['linear'])}") from None
    return choice.build(epsilon=epsilon, low=low, high=high, grid_bits=grid_bits, delta=delta)


@lru_cache(maxsize=256)
def flat_fraction(name: str, *, epsilon: float, grid_bits: int) -> float:
    """The share of a domain's width at each end where the mechanism ``name`` has a flat
    mean (classical OGPM, Theorem 3.7; it depends on epsilon only); 0 for the others."""
    affine = LINEAR[name].build(epsilon=epsilon, low=0.0, high=1.0,
                                grid_bits=grid_bits).affine_mean()
    return 0.0 if affine is None else max(0.0, affine[2], 1.0 - affine[3])


# Cached: every virtual agent of a fleet (and the planner) asks the same question, and
# shares the answer as it shares its channels' template mechanisms.
@lru_cache(maxsize=256)
def mechanism_for_data(name: str, *, epsilon: float, data: tuple[float, float],
                       bounds: tuple[float, float], grid_bits: int, margin: float | None = None,
                       reports: int = AUTO_REPORTS, delta: float = 0.0) -> Mechanism:
    """The mechanism for a fleet whose values lie in ``data`` = (least, largest).

    ``margin`` None: over the fixed domain ``bounds``.  Otherwise over ``data`` widened
    by ``margin`` x its width on each side, and further where the mechanism's mean is
    flat near the ends (so that the data stay where the mean is affine: a fleet in a
    flat end is estimated at its edge), kept inside ``bounds``.  ``name`` "auto": each
    of AUTO_CANDIDATES over its own domain, the one whose mean of ``reports`` reports
    errs least in the worst case over ``data`` (ties to the earlier candidate).
    """
    lo, hi = min(max(data[0], bounds[0]), bounds[1]), max(min(data[1], bounds[1]), bounds[0])
    lo, hi = min(lo, hi), max(lo, hi)
    points = np.linspace(lo, hi, _AUTO_POINTS)

    def build(candidate: str) -> Mechanism:
        low, high = bounds
        if margin is not None:
            width = max(hi - lo, 1e-9 * (bounds[1] - bounds[0]))
            flat = flat_fraction(candidate, epsilon=epsilon, grid_bits=grid_bits)
            # data + m w on each side, and at least a flat end's share of the result
            # (x_lo = low + flat (high - low) <= lo): total = w (1 + 2m) and w / (1 - 2 flat).
            total = max(width * (1.0 + 2.0 * margin), width / max(1.0 - 2.0 * flat, 1e-9))
            side = 0.5 * (total - width)
            low, high = max(bounds[0], lo - side), min(bounds[1], hi + side)
        return linear_mechanism(candidate, epsilon=epsilon, low=low, high=high,
                                grid_bits=grid_bits, delta=delta)

    if name != AUTO:
        return build(name)
    built = [build(candidate) for candidate in AUTO_CANDIDATES]
    errors = [float(np.max(m.averaged_error(points, reports))) for m in built]
    return built[errors.index(min(errors))]


def polar_mechanism(*, epsilon: float, radius_max: float, weight: float, period: float,
                    origin: float, grid_bits: int, radius: str = "ogpm",
                    split: str = "report") -> PolarOGPM:
    """A polar channel's mechanism; ``radius`` "auto": of AUTO_CANDIDATES the one whose
    fleet mean of the radius errs least over [0, radius_max] at the split's share
    (``mechanism_for_data``, the whole range: nothing discovers a radius range)."""
    if radius == AUTO:
        # The split PolarOGPM makes (it does not depend on the radius's mechanism).
        share = POLAR_SPLITS[split](epsilon, radius_max, weight=weight, period=period)[0]
        radius = "ogpm"
        if share > 0:
            chosen = mechanism_for_data(AUTO, epsilon=share, data=(0.0, radius_max),
                                        bounds=(0.0, radius_max), grid_bits=grid_bits)
            radius = next(n for n in AUTO_CANDIDATES if linear_mechanism(
                n, epsilon=share, low=0.0, high=radius_max, grid_bits=grid_bits) == chosen)
    return PolarOGPM(epsilon=epsilon, radius_max=radius_max, weight=weight, period=period,
                     origin=origin, grid_bits=grid_bits, radius=radius, split=split)


def kind_accepts(kind: str, wire_name: str) -> bool:
    """Whether a channel of ``kind`` may report with the mechanism named ``wire_name``."""
    if kind == "circular":
        return wire_name == CIRCULAR
    if kind == "polar":
        return wire_name == POLAR
    if kind == "categorical":
        return wire_name in ORACLES or wire_name in LONGITUDINAL
    return wire_name in LINEAR_WIRE_NAMES or (kind == "vector" and wire_name in VECTOR)


# Derived quantities that describe() reports but the constructors do not take.
_DERIVED = {"epsilon_radius", "epsilon_angle"}


def from_description(description: dict[str, Any]) -> Mechanism | FrequencyOracle:
    """The mechanism (or frequency oracle) a ``describe()`` dict names; unknown names or
    keys raise ValueError."""
    if not isinstance(description, dict):
        raise TypeError("a mechanism description must be a dict")
    params = dict(description)
    name = params.pop("name", None)
    cls = MECHANISMS.get(name) or VECTOR.get(name) or ORACLES.get(name) or LONGITUDINAL.get(name)
    if cls is None:
        known = ", ".join(sorted([*MECHANISMS, *VECTOR, *ORACLES, *LONGITUDINAL]))
        raise ValueError(f"unknown mechanism {name!r}; known: {known}")
    derived = {k: params.pop(k) for k in _DERIVED & params.keys()}
    try:
        mechanism = cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for {name}: {exc}") from None
    for key, value in derived.items():
        if getattr(mechanism, key) != value:
            raise ValueError(f"{name}: {key}={value!r} does not match the parameters")
    return mechanism
