"""``edge-collector``: run the collector, check its configuration, watch it live, replay a
recorded stream offline."""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
import time
from collections.abc import Iterator
from typing import BinaryIO, NoReturn

import click

from collector.config import CollectorConfig, load_collector_config
from edge_agent.common.commandline import (
    EXIT_CONFIG,
    add_check_config,
    command_group,
    load_or_exit,
    require_paths,
)


def _load(path: str, exit_code: int = 2) -> CollectorConfig:
    return load_or_exit(load_collector_config, path, exit_code)


def _load_service(path: str, *, writes: tuple[str, ...] = ()) -> CollectorConfig:
    """The configuration of a service (exit 78 when it cannot work), with the files it
    names readable and the directories it writes (``writes``: keys of
    ``CollectorConfig.dirs_written``: the journal's, the results store's) writable."""
    config = _load(path, EXIT_CONFIG)
    dirs = config.dirs_written()
    require_paths(path, read=config.files_read(),
                  write={key: dirs[key] for key in writes if key in dirs},
                  hints={"storage.path": "set it to a file in a directory this user can "
                                         "write (e.g. path = \"~/.local/state/edge-collector/"
                                         "state.sqlite\" under [storage])"})
    return config


def _refuse(config_path: str, problem: str) -> None:
    """Exit 78 with a configuration problem the model cannot see (it depends on the
    command)."""
    click.echo(f"{config_path}: invalid configuration:\n  {problem}", err=True)
    sys.exit(EXIT_CONFIG)


main = command_group("Fleet-wide aggregates of locally privatised sensor reports.",
                     needs=("starlette", "uvicorn", "sse_starlette", "prometheus_client",
                            "rich"), extra="collector")
add_check_config(main, load_collector_config)


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
def run(config_path: str) -> None:
    """Ingest reports, keep aggregates, serve the dashboard and API until SIGTERM."""
    from collector.service import CollectorService

    config = _load_service(config_path, writes=("storage.path", "results.path"))
    if config.broker.shared_group is not None:
        _refuse(config_path, "broker.shared_group: only ingresses share a subscription "
                             "(docs/guides/SCALE_OUT.md); a collector with it would count only "
                             "part of the fleet")
    sys.exit(CollectorService(config).run_forever())


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
def merge(config_path: str) -> None:
    """Merge the scale-out partitions' states and serve the dashboard and API
    (docs/guides/SCALE_OUT.md)."""
    from collector.scaleout.merge import MergeService

    config = _load_service(config_path, writes=("results.path",))
    if config.scale_out is None:
        _refuse(config_path, "scale_out: the merge view needs a [scale_out] table "
                             "(docs/guides/SCALE_OUT.md)")
    sys.exit(MergeService(config).run_forever())


