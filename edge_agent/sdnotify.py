"""Dependency-free sd_notify(3): readiness, status and watchdog pings for systemd.

The unit (systemd/edge-agent.service) is ``Type=notify`` with
``WatchdogSec=30``.  systemd then expects, from the agent's main process
(``NotifyAccess=main``):

* ``READY=1`` once start-up is done: until then the unit is "activating" and
  only ``TimeoutStartSec`` applies (the watchdog is not armed yet, so a long
  first numba JIT is fine; ``extend_timeout`` can ask for more time);
* ``WATCHDOG=1`` at least every ``WatchdogSec`` afterwards, or systemd kills
  the agent with SIGABRT and restarts it.  We ping at half that interval,
  as sd_watchdog_enabled(3) recommends;
* ``STOPPING=1`` when it starts shutting down (optional, it shows in
  ``systemctl status``).

Outside systemd (tests, a shell) there is no ``$NOTIFY_SOCKET``: every
function returns ``False`` / ``None`` and does nothing, so the agent calls
them unconditionally.  No threads: the main loop calls ``Watchdog.tick()``
every iteration, which is exactly what makes the watchdog meaningful (a
ping thread would keep pinging while the main loop is stuck).

Typical use::

    watchdog = sdnotify.Watchdog()
    ...start-up (compile kernels, open state, connect)...
    sdnotify.ready("publishing 3 channels")
    while running:
        do_one_batch(timeout=watchdog.clamp_timeout(batch_seconds))
        watchdog.tick()
    sdnotify.stopping()
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable

__all__ = ["notify", "ready", "stopping", "status", "watchdog", "extend_timeout",
           "watchdog_interval", "Watchdog"]

log = logging.getLogger(__name__)


def _address(value: str) -> str | bytes | None:
    """$NOTIFY_SOCKET -> an AF_UNIX address, or None if it is not one we can use."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        # Abstract namespace: a leading NUL byte instead of '@', no terminator.
        return b"\0" + value[1:].encode()
    return None  # e.g. "vsock:..." (VMs, systemd >= 254): not supported here


def notify(state: str) -> bool:
    """Send ``state`` (newline-separated ``KEY=value`` lines) to the service manager.

    True if the datagram was sent; False, quietly, when not started by
    systemd (no ``$NOTIFY_SOCKET``) or when sending fails.
    """
    value = os.environ.get("NOTIFY_SOCKET", "")
    if not value:
        return False
    address = _address(value)
    if address is None:
        log.debug("NOTIFY_SOCKET=%r is not an AF_UNIX address; not notifying", value)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.debug("sd_notify(%r) to %r failed: %s", state, value, exc)
        return False
    return True


def _one_line(text: str) -> str:
    # A newline would start a new KEY=value assignment.
    return " ".join(text.splitlines())


def ready(status: str = "") -> bool:
    """Start-up is complete (``READY=1``), optionally with a status line."""
    return notify("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))


def stopping(status: str = "") -> bool:
    """Shutdown has begun (``STOPPING=1``)."""
    return notify("STOPPING=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))


def status(text: str) -> bool:
    """Free-form status shown by ``systemctl status`` (``STATUS=...``)."""
    return notify(f"STATUS={_one_line(text)}")


def watchdog() -> bool:
    """One keep-alive ping (``WATCHDOG=1``).  Prefer ``Watchdog.tick()`` in loops."""
    return notify("WATCHDOG=1")


def extend_timeout(seconds: float) -> bool:
    """Ask for ``seconds`` more before the current start/stop timeout fires.

    Useful during a slow first JIT compile: systemd (>= 236) then waits at
    least that long from now, whatever ``TimeoutStartSec`` says.
    """
    return notify(f"EXTEND_TIMEOUT_USEC={max(0, math.ceil(seconds * 1_000_000))}")


def watchdog_interval() -> float | None:
    """Seconds between pings (half of ``$WATCHDOG_USEC``), or None if no watchdog.

    Like sd_watchdog_enabled(3): the watchdog applies to this process only if
    ``$WATCHDOG_USEC`` is a positive integer and ``$WATCHDOG_PID`` is unset or
    is our PID (a child that inherited the environment must not ping).
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    try:
        usec_value = int(usec)
    except ValueError:
        return None
    if usec_value <= 0:
        return None
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec_value / 2 / 1_000_000


class Watchdog:
    """Sends ``WATCHDOG=1`` at the right cadence from a single-threaded loop.

    ``interval`` defaults to ``watchdog_interval()`` read at construction; None
    (or no watchdog configured) disables it: ``due`` is then always False and
    ``tick``/``ping`` send nothing.  The first ``tick`` pings at once; after
    that every ``interval`` seconds of ``clock`` (monotonic by default, so
    wall-clock steps from NTP do not matter).
    """

    def __init__(self, interval: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        if interval is None:
            interval = watchdog_interval()
        if interval is not None and not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval: must be a positive number of seconds, got {interval!r}")
        self.interval = interval
        self._clock = clock
        self._next: float | None = None  # None: never pinged, due at once
        self.pings = 0  # WATCHDOG=1 datagrams actually sent

    @property
    def enabled(self) -> bool:
        return self.interval is not None

    def due(self, now: float | None = None) -> bool:
        """True if a ping should be sent now."""
        if self.interval is None:
            return False
        if self._next is None:
            return True
        return (self._clock() if now is None else now) >= self._next

    def ping(self, now: float | None = None) -> bool:
        """Send ``WATCHDOG=1`` now (if enabled) and schedule the next one."""
        if self.interval is None:
            return False
        now = self._clock() if now is None else now
        self._next = now + self.interval
        sent = watchdog()
        self.pings += sent
        return sent

    def tick(self, now: float | None = None) -> bool:
        """Call once per loop iteration: pings when due.  True if it pinged."""
        now = self._clock() if now is None else now
        return self.ping(now) if self.due(now) else False

    def seconds_until_due(self, now: float | None = None) -> float | None:
        """How long the loop may block before the next ping (None: no limit)."""
        if self.interval is None:
            return None
        if self._next is None:
            return 0.0
        return max(0.0, self._next - (self._clock() if now is None else now))

    def clamp_timeout(self, timeout: float | None, now: float | None = None) -> float | None:
        """``timeout`` shortened so that a blocking wait does not miss a ping."""
        left = self.seconds_until_due(now)
        if left is None:
            return timeout
        return left if timeout is None else min(timeout, left)
