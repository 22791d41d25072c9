"""The dashboard's view controls in Chromium, over a real SQLite results store: the
resolution and time range of every chart over time, the 95% interval as a band, windows
with too few reports marked (not drawn as measurements), the server's message when a query
fails, the periodic refresh (not in a background tab) and the way back to the live view."""

from __future__ import annotations

from datetime import UTC as TZ_UTC
from datetime import datetime
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from collector.api.server import WebServer
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM, PolarOGPM, UnbiasedOGPM
from edge_agent.mechanisms.categorical import ORACLES
from tests.collector.api.test_dashboard_history import COUNT_TIMERS, READY
from tests.support.ports import HANG_GUARD_MS
from tests.support.results import HOUR, RecordedFleet
from tests.support.web import Dashboard, request, strict_json

T0 = 1_699_920_000.0  # 2023-11-14 00:00 UTC, a day's start
HOURS = 6
LINEAR = ClassicalOGPM(epsilon=2.0, low=0.0, high=1.0)
HEART = ClassicalOGPM(epsilon=1.0, low=40.0, high=200.0)
CIRCULAR = CircularOGPM(epsilon=2.0, period=360.0)
POLAR = PolarOGPM(epsilon=4.0, radius_max=2.0)
AXES = UnbiasedOGPM(epsilon=1.0, low=-1.0, high=1.0)
GRR = ORACLES["grr"](epsilon=2.0, categories=3, labels=("sit", "walk", "run"))
UTC = {"timezone_id": "UTC"}  # what the custom range's inputs mean
RESOLUTION = '#view [data-control="resolution"]'
RANGE = '#view [data-control="range"]'
FROM = '#view [data-control="from"]'
TO = '#view [data-control="to"]'


