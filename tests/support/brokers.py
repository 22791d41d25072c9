"""Mosquitto for the tests and the benchmarks: a private broker on a free loopback port.

``Mosquitto`` writes a permissive test configuration; tests/deploy/secure_broker.py
subclasses it to run the production configuration instead (TLS, accounts, ACL)
with the same process handling.  Every broker started is tracked like the other
children (processes.py), so it is killed after the test however the test ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.ports import LOOPBACK, free_port, port_open, wait_until
from tests.support.processes import ChildProcess

NOT_INSTALLED = ("mosquitto is not installed: run `make test` (it installs it with apt) "
                 "or `apt-get install mosquitto`")


def find_mosquitto() -> str | None:
    """The mosquitto binary: on PATH, or where Debian puts it (sbin is not on every PATH)."""
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.path.exists(p)),
        None)


def require_mosquitto() -> str:
    """The mosquitto binary, or the test fails saying how to install it (a missing
    broker must not look like a skipped or broken feature)."""
    binary = find_mosquitto()
    if binary is None:
        import pytest  # only here: the benchmarks use this module without pytest

        pytest.fail(NOT_INSTALLED)
    return binary


class Mosquitto(ChildProcess):
    """A mosquitto process the test owns, on one port across start, stop, kill and restart.

    ``stop()`` kills it (a crash) unless ``graceful_stop``; ``stop(graceful=True)``
    sends SIGTERM, so a persistent broker saves its state.  ``extra_conf`` is appended
    to the configuration; ``max_queued_messages`` 0 means no limit; ``verbose`` logs
    every packet.  Also a context manager (the benchmarks use it so)."""

    host = LOOPBACK
    CONSOLE = "mosquitto.log"  # its standard output and error, in the work dir

    def __init__(self, workdir: Path, *, port: int | None = None, extra_conf: str = "",
                 max_queued_messages: int = 1_000_000, verbose: bool = False,
                 graceful_stop: bool = False):
        self.binary = require_mosquitto()
        self.port = port or free_port()
        self.workdir = workdir
        self.extra_conf = extra_conf
        self.max_queued_messages = max_queued_messages
        self.graceful_stop = graceful_stop
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(self.configuration())
        super().__init__([self.binary, *(["-v"] if verbose else []), "-c", self.conf],
                         workdir / self.CONSOLE)
        self.broker_log = self.log  # where the configuration sends the broker's log

    def configuration(self) -> str:
        """The mosquitto.conf to run: anonymous, on the loopback port."""
        return (f"listener {self.port} {LOOPBACK}\n"
                "allow_anonymous true\n"
                # The defaults drop QoS 1 messages for slow or offline subscribers
                # past 1000 queued (docs/guides/FIELD_NOTES.md, Mosquitto); tests must not
                # lose anything there.
                f"max_queued_messages {self.max_queued_messages}\n"
                "max_inflight_messages 0\n"
                "persistence false\n"
                f"{self.extra_conf}\n")

    def log_text(self) -> str:
        """What the broker logged so far."""
        return self.broker_log.read_text(errors="replace") if self.broker_log.exists() else ""

    def start(self) -> Mosquitto:
        """Start, and return once it accepts connections."""
        super().start()

        def listening() -> bool:
            if self.process.poll() is not None:
                logs = self.output()[-2000:]
                if self.broker_log != self.log:
                    logs += "\n" + self.log_text()[-3000:]
                raise RuntimeError(f"mosquitto exited: {logs}")
            return port_open(LOOPBACK, self.port, timeout=0.2)

        if not wait_until(listening, 10, interval=0.05):
            raise RuntimeError("mosquitto did not start listening")
        return self

    def stop(self, *, graceful: bool | None = None) -> None:
        """Kill it, or with ``graceful`` (default: ``graceful_stop``) SIGTERM it and
        give it 10 s to save its state; a no-op if it is not running."""
        if self.running() and (self.graceful_stop if graceful is None else graceful):
            try:
                self.terminate(10)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def reload(self) -> None:
        """SIGHUP: re-read the configuration, password and ACL files (as
        `systemctl reload mosquitto`); returns once the log says so."""
        mark = len(self.log_text())
        self.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "Reloading config" in self.log_text()[mark:], 10,
                          interval=0.05), self.log_text()[mark:]
        time.sleep(0.2)  # the new files take effect just after the line

    def __enter__(self) -> Mosquitto:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
