"""Helpers of the tests of the collector's HTTP API and dashboard (tests/collector/api/):
HTTP requests and event streams against a real WebServer, sources that fail or serve
NaN, the dashboard as a page in headless Chromium, and what it shows."""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
from decimal import Decimal

from collector.api.documents import Capture, Documents
from collector.api.server import WebServer
from tests.support.ports import HANG_GUARD_SECONDS

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
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD_SECONDS)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read())
    finally:
        conn.close()


def raw_exchange(server: WebServer, data: bytes) -> bytes:
    """Send bytes on a fresh connection; whatever comes back until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_SECONDS) as sock:
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

    def __init__(self, server: WebServer, timeout: float = HANG_GUARD_SECONDS):
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


def serve(source, **kwargs) -> WebServer:
    """A started WebServer of ``source`` on a free loopback port (``PUSH`` by default)."""
    return WebServer(source, host="127.0.0.1", port=0, **{"push_seconds": PUSH, **kwargs}).start()


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


class Dashboard:
    """A page on the dashboard that records every console error, page error,
    failed request and HTTP error."""

    def __init__(self, browser, server: WebServer, *, init_script: str | None = None,
                 block_events: bool = False, path: str = "/", wait: bool = True,
                 context_options: dict | None = None, fake_clock: bool = False):
        """``wait``: until the first document is shown.  ``context_options``: more options
        of the browser context (e.g. ``timezone_id``); ``fake_clock``: the page's timers
        run on Playwright's clock (``page.clock.fast_forward``), from now."""
        self.context = browser.new_context(
            **{"viewport": {"width": 1280, "height": 900}, **(context_options or {})})
        if fake_clock:
            self.context.clock.install()
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

    def wait_updates(self, n: int, timeout: float = HANG_GUARD_SECONDS) -> None:
        # A function, not an expression string: the page's CSP forbids eval.
        self.page.wait_for_function("(n) => Number(document.body.dataset.updated) >= n",
                                    arg=n, timeout=timeout * 1000)

    def text(self, selector: str) -> str:
        locator = self.page.locator(selector)
        assert locator.count() == 1, f"{selector}: {locator.count()} elements"
        return locator.inner_text().strip()

    def close(self) -> None:
        self.context.close()


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


def shown(x: float) -> str:
    """``x`` as app.js's fmt writes it: 4 significant digits in plain decimal (never an
    exponent), thousands grouped, a true minus sign (for the titles)."""
    if x == 0:
        return "0"
    text = f"{Decimal(f'{x:.3e}').normalize():,f}"
    return text.replace("-", "\u2212")


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
