"""The net under every test (tests/support/reaper.py): what a test leaves running, its
orphans included, is killed when it ends; what ran before it is spared."""

import os
import subprocess
import sys
import time

from collector.broker.lifetime import running
from tests.support.ports import HANG_GUARD_SECONDS, wait_until
from tests.support.reaper import Reaper, die_with_test

# A child that starts a grandchild and exits: the grandchild is an orphan, re-parented to
# the test process (a subreaper), as a killed demo's broker is.
ORPHAN_MAKER = ("import subprocess, sys; "
                "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                "print(p.pid, flush=True)")


def test_orphans_and_children_a_test_leaves_are_killed_and_reaped():
    older = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        reaper = Reaper()  # the census: `older` ran before the "test"
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        maker = subprocess.run([sys.executable, "-c", ORPHAN_MAKER], capture_output=True,
                               text=True, check=True)
        orphan = int(maker.stdout)
        assert running(orphan)
        assert wait_until(lambda: open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1]
                          .split()[1] == str(os.getpid()), 10)  # re-parented to us
        left = reaper.collect()
        assert len(left) == 2 and all("time.sleep(300)" in command for command in left)
        assert not running(orphan) and not os.path.exists(f"/proc/{orphan}")  # reaped
        assert not running(child.pid) and child.poll() is not None  # (reaped: no status)
        assert older.poll() is None  # spared
    finally:
        older.kill()
        older.wait()


def test_a_child_started_with_die_with_test_dies_with_its_parent():
    # The parent starts the child with the preexec_fn and is killed: the kernel kills
    # the child (no test left to clean up after an interrupted run).
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "from tests.support.reaper import die_with_test\n"
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
         " preexec_fn=die_with_test())\n"
         "print(p.pid, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True, preexec_fn=die_with_test())
    child = int(parent.stdout.readline())
    assert running(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            os.waitpid(child, os.WNOHANG)  # re-parented to us, a subreaper
        except ChildProcessError:
            pass
    assert not running(child)
