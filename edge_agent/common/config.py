"""The configuration framework both programs use: TOML validated by pydantic v2.

Every table is a frozen ``Model`` whose unknown keys are errors.  A file that cannot be
used raises ``ConfigError``, whose message lists every problem as
``key.path[index].key: what is allowed, got value``, e.g.
``channels[2].epsilon: must be > 0, got -1`` (``format_validation_error``).  Also here:
the bounded scalar types (names, units, epsilon, ports), budget periods, and the broker
table both programs connect with.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from edge_agent.common.mqtt_client import Endpoint, TlsFiles
from edge_agent.mechanisms import EPSILON_MAX, EPSILON_MIN, GRID_BITS_MAX, GRID_BITS_MIN
from edge_agent.mechanisms.categorical import LABEL, UNIT
from edge_agent.protocol.topics import NAME_CHARS

# MQTT topic levels we create from names (edge_agent.protocol.topics): no wildcards,
# separators or the reserved leading underscore (collector topics such as _aggregates).
# pydantic's regex engine matches "$" only at the very end.
NAME_PATTERN = f"^{NAME_CHARS}$"

_PERIOD = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_PERIOD_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def period_parts(text: str) -> tuple[float, str]:
    """'10m' -> (10.0, 'm'): the number and the unit (s, m, h, d or w) of a period."""
    match = _PERIOD.match(text)
    if not match:
        raise ValueError(f"must look like 30m, 12h, 1d or 1w, got {text!r}")
    return float(match.group(1)), match.group(2)


def parse_period(text: str) -> float:
    """'1d', '12h', '30m', '90s', '1w' -> seconds."""
    number, unit = period_parts(text)
    seconds = number * _PERIOD_SECONDS[unit]
    if seconds < 60:
        raise ValueError(f"must be at least 1 minute, got {text!r}")
    return seconds


def _valid_period(text: str) -> str:
    # its form (named here so that docs/reference/CONFIG_REFERENCE.md lists both)
    period_parts(text)
    parse_period(text)  # and its length
    return text


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
# A rolling window's length as a user writes it ("10m", "1d"): at least a minute.
Period = Annotated[str, AfterValidator(_valid_period)]
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




# -- loading and error messages ----------------------------------------------------------

class ConfigError(ValueError):
    """A configuration file that cannot be used; the message lists every problem."""


# What pydantic inserts into an error's location besides keys: the tags of discriminated
# unions (source types, channel kinds: each table registers its own with
# ``union_tags``) and its validator wrappers.
_TAGS = {"function-after", "function-before", "function-plain"}

# How a failed pattern reads in an error message, by pattern (``explain_pattern``).
_PATTERN_TEXT = {
    NAME_PATTERN: "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
                  "digit",
    f"^{UNIT.pattern}$": "must be 1-16 characters, none a control character or a brace",
    f"^{LABEL.pattern}$": "must be 1-40 characters, none a control character or a brace",
}


def union_tags(*tags: str) -> None:
    """Tags of a discriminated union, left out of the key paths errors name."""
    _TAGS.update(tags)


def explain_pattern(pattern: str, text: str) -> None:
    """Say ``text`` ("must be ...") where a value fails ``pattern``."""
    _PATTERN_TEXT[pattern] = text


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



def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's contents, or ``ConfigError`` saying why not (agent and collector)."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def toml_value(value: Any) -> str:
    """``value`` as TOML, for configurations programs write (the demo's, the tests'):
    booleans, numbers, arrays, inline tables, and anything else (strings, paths) as a
    basic string.  JSON's escapes are TOML's; non-ASCII is kept as is (JSON would write
    astral characters as surrogate pairs, which TOML refuses)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {toml_value(v)}" for key, v in value.items()) + "}"
    return json.dumps(str(value), ensure_ascii=False)
