"""Loopback ports, and waiting for something to become true.

Every test server (Mosquitto, a collector's HTTP API, the web server) listens on
a port the test picked with ``free_port``, and every end-to-end check waits with
``wait_until`` rather than sleeping a fixed time.

Tests never race the clock.  A wait is a guard against a hang, never a bound on
speed: ``wait_until`` waits at least ``HANG_GUARD_SECONDS`` whatever it is asked, and
returns as soon as the condition holds, so a loaded machine costs time, not a failure.
Where a test checks that something does *not* wait (a stop that must not sit out a
back-off), the configuration makes the wrong outcome take far longer than the guard
(``returns_within``).  Durations are measured in benchmarks/, not asserted here.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Callable

LOOPBACK = "127.0.0.1"
# How long a test waits for what must happen before it fails: a guard against a hang.
HANG_GUARD_SECONDS = 60.0
HANG_GUARD_MS = 60_000  # the same, for playwright


# Ports the tests' servers listen on come from below Linux's ephemeral range (32768-60999
# by default), split between the xdist workers.  The kernel's choice (bind to port 0) is
# taken from the ephemeral range, where any outgoing connection of any test may take the
# same port between our check and the child's bind: twice a full run lost a server to
# "Address already in use" that way (2026-11-28).
TEST_PORTS_FIRST, TEST_PORTS_SPAN = 20_000, 12_000
_next_port = itertools.count()


def _worker_ports() -> range:
    """This xdist worker's share of the test ports (all of them outside xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    share = TEST_PORTS_SPAN // workers
    first = TEST_PORTS_FIRST + (index % workers) * share
    return range(first, first + share)


def free_port() -> int:
    """A TCP port nobody listens on right now, for a child to bind: the next one of this
    worker's share that binds (no other worker, and no outgoing connection, takes it)."""
    ports = _worker_ports()
    for _ in range(len(ports)):
        port = ports[next(_next_port) % len(ports)]
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports}")


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(condition: Callable[[], object], timeout: float = HANG_GUARD_SECONDS, *,
               interval: float = 0.02, ignore: tuple[type[BaseException], ...] = ()) -> bool:
    """Poll ``condition`` every ``interval`` seconds until it is true or the guard passes:
    ``timeout``, but never less than ``HANG_GUARD_SECONDS`` (module docstring).

    Returns whether it became true; it is asked once more at the deadline, so a
    slow machine is not failed by the last poll's timing.  Exceptions of the
    ``ignore`` types (e.g. a service's API refusing connections while it starts)
    count as "not yet".  To check that something does not happen, ``stays_false``."""
    def holds() -> bool:
        try:
            return bool(condition())
        except ignore:
            return False

    deadline = time.monotonic() + max(timeout, HANG_GUARD_SECONDS)
    while time.monotonic() < deadline:
        if holds():
            return True
        time.sleep(interval)
    return holds()


def stays_false(condition: Callable[[], object], seconds: float, *,
                interval: float = 0.05) -> bool:
    """Whether ``condition`` stays false for ``seconds`` (polled every ``interval``): a
    check that something does not happen, which a slow machine can only make easier."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return False
        time.sleep(interval)
    return not condition()


def returns_within(function: Callable[[], object], guard: float = HANG_GUARD_SECONDS) -> bool:
    """Call ``function`` in a thread; whether it returned within ``guard`` (its exception,
    if it raised, is raised here).  With a configuration under which the wrong
    behaviour takes far longer than ``guard``, this tells the two apart however loaded
    the machine is."""
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            function()
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(guard)
    if outcome and outcome[0] is not None:
        raise outcome[0]
    return bool(outcome)
