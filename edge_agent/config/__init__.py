"""Agent configuration: TOML (stdlib ``tomllib``) validated by pydantic v2.

``load_config(path)`` returns an ``AgentConfig`` or raises ``ConfigError``
whose message lists every problem as ``key.path[index].key: what is allowed,
got value``, e.g. ``channels[2].epsilon: must be > 0, got -1``.
"""

from __future__ import annotations

import ipaddress
import math
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from edge_agent.common.mqtt_client import Endpoint, TlsFiles
from edge_agent.mechanisms import (
    DELTA_MAX,
    EPSILON_MAX,
    EPSILON_MIN,
    GRID_BITS_MAX,
    GRID_BITS_MIN,
    CircularOGPM,
    PolarOGPM,
    linear_mechanism,
    split_epsilon,
)
from edge_agent.mechanisms.categorical import LABEL, MAX_LABELS, ORACLES, UNIT, best_oracle
from edge_agent.mechanisms.registry import KIND_CONFIG_NAMES
from edge_agent.protocol.messages import MAX_AGENT_CHANNELS
from edge_agent.protocol.topics import NAME_CHARS, STATUS

# MQTT topic levels we create from names (edge_agent.protocol.topics): no wildcards,
# separators or the reserved leading underscore (collector topics such as _aggregates).
# pydantic's regex engine matches "$" only at the very end.
NAME_PATTERN = f"^{NAME_CHARS}$"
RESERVED_CHANNEL_NAMES = {STATUS}
# Most virtual agents ``edge-agent fleet`` runs in one process.
FLEET_MAX_COUNT = 100_000

_PERIOD = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_PERIOD_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_period(text: str) -> float:
    """'1d', '12h', '30m', '90s', '1w' -> seconds."""
    match = _PERIOD.match(text)
    if not match:
        raise ValueError(f"must look like 30m, 12h, 1d or 1w, got {text!r}")
    seconds = float(match.group(1)) * _PERIOD_SECONDS[match.group(2)]
    if seconds < 60:
        raise ValueError(f"must be at least 1 minute, got {text!r}")
    return seconds


