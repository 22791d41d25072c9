"""Helpers for end-to-end tests: the agent as a real process, a real paho subscriber."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt

REPO = Path(__file__).resolve().parents[2]


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def write_config(path: Path, *, agent_id="w1", fleet="demo", broker, state_dir, sources,
                 channels, budget=1e6, period="1d", batch_seconds=0.2) -> Path:
    lines = [f"agent_id = {toml_value(agent_id)}", f"fleet = {toml_value(fleet)}",
             f"batch_seconds = {batch_seconds}", "", "[broker]",
             f"host = {toml_value(broker.host)}", f"port = {broker.port}", "", "[privacy]",
             f"budget_epsilon = {budget}", f"budget_period = {toml_value(period)}",
             f"state_dir = {toml_value(str(state_dir))}", ""]
    for table, items in (("sources", sources), ("channels", channels)):
        for item in items:
            lines.append(f"[[{table}]]")
            nested = {}
            for key, value in item.items():
                if isinstance(value, dict):
                    nested[key] = value
                else:
                    lines.append(f"{key} = {toml_value(value)}")
            for key, value in nested.items():
                lines.append(f"[{table}.{key}]")
                lines.extend(f"{k} = {toml_value(v)}" for k, v in value.items())
            lines.append("")
    path.write_text("\n".join(lines))
    return path


class AgentProcess:
    def __init__(self, config: Path, log: Path):
        self.config, self.log = config, log
        self.process: subprocess.Popen | None = None

    def start(self) -> "AgentProcess":
        env = dict(os.environ)
        env.setdefault("NUMBA_CACHE_DIR", str(REPO / ".venv" / "numba-cache"))
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "edge_agent", "run", "--config", str(self.config)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        return self

    def terminate(self, timeout: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def output(self) -> str:
        return self.log.read_text()


class Subscriber:
    """Collects every message on a topic filter (QoS 1), optionally with a persistent session."""

    def __init__(self, broker, topic: str, *, client_id: str | None = None):
        self.messages: list[tuple[str, bytes, bool]] = []
        self._lock = threading.Lock()
        self.topic = topic
        persistent = client_id is not None
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or "",
                                  clean_session=not persistent)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.1, 1)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        deadline = time.monotonic() + 5
        while not self.client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # let the SUBACK land

    def _on_message(self, client, userdata, message):
        with self._lock:
            self.messages.append((message.topic, message.payload, message.retain))

    def reports(self, channel: str | None = None) -> list[dict]:
        with self._lock:
            items = list(self.messages)
        out = []
        for topic, payload, _ in items:
            if topic.endswith("/status"):
                continue
            message = json.loads(payload)
            if channel is None or message["channel"] == channel:
                out.append(message)
        return out

    def statuses(self) -> list[dict]:
        with self._lock:
            return [json.loads(p) for t, p, _ in self.messages if t.endswith("/status")]

    def wait_for(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
