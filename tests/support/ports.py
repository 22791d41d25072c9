"""Loopback ports, and waiting for something to become true.

Every test server (Mosquitto, a collector's HTTP API, the web server) listens on
a port the test picked with ``free_port``, and every end-to-end check waits with
``wait_until`` rather than sleeping a fixed time.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice), for a child to bind."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(condition: Callable[[], object], timeout: float = 5.0, *,
               interval: float = 0.02, ignore: tuple[type[BaseException], ...] = ()) -> bool:
    """Poll ``condition`` every ``interval`` seconds until it is true or ``timeout`` passes.

    Returns whether it became true; it is asked once more at the deadline, so a
    slow machine is not failed by the last poll's timing.  Exceptions of the
    ``ignore`` types (e.g. a service's API refusing connections while it starts)
    count as "not yet"."""
    def holds() -> bool:
        try:
            return bool(condition())
        except ignore:
            return False

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if holds():
            return True
        time.sleep(interval)
    return holds()