class Model(BaseModel):
    """Every configuration table: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Name = Annotated[str, Field(pattern=NAME_PATTERN)]
# A unit of measurement shown with every value ("g", "m/s²", "°C", "bpm"): free text.
Unit = Annotated[str, Field(pattern=f"^{UNIT.pattern}$")]
def _epsilon_range(value: float) -> float:
    if not EPSILON_MIN <= value <= EPSILON_MAX:
        raise ValueError(f"must be in [{EPSILON_MIN:g}, {EPSILON_MAX:g}], got {value:g}")
    return value


Epsilon = Annotated[float, AfterValidator(_epsilon_range)]
GridBits = Annotated[int, Field(ge=GRID_BITS_MIN, le=GRID_BITS_MAX)]
Port = Annotated[int, Field(ge=1, le=65535)]
Rate = Annotated[float, Field(gt=0, le=10_000)]


# -- broker ---------------------------------------------------------------------

class TLSConfig(Model):
    ca: Path | None = None  # CA bundle; None = the system's
    cert: Path | None = None  # client certificate (mutual TLS)
    key: Path | None = None
    insecure: bool = False  # skip host name check (testing only)


class BrokerConfig(Model):
    host: str = "127.0.0.1"
    port: Port = 1883
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    tls: TLSConfig | None = None
    keepalive: Annotated[int, Field(ge=5, le=3600)] = 30
    # Messages allowed in flight (sent, not yet acknowledged) at once.
    max_inflight: Annotated[int, Field(ge=1, le=65535)] = 100

    @model_validator(mode="after")
    def _one_password(self):
        if self.password is not None and self.password_file is not None:
            raise ValueError("set password or password_file, not both")
        return self

    def resolved_password(self) -> str | None:
        if self.password_file is not None:
            return self.password_file.read_text().strip()
        return self.password.get_secret_value() if self.password else None

    def files(self, key: str = "broker") -> dict[str, Path]:
        """The files it names (password, TLS), by configuration key."""
        tls = self.tls or TLSConfig()
        named = {f"{key}.password_file": self.password_file, f"{key}.tls.ca": tls.ca,
                 f"{key}.tls.cert": tls.cert, f"{key}.tls.key": tls.key}
        return {name: path for name, path in named.items() if path is not None}

    def endpoint(self, version: str = "3.1.1") -> Endpoint:
        """The broker as ``edge_agent.common.mqtt_client`` takes it (reads ``password_file``)."""
        tls = self.tls
        return Endpoint(
            host=self.host, port=self.port, keepalive=self.keepalive, username=self.username,
            password=self.resolved_password(), version=version,
            tls=None if tls is None else TlsFiles(
                ca=str(tls.ca) if tls.ca else None, cert=str(tls.cert) if tls.cert else None,
                key=str(tls.key) if tls.key else None, insecure=tls.insecure))


# -- privacy, spool ------------------------------------------------------------

class PrivacyConfig(Model):
    budget_epsilon: Annotated[float, Field(gt=0)]
    # Total delta this agent may spend in any rolling period, all channels together
    # ((epsilon, delta)-LDP channels; basic composition, docs/PRIVACY.md "δ"); 0: only
    # pure epsilon-LDP reports.
    budget_delta: Annotated[float, Field(ge=0, le=1)] = 0.0
    budget_period: str = "1d"
    state_dir: Path = Path("/var/lib/edge-agent")
    # Most epsilon one range-discovery run may take from this agent (0 = never).
    range_epsilon_max: Annotated[float, Field(ge=0, le=EPSILON_MAX)] = 4.0

    @field_validator("budget_period")
    @classmethod
    def _period(cls, value: str) -> str:
        parse_period(value)
        return value

    @field_validator("state_dir")
    @classmethod
    def _home(cls, value: Path) -> Path:
        return value.expanduser()  # "~/..." for a user without root

    @property
    def period_seconds(self) -> float:
        return parse_period(self.budget_period)


class SpoolConfig(Model):
    # Perturbed messages kept on disk while the broker is unreachable (and, with
    # [delivery] confirm = "collector", until a collector confirms them); past
    # this the oldest are dropped (and counted).
    max_messages: Annotated[int, Field(ge=10, le=100_000_000)] = 200_000


class DeliveryConfig(Model):
    """When a spooled report may leave the spool (docs/DEPLOYMENT.md, "Delivery")."""

    # "broker": on the broker's acknowledgement.  "collector": once a collector confirms
    # it counted the report durably (ldp/v1/<fleet>/_confirm/<agent>); nothing is then
    # lost by a broker restarted without persistence, or a collector that lost its disk.
    confirm: Literal["broker", "collector"] = "broker"
    # A report acknowledged by the broker but not confirmed this long is sent again
    # (the wait doubles with each resend of it, up to 64 times); also after a reconnect.
    resend_seconds: Annotated[float, Field(ge=1, le=86400)] = 120.0


# -- sources ---------------------------------------------------------------------

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
    prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{0,32}$")] = ""
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
    adapter: Annotated[str, Field(pattern=r"^hci[0-9]{1,3}$")] | None = None
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


# -- channels --------------------------------------------------------------------

# The configuration names of edge_agent.mechanisms.registry ("pm-c" is PM, compressed).
LinearMechanism = Literal[KIND_CONFIG_NAMES["linear"]]  # type: ignore[valid-type]
OgpmOnly = Literal[KIND_CONFIG_NAMES["circular"]]  # type: ignore[valid-type]


class _ChannelBase(Model):
    name: Name
    source: Name
    epsilon: Epsilon  # per report (a vector or polar report counts once)
    # Seconds between reported readings: sub-sampling stretches the budget.
    report_interval: Annotated[float, Field(ge=0, le=86400)] = 0.0
    grid_bits: GridBits = 16

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value in RESERVED_CHANNEL_NAMES:
            raise ValueError(f"{value!r} is reserved for the agent's status topic")
        return value


def _check_domain(domain: tuple[float, float]) -> tuple[float, float]:
    low, high = domain
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"must be [low, high] with finite low < high, got {list(domain)}")
    return domain


class LinearChannelConfig(_ChannelBase):
    kind: Literal["linear"]
    field: str
    mechanism: LinearMechanism = "ogpm"
    domain: tuple[float, float] | Literal["auto"]
    unit: Unit | None = None  # of the readings (and domain); the collector shows it
    # domain = "auto": report over initial_domain until the fleet's range has been
    # discovered (range discovery), then, from the next budget period on, over the
    # discovered [min, max] widened by domain_margin x its width on each side
    # (never beyond initial_domain).
    initial_domain: tuple[float, float] | None = None
    domain_margin: Annotated[float, Field(ge=0, le=10)] = 0.1

    _domain = field_validator("domain")(
        classmethod(lambda cls, v: v if v == "auto" else _check_domain(v)))
    _initial = field_validator("initial_domain")(
        classmethod(lambda cls, v: v if v is None else _check_domain(v)))

    @model_validator(mode="after")
    def _auto_domain(self):
        if self.domain == "auto" and self.initial_domain is None:
            raise ValueError('initial_domain: required with domain = "auto" (the domain to '
                             "report over until a range is discovered)")
        if self.domain != "auto" and self.initial_domain is not None:
            raise ValueError('initial_domain: only with domain = "auto"')
        return self

    @property
    def start_domain(self) -> tuple[float, float]:
        return self.initial_domain if self.domain == "auto" else self.domain


class CircularChannelConfig(_ChannelBase):
    kind: Literal["circular"]
    field: str
    mechanism: OgpmOnly = "ogpm"
    unit: Literal["rad", "deg"] = "rad"
    # Start of the reported range: 0 gives [0, 2pi) / [0, 360); -pi / -180 a
    # signed range.  Values are wrapped either way.
    origin: float = 0.0


class PolarChannelConfig(_ChannelBase):
    kind: Literal["polar"]
    fields: tuple[str, str]  # (magnitude, direction)
    mechanism: OgpmOnly = "ogpm"
    radius_max: Annotated[float, Field(gt=0)]
    weight: Annotated[float, Field(gt=0)] = 1.0  # radius accuracy vs angle accuracy
    unit: Literal["rad", "deg"] = "rad"  # the angle's
    origin: float = 0.0
    radius_unit: Unit | None = None  # the magnitude's ("g", "m/s"); the collector shows it


class VectorChannelConfig(_ChannelBase):
    kind: Literal["vector"]
    fields: Annotated[list[str], Field(min_length=2, max_length=64)]
    mechanism: LinearMechanism = "ogpm"
    domain: tuple[float, float]
    unit: Unit | None = None  # of every axis
    # split: every reading reports all d axes at epsilon/d each;
    # sample: every reading reports k random axes at epsilon/k each;
    # auto: the k (k = d is split) with the smallest worst-case variance of the
    #       per-axis mean, from the mechanism's closed form.
    strategy: Literal["split", "sample", "auto"] = "auto"
    k: Annotated[int, Field(ge=1)] | None = None

    _domain = field_validator("domain")(classmethod(lambda cls, v: _check_domain(v)))

    @model_validator(mode="after")
    def _k_fits(self):
        if len(set(self.fields)) != len(self.fields):
            raise ValueError("fields must be distinct")
        if self.strategy == "sample":
            if self.k is None:
                raise ValueError("strategy 'sample' needs k")
            if not 1 <= self.k <= len(self.fields):
                raise ValueError(f"k must be in [1, {len(self.fields)}], got {self.k}")
        elif self.k is not None:
            raise ValueError(f"k is only used with strategy 'sample', not {self.strategy!r}")
        return self


Oracle = Literal[("auto", *ORACLES)]  # type: ignore[valid-type]
CategoryLabel = Annotated[str, Field(pattern=f"^{LABEL.pattern}$")]


class CategoricalChannelConfig(_ChannelBase):
    """A field whose readings are categories, reported with a frequency oracle.

    The categories are given one of three ways:

    * a text field: ``categories = ["rest", "walk", "run"]``, the words it carries;
    * an integer field: ``categories = [1, 2, 3, 4]``, the values it takes;
    * a numeric field cut into bins: ``bin_edges = [40, 60, 80, 100, 200]`` (k + 1
      increasing edges, k bins [e_i, e_i+1), the last one closed); ``categories``
      then optionally names the bins.
    """

    kind: Literal["categorical"]
    field: str
    categories: list[CategoryLabel] | list[int] | None = None
    bin_edges: list[float] | None = None
    unit: Unit | None = None  # of the field (its bin_edges), shown with the bins
    # grr | oue | sue | olh, or auto: the one of least variance for this domain size and
    # epsilon (GRR for small domains, OLH for large ones; edge_agent.mechanisms.categorical).
    oracle: Oracle = "auto"
    # (epsilon, delta)-LDP: each report also costs delta, which [privacy] budget_delta
    # must allow (papers/003 Section 5).  0 is pure epsilon-LDP.
    delta: Annotated[float, Field(ge=0, le=DELTA_MAX)] = 0.0
    # A reading that is none of the categories (a word or value not listed): "drop" it,
    # or report it as the category named here (e.g. "other"): dropping changes how many
    # reports a batch has, reporting it does not (docs/PRIVACY.md).
    unknown: str = "drop"

    @model_validator(mode="after")
    def _categories(self):
        if self.bin_edges is not None:
            edges = self.bin_edges
            if len(edges) < 3 or not all(math.isfinite(e) for e in edges) \
                    or any(b <= a for a, b in zip(edges, edges[1:])):
                raise ValueError("bin_edges: must be at least 3 finite, increasing edges "
                                 "(2 bins or more)")
            if self.categories is not None and (
                    len(self.categories) != len(edges) - 1
                    or not all(isinstance(c, str) for c in self.categories)):
                raise ValueError(f"categories: with bin_edges, names for the "
                                 f"{len(edges) - 1} bins (or leave it out)")
        elif self.categories is None:
            raise ValueError("categories: required (the words or integers the field "
                             "carries), or bin_edges for a numeric field")
        elif len(self.categories) < 2:
            raise ValueError("categories: at least 2")
        if self.categories is not None and len(set(self.categories)) != len(self.categories):
            raise ValueError("categories: must be distinct")
        if self.unknown != "drop" and self.unknown not in [str(c) for c in self.labels]:
            raise ValueError(f"unknown: 'drop' or one of the categories, got {self.unknown!r}")
        return self

    @property
    def count(self) -> int:
        return len(self.bin_edges) - 1 if self.bin_edges is not None else len(self.categories)

    @property
    def labels(self) -> tuple[str, ...]:
        """The categories' names (bins unnamed: their ranges, "[40, 60)")."""
        if self.categories is not None:
            return tuple(str(c) for c in self.categories)
        edges = self.bin_edges
        return tuple(f"[{a:g}, {b:g}{']' if i == len(edges) - 2 else ')'}"
                     for i, (a, b) in enumerate(zip(edges, edges[1:])))

    @property
    def text(self) -> bool:
        """Whether the field carries words (else numbers)."""
        return self.bin_edges is None and isinstance(self.categories[0], str)

    def chosen_oracle(self) -> str:
        if self.oracle != "auto":
            return self.oracle
        return best_oracle(epsilon=self.epsilon, categories=self.count, delta=self.delta)

    def build_oracle(self):
        """The channel's frequency oracle (labels only up to MAX_LABELS categories)."""
        labels = self.labels if self.count <= MAX_LABELS else None
        return ORACLES[self.chosen_oracle()](epsilon=self.epsilon, categories=self.count,
                                             delta=self.delta, labels=labels)


