"""Collector configuration: TOML validated by pydantic v2 (errors as in the agent)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from collector.results.durations import (
    default_retention,
    duration_name,
    parse_duration,
    parse_retention,
)
from collector.storage.states import MAX_LEVELS, AggregateSettings
from edge_agent.common.config import (
    BrokerConfig,
    ConfigError,
    Epsilon,
    Model,
    Name,
    format_validation_error,
    read_toml,
)
from edge_agent.common.mqtt_client import Endpoint
from edge_agent.protocol import is_name


class CollectorBrokerConfig(BrokerConfig):
    client_id: Name = "edge-collector"
    # The broker keeps the session (and queues reports) this long while the
    # collector is away (MQTT v5 session expiry).
    session_expiry_seconds: Annotated[int, Field(ge=0, le=2**32 - 1)] = 86400
    # Several scale-out ingresses share one subscription (docs/guides/SCALE_OUT.md); a single
    # collector (``edge-collector run``) refuses it: it would count only its share.
    shared_group: Name | None = None
    # "5" (default) or "3.1.1" for brokers without MQTT 5, such as the demo's
    # embedded amqtt (session_expiry_seconds then does not apply).
    mqtt_version: Literal["5", "3.1.1"] = "5"

    def endpoint(self, version: str | None = None) -> Endpoint:
        """The broker, spoken to in ``mqtt_version``."""
        return super().endpoint(version or self.mqtt_version)


class HttpConfig(Model):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080  # 0: any free port
    push_seconds: Annotated[float, Field(gt=0, le=60)] = 1.0
    # Open connections at most.  Beyond, the connection waiting longest for a request
    # is closed to make room, or the new one refused (503) if all are busy.
    max_connections: Annotated[int, Field(ge=8, le=65536)] = 256
    # Open /api/events streams (dashboards) at most; beyond, 503.
    max_event_streams: Annotated[int, Field(ge=1, le=65536)] = 64
    # An idle keep-alive connection, or one whose client stopped reading, is closed after this.
    idle_timeout_seconds: Annotated[float, Field(ge=1, le=3600)] = 60.0
    # A request's line and headers must arrive within this (slow-loris clients).
    header_timeout_seconds: Annotated[float, Field(ge=1, le=300)] = 10.0


class StorageConfig(Model):
    path: Path = Path("/var/lib/edge-collector/state.sqlite")  # "~/..." for a user without root
    # Full checkpoint of all aggregates; between checkpoints every message is
    # journaled, so a crash loses nothing either way.
    checkpoint_seconds: Annotated[float, Field(ge=0.5, le=3600)] = 10.0
    # Journal commits (and so broker acknowledgements) are grouped this often.
    ack_interval_seconds: Annotated[float, Field(ge=0.005, le=5)] = 0.05
    # After each checkpoint, tell every agent that sent something which of its reports
    # are durably counted (retained, ldp/v1/<fleet>/_confirm/<agent>): agents with
    # [delivery] confirm = "collector" keep each report until then.
    confirmations: bool = True
    # Keep every journaled message after checkpoints, so that `edge-collector export`
    # writes the whole stream since the store was created (to re-analyse a study with
    # `edge-collector replay`).  The file then grows with the stream: about the size of
    # the reports received (a 500-value report is about 1-3 KB).
    keep_journal: bool = False

    @field_validator("path")
    @classmethod
    def _home(cls, value: Path) -> Path:
        return value.expanduser()


MAX_WINDOWS = 10_000  # kept per series: bounds a channel's memory and its history
# The coarser resolutions a configuration without ``resolutions`` gets (where each is a
# whole number of the one before, from window_seconds).
DEFAULT_COARSER = (3600, 86400)


class AggregatesConfig(Model):
    window_seconds: Annotated[float, Field(ge=1, le=86400)] = 60.0
    # Every resolution windows are estimated at, finest first, each a whole number of the
    # one before: ["1m", "1h", "1d"] (units s, m, h, d, w).  A coarser window is the exact
    # merge of its finer windows' sums (as good as one window holding all their reports).
    # The finest is window_seconds (give one or the other, or the same).  Default:
    # window_seconds, then an hour and a day where they are whole numbers of it.
    resolutions: Annotated[list[str], Field(min_length=1, max_length=MAX_LEVELS)] | None = None
    histogram_bins: Annotated[int, Field(ge=4, le=1000)] = 50
    # Worker processes that estimate the history a push period cannot (after a burst, a
    # restart from an old state, a fleet flushing its spools): "auto" is one per core the
    # collector may use but one (its own process's), 0 none (the pushes catch up within a
    # share of their period).
    # They start only when needed and stop after 30 s without work.
    estimate_workers: Annotated[int, Field(ge=0, le=256)] | Literal["auto"] = "auto"
    # How far back each channel's windowed estimates go: the windows kept, served as
    # the channel's time series (GET /api/channels/<name>/history) that the dashboard
    # draws, so a page opened now shows the past hour.
    history_seconds: Annotated[float, Field(gt=0, le=366 * 86400)] = 3600.0
    # The same as a number of windows (history_seconds = keep_windows x window_seconds),
    # as configurations before history_seconds said it: one or the other.
    keep_windows: Annotated[int, Field(ge=1, le=MAX_WINDOWS)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _finest(cls, data):
        """Without window_seconds, the finest resolution is it."""
        if isinstance(data, dict) and "window_seconds" not in data:
            resolutions = data.get("resolutions")
            if isinstance(resolutions, list) and resolutions:
                try:
                    return {**data, "window_seconds": parse_duration(resolutions[0])}
                except ValueError:
                    pass  # said by _resolutions
        return data

    @model_validator(mode="after")
    def _resolutions(self):
        if self.resolutions is None:
            return self
        spans = [parse_duration(name, what="aggregates.resolutions") for name in self.resolutions]
        if spans[0] != self.window_seconds:
            raise ValueError(f"aggregates.resolutions: the finest ({self.resolutions[0]}) "
                             f"must be window_seconds ({self.window_seconds:g} s): give one "
                             f"or the other")
        if spans[0] > 86400:
            raise ValueError("aggregates.resolutions: the finest must be at most a day")
        for finer, coarser, name in zip(spans, spans[1:], self.resolutions[1:]):
            if coarser <= finer or coarser % finer:
                raise ValueError(f"aggregates.resolutions: {name} must be a whole number "
                                 f"(2 or more) of the resolution before it")
        return self

    @property
    def spans(self) -> list[float]:
        """Each resolution's window length in seconds, finest first."""
        if self.resolutions is not None:
            return [float(parse_duration(name)) for name in self.resolutions]
        spans = [self.window_seconds]
        for span in DEFAULT_COARSER:
            ratio = span / spans[-1]
            if ratio >= 2 and abs(ratio - round(ratio)) < 1e-9:
                spans.append(float(span))
        return spans

    @property
    def coarser(self) -> tuple[int, ...]:
        """Each coarser resolution as a multiple of the one before."""
        spans = self.spans
        return tuple(round(coarse / fine) for fine, coarse in zip(spans, spans[1:]))

    @property
    def resolution_names(self) -> list[str]:
        """The resolutions' names ("1m", "1h", "1d"), finest first."""
        return [duration_name(span) for span in self.spans]

    @model_validator(mode="after")
    def _history(self):
        if self.keep_windows is not None and "history_seconds" in self.model_fields_set:
            raise ValueError("aggregates.keep_windows: give history_seconds or keep_windows, "
                             "not both "
                             "(history_seconds = keep_windows x window_seconds)")
        if self.kept_windows > MAX_WINDOWS:
            raise ValueError(f"aggregates.history_seconds: at most {MAX_WINDOWS} windows of "
                             f"window_seconds = {self.window_seconds:g}, i.e. "
                             f"{MAX_WINDOWS * self.window_seconds:g} s, got "
                             f"{self.history_seconds:g}")
        return self

    @property
    def kept_windows(self) -> int:
        """Windows kept per series: the whole history (the window under way included)."""
        if self.keep_windows is not None:
            return self.keep_windows
        return max(1, math.ceil(self.history_seconds / self.window_seconds - 1e-9)) + 1