def _run_scale_out(config_path: str, role: str, service) -> None:
    """Run ``service(config)`` (an ingress or a member); exit 78 without [scale_out], or
    when the cluster's stream was made with other settings."""
    from collector.scaleout.engine import EngineError

    config = _load_service(config_path)
    if config.scale_out is None:
        _refuse(config_path, f"scale_out: the {role} needs a [scale_out] table "
                             f"(docs/guides/SCALE_OUT.md)")
    try:
        sys.exit(service(config).run_forever())
    except EngineError as exc:
        click.echo(f"edge-collector {role}: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
def ingress(config_path: str) -> None:
    """Take reports from MQTT into the JetStream stream, acknowledged once stored."""
    from collector.scaleout.ingress import Ingress

    _run_scale_out(config_path, "ingress", Ingress)


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
def member(config_path: str) -> None:
    """Own partitions of the JetStream stream and count their reports exactly."""
    from collector.scaleout.member import Member

    _run_scale_out(config_path, "member", Member)


@main.command("discover-range")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
@click.option("--channel", required=True, help="a linear channel's name")
@click.option("--side", required=True, type=click.Choice(["min", "max"]))
@click.option("--domain", nargs=2, type=float, default=None, metavar="LOW HIGH",
              help="search domain (default: the schedule's, else the channel's declared "
                   "domain from the running collector's API)")
@click.option("--expect", type=click.IntRange(min=1), default=None,
              help="stop waiting for joins once this many agents joined")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def discover_range(config_path: str, channel: str, side: str, domain, expect, as_json) -> None:
    """Run one private min or max search now, print the result and publish it (retained)."""
    from collector.range.coordinator import RangeCoordinator, RunRequest, connect_client

    config = _load(config_path)
    if domain is None:
        scheduled = {e.channel: e.domain for e in config.range_discovery.schedule}
        domain = scheduled.get(channel) or _domain_from_api(config, channel)
    low, high = domain
    if not low < high:
        raise click.BadParameter(f"need LOW < HIGH, got {low} {high}", param_hint="--domain")
    try:
        client = connect_client(config, f"{config.range_discovery.client_id}-cli")
    except (ConnectionError, OSError) as exc:
        click.echo(f"cannot reach the broker: {exc}", err=True)
        sys.exit(1)
    try:
        result = RangeCoordinator(client, fleet=config.fleet,
                                  settings=config.range_discovery).run(
            RunRequest(channel, side, low, high), expected_agents=expect)
    finally:
        client.stop()
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif result["status"] == "done":
        p = result["parameters"]
        click.echo(f"{channel} {side} ~ {result['estimate']:.6g}  ({result['participants']} "
                   f"agents, {p['strategy']}, eps {p['epsilon']:g}, {p['rounds']} rounds, "
                   f"domain [{low:g}, {high:g}])")
    else:
        click.echo(f"{channel} {side}: {result['status']}: {result.get('reason', '')}")
    sys.exit(0 if result["status"] == "done" else 3)


def _domain_from_api(config: CollectorConfig, channel: str) -> tuple[float, float]:
    import urllib.error
    import urllib.request

    host = "127.0.0.1" if config.http.host in ("0.0.0.0", "::") else config.http.host
    url = f"http://{host}:{config.http.port}/api/channels/{channel}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            document = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise click.UsageError(f"no --domain given and the collector at {url} could not tell "
                               f"the channel's domain ({exc})") from None
    domains = [document.get("mechanism", {})] + [s.get("mechanism", {}) for s in
                                                 document.get("other_series", [])]
    domains = [(m["low"], m["high"]) for m in domains if "low" in m and "high" in m]
    if document.get("kind") != "linear" or not domains:
        raise click.UsageError(f"{channel} is not a linear channel with a domain; pass --domain")
    return min(d[0] for d in domains), max(d[1] for d in domains)


@main.command()
@click.option("--agents", default=None, type=click.IntRange(1, 10_000),
              help="simulated wearables  [default: 1,000; with --fast 24]")
@click.option("--fast", is_flag=True,
              help="a budget no study could publish (epsilon 1,000,000 an hour): each wearer "
                   "reports every channel 4 times a second, and estimates settle in seconds")
@click.option("--duration", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="seconds to run; 0 = until Ctrl-C")
@click.option("--http-port", default=8080, show_default=True, type=click.IntRange(1, 65535),
              help="dashboard and API port")
@click.option("--broker", default=None, metavar="HOST:PORT",
              help="use this running broker, which must speak MQTT 5 (default: $BROKER, else "
                   "a private Mosquitto if installed, else the embedded amqtt broker)")
@click.option("--embedded", is_flag=True, help="use the embedded broker even if Mosquitto "
                                               "is installed")
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="keep configs, state and logs here, a new or empty directory (default: a "
                   "temporary directory)")
@click.option("--scale-out", is_flag=True,
              help="a local 3-node NATS JetStream cluster, an ingress, two aggregation "
                   "members and the merge view instead of one collector (docs/guides/SCALE_OUT.md)")
def demo(agents, fast, duration, http_port, broker, embedded, workdir, scale_out) -> None:
    """Broker, collector, dashboard and a fleet of simulated wearables, in one command.

    Ctrl-C, SIGTERM or SIGHUP stops everything it started.
    """
    from collector.tools.demo import DemoError, run_demo

    try:
        code = run_demo(agents=agents, duration=duration, http_port=http_port, broker=broker,
                        workdir=workdir, embedded=embedded, scale_out=scale_out, fast=fast)
    except DemoError as exc:  # found before anything started
        click.echo(f"edge-collector demo: {exc}", err=True)
        code = 2
    except RuntimeError as exc:
        click.echo(f"demo failed: {exc}", err=True)
        code = 1
    except KeyboardInterrupt as exc:  # during start-up: what was started has been stopped
        code = 128 + getattr(exc, "signum", 2)  # 130 for Ctrl-C, 143 for SIGTERM
    sys.exit(code)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--out", default="-", show_default=True,
              type=click.Path(dir_okay=False, allow_dash=True),
              help="write the aggregates (the GET /api/channels document) here; - = stdout")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="its fleet, [aggregates] and [registry] (default: the fleet of FILE's "
                   "topics and the default settings)")
