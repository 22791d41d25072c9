"""``edge-collector demo``: a broker, the collector with its dashboard, and a simulated fleet.

What runs (all as child processes of this one, all stopped on Ctrl-C, SIGTERM,
SIGHUP or after ``--duration``):

* a broker: the one given with ``--broker HOST:PORT`` (or ``BROKER``), else
  a private Mosquitto on a free port if ``mosquitto`` is installed, else the
  embedded pure-Python broker amqtt (MQTT 3.1.1; the collector then speaks
  3.1.1);
* ``edge-collector run`` with the dashboard on ``--http-port`` and a range
  discovery schedule for ``accel_x``; or with ``--scale-out``, a local 3-node
  NATS JetStream cluster, ``edge-collector ingress``, two ``edge-collector
  member`` and ``edge-collector merge`` serving the dashboard (docs/guides/SCALE_OUT.md),
  so that parts can be killed while watching the counts;
* ``edge-agent fleet --count N``: N simulated wearables, each its own agent
  (id ``wearable-<i>``, seed, budget and sequence numbers), streaming
  accelerometer axes, attitude angles, a polar channel, activity and heart
  rate.  By default (1,000 wearers) under the sample configuration's
  guarantees, which the planner spends: what a study could publish, with the
  errors per minute, hour and day it allows printed at the start; with
  ``--fast`` (24 wearers) 4 reports a second per channel under a budget no
  study could publish.  Because this is a simulation, the fleet also writes
  the true mean of what it reported (``truth.json``, see ``edge_agent.fleet``),
  so the live summary can show estimate next to truth.  Real agents never do
  this.

Nothing needs root.  Configs, state and logs go to ``--workdir`` (default: a
temporary directory, removed at the end); an existing one must be empty.

No child outlives the demo, however it ends: each gets SIGTERM from the kernel
when the demo dies (``collector.broker.lifetime``), SIGKILL of the demo included, and
a small janitor process removes the temporary directory once they are gone.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

from collector.broker.lifetime import CHILDREN_GRACE_SECONDS, preexec_die_with_parent
from collector.scaleout.local_cluster import NOT_INSTALLED as NATS_NOT_INSTALLED
from collector.scaleout.local_cluster import Node, find_nats_server, node_config
from collector.tools.watch import fetch, render
from edge_agent.common.config import toml_value

# The wearables' channels: a data file beside this module.
DEMO_CHANNELS = importlib.resources.files("collector.tools").joinpath("demo_channels.toml")
# What the demo promises every wearer (configs/agent.toml's): a guarantee a study could
# publish, which the planner spends; and the wearers it simulates by default, enough for
# an hour's mean to mean something (the plan's error per hour, printed at the start).
STUDY_GUARANTEES = ({"epsilon": 4, "per": "10m"}, {"epsilon": 120, "per": "1d"})
STUDY_AGENTS = 1000
# A planned channel reports one reading every half hour or so: the synthetic source
# need not draw many more (each reading drawn costs the simulator CPU).
STUDY_RATE_HZ = 1
PLAN_SHOWN = ("accel_x", "heart_rate")  # the channels whose plan the demo prints
# --fast: no guarantee a study could publish; a few wearers, each reporting every channel
# 4 times a second at these epsilons (1 where not named), so that estimates settle in
# seconds (and the tests' estimates match the truth within a minute).
FAST_AGENTS = 24
FAST_EPSILON = {"accel_z": 2.0, "accel_polar": 4.0}
FAST_REPORT_INTERVAL = 0.25
FAST_RATE_HZ = 20
CHECK_SECONDS = 120  # edge-agent check-config of the generated configuration, at most


# Ctrl-C, SIGTERM and SIGHUP (a closed terminal) stop the demo: the children run in
# their own sessions, so nobody else stops them.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RESTART_SECONDS = 30.0  # a killed part of the --scale-out demo comes back after this (its
# leases, 20 s, expire first: the others take its partitions, then it takes its share back)


class DemoError(ValueError):
    """A bad option or environment found before anything started (the CLI exits 2)."""


class Stopped(KeyboardInterrupt):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP): handled wherever Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, frame) -> None:
    # The first stop signal ignores the ones after it at once: an impatient second Ctrl-C
    # arriving before stop() has begun must not interrupt it (children left running).
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    raise Stopped(signum)


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


def port_free(host: str, port: int) -> bool:
    """Whether the collector could listen on host:port (it sets SO_REUSEADDR as here,
    so a port in TIME_WAIT counts as free and only a listener counts as taken)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def parse_broker(text: str, source: str = "--broker") -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DemoError(f"{source}: must be HOST:PORT, got {text!r}")
    return host, int(port)


