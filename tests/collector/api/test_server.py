"""The collector's HTTP server (docs/reference/API.md) against a real WebServer on a free port
fed by FakeSource: its lifecycle, the JSON routes, the dashboard's files, methods and malformed
requests, and the limits on what clients can hold (connections, slow clients)."""

from __future__ import annotations

import http.client
import importlib.resources
import re
import socket
import threading
import time
import tomllib
from fnmatch import fnmatch

import pytest

from collector.api.server import HttpLimits, WebServer
from collector.estimation.jsonsafe import json_safe
from tests.support import HANG_GUARD_SECONDS, REPO, returns_within, wait_until
from tests.support.web import (
    EventReader,
    NanSource,
    closed_by_server,
    raw_exchange,
    read_until_closed,
    request,
    serve,
    strict_json,
)

# -- lifecycle ------------------------------------------------------------------------------------

def test_port_zero_binds_a_free_port_and_url_names_it(server):
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"
    with pytest.raises(RuntimeError):
        server.start()


def test_stop_is_idempotent_and_frees_the_port(source):
    web = serve(source)
    port = web.port
    web.stop()
    web.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_stop_is_prompt_with_an_idle_keepalive_connection(source, monkeypatch):
    """An idle keep-alive connection is closed by the stop: with an hour's idle timeout
    and an hour for the graceful stop, a stop that waited for it would not return."""
    monkeypatch.setattr("collector.api.server.STOP_JOIN_SECONDS", 3600.0)
    monkeypatch.setattr("collector.api.server.GRACEFUL_SHUTDOWN_SECONDS", 3600.0)
    server = serve(source, limits=HttpLimits(idle_timeout_seconds=3600.0))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD_SECONDS)
    conn.request("GET", "/api/channels")
    conn.getresponse().read()  # the connection stays open (HTTP/1.1 keep-alive)
    assert returns_within(server.stop)
    conn.close()


# -- JSON routes ----------------------------------------------------------------------------------

def test_channels_document(server, source):
    status, headers, body = request(server, "GET", "/api/channels")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-store"
    assert int(headers["content-length"]) == len(body)
    document = strict_json(body)
    assert document == source.channels_json()
    assert set(document["channels"]) == {"accel_x", "roll", "accel_polar", "accel"}
    assert request(server, "GET", "/api/channels?x=1")[0] == 200  # a query string is ignored


@pytest.mark.parametrize("name", ["accel_x", "roll", "accel_polar", "accel"])
def test_channel_entry_has_windows(server, source, name):
    status, headers, body = request(server, "GET", f"/api/channels/{name}")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-store"
    entry = strict_json(body)
    windows = entry.pop("windows")
    assert entry == source.channels_json()["channels"][name]
    assert windows and all({"start", "end", "count"} <= set(w) for w in windows)


def test_channel_name_is_url_decoded(server, source):
    source.add_channel("cabin temp/1")
    server.snapshots.refresh()  # rather than waiting for the next push
    status, _, body = request(server, "GET", "/api/channels/cabin%20temp%2F1")
    assert status == 200
    assert strict_json(body)["kind"] == "linear"


def test_unknown_channel_is_a_json_404(server):
    status, headers, body = request(server, "GET", "/api/channels/nope")
    assert status == 404
    assert headers["content-type"] == "application/json"
    assert "nope" in strict_json(body)["error"]


def test_nan_and_inf_are_served_as_null():
    web = serve(NanSource())
    try:
        status, _, body = request(web, "GET", "/api/channels")
        assert status == 200
        document = strict_json(body)  # would raise on NaN/Infinity
        mean = document["channels"]["a"]["mean"]
        assert document["t"] is None
        assert mean == {"estimate": None, "stderr": None, "ci95": [None, None], "raw": 1.5}
        assert strict_json(request(web, "GET", "/api/channels/a")[2])["mean"]["estimate"] is None
        reader = EventReader(web)
        name, data = reader.read_event()
        assert name == "channels" and strict_json(data.encode())["t"] is None
        reader.close()
    finally:
        web.stop()