def replay(file: str, out: str, config_path: str | None) -> None:
    """Re-run a recorded stream (FILE, - = stdin) through the collector's checks and
    estimators, offline, and write the GET /api/channels document.

    FILE has one JSON object per line, {"topic": ..., "payload": {the message}}, as
    `export` writes.  Duplicates are dropped, and every message is checked as a live
    collector checks it except against its clock (no report is too far ahead or behind)
    and its [limits] caps (agents, channels, series, statuses, categories: only memory
    limits a replay).  Lines refused are counted by reason and change nothing else; a
    summary goes to stderr.

    Exit 0 (also with refused lines), 2 if FILE cannot be read, mixes fleets without
    --config or names none, 78 if --config is invalid.
    """
    from collector.estimation.jsonsafe import to_json
    from collector.tools.replay import Replay, ReplayError, bounded_lines

    config = _load(config_path, EXIT_CONFIG) if config_path is not None else None
    run = Replay(config)
    name = "standard input" if file == "-" else file
    try:
        with contextlib.ExitStack() as stack:
            stream = sys.stdin.buffer if file == "-" else stack.enter_context(open(file, "rb"))
            run.feed(bounded_lines(stream))
        result = run.result()
    except OSError as exc:
        _fail(f"cannot read {name}: {exc.strerror or exc}")
    except ReplayError as exc:
        _fail(f"{name}: {exc}")
    try:
        with _output(out) as stream:
            stream.write(to_json(result.channels) + b"\n")
    except OSError as exc:
        _fail(f"cannot write {out}: {exc.strerror or exc}")
    click.echo(result.summary(), err=True)


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="the collector's configuration (its [storage] path holds the journal)")
@click.option("--out", default="-", show_default=True,
              type=click.Path(dir_okay=False, allow_dash=True),
              help="write the recording here; - = stdout")
def export(config_path: str, out: str) -> None:
    """Write the collector's journal as a recording for `replay`, one message per line.

    By default only part of the history: the journal holds the messages received since
    the last checkpoint (every [storage] checkpoint_seconds, and at a clean stop), since a
    checkpoint keeps the aggregates and deletes the messages they include.  So an export
    is the recent tail of the stream (seconds, by default), empty after a clean stop;
    the summary on stderr says since when.  With [storage] keep_journal = true the
    journal keeps every message, and an export is the whole stream.  The file is opened
    read-only and read as of one instant: a running collector goes on meanwhile.
    Payloads that are not a JSON object (the journal keeps refused messages too) are
    written losslessly, as "payload_base64".

    Exit 0, 2 if the journal cannot be read or --out written, 78 if --config is invalid.
    """
    import sqlite3

    from collector.tools.export import JournalExport

    config = _load(config_path, EXIT_CONFIG)
    path = config.storage.path
    if not path.is_file():
        _fail(f"cannot read the journal {path}: no such file")
    try:
        with JournalExport(path) as export, _output(out) as stream:
            for line in export.lines():
                stream.write(line)
    except sqlite3.Error as exc:
        _fail(f"cannot read the journal {path}: {exc}")
    except OSError as exc:  # reading the journal raises sqlite3's errors: this is --out
        _fail(f"cannot write {out}: {exc.strerror or exc}")
    click.echo(export.summary(), err=True)


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="the collector's configuration (its [results] name the store)")
@click.option("--channel", required=True, help="the channel's name")
@click.option("--resolution", default=None, help="one of [aggregates] resolutions "
              "(default: the finest)")
@click.option("--start", default=None, metavar="TIME",
              help="Unix seconds or an ISO 8601 time (UTC unless it says); default: 60 "
                   "windows before --end")
