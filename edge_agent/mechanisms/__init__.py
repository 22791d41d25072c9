"""Local-differential-privacy mechanisms for bounded numerical sensor data.

Every mechanism takes keyword-only, validated parameters and offers the same
API (see ``Mechanism``): ``perturb`` / ``perturb_codes`` run an exact integer
kernel fed by the OS-seeded CSPRNG, ``to_codes`` / ``from_codes`` give the
compact wire form, and ``pdf``, ``cdf``, ``mean_output``, ``variance``,
``expected_error``, ``worst_case_error`` and ``privacy_loss`` are closed forms.
"""

from edge_agent.mechanisms._validate import (
    DELTA_MAX,
    EPSILON_MAX,
    EPSILON_MIN,
    GRID_BITS_MAX,
    GRID_BITS_MIN,
)
from edge_agent.mechanisms.base import ExactLoss, Mechanism, split_epsilon
from edge_agent.mechanisms.baselines import PTT, Duchi, PiecewiseMechanism, SquareWave
from edge_agent.mechanisms.gaussian import OptimalGaussian
from edge_agent.mechanisms.laplace import BoundedLaplace, TruncatedLaplace
from edge_agent.mechanisms.ogpm import (
    CircularOGPM,
    ClassicalOGPM,
    PolarOGPM,
    UnbiasedOGPM,
    fleet_polar_split,
    optimal_polar_split,
)
from edge_agent.mechanisms.randomness import RandomSource, SeededRandom, SystemRandom
from edge_agent.mechanisms.registry import (
    MECHANISMS,
    from_description,
    kind_accepts,
    linear_mechanism,
)
from edge_agent.mechanisms.tent import TypeIIPTT

__all__ = [
    "DELTA_MAX",
    "EPSILON_MAX",
    "EPSILON_MIN",
    "GRID_BITS_MAX",
    "GRID_BITS_MIN",
    "MECHANISMS",
    "BoundedLaplace",
    "CircularOGPM",
    "ClassicalOGPM",
    "Duchi",
    "ExactLoss",
    "Mechanism",
    "OptimalGaussian",
    "PiecewiseMechanism",
    "PolarOGPM",
    "PTT",
    "RandomSource",
    "SeededRandom",
    "SquareWave",
    "SystemRandom",
    "TruncatedLaplace",
    "TypeIIPTT",
    "UnbiasedOGPM",
    "from_description",
    "kind_accepts",
    "linear_mechanism",
    "fleet_polar_split",
    "optimal_polar_split",
    "split_epsilon",
]