def test_json_safe_handles_numpy():
    np = pytest.importorskip("numpy")
    value = {"a": np.array([1.0, np.nan]), "b": np.float64("inf"), "c": np.int64(3),
             "d": (np.float32(0.5),)}
    assert json_safe(value) == {"a": [1.0, None], "b": None, "c": 3, "d": [0.5]}


# -- dashboard files ------------------------------------------------------------------------------

@pytest.mark.parametrize("path, content_type", [
    ("/", "text/html; charset=utf-8"),
    ("/index.html", "text/html; charset=utf-8"),
    ("/static/app.js", "text/javascript; charset=utf-8"),
    ("/static/style.css", "text/css; charset=utf-8"),
])
def test_dashboard_files(server, path, content_type):
    status, headers, body = request(server, "GET", path)
    assert status == 200
    assert headers["content-type"] == content_type
    assert headers["x-content-type-options"] == "nosniff"
    assert int(headers["content-length"]) == len(body) > 0
    if path in ("/", "/index.html"):
        assert "default-src 'self'" in headers["content-security-policy"]
        assert b"static/app.js" in body and b"static/style.css" in body


@pytest.mark.parametrize("path", ["/nope", "/api", "/api/channelz", "/static/", "/static/nope.js",
                                  "/metrics/x", "/api/events/x"])
def test_unknown_paths_are_json_404(server, path):
    status, headers, body = request(server, "GET", path)
    assert status == 404
    assert headers["content-type"] == "application/json"
    assert "error" in strict_json(body)


@pytest.mark.parametrize("path", [
    "/static/../server.py",
    "/static/%2e%2e/server.py",
    "/static/..%2fserver.py",
    "/static/..%2F__init__.py",
    "/static/%2e%2e%2f%2e%2e%2f%2e%2e%2fpyproject.toml",
    "/static/..%5cserver.py",
    "/static//etc/passwd",
    "/static/%2fetc%2fpasswd",
    "/static/.",
    "/static/..",
    "/../collector/api/server.py",
    "//etc/passwd",
    "/static/app.js%00.html",
])
def test_path_traversal_is_refused(server, path):
    status, _, body = request(server, "GET", path)
    assert status in (400, 404)
    assert b"import" not in body and b"root:" not in body and b"[project]" not in body


# -- methods --------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/api/channels", "/api/channels/roll", "/metrics", "/",
                                  "/static/app.js"])
def test_head_sends_headers_only(server, path):
    _, get_headers, get_body = request(server, "GET", path)
    status, headers, body = request(server, "HEAD", path)
    assert status == 200
    assert body == b""
    assert headers["content-type"] == get_headers["content-type"]
    if path == "/metrics":  # rendered per request: the server's own gauges move
        assert int(headers["content-length"]) > 0
    else:
        assert int(headers["content-length"]) == len(get_body)


def test_head_of_the_event_stream(server):
    status, headers, body = request(server, "HEAD", "/api/events")
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert body == b""
    assert wait_until(lambda: server.active_streams == 0)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"])
def test_other_methods_are_405(server, method):
    status, headers, body = request(server, method, "/api/channels", body=b'{"x": 1}',
                                    headers={"Content-Type": "application/json"})
    assert status == 405
    assert headers["allow"] == "GET, HEAD"
    assert headers["content-type"] == "application/json"
    assert method in strict_json(body)["error"]
    assert request(server, "GET", "/api/channels")[0] == 200