@click.option("--end", default=None, metavar="TIME", help="as --start; default: now")
@click.option("--series", default=None, help="another series of the channel (a key the "
              "JSON history lists); default: its newest")
@click.option("--format", "output", default="csv", show_default=True,
              type=click.Choice(["csv", "parquet"]))
@click.option("--out", default="-", show_default=True,
              type=click.Path(dir_okay=False, allow_dash=True),
              help="write the table here; - = stdout (CSV only)")
def results(config_path: str, channel: str, resolution: str | None, start: str | None,
            end: str | None, series: str | None, output: str, out: str) -> None:
    """Write a channel's stored windows at one resolution as a table (CSV or Parquet): one
    row per window with start, end, count, too_few and every estimate with its 95%
    interval (docs/reference/API.md).  Reads the results store, read-only: a running
    collector goes on meanwhile.  Parquet needs the parquet extra (pyarrow).

    Exit 0, 2 if the store cannot be read, the query is wrong or --out cannot be written,
    78 if --config is invalid.
    """
    from collector.results import table
    from collector.results.backends import open_results_store
    from collector.results.query import HistoryQuery, QueryError, parse_request, table_columns
    from collector.results.store import StoreError

    config = _load(config_path, EXIT_CONFIG)
    params = {name: value for name, value in (("resolution", resolution), ("series", series),
                                              ("start", _unix(start, "--start")),
                                              ("end", _unix(end, "--end")))
              if value is not None}
    if output == "parquet" and out == "-":
        _fail("--format parquet: give a file with --out")
    try:
        request = parse_request(params, spans=config.aggregates.spans, now=time.time())
        store = open_results_store(config, read_only=True)
    except QueryError as exc:
        _fail(f"--{exc}")
    except StoreError as exc:
        _fail(str(exc))
    try:
        found = HistoryQuery(store, config.aggregates.spans).select(channel, request, None)
    except QueryError as exc:  # series=fleet weighs the strata by the live view's agents
        _fail(f"--{exc}")
    finally:
        store.close()
    if found is None:
        _fail(f"no windows of a channel named {channel!r} in the results store")
    header, points, _ = found
    try:
        if output == "parquet":
            table.to_parquet(points, table_columns(header), out)
        else:
            with _output(out) as stream:
                stream.write(table.to_csv(points, table_columns(header)).encode())
    except (OSError, RuntimeError) as exc:
        _fail(f"cannot write {out}: {getattr(exc, 'strerror', None) or exc}")
    click.echo(f"{len(points)} window(s) of {request.resolution} of {channel}", err=True)


def _unix(text: str | None, option: str) -> str | None:
    """Unix seconds as text, from Unix seconds or an ISO 8601 time (UTC unless it says)."""
    if text is None:
        return None
    try:
        float(text)
        return text
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        _fail(f"{option}: expected Unix seconds or an ISO 8601 time, got {text[:40]!r}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return repr(moment.timestamp())


def _fail(message: str) -> NoReturn:
    click.echo(f"edge-collector: {message}", err=True)
    sys.exit(2)


@contextlib.contextmanager
def _output(out: str) -> Iterator[BinaryIO]:
    """``out`` opened for binary writing (- = stdout)."""
    if out == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    with open(out, "wb") as stream:
        yield stream


@main.command()
@click.argument("url", default="http://127.0.0.1:8080")
@click.option("--interval", default=2.0, show_default=True, help="seconds between refreshes")
@click.option("--once", is_flag=True, help="print one snapshot and exit")
def watch(url: str, interval: float, once: bool) -> None:
    """A live terminal table of a running collector's aggregates.

    URL is the collector's HTTP address, where its dashboard is served: the
    [http] host and port of its configuration (default: http://127.0.0.1:8080).
    A bare HOST:PORT is taken as http://HOST:PORT; behind a reverse proxy, give
    the prefix the dashboard is served under (e.g. https://proxy/ldp/).  The
    table is read from URL/api/channels.

    Values are in each channel's unit; a mean's ± is its standard error (s.e.),
    a circular mean's ± the half-width of its 95% interval.
    """
    from collector.tools.watch import watch as run_watch

    sys.exit(run_watch(url, interval=interval, once=once))


if __name__ == "__main__":  # pragma: no cover
    main()