class ResultsConfig(Model):
    """The results store (docs/guides/COLLECTOR.md, "Results of a study"): every closed
    window at every resolution, with its sums and estimates, kept for each resolution's
    retention, and served by GET /api/channels/<name>/history?resolution=...."""

    # The SQLite file; default: results.sqlite beside [storage] path.
    path: Path | None = None
    # A PostgreSQL database instead (postgresql://user@host:port/database; needs the
    # postgresql extra), for results that outgrow one file or a merge view's.
    url: Annotated[str, Field(pattern=r"^postgres(ql)?://\S+$", max_length=1024)] | None = None
    # The PostgreSQL user's password, from a file (never in the configuration).
    password_file: Path | None = None
    # How long each resolution's windows are kept, by resolution name: a duration
    # ("7d", "400d") or "forever".  Unset: shorter than an hour 7 days, shorter than a
    # day 400 days, else forever.
    retention: dict[str, str] = {}
    # A window is handed to the store this long after it ends (reports still on their way
    # arrive first).  A report later than that is merged into the stored window exactly.
    close_after_seconds: Annotated[float, Field(ge=0, le=86400)] = 120.0

    @field_validator("path", "password_file")
    @classmethod
    def _home(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()

    @model_validator(mode="after")
    def _checks(self):
        if self.url is not None and self.path is not None:
            raise ValueError("results.url: give a PostgreSQL url or a SQLite path, not both")
        if self.password_file is not None and self.url is None:
            raise ValueError("results.password_file: only with a PostgreSQL url")
        for name, keep in self.retention.items():
            parse_duration(name, what=f"results.retention: the resolution {name!r}")
            parse_retention(keep, what=f"results.retention.{name}: \"forever\" or a duration")
        return self


class LimitsConfig(Model):
    """What senders can make the collector hold.  Past a limit a message is refused,
    counted by reason (``limit_agents`` ...) and logged once; see docs/guides/HARDENING.md."""

    # Distinct agents (from reports or statuses).
    agents: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    # Distinct channel names.
    channels: Annotated[int, Field(ge=1, le=100_000)] = 256
    # Series (mechanism settings) of one channel: each epsilon or domain change starts one.
    series_per_channel: Annotated[int, Field(ge=1, le=10_000)] = 16
    # Categories of a categorical channel (each is a count in every kept window).
    categories: Annotated[int, Field(ge=2, le=65_536)] = 1024
    # Agents known only from their status (online, no report yet).
    statuses: Annotated[int, Field(ge=0, le=10_000_000)] = 1_000
    # Channels with a range-discovery result shown (GET /api/range).
    range_results: Annotated[int, Field(ge=0, le=100_000)] = 256
    # A report's end (t + dt) may be this far ahead of the collector's clock (reason
    # "future"): reports dated ahead would push every real window of a channel out.
    future_seconds: Annotated[float, Field(ge=0, le=365 * 86400)] = 300.0
    # A report's start may be this far behind it (reason "stale"); default: the broker's
    # session expiry plus future_seconds (older reports cannot have waited in our session).
    max_age_seconds: Annotated[float, Field(gt=0, le=100 * 365 * 86400)] | None = None


class RegistryConfig(Model):
    """Which agents may report: any, or those listed in ``file`` (one agent id per line,
    ``#`` comments; re-read on SIGHUP)."""

    agents: Literal["any", "registered"] = "any"
    file: Path | None = None

    @model_validator(mode="after")
    def _file(self):
        if self.agents == "registered" and self.file is None:
            raise ValueError("file: required when agents = \"registered\"")
        return self


class SnapshotConfig(Model):
    # Retained aggregate snapshots on ldp/v1/<fleet>/_aggregates/<channel>; 0 = off.
    interval_seconds: Annotated[float, Field(ge=0, le=86400)] = 10.0


class ScaleOutConfig(Model):
    """Scale-out on NATS JetStream (docs/guides/SCALE_OUT.md): ``edge-collector ingress``,
    ``member`` and ``merge`` use it; a single collector (``run``) does not."""

    # The NATS servers of the cluster (any of them will do; all are tried).
    servers: Annotated[list[Annotated[str, Field(pattern=r"^(nats|tls)://[^\s/]+$")]],
                       Field(min_length=1, max_length=32)]
    # The JetStream stream of every fleet message; its subjects are <stream>.<partition>,
    # and its KV buckets <stream>_leases and <stream>_state.
    stream: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")] = "ldp_reports"
    # Partitions: one agent's messages all go to one; a member owns whole partitions.
    # Fixed when the stream is created: more than the members you will ever run.
    partitions: Annotated[int, Field(ge=1, le=1024)] = 32
    # Copies of every message and state in the cluster (3 survives one node down).
    replicas: Annotated[int, Field(ge=1, le=5)] = 3
    # The stream drops a copy with a message id it stored this recently (agent/channel/seq).
    duplicate_window_seconds: Annotated[float, Field(ge=1, le=86400)] = 120.0
    # How long the stream keeps messages: a member down longer loses what expired.
    max_age_seconds: Annotated[float, Field(ge=60, le=365 * 86400)] = 7 * 86400.0
    # This member's name (in leases and partition states); default: broker.client_id.
    member: Name | None = None
    # A member that stops renewing loses its partitions after this long.  Above the
    # cluster's failover time (10-15 s): shorter, and every lease expires when a node dies.
    lease_seconds: Annotated[float, Field(ge=3, le=600)] = 20.0
    # A member writes the state of each partition it owns this often (when changed).
    checkpoint_seconds: Annotated[float, Field(ge=0.2, le=600)] = 2.0
    # A partition state larger than this is written to the object store in chunks, and
    # its KV value names it (docs/guides/SCALE_OUT.md): below the servers' max_payload (1 MB
    # unless configured), with room for the headers.
    inline_state_bytes: Annotated[int, Field(ge=1024, le=8 << 20)] = 256 << 10
    username: str | None = None
    password_file: Path | None = None
    tls_ca: Path | None = None  # CA of the servers' certificates, for tls:// servers

    @model_validator(mode="after")
    def _lease(self):
        if self.lease_seconds < 2 * self.checkpoint_seconds:
            raise ValueError("lease_seconds: must be at least twice checkpoint_seconds")
        if (self.username is None) != (self.password_file is None):
            raise ValueError("username: set both username and password_file, or neither")
        return self


class RangeScheduleConfig(Model):
    """A channel whose range is discovered periodically (on the coordinator)."""

    channel: Name
    sides: list[Literal["min", "max"]] = ["min", "max"]
    every_seconds: Annotated[float, Field(ge=10, le=30 * 86400)] = 3600.0
    # Search domain; default: the widest domain the channel's reports declared.
    domain: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _domain(self):
        if self.domain is not None and not (math.isfinite(self.domain[0])
                                            and math.isfinite(self.domain[1])
                                            and self.domain[0] < self.domain[1]):
            raise ValueError(f"domain: must be [low, high] with finite low < high, "
                             f"got {list(self.domain)}")
        if not self.sides or len(set(self.sides)) != len(self.sides):
            raise ValueError("sides: must list min and/or max once each")
        return self


class RangeDiscoveryConfig(Model):
    """Private min/max discovery (Fukuchi et al.); see docs/reference/PROTOCOL.md."""

    # Periodic schedules run only where this is true: one designated coordinator.
    coordinator: bool = False
    client_id: Name = "edge-collector-range"
    epsilon: Epsilon = 1.0  # per agent per run (agents refuse above range_epsilon_max)
    strategy: Literal["sequential", "split"] = "split"
    window_seconds: Annotated[float, Field(gt=0, le=86400)] = 300.0
    join_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 5.0
    round_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 5.0
    min_participants: Annotated[int, Field(ge=1, le=10**7)] = 20
    # A known lower bound on the fatness alpha (Corollary 1); unset: alpha unknown
    # (Corollary 2, more rounds).  Uniform-ish data has alpha = 1.
    alpha_min: Annotated[float, Field(gt=0, le=100)] | None = None
    rounds: Annotated[int, Field(ge=1, le=64)] | None = None  # overrides L
    h: Annotated[float, Field(gt=0, le=1e6)] | None = None  # overrides h_N
    schedule: list[RangeScheduleConfig] = []


class CollectorConfig(Model):
    fleet: Name
    broker: CollectorBrokerConfig = CollectorBrokerConfig()
    http: HttpConfig = HttpConfig()
    storage: StorageConfig = StorageConfig()
    aggregates: AggregatesConfig = AggregatesConfig()
    snapshots: SnapshotConfig = SnapshotConfig()
    range_discovery: RangeDiscoveryConfig = RangeDiscoveryConfig()
    limits: LimitsConfig = LimitsConfig()
    registry: RegistryConfig = RegistryConfig()
    results: ResultsConfig = ResultsConfig()
    scale_out: ScaleOutConfig | None = None

    @model_validator(mode="after")
    def _retention(self):
        spans = self.aggregates.spans
        for name in self.results.retention:
            if parse_duration(name) not in spans:
                raise ValueError(f"results.retention.{name}: not one of the resolutions "
                                 f"{self.aggregates.resolution_names}")
        return self

    def retention(self) -> dict[float, float]:
        """Seconds each resolution's windows are kept (infinity: for ever), by span."""
        configured = {float(parse_duration(name)): parse_retention(keep, what=name)
                      for name, keep in self.results.retention.items()}
        return {span: configured.get(span, default_retention(span))
                for span in self.aggregates.spans}

    @property
    def results_path(self) -> Path:
        """The results' SQLite file (without a PostgreSQL url)."""
        return self.results.path or self.storage.path.parent / "results.sqlite"

    @model_validator(mode="after")
    def _ports(self):
        if self.http.port == self.broker.port and self.http.host == self.broker.host \
                and self.http.port != 0:
            raise ValueError("http.port: must differ from broker.port on the same host")
        return self

    @property
    def aggregate_settings(self) -> AggregateSettings:
        """The aggregates settings the scale-out members and the merge view must share."""
        aggregates = self.aggregates
        return AggregateSettings(bins=aggregates.histogram_bins,
                                 window_seconds=aggregates.window_seconds,
                                 keep_windows=aggregates.kept_windows,
                                 coarser=aggregates.coarser)

    def files_read(self) -> dict[str, Path]:
        """Every file the collector (any role) reads, by configuration key."""
        files = self.broker.files()
        if self.scale_out is not None:
            named = {"scale_out.password_file": self.scale_out.password_file,
                     "scale_out.tls_ca": self.scale_out.tls_ca}
            files.update({key: path for key, path in named.items() if path is not None})
        if self.results.password_file is not None:
            files["results.password_file"] = self.results.password_file
        return files

    def dirs_written(self) -> dict[str, Path]:
        """The directories of the journal and checkpoint, and of the SQLite results store."""
        dirs = {"storage.path": self.storage.path.parent}
        if self.results.url is None:
            dirs["results.path"] = self.results_path.parent
        return dirs

    @property
    def member_name(self) -> str:
        """This scale-out member's name."""
        return (self.scale_out and self.scale_out.member) or self.broker.client_id


def parse_collector_config(data: dict) -> CollectorConfig:
    try:
        return CollectorConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


# The registry ([registry] file): one agent id per line, blank lines and # comments ignored.
MAX_REGISTRY_BYTES = 64 << 20


def load_registry(path: str | Path) -> frozenset[str]:
    """The agent ids of a registry file, or ``ConfigError`` naming the file and line."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_REGISTRY_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_REGISTRY_BYTES >> 20} MB")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
    agents = set()
    for number, line in enumerate(text.splitlines(), 1):
        agent = line.split("#", 1)[0].strip()
        if not agent:
            continue
        if not is_name(agent):
            raise ConfigError(f"{path}, line {number}: {agent[:80]!r} is not an agent id "
                              f"(letters, digits, . _ -, at most 64, not starting with . _ -)")
        agents.add(agent)
    return frozenset(agents)


def load_collector_config(path: str | Path) -> CollectorConfig:
    """The configuration in ``path``, with the registry file it names checked too."""
    config = parse_collector_config(read_toml(path))
    if config.registry.agents == "registered":
        try:
            load_registry(config.registry.file)
        except ConfigError as exc:
            raise ConfigError(f"registry.file: {exc}") from None
    return config


__all__ = ["CollectorConfig", "ConfigError", "load_collector_config", "parse_collector_config"]