def demo_channels(*, fast: bool) -> str:
    """The ``[[channels]]`` tables of DEMO_CHANNELS; with ``fast``, each with its
    epsilon per report (FAST_EPSILON) and FAST_REPORT_INTERVAL."""
    tables = []
    for table in tomllib.loads(DEMO_CHANNELS.read_text())["channels"]:
        if fast:
            table = {**table, "epsilon": FAST_EPSILON.get(table["name"], 1.0),
                     "report_interval": FAST_REPORT_INTERVAL}
        tables.append("[[channels]]\n" + "".join(f"{key} = {toml_value(value)}\n"
                                                 for key, value in table.items()))
    return "\n".join(tables)


class Janitor:
    """``python -m collector.broker.lifetime clean``: stops the demo's children and removes its
    temporary directory (``None``: a --workdir, kept) once the demo is gone, also when
    nobody is left to do it (SIGKILL)."""

    def __init__(self, directory: Path | None):
        self.directory = directory
        self.process = subprocess.Popen(
            [sys.executable, "-m", "collector.broker.lifetime", "clean",
             *([str(directory)] if directory is not None else [])],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd="/")

    def watch(self, pid: int) -> None:
        self.process.stdin.write(f"{pid}\n".encode())
        self.process.stdin.flush()

    def finish(self) -> None:
        """The children are stopped: clean up now, and wait for it."""
        self.process.stdin.close()
        self.process.wait(CHILDREN_GRACE_SECONDS + 10)