ChannelConfig = Annotated[
    Union[LinearChannelConfig, CircularChannelConfig, PolarChannelConfig, VectorChannelConfig,
          CategoricalChannelConfig],
    Field(discriminator="kind"),
]


# -- the agent ---------------------------------------------------------------------

class AgentConfig(Model):
    agent_id: Name  # also the MQTT client id and topic level
    fleet: Name
    broker: BrokerConfig = BrokerConfig()
    privacy: PrivacyConfig
    spool: SpoolConfig = SpoolConfig()
    delivery: DeliveryConfig = DeliveryConfig()
    batch_seconds: Annotated[float, Field(ge=0.05, le=3600)] = 1.0
    sources: Annotated[list[SourceConfig], Field(min_length=1, max_length=MAX_AGENT_CHANNELS)]
    channels: Annotated[list[ChannelConfig], Field(min_length=1, max_length=MAX_AGENT_CHANNELS)]

    @model_validator(mode="after")
    def _references(self):
        _unique("sources", [s.name for s in self.sources])
        _unique("channels", [c.name for c in self.channels])
        sources = {s.name: s for s in self.sources}
        for i, channel in enumerate(self.channels):
            source = sources.get(channel.source)
            if source is None:
                raise ValueError(f"channels[{i}].source: no source named {channel.source!r} "
                                 f"(have: {', '.join(sources)})")
            problem = _mechanism_problem(channel)
            if problem:
                raise ValueError(f"channels[{i}]: its mechanism refuses it: {problem}")
            if getattr(channel, "delta", 0.0) > 0 and self.privacy.budget_delta == 0:
                raise ValueError(f"channels[{i}].delta: {channel.delta:g} needs a delta "
                                 f"budget: set privacy.budget_delta (basic composition: "
                                 f"each report spends delta)")
            available = source_fields(source)
            wanted = [channel.field] if hasattr(channel, "field") else list(channel.fields)
            if available is not None:
                for name in wanted:
                    if name not in available:
                        raise ValueError(
                            f"channels[{i}]: source {source.name!r} has no field {name!r} "
                            f"(it has: {', '.join(sorted(available))})")
        return self

    @model_validator(mode="after")
    def _http_requests_outwait_a_batch(self):
        for i, source in enumerate(self.sources):
            if source.type == "http" and source.commit_timeout_seconds <= self.batch_seconds:
                raise ValueError(
                    f"sources[{i}].commit_timeout_seconds: must exceed batch_seconds "
                    f"({self.batch_seconds:g}): a request waits for the batch that takes its "
                    f"readings, got {source.commit_timeout_seconds:g}")
        return self

    def source(self, name: str):
        return next(s for s in self.sources if s.name == name)

    def files_read(self) -> dict[str, Path]:
        """Every file the agent reads, by configuration key (checked at start-up)."""
        files = self.broker.files()
        for i, source in enumerate(self.sources):
            if source.type == "csv" or (source.type == "jsonl" and source.path != "-"):
                files[f"sources[{i}].path"] = Path(source.path)
            if source.type == "http":
                files[f"sources[{i}].token_file"] = source.token_file
        return files

    def dirs_written(self) -> dict[str, Path]:
        """Every directory the agent writes, by configuration key."""
        return {"privacy.state_dir": self.privacy.state_dir}


