"""Categorical channels on the dashboard in Chromium: bar charts with intervals, cards
without data, new labels, delta, many categories, labels that try to be markup."""

from __future__ import annotations

import json
import threading
import time

from collector.aggregation.ingest import Ingestor
from collector.api.documents import Capture, Documents, Views
from edge_agent import protocol
from tests.support.ports import HANG_GUARD_MS
from tests.support.web import (
    PUSH,
    Dashboard,
    assert_shows,
    card,
    request,
    serve,
    shown,
    strict_json,
)

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
    """Serves whatever channels document a test sets (shaped like docs/reference/API.md)."""

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
        page.wait_for_selector('[data-channel="activity"] .bar-row', timeout=HANG_GUARD_MS)
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
        page.wait_for_selector('[data-channel="activity"] .bar-row', timeout=HANG_GUARD_MS)
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
            timeout=HANG_GUARD_MS)
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
            timeout=HANG_GUARD_MS)
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
                 .dataset.category === String(first)""", arg=first, timeout=HANG_GUARD_MS)
        assert page.evaluate(
            "document.querySelector('[data-channel=\"activity\"]').__same") is True
        assert page.locator('[data-channel="activity"] .bar-row').count() == 64
        assert board.problems == []
    finally:
        board.close()
        web.stop()
