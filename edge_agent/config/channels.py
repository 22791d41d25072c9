"""The agent's ``[[channels]]``: one table type per channel kind, told apart by ``kind``.

A channel turns one source field (or fields) into perturbed reports; its table names the
mechanism, epsilon per report and the domain.  ``mechanism_problem`` builds the
channel's mechanism the way the agent will, so check-config refuses what the agent's
start would.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union

from pydantic import Field, field_validator, model_validator

from edge_agent.common.config import Epsilon, GridBits, Model, Name, Unit, union_tags
from edge_agent.mechanisms import (
    DELTA_MAX,
    EPSILON_MIN,
    CircularOGPM,
    linear_mechanism,
    split_epsilon,
)
from edge_agent.mechanisms.categorical import (
    LABEL,
    MAX_LABELS,
    ORACLES,
    LongitudinalGRR,
    best_oracle,
)
from edge_agent.mechanisms.multidimensional import MAX_DIMENSIONS, SampledDuchi
from edge_agent.mechanisms.ogpm import RADIUS_MECHANISMS
from edge_agent.mechanisms.registry import (
    AUTO,
    AUTO_CANDIDATES,
    DELTA_MECHANISMS,
    KIND_CONFIG_NAMES,
    VECTOR,
    polar_mechanism,
)
from edge_agent.protocol.topics import STATUS

RESERVED_CHANNEL_NAMES = {STATUS}

# The configuration names of edge_agent.mechanisms.registry ("pm-c" is PM, compressed).
LinearMechanism = Literal[KIND_CONFIG_NAMES["linear"]]  # type: ignore[valid-type]
VectorMechanism = Literal[KIND_CONFIG_NAMES["vector"]]  # type: ignore[valid-type]
OgpmOnly = Literal[KIND_CONFIG_NAMES["circular"]]  # type: ignore[valid-type]
RadiusMechanism = Literal[(*RADIUS_MECHANISMS, AUTO)]  # type: ignore[valid-type]


class _ChannelBase(Model):
    name: Name
    source: Name
    # Per report (a vector or polar report counts once).  Leave it out and the planner
    # sets it ([privacy] plan = "auto", docs/guides/PRIVACY.md "The planner").
    epsilon: Epsilon | None = None
    # Seconds between reported readings: sub-sampling stretches the budget (plan = "manual").
    report_interval: Annotated[float, Field(ge=0, le=86400)] = 0.0
    # plan = "auto": this channel's share of every guarantee, relative to the others'.
    plan_weight: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    grid_bits: GridBits = 16

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value in RESERVED_CHANNEL_NAMES:
            raise ValueError(f"{value!r} is reserved for the agent's status topic")
        return value


def _check_domain(domain: tuple[float, float]) -> tuple[float, float]:
    low, high = domain
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"must be [low, high] with finite low < high, got {list(domain)}")
    return domain


class LinearChannelConfig(_ChannelBase):
    kind: Literal["linear"]
    field: str
    mechanism: LinearMechanism = "ogpm"
    domain: tuple[float, float] | Literal["auto"]
    unit: Unit | None = None  # of the readings (and domain); the collector shows it
    # domain = "auto": report over initial_domain until the fleet's range has been
    # discovered (range discovery), then, from the next budget period on, over the
    # discovered [min, max] (the outer ends of the results' intervals) widened by
    # domain_margin x its width on each side (never beyond initial_domain).
    # mechanism = "auto": of OGPM, PM-C and SW-C the one whose fleet mean errs least in
    # the worst case over the discovered range (the domain until then), chosen again
    # when a range is discovered (edge_agent.mechanisms.registry.choose_linear).
    initial_domain: tuple[float, float] | None = None
    domain_margin: Annotated[float, Field(ge=0, le=10)] = 0.1
    # mechanism = "opt-gm" ((epsilon, delta)-LDP, required > 0): each report also costs its
    # exact delta at epsilon (at most this), which the [privacy] guarantees must allow.
    delta: Annotated[float, Field(ge=0, le=DELTA_MAX)] = 0.0

    _domain = field_validator("domain")(
        classmethod(lambda cls, v: v if v == "auto" else _check_domain(v)))
    _initial = field_validator("initial_domain")(
        classmethod(lambda cls, v: v if v is None else _check_domain(v)))

    @model_validator(mode="after")
    def _auto_domain(self):
        if self.mechanism in DELTA_MECHANISMS and self.delta == 0:
            raise ValueError(f"delta: required with mechanism = {self.mechanism!r}, which is "
                             f"(epsilon, delta)-LDP (e.g. delta = 1e-6)")
        if self.mechanism not in DELTA_MECHANISMS and self.delta > 0:
            raise ValueError(f"delta: only with an (epsilon, delta) mechanism "
                             f"({', '.join(DELTA_MECHANISMS)}); {self.mechanism!r} is pure")
        if self.domain == "auto" and self.initial_domain is None:
            raise ValueError('initial_domain: required with domain = "auto" (the domain to '
                             "report over until a range is discovered)")
        if self.domain != "auto" and self.initial_domain is not None:
            raise ValueError('initial_domain: only with domain = "auto"')
        return self

    @property
    def start_domain(self) -> tuple[float, float]:
        return self.initial_domain if self.domain == "auto" else self.domain


class CircularChannelConfig(_ChannelBase):
    kind: Literal["circular"]
    field: str
    mechanism: OgpmOnly = "ogpm"
    unit: Literal["rad", "deg"] = "rad"
    # Start of the reported range: 0 gives [0, 2pi) / [0, 360); -pi / -180 a
    # signed range.  Values are wrapped either way.
    origin: float = 0.0


class PolarChannelConfig(_ChannelBase):
    kind: Literal["polar"]
    fields: tuple[str, str]  # (magnitude, direction)
    mechanism: OgpmOnly = "ogpm"
    radius_max: Annotated[float, Field(gt=0)]
    weight: Annotated[float, Field(gt=0)] = 1.0  # radius accuracy vs angle accuracy
    unit: Literal["rad", "deg"] = "rad"  # the angle's
    origin: float = 0.0
    radius_unit: Unit | None = None  # the magnitude's ("g", "m/s"); the collector shows it
    # The radius's mechanism at its share of epsilon: "ogpm" (the paper's), "pm-c" or
    # "sw-c" (no flat ends: for magnitudes that crowd 0, like a resting wearer's motion),
    # or "auto": the one of those whose fleet mean errs least over [0, radius_max].
    radius_mechanism: RadiusMechanism = "ogpm"
    # How epsilon is split between radius and angle: "fleet", for the least error of the
    # fleet's means (weight x the radius's variance + the direction's: both always get
    # a share); "report", the paper's (one report's worst error, Sec. 6: at small epsilon
    # one of them gets everything and the other's reports say nothing).
    split: Literal["fleet", "report"] = "fleet"


class VectorChannelConfig(_ChannelBase):
    kind: Literal["vector"]
    fields: Annotated[list[str], Field(min_length=2, max_length=64)]
    # A scalar mechanism for each reported axis, or one of the whole vector:
    # duchi-vector (every axis a sign, jointly at epsilon and delta) or sampled-duchi
    # (k random axes, each a sign at epsilon/k and delta/k): Wang, Zhao, Yang and Ren,
    # "Locally Differentially Private Data Collection and Analysis" (arXiv:1906.01777),
    # Alg. 1 and 3.
    mechanism: VectorMechanism = "ogpm"
    domain: tuple[float, float]
    unit: Unit | None = None  # of every axis
    # split: every reading reports all d axes at epsilon/d each;
    # sample: every reading reports k random axes at epsilon/k each;
    # auto: the k (k = d is split) with the smallest worst-case variance of the
    #       per-axis mean, from the mechanism's closed form.
    # Not with duchi-vector or sampled-duchi, which report whole vectors.
    strategy: Literal["split", "sample", "auto"] = "auto"
    # strategy 'sample': the axes per reading; sampled-duchi: its k (leave it out: the k
    # of least worst-case variance, Wang et al. arXiv:1906.01777 Lemma 5).
    k: Annotated[int, Field(ge=1)] | None = None
    # duchi-vector and sampled-duchi only: (epsilon, delta)-LDP per reading, which
    # [privacy] budget_delta must allow (Wang et al. arXiv:1906.01777).  0 is pure epsilon-LDP.
    delta: Annotated[float, Field(ge=0, le=DELTA_MAX)] = 0.0

    _domain = field_validator("domain")(classmethod(lambda cls, v: _check_domain(v)))

    @model_validator(mode="after")
    def _k_fits(self):
        if len(set(self.fields)) != len(self.fields):
            raise ValueError("fields must be distinct")
        if self.mechanism in VECTOR:
            if len(self.fields) > MAX_DIMENSIONS:
                raise ValueError(f"fields: {self.mechanism} takes at most {MAX_DIMENSIONS} "
                                 f"axes, got {len(self.fields)}")
            if "strategy" in self.model_fields_set:
                raise ValueError(f"strategy: {self.mechanism} reports whole vectors (leave "
                                 f"strategy out; sampled-duchi takes k)")
            if self.k is not None and self.mechanism != SampledDuchi.name:
                raise ValueError(f"k: {self.mechanism} reports every axis (sampled-duchi "
                                 f"reports k of them)")
            if self.k is not None and not 1 <= self.k <= len(self.fields):
                raise ValueError(f"k: must be in [1, {len(self.fields)}], got {self.k}")
            return self
        if self.delta > 0:
            raise ValueError(f"delta: only duchi-vector and sampled-duchi take a delta, "
                             f"not {self.mechanism!r}")
        if self.strategy == "sample":
            if self.k is None:
                raise ValueError("strategy 'sample' needs k")
            if not 1 <= self.k <= len(self.fields):
                raise ValueError(f"k must be in [1, {len(self.fields)}], got {self.k}")
        elif self.k is not None:
            raise ValueError(f"k is only used with strategy 'sample', not {self.strategy!r}")
        return self

    def build_vector_mechanism(self):
        """duchi-vector or sampled-duchi as the channel configures it, over the domain."""
        options = {"k": self.k} if self.mechanism == SampledDuchi.name else {}
        return VECTOR[self.mechanism](epsilon=self.epsilon, dimensions=len(self.fields),
                                      delta=self.delta, low=self.domain[0],
                                      high=self.domain[1], **options)


Oracle = Literal[("auto", *ORACLES)]  # type: ignore[valid-type]
CategoryLabel = Annotated[str, Field(pattern=f"^{LABEL.pattern}$")]


class CategoricalChannelConfig(_ChannelBase):
    """A field whose readings are categories, reported with a frequency oracle.

    The categories are given one of three ways:

    * a text field: ``categories = ["rest", "walk", "run"]``, the words it carries;
    * an integer field: ``categories = [1, 2, 3, 4]``, the values it takes;
    * a numeric field cut into bins: ``bin_edges = [40, 60, 80, 100, 200]`` (k + 1
      increasing edges, k bins [e_i, e_i+1), the last one closed); ``categories``
      then optionally names the bins.
    """

    kind: Literal["categorical"]
    field: str
    categories: list[CategoryLabel] | list[int] | None = None
    bin_edges: list[float] | None = None
    unit: Unit | None = None  # of the field (its bin_edges), shown with the bins
    # grr | oue | sue | olh, or auto: the one of least variance for this domain size and
    # epsilon (GRR for small domains, OLH for large ones; edge_agent.mechanisms.categorical).
    oracle: Oracle = "auto"
    # (epsilon, delta)-LDP: each report also costs delta, which [privacy] budget_delta
    # must allow (Wang et al. arXiv:1906.01777 Section 5).  0 is pure epsilon-LDP.
    delta: Annotated[float, Field(ge=0, le=DELTA_MAX)] = 0.0
    # A reading that is none of the categories (a word or value not listed): "drop" it,
    # or report it as the category named here (e.g. "other"): dropping changes how many
    # reports a batch has, reporting it does not (docs/guides/PRIVACY.md).
    unknown: str = "drop"
    # For values that change slowly (an activity): each value gets a permanent randomized
    # response (GRR at memo_epsilon), drawn once, kept in the state file for good, and
    # every report randomizes it again (GRR at epsilon).  However often an unchanged value
    # is reported, what the reports reveal about it stays within memo_epsilon; reports of
    # an unchanged value are linked (docs/guides/PRIVACY.md, "Memoized categories").
    memoize: bool = False
    memo_epsilon: Epsilon | None = None  # with memoize: the permanent layer's, per value

    @model_validator(mode="after")
    def _memoized(self):
        if not self.memoize:
            if self.memo_epsilon is not None:
                raise ValueError("memo_epsilon: only with memoize = true")
            return self
        if self.memo_epsilon is None:
            raise ValueError("memo_epsilon: required with memoize = true (what a memoized "
                             "value's reports reveal about it, at most, for good)")
        if self.oracle not in ("auto", "grr"):
            raise ValueError(f"oracle: memoized reports are GRR's (l-grr): 'auto' or 'grr', "
                             f"got {self.oracle!r}")
        if self.delta > 0:
            raise ValueError("delta: memoized reports are pure epsilon-LDP (0)")
        return self

    @model_validator(mode="after")
    def _categories(self):
        if self.bin_edges is not None:
            edges = self.bin_edges
            if len(edges) < 3 or not all(math.isfinite(e) for e in edges) \
                    or any(b <= a for a, b in zip(edges, edges[1:])):
                raise ValueError("bin_edges: must be at least 3 finite, increasing edges "
                                 "(2 bins or more)")
            if self.categories is not None and (
                    len(self.categories) != len(edges) - 1
                    or not all(isinstance(c, str) for c in self.categories)):
                raise ValueError(f"categories: with bin_edges, names for the "
                                 f"{len(edges) - 1} bins (or leave it out)")
        elif self.categories is None:
            raise ValueError("categories: required (the words or integers the field "
                             "carries), or bin_edges for a numeric field")
        elif len(self.categories) < 2:
            raise ValueError("categories: at least 2")
        if self.categories is not None and len(set(self.categories)) != len(self.categories):
            raise ValueError("categories: must be distinct")
        if self.unknown != "drop" and self.unknown not in [str(c) for c in self.labels]:
            raise ValueError(f"unknown: 'drop' or one of the categories, got {self.unknown!r}")
        return self

    @property
    def count(self) -> int:
        return len(self.bin_edges) - 1 if self.bin_edges is not None else len(self.categories)

    @property
    def labels(self) -> tuple[str, ...]:
        """The categories' names (bins unnamed: their ranges, "[40, 60)")."""
        if self.categories is not None:
            return tuple(str(c) for c in self.categories)
        edges = self.bin_edges
        return tuple(f"[{a:g}, {b:g}{']' if i == len(edges) - 2 else ')'}"
                     for i, (a, b) in enumerate(zip(edges, edges[1:])))

    @property
    def text(self) -> bool:
        """Whether the field carries words (else numbers)."""
        return self.bin_edges is None and isinstance(self.categories[0], str)

    def chosen_oracle(self) -> str:
        if self.memoize:
            return LongitudinalGRR.name
        if self.oracle != "auto":
            return self.oracle
        return best_oracle(epsilon=self.epsilon, categories=self.count, delta=self.delta)

    def build_oracle(self):
        """The channel's frequency oracle (labels only up to MAX_LABELS categories)."""
        labels = self.labels if self.count <= MAX_LABELS else None
        if self.memoize:
            return LongitudinalGRR(epsilon=self.epsilon, memo_epsilon=self.memo_epsilon,
                                   categories=self.count, labels=labels)
        return ORACLES[self.chosen_oracle()](epsilon=self.epsilon, categories=self.count,
                                             delta=self.delta, labels=labels)


