"""The agent's ``[[sources]]``: one table type per source, told apart by ``type``.

Each source type's table is validated here; ``source_fields`` says which fields a
source provides, so that a channel naming a field its source lacks is refused by
check-config (``config.agent``).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, SecretStr, field_validator, model_validator

from edge_agent.common.config import (
    Model,
    Name,
    Port,
    Rate,
    explain_pattern,
    union_tags,
)
from edge_agent.common.mqtt_client import Endpoint

Derive = Literal["horizontal", "tilt"]


class _SourceBase(Model):
    name: Name
    # Derived fields: "horizontal" adds accel_h_mag and accel_h_dir from
    # accel_x/accel_y; "tilt" adds roll and pitch from accel_x/y/z where the
    # source has no attitude of its own.
    derive: list[Derive] = []


class SyntheticSourceConfig(_SourceBase):
    type: Literal["synthetic"]
    rate_hz: Rate = 50.0
    seed: int | None = None  # default: derived from agent_id and source name
    duration: Annotated[float, Field(gt=0)] | None = None  # finite run (seconds)


class CsvSourceConfig(_SourceBase):
    type: Literal["csv"]
    path: Path
    pace: Literal["recorded", "fixed", "fast"] = "fixed"
    rate_hz: Rate = 50.0
    timestamp_column: str | None = None  # for pace = "recorded" (seconds)
    loop: bool = False
    columns: dict[str, str]  # field name = CSV column

    @model_validator(mode="after")
    def _recorded_needs_timestamps(self):
        if self.pace == "recorded" and not self.timestamp_column:
            raise ValueError("pace = 'recorded' needs timestamp_column")
        if not self.columns:
            raise ValueError("columns must map at least one field to a CSV column")
        return self


class JsonlSourceConfig(_SourceBase):
    type: Literal["jsonl"]
    path: str = "-"  # '-' = standard input
    timestamp_field: str | None = None  # field holding seconds since the epoch


class MqttSourceConfig(_SourceBase):
    type: Literal["mqtt"]
    host: str = "127.0.0.1"
    port: Port = 1883
    topic: str  # e.g. "wearables/+/raw"; payload: a JSON object (or list) of fields
    username: str | None = None
    password: SecretStr | None = None
    timestamp_field: str | None = None

    def endpoint(self) -> Endpoint:
        """The local broker (no TLS: it runs on the gateway itself)."""
        return Endpoint(host=self.host, port=self.port, username=self.username,
                        password=self.password.get_secret_value() if self.password else None)


class I2cSourceConfig(_SourceBase):
    type: Literal["i2c"]
    bus: Annotated[int, Field(ge=0, le=255)] = 1
    address: Annotated[int, Field(ge=0x03, le=0x77)] = 0x68
    rate_hz: Annotated[float, Field(gt=0, le=1000)] = 50.0


class HttpSourceConfig(_SourceBase):
    """Sensor batches that phone and watch apps POST as JSON (edge_agent/sources/http/source.py)."""

    type: Literal["http"]
    # The address to listen on: loopback, or a private or link-local address of this
    # device (never 0.0.0.0, :: or a public address: raw readings stay on the local
    # network).
    host: str = "127.0.0.1"
    port: Port = 8780  # the senders' URL: http://<host>:<port>/readings
    # The token senders present as "Authorization: Bearer <token>" (at least 16
    # characters; read at start-up).
    token_file: Path
    # "records": {"readings": [{...}, ...]} or a bare list of readings, each an object
    # with its time; "sensor-logger": the Sensor Logger app's HTTP push.
    format: Literal["records", "sensor-logger"] = "records"
    # format = "records": the path of each reading's time (default "time").
    timestamp_field: str | None = None
    # format = "records": the unit of that time since the epoch: s (default), ms, us or ns.
    timestamp_unit: Literal["s", "ms", "us", "ns"] | None = None
    # field name = path in a reading: a key, or a dotted path into nested objects
    # ("acc.x"); with format = "sensor-logger", "<sensor name>.<values key>"
    # ("accelerometer.x").
    fields: dict[str, str]
    # Largest request body accepted (413 beyond, refused before it is read).
    max_body_bytes: Annotated[int, Field(ge=1024, le=16 << 20)] = 1 << 20
    # Most readings in one request (413 beyond).
    max_readings: Annotated[int, Field(ge=1, le=100_000)] = 10_000
    # Readings held for the agent's next batch; a request that does not fit gets 503.
    queue_readings: Annotated[int, Field(ge=1, le=1_000_000)] = 50_000
    # How long a request waits for the batch that takes its readings to be committed
    # (503 "retry" beyond); must exceed batch_seconds.
    commit_timeout_seconds: Annotated[float, Field(gt=0, le=300)] = 10.0

    @field_validator("host")
    @classmethod
    def _local_network(cls, value: str) -> str:
        return local_address(value)

    @field_validator("token_file")
    @classmethod
    def _home(cls, value: Path) -> Path:
        return value.expanduser()

    # Field validators see the keys declared before theirs (info.data): the format.
    @field_validator("timestamp_field", "timestamp_unit")
    @classmethod
    def _records_only(cls, value, info):
        if value is not None and info.data.get("format") == "sensor-logger":
            raise ValueError("not with format = 'sensor-logger' (its readings carry their "
                             "time in 'time', in ns)")
        return value

    @field_validator("fields")
    @classmethod
    def _mapping(cls, fields: dict[str, str], info) -> dict[str, str]:
        if not fields:
            raise ValueError("must map at least one field to a path in the readings")
        for name, path in fields.items():
            if not path.strip("."):
                raise ValueError(f"{name} = {path!r}: must be a key or a dotted path")
            if info.data.get("format") == "sensor-logger" and "." not in path.strip("."):
                raise ValueError(f"{name} = {path!r}: with format = 'sensor-logger', "
                                 f"'<sensor name>.<values key>' (e.g. 'accelerometer.x')")
        return fields

    @field_validator("queue_readings")
    @classmethod
    def _holds_a_request(cls, value: int, info) -> int:
        most = info.data.get("max_readings")
        if most is not None and value < most:
            raise ValueError(f"must be >= max_readings ({most}), got {value}")
        return value

    @property
    def time_path(self) -> str:
        return self.timestamp_field or "time"

    @property
    def time_unit(self) -> str:
        return self.timestamp_unit or ("ns" if self.format == "sensor-logger" else "s")


def local_address(value: str) -> str:
    """``value`` if it is an IP address on the local network only (loopback, private or
    link-local), else ValueError saying why."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"must be an IP address of this device on the local network "
                         f"(loopback, private or link-local), got {value!r}") from None
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    if address.is_unspecified:
        raise ValueError(f"must be one address of this device on the local network, not "
                         f"every interface, got {value!r}")
    if not address.is_loopback and (address.is_multicast or address.is_reserved or not (
            address.is_private or address.is_link_local)):
        raise ValueError(f"must be a loopback, private or link-local address (raw readings "
                         f"stay on the local network), got {value!r}")
    return value


