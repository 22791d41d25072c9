"""The collector's HTTP API (docs/API.md) and dashboard, against a real
WebServer on a free port fed by FakeSource, and the dashboard in a real
headless Chromium."""

from __future__ import annotations

import http.client
import importlib.resources
import json
import math
import os
import re
import socket
import threading
import time
import tomllib
from fnmatch import fnmatch

import pytest

from collector.web import WebServer, json_safe
from tests.support import REPO, wait_until

from .fake_source import FakeSource

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
            line = self.response.fp.readline()
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
    """A source that raises while ``failing`` is set."""

    def __init__(self, inner):
        self.inner = inner
        self.failing = True

    def _check(self):
        if self.failing:
            raise RuntimeError("engine exploded")

    def channels_json(self):
        self._check()
        return self.inner.channels_json()

    def channel_json(self, name):
        self._check()
        return self.inner.channel_json(name)

    def metrics_text(self):
        self._check()
        return self.inner.metrics_text()


class NanSource:
    def channels_json(self):
        return {"fleet": "nan", "t": float("nan"), "agents_online": 0, "agents": {},
                "ingest": {"messages": 0, "values": 0, "duplicates": 0, "rejects": {}},
                "channels": {"a": {"kind": "linear", "count": 0,
                                   "mean": {"estimate": float("inf"), "stderr": float("nan"),
                                            "ci95": [float("-inf"), float("nan")],
                                            "raw": 1.5}}}}

    def channel_json(self, name):
        return {"kind": "linear", "mean": {"estimate": float("nan")}, "windows": []}

    def metrics_text(self):
        return "ldp_agents_online 0\n"


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
    assert headers["content-type"] == "text/plain; version=0.0.4"
    text = body.decode()
    for metric in ("ldp_ingest_messages_total", "ldp_ingest_values_total",
                   "ldp_ingest_duplicates_total", 'ldp_ingest_rejects_total{reason="schema"}',
                   "ldp_agents_online", 'ldp_channel_count{channel="accel_x"}',
                   'ldp_channel_mean_estimate{channel="accel_x"}',
                   'ldp_channel_mean_stderr{channel="accel_x"}',
                   'ldp_channel_resultant_length{channel="roll"}'):
        assert re.search(rf"^{re.escape(metric)} \S+$", text, re.M), metric


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
    "/static/../web.py",
    "/static/%2e%2e/web.py",
    "/static/..%2fweb.py",
    "/static/..%2F__init__.py",
    "/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
    "/static/..%5cweb.py",
    "/static//etc/passwd",
    "/static/%2fetc%2fpasswd",
    "/static/.",
    "/static/..",
    "/../collector/web.py",
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
    (b"GET /api/channels HTTP/9.9\r\n\r\n", b"505"),
    (b"GET " + b"/x" * 40000 + b" HTTP/1.1\r\n\r\n", b"414"),
    (b"\x00\xff\xfe\r\n\r\n", b"400"),
    (b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
    (b"GET /api/%ff%fe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"404"),
    # http.server tolerates a malformed header line; what matters is surviving it.
    (b"GET /api/channels HTTP/1.1\r\nBad Header Line\r\nConnection: close\r\n\r\n", b"200"),
])
def test_bad_requests_get_an_answer_and_the_server_survives(server, data, status, capfd):
    answer = raw_exchange(server, data)
    assert re.match(rb"HTTP/1\.[01] " + status + rb" ", answer), answer[:200]
    assert request(server, "GET", "/api/channels")[0] == 200
    assert capfd.readouterr().err == ""  # no tracebacks, no access log


def test_a_refused_request_with_a_large_body_still_gets_its_answer(server):
    body = b"x" * 300_000
    head = f"POST /api/channels HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head.encode() + body)  # completes only if the server reads the body away
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 405 ")


def test_no_access_log_on_stderr(server, capfd):
    for path in ("/", "/static/app.js", "/api/channels", "/nope", "/metrics"):
        request(server, "GET", path)
    request(server, "POST", "/api/channels")
    assert capfd.readouterr().err == ""


# -- a failing source -----------------------------------------------------------------------------

def test_failing_source_gives_500_and_the_server_keeps_serving(source, caplog):
    flaky = FlakySource(source)
    web = serve(flaky)
    try:
        with caplog.at_level("ERROR", logger="collector.web"):
            for path in ("/api/channels", "/api/channels/roll", "/metrics"):
                status, headers, body = request(web, "GET", path)
                assert status == 500, path
                assert headers["content-type"] == "application/json"
                assert strict_json(body) == {"error": "internal error"}
        assert sum("engine exploded" in (r.exc_text or "") or r.exc_info is not None
                   for r in caplog.records) >= 3
        assert request(web, "GET", "/")[0] == 200
        flaky.failing = False
        status, _, body = request(web, "GET", "/api/channels")
        assert status == 200 and strict_json(body)["fleet"] == "demo"
    finally:
        web.stop()


def test_event_stream_survives_a_failing_source(source, caplog):
    flaky = FlakySource(source)
    web = serve(flaky)
    try:
        reader = EventReader(web)
        with caplog.at_level("ERROR", logger="collector.web"):
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
    monkeypatch.setattr("collector.web.KEEPALIVE_SECONDS", 0.1)
    web = serve(source, push_seconds=60)
    try:
        started = time.monotonic()
        reader = EventReader(web)
        name, _ = reader.read_event()
        assert name == "channels"
        assert time.monotonic() - started < 1.5
        lines = [reader.response.fp.readline() for _ in range(4)]
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
            while reader.response.fp.readline():
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


# -- package data ---------------------------------------------------------------------------------

def test_static_files_are_package_data():
    static = importlib.resources.files("collector").joinpath("static")
    names = {"index.html", "app.js", "style.css"}
    for name in names:
        assert static.joinpath(name).is_file(), name
    # ... and pyproject ships every file of the directory in the wheel.
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["collector"]
    for name in names:
        assert any(fnmatch(f"static/{name}", pattern) for pattern in patterns), name


def test_dashboard_loads_nothing_from_elsewhere():
    static = importlib.resources.files("collector").joinpath("static")
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
                 block_events: bool = False):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        if init_script:
            self.context.add_init_script(init_script)
        self.page = self.context.new_page()
        self.problems: list[str] = []
        page = self.page
        page.on("console", lambda m: m.type in ("error", "warning")
                and self.problems.append(f"console {m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url} {r.failure}"))
        page.on("response", lambda r: r.status >= 400
                and self.problems.append(f"HTTP {r.status}: {r.url}"))
        if block_events:
            page.route("**/api/events", lambda route: route.abort())
        page.goto(server.url + "/")
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

    def circular(name, block, stats):
        assert_shows(board, card(name, "circular-mean", block), stats["circular_mean"])
        assert_shows(board, card(name, "resultant-estimate", block),
                     stats["resultant_length"]["estimate"])
        assert_shows(board, card(name, "resultant-raw", block), stats["resultant_length"]["raw"])
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
        # accel_x: trend + histogram; roll: rose; polar: 2 + rose; vector: 3 axes x 2
        assert len(charts) == 2 + 1 + 3 + 6
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
