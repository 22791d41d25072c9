"""Fill numba's on-disk cache before the tests run in parallel (tests/conftest.py runs this
once, in a process of its own, before pytest-xdist starts its workers).

On a fresh clone the cache is empty: every worker and every agent or collector a test
starts would compile the same kernels at once, each paying seconds of CPU that a loaded
machine does not have.  Here each kernel the product runs is compiled once, through the
product's own paths: every mechanism's sampling (the OS generator's and a seeded one's),
every frequency oracle and randomized response, and the collector's estimates of every
kind of channel.  Only the cache is filled: nothing here is checked (the tests do that).

``python -m tests.support.warm``; NUMBA_CACHE_DIR as the tests' children have it.
"""

from __future__ import annotations

import numpy as np

from collector.aggregation.ingest import Ingestor
from collector.api.documents import Views
from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, PolarOGPM, SeededRandom, linear_mechanism
from edge_agent.mechanisms.categorical import ORACLES
from edge_agent.mechanisms.randomized_response import RandomizedResponse
from edge_agent.mechanisms.registry import LINEAR

FLEET = "warm"


def _sources():
    return [None, SeededRandom(np.random.default_rng(1)), np.random.default_rng(1)]


def _report(ingestor: Ingestor, channel: str, kind: str, mechanism, codes, **extra) -> None:
    payload = protocol.report(agent="a", channel=channel, kind=kind, seq=0, t=1000.0, dt=1.0,
                              mechanism=mechanism.describe(), codes=codes, **extra)
    ingestor.ingest(protocol.data_topic(FLEET, "a", channel), payload, 1000.0)


def main() -> None:
    values = np.linspace(0.0, 1.0, 64)
    ingestor = Ingestor(fleet=FLEET)
    for name in LINEAR:
        mechanism = linear_mechanism(name, epsilon=1.0, low=0.0, high=1.0, grid_bits=16,
                                     delta=1e-6 if LINEAR[name].delta else 0.0)
        for source in _sources():
            codes = mechanism.perturb_codes(values, source)
        _report(ingestor, name.replace("-", "_"), "linear", mechanism, codes.tolist())
    circle = CircularOGPM(epsilon=1.0)
    for source in _sources():
        codes = circle.perturb_codes(values * 6.0, source)
    _report(ingestor, "angle", "circular", circle, codes.tolist())
    polar = PolarOGPM(epsilon=2.0, radius_max=1.0)
    for source in _sources():
        radius, angle = polar.perturb_codes(values, values * 6.0, source)
    _report(ingestor, "pair", "polar", polar, [radius.tolist(), angle.tolist()])
    categories = np.arange(64) % 4
    for cls in ORACLES.values():
        oracle = cls(epsilon=1.0, categories=4)
        for source in _sources():
            oracle.perturb(categories, source)
    for source in _sources():
        RandomizedResponse(epsilon=1.0).respond(np.ones(8, dtype=np.int64), source)
    Views(lambda: ingestor).channels_json()


if __name__ == "__main__":
    main()
