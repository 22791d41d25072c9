"""Input sources: synthetic wearable, CSV replay, JSON lines, local MQTT, I2C IMU,
phone and watch apps over HTTP, wearables over Bluetooth LE.

``build_source(config, agent_id=...)`` turns a validated source config into
its (not yet started) ``Source``; see ``base.Source`` for the lifecycle.
"""

from __future__ import annotations

from ..config import (
    BleSourceConfig,
    CsvSourceConfig,
    HttpSourceConfig,
    I2cSourceConfig,
    JsonlSourceConfig,
    MqttSourceConfig,
    SyntheticSourceConfig,
)
from .base import Source
from .ble import BleSource  # bleak is imported at start()
from .csv_source import CsvSource
from .derive import apply_derive
from .http_source import HttpSource  # its server (http_server) is imported at start()
from .i2c import I2cSource
from .jsonl import JsonlSource
from .mqtt_source import MqttSource
from .synthetic import SyntheticSource

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
