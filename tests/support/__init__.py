"""The helpers the tests and the benchmarks share, each in one place.

- ports: free_port, port_open, wait_until, stays_false, returns_within (waits are
  guards against a hang, never bounds on speed)
- brokers: find_mosquitto, require_mosquitto, Mosquitto
- configs: agent and collector configurations as dicts and TOML files
- mqtt: MqttClient, Subscriber, session_present
- processes: AgentProcess, FleetProcess, CollectorProcess, run_module (a CLI command
  to completion), wait_for_api, and the clean-up of whatever a test leaves running
- fakes: FakeTransport, SimulatedTime
- paths: REPO, child_env
- results: RecordedFleet (aggregates recording into a SQLite results store, served)

The benchmarks import them too (``python -m benchmarks.<name>`` from the
repository root), so nothing here may need pytest at import time.
"""

from tests.support.brokers import Mosquitto, find_mosquitto, require_mosquitto
from tests.support.configs import (
    AX_CHANNEL,
    FLEET,
    SYNTHETIC_IMU,
    agent_config,
    broker_table,
    collector_config,
    to_toml,
    toml_value,
    write_agent_config,
    write_toml,
)
from tests.support.fakes import FakeTransport, SimulatedTime
from tests.support.mqtt import MqttClient, Subscriber, session_present
from tests.support.paths import REPO, child_env
from tests.support.ports import (
    HANG_GUARD_SECONDS,
    LOOPBACK,
    free_port,
    port_open,
    returns_within,
    stays_false,
    wait_until,
)
from tests.support.processes import (
    AgentProcess,
    ChildProcess,
    CollectorProcess,
    FleetProcess,
    python_module,
    replaying_agents,
    run_module,
    spent_by_channel,
    stop_leftover_processes,
    track,
    wait_for_api,
)

__all__ = [
    "AX_CHANNEL", "FLEET", "HANG_GUARD_SECONDS", "LOOPBACK", "REPO", "SYNTHETIC_IMU",
    "AgentProcess", "ChildProcess", "CollectorProcess", "FakeTransport", "FleetProcess",
    "Mosquitto", "MqttClient", "SimulatedTime", "Subscriber", "agent_config", "broker_table",
    "child_env", "collector_config", "find_mosquitto", "free_port", "port_open",
    "python_module", "replaying_agents", "require_mosquitto", "returns_within", "run_module",
    "session_present", "spent_by_channel", "stays_false", "stop_leftover_processes",
    "to_toml", "toml_value", "track", "wait_for_api", "wait_until", "write_agent_config",
    "write_toml",
]
