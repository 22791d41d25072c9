"""``edge-collector watch URL``: a collector's live aggregates in the terminal.

``URL`` is the collector's HTTP address, where its dashboard is served (its
``[http]`` host and port; default ``http://127.0.0.1:8080``).  Polls
``URL/api/channels`` (docs/reference/API.md) with urllib and redraws a ``rich`` table:
one row per channel, plus one per axis (vector) or component (polar).  Values
are shown with their channel's unit; a mean's ± is its standard error
("(s.e.)"), a circular mean's ± the half-width of its 95% interval; numbers are
plain decimals, never in exponent form.
``render()`` turns a document into the table and does nothing else, so it is
testable without a server or a terminal.  Errors reaching the collector are
shown under the last table received and retried; ``watch`` never raises them.
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.error
import urllib.request
from datetime import datetime
from decimal import Decimal
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

DASH = "–"
TAU = 2 * math.pi
COLUMNS = ("channel", "kind", "count", "agents", "estimate", "95% CI / detail", "ε")


# -- formatting (the dashboard's rules: 4 significant digits, "–" for none) --

def fmt(x: Any, digits: int = 4) -> str:
    """``digits`` significant digits in plain decimal, never in exponent form
    (-0.0006788, 12,000,000), trailing zeros dropped, thousands grouped."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return DASH
    if x == 0:
        return "0"
    rounded = Decimal(f"{x:.{digits - 1}e}").normalize()  # the digits, exactly
    return f"{rounded:,f}"


def with_unit(text: str, unit: Any) -> str:
    """``text`` followed by the unit, if the channel names one (and there is a value)."""
    return f"{text} {unit}" if isinstance(unit, str) and unit.strip() and text != DASH \
        else text


def fmt_count(n: Any) -> str:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n):
        return DASH
    return f"{round(n):,}"


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _is_radians(period: Any) -> bool:
    return isinstance(period, (int, float)) and abs(period - TAU) < 1e-6


# -- the cells of one statistics block --

def _unit(unit: Any) -> str:
    return f" {unit.strip()}" if isinstance(unit, str) and unit.strip() else ""


def _linear_cells(block: dict, unit: Any = None) -> tuple[str, str]:
    """mean ± its standard error, in the unit; the 95% interval, the method."""
    mean = _dict(block.get("mean"))
    ci = mean.get("ci95") if isinstance(mean.get("ci95"), list) else [None, None]
    low, high = (ci + [None, None])[:2]
    estimate = f"{fmt(mean.get('estimate'))} ± {fmt(mean.get('stderr'))}{_unit(unit)} (s.e.)"
    detail = f"[{fmt(low)}, {fmt(high)}]{_unit(unit)}"
    if mean.get("method"):
        detail += f" {mean['method']}"
    if mean.get("note"):  # data where the mechanism cannot place it (docs/reference/API.md)
        detail += " !near an end"
    return estimate, detail


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _circular_cells(block: dict, period: Any, unit: Any = None) -> tuple[str, str]:
    """μ ± the 95% half-width (or "any direction"), in the unit; R with its 95% interval,
    raw, σ."""
    mean = block.get("circular_mean")
    direction = _dict(block.get("direction"))
    half = direction.get("half_width")
    estimate = f"μ {fmt(mean)}" + (f" ± {fmt(half)}" if _finite(half) else "")
    if _finite(mean):
        estimate += _unit(unit) + (" (95% half-width)" if _finite(half) else "")
    in_radians = unit == "rad" or (not _unit(unit) and _is_radians(period))
    if in_radians and _finite(mean):
        degrees = f"{fmt(math.degrees(mean), 3)}°"
        if _finite(half):
            degrees += f" ± {fmt(math.degrees(half), 3)}°"
        estimate += f" ({degrees})"
    if _finite(mean) and not _finite(half) and direction.get("reason"):
        estimate += " any direction"
    length = _dict(block.get("resultant_length"))
    ci = length.get("ci95") if isinstance(length.get("ci95"), list) else []
    interval = f" [{fmt(ci[0])}, {fmt(ci[1])}]" if len(ci) == 2 else ""
    std = f"σ {with_unit(fmt(block.get('circular_std')), unit)}"
    if not _finite(block.get("circular_std")) and _finite(length.get("estimate")) \
            and length["estimate"] >= 1:
        std += " (R ≥ 1)"  # null rather than a fake 0 (docs/reference/API.md)
    detail = f"R {fmt(length.get('estimate'))}{interval} (raw {fmt(length.get('raw'))}) · {std}"
    return estimate, detail