# -- the ble source (edge_agent/sources/ble/source.py) -------------------------------------

# Fields each BLE profile provides (before a device's prefix): "heart_rate" is the
# standard Heart Rate Service (bpm, RR intervals in s, energy expended in kJ);
# "polar_acc" is the accelerometer of Polar's Measurement Data service (g).
BLE_PROFILE_FIELDS = {"heart_rate": ("heart_rate", "rr_interval", "energy"),
                      "polar_acc": ("accel_x", "accel_y", "accel_z")}
BleProfile = Literal["heart_rate", "polar_acc"]
BLE_ADDRESS_PATTERN = r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$"
BLE_PREFIX_PATTERN = r"^[A-Za-z0-9_.-]{0,32}$"
BLE_ADAPTER_PATTERN = r"^hci[0-9]{1,3}$"
BLE_MAX_DEVICES = 32


class BleDeviceConfig(Model):
    """One wearable: found by its address or by the name it advertises."""

    # The device's Bluetooth address ("AA:BB:CC:DD:EE:FF") ...
    address: Annotated[str, Field(pattern=BLE_ADDRESS_PATTERN)] | None = None
    # ... or the name it advertises, exactly ("Polar H10 1A2B3C4D"): set one of the two.
    name: Annotated[str, Field(min_length=1, max_length=248)] | None = None
    # What to read from it: "heart_rate" (heart_rate, rr_interval, energy) and/or
    # "polar_acc" (accel_x, accel_y, accel_z), a word or a list of them.
    profile: Annotated[list[BleProfile], Field(min_length=1)] = ["heart_rate"]
    # Put before each of its field names ("left_" gives left_heart_rate ...), so that
    # several devices of one agent have distinct fields.
    prefix: Annotated[str, Field(pattern=BLE_PREFIX_PATTERN)] = ""
    # profile "polar_acc": the sample rate to ask for (Polar H10: 25, 50, 100 or 200) ...
    acc_rate_hz: Annotated[int, Field(ge=1, le=65535)] = 50
    # ... and the range in ±g (Polar H10: 2, 4 or 8).
    acc_range_g: Annotated[int, Field(ge=1, le=65535)] = 8

    @field_validator("profile", mode="before")
    @classmethod
    def _one_or_more(cls, value):
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _address_or_name(self):
        if (self.address is None) == (self.name is None):
            raise ValueError("set address or name (one of them) to find the device by")
        if len(set(self.profile)) != len(self.profile):
            raise ValueError("profile: names a profile twice")
        if self.address is not None:
            object.__setattr__(self, "address", self.address.upper())
        return self

    @property
    def label(self) -> str:
        """How logs and the local status name it: its address, or its name."""
        return self.address or f"name={self.name!r}"

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(self.prefix + name for profile in self.profile
                     for name in BLE_PROFILE_FIELDS[profile])


