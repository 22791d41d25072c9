"""Local-differential-privacy mechanisms for bounded numerical sensor data.

Every mechanism takes keyword-only, validated parameters and offers the same
API (see ``Mechanism``): ``perturb`` / ``perturb_codes`` run an exact integer
kernel fed by the OS-seeded CSPRNG, ``to_codes`` / ``from_codes`` give the
compact wire form, and ``pdf``, ``cdf``, ``mean_output``, ``variance``,
``expected_error``, ``worst_case_error`` and ``privacy_loss`` are closed forms.
"""

from ._validate import DELTA_MAX, EPSILON_MAX, EPSILON_MIN, GRID_BITS_MAX, GRID_BITS_MIN
from .base import ExactLoss, Mechanism, split_epsilon
from .baselines import PTT, Duchi, PiecewiseMechanism, SquareWave
from .laplace import BoundedLaplace, TruncatedLaplace
from .ogpm import CircularOGPM, ClassicalOGPM, PolarOGPM, UnbiasedOGPM, optimal_polar_split
from .randomness import RandomSource, SeededRandom, SystemRandom
from .registry import MECHANISMS, from_description, kind_accepts, linear_mechanism

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
    "PiecewiseMechanism",
    "PolarOGPM",
    "PTT",
    "RandomSource",
    "SeededRandom",
    "SquareWave",
    "SystemRandom",
    "TruncatedLaplace",
    "UnbiasedOGPM",
    "from_description",
    "kind_accepts",
    "linear_mechanism",
    "optimal_polar_split",
    "split_epsilon",
]
