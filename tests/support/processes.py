"""The programs under test as child processes: the agent, the fleet simulator, the collector.

Each child appends its output to a log file (read it with ``output()`` in an
assertion message) and is tracked: ``stop_leftover_processes()``, which the
autouse fixture in tests/conftest.py calls after every test, kills whatever a
test left running, so a failed assertion halfway through a test cannot leave a
collector or a broker holding ports and CPU for the rest of the run.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.support.configs import collector_config, write_agent_config, write_toml
from tests.support.paths import REPO, child_env
from tests.support.ports import HANG_GUARD_SECONDS, LOOPBACK, free_port, wait_until
from tests.support.reaper import die_with_test

_started: list[subprocess.Popen] = []


def track(process: subprocess.Popen) -> subprocess.Popen:
    """Remember ``process`` so that ``stop_leftover_processes`` can kill it."""
    _started.append(process)
    return process


def stop_leftover_processes() -> None:
    """Kill every tracked process still running (a test ended without stopping it)."""
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.kill()
            process.wait(10)


def wait_for_api(predicate: Callable[[], object], timeout: float = HANG_GUARD_SECONDS) -> bool:
    """``wait_until`` for a predicate that asks a service's HTTP API: every 0.2 s (each
    poll is a request the service has to answer), and a refused connection (the
    service is starting or was just killed) counts as "not yet"."""
    return wait_until(predicate, timeout, interval=0.2, ignore=(OSError,))


class ChildProcess:
    """``command`` run from the repository root, its output appended to ``log``."""

    def __init__(self, command: Sequence[str], log: Path, *, env: dict | None = None):
        self.command = [str(part) for part in command]
        self.log = log
        self.env = env
        self.process: subprocess.Popen | None = None

    def start(self):
        with self.log.open("ab") as log:  # the child keeps its own descriptor
            self.process = track(subprocess.Popen(self.command, stdout=log,
                                                  stderr=subprocess.STDOUT, env=self.env,
                                                  cwd=REPO, preexec_fn=die_with_test()))
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM (a clean shutdown) and the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL if still running (a crash at an arbitrary instant); idempotent."""
        if self.running():
            self.process.kill()
        if self.process is not None:
            self.process.wait(10)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def run_module(module: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m module args...`` run to completion (a CLI command): its exit code
    and text output, for the test to check."""
    return subprocess.run(python_module(module, *args), capture_output=True, text=True,
                          cwd=REPO, env=child_env(), timeout=timeout)


def python_module(module: str, *args, python: str | Path = sys.executable,
                  log_level: str | None = None) -> list[str]:
    """``python -m module [--log-level L] args...``; ``python`` may be another
    interpreter (the benchmarks measure a venv with only the runtime dependencies)."""
    return [str(python), "-m", module, *(["--log-level", log_level] if log_level else []),
            *map(str, args)]


class AgentProcess(ChildProcess):
    """``edge-agent run --config <config>``."""

    def __init__(self, config: Path, log: Path, **interpreter):
        super().__init__(python_module("edge_agent", "run", "--config", config, **interpreter),
                         log, env=child_env())


def spent_by_channel(state_dir: Path) -> dict[str, tuple[int, int]]:
    """Per channel, what an agent's ledger charged: (reports, delta in 1e-15 units)."""
    db = sqlite3.connect(f"file:{state_dir}/state.sqlite?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT channel, SUM(reports), SUM(spent_delta) FROM spending "
                          "GROUP BY channel").fetchall()
    finally:
        db.close()
    return {channel: (reports, delta) for channel, reports, delta in rows}


def replaying_agents(tmp_path: Path, broker, recordings: Sequence, channels: list[dict],
                     privacy: dict | None = None) -> list[AgentProcess]:
    """One agent process per recording (a mapping of field -> values), each replaying it
    as fast as it can from a CSV file through ``channels`` (their source is "rec"), as
    agents w0, w1, ... with their own state directories."""
    agents = []
    for i, recording in enumerate(recordings):
        fields = list(recording)
        path = tmp_path / f"rec{i}.csv"
        path.write_text(",".join(fields) + "\n" + "".join(
            ",".join(f"{v:.6f}" for v in row) + "\n"
            for row in zip(*(recording[f] for f in fields))))
        config = write_agent_config(
            tmp_path / f"agent{i}.toml", agent_id=f"w{i}", broker=broker,
            state_dir=tmp_path / f"state{i}", privacy=privacy,
            sources=[{"name": "rec", "type": "csv", "path": str(path), "pace": "fast",
                      "columns": {f: f for f in fields}}],
            channels=channels)
        agents.append(AgentProcess(config, tmp_path / f"agent{i}.log").start())
    return agents


class FleetProcess(ChildProcess):
    """``edge-agent fleet --config <config> --count <count> [extra...]``."""

    def __init__(self, config: Path, log: Path, count: int, *extra: str, **interpreter):
        super().__init__(python_module("edge_agent", "fleet", "--config", config,
                                       "--count", count, *extra, **interpreter),
                         log, env=child_env())


class CollectorProcess(ChildProcess):
    """``edge-collector <command>`` against a test broker, on an HTTP port of its own.

    The configuration makes everything the end-to-end tests watch happen within
    seconds (pushes, checkpoints, windows, snapshots) and keeps a minute of windows;
    ``name`` keeps several collectors apart in one directory, ``broker_settings`` adds
    keys to [broker], ``http`` to [http], and ``tables`` adds or replaces whole tables
    (``scale_out={...}``, ``range_discovery={...}``, ``aggregates={...}``)."""

    def __init__(self, tmp_path: Path, broker, *, checkpoint_seconds: float = 2.0,
                 name: str = "collector", command: str = "run",
                 broker_settings: dict | None = None, **tables):
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        # 5-s windows, a minute of them: an hour of 5-s windows (721, the default
        # history) made every end-to-end collector recompute hundreds of windows.
        tables = {"aggregates": {"window_seconds": 5, "history_seconds": 60},
                  "snapshots": {"interval_seconds": 1}, **tables}
        http = {"push_seconds": 0.5, **tables.pop("http", {}),
                "host": LOOPBACK, "port": self.port}
        self.config = write_toml(tmp_path / f"{name}.toml", collector_config(
            broker, broker_settings=broker_settings, http=http,
            storage={"path": str(tmp_path / f"{name}.sqlite"),
                     "checkpoint_seconds": checkpoint_seconds}, **tables))
        super().__init__(python_module("collector", command, "--config", self.config),
                         tmp_path / f"{name}.log", env=child_env())

    def start(self) -> CollectorProcess:
        """Start, and return once it is subscribed: from then on nothing published is lost."""
        super().start()

        def subscribed() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(self.output())
            return self.api()["broker"]["connected"]

        if not wait_for_api(subscribed, 60):
            raise RuntimeError("collector did not come up")
        return self

    def api(self, path: str = "/api/channels"):
        with urllib.request.urlopen(self.url + path, timeout=HANG_GUARD_SECONDS) as response:
            return json.loads(response.read())

    def metric(self, name: str) -> float:
        """The value of an unlabelled sample at /metrics (``AssertionError`` if absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=HANG_GUARD_SECONDS) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"no {name} in /metrics")
