"""The dashboard in a real headless Chromium: it loads cleanly, shows the API's numbers,
updates itself, falls back to polling, and shows range discovery's bounds."""

from __future__ import annotations

import dataclasses
import json

import pytest

from collector.api.documents import Capture, Documents
from tests.support.fake_source import FakeSource
from tests.support.ports import HANG_GUARD_MS
from tests.support.web import (
    CANVAS_STATE,
    Dashboard,
    assert_shows,
    card,
    request,
    serve,
    strict_json,
)

# -- the dashboard in Chromium --------------------------------------------------------------------

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
    # The most common promise in words, and how many agents state another.
    assert board.text('#fleet [data-stat="promise"]') == (
        "any 10 minutes: ε ≤ 4; any day: ε ≤ 120 (2 agents state another)")

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
        arg=[card("accel_x", "count"), new], timeout=HANG_GUARD_MS)
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
    broker.wait_for(timeout=HANG_GUARD_MS)
    assert broker.inner_text().startswith("disconnected since ")
    assert dashboard.problems == []


def test_a_channel_appearing_later_with_null_statistics(dashboard, source):
    source.add_channel("humidity")
    dashboard.page.wait_for_selector('[data-channel="humidity"]', timeout=HANG_GUARD_MS)
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
        page.wait_for_selector("#range:not([hidden])", timeout=HANG_GUARD_MS)

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
                               timeout=HANG_GUARD_MS)
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
            arg=[card("roll", "count"), new], timeout=HANG_GUARD_MS)
        assert_shows(board, card("roll", "circular-mean"),
                     source.channels_json()["channels"]["roll"]["circular_mean"])
        # Only the refused stream itself may be reported (Chromium logs it without its URL).
        expected = ("api/events", "net::ERR_FAILED") if how == "stream refused" else ()
        assert [p for p in board.problems if not any(e in p for e in expected)] == []
    finally:
        board.close()