def _period(block: dict, mechanism: dict) -> Any:
    """The circular domain's period: from the histogram edges, else the mechanism."""
    edges = _dict(block.get("histogram")).get("edges")
    if isinstance(edges, list) and len(edges) > 1 and all(
            isinstance(e, (int, float)) for e in (edges[0], edges[-1])):
        return edges[-1] - edges[0]
    return mechanism.get("period", TAU)


def _linear_rows(head: list, channel: dict, mechanism: dict, epsilon: str) -> list:
    return [(*head, *_linear_cells(channel, channel.get("unit")), epsilon)]


def _circular_rows(head: list, channel: dict, mechanism: dict, epsilon: str) -> list:
    return [(*head, *_circular_cells(channel, _period(channel, mechanism), channel.get("unit")),
             epsilon)]


def _polar_rows(head: list, channel: dict, mechanism: dict, epsilon: str) -> list:
    vector = _dict(channel.get("mean_vector"))
    radius, angle = _dict(channel.get("radius")), _dict(channel.get("angle"))
    unit, angle_unit = channel.get("unit"), channel.get("angle_unit")
    return [
        (*head, f"|v| {with_unit(fmt(vector.get('magnitude')), unit)} ∠ "
         f"{with_unit(fmt(vector.get('direction')), angle_unit)}",
         f"x {fmt(vector.get('x'))}, y {fmt(vector.get('y'))}{_unit(unit)}", epsilon),
        ("  radius", "", "", "", *_linear_cells(radius, unit), ""),
        ("  angle", "", "", "",
         *_circular_cells(angle, _period(angle, mechanism), angle_unit), ""),
    ]


def _vector_rows(head: list, channel: dict, mechanism: dict, epsilon: str) -> list:
    strategy = _dict(channel.get("strategy"))
    rows = [(*head, "", f"{fmt_count(strategy.get('k'))} of {fmt_count(strategy.get('d'))} "
             f"axes per reading", fmt(strategy.get("epsilon", mechanism.get("epsilon"))))]
    for axis, block in _dict(channel.get("axes")).items():
        block = _dict(block)
        rows.append((f"  {axis}", "", fmt_count(block.get("count")), "",
                     *_linear_cells(block, channel.get("unit")), epsilon))
    return rows


def _categorical_rows(head: list, channel: dict, mechanism: dict, epsilon: str) -> list:
    unit = channel.get("unit")
    bins = f" (bin edges in {unit.strip()})" if _unit(unit) else ""
    return [(*head, "", f"{mechanism.get('name')} over "
             f"{fmt_count(mechanism.get('categories'))} categories{bins}", epsilon),
            *_category_rows(_dict(channel.get("frequencies")))]


# How each kind of the protocol (edge_agent.protocol.KINDS) is shown: its rows, from
# the kind's entry of /api/channels (the shapes of collector.aggregation.series).
KIND_ROWS = {"linear": _linear_rows, "circular": _circular_rows, "polar": _polar_rows,
             "vector": _vector_rows, "categorical": _categorical_rows}


def _rows(name: str, channel: dict) -> list[tuple[str, ...]]:
    """The table rows of one channel: its own, then one per axis or component (a kind
    this version does not know, from a newer collector: one row saying so)."""
    kind = channel.get("kind")
    mechanism = _dict(channel.get("mechanism"))
    head = [name, str(kind), fmt_count(channel.get("count")), fmt_count(channel.get("agents"))]
    epsilon = fmt(mechanism.get("epsilon"))
    rows = KIND_ROWS.get(kind) if isinstance(kind, str) else None
    if rows is None:
        return [(*head, "", f"kind {kind!r} not shown", epsilon)]
    return rows(head, channel, mechanism, epsilon)


def _category_rows(frequencies: dict) -> list[tuple[str, ...]]:
    """One row per category: its consistent share, then the unbiased estimate's 95%
    interval."""
    rows = []
    columns = [frequencies.get(key) for key in ("labels", "shares", "ci95")]
    if not all(isinstance(column, list) for column in columns):
        return rows
    for label, share, ci in zip(*columns):
        low, high = ci if isinstance(ci, list) and len(ci) == 2 else (None, None)
        rows.append((f"  {str(label)[:40]}", "", "", "", fmt(share),
                     f"[{fmt(low)}, {fmt(high)}]", ""))
    return rows


