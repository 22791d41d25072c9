"""Shared fixtures: a real Mosquitto broker on a free loopback port, a real 3-node NATS
JetStream cluster, and no child process outliving its test.  The helpers themselves live
in tests/support."""

from __future__ import annotations

import pytest

from tests.support import Mosquitto, stop_leftover_processes
from tests.support.nats import NatsCluster
from tests.support.reaper import Reaper, become_subreaper


def pytest_configure(config):
    # In every test process (each xdist worker too): orphans of the processes a test
    # starts come back to it, for the fixture below to find (tests/support/reaper.py).
    become_subreaper()


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """Kill any broker, agent or collector a test started and did not stop (it failed
    halfway, say), and whatever they started: they would hold ports and CPU for the
    rest of the run."""
    reaper = Reaper()
    yield
    stop_leftover_processes()
    left = reaper.collect()
    if left:  # shown with the test's output if it fails
        print("killed what the test left running:", *left, sep="\n  ")


@pytest.fixture
def mosquitto(tmp_path):
    broker = Mosquitto(tmp_path).start()
    yield broker
    broker.stop()


@pytest.fixture
def nats_cluster(tmp_path):
    cluster = NatsCluster(tmp_path / "nats").start()
    yield cluster
    cluster.stop()