@pytest.mark.parametrize("data, status", [
    (b"GARBAGE\r\n\r\n", b"400"),
    (b"GET /api/channels HTTP/9.9\r\nHost: x\r\n\r\n", b"505"),
    (b"GET " + b"/x" * 40000 + b" HTTP/1.1\r\n\r\n", b"400"),  # h11: head over 16 kB
    (b"\x00\xff\xfe\r\n\r\n", b"400"),
    (b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
    (b"GET /api/%ff%fe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"404"),
    (b"GET /api/channels HTTP/1.1\r\nBad Header Line\r\nConnection: close\r\n\r\n", b"400"),
    (b"GET http://x/api/channels HTTP/1.1\r\nHost: x\r\n\r\n", b"200"),  # absolute form
    (b"GET /api/channels HTTP/1.0\r\n\r\n", b"200"),
])
def test_bad_requests_get_an_answer_and_the_server_survives(server, data, status, capfd):
    answer = raw_exchange(server, data)  # sent, then half-closed: answered all the same
    assert re.match(rb"HTTP/1\.[01] " + status + rb" ", answer), answer[:200]
    if status != b"200":
        body = answer.partition(b"\r\n\r\n")[2]
        assert "error" in strict_json(body), answer[:300]
    assert request(server, "GET", "/api/channels")[0] == 200
    assert capfd.readouterr().err == ""  # no tracebacks, no access log


def test_a_refused_request_with_a_large_body_still_gets_its_answer(server):
    body = b"x" * 300_000
    head = f"POST /api/channels HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_SECONDS) as sock:
        sock.sendall(head.encode() + body)  # completes only if the server reads the body away
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        assert response.status == 405 and b"not allowed" in response.read()
        # The body was read away, not taken for the next request.
        sock.sendall(b"GET /api/range HTTP/1.1\r\nHost: x\r\n\r\n")
        response = http.client.HTTPResponse(sock, method="GET")
        response.begin()
        assert response.status == 200 and "channels" in strict_json(response.read())


def test_no_access_log_on_stderr(server, capfd):
    for path in ("/", "/static/app.js", "/api/channels", "/nope", "/metrics"):
        request(server, "GET", path)
    request(server, "POST", "/api/channels")
    assert capfd.readouterr().err == ""


# -- package data ---------------------------------------------------------------------------------

def test_static_files_are_package_data():
    static = importlib.resources.files("collector.api").joinpath("static")
    names = {"index.html", "app.js", "style.css"}
    for name in names:
        assert static.joinpath(name).is_file(), name
    # ... and pyproject ships every file of the directory in the wheel.
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["collector.api"]
    for name in names:
        assert any(fnmatch(f"static/{name}", pattern) for pattern in patterns), name


def test_dashboard_loads_nothing_from_elsewhere():
    static = importlib.resources.files("collector.api").joinpath("static")
    for name in ("index.html", "app.js", "style.css"):
        text = static.joinpath(name).read_text()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), name
        assert not re.search(r"""(fetch|EventSource|url)\(\s*["'](https?:)?//""", text), name
        assert "@import" not in text


# -- connection limits -----------------------------------------------------------------------------

def slow_loris(web: WebServer, slow: int) -> list[socket.socket]:
    """``slow`` connections that each send part of a request and never the rest."""
    sockets = []
    for _ in range(slow):
        sock = socket.create_connection(("127.0.0.1", web.port), timeout=HANG_GUARD_SECONDS)
        sock.sendall(b"GET /api/channels HTTP/1.1\r\nHost: x")  # never finished
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


def test_a_client_takes_the_place_of_the_connection_waiting_longest(source):
    """At the cap, each new connection makes the one that has waited longest for its
    request close (no header timeout can fire here: it is an hour), and a real client
    is answered in its place: no wait for a timeout, no refusal."""
    cap, slow = 100, 300
    web = serve(source, limits=HttpLimits(max_connections=cap, header_timeout_seconds=3600.0))
    threads = threading.active_count()
    sockets = []
    try:
        sockets = slow_loris(web, slow)
        assert wait_until(lambda: web.guard.refused["evicted"] == slow - cap)
        assert web.open_connections == cap
        assert threading.active_count() <= threads  # a connection costs no thread
        assert request(web, "GET", "/api/channels")[0] == 200
        refused = web.guard.refused
        assert refused["evicted"] == slow - cap + 1  # the real client took one's place
        assert refused["header_timeout"] == 0 and refused["connections"] == 0
        # The longest-waiting were closed, the newest are still held.
        assert wait_until(lambda: all(closed_by_server(s) for s in sockets[:slow - cap + 1]))
        assert not any(closed_by_server(s) for s in sockets[slow - cap + 1:])
    finally:
        for sock in sockets:
            sock.close()
        web.stop()


def test_slow_loris_is_held_to_the_cap_costs_no_thread_and_times_out(source):
    cap, slow = 100, 300
    web = serve(source, limits=HttpLimits(max_connections=cap, header_timeout_seconds=1.0))
    sockets, held, watching = [], [], threading.Event()

    def watch():  # what the server holds, sampled throughout
        while not watching.is_set():
            held.append(web.open_connections)
            time.sleep(0.002)

    threads = threading.active_count()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        sockets += slow_loris(web, slow)
        assert threading.active_count() <= threads + 1  # the watcher; none in the server
        # A real client is answered (it takes the longest-waiting one's place: above).
        assert request(web, "GET", "/api/channels")[0] == 200
        # Every slow connection ends: made room for a newer one, or timed out.
        still_open = set(sockets)

        def all_closed() -> bool:
            still_open.difference_update([s for s in still_open if closed_by_server(s)])
            return not still_open

        assert wait_until(all_closed, timeout=30, interval=0.1), \
            f"{len(still_open)} slow connections still open"
        refused = web.guard.refused
        assert refused["evicted"] + refused["header_timeout"] >= slow
        assert refused["header_timeout"] >= 1 and refused["connections"] == 0
        assert threading.active_count() <= threads + 1
        assert wait_until(lambda: web.open_connections == 0)
    finally:
        watching.set()
        watcher.join()
        for sock in sockets:
            sock.close()
        web.stop()
    assert max(held) <= cap


def test_a_silent_connection_gets_408(source):
    web = serve(source, limits=HttpLimits(header_timeout_seconds=0.5))
    try:
        with socket.create_connection(("127.0.0.1", web.port), timeout=HANG_GUARD_SECONDS) as sock:
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
        assert "error" in strict_json(answer.partition(b"\r\n\r\n")[2])
        assert web.guard.refused["header_timeout"] == 1
    finally:
        web.stop()


def test_headers_trickling_in_are_cut_off_at_the_header_timeout(source):
    web = serve(source, limits=HttpLimits(header_timeout_seconds=1.0))
    head = b"GET /api/channels HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", web.port), timeout=HANG_GUARD_SECONDS) as sock:
            sock.sendall(b"GET /api/channels HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in sock.recv(200)  # a first request, then keep-alive ...
            time.sleep(0.1)
            sock.setblocking(False)
            for byte in head:  # ... and the next one a byte at a time, 10 s in all
                try:
                    sock.send(bytes([byte]))
                except OSError:  # reset: closed
                    break
                if closed_by_server(sock):
                    break
                time.sleep(0.05)
            else:
                pytest.fail("a request trickling in for 10 s was not cut off")
        assert web.guard.refused["header_timeout"] == 1
    finally:
        web.stop()


def test_idle_keepalive_connections_are_closed(source):
    web = serve(source, limits=HttpLimits(idle_timeout_seconds=0.5))
    try:
        with socket.create_connection(("127.0.0.1", web.port), timeout=HANG_GUARD_SECONDS) as sock:
            sock.sendall(b"GET /api/range HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_until_closed(sock)  # ends when the server closes the idle connection
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert wait_until(lambda: web.open_connections == 0)
    finally:
        web.stop()


def test_a_client_that_stops_reading_is_dropped(source):
    web = serve(source, limits=HttpLimits(idle_timeout_seconds=0.5))
    try:
        with socket.create_connection(("127.0.0.1", web.port), timeout=HANG_GUARD_SECONDS) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            # Pipelined requests for far more than the kernel buffers hold (loopback's grow
            # to megabytes), and never a byte read.
            sock.sendall(b"GET /api/channels HTTP/1.1\r\nHost: x\r\n\r\n" * 1000)
            assert wait_until(lambda: web.guard.refused["write_timeout"] == 1, timeout=20)
        assert wait_until(lambda: web.open_connections == 0)
    finally:
        web.stop()


def test_at_the_cap_with_every_connection_busy_a_new_one_is_refused(source):
    web = serve(source, limits=HttpLimits(max_connections=2))
    readers = [EventReader(web) for _ in range(2)]
    try:
        for reader in readers:
            reader.read_event()
        with socket.create_connection(("127.0.0.1", web.port), timeout=HANG_GUARD_SECONDS) as sock:
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:100]
        assert b"Retry-After: 5" in answer
        assert web.guard.refused["connections"] == 1
        assert web.open_connections == 2
    finally:
        for reader in readers:
            reader.close()
        web.stop()