def header_line(document: dict) -> str:
    """Fleet, agents online, messages and rejects in one line."""
    ingest = _dict(document.get("ingest"))
    rejects = _dict(ingest.get("rejects"))
    total = sum(n for n in rejects.values() if isinstance(n, (int, float)))
    by_reason = ", ".join(f"{reason} {fmt_count(n)}" for reason, n in rejects.items())
    agents = document.get("agents")
    online = fmt_count(document.get("agents_online"))
    if isinstance(agents, dict):
        online += f"/{len(agents)}"
    broker = _dict(document.get("broker")).get("connected")
    line = (f"fleet {document.get('fleet') or DASH} · {online} agents online · "
            f"{fmt_count(ingest.get('messages'))} messages · {fmt_count(ingest.get('values'))} "
            f"values · {fmt_count(ingest.get('duplicates'))} duplicates · "
            f"rejects {fmt_count(total)}")
    if by_reason:
        line += f" ({by_reason})"
    if isinstance(broker, bool):
        line += " · broker " + ("connected" if broker else "DISCONNECTED")
    return line


def render(document: dict | None, *, error: str | None = None) -> Group:
    """The display for a ``/api/channels`` document (``None``: nothing
    received yet): a header line, the table, and ``error`` under it if given."""
    doc = _dict(document)
    table = Table(box=box.SIMPLE_HEAD, expand=False)
    for column in COLUMNS:
        numeric = column in ("count", "agents", "ε")
        # fold: a narrow terminal wraps a number rather than cutting it to "1.2…".
        table.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for name, channel in _dict(doc.get("channels")).items():
        for row in _rows(str(name), _dict(channel)):
            # Text, not markup: a channel named "[red]x" is shown as it is.
            table.add_row(*(Text(cell) for cell in row),
                          style="dim" if row[0].startswith("  ") else None)
    header = Text(header_line(doc) if doc else "waiting for the collector…", style="bold")
    if isinstance(doc.get("t"), (int, float)):
        header.append(f"   as of {datetime.fromtimestamp(doc['t']):%H:%M:%S}", style="dim")
    parts: list = [header, table]
    if error:
        parts.append(Text(f"⚠ {error}", style="bold red"))
    return Group(*parts)


# -- polling --

def channels_url(url: str) -> str:
    """``URL/api/channels``; a bare ``host:port`` is taken as http."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/") + "/api/channels"


def fetch(url: str, *, timeout: float) -> tuple[dict | None, str | None]:
    """(document, None) or (None, a one-line reason): never raises for
    anything a network, a proxy or a wrong URL can do."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            document = json.load(response)
    except urllib.error.HTTPError as exc:
        return None, f"{url}: HTTP {exc.code} {_error_message(exc)}".rstrip()
    except urllib.error.URLError as exc:
        return None, f"cannot reach {url}: {exc.reason}"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # timeouts, resets, bad JSON, a bad URL or port, a garbled answer
        return None, f"{url}: {exc or type(exc).__name__}"
    if not isinstance(document, dict) or not isinstance(document.get("channels"), dict):
        return None, f"{url}: not a collector's /api/channels answer"
    return document, None


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read(4096))["error"])
    except Exception:  # not our JSON: the status line says enough
        return exc.reason or ""


def watch(url: str, *, interval: float = 2.0, once: bool = False,
          console: Console | None = None) -> int:
    """Show the collector at ``url`` (e.g. ``http://127.0.0.1:8080``) live,
    refreshed every ``interval`` seconds, until Ctrl-C (then returns 0).

    ``once``: print one snapshot and return 0, or 1 if the collector could not
    be read (the error is printed, not raised).
    """
    console = console or Console()
    target = channels_url(url)
    timeout = max(1.0, min(10.0, interval * 2))
    if once:
        document, error = fetch(target, timeout=timeout)
        console.print(render(document, error=error))
        return 0 if error is None else 1
    last = None
    with Live(render(None), console=console, auto_refresh=False) as live:
        try:
            while True:
                document, error = fetch(target, timeout=timeout)
                last = document or last  # keep showing the last data through an outage
                if error:
                    error += f" (retrying every {fmt(interval)} s)"
                live.update(render(last, error=error), refresh=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
    return 0
