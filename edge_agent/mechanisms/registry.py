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
SUE, OLH), linear and vector channels every other mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_agent.mechanisms.base import Mechanism
from edge_agent.mechanisms.baselines import PTT, Duchi, PiecewiseMechanism, SquareWave
from edge_agent.mechanisms.categorical import LONGITUDINAL, ORACLES, FrequencyOracle
from edge_agent.mechanisms.laplace import BoundedLaplace, TruncatedLaplace
from edge_agent.mechanisms.ogpm import CircularOGPM, ClassicalOGPM, PolarOGPM, UnbiasedOGPM

# Wire name -> class.
MECHANISMS: dict[str, type[Mechanism]] = {
    cls.name: cls
    for cls in (ClassicalOGPM, UnbiasedOGPM, CircularOGPM, PolarOGPM, PiecewiseMechanism,
                SquareWave, PTT, Duchi, TruncatedLaplace, BoundedLaplace)
}
CIRCULAR = CircularOGPM.name
POLAR = PolarOGPM.name


@dataclass(frozen=True)
class LinearChoice:
    """A configuration name of a scalar mechanism on [low, high]."""

    cls: type[Mechanism]
    options: dict[str, Any] = field(default_factory=dict)
    grid: bool = True  # takes grid_bits (Duchi reports one of two atoms instead)

    def build(self, *, epsilon: float, low: float, high: float, grid_bits: int) -> Mechanism:
        grid = {"grid_bits": grid_bits} if self.grid else {}
        return self.cls(epsilon=epsilon, low=low, high=high, **self.options, **grid)


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
}
# Wire names a linear or vector channel may announce.
LINEAR_WIRE_NAMES = frozenset(choice.cls.name for choice in LINEAR.values())
# Configuration names of each channel kind (the circular and polar channels'
# ``mechanism`` key allows only "ogpm", the paper's mechanism for them).
KIND_CONFIG_NAMES = {"linear": tuple(LINEAR), "vector": tuple(LINEAR), "circular": ("ogpm",),
                     "polar": ("ogpm",)}


def linear_mechanism(name: str, *, epsilon: float, low: float, high: float,
                     grid_bits: int) -> Mechanism:
    """The scalar mechanism a linear or vector channel configures as ``name``."""
    try:
        choice = LINEAR[name]
    except KeyError:
        raise ValueError(f"unknown linear mechanism {name!r}; known: {', '.join(LINEAR)}") \
            from None
    return choice.build(epsilon=epsilon, low=low, high=high, grid_bits=grid_bits)


def kind_accepts(kind: str, wire_name: str) -> bool:
    """Whether a channel of ``kind`` may report with the mechanism named ``wire_name``."""
    if kind == "circular":
        return wire_name == CIRCULAR
    if kind == "polar":
        return wire_name == POLAR
    if kind == "categorical":
        return wire_name in ORACLES or wire_name in LONGITUDINAL
    return wire_name in LINEAR_WIRE_NAMES


# Derived quantities that describe() reports but the constructors do not take.
_DERIVED = {"epsilon_radius", "epsilon_angle"}


def from_description(description: dict[str, Any]) -> Mechanism | FrequencyOracle:
    """The mechanism (or frequency oracle) a ``describe()`` dict names; unknown names or
    keys raise ValueError."""
    if not isinstance(description, dict):
        raise TypeError("a mechanism description must be a dict")
    params = dict(description)
    name = params.pop("name", None)
    cls = MECHANISMS.get(name) or ORACLES.get(name) or LONGITUDINAL.get(name)
    if cls is None:
        known = ", ".join(sorted([*MECHANISMS, *ORACLES, *LONGITUDINAL]))
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