class BleReconnectConfig(Model):
    """Waits between attempts to find or connect a device: exponential back-off."""

    # The wait after the first failed attempt (or a connection that dropped), doubled
    # after each further failure ...
    initial_seconds: Annotated[float, Field(ge=0.001, le=3600)] = 2.0
    # ... up to this.
    max_seconds: Annotated[float, Field(ge=0.001, le=86400)] = 60.0
    # Each wait is shortened by a random share of up to this (0.25: 75-100% of it), so
    # that devices dropped together are not retried in step.
    jitter: Annotated[float, Field(ge=0, le=1)] = 0.25

    @model_validator(mode="after")
    def _ordered(self):
        if self.max_seconds < self.initial_seconds:
            raise ValueError(f"max_seconds: must be >= initial_seconds "
                             f"({self.initial_seconds:g}), got {self.max_seconds:g}")
        return self


class BleSourceConfig(_SourceBase):
    """Wearables over Bluetooth LE (GATT notifications), through BlueZ with bleak."""

    type: Literal["ble"]
    devices: Annotated[list[BleDeviceConfig], Field(min_length=1, max_length=BLE_MAX_DEVICES)]
    # "this_agent": the agent reads every device (one wearer; their fields must be
    # distinct: give them prefixes); "one_per_agent": `edge-agent fleet --count N`
    # gives virtual agent i devices[i] (N devices, all providing the same fields).
    assign: Literal["this_agent", "one_per_agent"] = "this_agent"
    # The Bluetooth adapter ("hci1"); default: BlueZ's default adapter.
    adapter: Annotated[str, Field(pattern=BLE_ADAPTER_PATTERN)] | None = None
    # How long one search for a device lasts (it must be advertising) ...
    scan_seconds: Annotated[float, Field(gt=0, le=300)] = 10.0
    # ... and one attempt to connect to it and subscribe.
    connect_seconds: Annotated[float, Field(gt=0, le=300)] = 20.0
    reconnect: BleReconnectConfig = BleReconnectConfig()
    # Readings kept while the agent does not poll; past this the oldest are dropped
    # (counted in the local status).
    max_queued: Annotated[int, Field(ge=100, le=10_000_000)] = 100_000

    @model_validator(mode="after")
    def _devices(self):
        seen: dict[str, int] = {}
        for i, device in enumerate(self.devices):
            key = device.address or f"name {device.name!r}"
            if key in seen:
                raise ValueError(f"the same device twice: devices[{seen[key]}] and "
                                 f"devices[{i}] are both {key}")
            seen[key] = i
        if self.assign == "this_agent":
            owner: dict[str, int] = {}
            for i, device in enumerate(self.devices):
                for name in device.field_names:
                    if name in owner:
                        raise ValueError(
                            f"two devices provide field {name!r} (devices[{owner[name]}] and "
                            f"devices[{i}]): give them distinct prefixes (prefix = \"left_\"), "
                            f"or assign = \"one_per_agent\" for a fleet")
                    owner[name] = i
        else:
            first = set(self.devices[0].field_names)
            for i, device in enumerate(self.devices[1:], start=1):
                if set(device.field_names) != first:
                    raise ValueError(
                        f"with assign = \"one_per_agent\" every device provides the same "
                        f"fields (the virtual agents share the channels): devices[{i}] has "
                        f"{', '.join(device.field_names)}, devices[0] "
                        f"{', '.join(self.devices[0].field_names)}")
        provided = set(self.provided_fields)
        for item in self.derive:
            needed = ("accel_x", "accel_y") + (("accel_z",) if item == "tilt" else ())
            if not set(needed) <= provided:
                raise ValueError(f"derive: {item!r} needs {', '.join(needed)}: a device with "
                                 f"profile \"polar_acc\" and no prefix")
        return self

    @property
    def provided_fields(self) -> tuple[str, ...]:
        """The fields it provides before ``derive`` (one device's in a fleet)."""
        devices = self.devices if self.assign == "this_agent" else self.devices[:1]
        return tuple(name for device in devices for name in device.field_names)


