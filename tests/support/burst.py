"""A study's history in one burst: many channels x agents x windows of linear reports,
and what a collector's API says once it has counted and estimated all of them.

Shared by the tests of estimates kept across restarts and floods
(tests/collector/test_estimates_e2e.py) and benchmarks/bench_collector_scale.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support.configs import FLEET

MECHANISM = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)


def channel_names(count: int, prefix: str = "ch") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(count)]


def burst(*, channels: list[str], agents: list[str], windows: int, values: int = 50,
          window_seconds: float = 60.0, now: float | None = None, seed: int = 0,
          fleet: str = FLEET, first_seq: int = 0) -> Iterator[tuple[str, bytes]]:
    """(topic, payload) of one report of ``values`` values per channel, agent and window,
    oldest window first, the newest window the one under way at ``now``.  Each channel's
    data are normal around a mean of its own (seeded), each window's drifting; an agent's
    sequence numbers per channel count windows from ``first_seq``."""
    now = time.time() if now is None else now
    rng = np.random.default_rng(seed)
    newest = int(now // window_seconds)
    description = MECHANISM.describe()
    means = {name: rng.uniform(-1.0, 1.0) for name in channels}
    for w in range(windows):
        window = newest - windows + 1 + w
        for name in channels:
            truth = np.clip(rng.normal(means[name] + 0.01 * w, 0.3, (len(agents), values)),
                            -2.0, 2.0)
            codes = MECHANISM.perturb_codes(truth.ravel(), rng).reshape(len(agents), values)
            for i, agent in enumerate(agents):
                # Inside the window, spread over its first half (never in the future).
                t = min(window * window_seconds + (i % 30) + 0.5, now)
                yield (protocol.data_topic(fleet, agent, name),
                       protocol.report(agent=agent, channel=name, kind="linear",
                                       seq=first_seq + w, t=t, dt=1.0, mechanism=description,
                                       codes=codes[i].tolist()))


def complete(document: dict, expected: dict[str, int]) -> bool:
    """Whether an /api/channels document counts ``expected`` values per channel and has
    computed everything of them (each entry's ``state`` "ready")."""
    channels = document["channels"]
    return all(name in channels and channels[name]["count"] == count
               and channels[name]["state"] == "ready" for name, count in expected.items())
