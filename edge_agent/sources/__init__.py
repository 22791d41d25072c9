"""Input sources: synthetic wearable, CSV replay, JSON lines, local MQTT, I2C IMU,
phone and watch apps over HTTP, wearables over Bluetooth LE.

``build_source(config, agent_id=...)`` turns a validated source config into
its (not yet started) ``Source``; see ``base.Source`` for the lifecycle.
"""

from __future__ import annotations

from edge_agent.config import (
    BleSourceConfig,
    CsvSourceConfig,
    HttpSourceConfig,
    I2cSourceConfig,
    JsonlSourceConfig,
    MqttSourceConfig,
    SyntheticSourceConfig,
)
from edge_agent.sources.base import Source
from edge_agent.sources.ble.source import BleSource  # bleak is imported at start()
from edge_agent.sources.csv_source import CsvSource
from edge_agent.sources.derive import apply_derive
from edge_agent.sources.http.source import (
    HttpSource,  # its server (http_server) is imported at start()
)
from edge_agent.sources.i2c import I2cSource
from edge_agent.sources.jsonl import JsonlSource
from edge_agent.sources.mqtt_source import MqttSource
from edge_agent.sources.synthetic import SyntheticSource

__all__ = [
    "BleSource",
    "CsvSource",
    "HttpSource",
    "I2cSource",
    "JsonlSource",
    "MqttSource",
    "Source",
    "SyntheticSource",
    "apply_derive",
    "build_source",
]


def build_source(config, *, agent_id: str) -> Source:
    """The source a config describes (constructed only: no I/O until start())."""
    if isinstance(config, SyntheticSourceConfig):
        return SyntheticSource(config, agent_id=agent_id)
    if isinstance(config, BleSourceConfig):
        return BleSource(config)
    if isinstance(config, CsvSourceConfig):
        return CsvSource(config)
    if isinstance(config, HttpSourceConfig):
        return HttpSource(config)
    if isinstance(config, JsonlSourceConfig):
        return JsonlSource(config)
    if isinstance(config, MqttSourceConfig):
        return MqttSource(config, agent_id=agent_id)
    if isinstance(config, I2cSourceConfig):
        return I2cSource(config)
    raise TypeError(f"unknown source config type {type(config).__name__}")
