"""Input sources: synthetic wearable, CSV replay, JSON lines, local MQTT, I2C IMU.

``build_source(config, agent_id=...)`` turns a validated source config into
its (not yet started) ``Source``; see ``base.Source`` for the lifecycle.
"""

from __future__ import annotations

from ..config import (
    CsvSourceConfig,
    I2cSourceConfig,
    JsonlSourceConfig,
    MqttSourceConfig,
    SyntheticSourceConfig,
)
from .base import Source
from .csv_source import CsvSource
from .derive import apply_derive
from .i2c import I2cSource
from .jsonl import JsonlSource
from .mqtt_source import MqttSource
from .synthetic import SyntheticSource

__all__ = [
    "CsvSource",
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
    if isinstance(config, CsvSourceConfig):
        return CsvSource(config)
    if isinstance(config, JsonlSourceConfig):
        return JsonlSource(config)
    if isinstance(config, MqttSourceConfig):
        return MqttSource(config, agent_id=agent_id)
    if isinstance(config, I2cSourceConfig):
        return I2cSource(config)
    raise TypeError(f"unknown source config type {type(config).__name__}")