class Fleet(RecordedFleet):
    """An ingestor with stored windows and a clock, served with a results store."""

    def __init__(self, path):
        super().__init__(path)
        self.rng = np.random.default_rng(8)
        self.seq = 0
        self.now = T0 + HOURS * HOUR
        for t in np.arange(T0, self.now, 600.0).tolist():
            self.report(t, hour=int((t - T0) // HOUR))
        self.record(before=self.now - HOUR)
        self.serve(lambda: self.now)

    def send(self, channel, kind, t, codes, mechanism, **extra) -> None:
        super().send("w1", channel, kind, self.seq, t, codes, mechanism, **extra)

    def report(self, t: float, hour: int) -> None:
        """A report of every channel at ``t``: x's mean follows the hour; hr has 5 readings
        a report for three hours (too few, a minute or an hour of them), then 2,000."""
        rng = self.rng
        self.send("x", "linear", t, LINEAR.perturb_codes(np.full(400, 0.2 + 0.05 * hour),
                                                         rng).tolist(), LINEAR)
        readings = rng.normal(70, 5, 5 if hour < 3 else 2000).clip(40, 200)
        self.send("hr", "linear", t, HEART.perturb_codes(readings, rng).tolist(), HEART)
        self.send("yaw", "circular", t, CIRCULAR.perturb_codes(rng.normal(90, 10, 200) % 360,
                                                               rng).tolist(), CIRCULAR)
        radius, angle = POLAR.perturb_codes(rng.uniform(0.5, 1.5, 200),
                                            rng.normal(1.0, 0.3, 200), rng)
        self.send("wind", "polar", t, [radius.tolist(), angle.tolist()], POLAR)
        self.send("acc", "vector", t,
                  [AXES.perturb_codes(rng.uniform(-0.5, 0.5, 200), rng).tolist()
                   for _ in range(2)], AXES,
                  fields=["ax", "ay"], strategy={"k": 2, "d": 2, "epsilon": 2.0})
        self.send("activity", "categorical", t,
                  GRR.perturb(rng.integers(0, 3, 200), rng).tolist(), GRR)
        self.seq += 1


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("results") / "results.sqlite")
    yield fleet
    fleet.close()


@pytest.fixture
def board(browser, fleet):
    board = Dashboard(browser, fleet.web, context_options=UTC)
    yield board
    board.close()


# -- what the page shows, what the server says -----------------------------------------------

# Every chart over time: its card, block and what its canvas and label say.
CHARTS = """() => [...document.querySelectorAll("canvas.trend")].map((c) => {
  const card = c.closest("[data-channel]");
  const block = c.closest("[data-block]");
  const choice = block.querySelector('[data-control="category"]');
  return {channel: card.dataset.channel, block: block.dataset.block, chart: c.dataset.chart,
          mode: card.dataset.mode, points: Number(c.dataset.points),
          first: c.dataset.first === "" ? null : Number(c.dataset.first),
          last: c.dataset.last === "" ? null : Number(c.dataset.last),
          tooFew: Number(c.dataset.tooFew), bandPoints: Number(c.dataset.bandPoints),
          bands: Number(c.dataset.bands),
          category: choice ? Number(choice.value) : null,
          label: block.querySelector(`[data-label="${c.dataset.chart}"]`).textContent};
})"""

# True once every card with charts over time is in `mode` and `state` (data-history).
CARDS_ARE = """([mode, state]) => {
  const cards = [...document.querySelectorAll("[data-channel]")]
    .filter((card) => card.querySelector("canvas.trend"));
  return cards.length > 0
    && cards.every((card) => card.dataset.mode === mode && card.dataset.history === state);
}"""

# Records the URL of every history query the page asks (synchronously, unlike the
# browser's request events), and app.js's timers: their delay, and whether each fired or
# was cleared (Playwright's clock runs due callbacks after fast_forward returns: a test
# waits for a timer to have fired before it checks what the timer did not do).
RECORD_QUERIES = """
window.__queries = [];
const realFetch = window.fetch;
window.fetch = function (url, ...rest) {
  if (String(url).includes("/history?")) window.__queries.push(String(url));
  return realFetch.call(this, url, ...rest);
};
window.__timers = [];
const fromApp = () => String(new Error().stack).includes("/static/app.js");
const realSetTimeout = window.setTimeout;
const realClearTimeout = window.clearTimeout;
window.setTimeout = function (fn, ms, ...rest) {
  if (!fromApp()) return realSetTimeout.call(this, fn, ms, ...rest);
  const timer = {ms, state: "pending"};
  window.__timers.push(timer);
  timer.id = realSetTimeout.call(this, (...args) => {
    timer.state = "fired";
    return fn(...args);
  }, ms, ...rest);
  return timer.id;
};
window.clearTimeout = function (id) {
  for (const timer of window.__timers) {
    if (timer.id === id && timer.state === "pending") timer.state = "cleared";
  }
  return realClearTimeout.call(this, id);
};"""
# app.js's pending timers' delays, and how many have fired.
PENDING = "() => window.__timers.filter((t) => t.state === 'pending').map((t) => t.ms)"
FIRED = "() => window.__timers.filter((t) => t.state === 'fired').length"
HIDE = """(hidden) => {
  Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
  document.dispatchEvent(new Event("visibilitychange"));
}"""

KINDS = {  # per kind: (block, the block's part of a point, whether the block is a direction)
    "linear": [("value", lambda p: p, False)],
    "circular": [("value", lambda p: p, True)],
    "polar": [("radius", lambda p: p["radius"], False), ("angle", lambda p: p["angle"], True)],
    "vector": [("ax", lambda p: p["axes"]["ax"], False), ("ay", lambda p: p["axes"]["ay"], False)],
    "categorical": [("frequencies", lambda p: p, None)],
}


def has_interval(part: dict, direction: bool | None, category: int | None) -> bool:
    if direction is None:  # a category's share
        interval = part["frequencies"]["ci95"][category]
    elif direction:
        return part["half_width"] is not None
    else:
        interval = part["mean"]["ci95"]
    return interval is not None and None not in interval


def expected(document: dict, charts: list[dict]) -> dict:
    """Per block of the channel: the windows, their first and last start, the windows with
    too few reports, and the measured windows with an interval (the band's)."""
    points = document["points"]
    category = {c["block"]: c["category"] for c in charts}
    want = {}
    for block, part, direction in KINDS[document["kind"]]:
        measured = [p for p in points if not p.get("too_few", False)]
        want[block] = {
            "points": len(points),
            "first": points[0]["start"] if points else None,
            "last": points[-1]["start"] if points else None,
            "tooFew": len(points) - len(measured),
            "bandPoints": sum(has_interval(part(p), direction, category.get(block))
                              for p in measured)}
    return want


def shown_charts(board: Dashboard) -> dict[str, list[dict]]:
    charts: dict[str, list[dict]] = {}
    for chart in board.page.evaluate(CHARTS):
        charts.setdefault(chart["channel"], []).append(chart)
    return charts


def history_queries(board: Dashboard) -> dict[str, str]:
    """The latest history query of each channel the page asked (path and query)."""
    found = {}
    for url in board.requests:
        parts = urlsplit(url)
        if parts.path.endswith("/history") and parts.query:
            found[parts.path.split("/")[-2]] = f"{parts.path}?{parts.query}"
    return found


def assert_charts_match(board: Dashboard, web: WebServer, paths: dict[str, str]) -> dict:
    """Every chart shows what the server answers to ``paths`` (per channel); the answers."""
    answers = {}
    for channel, charts in shown_charts(board).items():
        status, _, body = request(web, "GET", paths[channel])
        assert status == 200, (channel, body)
        answers[channel] = document = strict_json(body)
        want = expected(document, charts)
        assert {c["block"] for c in charts} == set(want), (channel, charts)
        for chart in charts:
            block = want[chart["block"]]
            assert {key: chart[key] for key in block} == block, (channel, chart, block)
            # A band wherever there are measured windows with intervals: polygons drawn.
            assert (chart["bands"] > 0) == (block["bandPoints"] > 0), (channel, chart)
    return answers


def choose(board: Dashboard, resolution: str | None = None, range_: str | None = None) -> None:
    if resolution is not None:
        board.page.select_option(RESOLUTION, resolution)
    if range_ is not None:
        board.page.select_option(RANGE, range_)


def wait_cards(board: Dashboard, mode: str, state: str) -> None:
    board.page.wait_for_function(CARDS_ARE, arg=[mode, state], timeout=HANG_GUARD_MS)


def minute(t: float) -> str:
    return datetime.fromtimestamp(t, TZ_UTC).strftime("%Y-%m-%d %H:%M")


def local_input(t: float) -> str:
    return datetime.fromtimestamp(t, TZ_UTC).strftime("%Y-%m-%dT%H:%M")


def only_refused_queries(problems: list[str]) -> bool:
    """Problems of queries the server refused (400), as the page and Chromium report them."""
    return bool(problems) and all("400" in problem for problem in problems)


# -- the tests ------------------------------------------------------------------------------------

def test_the_controls_list_the_resolutions_and_the_page_starts_live(board, fleet):
    page = board.page
    assert page.locator("#view").is_visible()
    options = page.eval_on_selector_all(
        f"{RESOLUTION} option", "(os) => os.map((o) => [o.value, o.textContent])")
    assert options == [["1m", "1m (finest)"], ["1h", "1h"], ["1d", "1d"]]
    for channel in strict_json(request(fleet.web, "GET", "/api/channels")[2])["channels"].values():
        assert channel["resolutions"] == ["1m", "1h", "1d"]
    ranges = page.eval_on_selector_all(f"{RANGE} option", "(os) => os.map((o) => o.value)")
    assert ranges == ["live", "hour", "day", "week", "month", "custom"]
    # Every control has its label (the category's of the share-over-time chart too).
    labels = page.eval_on_selector_all(
        "select, input", "(ns) => ns.map((n) => [n.dataset.control, n.labels.length, "
                         "n.labels.length ? n.labels[0].textContent.trim().split(' ')[0] : ''])")
    assert sorted(labels) == sorted([["resolution", 1, "resolution"], ["range", 1, "time"],
                                     ["from", 1, "from"], ["to", 1, "to"],
                                     ["category", 1, "share"]]), labels
    assert board.text('#view [data-stat="view"]').startswith("live:")
    assert not page.locator('#view [data-control="custom"]').is_visible()

    # Live: the live history of every channel, every kind with its chart over time.
    wait_cards(board, "live", "live")
    paths = {name: f"/api/channels/{name}/history"
             for name in ("x", "hr", "yaw", "wind", "acc", "activity")}
    page.wait_for_function(
        """(n) => [...document.querySelectorAll("canvas.trend")]
             .every((c) => Number(c.dataset.points) > 0) && document.querySelectorAll(
             "canvas.trend").length === n""", arg=8, timeout=HANG_GUARD_MS)
    answers = assert_charts_match(board, fleet.web, paths)
    charts = shown_charts(board)
    # hr: a minute of its first three hours has too few reports, of the last three not;
    # acc: every minute of each axis has too few, and the charts say so in words.
    assert 0 < charts["hr"][0]["tooFew"] < charts["hr"][0]["points"]
    assert "with too few reports (hollow markers" in charts["hr"][0]["label"]
    assert sum(p.get("too_few", False) for p in answers["hr"]["points"]) \
        == charts["hr"][0]["tooFew"]
    for axis in charts["acc"]:
        assert axis["tooFew"] == axis["points"] > 0 and axis["bands"] == 0, axis
        assert "too few reports in every window" in axis["label"], axis
    assert charts["x"][0]["tooFew"] == 0 and charts["x"][0]["bands"] >= 1
    assert page.get_attribute('[data-link="view"]', "href") == "?static=1"
    assert board.problems == []


def test_an_hourly_range_shows_the_stored_hours_with_bands_and_too_few_marks(board, fleet):
    page = board.page
    choose(board, "1h", "day")
    wait_cards(board, "query", "ready")
    paths = history_queries(board)
    assert set(paths) == {"x", "hr", "yaw", "wind", "acc", "activity"}
    query = parse_qs(urlsplit(paths["x"]).query)
    assert query["resolution"] == ["1h"]
    start, end = float(query["start"][0]), float(query["end"][0])
    t = strict_json(request(fleet.web, "GET", "/api/channels")[2])["t"]
    assert (start, end) == (t - 86400, t)  # the last day before the collector's time

    answers = assert_charts_match(board, fleet.web, paths)
    hours = answers["x"]["points"]
    assert len(hours) == HOURS and answers["x"]["window_seconds"] == HOUR
    assert [p["start"] for p in hours] == [T0 + HOUR * h for h in range(HOURS)]
    charts = shown_charts(board)
    # Every chart over time has its band; hr's first hours are too few, marked, off the line.
    assert all(c["bands"] >= 1 and c["bandPoints"] > 0 for cs in charts.values() for c in cs)
    few = sum(p.get("too_few", False) for p in answers["hr"]["points"])
    assert 0 < few < HOURS and charts["hr"][0]["tooFew"] == few
    assert f"; ○ {few} window{'s' if few > 1 else ''} with too few reports" \
        in charts["hr"][0]["label"]
    assert charts["x"][0]["tooFew"] == 0 and "too few" not in charts["x"][0]["label"]
    assert f"{minute(start)} – {minute(end)} ({HOURS} windows of 1h)" in charts["x"][0]["label"]

    assert board.text('#view [data-stat="view"]') == (
        "1h windows, last day, asked again every 30 s")
    assert page.evaluate("window.location.search") == "?resolution=1h&range=day"
    assert page.get_attribute('[data-link="view"]', "href") == (
        "?static=1&resolution=1h&range=day")
    assert page.locator('[data-stat="history-error"]:visible').count() == 0
    assert board.problems == []


def test_a_custom_range_and_the_servers_message_when_a_query_fails(board, fleet):
    page = board.page
    choose(board, "1h", "custom")
    assert page.locator('#view [data-control="custom"]').is_visible()
    # Prefilled: the day before the collector's time, to the minute.
    wait_cards(board, "query", "ready")
    page.fill(FROM, local_input(T0))
    page.fill(TO, local_input(T0 + 2 * HOUR))
    page.wait_for_function(
        """(n) => Number(document.querySelector('[data-channel="hr"] canvas.trend')
                   .dataset.points) === n""", arg=2, timeout=HANG_GUARD_MS)
    wait_cards(board, "query", "ready")
    paths = history_queries(board)
    query = parse_qs(urlsplit(paths["hr"]).query)
    assert (float(query["start"][0]), float(query["end"][0])) == (T0, T0 + 2 * HOUR)
    assert_charts_match(board, fleet.web, paths)
    hr = shown_charts(board)["hr"][0]
    # Both hours of hr have too few reports: no measurement, and the chart says so.
    assert hr["tooFew"] == hr["points"] == 2 and hr["bands"] == 0
    assert "too few reports in every window: no measurement to draw" in hr["label"]
    assert f"{minute(T0)} – {minute(T0 + 2 * HOUR)} (2 windows of 1h)" in hr["label"]
    assert board.text('#view [data-stat="view"]').startswith(
        f"1h windows, {minute(T0)} to {minute(T0 + 2 * HOUR)}")
    assert board.problems == []

    # From after to: the server refuses it, each card says why (no blank chart).
    page.fill(FROM, local_input(T0 + 5 * HOUR))
    wait_cards(board, "query", "error")
    errors = page.eval_on_selector_all('[data-stat="history-error"]:visible',
                                       "(ns) => ns.map((n) => n.textContent)")
    assert len(errors) == 6 and set(errors) == {
        "history query failed: HTTP 400 start: must be before end"}, errors
    assert page.get_attribute(TO, "aria-invalid") == "true"
    assert {c["points"] for cs in shown_charts(board).values() for c in cs} == {0}
    assert only_refused_queries(board.problems), board.problems

    # Minutes over 30 days: more windows than a query may span, as the server says.
    choose(board, "1m", "month")
    page.wait_for_function(
        """() => {
             const shown = [...document.querySelectorAll('[data-stat="history-error"]')]
               .filter((n) => !n.hidden);
             return shown.length === 6
               && shown.every((n) => n.textContent.includes("1m at once"));
           }""",
        timeout=HANG_GUARD_MS)
    wait_cards(board, "query", "error")
    error = board.text('[data-channel="x"] [data-stat="history-error"]')
    assert error == ("history query failed: HTTP 400 end: at most 10000 windows of 1m at once: "
                     "narrow start .. end, or ask a coarser resolution"), error
    assert only_refused_queries(board.problems), board.problems


def test_the_static_view_shows_the_view_of_its_url_and_starts_no_timer(browser, fleet):
    board = Dashboard(browser, fleet.web, init_script=COUNT_TIMERS, context_options=UTC,
                      path="/?static=1&resolution=1d&range=week", wait=False)
    try:
        page = board.page
        page.wait_for_function(READY, timeout=HANG_GUARD_MS)
        assert page.input_value(RESOLUTION) == "1d" and page.input_value(RANGE) == "week"
        assert all(c["mode"] == "query" for cs in shown_charts(board).values() for c in cs)
        paths = history_queries(board)
        answers = assert_charts_match(board, fleet.web, paths)
        assert [len(a["points"]) for a in answers.values()] == [1] * 6  # the day so far
        assert page.evaluate("window.__started") == {"setTimeout": 0, "setInterval": 0,
                                                     "EventSource": 0}
        assert board.text('#view [data-stat="view"]') == "1d windows, last week"
        assert page.get_attribute('[data-link="view"]', "href") == "?resolution=1d&range=week"
        assert board.problems == []
    finally:
        board.close()


def test_the_demos_link_opens_on_the_hours_up_to_the_one_under_way(browser, fleet):
    """`edge-collector demo` links the dashboard at ?resolution=1h (minutes are noise
    under a real guarantee): hourly windows, without a range (the server's recent
    ones, the hour under way last), asked again as the hour fills."""
    board = Dashboard(browser, fleet.web, context_options=UTC, path="/?resolution=1h")
    try:
        page = board.page
        assert page.input_value(RESOLUTION) == "1h" and page.input_value(RANGE) == "live"
        wait_cards(board, "query", "ready")
        paths = history_queries(board)
        query = parse_qs(urlsplit(paths["x"]).query)
        assert query == {"resolution": ["1h"]}, query
        answers = assert_charts_match(board, fleet.web, paths)
        assert answers["x"]["window_seconds"] == HOUR and len(answers["x"]["points"]) > 0
        assert board.text('#view [data-stat="view"]').startswith("1h windows")
        assert board.problems == []
    finally:
        board.close()


def test_a_query_is_asked_again_every_30_s_but_not_in_a_background_tab(browser, fleet):
    board = Dashboard(browser, fleet.web, init_script=RECORD_QUERIES, context_options=UTC,
                      fake_clock=True)
    try:
        page = board.page
        assert page.evaluate(PENDING) == []  # live: nothing to ask again
        choose(board, None, "hour")
        choose(board, "1h")
        wait_cards(board, "query", "ready")
        # 1m over the hour, then 1h: the 1m queries still waiting their turn are dropped.
        queries = page.evaluate("window.__queries")
        asked = len(queries)
        assert len([q for q in queries if "resolution=1h" in q]) == 6, queries
        assert 6 < asked <= 12, queries
        # From now on the page's time moves only when the test moves it.
        page.clock.pause_at(page.evaluate("Date.now()") / 1000 + 0.1)  # seconds, in Python
        assert page.evaluate(PENDING) == [30_000]  # one refresh, in 30 s

        def wait_asked(n: int) -> None:
            page.wait_for_function("(n) => window.__queries.length === n", arg=n,
                                   timeout=HANG_GUARD_MS)

        def after_a_refresh(fired: int) -> None:
            """Wait for the refresh timer to have run: what it asks, it asks in that task's
            microtasks, before this wait's next check (a task of its own) can see it."""
            page.wait_for_function(f"() => ({FIRED})() > {fired}", timeout=HANG_GUARD_MS)

        fired = page.evaluate(FIRED)
        page.clock.fast_forward(30_500)
        after_a_refresh(fired)
        wait_asked(asked + 6)
        t = strict_json(request(fleet.web, "GET", "/api/channels")[2])["t"]
        latest = parse_qs(urlsplit(page.evaluate("window.__queries.at(-1)")).query)
        assert latest["resolution"] == ["1h"]
        assert float(latest["end"][0]) == t and float(latest["start"][0]) == t - HOUR
        wait_cards(board, "query", "ready")
        assert page.evaluate(PENDING) == [30_000]  # and the next one

        # A background tab asks nothing; shown again, it asks at once.
        page.evaluate(HIDE, True)
        fired = page.evaluate(FIRED)
        page.clock.fast_forward(30_500)
        after_a_refresh(fired)
        assert page.evaluate("window.__queries.length") == asked + 6
        assert page.evaluate(PENDING) == []
        page.evaluate(HIDE, False)
        wait_asked(asked + 12)
        wait_cards(board, "query", "ready")
        assert page.evaluate(PENDING) == [30_000]

        # Back to the live view: no more queries, no timer.
        choose(board, None, "live")
        choose(board, "1m")
        wait_cards(board, "live", "live")
        assert page.evaluate(PENDING) == []
        after = page.evaluate("window.__queries.length")
        page.clock.fast_forward(61_000)
        assert page.evaluate(PENDING) == []
        assert page.evaluate("window.__queries.length") == after
        assert board.problems == []
    finally:
        board.close()


def test_back_to_the_finest_resolution_and_live_the_stream_extends_the_charts(board, fleet):
    page = board.page
    choose(board, "1h")  # the most recent hours (the server's default range)
    wait_cards(board, "query", "ready")
    paths = history_queries(board)
    assert parse_qs(urlsplit(paths["x"]).query) == {"resolution": ["1h"]}
    assert_charts_match(board, fleet.web, paths)
    assert board.text('#view [data-stat="view"]') == (
        "1h windows, the most recent, asked again every 30 s")

    choose(board, "1m")
    wait_cards(board, "live", "live")
    assert board.text('#view [data-stat="view"]').startswith("live:")
    assert page.evaluate("window.location.search") == ""
    live = {name: f"/api/channels/{name}/history" for name in paths}
    page.wait_for_function(  # the live history asked again, drawn
        """(n) => Number(document.querySelector('[data-channel="x"] canvas.trend')
                   .dataset.points) === n""",
        arg=len(strict_json(request(fleet.web, "GET", live["x"])[2])["points"]),
        timeout=HANG_GUARD_MS)
    assert_charts_match(board, fleet.web, live)
    before = shown_charts(board)["x"][0]

    # A report in a new minute: the next event's window extends the chart.
    start = fleet.now + 60
    fleet.report(start + 1, hour=HOURS)
    fleet.now = start + 2
    page.wait_for_function(
        """([n, last]) => {
             const c = document.querySelector('[data-channel="x"] canvas.trend');
             return Number(c.dataset.points) === n && Number(c.dataset.last) === last;
           }""", arg=[before["points"] + 1, start], timeout=HANG_GUARD_MS)
    assert board.problems == []
