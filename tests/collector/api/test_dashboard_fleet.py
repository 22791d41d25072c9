"""The dashboard's mean of all wearers in Chromium: a channel whose wearers report under
guarantees of their own shows the fleet's mean over its strata (the API's fleet_mean),
its windows live (fleet_points, extended by every event) and from the results store
(series=fleet), over a real SQLite store and the real web server."""

from __future__ import annotations

import threading
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from collector.aggregation.ingest import Ingestor
from collector.api.documents import Views
from collector.api.server import WebServer
from collector.results.query import HistoryQuery
from collector.results.recorder import ResultsRecorder
from collector.results.sqlite import SqliteResultsStore
from edge_agent import protocol
from edge_agent.mechanisms import linear_mechanism
from tests.support.ports import HANG_GUARD_MS
from tests.support.web import Dashboard, assert_shows, request, strict_json

FLEET = "demo"
HOUR = 3600.0
T0 = 1_699_920_000.0  # a day's start
HOURS = 4
STUDY = linear_mechanism("pm-c", epsilon=4.0, low=0.0, high=1.0, grid_bits=16)
STRICT = linear_mechanism("pm-c", epsilon=1.0, low=0.0, high=1.0, grid_bits=16)
WEARERS = [("s0", STUDY, 0.3, 300), ("s1", STUDY, 0.3, 300), ("s2", STUDY, 0.3, 300),
           ("p0", STRICT, 0.8, 100)]
FLEET_CHART = '[data-channel="x"] [data-block="fleet"] canvas.trend'


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Four hours of reports every 10 minutes from each wearer; the windows before the
    last hour in the store."""
    rng = np.random.default_rng(45)
    store = SqliteResultsStore(tmp_path_factory.mktemp("results") / "results.sqlite")
    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=60.0, coarser=(60, 24),
                        keep_windows=61, recording=True)
    lock = threading.RLock()
    recorder = ResultsRecorder(store, source="test", aggregates=lambda: ingestor, lock=lock,
                               retention={})
    now = T0 + HOURS * HOUR
    for seq, t in enumerate(np.arange(T0, now, 600.0).tolist()):
        for agent, mechanism, centre, n in WEARERS:
            codes = mechanism.perturb_codes(np.clip(rng.normal(centre, 0.1, n), 0, 1), rng)
            payload = protocol.report(agent=agent, channel="x", kind="linear", seq=seq, t=t,
                                      dt=1.0, codes=codes.tolist(),
                                      mechanism=mechanism.describe(), unit="g")
            assert ingestor.ingest(protocol.data_topic(FLEET, agent, "x"), payload,
                                   now=1e10) == "accepted"
    recorder.durable = ingestor.close_windows(now=now - HOUR, grace=0.0)
    recorder.record()
    views = Views(lambda: ingestor, lock, clock=lambda: now, budget_seconds=None)
    web = WebServer(views, host="127.0.0.1", port=0, push_seconds=0.2,
                    history=HistoryQuery(store, [60.0, HOUR, 86400.0])).start()
    yield web
    web.stop()
    store.close()


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