def _mechanism_problem(channel) -> str | None:
    """Why the channel's mechanism cannot be built (the mechanisms' own checks: epsilon
    per axis, domain width and overflow), or None; so that check-config says it, not the
    agent's start."""
    try:
        if channel.kind == "linear":
            low, high = channel.start_domain
            linear_mechanism(channel.mechanism, epsilon=channel.epsilon, low=low, high=high,
                             grid_bits=channel.grid_bits)
        elif channel.kind == "vector":
            # "auto" may choose any k of 1..d axes: the smallest share is epsilon / d.
            axes = channel.k if channel.strategy == "sample" else len(channel.fields)
            share = split_epsilon(channel.epsilon, axes)
            if share < EPSILON_MIN:
                return (f"epsilon {channel.epsilon:g} over {axes} axes is {share:.3g} per axis, "
                        f"below the least a mechanism takes ({EPSILON_MIN:g}): raise "
                        f"epsilon or report fewer axes per reading (strategy 'sample')")
            linear_mechanism(channel.mechanism, epsilon=share, low=channel.domain[0],
                             high=channel.domain[1], grid_bits=channel.grid_bits)
        elif channel.kind == "circular":
            CircularOGPM(epsilon=channel.epsilon, period=period_of(channel.unit),
                         origin=channel.origin, grid_bits=channel.grid_bits)
        elif channel.kind == "categorical":
            channel.build_oracle()
        elif channel.kind == "polar":
            PolarOGPM(epsilon=channel.epsilon, radius_max=channel.radius_max,
                      weight=channel.weight, period=period_of(channel.unit),
                      origin=channel.origin, grid_bits=channel.grid_bits)
    except (ValueError, OverflowError) as exc:
        return str(exc)
    return None


