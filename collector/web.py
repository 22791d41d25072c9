"""The collector's HTTP API and live dashboard (standard library only).

``WebServer`` serves docs/API.md from any *source* object with three methods:

* ``channels_json() -> dict``: the whole ``/api/channels`` document;
* ``channel_json(name) -> dict | None``: one channel plus ``"windows"``
  (``None``: no such channel, answered with 404);
* ``metrics_text() -> str``: Prometheus exposition text.

The source is called from the server's request threads, concurrently, so it
must be thread-safe.  Only aggregates pass through here: the API has no field
for a single report, let alone a raw reading.

The server runs ``http.server.ThreadingHTTPServer`` in a daemon thread.  Every
answer is built in full before anything is written, so a failing source gives
a clean 500 instead of a half-sent body; ``/api/events`` is the one streamed
route.  ``stop()`` closes every open connection (SSE streams and idle
keep-alive ones), so it returns promptly even with a dashboard attached.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import socket
import socketserver
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from .jsonsafe import json_safe

log = logging.getLogger(__name__)

JSON_TYPE = "application/json"
METRICS_TYPE = "text/plain; version=0.0.4"
EVENTS_TYPE = "text/event-stream; charset=utf-8"

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

KEEPALIVE_SECONDS = 15.0  # SSE comment when no event went out for this long (idle proxies)
SSE_RETRY_MS = 2000       # tells EventSource how soon to reconnect
MAX_STREAMS = 64          # each SSE stream holds a thread; refuse beyond this
IDLE_TIMEOUT = 60.0       # seconds an idle keep-alive connection (or a stuck write) may last
STOP_JOIN_SECONDS = 2.0   # how long stop() waits for request threads to end
LINGER_SECONDS = 1.0      # reading a refused request's leftovers before closing ...
LINGER_BYTES = 1 << 20    # ... up to this much

ALLOWED_METHODS = "GET, HEAD"


class Source(Protocol):
    def channels_json(self) -> dict: ...

    def channel_json(self, name: str) -> dict | None: ...

    def metrics_text(self) -> str: ...


class HttpError(Exception):
    """An answer other than 200, raised by a route and sent as a JSON error."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def to_json(value: Any) -> bytes:
    return json.dumps(json_safe(value), allow_nan=False, separators=(",", ":")).encode()


def _static_files() -> dict[str, Any]:
    """The dashboard's files by name.  Requests are looked up in this mapping,
    never turned into paths, so no URL can reach outside the directory."""
    root = importlib.resources.files("collector").joinpath("static")
    try:
        return {entry.name: entry for entry in root.iterdir() if entry.is_file()}
    except (FileNotFoundError, NotADirectoryError):
        return {}


