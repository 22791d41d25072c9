"""Shared fixtures: a real Mosquitto broker on a free loopback port, and no child
process outliving its test.  The helpers themselves live in tests/support."""

from __future__ import annotations

import pytest

from tests.support import Mosquitto, stop_leftover_processes


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """Kill any broker, agent or collector a test started and did not stop (it failed
    halfway, say): they would hold ports and CPU for the rest of the run."""
    yield
    stop_leftover_processes()


@pytest.fixture
def mosquitto(tmp_path):
    broker = Mosquitto(tmp_path).start()
    yield broker
    broker.stop()