def period_of(unit: str) -> float:
    """The circle's length in ``unit`` (rad or deg)."""
    return 2.0 * math.pi if unit == "rad" else 360.0


def _unique(what: str, names: list[str]) -> None:
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ValueError(f"{what}[{i}].name: {name!r} is used twice")
        seen.add(name)


# -- loading and error messages ----------------------------------------------------------

class ConfigError(ValueError):
    """A configuration file that cannot be used; the message lists every problem."""


_TAGS = {"synthetic", "csv", "jsonl", "mqtt", "i2c", "linear", "circular", "polar", "vector",
         "categorical",
         "http",
         "ble",
         "function-after", "function-before", "function-plain"}


_PATTERN_TEXT = {
    NAME_PATTERN: "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
                  "digit",
    f"^{UNIT.pattern}$": "must be 1-16 characters, none a control character or a brace",
    f"^{LABEL.pattern}$": "must be 1-40 characters, none a control character or a brace",
    BLE_ADDRESS_PATTERN: "must be a Bluetooth address, six hex pairs like AA:BB:CC:DD:EE:FF",
    r"^[A-Za-z0-9_.-]{0,32}$": "must be at most 32 letters, digits, '_', '.' or '-'",
    r"^hci[0-9]{1,3}$": "must be an adapter name like hci0",
}