def _static_type(name: str) -> str:
    dot = name.rfind(".")
    return STATIC_TYPES.get(name[dot:].lower() if dot >= 0 else "", "application/octet-stream")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], web: WebServer):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.web = web
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host with getfqdn(), a reverse
        # DNS lookup that stalls for seconds on machines without a resolver.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), port

    def handle_error(self, request, client_address) -> None:
        # The default prints a traceback to stderr; a dropped connection is
        # routine for a dashboard, anything else is worth a real log entry.
        log.debug("error while serving %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: the polling fallback reuses its connection
    server_version = "edge-collector"
    sys_version = ""
    timeout = IDLE_TIMEOUT

    # -- connection bookkeeping, so stop() can end every open connection --

    def setup(self) -> None:
        super().setup()
        self._linger = False         # drain unread input before closing (see _drain)
        self._source_failing = False  # the event stream logs a failing source once
        self.server.web._register(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
            if self._linger:
                self._drain()
        finally:
            self.server.web._unregister(self.connection)

    def _drain(self) -> None:
        """Read what the client still sends (an oversized request line, a body
        we refused) before the socket closes: closing with unread input makes
        the kernel send a reset, which can destroy our answer in transit."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_SECONDS)
            deadline = time.monotonic() + LINGER_SECONDS
            received = 0
            while received < LINGER_BYTES and time.monotonic() < deadline:
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                received += len(chunk)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # -- methods --

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def __getattr__(self, name: str):
        # BaseHTTPRequestHandler looks up do_<METHOD>; answer every other
        # method (POST, PUT, PROPFIND, ...) with 405 rather than 501.
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        self.close_connection = self._linger = True  # a request body may follow, unread
        self._send_error(HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command} not allowed",
                         {"Allow": ALLOWED_METHODS})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Called by the base class for malformed requests: answer in JSON too.
        self.close_connection = self._linger = True
        if self.request_version == "HTTP/0.9":  # unparsed request line: still send a status line
            self.request_version = "HTTP/1.0"
        self._send_error(code, message or HTTPStatus(code).phrase)

    # -- routing --

    def _dispatch(self, *, head: bool) -> None:
        if self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers:
            # GET with a body: don't parse it as the next request.
            self.close_connection = self._linger = True
        try:
            path = self._request_path()
            if path == "/api/events":
                self._events(head=head)
                return
            status, content_type, body, headers = self._route(path)
        except HttpError as exc:
            self._send_error(exc.status, exc.message, exc.headers, head=head)
            return
        except Exception:
            log.exception("collector web: %s %s failed", self.command, self.path)
            self._send_error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error", head=head)
            return
        self._send(status, content_type, body, headers, head=head)

    def _request_path(self) -> str:
        target = self.path
        if target.startswith("/"):
            # Not urlsplit: it would read "//host/x" as a network location.
            return target.split("?", 1)[0].split("#", 1)[0]
        if target.lower().startswith(("http://", "https://")):  # absolute-form (RFC 9112)
            return urlsplit(target).path or "/"
        raise HttpError(HTTPStatus.BAD_REQUEST, "bad request target")

    def _route(self, path: str) -> tuple[int, str, bytes, dict[str, str]]:
        source = self.server.web.source
        no_store = {"Cache-Control": "no-store"}
        if path in ("/api/channels", "/api/channels/"):
            return 200, JSON_TYPE, to_json(source.channels_json()), no_store
        if path.startswith("/api/channels/"):
            name = unquote(path[len("/api/channels/"):])
            channel = source.channel_json(name)
            if channel is None:
                raise HttpError(HTTPStatus.NOT_FOUND, f"no channel named {name!r}")
            return 200, JSON_TYPE, to_json(channel), no_store
        if path == "/api/range":
            results = getattr(source, "range_json", None)
            document = results() if results is not None else {"channels": {}}
            return 200, JSON_TYPE, to_json(document), no_store
        if path == "/api/rejects":
            recent = getattr(source, "dead_letters", list)()
            return 200, JSON_TYPE, to_json({"recent": recent}), no_store
        if path == "/metrics":
            return 200, METRICS_TYPE, source.metrics_text().encode(), no_store
        if path in ("/", "/index.html"):
            return self._static("index.html")
        if path.startswith("/static/"):
            return self._static(unquote(path[len("/static/"):]))
        raise HttpError(HTTPStatus.NOT_FOUND, "not found")

    def _static(self, name: str) -> tuple[int, str, bytes, dict[str, str]]:
        entry = _static_files().get(name)
        if entry is None:
            raise HttpError(HTTPStatus.NOT_FOUND, "not found")
        # no-cache (revalidate) rather than caching: an upgraded collector must
        # not pair a new API with yesterday's app.js.
        headers = {"Cache-Control": "no-cache"}
        if name.endswith(".html"):
            headers["Content-Security-Policy"] = DASHBOARD_CSP
        return 200, _static_type(name), entry.read_bytes(), headers

    # -- server-sent events --

    def _events(self, *, head: bool) -> None:
        web = self.server.web
        if not head and not web._open_stream():
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "too many event streams",
                            {"Retry-After": "5"})
        try:
            # No Content-Length: the body lasts until either side closes.
            self.close_connection = True
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", EVENTS_TYPE)
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.send_header("X-Accel-Buffering", "no")  # nginx: don't buffer the stream
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if not head:
                self._stream(web)
        except OSError as exc:  # the client left (broken pipe, reset) or stop() shut it
            log.debug("event stream to %s ended: %s", self.address_string(), exc)
        finally:
            if not head:
                web._close_stream()

    def _stream(self, web: WebServer) -> None:
        """Write an event now and every push_seconds until the client leaves
        (a write fails) or the server stops."""
        self._write(f"retry: {SSE_RETRY_MS}\n\n".encode())
        while not web._stopping.is_set():
            self._write(self._event())
            next_push = time.monotonic() + web.push_seconds
            while True:
                remaining = next_push - time.monotonic()
                if remaining <= 0:
                    break
                if web._stopping.wait(min(remaining, KEEPALIVE_SECONDS)):
                    return
                if next_push - time.monotonic() > 0:
                    self._write(b": keep-alive\n\n")

    def _event(self) -> bytes:
        try:
            data = to_json(self.server.web.source.channels_json())
            kind, self._source_failing = "channels", False
        except Exception:
            # Keep the stream: the next push may succeed, and the dashboard
            # shows the error meanwhile.  Logged once per failing streak, not
            # at every push of every open dashboard.
            if not self._source_failing:
                log.exception("collector web: channels_json failed for /api/events")
            self._source_failing = True
            data, kind = to_json({"error": "internal error"}), "source-error"
        # to_json never emits a newline, so the payload is a single data line.
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    # -- plain answers --

    def _send(self, status: int, content_type: str, body: bytes,
              headers: dict[str, str] | None = None, *, head: bool = False) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Content-Type-Options", "nosniff")
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if not head and self.command != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as exc:
            self.close_connection = True
            log.debug("client %s went away: %s", self.address_string(), exc)

    def _send_error(self, status: int, message: str, headers: dict[str, str] | None = None,
                    *, head: bool = False) -> None:
        headers = {"Cache-Control": "no-store", **(headers or {})}
        self._send(int(status), JSON_TYPE, to_json({"error": message}), headers, head=head)


class WebServer:
    """The collector's HTTP server: ``start()`` binds and serves in a daemon
    thread, ``stop()`` ends it and every open connection.

    ``port=0`` binds a free port; ``.port`` and ``.url`` tell which.
    """

    def __init__(self, source: Source, *, host: str, port: int, push_seconds: float = 1.0):
        if not push_seconds > 0:
            raise ValueError(f"push_seconds must be > 0, got {push_seconds}")
        self.source = source
        self.host = host
        self.push_seconds = float(push_seconds)
        self._requested_port = port
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._streams = 0

    # -- lifecycle --

    def start(self) -> WebServer:
        if self._httpd is not None:
            raise RuntimeError("WebServer already started")
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self._requested_port), self)
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name="collector-web", daemon=True)
        self._thread.start()
        log.info("dashboard and API on %s", self.url)
        return self

    def stop(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        self._stopping.set()  # SSE loops return at their next wait
        httpd.shutdown()      # the accept loop ends within poll_interval
        httpd.server_close()
        with self._lock:
            connections = dict(self._connections)
        for conn in connections:
            # Wakes handlers blocked in a read (idle keep-alive) or a write.
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_JOIN_SECONDS
        for thread in [*connections.values(), self._thread]:
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self._httpd = self._thread = None

    def __enter__(self) -> WebServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("WebServer not started")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """Base URL without a trailing slash; a wildcard bind is shown as loopback."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def active_streams(self) -> int:
        """Open /api/events streams (for tests and diagnostics)."""
        with self._lock:
            return self._streams

    # -- bookkeeping called by the handler threads --

    def _register(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections[conn] = threading.current_thread()

    def _unregister(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.pop(conn, None)

    def _open_stream(self) -> bool:
        with self._lock:
            if self._streams >= MAX_STREAMS:
                return False
            self._streams += 1
            return True

    def _close_stream(self) -> None:
        with self._lock:
            self._streams -= 1
