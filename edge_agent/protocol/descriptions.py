"""Mechanism descriptions: a mechanism's parameters as they travel in every report
(its ``describe()``, tagged by its wire name), and the mechanism a description names."""

from functools import lru_cache
from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, Struct

from edge_agent.mechanisms import (
    DELTA_MAX,
    MECHANISMS,
    PTT,
    BoundedLaplace,
    CircularOGPM,
    ClassicalOGPM,
    Duchi,
    Mechanism,
    OptimalGaussian,
    PiecewiseMechanism,
    PolarOGPM,
    SquareWave,
    TruncatedLaplace,
    TypeIIPTT,
    UnbiasedOGPM,
    from_description,
)
from edge_agent.mechanisms.categorical import (
    LONGITUDINAL,
    MAX_CATEGORIES,
    MAX_LABELS,
    ORACLES,
    LongitudinalGRR,
)
from edge_agent.mechanisms.multidimensional import MAX_DIMENSIONS, DuchiVector, SampledDuchi
from edge_agent.mechanisms.ogpm import RADIUS_MECHANISMS
from edge_agent.mechanisms.registry import VECTOR
from edge_agent.protocol.codec import define
from edge_agent.protocol.fields import (
    CategoryLabel,
    Epsilon,
    Finite,
    GridBits,
    Positive,
    SplitEpsilon,
)

# -- mechanism descriptions (a mechanism's describe(), tagged by its wire name) ---------------

class _Interval(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name"):
    epsilon: Epsilon
    low: Finite
    high: Finite
    grid_bits: GridBits


class _Compressible(_Interval):
    compressed: bool


class _IntervalDelta(_Interval):
    """An (epsilon, delta) mechanism on an interval: also its delta (> 0)."""

    delta: Annotated[float, Meta(gt=0.0, le=DELTA_MAX)]


class _TwoAtoms(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name"):
    epsilon: Epsilon
    low: Finite
    high: Finite


class _Circle(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name"):
    epsilon: Epsilon
    period: Positive
    origin: Finite
    grid_bits: GridBits


class _PolarPair(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name",
                 omit_defaults=True):
    epsilon: Epsilon
    radius_max: Positive
    weight: Positive
    period: Positive
    origin: Finite
    grid_bits: GridBits
    epsilon_radius: SplitEpsilon
    epsilon_angle: SplitEpsilon
    # The radius's mechanism when not classical OGPM (left out for it, as in earlier
    # releases' reports; None, not "ogpm", as the default: msgspec omits a default by
    # identity, and a decoded or unpickled "ogpm" is another string object).
    radius: Literal[tuple(n for n in RADIUS_MECHANISMS if n != "ogpm")] | None = None  # type: ignore[valid-type]
    # How epsilon was split when not the paper's ("report"): "fleet", for the fleet's
    # means (left out for "report", as in earlier releases' reports; None as above).
    split: Literal["fleet"] | None = None


# Each registered mechanism's parameters (what its describe() gives), by wire name; a
# mechanism registered without a shape here fails at import.
_SHAPES = {ClassicalOGPM: _Interval, UnbiasedOGPM: _Interval, PTT: _Interval,
           TruncatedLaplace: _Interval, BoundedLaplace: _Interval,
           PiecewiseMechanism: _Compressible, SquareWave: _Compressible, Duchi: _TwoAtoms,
           CircularOGPM: _Circle, PolarOGPM: _PolarPair, OptimalGaussian: _IntervalDelta,
           TypeIIPTT: _Interval}

class _Categories(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name",
                  omit_defaults=True):
    """A frequency oracle (edge_agent.mechanisms.categorical) over ``categories``
    categories, named by ``labels`` (numbered without)."""

    epsilon: Epsilon
    categories: Annotated[int, Meta(ge=2, le=MAX_CATEGORIES)]
    delta: Annotated[float, Meta(ge=0.0, le=DELTA_MAX)] = 0.0
    labels: Annotated[tuple[CategoryLabel, ...], Meta(max_length=MAX_LABELS)] | None = None


class _MemoizedCategories(_Categories, kw_only=True):
    """A memoized frequency oracle: also the permanent layer's epsilon (required)."""

    memo_epsilon: Epsilon


_SHAPES[LongitudinalGRR] = _MemoizedCategories


class _Vector(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name"):
    """A mechanism of whole d-vectors on [low, high]^d (Wang, Zhao, Yang and Ren, "Locally
    Differentially Private Data Collection and Analysis", arXiv:1906.01777, Algorithm 1)
    at (epsilon, delta) per reading."""

    epsilon: Epsilon
    dimensions: Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)]
    delta: Annotated[float, Meta(ge=0.0, le=DELTA_MAX)]
    low: Finite
    high: Finite


class _SampledVector(_Vector, kw_only=True):
    """k of the d axes per reading, each at (epsilon/k, delta/k) (Wang et al.
    arXiv:1906.01777 Algorithm 3)."""

    k: Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)]


_SHAPES.update({DuchiVector: _Vector, SampledDuchi: _SampledVector})

DESCRIPTIONS: dict[str, type[Struct]] = {
    name: define(__name__, f"{cls.__name__}Description", _SHAPES.get(cls, _Categories), name)
    for name, cls in {**MECHANISMS, **VECTOR, **ORACLES, **LONGITUDINAL}.items()}
MechanismDescription = Union[tuple(DESCRIPTIONS.values())]  # noqa: UP007 (built from a tuple)


def description_name(description: Struct) -> str:
    return type(description).__struct_config__.tag


def describe(mechanism: Mechanism | dict) -> Struct:
    """A mechanism's typed description (from the mechanism or its ``describe()`` dict)."""
    described = mechanism if isinstance(mechanism, dict) else mechanism.describe()
    return msgspec.convert(described, MechanismDescription)


@lru_cache(maxsize=4096)  # bounded: a hostile sender cannot grow it
def mechanism_of(description: Struct) -> Mechanism:
    """The mechanism a description names, built once per description (the one cache)."""
    return from_description({"name": description_name(description),
                             **msgspec.structs.asdict(description)})


def as_dict(message: Struct) -> dict:
    """A struct as plain JSON values (tags included), e.g. for the API's documents."""
    return msgspec.to_builtins(message)
