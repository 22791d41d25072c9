"""Child processes that cannot outlive their parent, however it dies.

* ``die_with_parent(signum)``: Linux's ``PR_SET_PDEATHSIG``, so the kernel
  signals us when the parent dies (strictly: when the parent *thread* that
  started us ends), SIGKILL included.  For ``subprocess.Popen(preexec_fn=...)``
  use ``preexec_die_with_parent``, which also catches a parent that died
  before the call.
* ``python -m collector.broker.lifetime clean [DIRECTORY]``: the demo's janitor.  It
  reads the pids of the demo's children on stdin, one per line, until end of
  file (the demo exited, or was killed).  Then it sends SIGTERM to those still
  running (a child that changes its user, as Mosquitto started by root does,
  loses its parent-death signal), waits for them to end (SIGKILL after a grace
  period) and removes the demo's temporary directory, if given, which a killed
  demo cannot (a ``--workdir`` the user chose is kept).

Standard library only: the collector's network child imports it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
CHILDREN_GRACE_SECONDS = 60.0  # the collector checkpoints and the fleet flushes meanwhile


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Get ``signum`` when the parent dies (Linux; elsewhere nothing happens)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum)
    except OSError:
        pass


def preexec_die_with_parent(signum: int = signal.SIGTERM):
    """A ``preexec_fn`` that ties the child's life to this process."""
    parent = os.getpid()

    def tie() -> None:  # runs in the child, between fork and exec
        die_with_parent(signum)
        if os.getppid() != parent:  # the parent died before the call: no signal will come
            os._exit(1)

    return tie


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def clean_after(directory: Path | None, lines) -> None:
    """Wait for the end of ``lines`` (pids), stop those processes (SIGTERM, SIGKILL after
    the grace period), then remove ``directory`` (if any)."""
    pids = [int(line) for line in lines if line.strip().isdigit()]
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + CHILDREN_GRACE_SECONDS
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    signal_all(pids, signal.SIGKILL)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def signal_all(pids: list[int], signum: int) -> None:
    for pid in filter(running, pids):
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] != "clean":
        print("usage: python -m collector.broker.lifetime clean [DIRECTORY]", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the demo
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    clean_after(Path(argv[1]) if len(argv) == 2 else None, sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
