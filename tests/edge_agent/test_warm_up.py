"""A channel's warm-up compiles (or loads) every kernel its batches use: nothing is
compiled after READY, whatever the batch's size and wherever its random words came from."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.channels import build_channels
from edge_agent.config import parse_config
from edge_agent.mechanisms import _categorical, _kernels, _layout, tent
from edge_agent.mechanisms.categorical import ORACLES
from edge_agent.mechanisms.randomness import SystemRandom, as_random_source
from edge_agent.mechanisms.registry import DELTA_MECHANISMS, LINEAR

KERNEL_MODULES = (_kernels, _categorical, _layout, tent)
CATEGORIES = ["rest", "walk", "run"]


def compiled() -> dict[str, int]:
    """Every numba dispatcher of the mechanisms and how many specialisations it holds."""
    return {f"{module.__name__}.{name}": len(value.signatures)
            for module in KERNEL_MODULES for name, value in vars(module).items()
            if hasattr(value, "signatures") and hasattr(value, "py_func")}


def every_channel_kind(tmp_path) -> list:
    channels = [{"name": f"x_{name}", "kind": "linear", "field": "accel_x", "mechanism": name,
                 "domain": [-2.0, 2.0], **({"delta": 1e-6} if name in DELTA_MECHANISMS else {})}
                for name in LINEAR]
    channels += [
        {"name": "roll", "kind": "circular", "field": "roll"},
        {"name": "polar", "kind": "polar", "fields": ["accel_h_mag", "accel_h_dir"],
         "radius_max": 2.0, "epsilon": 6.0},
        {"name": "split", "kind": "vector", "fields": ["accel_x", "accel_y", "accel_z"],
         "domain": [-2.0, 2.0], "strategy": "split"},
        {"name": "sample", "kind": "vector", "fields": ["accel_x", "accel_y", "accel_z"],
         "domain": [-2.0, 2.0], "strategy": "sample", "k": 1}]
    channels += [{"name": f"activity_{name}", "kind": "categorical", "field": "activity",
                  "oracle": name, "categories": CATEGORIES} for name in ORACLES]
    config = parse_config({
        "agent_id": "warm", "fleet": "warm", "broker": {"host": "127.0.0.1", "port": 1883},
        "privacy": {"budget_epsilon": 1000.0, "budget_delta": 0.01, "state_dir": str(tmp_path)},
        "sources": [{"name": "imu", "type": "synthetic", "rate_hz": 50}],
        "channels": [{"source": "imu", "epsilon": 2.0, **c} for c in channels]})
    return build_channels(config, "warm")


def test_the_csprng_gives_writable_words_of_any_length():
    """numba types read-only arrays apart: one kind of array, one compilation."""
    for count in (1, 4, 10_000, 200_000):
        words = SystemRandom().words(count)
        assert words.dtype == np.uint64 and words.shape == (count,)
        assert words.flags.writeable and words.flags.c_contiguous


@pytest.mark.parametrize("size", [1, 3_000])
def test_no_kernel_compiles_after_the_warm_up(tmp_path, size):
    rng = np.random.default_rng(size)
    for channel in every_channel_kind(tmp_path):
        channel.warm_up()
        before = compiled()
        if channel.kind == "categorical":
            values = (rng.integers(0, len(CATEGORIES), size),)  # category numbers
        else:
            values = tuple(rng.uniform(-1.5, 1.5, size) for _ in channel.field_names)
        channel._perturb(values, as_random_source(None))
        after = compiled()
        grew = {name: after[name] - before.get(name, 0) for name in after
                if after[name] != before.get(name, 0)}
        assert not grew, (channel.name, grew)
