"""The dashboard's charts over time from the server's history, units and what ± is,
plain decimals, and the static view (in Chromium)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import struct
import subprocess

import pytest

from collector.api.server import WebServer
from tests.support import wait_until
from tests.support.fake_source import FakeSource, empty_linear_channel
from tests.support.ports import HANG_GUARD_MS, HANG_GUARD_SECONDS
from tests.support.web import (
    CANVAS_STATE,
    CHROMIUM,
    CHROMIUM_ARGS,
    Dashboard,
    FlakySource,
    assert_shows,
    card,
    request,
    serve,
    shown,
    strict_json,
)

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
    page.wait_for_selector('[data-channel="humidity"]', timeout=HANG_GUARD_MS)
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
        page.wait_for_function(READY, timeout=HANG_GUARD_MS)
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
                               timeout=HANG_GUARD_MS)
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
        process.wait(timeout=HANG_GUARD_SECONDS)
        web.stop()
