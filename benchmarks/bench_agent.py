"""The agent's footprint: start, RSS (peak and steady) and CPU of ``edge-agent run``.

Starts a private Mosquitto on a free port and runs the agent for ``--seconds`` in
three settings:

* the sample configuration (configs/agent.toml: planned, seven channels, a 50 Hz
  synthetic source) with an empty numba cache, then with the cache it left;
* a dense one: 10 channels of every kind reporting every reading of a 50 Hz source
  (500 values a second), warm cache.

Start-up is the time to the "running" log line (kernels loaded or compiled, exact
charges computed: the agent reports from then on).  RSS from /proc/<pid>/status
(VmRSS after start-up and at the end, VmHWM = the peak over the process's life);
CPU = user + system time over the measured seconds.  Goals (issue 29, the sample
configuration, warm cache): peak <= 150 MB, <= 1% of a core, <= 5 s to start.

``--arm64`` runs the same inside ``make pi-check``'s arm64 userland (qemu-user;
run ``make pi-check`` first so that it holds this tree's wheel): the figures are
then the emulator's (its translated code included), stated beside the native ones.

Run: ``python -m benchmarks.bench_agent [--seconds 60] [--arm64]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from benchmarks.machine import describe_machine
from tests.support import Mosquitto, write_toml

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "configs" / "agent.toml"
CHANNELS = tomllib.loads("""
[[channels]]
name = "accel_x"
source = "imu"
field = "accel_x"
kind = "linear"
epsilon = 1.0
domain = [-2.0, 2.0]
[[channels]]
name = "accel_y"
source = "imu"
field = "accel_y"
kind = "linear"
mechanism = "ogpm-unbiased"
epsilon = 1.0
domain = [-2.0, 2.0]
[[channels]]
name = "accel_z"
source = "imu"
field = "accel_z"
kind = "linear"
mechanism = "pm"
epsilon = 1.0
domain = [-2.0, 2.0]
[[channels]]
name = "roll"
source = "imu"
field = "roll"
kind = "circular"
epsilon = 1.0
[[channels]]
name = "pitch"
source = "imu"
field = "pitch"
kind = "circular"
epsilon = 1.0
[[channels]]
name = "yaw"
source = "imu"
field = "yaw"
kind = "circular"
epsilon = 1.0
[[channels]]
name = "accel_polar"
source = "imu"
fields = ["accel_h_mag", "accel_h_dir"]
kind = "polar"
epsilon = 3.0
radius_max = 2.0
[[channels]]
name = "accel"
source = "imu"
fields = ["accel_x", "accel_y", "accel_z"]
kind = "vector"
epsilon = 2.0
domain = [-2.0, 2.0]
strategy = "sample"
k = 1
[[channels]]
name = "mag"
source = "imu"
field = "accel_h_mag"
kind = "linear"
mechanism = "sw"
epsilon = 1.0
domain = [0.0, 2.0]
[[channels]]
name = "accel_x_laplace"
source = "imu"
field = "accel_x"
kind = "linear"
mechanism = "laplace"
epsilon = 1.0
domain = [-2.0, 2.0]
""")["channels"]


def proc_sample(pid: int) -> dict[str, float]:
    """RSS and peak RSS (MB) and CPU seconds of a process."""
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return {"rss": int(status["VmRSS"].split()[0]) / 1024.0,
            "peak": int(status["VmHWM"].split()[0]) / 1024.0,
            "cpu": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")}


class Native:
    """The agent run by an interpreter of this machine."""

    name = "x86_64" if os.uname().machine == "x86_64" else os.uname().machine

    def __init__(self, python: str, work: Path):
        self.python, self.work = python, work

    def path(self, name: str) -> Path:
        """A file the agent sees as ``path(name)``; ``host(...)`` is where it is here."""
        return self.work / name

    def host(self, path: Path) -> Path:
        return path

    def command(self, config: Path, cache: Path) -> tuple[list[str], dict[str, str]]:
        return ([self.python, "-m", "edge_agent", "run", "--config", str(config)],
                {**os.environ, "NUMBA_CACHE_DIR": str(cache)})

    @contextlib.contextmanager
    def session(self):
        yield self


class Emulated(Native):
    """The agent in ``make pi-check``'s arm64 userland, through qemu-user."""

    name = "arm64 (qemu-user)"

    def __init__(self):
        spec = importlib.util.spec_from_file_location("pi_check", REPO / "scripts/pi_check.py")
        self.pi = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.pi)
        if not (self.pi.to_inside(self.pi.VENV) / "bin" / "edge-agent").exists():
            raise SystemExit("--arm64: no arm64 userland with the agent; run make pi-check")
        self.work = self.pi.INSIDE / "bench-agent"
        shutil.rmtree(self.host(self.work), ignore_errors=True)
        self.host(self.work).mkdir(parents=True)

    def host(self, path: Path) -> Path:
        return self.pi.to_inside(path)

    def command(self, config: Path, cache: Path) -> tuple[list[str], dict[str, str]]:
        env = {"PATH": f"{self.pi.VENV}/bin:/usr/bin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8", "NUMBA_CACHE_DIR": str(cache)}
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        return [chroot, str(self.pi.ROOT), "/usr/bin/env", "edge-agent", "run", "--config",
                str(config)], env

    @contextlib.contextmanager
    def session(self):
        with self.pi.mounted():
            yield self