def _location(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in _TAGS or str(part).startswith(("constrained-", "tuple[", "list[")):
            continue  # union tags pydantic inserts
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def _describe(error: dict[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    bounds = {"greater_than": "> {gt}", "greater_than_equal": ">= {ge}",
              "less_than": "< {lt}", "less_than_equal": "<= {le}"}
    if kind in bounds:
        text = "must be " + bounds[kind].format(**{k: f"{v:g}" if isinstance(v, float) else v
                                                   for k, v in ctx.items()})
    elif kind == "missing":
        return "is required"
    elif kind == "extra_forbidden":
        return "is not a known key (check the spelling)"
    elif kind == "literal_error":
        text = f"must be one of {ctx.get('expected')}"
    elif kind == "union_tag_invalid":
        return f"must be one of {ctx.get('expected_tags')}, got {ctx.get('tag')!r}"
    elif kind == "union_tag_not_found":
        return f"needs a '{ctx.get('discriminator', '').strip(chr(39))}' key"
    elif kind == "string_pattern_mismatch":
        text = _PATTERN_TEXT.get(ctx.get("pattern"), f"must match {ctx.get('pattern')}")
    elif kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    else:
        text = error["msg"][0].lower() + error["msg"][1:]
    value = error.get("input")
    if kind.startswith("too_") or isinstance(value, (dict, list)):
        return text
    return f"{text}, got {value!r}" if not isinstance(value, (int, float)) or isinstance(
        value, bool) else f"{text}, got {value:g}"


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = _location(error["loc"])
        if error["type"] == "union_tag_invalid":  # name the key whose value picks the type
            where += "." + error.get("ctx", {}).get("discriminator", "").strip("'")
        message = _describe(error)
        # Model-level validators already name their own location ("channels[2]: ...",
        # "aggregates.history_seconds: ...").
        lines.append(message if re.match(r"^\w+(\[\d+\]|\.\w)", message)
                     else f"{where}: {message}")
    return "\n".join(dict.fromkeys(lines))


def parse_config(data: dict[str, Any]) -> AgentConfig:
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's contents, or ``ConfigError`` saying why not (agent and collector)."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def load_config(path: str | Path) -> AgentConfig:
    return parse_config(read_toml(path))
