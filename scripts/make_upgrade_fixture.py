"""Make the state file of an earlier release of the agent, for tests/edge_agent/test_upgrade.py.

    python scripts/make_upgrade_fixture.py COMMIT [COMMIT ...]

For each commit: its source in a temporary git worktree, run with this venv's
dependencies (``python -m edge_agent run`` with the worktree first on PYTHONPATH) and
tests/data/upgrade/agent.toml against a Mosquitto on a free port: reports for a few
seconds while the broker acknowledges them, then the broker is killed so that what
follows stays in the spool, then SIGTERM.  The agent's state database (ledger, sequence
numbers, spool) is written to tests/data/upgrade/state-<commit>.sqlite, as one file.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import Mosquitto, write_toml  # noqa: E402

FIXTURES = REPO / "tests" / "data" / "upgrade"
ONLINE_SECONDS = 6.0
OFFLINE_SECONDS = 6.0


def make(commit: str) -> Path:
    short = subprocess.run(["git", "rev-parse", "--short=7", commit], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        source = work / "source"
        subprocess.run(["git", "worktree", "add", "--detach", str(source), short], cwd=REPO,
                       check=True, capture_output=True)
        try:
            with Mosquitto(work) as broker:
                settings = tomllib.loads((FIXTURES / "agent.toml").read_text())
                settings["broker"] = {"host": broker.host, "port": broker.port}
                settings["privacy"]["state_dir"] = str(work / "state")
                config = write_toml(work / "agent.toml", settings)
                env = {**os.environ, "PYTHONPATH": str(source),
                       "NUMBA_CACHE_DIR": str(work / "numba")}
                log = open(work / "agent.log", "wb")
                agent = subprocess.Popen([sys.executable, "-m", "edge_agent", "run", "--config",
                                          str(config)], cwd=source, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    while b"running" not in (work / "agent.log").read_bytes():
                        if agent.poll() is not None:
                            raise SystemExit((work / "agent.log").read_text())
                        time.sleep(0.1)
                    time.sleep(ONLINE_SECONDS)
                    broker.stop()  # killed: what follows stays in the spool
                    time.sleep(OFFLINE_SECONDS)
                finally:
                    os.killpg(agent.pid, signal.SIGTERM)
                    agent.wait(120)
            out = FIXTURES / f"state-{short}.sqlite"
            out.unlink(missing_ok=True)
            with sqlite3.connect(work / "state" / "state.sqlite") as db, \
                    sqlite3.connect(out) as copy:
                db.backup(copy)  # one file, the WAL folded in
            copy.close()
            with sqlite3.connect(out) as copy:
                copy.execute("PRAGMA journal_mode=DELETE")
            return out
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(source)], cwd=REPO,
                           check=False, capture_output=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for commit in sys.argv[1:]:
        path = make(commit)
        with sqlite3.connect(path) as db:
            tables = [row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
            spooled = db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
        print(f"{path.relative_to(REPO)}: {path.stat().st_size} bytes, tables {tables}, "
              f"{spooled} report(s) spooled")
