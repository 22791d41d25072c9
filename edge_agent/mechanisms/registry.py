"""Rebuild a mechanism from its ``describe()`` dictionary (the wire protocol's form)."""

from __future__ import annotations

from typing import Any

from .baselines import PTT, Duchi, PiecewiseMechanism, SquareWave
from .laplace import BoundedLaplace, TruncatedLaplace
from .ogpm import CircularOGPM, ClassicalOGPM, PolarOGPM, UnbiasedOGPM

MECHANISMS = {
    cls.name: cls
    for cls in (ClassicalOGPM, UnbiasedOGPM, CircularOGPM, PolarOGPM, PiecewiseMechanism,
                SquareWave, PTT, Duchi, TruncatedLaplace, BoundedLaplace)
}

# Derived quantities that describe() reports but the constructors do not take.
_DERIVED = {"epsilon_radius", "epsilon_angle"}


def from_description(description: dict[str, Any]):
    """The mechanism a ``describe()`` dict names; unknown names or keys raise ValueError."""
    if not isinstance(description, dict):
        raise TypeError("a mechanism description must be a dict")
    params = dict(description)
    name = params.pop("name", None)
    cls = MECHANISMS.get(name)
    if cls is None:
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(sorted(MECHANISMS))}")
    derived = {k: params.pop(k) for k in _DERIVED & params.keys()}
    try:
        mechanism = cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for {name}: {exc}") from None
    for key, value in derived.items():
        if getattr(mechanism, key) != value:
            raise ValueError(f"{name}: {key}={value!r} does not match the parameters")
    return mechanism
