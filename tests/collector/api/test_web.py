"""The collector's HTTP API (docs/API.md) and dashboard, against a real
WebServer on a free port fed by FakeSource, and the dashboard in a real
headless Chromium; the server's limits (connections, slow clients, event
streams), and that documents are computed once per push, outside the
collector's lock."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import importlib.resources
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import tomllib
from decimal import Decimal
from fnmatch import fnmatch

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import Series
from collector.api.documents import Capture, Documents, Views
from collector.api.server import HttpLimits, WebServer
from collector.estimation.jsonsafe import json_safe
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import REPO, wait_until
from tests.support.fake_source import FakeSource, empty_linear_channel

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PUSH = 0.2  # seconds between events: fast, so the tests are quick


# -- helpers --------------------------------------------------------------------------------------

def strict_json(body: bytes):
    """json.loads that refuses NaN/Infinity, as a browser's JSON.parse does."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(body, parse_constant=refuse)


def request(server: WebServer, method: str, path: str, *, body: bytes | None = None,
            headers: dict | None = None):
    """(status, lower-cased headers, body); the path is sent exactly as given."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read())
    finally:
        conn.close()


def raw_exchange(server: WebServer, data: bytes) -> bytes:
    """Send bytes on a fresh connection; whatever comes back until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # no further request: the server answers and closes
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


class EventReader:
    """A minimal SSE client over http.client: read_event() -> (name, data)."""

    def __init__(self, server: WebServer, timeout: float = 5):
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
        self.conn.request("GET", "/api/events", headers={"Accept": "text/event-stream"})
        self.sock = self.conn.sock  # the response takes it over (Connection: close)
        self.response = self.conn.getresponse()

    def read_event(self) -> tuple[str, str]:
        name, data = "message", []
        while True:
            line = self.response.readline()  # de-chunked
            if not line:
                raise EOFError("stream closed")
            line = line.decode().rstrip("\r\n")
            if not line:
                if data:
                    return name, "\n".join(data)
                continue  # after a comment or retry: field
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.response.close()
        self.conn.close()


class FlakySource:
    """A source whose computation raises while ``failing`` is set."""

    def __init__(self, inner):
        self.inner = inner
        self.failing = True

    def capture(self):
        return self.inner.capture()

    def documents(self, capture):
        if self.failing:
            raise RuntimeError("engine exploded")
        return self.inner.documents(capture)


class NanSource:
    def capture(self):
        return Capture(t=float("nan"), content=None)

    def documents(self, capture):
        channel = {"kind": "linear", "count": 0,
                   "mean": {"estimate": float("inf"), "stderr": float("nan"),
                            "ci95": [float("-inf"), float("nan")], "raw": 1.5}}
        document = {"fleet": "nan", "t": float("nan"), "broker": {"connected": None},
                    "agents_online": 0, "agents": {},
                    "ingest": {"messages": 0, "values": 0, "duplicates": 0, "rejects": {}},
                    "channels": {"a": channel}}
        return Documents(channels=document, channel_details={"a": {**channel, "windows": []}},
                         histories={}, range={"t": float("nan"), "channels": {}},
                         dead_letters=[])


# -- fixtures -------------------------------------------------------------------------------------

@pytest.fixture
def source():
    return FakeSource()


@pytest.fixture
def server(source):
    web = WebServer(source, host="127.0.0.1", port=0, push_seconds=PUSH).start()
    yield web
    web.stop()


def serve(source, **kwargs) -> WebServer:
    return WebServer(source, host="127.0.0.1", port=0, **{"push_seconds": PUSH, **kwargs}).start()


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