def sample_settings(broker, state_dir: Path) -> dict:
    """configs/agent.toml with this run's broker and state directory."""
    settings = tomllib.loads(SAMPLE.read_text())
    settings["broker"] = {**settings.get("broker", {}), "host": broker.host,
                          "port": broker.port}
    settings["privacy"] = {**settings["privacy"], "state_dir": str(state_dir)}
    return settings


def measure(machine: Native, settings: dict, cache: str, seconds: float) -> dict[str, float]:
    """One ``edge-agent run`` for ``seconds`` after start-up; ``cache`` names its numba
    cache directory (a new name is an empty cache)."""
    config = machine.path(f"agent-{cache}-{time.monotonic_ns()}.toml")
    write_toml(machine.host(config), settings)
    command, env = machine.command(config, machine.path(f"numba-{cache}"))
    log = machine.host(config).with_suffix(".log")
    began = time.monotonic()
    with open(log, "wb") as out:
        agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
    try:
        while "running" not in log.read_text(errors="replace"):
            if agent.poll() is not None or time.monotonic() - began > 900:
                raise SystemExit(f"the agent did not start: {log.read_text()[-3000:]}")
            time.sleep(0.05)
        ready = time.monotonic() - began
        start = proc_sample(agent.pid)
        t0 = time.monotonic()
        time.sleep(seconds)
        end = proc_sample(agent.pid)
        elapsed = time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.pid, signal.SIGTERM)
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    return {"ready": ready, "rss_ready": start["rss"], "rss": end["rss"], "peak": end["peak"],
            "cpu": 100 * (end["cpu"] - start["cpu"]) / elapsed}


def run(machine: Native, broker, seconds: float, rate_hz: float) -> list[tuple[str, dict]]:
    """The three settings on one machine."""
    sample = sample_settings(broker, machine.path("state-sample"))
    dense = {"agent_id": "bench", "fleet": "bench", "batch_seconds": 1.0,
             "broker": {"host": broker.host, "port": broker.port},
             "privacy": {"budget_epsilon": 1e6, "state_dir": str(machine.path("state-dense"))},
             "sources": [{"name": "imu", "type": "synthetic", "rate_hz": rate_hz}],
             "channels": CHANNELS}
    measure(machine, dense, "dense", 10.0)  # fills the cache with the dense setting's kernels
    return [("sample configuration, empty numba cache", measure(machine, sample, "a", seconds)),
            ("sample configuration, warm cache", measure(machine, sample, "a", seconds)),
            (f"10 channels x every reading at {rate_hz:g} Hz, warm cache",
             measure(machine, dense, "dense", seconds))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate-hz", type=float, default=50.0)
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the agent (e.g. a venv with only runtime deps)")
    parser.add_argument("--arm64", action="store_true",
                        help="also in make pi-check's arm64 userland (root, qemu-user)")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Mosquitto(Path(tmp)) as broker:
        machines = [Native(args.python, Path(tmp))]
        if args.arm64:
            machines.append(Emulated())
        results = []
        for machine in machines:
            with machine.session():
                results.append((machine.name, run(machine, broker, args.seconds, args.rate_hz)))
    header = "| setting | " + " | ".join(
        f"{name}: start / RSS at start / RSS after {args.seconds:g} s / peak / CPU"
        for name, _ in results) + " |"
    lines = [f"Machine: {describe_machine()}; agent interpreter: {args.python}", "",
             f"`edge-agent run` against Mosquitto, measured for {args.seconds:g} s after "
             "start-up (to the 'running' log line); RSS and its peak (VmHWM) in MB, CPU in % "
             "of one core:", "", header, "|---|" + "---:|" * len(results)]
    for i, (label, _) in enumerate(results[0][1]):
        cells = []
        for _, rows in results:
            r = rows[i][1]
            cells.append(f"{r['ready']:.1f} s / {r['rss_ready']:.0f} / {r['rss']:.0f} / "
                         f"**{r['peak']:.0f}** / {r['cpu']:.2f}%")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Goals, sample configuration with a warm cache: start <= 5 s, peak <= 150 MB, "
              "CPU <= 1% of a core."]
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
