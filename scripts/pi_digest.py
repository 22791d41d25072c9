"""Seeded outputs and exact privacy losses of every mechanism, as one JSON document, so
that two machines (x86_64 and arm64, ``scripts/pi_check.py``) can be compared bit for
bit: the same seed must give the same codes, and the exact losses the same integers.

Run: ``python scripts/pi_digest.py`` (prints the JSON)."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from edge_agent.mechanisms import CircularOGPM, PolarOGPM, linear_mechanism
from edge_agent.mechanisms.categorical import ORACLES, LongitudinalGRR
from edge_agent.mechanisms.randomness import SeededRandom
from edge_agent.mechanisms.registry import LINEAR, VECTOR
from edge_agent.state import delta_units_up

VALUES = 4096
DELTA = 1e-6


def _digest(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _loss(mechanism) -> str:
    loss = mechanism.exact_privacy_loss()
    text = f"{loss.ceiling(10**18)}"  # the exact loss to 1e-18, rounded up: an integer
    if getattr(mechanism, "delta", 0):  # and an (epsilon, delta) one's delta, charged
        text += f" delta {delta_units_up(mechanism.exact_delta())}"
    return text


def digest() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    rng = np.random.default_rng(2026)
    x = rng.uniform(-1.5, 1.5, VALUES)  # some outside the domain: clipping too
    for epsilon in (0.5, 1.0, 4.0):
        for name in LINEAR:
            mechanism = linear_mechanism(name, epsilon=epsilon, low=-1.0, high=1.0,
                                         grid_bits=16, delta=DELTA if LINEAR[name].delta else 0)
            codes = mechanism.perturb_codes(x, SeededRandom(np.random.default_rng(7)))
            out[f"{name} {epsilon:g}"] = {"codes": _digest(codes), "loss": _loss(mechanism)}
        for name, cls in VECTOR.items():  # whole vectors of three axes
            vector = cls(epsilon=epsilon, dimensions=3, delta=DELTA, low=-1.0, high=1.0)
            parts = vector.perturb_codes(x[:VALUES // 3 * 3].reshape(-1, 3),
                                         SeededRandom(np.random.default_rng(7)))
            out[f"{name} {epsilon:g}"] = {"codes": "".join(_digest(p) for p in parts),
                                          "loss": _loss(vector)}
        circular = CircularOGPM(epsilon=epsilon)
        codes = circular.perturb_codes(x * 3, SeededRandom(np.random.default_rng(7)))
        out[f"circular {epsilon:g}"] = {"codes": _digest(codes), "loss": _loss(circular)}
        polar = PolarOGPM(epsilon=4 * epsilon, radius_max=2.0)
        radius, angle = polar.perturb_codes(np.abs(x), x * 3,
                                            SeededRandom(np.random.default_rng(7)))
        out[f"polar {4 * epsilon:g}"] = {"codes": _digest(radius) + _digest(angle),
                                         "loss": _loss(polar)}
        categories = (rng.integers(0, 5, VALUES)).astype(np.int64)
        for name, cls in ORACLES.items():
            oracle = cls(epsilon=epsilon, categories=5)
            reports = oracle.perturb(categories, SeededRandom(np.random.default_rng(7)))
            parts = reports if isinstance(reports, tuple) else (reports,)
            out[f"{name} {epsilon:g}"] = {"codes": "".join(_digest(p) for p in parts),
                                          "loss": _loss(oracle)}
        memoized = LongitudinalGRR(epsilon=epsilon, memo_epsilon=1.0, categories=5)
        reports = memoized.perturb(categories, SeededRandom(np.random.default_rng(7)))
        out[f"l-grr {epsilon:g}"] = {"codes": _digest(reports), "loss": _loss(memoized)}
    return out


if __name__ == "__main__":
    print(json.dumps(digest(), indent=1, sort_keys=True))