def test_stop_is_prompt_with_an_idle_keepalive_connection(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/api/channels")
    conn.getresponse().read()  # the connection stays open (HTTP/1.1 keep-alive)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 1.5
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


# -- metrics --------------------------------------------------------------------------------------

def test_metrics_are_prometheus_text(server):
    status, headers, body = request(server, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert headers["cache-control"] == "no-store"
    text = body.decode()
    for metric in ("ldp_ingest_messages_total", "ldp_ingest_values_total",
                   "ldp_ingest_duplicates_total", 'ldp_ingest_rejects_total{reason="schema"}',
                   "ldp_agents_online", 'ldp_channel_count{channel="accel_x"}',
                   'ldp_channel_mean_estimate{channel="accel_x"}',
                   'ldp_channel_mean_stderr{channel="accel_x"}',
                   'ldp_channel_resultant_length{channel="roll"}',
                   'ldp_channel_resultant_length_stderr{channel="roll"}',
                   'ldp_channel_circular_mean{channel="roll"}',
                   'ldp_channel_circular_mean_half_width{channel="roll"}'):
        assert re.search(rf"^{re.escape(metric)} \S+$", text, re.M), metric


def test_metrics_parse_and_have_every_family(server, source):
    text = request(server, "GET", "/metrics")[2].decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    # The parser names a counter family without its _total (the samples keep it).
    assert set(families) >= {
        "ldp_ingest_messages", "ldp_ingest_values", "ldp_ingest_duplicates",
        "ldp_ingest_rejects", "ldp_broker_connected", "ldp_agents_online",
        "ldp_channel_count", "ldp_channel_mean_estimate", "ldp_channel_mean_stderr",
        "ldp_channel_resultant_length", "ldp_channel_resultant_length_stderr",
        "ldp_channel_circular_mean", "ldp_channel_circular_mean_half_width",
        "ldp_http_connections", "ldp_http_event_streams",
        "ldp_http_refused", "ldp_snapshot_errors", "ldp_snapshot_age_seconds",
        "ldp_snapshot_seconds", "ldp_snapshot_lock_seconds"}
    document = source.channels_json()
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in families.values() for sample in family.samples}
    assert samples["ldp_ingest_messages_total", ()] == document["ingest"]["messages"]
    assert samples["ldp_ingest_rejects_total", (("reason", "bad_code"),)] == 2
    assert samples["ldp_channel_count", (("channel", "accel"),)] == 15501
    assert samples["ldp_broker_connected", ()] == 1
    assert samples["ldp_http_connections", ()] >= 1  # this request's
    assert samples["ldp_http_refused_total", (("reason", "header_timeout"),)] == 0
    assert samples["ldp_snapshot_seconds", ()] > 0
    assert families["ldp_ingest_messages"].type == "counter"
    assert families["ldp_channel_count"].type == "gauge"


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
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
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


# -- a failing source -----------------------------------------------------------------------------

def test_a_source_failing_from_the_start_gives_503_until_it_succeeds(source, caplog):
    flaky = FlakySource(source)
    with caplog.at_level("ERROR", logger="collector.api.snapshots"):
        web = serve(flaky)
        try:
            assert wait_until(lambda: web.snapshots.errors >= 3)
            for path in ("/api/channels", "/api/channels/roll", "/api/range", "/api/rejects"):
                status, headers, body = request(web, "GET", path)
                assert status == 503, path
                assert headers["content-type"] == "application/json"
                assert headers["retry-after"] == "5"
                assert "could not be computed" in strict_json(body)["error"]
            assert request(web, "GET", "/")[0] == 200
            assert request(web, "GET", "/metrics")[0] == 200  # the server's own metrics
            # Logged once for the failing streak, not at every push.
            failures = [r for r in caplog.records if r.exc_info is not None]
            assert len(failures) == 1 and "engine exploded" in str(failures[0].exc_info[1])
            flaky.failing = False
            assert wait_until(lambda: request(web, "GET", "/api/channels")[0] == 200)
            assert strict_json(request(web, "GET", "/api/channels")[2])["fleet"] == "demo"
        finally:
            web.stop()


def test_a_failing_computation_keeps_the_previous_snapshot(source, caplog):
    flaky = FlakySource(source)
    flaky.failing = False
    web = serve(flaky)
    try:
        before = request(web, "GET", "/api/channels")[2]
        with caplog.at_level("ERROR", logger="collector.api.snapshots"):
            flaky.failing = True
            source.step()
            errors = web.snapshots.errors
            assert wait_until(lambda: web.snapshots.errors >= errors + 3)
            assert request(web, "GET", "/api/channels")[2] == before  # as of its own t
            assert request(web, "GET", "/api/channels/roll")[0] == 200
        assert len([r for r in caplog.records if r.exc_info is not None]) == 1
        flaky.failing = False
        assert wait_until(lambda: request(web, "GET", "/api/channels")[2] != before)
    finally:
        web.stop()


def test_event_stream_survives_a_failing_source(source, caplog):
    flaky = FlakySource(source)
    web = serve(flaky)
    try:
        reader = EventReader(web)
        with caplog.at_level("ERROR", logger="collector.api.snapshots"):
            name, data = reader.read_event()
        assert name == "source-error" and "error" in strict_json(data.encode())
        flaky.failing = False
        while name != "channels":
            name, data = reader.read_event()
        assert strict_json(data.encode())["fleet"] == "demo"
        reader.close()
    finally:
        web.stop()


# -- server-sent events ---------------------------------------------------------------------------

def test_event_stream_delivers_channel_documents(server, source):
    reader = EventReader(server)
    assert reader.response.status == 200
    assert reader.response.getheader("Content-Type").startswith("text/event-stream")
    assert reader.response.getheader("Cache-Control") == "no-store"
    events = [reader.read_event() for _ in range(2)]
    assert [name for name, _ in events] == ["channels", "channels"]
    for _, data in events:
        assert strict_json(data.encode()) == source.channels_json()
    count = source.channels_json()["channels"]["accel_x"]["count"]
    source.step()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        _, data = reader.read_event()
        if strict_json(data.encode())["channels"]["accel_x"]["count"] > count:
            break
    else:
        pytest.fail("the stream did not follow source.step()")
    reader.close()


def test_first_event_is_immediate_and_keepalives_are_comments(source, monkeypatch):
    monkeypatch.setattr("collector.api.server.KEEPALIVE_SECONDS", 0.1)
    web = serve(source, push_seconds=60)
    try:
        started = time.monotonic()
        reader = EventReader(web)
        name, _ = reader.read_event()
        assert name == "channels"
        assert time.monotonic() - started < 1.5
        lines = [reader.response.readline() for _ in range(4)]
        assert b": keep-alive\n" in lines
        reader.close()
    finally:
        web.stop()


def test_stream_ends_when_the_client_disconnects(server):
    reader = EventReader(server)
    reader.read_event()
    assert server.active_streams == 1
    reader.close()
    assert wait_until(lambda: server.active_streams == 0, timeout=3)
    assert request(server, "GET", "/api/channels")[0] == 200


def test_stop_ends_open_streams_promptly(source):
    web = serve(source, push_seconds=30)
    readers = [EventReader(web) for _ in range(3)]
    for reader in readers:
        reader.read_event()
    ended = []

    def drain(reader):
        try:
            while reader.response.readline():
                pass
        except OSError:
            pass
        ended.append(reader)

    threads = [threading.Thread(target=drain, args=(r,), daemon=True) for r in readers]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    web.stop()
    assert time.monotonic() - started < 1.5
    for thread in threads:
        thread.join(2)
    assert len(ended) == 3
    assert web.active_streams == 0


def test_stop_with_open_streams_leaves_no_thread_behind(source):
    before = set(threading.enumerate())
    web = serve(source, push_seconds=30)
    readers = [EventReader(web) for _ in range(5)]
    try:
        for reader in readers:
            assert reader.read_event()[0] == "channels"
        assert web.active_streams == 5
        started = time.monotonic()
        web.stop()
        assert time.monotonic() - started < 5
        assert wait_until(lambda: set(threading.enumerate()) <= before, timeout=5), \
            set(threading.enumerate()) - before
    finally:
        for reader in readers:
            reader.close()


def test_event_streams_beyond_the_limit_get_503(source):
    web = serve(source, limits=HttpLimits(max_event_streams=2))
    readers = [EventReader(web) for _ in range(2)]
    try:
        for reader in readers:
            reader.read_event()
        status, headers, body = request(web, "GET", "/api/events")
        assert status == 503 and headers["retry-after"] == "5"
        assert "too many event streams" in strict_json(body)["error"]
        assert web.guard.refused["event_streams"] == 1
        readers.pop().close()
        assert wait_until(lambda: web.active_streams == 1)
        readers.append(EventReader(web))
        assert readers[-1].read_event()[0] == "channels"
    finally:
        for reader in readers:
            reader.close()
        web.stop()


# -- snapshots: computed once per push, outside the collector's lock -----------------------------

def test_fifty_streams_and_requests_share_one_computation_per_push(source):
    web = serve(source)
    readers = []
    try:
        readers = [EventReader(web, timeout=10) for _ in range(50)]
        for reader in readers:
            assert reader.read_event()[0] == "channels"
        computes, started = source.computes, time.monotonic()
        for _ in range(3):
            for reader in readers:
                assert reader.read_event()[0] == "channels"
            for _ in range(10):
                assert request(web, "GET", "/api/channels")[0] == 200
                assert request(web, "GET", "/api/channels/roll")[0] == 200
                assert request(web, "GET", "/metrics")[0] == 200
        pushes = (time.monotonic() - started) / PUSH
        assert web.active_streams == 50
        # At most one computation per push (and one under way), for 50 streams and
        # 90 requests: 150 events and 90 answers from a handful of computations.
        assert source.computes - computes <= pushes + 2
        assert source.captures == source.computes
    finally:
        for reader in readers:
            reader.close()
        web.stop()


def report_ingestor(messages: int = 12) -> Ingestor:
    """A real ingestor with one linear channel over several windows."""
    ingestor = Ingestor(fleet="demo", bins=20, window_seconds=10.0, keep_windows=4)
    mechanism = ClassicalOGPM(epsilon=1.0, low=0.0, high=1.0).describe()
    for seq in range(messages):
        payload = protocol.report(agent=f"w{seq % 3}", channel="x", kind="linear", seq=seq,
                                  t=100.0 + 5 * seq, dt=1, codes=[1000 * seq % 65536, 7, 30000],
                                  mechanism=mechanism)
        assert ingestor.ingest(protocol.data_topic("demo", f"w{seq % 3}", "x"), payload,
                               200.0) == "accepted"
    return ingestor


def test_the_collectors_lock_is_free_while_a_snapshot_is_computed(monkeypatch):
    ingestor = report_ingestor()
    lock = threading.RLock()
    views = Views(lambda: ingestor, lock, clock=lambda: 300.0)
    computing, go_on = threading.Event(), threading.Event()
    real_get = Series.get

    def blocking_get(self, *, windows=False):  # runs only while documents are computed
        computing.set()
        assert go_on.wait(10)
        return real_get(self, windows=windows)

    monkeypatch.setattr(Series, "get", blocking_get)
    web = serve(views)
    try:
        assert computing.wait(5)  # the first snapshot is being computed ...
        assert lock.acquire(timeout=2)  # ... and the aggregation loop could go on
        lock.release()
        go_on.set()
        status, _, body = request(web, "GET", "/api/channels")
        assert status == 200 and strict_json(body)["channels"]["x"]["count"] == 36
        snapshot = web.snapshots.latest
        assert 0 < snapshot.lock_seconds < snapshot.compute_seconds
    finally:
        go_on.set()
        web.stop()


def test_snapshot_documents_equal_the_views_under_the_lock():
    ingestor = report_ingestor()
    views = Views(lambda: ingestor, clock=lambda: 300.0)
    live = Views(lambda: ingestor, clock=lambda: 300.0)

    def same(documents):
        assert json_safe(documents.channels) == json_safe(live.channels_json())
        assert json_safe(documents.channel_details["x"]) == json_safe(live.channel_json("x"))

    same(views.documents(views.capture()))
    # More reports, in a new window: the unchanged windows' results are reused.
    mechanism = ClassicalOGPM(epsilon=1.0, low=0.0, high=1.0).describe()
    payload = protocol.report(agent="w1", channel="x", kind="linear", seq=99, t=170.0, dt=1,
                              codes=[5, 6], mechanism=mechanism)
    assert ingestor.ingest(protocol.data_topic("demo", "w1", "x"), payload, 200.0) == "accepted"
    same(views.documents(views.capture()))


# -- connection limits -----------------------------------------------------------------------------

def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (reading away what it sent before)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


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
        for _ in range(slow):
            sock = socket.create_connection(("127.0.0.1", web.port), timeout=5)
            sock.sendall(b"GET /api/channels HTTP/1.1\r\nHost: x")  # never finished
            sock.setblocking(False)
            sockets.append(sock)
        assert threading.active_count() <= threads + 1  # the watcher; none in the server
        # A real client is answered at once: it takes the longest-waiting one's place.
        started = time.monotonic()
        assert request(web, "GET", "/api/channels")[0] == 200
        assert time.monotonic() - started < 3
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
        with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
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
        with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
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
        with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
            sock.sendall(b"GET /api/range HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_until_closed(sock)  # ends when the server closes the idle connection
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert wait_until(lambda: web.open_connections == 0)
    finally:
        web.stop()


def test_a_client_that_stops_reading_is_dropped(source):
    web = serve(source, limits=HttpLimits(idle_timeout_seconds=0.5))
    try:
        with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
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
        with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:100]
        assert b"Retry-After: 5" in answer
        assert web.guard.refused["connections"] == 1
        assert web.open_connections == 2
    finally:
        for reader in readers:
            reader.close()
        web.stop()


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


# -- the dashboard in Chromium --------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: run `make test` (it installs it with apt) "
                    "or set CHROMIUM")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Dashboard:
    """A page on the dashboard that records every console error, page error,
    failed request and HTTP error."""

    def __init__(self, browser, server: WebServer, *, init_script: str | None = None,
                 block_events: bool = False, path: str = "/", wait: bool = True):
        """``wait``: until the first document is shown."""
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        if init_script:
            self.context.add_init_script(init_script)
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.requests: list[str] = []  # every URL the page asked for, in order
        page = self.page
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("console", lambda m: m.type in ("error", "warning")
                and self.problems.append(f"console {m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url} {r.failure}"))
        page.on("response", lambda r: r.status >= 400
                and self.problems.append(f"HTTP {r.status}: {r.url}"))
        if block_events:
            page.route("**/api/events", lambda route: route.abort())
        page.goto(server.url + path)
        if wait:
            self.wait_updates(1)

    def updates(self) -> int:
        return int(self.page.get_attribute("body", "data-updated"))

    def wait_updates(self, n: int, timeout: float = 10) -> None:
        # A function, not an expression string: the page's CSP forbids eval.
        self.page.wait_for_function("(n) => Number(document.body.dataset.updated) >= n",
                                    arg=n, timeout=timeout * 1000)

    def text(self, selector: str) -> str:
        locator = self.page.locator(selector)
        assert locator.count() == 1, f"{selector}: {locator.count()} elements"
        return locator.inner_text().strip()

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def dashboard(browser, server):
    board = Dashboard(browser, server)
    yield board
    board.close()


