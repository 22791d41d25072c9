"""``edge-collector demo``: a broker, the collector with its dashboard, and a simulated fleet.

What runs (all as child processes of this one, all stopped on Ctrl-C or after
``--duration``):

* a broker: the one given with ``--broker HOST:PORT`` (or ``BROKER``), else
  a private Mosquitto on a free port if ``mosquitto`` is installed, else the
  embedded pure-Python broker amqtt (MQTT 3.1.1; the collector then speaks
  3.1.1);
* ``edge-collector run`` with the dashboard on ``--http-port`` and a range
  discovery schedule for ``accel_x``;
* ``edge-agent fleet --count N``: N simulated wearables, each its own agent
  (id ``wearable-<i>``, seed, budget and sequence numbers), streaming
  accelerometer axes, attitude angles and a polar channel.  Because this
  is a simulation, the fleet also writes the true mean of what it reported
  (``truth.json``, see ``edge_agent.fleet``), so the live summary can show
  estimate next to truth.  Real agents never do this.

Nothing needs root.  Configs, state and logs go to ``--workdir`` (default: a
temporary directory, removed at the end).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .watch import fetch, render

DEMO_CHANNELS = """
[[sources]]
name = "imu"
type = "synthetic"
rate_hz = 20
derive = ["horizontal"]

[[channels]]
name = "accel_x"
source = "imu"
field = "accel_x"
kind = "linear"
epsilon = 1.0
domain = [-2.0, 2.0]
report_interval = 0.25

[[channels]]
name = "accel_y"
source = "imu"
field = "accel_y"
kind = "linear"
mechanism = "ogpm-unbiased"
epsilon = 1.0
domain = [-2.0, 2.0]
report_interval = 0.25

[[channels]]
name = "accel_z"
source = "imu"
field = "accel_z"
kind = "linear"
epsilon = 2.0
domain = [-1.0, 3.0]
report_interval = 0.25

[[channels]]
name = "roll"
source = "imu"
field = "roll"
kind = "circular"
epsilon = 1.0
origin = -3.141592653589793
report_interval = 0.25

[[channels]]
name = "pitch"
source = "imu"
field = "pitch"
kind = "circular"
epsilon = 1.0
origin = -3.141592653589793
report_interval = 0.25

[[channels]]
name = "yaw"
source = "imu"
field = "yaw"
kind = "circular"
epsilon = 1.0
report_interval = 0.25