class Demo:
    def __init__(self, *, agents: int, duration: float, http_port: int, broker: str | None,
                 workdir: Path, embedded: bool = False, scale_out: bool = False,
                 fast: bool = False, console: Console | None = None,
                 janitor: Janitor | None = None):
        self.agents, self.duration, self.http_port = agents, duration, http_port
        self.fast = fast
        self.scale_out = scale_out
        self.workdir = workdir
        self.janitor = janitor
        self.console = console or Console()
        self.processes: list[tuple[str, subprocess.Popen]] = []
        # With --scale-out, parts a user may kill to watch the failover: restarted.
        self.restartable: dict[str, list[str]] = {}
        self._restart_at: dict[str, float] = {}
        self.url = f"http://127.0.0.1:{http_port}"
        self.broker_text = broker
        self.embedded = embedded

    # -- children -------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], *, restart: bool = False) -> subprocess.Popen:
        env = dict(os.environ)
        # compiled kernels survive the demo's temporary directory
        env.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "edge-ldp" / "numba"))
        with (self.workdir / f"{name}.log").open("ab") as log:  # the child has its own copy
            process = subprocess.Popen([sys.executable, *args] if args[0] == "-m" else args,
                                       stdout=log, stderr=subprocess.STDOUT, env=env,
                                       cwd=self.workdir, start_new_session=True,
                                       preexec_fn=preexec_die_with_parent(signal.SIGTERM))
        self.processes.append((name, process))
        if restart:
            self.restartable[name] = args
        if self.janitor is not None:
            self.janitor.watch(process.pid)
        return process

    def _log_tail(self, name: str, lines: int = 20) -> str:
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

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
            self._spawn("broker", ["-m", "collector.tools.embedded_broker", "--port", str(port)])
            version, what = "3.1.1", f"the embedded amqtt broker on 127.0.0.1:{port}"
        self._wait(lambda: port_open("127.0.0.1", port), 30, "the broker did not start")
        return "127.0.0.1", port, version, what

    def _start_nats(self) -> list[str]:
        """A 3-node NATS JetStream cluster on free loopback ports; its client URLs."""
        binary = find_nats_server()
        if binary is None:
            raise RuntimeError(NATS_NOT_INSTALLED)
        nodes = [Node(f"nats-{i}", free_port(), free_port(), self.workdir / f"nats-{i}")
                 for i in range(3)]
        for node in nodes:
            conf = self.workdir / f"{node.name}.conf"
            conf.write_text(node_config(node, nodes))
            self._spawn(node.name, [binary, "-c", str(conf)], restart=True)
        self._wait(lambda: all(port_open("127.0.0.1", node.client_port) for node in nodes),
                   30, "the NATS cluster did not start")
        return [node.url for node in nodes]

    def _start_scale_out(self, collector_config: Path) -> str:
        """Ingress, two aggregation members and the merge view (with the dashboard) on a
        local NATS cluster; what runs, for the banner."""
        urls = self._start_nats()
        base = collector_config.read_text()
        for role, name in (("ingress", "ingress"), ("member", "member-1"),
                           ("member", "member-2"), ("merge", "merge")):
            config = self.workdir / f"{name}.toml"
            config.write_text(base.replace('client_id = "demo-collector',
                                           f'client_id = "demo-{name}') + f"""
[scale_out]
servers = [{", ".join(toml_value(url) for url in urls)}]
partitions = 8
member = {toml_value(name)}
""")
            self._spawn(name, ["-m", "collector", role, "--config", str(config)],
                        restart=role != "merge")
        return ("3 NATS nodes, an ingress, 2 members and the merge view; kill -9 one of "
                f"{self._pids('nats-1', 'member-2', 'ingress')} and watch the counts: it "
                f"comes back after {RESTART_SECONDS:g} s")

    def _pids(self, *names: str) -> str:
        return ", ".join(f"{name} {process.pid}" for name, process in self.processes
                         if name in names)

    def _wait(self, predicate, timeout: float, failure: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            for name, process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited ({process.returncode}):\n"
                                       f"{self._log_tail(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(failure)
            time.sleep(0.2)

    def _write_configs(self, host: str, port: int, version: str) -> tuple[Path, Path]:
        # Someone else's broker: client ids of our own (two demos must not take each
        # other's connections, nor the range client a real collector's
        # "edge-collector-range") and no session left behind there.
        suffix = f"-{secrets.token_hex(4)}" if self.broker_text else ""
        expiry = "session_expiry_seconds = 0\n" if self.broker_text else ""
        state_dir = toml_value(self.workdir / "agents")
        if self.fast:
            # Each agent spends 11 eps per tick (FAST_EPSILON) at 4 ticks/s: 44 eps/s,
            # 158,400 per hour, plus range discovery's 1 eps per side, min and max once a
            # minute (120 per hour).  A budget of 1e6 per hour never runs out, so "until
            # Ctrl-C" means it (and the truth stays exact: nothing is refused).
            privacy = f"""budget_epsilon = 1000000.0
budget_period = "1h"
state_dir = {state_dir}
range_epsilon_max = 2.0"""
            aggregates, range_epsilon, range_every = "window_seconds = 10\n", 1.0, 60
            range_sides = ["min", "max"]
        else:
            # The planner spends the guarantees (less range discovery's reserve, a quarter
            # of the shortest: eps 1 free in every window) on the channels.  The reserve
            # is one run a day at eps 1: the minimum of accel_x, which 1,000 wearers find
            # at eps 1 (40 of 40 simulated runs) but not at eps 0.5 a side (6 of 40 for
            # the minimum, none for the maximum, whose readings lie far from the end).
            privacy = f"""guarantees = {toml_value(list(STUDY_GUARANTEES))}
plan_fleet = {self.agents}
state_dir = {state_dir}"""
            aggregates, range_epsilon, range_every = "", 1.0, 86400
            range_sides = ["min"]
        agent = self.workdir / "agent.toml"
        agent.write_text(f"""agent_id = "wearable"
fleet = "demo"
batch_seconds = 1.0
[broker]
host = {toml_value(host)}
port = {port}
[privacy]
{privacy}
[delivery]
confirm = "collector"      # the private broker keeps nothing on disk: keep reports till counted
[[sources]]
name = "imu"
type = "synthetic"
rate_hz = {FAST_RATE_HZ if self.fast else STUDY_RATE_HZ}
derive = ["horizontal"]
""" + demo_channels(fast=self.fast))
        collector = self.workdir / "collector.toml"
        collector.write_text(f"""fleet = "demo"
[broker]
host = {toml_value(host)}
port = {port}
mqtt_version = {toml_value(version)}
client_id = "demo-collector{suffix}"
{expiry}[http]
host = "127.0.0.1"
port = {self.http_port}
[storage]
path = {toml_value(self.workdir / 'collector.sqlite')}
checkpoint_seconds = 5
[aggregates]
{aggregates}[snapshots]
interval_seconds = 5
[range_discovery]
client_id = "demo-range{suffix}"
coordinator = true
epsilon = {range_epsilon}
strategy = "split"
window_seconds = 60
join_timeout_seconds = 3
round_timeout_seconds = 3
min_participants = {max(2, self.agents // 2)}
[[range_discovery.schedule]]
channel = "accel_x"
sides = {toml_value(range_sides)}
every_seconds = {range_every}
""")
        return agent, collector

    def _privacy_lines(self, agent_config: Path) -> list[str]:
        """What the wearers are promised, and (planned) what that lets the fleet's means
        say at each resolution: the plan's figures for this many wearers."""
        if self.fast:
            return ["Privacy: [bold red]ε ≤ 1,000,000 in any hour: no study could publish "
                    "this[/]; it lets a few wearers report 4 times a second so that estimates "
                    "settle in seconds (without --fast the demo states a real guarantee)."]
        # What the agents' own command line says of their configuration (the collector
        # does not load the agent's configuration itself).
        checked = subprocess.run([sys.executable, "-m", "edge_agent", "check-config",
                                  str(agent_config)], capture_output=True, text=True,
                                 timeout=CHECK_SECONDS)
        if checked.returncode != 0:
            raise RuntimeError(f"the agents' configuration is refused: {checked.stderr}")
        effective = json.loads(checked.stdout)
        plan = effective["plan"]
        lines = [f"Privacy: {effective['budget']['promise']} (as a study could publish; the "
                 f"planner sets each channel's ε per report and spacing)."]
        for name in PLAN_SHOWN:
            channel = plan["channels"][name]
            errors = channel["relative_rmse"]
            lines.append(
                f"  {name}: one report every {channel['every_seconds'] / 60:.0f} minutes per "
                f"wearer at ε {channel['epsilon_per_report']:.2g}; the mean of "
                f"{self.agents:,} wearers errs by about {errors['1m']:.2g} of the domain's "
                f"width per minute, {errors['1h']:.2g} per hour, {errors['1d']:.2g} per day")
        lines.append("Under this guarantee a minute's window is mostly noise: the dashboard "
                     "opens on hours, and the interval of the hour under way narrows as "
                     "wearers report (their phases are random).")
        return lines

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> int:
        """0 when stopped as asked, 1 when a child exited on its own; Ctrl-C, SIGTERM or
        SIGHUP during start-up raise KeyboardInterrupt after everything is stopped."""
        with ExitStack() as stack:
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:  # under nohup, stay
                    stack.callback(signal.signal, signum,
                                   signal.signal(signum, _raise_stopped))
            stack.callback(self.stop)
            host, port, version, what = self._start_broker()
            agent_config, collector_config = self._write_configs(host, port, version)
            privacy = self._privacy_lines(agent_config)  # refused: before anything else
            if self.scale_out:
                what += "; " + self._start_scale_out(collector_config)
            else:
                self._spawn("collector", ["-m", "collector", "run", "--config",
                                          str(collector_config)])
            self._wait(lambda: fetch(self.url + "/api/channels", timeout=1)[0] is not None, 60,
                       "the collector did not start")
            self._spawn("fleet", ["-m", "edge_agent", "fleet", "--config", str(agent_config),
                                  "--count", str(self.agents), "--truth",
                                  str(self.workdir / "truth.json")])
            self.console.print(f"[bold]edge-ldp demo[/]: {self.agents:,} simulated wearables "
                               f"through {what}")
            for line in privacy:
                self.console.print(line)
            page = f"{self.url}/" if self.fast else f"{self.url}/?resolution=1h"
            self.console.print(f"Dashboard: [link={page}]{page}[/link]   "
                               f"API: {self.url}/api/channels   logs: {self.workdir}")
            self.console.print("Ctrl-C stops everything." if not self.duration
                               else f"Running for {self.duration:g} s.")
            try:
                self._summary_loop()
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: a requested stop
                pass
            return self._check_children()

    def _exited(self) -> bool:
        """Whether a child the demo cannot do without exited; a restartable one that did is
        started again (after ``RESTART_SECONDS``: long enough to watch the failover)."""
        for i, (name, process) in enumerate(self.processes):
            if process.poll() is None or name not in self.restartable:
                continue
            if name not in self._restart_at:
                self._restart_at[name] = time.monotonic() + RESTART_SECONDS
                self.console.print(f"{name} exited ({process.returncode}); the others go on, "
                                   f"and it is started again in {RESTART_SECONDS:g} s")
            elif time.monotonic() >= self._restart_at[name]:
                del self._restart_at[name], self.processes[i]
                self._spawn(name, self.restartable[name], restart=True)
                self.console.print(f"{name} started again")
                break
        return any(process.poll() is not None for name, process in self.processes
                   if name not in self.restartable)

    def _summary_loop(self) -> None:
        """Until the duration is over or a child exits; the view every `interval` s."""
        now = time.monotonic()
        deadline = now + self.duration if self.duration else float("inf")
        live = self.console.is_terminal
        interval = 2.0 if live else 10.0
        next_view = now if live else now + interval  # a log gets no empty first table
        with ExitStack() as stack:
            if live:
                from rich.live import Live

                view = stack.enter_context(Live(render(None), console=self.console,
                                                auto_refresh=False))
            while (now := time.monotonic()) < deadline and not self._exited():
                if now >= next_view:
                    if live:
                        view.update(self._view(), refresh=True)
                    else:
                        self.console.print(self._view())
                    next_view = now + interval
                time.sleep(max(0.0, min(0.5, next_view - now, deadline - now)))
            if not live and not self._exited():
                self.console.print(self._view())  # the final state

    def _check_children(self) -> int:
        """1 (and the end of its log, which may be in a directory about to be
        removed) for every child that exited on its own; else 0."""
        code = 0
        for name, process in self.processes:
            if process.poll() is not None and name not in self.restartable:
                self.console.print(f"[red]{name} exited early ({process.returncode}); "
                                   f"the end of {name}.log:[/]", highlight=False)
                self.console.print(self._log_tail(name), markup=False, highlight=False)
                code = 1
        return code

    def _view(self):
        from rich.console import Group

        document, error = fetch(self.url + "/api/channels", timeout=2)
        parts = [render(document, error=error)]
        truth = self._truth()
        if document and truth:
            parts.append(truth_table(document, truth))
            shares = shares_table(document, truth)
            if shares.row_count:
                parts.append(shares)
        return Group(*parts)

    def _truth(self) -> dict | None:
        try:
            return json.loads((self.workdir / "truth.json").read_text())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """The fleet first (it flushes), then the collector (it checkpoints), then the
        broker.  Ctrl-C, SIGTERM and SIGHUP are ignored meanwhile: a second one must
        not leave the rest running; whatever does not stop in time is killed."""
        previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
        try:
            deadline = time.monotonic() + 40
            for _, process in reversed(self.processes):
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(max(1.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
        finally:
            for _, process in self.processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _number(x) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


def truth_table(document: dict, truth: dict) -> Table:
    """Estimates next to the simulation's true means (linear channels); "–" for
    whatever the collector cannot tell yet."""
    table = Table(title="estimate vs simulated truth (linear channels)", show_edge=False)
    for column in ("channel", "estimate", "95% interval", "truth", "raw mean of reports"):
        table.add_column(column, justify="right" if column != "channel" else "left")
    for name, channel in document.get("channels", {}).items():
        mean, true = channel.get("mean"), truth.get(name, {}).get("mean")
        if not isinstance(mean, dict) or true is None:
            continue
        ci = mean.get("ci95")
        low, high = ci if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
        interval = f"[{_number(low)}, {_number(high)}]" if low is not None else "–"
        table.add_row(name, _number(mean.get("estimate")), interval, _number(true),
                      _number(mean.get("raw")))
    return table


def shares_table(document: dict, truth: dict) -> Table:
    """Categorical channels: each category's unbiased share, its 95% interval and the
    consistent share (non-negative, summing to 1), next to the simulation's true share."""
    table = Table(title="category shares vs simulated truth", show_edge=False)
    for column in ("channel", "category", "estimate", "95% interval", "consistent", "truth"):
        table.add_column(column, justify="left" if column in ("channel", "category")
                         else "right")
    for name, channel in document.get("channels", {}).items():
        frequencies = channel.get("frequencies")
        true = truth.get(name, {}).get("shares")
        if not isinstance(frequencies, dict) or not isinstance(true, dict):
            continue
        for label, estimate, ci, share in zip(*(frequencies.get(key, []) for key in (
                "labels", "estimate", "ci95", "shares"))):
            low, high = ci if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
            interval = f"[{_number(low)}, {_number(high)}]" if low is not None else "–"
            table.add_row(name, label, _number(estimate), interval, _number(share),
                          _number(true.get(label)))
    return table


def run_demo(*, agents: int | None, duration: float, http_port: int, broker: str | None,
             workdir: str | None, embedded: bool = False, scale_out: bool = False,
             fast: bool = False) -> int:
    """Raises DemoError (nothing started) for a bad BROKER or --broker, an HTTP port in
    use or a non-empty --workdir.  ``agents`` None: STUDY_AGENTS, FAST_AGENTS with
    ``fast``."""
    if broker is None and os.environ.get("BROKER"):
        broker = os.environ["BROKER"]
        parse_broker(broker, "BROKER")
    elif broker is not None:
        parse_broker(broker)
    if not port_free("127.0.0.1", http_port):
        raise DemoError(f"port {http_port} is in use; pass --http-port "
                        f'(make demo DEMO_ARGS="--http-port {http_port + 1}")')
    if scale_out and find_nats_server() is None:
        raise DemoError(NATS_NOT_INSTALLED)
    if agents is None:
        agents = FAST_AGENTS if fast else STUDY_AGENTS
    options = dict(agents=agents, duration=duration, http_port=http_port, broker=broker,
                   embedded=embedded, scale_out=scale_out, fast=fast)
    if workdir is None:
        directory = Path(tempfile.mkdtemp(prefix="edge-ldp-demo-"))
        janitor = Janitor(directory)
        try:
            return Demo(workdir=directory, janitor=janitor, **options).run()
        finally:
            janitor.finish()
    path = Path(workdir)
    # An earlier run's collector.sqlite would be mixed with a fresh truth.json; refusing
    # loses nothing, clearing could delete someone's files.
    if path.exists() and any(path.iterdir()):
        raise DemoError(f"--workdir {workdir} is not empty; pass a new or empty directory")
    path.mkdir(parents=True, exist_ok=True)
    janitor = Janitor(None)  # the children go with the demo; the directory stays
    try:
        return Demo(workdir=path.resolve(), janitor=janitor, **options).run()
    finally:
        janitor.finish()
