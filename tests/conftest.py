"""Shared fixtures: a real Mosquitto broker on a free loopback port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_mosquitto() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.path.exists(p)),
        None)


class Mosquitto:
    """A mosquitto process the test owns: start, stop (kill) and restart on one port."""

    def __init__(self, workdir: Path, *, port: int | None = None, extra_conf: str = ""):
        self.binary = find_mosquitto()
        if self.binary is None:
            pytest.fail("mosquitto is not installed: run `make test` (it installs it with apt) "
                        "or `apt-get install mosquitto`")
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.workdir = workdir
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            # The defaults drop QoS 1 messages for slow or offline subscribers
            # past 1000 queued (NOTES.md); tests must not lose anything there.
            "max_queued_messages 1000000\n"
            "max_inflight_messages 0\n"
            "persistence false\n"
            f"{extra_conf}\n"
        )
        self.process: subprocess.Popen | None = None

    def start(self) -> "Mosquitto":
        with self.log.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen([self.binary, "-c", str(self.conf)], stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start listening")

    def stop(self, *, graceful: bool = False) -> None:
        """Kill the broker (graceful: SIGTERM, so a persistent one saves its state)."""
        if self.process and self.process.poll() is None:
            if graceful:
                self.process.terminate()
            else:
                self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def mosquitto(tmp_path):
    broker = Mosquitto(tmp_path).start()
    yield broker
    broker.stop()
