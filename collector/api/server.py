"""The collector's HTTP API and live dashboard (docs/reference/API.md): Starlette on uvicorn.

Every document is served from the latest snapshot (``collector.api.snapshots``):
computed once per push period outside the collector's lock and serialised once, so
a request or an event stream only copies bytes, and no number of viewers slows
ingestion.  Only aggregates pass through here: the API has no field for a single
report, let alone a raw reading.

uvicorn runs in one thread of the collector process, guarded by
``edge_agent.common.asgi`` (connections capped with eviction of the longest waiting,
request and idle deadlines, JSON answers to malformed requests).  Here, on top: at
most ``max_event_streams`` open ``/api/events`` streams (503 beyond).  ``stop()``
ends the event streams and lets uvicorn close every connection, so it returns
promptly even with dashboards attached.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from collector.api.documents import SnapshotSource
from collector.api.snapshots import Snapshot, Snapshots
from collector.results.query import HistoryQuery, QueryError, parse_request
from edge_agent.common.asgi import (
    JSON_TYPE,
    RETRY_AFTER,
    ConnectionGuard,
    ConnectionLimits,
    ServerThread,
    json_error,
)

if TYPE_CHECKING:
    from collector.config import HttpConfig

log = logging.getLogger(__name__)

METRICS_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes

# Explicit, because mimetypes reads /etc/mime.types, which differs between
# systems (.js has been application/javascript, text/javascript or missing).
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": JSON_TYPE,
    ".txt": "text/plain; charset=utf-8",
}

# The dashboard loads nothing from elsewhere; the policy makes a stray CDN
# link or inline script fail loudly (a console error the browser tests catch).
DASHBOARD_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; "
                 "script-src 'self'; connect-src 'self'; base-uri 'none'; "
                 "form-action 'none'; frame-ancestors 'none'")

ALLOWED_METHODS = "GET, HEAD"
NO_STORE = {"Cache-Control": "no-store"}
KEEPALIVE_SECONDS = 15.0  # an SSE comment this often (proxies drop silent streams)
SSE_RETRY_MS = 2000       # tells EventSource how soon to reconnect
FIRST_SNAPSHOT_WAIT_SECONDS = 10.0  # a request before the first snapshot waits this long for it
STOP_JOIN_SECONDS = 3.0   # how long start() and stop() wait for the server thread
GRACEFUL_SHUTDOWN_SECONDS = 1.0  # uvicorn then cancels what is still running
# History queries of the results store running at once (each in a worker thread); beyond,
# 503: a burst of queries waits on no one else's requests, event streams or ingestion.
MAX_HISTORY_QUERIES = 4

SOURCE_ERROR_EVENT = (b"event: source-error\ndata: "
                      + json_error("the aggregates could not be computed") + b"\n\n")


@dataclass(frozen=True)
class HttpLimits:
    """What clients can make the server hold (``[http]`` of the collector's config)."""

    max_connections: int = 256
    max_event_streams: int = 64
    idle_timeout_seconds: float = 60.0
    header_timeout_seconds: float = 10.0

    def connections(self) -> ConnectionLimits:
        return ConnectionLimits(max_connections=self.max_connections,
                                request_seconds=self.header_timeout_seconds,
                                idle_seconds=self.idle_timeout_seconds, evict_waiting=True)


# -- metrics ------------------------------------------------------------------------------------

class ServerMetrics(Collector):
    """/metrics: the latest snapshot's families, and the server's own."""

    def __init__(self, web: WebServer):
        self.web = web

    def collect(self):
        web = self.web
        snapshots = web.snapshots
        snapshot = snapshots.latest
        if snapshot is not None:
            yield from snapshot.metrics
        yield GaugeMetricFamily("ldp_http_connections", "Open HTTP connections.",
                                value=web.open_connections)
        yield GaugeMetricFamily("ldp_http_event_streams", "Open /api/events streams.",
                                value=web.active_streams)
        refused = CounterMetricFamily(
            "ldp_http_refused_total",
            "Connections refused or closed and event streams refused by the server's limits, "
            "by reason.", labels=["reason"])
        for reason, count in sorted(web.guard.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        yield CounterMetricFamily("ldp_snapshot_errors_total",
                                  "Failed snapshot computations (the previous one is served).",
                                  value=snapshots.errors)
        if snapshot is not None:
            yield GaugeMetricFamily("ldp_snapshot_age_seconds",
                                    "Seconds since the served snapshot was computed.",
                                    value=time.monotonic() - snapshot.taken)
            yield GaugeMetricFamily("ldp_snapshot_seconds",
                                    "Time taken to compute the served snapshot.",
                                    value=snapshot.compute_seconds)
            yield GaugeMetricFamily("ldp_snapshot_lock_seconds",
                                    "How long computing the served snapshot held the "
                                    "collector's lock.", value=snapshot.lock_seconds)
            estimates = snapshot.documents.estimates
            if estimates is not None:
                yield CounterMetricFamily(
                    "ldp_estimates_total", "Estimates computed (a channel's total or one "
                    "window, each once per change of its sums).", value=estimates.computed)
                yield CounterMetricFamily("ldp_estimate_seconds_total",
                                          "Time spent computing estimates.",
                                          value=estimates.seconds)
                yield GaugeMetricFamily(
                    "ldp_estimates_pending", "Estimates whose sums changed, left for the "
                    "next pushes or with the worker processes (older windows, channels of "
                    "few agents).", value=estimates.pending)
                yield CounterMetricFamily(
                    "ldp_estimates_by_workers_total", "Of ldp_estimates_total, those computed "
                    "by worker processes ([aggregates] estimate_workers).",
                    value=estimates.by_workers)


# -- the app ------------------------------------------------------------------------------------

def _static_files() -> dict[str, tuple[bytes, str]]:
    """The dashboard's files by name: (content, type).  Requests are looked up in
    this mapping, never turned into paths, so no URL can reach outside the directory."""
    root = importlib.resources.files("collector.api").joinpath("static")
    try:
        entries = [entry for entry in root.iterdir() if entry.is_file()]
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {entry.name: (entry.read_bytes(), _static_type(entry.name)) for entry in entries}


def _static_type(name: str) -> str:
    dot = name.rfind(".")
    return STATIC_TYPES.get(name[dot:].lower() if dot >= 0 else "", "application/octet-stream")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(json_error(message), status_code=status, media_type=JSON_TYPE,
                    headers={**NO_STORE, **(headers or {})})


def _json(body: bytes) -> Response:
    return Response(body, media_type=JSON_TYPE, headers=NO_STORE)


class _EventStream(EventSourceResponse):
    """An event stream that gives its slot back however it ends."""

    def __init__(self, *args: Any, release: Callable[[], None], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


class WebServer:
    """The collector's HTTP server: ``start()`` binds and serves from a thread,
    ``stop()`` ends it and every open connection.

    It serves ``snapshots`` (``collector.api.snapshots.Snapshots``, started and stopped
    by their owner, ``collector.front``), or, given a ``source`` instead
    (``SnapshotSource``), snapshots of its own, computed every ``push_seconds`` while it
    runs.  ``port=0`` binds a free port; ``.port`` and ``.url`` tell which.
    """

    def __init__(self, source: SnapshotSource | None = None, *, host: str, port: int,
                 snapshots: Snapshots | None = None, push_seconds: float = 1.0,
                 limits: HttpLimits = HttpLimits(), history: HistoryQuery | None = None):
        """``history``: answers history requests with parameters from the results store
        (without one, such requests get 404)."""
        if (source is None) == (snapshots is None):
            raise TypeError("WebServer serves a source or snapshots: give one of them")
        self.host = host
        self.limits = limits
        self._requested_port = port
        self._owns_snapshots = snapshots is None
        self.snapshots = snapshots or Snapshots(source, push_seconds=push_seconds)
        self.snapshots.subscribe(self._snapshot_published)
        self.guard = ConnectionGuard(limits.connections())
        self.guard.refused["event_streams"] = 0
        self.guard.refused["history_queries"] = 0
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(ServerMetrics(self))
        self._static = _static_files()
        self._app = self._build_app()
        self._http: ServerThread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # In the loop: set (and replaced) at every snapshot, and when stopping.
        self._published: asyncio.Event | None = None
        self._closing = False
        self._streams = 0
        self._channels_event: bytes | None = None  # the latest snapshot's SSE event
        self.history = history
        self._history_queries = 0  # running now (MAX_HISTORY_QUERIES)

    def register(self, collector: Collector) -> None:
        """Add a prometheus_client collector's families to /metrics."""
        self._registry.register(collector)

    @classmethod
    def from_config(cls, snapshots: Snapshots, http: HttpConfig,
                    history: HistoryQuery | None = None) -> WebServer:
        return cls(snapshots=snapshots, host=http.host, port=http.port, history=history,
                   limits=HttpLimits(max_connections=http.max_connections,
                                     max_event_streams=http.max_event_streams,
                                     idle_timeout_seconds=http.idle_timeout_seconds,
                                     header_timeout_seconds=http.header_timeout_seconds))

    # -- lifecycle --

    def start(self) -> WebServer:
        if self._http is not None:
            raise RuntimeError("WebServer already started")
        # sse-starlette logs every event it sends at DEBUG; what matters is logged here.
        # An operator's explicit level stays.
        if logging.getLogger("sse_starlette").level == logging.NOTSET:
            logging.getLogger("sse_starlette").setLevel(logging.INFO)
        self._http = ServerThread(
            self._asgi, host=self.host, port=self._requested_port, name="collector-web",
            guard=self.guard, on_loop=self._in_loop,
            headers=[("Server", "edge-collector"), ("X-Content-Type-Options", "nosniff")],
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS)
        self._closing = False
        if self._owns_snapshots:
            self.snapshots.start()
        try:
            self._http.start()
        except RuntimeError:
            if self._owns_snapshots:
                self.snapshots.stop()
            self._http = None
            raise
        log.info("dashboard and API on %s", self.url)
        return self

    async def _in_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._published = asyncio.Event()

    def stop(self) -> None:
        http = self._http
        if http is None:
            return
        if self._owns_snapshots:
            self.snapshots.stop()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(self._end_streams)
        http.stop(STOP_JOIN_SECONDS)
        self._http = self._loop = None

    def __enter__(self) -> WebServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._http is None:
            raise RuntimeError("WebServer not started")
        return self._http.port

    @property
    def url(self) -> str:
        """Base URL without a trailing slash; a wildcard bind is shown as loopback."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def active_streams(self) -> int:
        """Open /api/events streams."""
        return self._streams

    @property
    def open_connections(self) -> int:
        """Connections held (refused ones are not)."""
        return self._http.connections if self._http is not None else 0

    # -- snapshots reach the event loop --

    def _snapshot_published(self) -> None:
        """After every snapshot attempt (the snapshots' thread): streams send."""
        snapshot = self.snapshots.latest
        if snapshot is not None:
            # One event for every stream.  The JSON has no newline: a single data line.
            self._channels_event = b"event: channels\ndata: " + snapshot.channels + b"\n\n"
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended: stopping
                loop.call_soon_threadsafe(self._wake_streams)

    def _wake_streams(self) -> None:
        published, self._published = self._published, asyncio.Event()
        published.set()

    def _end_streams(self) -> None:
        self._closing = True
        self._wake_streams()

    async def _snapshot(self) -> Snapshot:
        """The latest snapshot; before the first one, wait for it (a while)."""
        deadline = time.monotonic() + FIRST_SNAPSHOT_WAIT_SECONDS
        while True:
            published = self._published
            snapshot = self.snapshots.latest
            if snapshot is not None:
                return snapshot
            remaining = deadline - time.monotonic()
            if self.snapshots.failing or remaining <= 0 or self._closing:
                message = ("the aggregates could not be computed (see the collector's log)"
                           if self.snapshots.failing else "the aggregates are not ready yet")
                raise HTTPException(503, message, headers={"Retry-After": RETRY_AFTER})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(published.wait(), remaining)

    # -- the ASGI app --

    async def _asgi(self, scope, receive, send) -> None:
        """Starlette's app behind what uvicorn's h11 lets through: HTTP/1.x only, and a
        request target in origin form (absolute form is reduced to its path)."""
        if scope["type"] == "http":
            path = scope["path"]
            problem = None
            if scope["http_version"] not in ("1.0", "1.1"):
                problem = _error(505, "HTTP version not supported")
            elif path.lower().startswith(("http://", "https://")):  # absolute form, RFC 9112
                scope = {**scope, "path": urlsplit(path).path or "/"}
            elif not path.startswith("/"):
                problem = _error(400, "bad request target")
            if problem is not None:
                await problem(scope, receive, send)
                return
        await self._app(scope, receive, send)

    def _build_app(self) -> Starlette:
        get = ["GET"]  # Starlette adds HEAD
        routes = [
            Route("/api/channels", self._channels, methods=get),
            Route("/api/channels/", self._channels, methods=get),
            Route("/api/channels/{name}/history", self._history, methods=get),
            Route("/api/channels/{name:path}", self._channel, methods=get),
            Route("/api/range", self._range, methods=get),
            Route("/api/rejects", self._rejects, methods=get),
            Route("/api/events", self._events, methods=get),
            Route("/metrics", self._metrics, methods=get),
            Route("/", self._index, methods=get),
            Route("/index.html", self._index, methods=get),
            Route("/static/{name:path}", self._static_file, methods=get),
        ]
        return Starlette(routes=routes, exception_handlers={
            HTTPException: self._http_error, Exception: self._internal_error})

    async def _channels(self, request: Request) -> Response:
        return _json((await self._snapshot()).channels)

    async def _channel(self, request: Request) -> Response:
        return await self._of_channel(request, "channel_details")

    async def _history(self, request: Request) -> Response:
        """Without parameters: the live view's recent windows.  With any (resolution,
        start, end, format, series): the results store's windows in that range, with the
        open ones from the live view (collector.results.query)."""
        if not request.query_params:
            return await self._of_channel(request, "histories")
        name = request.path_params["name"]
        if self.history is None:
            raise HTTPException(404, "no results store: history is the live view's only")
        snapshot = await self._snapshot()
        try:
            query = parse_request(request.query_params, spans=self.history.spans,
                                  now=snapshot.t)
        except QueryError as exc:
            raise HTTPException(400, str(exc)) from None
        if self._history_queries >= MAX_HISTORY_QUERIES:
            self.guard.count("history_queries")
            raise HTTPException(503, "too many history queries at once",
                                headers={"Retry-After": RETRY_AFTER})
        live = None
        if name in snapshot.documents.histories:
            live = {**snapshot.documents.histories[name],
                    "open": snapshot.documents.open_windows.get(name, {}),
                    "fleet": snapshot.documents.fleet_open.get(name)}
        self._history_queries += 1
        try:
            found = await run_in_threadpool(self.history.run, name, query, live)
        except QueryError as exc:
            raise HTTPException(400, str(exc)) from None
        finally:
            self._history_queries -= 1
        if found is None:
            raise HTTPException(404, f"no channel named {name!r}")
        body, media_type = found
        return Response(body, media_type=media_type, headers=NO_STORE)

    async def _of_channel(self, request: Request, documents: str) -> Response:
        """The snapshot's document of the channel the path names (``documents``: which)."""
        name = request.path_params["name"]
        body = getattr(await self._snapshot(), documents).get(name)
        if body is None:
            raise HTTPException(404, f"no channel named {name!r}")
        return _json(body)

    async def _range(self, request: Request) -> Response:
        return _json((await self._snapshot()).range)

    async def _rejects(self, request: Request) -> Response:
        return _json((await self._snapshot()).rejects)

    async def _metrics(self, request: Request) -> Response:
        return Response(generate_latest(self._registry), media_type=METRICS_TYPE,
                        headers=NO_STORE)

    async def _index(self, request: Request) -> Response:
        return self._file("index.html")

    async def _static_file(self, request: Request) -> Response:
        return self._file(request.path_params["name"])

    def _file(self, name: str) -> Response:
        found = self._static.get(name)
        if found is None:
            raise HTTPException(404, "not found")
        content, content_type = found
        # no-cache (revalidate) rather than caching: an upgraded collector must
        # not pair a new API with yesterday's app.js.
        headers = {"Cache-Control": "no-cache"}
        if name.endswith(".html"):
            headers["Content-Security-Policy"] = DASHBOARD_CSP
        return Response(content, media_type=content_type, headers=headers)

    async def _events(self, request: Request) -> Response:
        """Server-sent events: the channels document at every snapshot.  sse-starlette
        sends the keep-alive comments, answers HEAD without a stream and notices a
        client that left."""
        release = _nothing
        if request.method != "HEAD":
            if self._streams >= self.limits.max_event_streams:
                self.guard.count("event_streams")
                raise HTTPException(503, "too many event streams",
                                    headers={"Retry-After": RETRY_AFTER})
            self._streams += 1
            release = self._release_stream
        return _EventStream(self._stream(), release=release, sep="\n", ping=KEEPALIVE_SECONDS,
                            ping_message_factory=_keepalive, headers=NO_STORE)

    async def _stream(self):
        """The latest snapshot's event now and at every snapshot after (a
        ``source-error`` event while computing fails) until the server stops."""
        yield f"retry: {SSE_RETRY_MS}\n\n".encode()
        while not self._closing:
            published = self._published
            event = SOURCE_ERROR_EVENT if self.snapshots.failing else self._channels_event
            if event is not None:  # None: the first snapshot is not computed yet
                yield event
            await published.wait()

    def _release_stream(self) -> None:
        self._streams -= 1

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ALLOWED_METHODS  # Starlette lists a set, in no set order
            return _error(405, f"method {request.method} not allowed", headers)
        message = exc.detail if exc.detail != HTTPStatus(exc.status_code).phrase \
            else exc.detail.lower()
        return _error(exc.status_code, message, headers)

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        # Starlette re-raises it after this answer, and uvicorn logs it with its traceback.
        return _error(500, "internal error")


def _nothing() -> None:
    pass


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keep-alive", sep="\n")
