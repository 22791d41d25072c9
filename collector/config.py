"""Collector configuration: TOML validated by pydantic v2 (errors as in the agent)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, model_validator

from edge_agent.config import (
    BrokerConfig,
    ConfigError,
    Name,
    _Model,
    format_validation_error,
)


class CollectorBrokerConfig(BrokerConfig):
    client_id: Name = "edge-collector"
    # The broker keeps the session (and queues reports) this long while the
    # collector is away (MQTT v5 session expiry).
    session_expiry_seconds: Annotated[int, Field(ge=0, le=2**32 - 1)] = 86400
    # Several collector shards share one subscription (see docs/SCALE_OUT.md).
    shared_group: Name | None = None


class HttpConfig(_Model):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080  # 0: any free port
    push_seconds: Annotated[float, Field(gt=0, le=60)] = 1.0


class StorageConfig(_Model):
    path: Path = Path("/var/lib/edge-collector/state.sqlite")
    # Full checkpoint of all aggregates; between checkpoints every message is
    # journaled, so a crash loses nothing either way.
    checkpoint_seconds: Annotated[float, Field(ge=0.5, le=3600)] = 10.0
    # Journal commits (and so broker acknowledgements) are grouped this often.
    ack_interval_seconds: Annotated[float, Field(ge=0.005, le=5)] = 0.05


class AggregatesConfig(_Model):
    window_seconds: Annotated[float, Field(ge=1, le=86400)] = 60.0
    histogram_bins: Annotated[int, Field(ge=4, le=1000)] = 50
    keep_windows: Annotated[int, Field(ge=1, le=10_000)] = 60


class SnapshotConfig(_Model):
    # Retained aggregate snapshots on ldp/v1/<fleet>/_aggregates/<channel>; 0 = off.
    interval_seconds: Annotated[float, Field(ge=0, le=86400)] = 10.0


class CollectorConfig(_Model):
    fleet: Name
    broker: CollectorBrokerConfig = CollectorBrokerConfig()
    http: HttpConfig = HttpConfig()
    storage: StorageConfig = StorageConfig()
    aggregates: AggregatesConfig = AggregatesConfig()
    snapshots: SnapshotConfig = SnapshotConfig()

    @model_validator(mode="after")
    def _ports(self):
        if self.http.port == self.broker.port and self.http.host == self.broker.host \
                and self.http.port != 0:
            raise ValueError("http.port: must differ from broker.port on the same host")
        return self


def parse_collector_config(data: dict) -> CollectorConfig:
    try:
        return CollectorConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def load_collector_config(path: str | Path) -> CollectorConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_collector_config(data)


__all__ = ["CollectorConfig", "ConfigError", "load_collector_config", "parse_collector_config"]