SourceConfig = Annotated[
    Union[SyntheticSourceConfig, CsvSourceConfig, JsonlSourceConfig, MqttSourceConfig,
          I2cSourceConfig, HttpSourceConfig, BleSourceConfig],
    Field(discriminator="type"),
]

# Fields each source type provides before ``derive`` (None: whatever the data has).
SYNTHETIC_FIELDS = ("accel_x", "accel_y", "accel_z", "roll", "pitch", "yaw",
                    "accel_h_mag", "accel_h_dir", "activity", "heart_rate", "rr_interval")
I2C_FIELDS = ("accel_x", "accel_y", "accel_z", "gyro_x", "gyro_y", "gyro_z", "temperature")
DERIVED_FIELDS = {"horizontal": ("accel_h_mag", "accel_h_dir"), "tilt": ("roll", "pitch")}


def source_fields(source) -> set[str] | None:
    base = {
        "synthetic": set(SYNTHETIC_FIELDS),
        "i2c": set(I2C_FIELDS),
        "csv": set(getattr(source, "columns", {}) or {}),
        "http": set(getattr(source, "fields", {}) or {}),
    }.get(source.type)
    if source.type == "ble":
        base = set(source.provided_fields)
    if base is None:
        return None
    for item in source.derive:
        base |= set(DERIVED_FIELDS[item])
    return base


union_tags("synthetic", "csv", "jsonl", "mqtt", "i2c", "http", "ble")
explain_pattern(BLE_ADDRESS_PATTERN,
                "must be a Bluetooth address, six hex pairs like AA:BB:CC:DD:EE:FF")
explain_pattern(BLE_PREFIX_PATTERN, "must be at most 32 letters, digits, '_', '.' or '-'")
explain_pattern(BLE_ADAPTER_PATTERN, "must be an adapter name like hci0")


def source_rate(source) -> float | None:
    """Readings per second of a source that has a fixed rate, else None."""
    if source.type in ("synthetic", "i2c") or (source.type == "csv" and source.pace == "fixed"):
        return float(source.rate_hz)
    return None