[[channels]]
name = "accel_polar"
source = "imu"
fields = ["accel_h_mag", "accel_h_dir"]
kind = "polar"
epsilon = 3.0
radius_max = 2.0
report_interval = 0.25
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def parse_broker(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--broker: must be HOST:PORT, got {text!r}")
    return host, int(port)


class Demo:
    def __init__(self, *, agents: int, duration: float, http_port: int, broker: str | None,
                 workdir: Path, embedded: bool = False, console: Console | None = None):
        self.agents, self.duration, self.http_port = agents, duration, http_port
        self.workdir = workdir
        self.console = console or Console()
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.url = f"http://127.0.0.1:{http_port}"
        self.broker_text = broker
        self.embedded = embedded

    # -- children -------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        env = dict(os.environ)
        # compiled kernels survive the demo's temporary directory
        env.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "edge-ldp" / "numba"))
        log = (self.workdir / f"{name}.log").open("ab")
        process = subprocess.Popen([sys.executable, *args] if args[0] == "-m" else args,
                                   stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=self.workdir, start_new_session=True)
        self.processes.append((name, process))
        return process

    def _start_broker(self) -> tuple[str, int, str, str]:
        """(host, port, MQTT version, description)."""
        if self.broker_text:
            host, port = parse_broker(self.broker_text)
            if not port_open(host, port):
                raise RuntimeError(f"no broker answers at {host}:{port}")
            return host, port, "5", f"the broker at {host}:{port}"
        port = free_port()
        mosquitto = None if self.embedded else (
            shutil.which("mosquitto") or next((p for p in ("/usr/sbin/mosquitto",
                                                           "/usr/local/sbin/mosquitto")
                                               if os.path.exists(p)), None))
        if mosquitto:
            conf = self.workdir / "mosquitto.conf"
            conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                            "max_queued_messages 100000\nmax_inflight_messages 1000\n")
            self._spawn("mosquitto", [mosquitto, "-c", str(conf)])
            version, what = "5", f"a private Mosquitto on 127.0.0.1:{port}"
        else:
            self._spawn("broker", ["-m", "collector.embedded_broker", "--port", str(port)])
            version, what = "3.1.1", f"the embedded amqtt broker on 127.0.0.1:{port}"
        self._wait(lambda: port_open("127.0.0.1", port), 30, "the broker did not start")
        return "127.0.0.1", port, version, what

    def _wait(self, predicate, timeout: float, failure: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            for name, process in self.processes:
                if process.poll() is not None:
                    log = (self.workdir / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name} exited ({process.returncode}):\n{log}")
            if time.monotonic() > deadline:
                raise RuntimeError(failure)
            time.sleep(0.2)

    def _write_configs(self, host: str, port: int, version: str) -> tuple[Path, Path]:
        agent = self.workdir / "agent.toml"
        agent.write_text(f"""agent_id = "wearable"
fleet = "demo"
batch_seconds = 1.0
[broker]
host = "{host}"
port = {port}
[privacy]
budget_epsilon = 1000000.0
budget_period = "1d"
state_dir = "{self.workdir / 'agents'}"
range_epsilon_max = 2.0
""" + DEMO_CHANNELS)
        collector = self.workdir / "collector.toml"
        collector.write_text(f"""fleet = "demo"
[broker]
host = "{host}"
port = {port}
mqtt_version = "{version}"
client_id = "demo-collector"
[http]
host = "127.0.0.1"
port = {self.http_port}
[storage]
path = "{self.workdir / 'collector.sqlite'}"
checkpoint_seconds = 5
[aggregates]
window_seconds = 10
[snapshots]
interval_seconds = 5
[range_discovery]
coordinator = true
epsilon = 1.0
strategy = "split"
window_seconds = 60
join_timeout_seconds = 3
round_timeout_seconds = 3
min_participants = {max(2, self.agents // 2)}
[[range_discovery.schedule]]
channel = "accel_x"
every_seconds = 60
""")
        return agent, collector

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> int:
        with ExitStack() as stack:
            stack.callback(self.stop)
            host, port, version, what = self._start_broker()
            agent_config, collector_config = self._write_configs(host, port, version)
            self._spawn("collector", ["-m", "collector", "run", "--config",
                                      str(collector_config)])
            self._wait(lambda: fetch(self.url + "/api/channels", timeout=1)[0] is not None, 60,
                       "the collector did not start")
            self._spawn("fleet", ["-m", "edge_agent", "fleet", "--config", str(agent_config),
                                  "--count", str(self.agents), "--truth",
                                  str(self.workdir / "truth.json")])
            self.console.print(f"[bold]edge-ldp demo[/]: {self.agents} simulated wearables "
                               f"through {what}")
            self.console.print(f"Dashboard: [link={self.url}/]{self.url}/[/link]   "
                               f"API: {self.url}/api/channels   logs: {self.workdir}")
            self.console.print("Ctrl-C stops everything." if not self.duration
                               else f"Running for {self.duration:g} s.")
            self._summary_loop()
        return 0

    def _summary_loop(self) -> None:
        deadline = time.monotonic() + self.duration if self.duration else float("inf")
        live = self.console.is_terminal
        interval = 2.0 if live else 10.0
        try:
            if live:
                from rich.live import Live

                with Live(render(None), console=self.console, auto_refresh=False) as view:
                    while time.monotonic() < deadline:
                        view.update(self._view(), refresh=True)
                        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
            else:
                while time.monotonic() < deadline:
                    time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
                    self.console.print(self._view())
        except KeyboardInterrupt:
            pass
        self._check_children()

    def _check_children(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                self.console.print(f"[red]{name} exited early ({process.returncode}); see "
                                   f"{self.workdir / (name + '.log')}[/]")

    def _view(self):
        from rich.console import Group

        document, error = fetch(self.url + "/api/channels", timeout=2)
        parts = [render(document, error=error)]
        truth = self._truth()
        if document and truth:
            parts.append(truth_table(document, truth))
        return Group(*parts)

    def _truth(self) -> dict | None:
        try:
            return json.loads((self.workdir / "truth.json").read_text())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """The fleet first (it flushes), then the collector (it checkpoints), then the broker."""
        for name, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(40)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)


def truth_table(document: dict, truth: dict) -> Table:
    """Estimates next to the simulation's true means (linear channels)."""
    table = Table(title="estimate vs simulated truth (linear channels)", show_edge=False)
    for column in ("channel", "estimate", "95% interval", "truth", "raw mean of reports"):
        table.add_column(column, justify="right" if column != "channel" else "left")
    for name, channel in document.get("channels", {}).items():
        mean, true = channel.get("mean"), truth.get(name, {}).get("mean")
        if not isinstance(mean, dict) or true is None or mean.get("estimate") is None:
            continue
        low, high = mean.get("ci95") or (None, None)
        table.add_row(name, f"{mean['estimate']:.4f}",
                      f"[{low:.4f}, {high:.4f}]" if low is not None else "–",
                      f"{true:.4f}", f"{mean['raw']:.4f}")
    return table


def run_demo(*, agents: int, duration: float, http_port: int, broker: str | None,
             workdir: str | None, embedded: bool = False) -> int:
    broker = broker or os.environ.get("BROKER") or None
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="edge-ldp-demo-") as tmp:
            return Demo(agents=agents, duration=duration, http_port=http_port, broker=broker,
                        workdir=Path(tmp), embedded=embedded).run()
    path = Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    return Demo(agents=agents, duration=duration, http_port=http_port, broker=broker,
                workdir=path.resolve(), embedded=embedded).run()
