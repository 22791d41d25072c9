"""The dashboard's mean of all wearers in Chromium: a channel whose wearers report under
guarantees of their own shows the fleet's mean over its strata (the API's fleet_mean),
its windows live (fleet_points, extended by every event) and from the results store
(series=fleet), over a real SQLite store and the real web server."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.collector.results.test_fleet_history import record_strata
from tests.support.ports import HANG_GUARD_MS
from tests.support.results import HOUR, RecordedFleet
from tests.support.web import Dashboard, assert_shows, request, strict_json

T0 = 1_699_920_000.0  # a day's start
HOURS = 4
FLEET_CHART = '[data-channel="x"] [data-block="fleet"] canvas.trend'


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Four hours of reports every 10 minutes from each wearer of test_fleet_history; the
    windows before the last hour in the store."""
    fleet = RecordedFleet(tmp_path_factory.mktemp("results") / "results.sqlite")
    now = T0 + HOURS * HOUR
    record_strata(fleet, T0, now)
    yield fleet.serve(lambda: now)
    fleet.close()


def chart_points(board: Dashboard) -> int:
    return int(board.page.get_attribute(FLEET_CHART, "data-points"))


def test_the_card_shows_the_mean_of_all_wearers_live_and_at_hours(browser, served):
    channel = strict_json(request(served, "GET", "/api/channels/x")[2])
    board = Dashboard(browser, served, context_options={"timezone_id": "UTC"})
    try:
        fleet = channel["fleet_mean"]
        assert_shows(board, '[data-channel="x"] [data-stat="fleet-estimate"]',
                     fleet["mean"]["estimate"])
        assert_shows(board, '[data-channel="x"] [data-stat="fleet-ci-low"]',
                     fleet["mean"]["ci95"][0])
        assert board.text('[data-channel="x"] [data-stat="fleet-strata"]') == \
            "ε 4: 3 wearers (75%); ε 1: 1 wearer (25%)"
        assert "in “all wearers” too: ε 1: 2,400 values" in \
            board.text('[data-channel="x"] [data-stat="other-series"]')
        # Live: the fleet's minutes the server keeps (the history's fleet_points).
        history = strict_json(request(served, "GET", "/api/channels/x/history")[2])
        board.page.wait_for_function(f"() => Number(document.querySelector('{FLEET_CHART}')"
                                     f".dataset.points) > 0", timeout=HANG_GUARD_MS)
        assert chart_points(board) == len(history["fleet_points"]) > 0
        # ... read from the channel's one history document, not fetched twice
        assert sum(url.endswith("/api/channels/x/history") for url in board.requests) == 1
        assert board.problems == []
    finally:
        board.close()
    board = Dashboard(browser, served, context_options={"timezone_id": "UTC"},
                      path="/?resolution=1h")
    try:  # Hours: the store's, asked with series=fleet
        board.page.wait_for_function(
            "() => document.querySelector('[data-channel=\"x\"]').dataset.history === 'ready'",
            timeout=HANG_GUARD_MS)
        asked = [parse_qs(urlsplit(url).query) for url in board.requests
                 if "/history?" in url and "series=fleet" in url]
        assert asked and asked[-1] == {"resolution": ["1h"], "series": ["fleet"]}
        answer = strict_json(request(served, "GET",
                                     "/api/channels/x/history?resolution=1h&series=fleet")[2])
        assert chart_points(board) == len(answer["points"]) == HOURS
        assert board.problems == []
    finally:
        board.close()