ChannelConfig = Annotated[
    Union[LinearChannelConfig, CircularChannelConfig, PolarChannelConfig, VectorChannelConfig,
          CategoricalChannelConfig],
    Field(discriminator="kind"),
]


def mechanism_problem(channel) -> str | None:
    """Why the channel's mechanism cannot be built (the mechanisms' own checks: epsilon
    per axis, domain width and overflow), or None; so that check-config says it, not the
    agent's start."""
    try:
        if channel.kind == "linear":
            low, high = channel.start_domain
            # "auto" may choose any candidate once the range is known.
            for name in AUTO_CANDIDATES if channel.mechanism == AUTO else [channel.mechanism]:
                linear_mechanism(name, epsilon=channel.epsilon, low=low, high=high,
                                 grid_bits=channel.grid_bits, delta=channel.delta)
        elif channel.kind == "vector" and channel.mechanism in VECTOR:
            channel.build_vector_mechanism()
        elif channel.kind == "vector":
            # "auto" may choose any k of 1..d axes: the smallest share is epsilon / d.
            axes = channel.k if channel.strategy == "sample" else len(channel.fields)
            share = split_epsilon(channel.epsilon, axes)
            if share < EPSILON_MIN:
                return (f"epsilon {channel.epsilon:g} over {axes} axes is {share:.3g} per axis, "
                        f"below the least a mechanism takes ({EPSILON_MIN:g}): raise "
                        f"epsilon or report fewer axes per reading (strategy 'sample')")
            linear_mechanism(channel.mechanism, epsilon=share, low=channel.domain[0],
                             high=channel.domain[1], grid_bits=channel.grid_bits)
        elif channel.kind == "circular":
            CircularOGPM(epsilon=channel.epsilon, period=period_of(channel.unit),
                         origin=channel.origin, grid_bits=channel.grid_bits)
        elif channel.kind == "categorical":
            channel.build_oracle()
        elif channel.kind == "polar":
            polar_mechanism(epsilon=channel.epsilon, radius_max=channel.radius_max,
                            weight=channel.weight, period=period_of(channel.unit),
                            origin=channel.origin, grid_bits=channel.grid_bits,
                            radius=channel.radius_mechanism, split=channel.split)
    except (ValueError, OverflowError) as exc:
        return str(exc)
    return None


def period_of(unit: str) -> float:
    """The circle's length in ``unit`` (rad or deg)."""
    return 2.0 * math.pi if unit == "rad" else 360.0


union_tags("linear", "circular", "polar", "vector", "categorical")