def shown_number(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def assert_shows(board: Dashboard, selector: str, value) -> None:
    text = board.text(selector)
    if value is None:
        assert text == "–", (selector, text)
    elif isinstance(value, int):
        assert shown_number(text) == value, (selector, text, value)
    else:  # 4 significant digits
        assert math.isclose(shown_number(text), value, rel_tol=1e-3), (selector, text, value)


def card(name: str, stat: str, block: str | None = None) -> str:
    inner = f' [data-block="{block}"]' if block else ""
    return f'[data-channel="{name}"]{inner} [data-stat="{stat}"]'


def test_dashboard_loads_cleanly_with_every_channel(dashboard, server):
    document = strict_json(request(server, "GET", "/api/channels")[2])
    page = dashboard.page
    assert page.locator("[data-channel]").count() == len(document["channels"])
    for name, channel in document["channels"].items():
        kind = page.locator(f'[data-channel="{name}"]').get_attribute("data-kind")
        assert kind == channel["kind"]
    assert dashboard.text('[data-stat="fleet"]') == "demo"
    assert dashboard.page.get_attribute('[data-stat="connection"]', "data-state") == "live"
    assert dashboard.problems == []


def test_dashboard_numbers_match_the_api(dashboard, server):
    document = strict_json(request(server, "GET", "/api/channels")[2])
    board = dashboard
    ingest = document["ingest"]
    assert_shows(board, '#fleet [data-stat="agents-online"]', document["agents_online"])
    assert_shows(board, '#fleet [data-stat="agents-total"]', len(document["agents"]))
    assert_shows(board, '#fleet [data-stat="messages"]', ingest["messages"])
    assert_shows(board, '#fleet [data-stat="values"]', ingest["values"])
    assert_shows(board, '#fleet [data-stat="duplicates"]', ingest["duplicates"])
    assert_shows(board, '#fleet [data-stat="rejects-total"]', sum(ingest["rejects"].values()))
    for reason, n in ingest["rejects"].items():
        assert board.text(f'[data-reject="{reason}"]') == f"{reason} {n}"
    assert board.text('#fleet [data-stat="broker"]') == "connected"

    channels = document["channels"]
    for name, channel in channels.items():
        assert_shows(board, card(name, "count"), channel["count"])
        assert_shows(board, card(name, "agents"), channel["agents"])
        assert_shows(board, card(name, "epsilon"), channel["mechanism"]["epsilon"])
        assert board.text(card(name, "kind")) == channel["kind"]
        assert board.text(card(name, "mechanism")) == channel["mechanism"]["name"]

    def linear(name, block, stats):
        mean = stats["mean"]
        assert_shows(board, card(name, "mean-estimate", block), mean["estimate"])
        assert_shows(board, card(name, "stderr", block), mean["stderr"])
        assert_shows(board, card(name, "ci-low", block), mean["ci95"][0])
        assert_shows(board, card(name, "ci-high", block), mean["ci95"][1])
        assert_shows(board, card(name, "mean-raw", block), mean["raw"])
        assert_shows(board, card(name, "bias-bound", block), mean["bias_bound"])
        assert_shows(board, card(name, "median", block), stats["quantiles"]["0.5"])
        assert board.text(card(name, "method", block)) == mean["method"]
        note = board.page.locator(f'[data-channel="{name}"]'
                                  + (f' [data-block="{block}"]' if block else "")
                                  + ' [data-field="note"]')
        assert note.is_visible() == bool(mean["note"])
        if mean["note"]:
            assert note.inner_text() == mean["note"]
        histogram = stats["histogram"]
        assert board.text(card(name, "histogram-method", block)) == (
            "raw reports" if histogram["method"] == "raw"
            else f"reconstruction, smoothing {histogram['smoothing']:g}")

    def circular(name, block, stats):
        assert_shows(board, card(name, "circular-mean", block), stats["circular_mean"])
        direction, length = stats["direction"], stats["resultant_length"]
        assert_shows(board, card(name, "circular-half-width", block), direction["half_width"])
        assert_shows(board, card(name, "direction-low", block), direction["ci95"][0])
        assert_shows(board, card(name, "direction-high", block), direction["ci95"][1])
        assert_shows(board, card(name, "resultant-estimate", block), length["estimate"])
        assert_shows(board, card(name, "resultant-stderr", block), length["stderr"])
        assert_shows(board, card(name, "resultant-low", block), length["ci95"][0])
        assert_shows(board, card(name, "resultant-high", block), length["ci95"][1])
        assert_shows(board, card(name, "resultant-raw", block), length["raw"])
        assert_shows(board, card(name, "circular-std", block), stats["circular_std"])

    linear("accel_x", None, channels["accel_x"])
    circular("roll", None, channels["roll"])
    linear("accel_polar", "radius", channels["accel_polar"]["radius"])
    circular("accel_polar", "angle", channels["accel_polar"]["angle"])
    vector = channels["accel_polar"]["mean_vector"]
    assert_shows(board, card("accel_polar", "mean-vector-magnitude"), vector["magnitude"])
    assert_shows(board, card("accel_polar", "mean-vector-direction"), vector["direction"])
    for axis, stats in channels["accel"]["axes"].items():
        linear("accel", axis, stats)
        assert_shows(board, card("accel", "axis-count", axis), stats["count"])
    assert dashboard.problems == []


def test_dashboard_updates_itself_without_reloading(dashboard, source):
    page = dashboard.page
    page.evaluate("window.__sameDocument = true")
    before = dashboard.updates()
    old = dashboard.text(card("accel_x", "count"))
    source.step()
    new = source.channels_json()["channels"]["accel_x"]["count"]
    page.wait_for_function(
        """([selector, expected]) => document.querySelector(selector).textContent
             .replace(/,/g, "") === String(expected)""",
        arg=[card("accel_x", "count"), new], timeout=5000)
    assert dashboard.text(card("accel_x", "count")) != old
    assert dashboard.updates() > before
    assert page.evaluate("window.__sameDocument") is True
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    assert_shows(dashboard, card("accel_x", "mean-estimate"),
                 source.channels_json()["channels"]["accel_x"]["mean"]["estimate"])
    assert dashboard.problems == []


def test_broker_disconnection_is_shown(dashboard, source):
    source.broker_connected = False
    source.step()
    broker = dashboard.page.locator('#fleet [data-stat="broker"][data-state="disconnected"]')
    broker.wait_for(timeout=5000)
    assert broker.inner_text().startswith("disconnected since ")
    assert dashboard.problems == []


def test_a_channel_appearing_later_with_null_statistics(dashboard, source):
    source.add_channel("humidity")
    dashboard.page.wait_for_selector('[data-channel="humidity"]', timeout=5000)
    dashboard.wait_updates(dashboard.updates() + 1)
    for stat in ("mean-estimate", "stderr", "ci-low", "ci-high", "method", "median",
                 "bias-bound"):
        assert dashboard.text(card("humidity", stat)) == "–", stat
    assert_shows(dashboard, card("humidity", "count"), 0)
    assert dashboard.page.locator("[data-channel]").count() == 5
    assert dashboard.problems == []


# -- range discovery on the dashboard --------------------------------------------------------------

RANGE_PARAMETERS = {"strategy": "split", "epsilon": 4.0, "rounds": 9, "h": 3.45,
                    "participants": 1000, "alpha_min": None, "answer_epsilon": 4.0,
                    "window_seconds": 300.0}
RANGE_CHANNELS = {
    "accel_x": {  # a trustworthy min with its bound; a max contradicting it
        "min": {"v": 1, "run": "accel_x-min-1", "coordinator": "c", "channel": "accel_x",
                "side": "min", "domain": [-20.0, 20.0], "started_at": 1763780000.0,
                "finished_at": 1763780021.3, "status": "done", "estimate": -3.906,
                "error_bound": 1.172, "interval": [-5.078, -3.125], "confidence": 0.95,
                "rounds": 9, "participants": 1000, "parameters": RANGE_PARAMETERS},
        "max": {"v": 1, "run": "accel_x-max-1", "coordinator": "c", "channel": "accel_x",
                "side": "max", "domain": [-20.0, 20.0], "started_at": 1763780030.0,
                "status": "insufficient", "published_status": "done",
                "reason": "min -3.91 exceeds max -7.5", "estimate": -7.5, "error_bound": 2.5,
                "interval": [-10.0, -5.0], "confidence": 0.95, "participants": 1000}},
    "roll": {  # too few agents for any round; an old coordinator's result without a bound
        "min": {"v": 1, "run": "roll-min-1", "coordinator": "c", "channel": "roll",
                "side": "min", "domain": [-1.0, 1.0], "started_at": 1763780000.0,
                "status": "insufficient", "participants": 4,
                "reason": "4 agents joined: too few for even one informative round "
                          "(4 answers at \u03b5 0.0833 each cannot be told from noise at "
                          "95% confidence)"},
        "max": {"v": 1, "run": "roll-max-0", "coordinator": "c", "channel": "roll",
                "side": "max", "domain": [-1.0, 1.0], "started_at": 1763770000.0,
                "status": "done", "estimate": 0.75, "rounds": 2, "participants": 24}},
}


class RangeSource(FakeSource):
    """FakeSource with range results in /api/range and every channels document."""

    def documents(self, capture: Capture) -> Documents:
        documents = super().documents(capture)
        documents.channels["range"] = json.loads(json.dumps(RANGE_CHANNELS))
        return dataclasses.replace(documents, range={"t": capture.t,
                                                     "channels": RANGE_CHANNELS,
                                                     "ignored": {}})


def test_dashboard_shows_range_bounds_and_why_a_result_is_insufficient(browser):
    web = serve(RangeSource())
    board = Dashboard(browser, web)
    try:
        served = strict_json(request(web, "GET", "/api/range")[2])["channels"]
        assert served["accel_x"]["min"]["error_bound"] == 1.172
        page = board.page
        page.wait_for_selector("#range:not([hidden])", timeout=5000)

        def cell(channel, side, stat=None):
            inner = f' [data-range-stat="{stat}"]' if stat else ""
            return f'[data-range="{channel}"] [data-side="{side}"]{inner}'

        ok = RANGE_CHANNELS["accel_x"]["min"]
        assert_shows(board, cell("accel_x", "min", "estimate"), ok["estimate"])
        assert_shows(board, cell("accel_x", "min", "bound"), ok["error_bound"])
        assert_shows(board, cell("accel_x", "min", "interval-low"), ok["interval"][0])
        assert_shows(board, cell("accel_x", "min", "interval-high"), ok["interval"][1])
        assert "95% in [" in board.text(cell("accel_x", "min"))
        assert "1,000 agents" in board.text(cell("accel_x", "min"))
        # insufficient: the reason, and none of the numbers as if they could be trusted
        for channel, side in (("accel_x", "max"), ("roll", "min")):
            result = RANGE_CHANNELS[channel][side]
            assert board.text(cell(channel, side, "status")) == "insufficient"
            assert board.text(cell(channel, side, "reason")) == result["reason"]
            assert page.locator(cell(channel, side, "estimate")).count() == 0
            assert page.locator(cell(channel, side, "bound")).count() == 0
            assert board.text(cell(channel, side)) == f"insufficient: {result['reason']}"
        # an old coordinator's result: its number, said to be without a bound
        assert_shows(board, cell("roll", "max", "estimate"), 0.75)
        assert board.text(cell("roll", "max", "no-bound")) == (
            "(no error bound: an older coordinator)")
        assert board.problems == []
    finally:
        board.close()
        web.stop()


# Pixels are read from a copy: reading the page's own canvases back would make
# Chromium warn (willReadFrequently), which the tests count as a problem.
CANVAS_STATE = """() => [...document.querySelectorAll("canvas")].map((c) => {
    const copy = document.createElement("canvas");
    copy.width = c.width;
    copy.height = c.height;
    const ctx = copy.getContext("2d", {willReadFrequently: true});
    ctx.drawImage(c, 0, 0);
    const data = ctx.getImageData(0, 0, c.width, c.height).data;
    let ink = 0;
    for (let i = 3; i < data.length; i += 4) if (data[i] > 0) ink++;
    return {chart: c.dataset.chart, width: c.width, height: c.height,
            cssWidth: c.clientWidth, ink: ink,
            channel: c.closest("[data-channel]").dataset.channel};
})"""


def test_charts_are_drawn_and_follow_a_resize(browser, source):
    # One event, then none for a minute: only the resize handling can redraw.
    web = serve(source, push_seconds=60)
    board = Dashboard(browser, web)
    try:
        page = board.page
        charts = page.evaluate(CANVAS_STATE)
        # accel_x: trend + histogram; roll: direction trend + rose; polar: radius trend +
        # histogram, angle trend + rose; vector: 3 axes x (trend + histogram)
        assert len(charts) == 2 + 2 + 4 + 6
        for chart in charts:
            assert chart["width"] > 0 and chart["height"] > 0, chart
            assert chart["ink"] > 50, chart
        dpr = page.evaluate("window.devicePixelRatio")

        # 3 grid columns at 1280 px, 2 wider ones at 1000 px.
        page.set_viewport_size({"width": 1000, "height": 800})
        page.wait_for_function("""(old) => [...document.querySelectorAll("canvas.trend")].every(
            (c) => c.clientWidth * window.devicePixelRatio > old + 20
                && Math.abs(c.width - Math.round(c.clientWidth * window.devicePixelRatio)) <= 1)""",
                               arg=max(c["width"] for c in charts if c["chart"] == "trend"),
                               timeout=5000)
        resized = page.evaluate(CANVAS_STATE)
        assert board.updates() == 1
        for before, after in zip(charts, resized):
            assert abs(after["width"] - round(after["cssWidth"] * dpr)) <= 1, after
            assert after["ink"] > 50, after
            if after["chart"] != "rose":  # fixed size
                assert after["width"] > before["width"], (before, after)
        assert board.problems == []
    finally:
        board.close()
        web.stop()


def test_the_page_does_not_grow_while_updating(dashboard, source):
    page = dashboard.page
    count_nodes = "document.getElementsByTagName('*').length"
    dashboard.wait_updates(dashboard.updates() + 2)
    nodes = page.evaluate(count_nodes)
    for _ in range(10):
        source.step()
        dashboard.wait_updates(dashboard.updates() + 1)
    assert page.evaluate(count_nodes) == nodes
    assert dashboard.problems == []


@pytest.mark.parametrize("how", ["no EventSource", "stream refused"])
def test_falls_back_to_polling(browser, server, source, how):
    if how == "no EventSource":
        board = Dashboard(browser, server, init_script="delete window.EventSource;")
    else:
        board = Dashboard(browser, server, block_events=True)
    try:
        assert board.page.get_attribute('[data-stat="connection"]', "data-state") == "polling"
        source.step()
        new = source.channels_json()["channels"]["roll"]["count"]
        board.page.wait_for_function(
            """([selector, expected]) => document.querySelector(selector).textContent
                 .replace(/,/g, "") === String(expected)""",
            arg=[card("roll", "count"), new], timeout=6000)
        assert_shows(board, card("roll", "circular-mean"),
                     source.channels_json()["channels"]["roll"]["circular_mean"])
        # Only the refused stream itself may be reported (Chromium logs it without its URL).
        expected = ("api/events", "net::ERR_FAILED") if how == "stream refused" else ()
        assert [p for p in board.problems if not any(e in p for e in expected)] == []
    finally:
        board.close()


# -- categorical channels in Chromium ------------------------------------------------------

HOSTILE_LABEL = "<img src=x onerror=alert(1)>"
# Records what a label turned into markup would do (no alert box in a headless page).
NO_ALERTS = "window.__alerts = []; window.alert = (m) => window.__alerts.push(String(m));"

# Each row of a categorical card: its texts, and the bar's and whisker's geometry
# relative to the track (CSS pixels).
BAR_ROWS = """(name) => [...document.querySelectorAll(`[data-channel="${name}"] .bar-row`)]
    .map((row) => {
  const track = row.querySelector(".bar-track").getBoundingClientRect();
  const whisker = row.querySelector(".whisker");
  const w = whisker.getBoundingClientRect();
  return {label: row.querySelector(".bar-label").textContent,
          value: row.querySelector(".bar-value").textContent,
          category: Number(row.dataset.category), title: row.getAttribute("title"),
          track: track.width, bar: row.querySelector(".bar").getBoundingClientRect().width,
          whisker: !whisker.hidden && w.width > 0, whiskerLeft: w.left - track.left,
          whiskerRight: w.right - track.left,
          scale: Number(row.closest("[data-chart]").dataset.scale)};
})"""


class DocumentSource:
    """Serves whatever channels document a test sets (shaped like docs/API.md)."""

    def __init__(self, channels: dict):
        self._lock = threading.Lock()
        self.channels = channels

    def set(self, channels: dict) -> None:
        with self._lock:
            self.channels = channels

    def capture(self):
        with self._lock:
            return Capture(t=time.time(), content=json.loads(json.dumps(self.channels)))

    def documents(self, capture):
        document = {"fleet": "demo", "t": capture.t, "broker": {"connected": True},
                    "agents_online": 0, "agents": {},
                    "ingest": {"messages": 0, "values": 0, "duplicates": 0, "rejects": {}},
                    "channels": capture.content}
        return Documents(channels=document,
                         channel_details={n: {**c, "windows": []}
                                          for n, c in capture.content.items()},
                         histories={}, range={"t": capture.t, "channels": {}},
                         dead_letters=[])


def categorical_channel(labels: list[str], shares: list[float] | None, *, delta: float = 0.0,
                        mechanism_labels: bool = True) -> dict:
    """A categorical channel entry; ``shares`` None: no report yet (null statistics)."""
    k = len(labels)
    mechanism = {"name": "oue", "epsilon": 1.0, "categories": k, "delta": delta}
    if mechanism_labels:
        mechanism["labels"] = labels
    if shares is None:
        frequencies = {key: [None] * k for key in ("raw", "estimate", "stderr", "shares")}
        frequencies["ci95"] = [[None, None]] * k
        count = 0
    else:
        frequencies = {"raw": [0.5 * s + 0.5 / k for s in shares], "estimate": shares,
                       "stderr": [0.01] * k, "shares": shares,
                       "ci95": [[max(s - 0.02, 0.0), min(s + 0.02, 1.0)] for s in shares]}
        count = 1000
    return {"kind": "categorical", "mechanism": mechanism, "count": count,
            "messages": count // 100, "agents": 2 if count else 0, "other_series": [],
            "frequencies": {"labels": labels, **frequencies}}


def shown(x: float) -> str:
    """``x`` as app.js's fmt writes it: 4 significant digits in plain decimal (never an
    exponent), thousands grouped, a true minus sign (for the titles)."""
    if x == 0:
        return "0"
    text = f"{Decimal(f'{x:.3e}').normalize():,f}"
    return text.replace("-", "\u2212")


def test_a_categorical_channel_is_a_bar_chart_with_intervals(browser):
    labels = ["rest", "walk", "run", HOSTILE_LABEL]
    mechanism = {"name": "grr", "epsilon": 1.0, "categories": 4, "delta": 0.0, "labels": labels}
    ingestor = Ingestor(fleet="demo", bins=20, window_seconds=10.0, keep_windows=4)
    now = time.time()
    for seq in range(12):
        agent = f"w{seq % 4}"
        payload = protocol.report(agent=agent, channel="activity", kind="categorical", seq=seq,
                                  t=now, dt=1.0, mechanism=mechanism,
                                  codes=[0] * 14 + [1] * 8 + [2] * 5 + [3] * 3)
        assert ingestor.ingest(protocol.data_topic("demo", agent, "activity"), payload,
                               now) == "accepted"
    web = serve(Views(lambda: ingestor))
    board = Dashboard(browser, web, init_script=NO_ALERTS)
    try:
        page = board.page
        page.wait_for_selector('[data-channel="activity"] .bar-row', timeout=5000)
        channel = strict_json(request(web, "GET", "/api/channels")[2])["channels"]["activity"]
        freq = channel["frequencies"]
        assert freq["labels"] == labels and channel["count"] == 360

        assert page.get_attribute('[data-channel="activity"]', "data-kind") == "categorical"
        assert board.text(card("activity", "kind")) == "categorical"
        assert board.text(card("activity", "mechanism")) == "grr"
        assert board.text(card("activity", "epsilon")) == "1"
        assert board.text(card("activity", "delta")) == ""  # pure ε
        assert_shows(board, card("activity", "count"), 360)
        assert_shows(board, card("activity", "agents"), 4)
        assert_shows(board, card("activity", "categories"), 4)

        rows = page.evaluate(BAR_ROWS, "activity")
        assert [r["label"] for r in rows] == labels  # every label, in category order
        assert [r["category"] for r in rows] == [0, 1, 2, 3]
        scale = rows[0]["scale"]
        ends = freq["shares"] + [hi for _, hi in freq["ci95"]]
        assert max(ends) <= scale <= 1
        for row, share, (lo, hi), est, se in zip(rows, freq["shares"], freq["ci95"],
                                                 freq["estimate"], freq["stderr"]):
            width = row["track"]
            assert width > 100, row
            assert row["value"] == f"{100 * share:.1f}%", (row, share)
            assert abs(row["bar"] - share / scale * width) <= max(1, 0.01 * width), (row, share)
            assert row["whisker"], row
            assert abs(row["whiskerLeft"] - lo / scale * width) <= 1, (row, lo)
            # The end ticks keep a whisker at least 3 px wide.
            assert abs(row["whiskerRight"] - max(hi / scale * width, row["whiskerLeft"] + 3)) <= 1
            assert row["title"].startswith(f"{row['label']}: share {row['value']}"), row
            assert f"{shown(est)} ± {shown(se)}" in row["title"], (row, est, se)
            assert f"95% interval [{shown(lo)}, {shown(hi)}]" in row["title"], (row, lo, hi)

        # The label is text: literally on the page, and no element was made from it.
        assert board.text('[data-channel="activity"] [data-category="3"] .bar-label') \
            == HOSTILE_LABEL
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        page.wait_for_timeout(3 * PUSH * 1000)  # a few more updates of the same card
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        assert page.evaluate("window.__alerts") == []
        assert page.locator('[data-channel="activity"] .bar-row').count() == 4
        assert board.problems == []
    finally:
        board.close()
        web.stop()


def test_categorical_cards_without_data_with_new_labels_with_delta_and_many_categories(browser):
    source = DocumentSource({"activity": categorical_channel(["rest", "walk", "run"], None)})
    web = serve(source)
    board = Dashboard(browser, web)
    try:
        page = board.page
        page.wait_for_selector('[data-channel="activity"] .bar-row', timeout=5000)
        # No report yet: empty bars, dashes, no whiskers.
        empty = page.evaluate(BAR_ROWS, "activity")
        assert [r["label"] for r in empty] == ["rest", "walk", "run"]
        for row in empty:
            assert row["value"] == "–" and row["bar"] == 0 and not row["whisker"], row
            assert row["scale"] == 1, row  # axis 0–100% until there are shares
            assert row["title"] == f"{row['label']}: no data yet"
        assert_shows(board, card("activity", "count"), 0)
        page.evaluate("document.querySelector('[data-channel=\"activity\"]').__first = true")

        # A new series with other labels and δ > 0: the card is rebuilt.
        labels = ["rest", "walk", "run", "cycle"]
        shares = [0.4, 0.3, 0.2, 0.1]
        source.set({"activity": categorical_channel(labels, shares, delta=1e-6)})
        page.wait_for_function(
            "() => document.querySelectorAll('[data-channel=\"activity\"] .bar-row').length === 4",
            timeout=5000)
        assert page.evaluate(
            "document.querySelector('[data-channel=\"activity\"]').__first") is None
        assert page.locator("[data-channel]").count() == 1
        assert board.text(card("activity", "mechanism")) == "oue"
        epsilon = page.locator(f'{card("activity", "epsilon")} >> xpath=..')
        assert epsilon.inner_text().strip() == "1, δ 0.000001"
        filled = page.evaluate(BAR_ROWS, "activity")
        assert [r["label"] for r in filled] == labels
        assert [r["value"] for r in filled] == ["40.0%", "30.0%", "20.0%", "10.0%"]
        for row, share in zip(filled, shares):
            assert abs(row["bar"] - share / row["scale"] * row["track"]) <= 1, row
            assert row["whisker"], row

        # 100 numbered categories (no labels in the mechanism): the 64 largest shares.
        weights = [(i * 37) % 100 + 1 for i in range(100)]
        shares = [w / sum(weights) for w in weights]
        numbered = [str(i) for i in range(100)]
        source.set({"activity": categorical_channel(numbered, shares, mechanism_labels=False)})
        page.wait_for_function(
            "() => document.querySelectorAll('[data-channel=\"activity\"] .bar-row').length === 64",
            timeout=5000)
        assert "top 64 of 100 categories by share" in board.text(
            '[data-channel="activity"] [data-block="frequencies"] .chart-label')
        many = page.evaluate(BAR_ROWS, "activity")
        largest = sorted(range(100), key=lambda i: (-shares[i], i))[:64]
        assert [r["category"] for r in many] == largest
        assert [r["label"] for r in many] == [numbered[i] for i in largest]
        for row in many:
            share = shares[row["category"]]
            assert abs(row["bar"] - share / row["scale"] * row["track"]) <= 1, row
        assert_shows(board, card("activity", "categories"), 100)

        # Same labels, other shares: the rows are reused and re-ranked.
        page.evaluate("document.querySelector('[data-channel=\"activity\"]').__same = true")
        reverse = list(reversed(shares))
        source.set({"activity": categorical_channel(numbered, reverse, mechanism_labels=False)})
        first = sorted(range(100), key=lambda i: (-reverse[i], i))[0]
        page.wait_for_function(
            """(first) => document.querySelector('[data-channel="activity"] .bar-row')
                 .dataset.category === String(first)""", arg=first, timeout=5000)
        assert page.evaluate(
            "document.querySelector('[data-channel=\"activity\"]').__same") is True
        assert page.locator('[data-channel="activity"] .bar-row').count() == 64
        assert board.problems == []
    finally:
        board.close()
        web.stop()


# -- charts over time from the server's history, units, number formats, the static view ----------

# Every chart over time: what it shows (data- attributes of its canvas) and its label.
TRENDS = """() => [...document.querySelectorAll("canvas.trend")].map((c) => {
  const block = c.closest("[data-block]");
  const label = block.querySelector(`[data-label="${c.dataset.chart}"]`);
  const number = (text) => (text === undefined || text === "" ? null : Number(text));
  return {channel: c.closest("[data-channel]").dataset.channel, block: block.dataset.block,
          chart: c.dataset.chart, points: Number(c.dataset.points),
          first: number(c.dataset.first), last: number(c.dataset.last),
          value: number(c.dataset.lastValue),
          span: Number(label.querySelector("[data-span]").dataset.span),
          label: label.textContent};
})"""

# True once every chart named in the argument shows the given points and span.
TRENDS_ARE = """(want) => want.every((w) => {
  const c = document.querySelector(
    `[data-channel="${w.channel}"] [data-block="${w.block}"] canvas.trend`);
  const number = (text) => (text === undefined || text === "" ? null : Number(text));
  return c !== null && Number(c.dataset.points) === w.points
    && number(c.dataset.first) === w.first && number(c.dataset.last) === w.last
    && number(c.dataset.lastValue) === w.value
    && Number(c.closest("[data-block]").querySelector(
      `[data-label="${c.dataset.chart}"] [data-span]`).dataset.span) === w.span;
})"""


def served_trends(web: WebServer) -> list[dict]:
    """What each chart over time should show, from the server's own histories: per block
    with a chart, the number of windows, the first and last window's start, and the
    latest estimate."""
    channels = strict_json(request(web, "GET", "/api/channels")[2])["channels"]
    want = []
    for name, channel in channels.items():
        status, _, body = request(web, "GET", f"/api/channels/{name}/history")
        assert status == 200, (name, body)
        points = strict_json(body)["points"]
        picks = {"linear": {"value": lambda p: p["mean"]["estimate"]},
                 "circular": {"value": lambda p: p["circular_mean"]},
                 "polar": {"radius": lambda p: p["radius"]["mean"]["estimate"],
                           "angle": lambda p: p["angle"]["circular_mean"]},
                 "vector": {axis: (lambda p, axis=axis: p["axes"][axis]["mean"]["estimate"])
                            for axis in channel.get("axes", {})}}.get(channel["kind"], {})
        for block, pick in picks.items():
            want.append({"channel": name, "block": block, "points": len(points),
                         "first": points[0]["start"] if points else None,
                         "last": points[-1]["start"] if points else None,
                         "value": pick(points[-1]) if points else None,
                         "span": points[-1]["end"] - points[0]["start"] if points else 0})
    return want


def step(web: WebServer, source: FakeSource, *, new_window: bool = True) -> list[dict]:
    """Step the source, wait for the server's snapshot of it; what the charts should show."""
    source.step(new_window=new_window)
    t = source.channels_json()["t"]
    assert wait_until(lambda: strict_json(request(web, "GET", "/api/channels")[2])["t"] == t,
                      timeout=10)
    return served_trends(web)


def wait_trends(page, want: list[dict], timeout: float = 10) -> None:
    page.wait_for_function(TRENDS_ARE, arg=want, timeout=timeout * 1000)


def history_requests(board: Dashboard) -> list[str]:
    return sorted(url.removeprefix(url.split("/api/")[0]) for url in board.requests
                  if url.endswith("/history"))


CHARTED = ("accel_x", "roll", "accel_polar", "accel")  # FakeSource's channels with charts


def test_a_new_page_draws_the_history_and_follows_it(browser, source):
    source.step()
    source.step()  # three windows of history before the page is opened
    web = serve(source)
    board = Dashboard(browser, web)
    try:
        page = board.page
        want = served_trends(web)
        # accel_x, roll, the polar radius and angle, three vector axes
        assert len(want) == 7 and {w["points"] for w in want} == {3}
        wait_trends(page, want)
        for trend in page.evaluate(TRENDS):
            # Fake windows are 10 s long and start a second apart: 12 s covered.
            assert trend["span"] == 12, trend
            assert "last 12 s (3 windows of 10 s)" in trend["label"], trend
        assert history_requests(board) == sorted(f"/api/channels/{n}/history" for n in CHARTED)

        appended = step(web, source)  # a new window starts: one more point
        assert {w["points"] for w in appended} == {4}
        wait_trends(page, appended)

        # The window under way changes: so does the last point.
        replaced = step(web, source, new_window=False)
        for before, after in zip(appended, replaced):
            assert (after["points"], after["last"]) == (before["points"], before["last"])
            assert after["value"] != before["value"]
        wait_trends(page, replaced)

        for _ in range(3):  # up to the 6 windows the fake keeps, then one beyond
            wait_trends(page, step(web, source))
        full = served_trends(web)
        assert {w["points"] for w in full} == {6}
        assert min(w["first"] for w in full) > max(w["first"] for w in want)  # oldest dropped
        shown_trends = {(t["channel"], t["block"]): t for t in page.evaluate(TRENDS)}
        assert len(shown_trends) == len(full)
        for served in full:
            trend = shown_trends[served["channel"], served["block"]]
            assert trend["span"] == served["span"]
            assert f"last {served['span']:g} s (6 windows of 10 s)" in trend["label"], trend

        # The page keeps what the server keeps (windows_kept): the next window drops
        # the oldest point without asking the server again.
        fetched = history_requests(board)
        wait_trends(page, step(web, source))
        assert history_requests(board) == fetched
        assert {t["points"] for t in page.evaluate(TRENDS)} == {6}
        assert board.problems == []
    finally:
        board.close()
        web.stop()


def test_a_circular_mean_crossing_the_domains_ends_is_unwrapped(browser, source):
    """Means either side of ±π are drawn next to each other, not a period apart."""
    for mean in (3.12, -3.12, 3.1, -3.1, 3.12, -3.12):  # the 6 windows kept; steps drift them
        source.set_parameter("roll", mean)
        source.step()
    web = serve(source)
    board = Dashboard(browser, web)
    try:
        page = board.page
        want = served_trends(web)
        wait_trends(page, want)
        history = strict_json(request(web, "GET", "/api/channels/roll/history")[2])["points"]
        means = [p["circular_mean"] for p in history]
        assert min(means) < -3 and max(means) > 3, means  # it does cross the ends
        chart = page.locator('[data-channel="roll"] canvas[data-chart="direction-trend"]')
        low = float(chart.get_attribute("data-y-low"))
        high = float(chart.get_attribute("data-y-high"))
        halves = [p["half_width"] for p in history]
        # The band around the unwrapped means: the means within 0.5 rad, plus the intervals.
        assert high - low < 0.5 + 2 * max(halves), (low, high, means)
        latest = means[-1]
        assert low <= latest <= high  # unwrapped around the latest, which is drawn as it is
        assert low < -math.pi or high > math.pi  # others moved by a period, past the end
        assert board.problems == []
    finally:
        board.close()
        web.stop()


NUMBER = r"−?[\d,]+(?:\.\d+)?"


def term_text(board: Dashboard, name: str, stat: str, block: str | None = None) -> str:
    """The whole value of the statistic's term (its dd), units and labels included."""
    return board.page.locator(f"{card(name, stat, block)} >> xpath=..").inner_text().strip()


def test_values_show_their_unit_and_what_the_plus_minus_is(dashboard, source):
    board = dashboard
    page = board.page
    mean = term_text(board, "accel_x", "mean-estimate")
    assert re.fullmatch(rf"{NUMBER} ± {NUMBER} g \(s\.e\.\)", mean), mean
    assert re.fullmatch(rf"\[{NUMBER}, {NUMBER}\] g", term_text(board, "accel_x", "ci-low"))
    assert re.fullmatch(rf"{NUMBER} … {NUMBER} g", term_text(board, "accel_x", "q05"))
    for stat in ("mean-raw", "median", "bias-bound"):
        assert re.fullmatch(rf"{NUMBER} g", term_text(board, "accel_x", stat)), stat
    # ... and to the pointer: the ± and the "(s.e.)" have tooltips.
    block = page.locator('[data-channel="accel_x"] [data-block="value"]')
    assert block.locator(".pm").evaluate_all("(ns) => ns.map((n) => n.title)") == [
        "standard error"]
    assert block.locator('[data-label="stderr"]').get_attribute("title") == "± one standard error"
    assert block.locator('[data-label="trend"]').inner_text().startswith(
        "mean estimate (g) and 95% interval per window")

    radius = term_text(board, "accel_polar", "mean-estimate", "radius")
    assert re.fullmatch(rf"{NUMBER} ± {NUMBER} g \(s\.e\.\)", radius), radius
    for name, block_name in (("accel_polar", "angle"), ("roll", None)):
        angle = term_text(board, name, "circular-mean", block_name)
        assert re.fullmatch(rf"{NUMBER} ± {NUMBER} rad \(95% half-width\) "
                            rf"\({NUMBER}° ± {NUMBER}°\)", angle), angle
        assert re.fullmatch(rf"\[{NUMBER}, {NUMBER}\] rad",
                            term_text(board, name, "direction-low", block_name))
        assert term_text(board, name, "circular-std", block_name).endswith(" rad")
        # the resultant length has no unit; its ± is a standard error
        length = term_text(board, name, "resultant-estimate", block_name)
        assert re.fullmatch(rf"{NUMBER} ± {NUMBER} \(s\.e\.\) \(raw {NUMBER}\)", length), length
    angle_block = page.locator('[data-channel="accel_polar"] [data-block="angle"]')
    assert angle_block.locator(".pm").first.get_attribute("title") == (
        "half-width of the 95% interval")
    assert "circular mean (rad) and 95% interval" in angle_block.locator(
        '[data-label="direction-trend"]').inner_text()
    assert term_text(board, "accel_polar", "mean-vector-magnitude").endswith(" g")
    assert term_text(board, "accel_polar", "mean-vector-direction").endswith(" rad")
    for axis in ("accel_x", "accel_y", "accel_z"):
        text = term_text(board, "accel", "mean-estimate", axis)
        assert re.fullmatch(rf"{NUMBER} ± {NUMBER} g \(s\.e\.\)", text), (axis, text)

    # A channel that names no unit shows none.
    source.add_channel("humidity")
    page.wait_for_selector('[data-channel="humidity"]', timeout=5000)
    assert term_text(board, "humidity", "mean-estimate") == "– ± – (s.e.)"
    assert term_text(board, "humidity", "ci-low") == "[–, –]"
    assert page.locator('[data-channel="humidity"] [data-unit]').count() == 0
    assert page.locator('[data-channel="accel_x"] [data-unit="g"]').count() >= 6
    assert board.problems == []


# Records every text drawn on a canvas (axis labels are not in the DOM).
RECORD_CANVAS_TEXT = """
window.__canvasTexts = [];
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
  window.__canvasTexts.push(String(text));
  return fillText.call(this, text, ...rest);
};"""
EXPONENT = re.compile(r"\d[eE][+−-]?\d")


def linear_channel_with(estimate: float, stderr: float, unit: str | None) -> dict:
    channel = empty_linear_channel()
    channel.update(unit=unit, count=1000, messages=20, agents=3)
    channel["mean"].update(estimate=estimate, stderr=stderr, raw=2 * estimate,
                           ci95=[estimate - 1.96 * stderr, estimate + 1.96 * stderr],
                           method="inversion", bias_bound=stderr / 100)
    channel["quantiles"] = {q: estimate * (1 + float(q) / 10) for q in channel["quantiles"]}
    return channel


def test_numbers_are_plain_decimals_never_exponents(browser, source):
    source.add_channel("tiny", linear_channel_with(-6.788e-4, 1.234e-5, "Pa"))
    source.add_channel("huge", linear_channel_with(1.2e7, 3.4e5, None))
    source.step()  # a window of history for both
    web = serve(source)
    board = Dashboard(browser, web, init_script=RECORD_CANVAS_TEXT)
    try:
        page = board.page
        wait_trends(page, served_trends(web))  # histories loaded and drawn
        assert board.text(card("tiny", "mean-estimate")) == "−0.0006788"
        assert board.text(card("tiny", "stderr")) == "0.00001234"
        assert board.text(card("tiny", "ci-low")) == shown(-6.788e-4 - 1.96 * 1.234e-5)
        assert shown(-6.788e-4 - 1.96 * 1.234e-5) == "−0.000703"
        assert board.text(card("tiny", "bias-bound")) == "0.0000001234"
        assert board.text(card("huge", "mean-estimate")) == "12,000,000"
        assert board.text(card("huge", "stderr")) == "340,000"
        assert board.text(card("huge", "ci-low")) == "11,330,000"
        assert board.text(card("huge", "mean-raw")) == "24,000,000"
        assert term_text(board, "tiny", "mean-estimate") == "−0.0006788 ± 0.00001234 Pa (s.e.)"

        body = page.inner_text("body")
        assert not EXPONENT.search(body), EXPONENT.search(body)
        assert "-0" not in body and "−0.0006788" in body  # one minus sign, the true one
        for title in page.eval_on_selector_all("[title]", "(ns) => ns.map((n) => n.title)"):
            assert not EXPONENT.search(title), title
        texts = page.evaluate("window.__canvasTexts")
        assert texts and not [t for t in texts if EXPONENT.search(t)]
        assert any(re.fullmatch(r"−0\.000\d+ Pa", t) for t in texts), texts  # the trend axis
        assert any(re.fullmatch(r"1\d,\d{3},\d{3}", t) for t in texts), texts
        assert board.problems == []
    finally:
        board.close()
        web.stop()


# Counts what app.js starts that would keep a page busy: timers and event streams.
COUNT_TIMERS = """
window.__started = {setTimeout: 0, setInterval: 0, EventSource: 0};
const fromApp = () => String(new Error().stack).includes("/static/app.js");
for (const name of ["setTimeout", "setInterval"]) {
  const real = window[name];
  window[name] = function (...args) {
    if (fromApp()) window.__started[name] += 1;
    return real.apply(this, args);
  };
}
const RealEventSource = window.EventSource;
window.EventSource = function (...args) {
  window.__started.EventSource += 1;
  return new RealEventSource(...args);
};"""
READY = "() => document.documentElement.dataset.state === 'ready'"


def test_the_static_view_fetches_once_and_says_when_it_is_done(browser, source):
    source.step()
    source.step()
    web = serve(source)
    board = Dashboard(browser, web, init_script=COUNT_TIMERS, path="/?static=1", wait=False)
    try:
        page = board.page
        page.wait_for_function(READY, timeout=10000)
        channels = strict_json(request(web, "GET", "/api/channels")[2])["channels"]
        connection = board.text('[data-stat="connection"]')
        assert re.fullmatch(r"static view as of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", connection)
        assert page.get_attribute('[data-stat="connection"]', "data-state") == "static"
        assert_shows(board, card("accel_x", "mean-estimate"),
                     channels["accel_x"]["mean"]["estimate"])
        assert_shows(board, card("roll", "circular-mean"), channels["roll"]["circular_mean"])
        assert_shows(board, card("accel", "mean-estimate", "accel_z"),
                     channels["accel"]["axes"]["accel_z"]["mean"]["estimate"])
        assert page.evaluate(TRENDS_ARE, served_trends(web))  # the past, already drawn
        assert all(chart["ink"] > 50 for chart in page.evaluate(CANVAS_STATE))

        # Fetched once, no event stream, no timer: nothing keeps the page (or a
        # headless browser's virtual time) busy.
        api = sorted(url.removeprefix(web.url) for url in board.requests if "/api/" in url)
        assert api == sorted(["/api/channels"] + [f"/api/channels/{n}/history" for n in CHARTED])
        assert web.active_streams == 0
        assert page.evaluate("window.__started") == {"setTimeout": 0, "setInterval": 0,
                                                     "EventSource": 0}
        assert page.get_attribute('[data-link="view"]', "href") == "."
        assert board.problems == []
    finally:
        board.close()
        web.stop()


def test_the_live_page_links_to_the_static_view_and_streams(dashboard, server):
    page = dashboard.page
    assert page.get_attribute('[data-link="view"]', "href") == "?static=1"
    assert page.evaluate("document.documentElement.dataset.state") is None
    assert any(url.endswith("/api/events") for url in dashboard.requests)
    assert wait_until(lambda: server.active_streams == 1, timeout=5)


def test_the_static_view_says_why_it_could_not_load(browser):
    web = serve(FlakySource(FakeSource()))
    board = Dashboard(browser, web, path="/?static=1", wait=False)
    try:
        page = board.page
        page.wait_for_function("() => document.documentElement.dataset.state === 'error'",
                               timeout=10000)
        connection = board.text('[data-stat="connection"]')
        assert connection.startswith("could not load the collector's data"), connection
        assert "HTTP 503 the aggregates could not be computed" in connection
        assert page.get_attribute('[data-stat="connection"]', "data-state") == "error"
        assert page.locator("#empty").is_visible()
        assert "HTTP 503" in board.text("#empty")
        assert "connecting" not in page.inner_text("body")
        assert not any("/api/events" in url for url in board.requests)
        assert web.active_streams == 0
        # Only the refused document itself is reported (by Chromium, as a console error).
        assert board.problems and all("503" in p for p in board.problems), board.problems
    finally:
        board.close()
        web.stop()


def test_a_headless_screenshot_of_the_static_view_finishes(source, tmp_path):
    """Chromium's --virtual-time-budget waits for the page to go idle: a page with an
    event stream never does; the static view must."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}")
    source.step()
    web = serve(source)
    shot = tmp_path / "shot.png"
    command = [CHROMIUM, "--headless", *CHROMIUM_ARGS, "--disable-crash-reporter",
               "--virtual-time-budget=5000",
               f"--screenshot={shot}", "--window-size=1280,2000",
               f"--user-data-dir={tmp_path / 'profile'}", f"{web.url}/?static=1"]
    # Its own process group: Chromium's helper processes are ended with it.
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr.decode(errors="replace")[-3000:]
        png = shot.read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, len(png)
        width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
        assert (width, height) == (1280, 2000)
        assert web.active_streams == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        web.stop()
