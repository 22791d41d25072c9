"""A private Mosquitto on a free loopback port, for the benchmarks."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_mosquitto(workdir: Path):
    """Yields the port of a Mosquitto with unlimited queues and in-flight windows."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                    "max_queued_messages 0\nmax_inflight_messages 0\n")
    log = (workdir / "mosquitto.log").open("wb")  # kept for post-mortems
    broker = subprocess.Popen([binary, "-v", "-c", str(conf)], stdout=log,
                              stderr=subprocess.STDOUT)
    time.sleep(0.5)
    try:
        yield port
    finally:
        broker.terminate()
        broker.wait(10)
        log.close()
