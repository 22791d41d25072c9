"""No process a test starts outlives it, however the test ends.

Three layers, each for what the one before cannot see:

* ``stop_leftover_processes`` (processes.py) stops the children the helpers
  started and track, in order;
* ``die_with_test``, a ``preexec_fn`` that has the kernel kill a child when the
  test process dies (``PR_SET_PDEATHSIG``: pytest killed, or an xdist worker
  lost), so nothing lingers for minutes after an interrupted run;
* the test process is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): the
  children of a child that died (the demo's broker, collector and fleet when
  the demo is killed) are re-parented to it rather than to init, so
  ``Reaper.collect`` finds every process a test started, directly or not, and
  kills what is left when the test ends.

Processes that existed before the test (a browser a module fixture started, and
whatever they start later, such as Chromium's renderers) are left alone.
Linux only; elsewhere the last two layers do nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Iterable

from collector.broker.lifetime import running

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

try:  # loaded here: a preexec_fn must not load a library between fork and exec
    _libc = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    _libc = None


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it (Linux >= 3.4)."""
    if _libc is not None:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_test(**signals):
    """A ``preexec_fn``: the child gets SIGKILL when the process that started it dies.
    ``signals``: what the child starts with for some signals, by name (``SIGHUP=
    signal.SIG_DFL``), rather than this process's: a test run in the background
    ignores SIGINT (a shell's asynchronous commands do), under nohup SIGHUP, and
    children inherit that; tests of what those signals do set them."""
    parent = os.getpid()
    dispositions = [(getattr(signal, name), action) for name, action in signals.items()]

    def tie() -> None:  # in the child, between fork and exec: no allocation, no import
        if _libc is not None:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for signum, action in dispositions:
            signal.signal(signum, action)
        if os.getppid() != parent:  # the parent died before prctl: no signal will come
            os._exit(1)

    return tie


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (zombies included)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    parents[int(name)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


class Reaper:
    """Kills what a test started and left running (``collect``), sparing what ran before
    it (``__init__`` takes the census)."""

    def __init__(self):
        self.root = os.getpid()
        self.before = set(self._descendants(_parents()))

    def _descendants(self, parents: dict[int, int]) -> Iterable[int]:
        children: dict[int, list[int]] = {}
        for pid, parent in parents.items():
            children.setdefault(parent, []).append(pid)
        stack = list(children.get(self.root, ()))
        while stack:
            pid = stack.pop()
            yield pid
            stack.extend(children.get(pid, ()))

    def _started_since(self) -> list[int]:
        """Processes below this one, started since the census, not under an older one."""
        parents = _parents()
        found = []
        for pid in self._descendants(parents):
            ancestor = pid
            while ancestor != self.root and ancestor not in self.before:
                ancestor = parents.get(ancestor, self.root)
            if ancestor == self.root and pid not in self.before:
                found.append(pid)
        return found

    def collect(self, timeout: float = 20.0) -> list[str]:
        """SIGKILL every process the test left, reap those that are this process's
        children (orphans re-parented here among them), and return the command lines of
        those that were running (for a message); give up after ``timeout`` seconds."""
        started = self._started_since()
        names = [_command(pid) for pid in started if running(pid)]
        deadline = time.monotonic() + timeout
        while started and time.monotonic() < deadline:
            for pid in filter(running, started):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            for pid in started:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not our child (yet): its parent reaps it
                    pass
            if not any(map(running, started)):
                break
            time.sleep(0.05)
            started = self._started_since()
        return names


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"pid {pid}"
