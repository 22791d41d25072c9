"""GET /api/channels/<name>/history with a resolution and a time range, from a real SQLite
results store behind the real web server: the stored windows with the open ones, as JSON
and CSV (and Parquet through `edge-collector results`), and hostile queries refused with a
400 naming the parameter."""

from __future__ import annotations

import csv
import io
import json
import math

import msgspec
import numpy as np
import pytest
from click.testing import CliRunner

from collector.cli import main
from collector.results.query import MAX_POINTS
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM
from edge_agent.mechanisms.categorical import ORACLES
from tests.support.configs import FLEET
from tests.support.results import HOUR, RecordedFleet
from tests.support.web import request

DAYS = 2
LINEAR = ClassicalOGPM(epsilon=2.0, low=0.0, high=1.0)
HEART = ClassicalOGPM(epsilon=1.0, low=40.0, high=200.0)  # 20 readings per report
CIRCULAR = CircularOGPM(epsilon=2.0, period=360.0)
GRR = ORACLES["grr"](epsilon=2.0, categories=3, labels=("sit", "walk", "run"))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two days of a linear, a circular and a categorical channel at 1m/1h/1d, one report
    of each every 10 minutes, the mean of x following the hour; every window before the
    last hour closed into the store, the rest open; the web server over both."""
    rng = np.random.default_rng(8)
    fleet = RecordedFleet(tmp_path_factory.mktemp("results") / "results.sqlite")
    end = DAYS * 86400.0
    for seq, t in enumerate(np.arange(0.0, end, 600.0).tolist()):
        hour = int(t // HOUR) % 24
        fleet.send("w1", "x", "linear", seq, t,
                   LINEAR.perturb_codes(np.full(400, 0.2 + 0.025 * hour), rng).tolist(), LINEAR)
        fleet.send("w1", "yaw", "circular", seq, t,
                   CIRCULAR.perturb_codes(rng.normal(90, 10, 200) % 360, rng).tolist(),
                   CIRCULAR)
        fleet.send("w1", "hr", "linear", seq, t,
                   HEART.perturb_codes(rng.normal(70, 5, 20).clip(40, 200), rng).tolist(), HEART)
        fleet.send("w1", "activity", "categorical", seq, t,
                   GRR.perturb(rng.integers(0, 3, 200), rng).tolist(), GRR)
    fleet.record(before=end - HOUR)
    yield fleet.serve(lambda: end), fleet.ingestor, fleet.path
    fleet.close()


def _get(web, path):
    status, headers, body = request(web, "GET", path)
    return status, headers, body


def _json(web, path) -> dict:
    status, headers, body = _get(web, path)
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    return json.loads(body)


def test_a_day_of_hours_is_read_from_the_store_with_the_open_hour(served):
    web, ingestor, _ = served
    history = _json(web, f"/api/channels/x/history?resolution=1h&start={86400}&end={2 * 86400}")
    points = history["points"]
    assert history["resolution"] == "1h" and history["window_seconds"] == HOUR
    assert [p["start"] for p in points] == [86400.0 + HOUR * h for h in range(24)]
    # Six reports of 400 values an hour; the last hour is still open (from the live view).
    assert all(p["count"] == 2400 for p in points)
    for hour, point in enumerate(points):
        truth = 0.2 + 0.025 * hour
        low, high = point["mean"]["ci95"]
        assert low - 0.02 < truth < high + 0.02 and not point.get("too_few", False)
    # The whole day: one window, of every report.
    day = _json(web, "/api/channels/x/history?resolution=1d&start=0&end=172800")["points"]
    assert [(p["start"], p["count"]) for p in day] == [(0.0, 144 * 400), (86400.0, 144 * 400)]
    # Minutes: a report every ten minutes, so a minute window every ten.
    minutes = _json(web, "/api/channels/x/history?resolution=1m&start=3600&end=7200")["points"]
    assert [p["start"] for p in minutes] == [3600.0 + 600 * i for i in range(6)]
    assert all(p["count"] == 400 for p in minutes)


def test_a_minute_of_a_few_private_reports_is_marked_too_few_and_a_day_is_not(served):
    """20 heart-rate readings at epsilon 1 a minute: each minute's interval spans the
    whole domain, while the day's (2,880 readings) is a measurement."""
    web, _, _ = served
    query = "/api/channels/hr/history?start=0&end=86400&resolution="
    minutes = _json(web, query + "1m")["points"]
    day = _json(web, query + "1d")["points"]
    assert len(minutes) == 144 and all(p["too_few"] for p in minutes)
    assert len(day) == 1 and "too_few" not in day[0]
    low, high = day[0]["mean"]["ci95"]
    assert high - low < 0.5 * (200 - 40) and low < 70 < high
    hours = _json(web, "/api/channels/activity/history?resolution=1h&start=0&end=7200")
    assert hours["labels"] == ["sit", "walk", "run"]
    assert all(not p.get("too_few", False) for p in hours["points"])


def test_csv_is_a_table_with_a_header_row_and_the_same_numbers(served):
    web, _, _ = served
    path = "/api/channels/x/history?resolution=1h&start=0&end=86400"
    status, headers, body = _get(web, path + "&format=csv")
    assert status == 200 and headers["content-type"] == "text/csv; charset=utf-8"
    table = list(csv.DictReader(io.StringIO(body.decode())))
    points = _json(web, path)["points"]
    assert list(table[0]) == ["start", "end", "count", "too_few", "mean", "mean_stderr",
                              "mean_low", "mean_high"]
    assert len(table) == len(points) == 24
    for row, point in zip(table, points):
        assert float(row["start"]) == point["start"] and int(row["count"]) == point["count"]
        assert float(row["mean"]) == point["mean"]["estimate"]  # repr: exact round trip
        assert float(row["mean_low"]) == point["mean"]["ci95"][0]
        assert row["too_few"] == "false"
    status, _, body = _get(web, "/api/channels/activity/history?resolution=1d&start=0"
                                "&end=172800&format=csv")
    header = body.decode().splitlines()[0].split(",")
    assert status == 200 and header[4:8] == ["share_sit", "estimate_sit", "share_sit_low",
                                             "share_sit_high"]


@pytest.mark.parametrize("query, parameter", [
    ("resolution=2h", "resolution"),
    ("resolution=1h&start=abc", "start"),
    ("resolution=1h&start=nan", "start"),
    ("resolution=1h&end=1e300", "end"),
    ("resolution=1h&start=7200&end=3600", "start"),
    ("resolution=1m&start=0&end=1e9", "end"),
    ("format=xml", "format"),
    ("series=../../etc", "series"),
    ("series=" + "0" * 32, "series"),
    ("limit=5", "limit"),
])
def test_a_hostile_query_gets_a_400_naming_the_parameter(served, query, parameter):
    web, _, _ = served
    status, _, body = _get(web, f"/api/channels/x/history?{query}")
    assert status == 400, body
    assert json.loads(body)["error"].startswith(f"{parameter}:")
    # ... and the server goes on answering.
    assert _get(web, "/api/channels/x/history?resolution=1d")[0] == 200


def test_the_widest_query_returns_at_most_its_bound(served):
    web, _, _ = served
    history = _json(web, f"/api/channels/x/history?resolution=1m&start=0"
                         f"&end={60 * MAX_POINTS}")
    assert len(history["points"]) == 2 * 144  # every minute with reports, open ones too
    status, _, body = _get(web, f"/api/channels/x/history?resolution=1m&start=0"
                                f"&end={60 * MAX_POINTS + 60}")
    assert status == 400 and b"at most 10000 windows of 1m" in body
    assert _get(web, "/api/channels/nothing/history?resolution=1h")[0] == 404


def test_edge_collector_results_writes_csv_and_parquet_with_the_same_numbers(served, tmp_path):
    pyarrow = pytest.importorskip("pyarrow.parquet")
    web, _, path = served
    config = tmp_path / "collector.toml"
    config.write_text(f'fleet = "{FLEET}"\n[results]\npath = "{path}"\n')
    runner = CliRunner()
    base = ["results", "--config", str(config), "--channel", "x", "--resolution", "1h",
            "--start", "1970-01-01T00:00", "--end", "86400"]
    found = runner.invoke(main, base)
    assert found.exit_code == 0, found.output
    table = list(csv.DictReader(io.StringIO(found.stdout)))
    served_csv = _get(web, "/api/channels/x/history?resolution=1h&start=0&end=86400"
                           "&format=csv")[2].decode()
    assert found.stdout == served_csv and len(table) == 24
    parquet = tmp_path / "x.parquet"
    assert runner.invoke(main, [*base, "--format", "parquet", "--out", str(parquet)]) \
        .exit_code == 0
    frame = pyarrow.read_table(parquet).to_pylist()
    assert [row["start"] for row in frame] == [float(row["start"]) for row in table]
    assert all(math.isclose(a["mean"], float(b["mean"]), rel_tol=0, abs_tol=0)
               for a, b in zip(frame, table))
    bad = runner.invoke(main, [*base[:-2], "--end", "yesterday"])
    assert bad.exit_code == 2 and "--end: expected Unix seconds or an ISO 8601" in bad.output
    bad = runner.invoke(main, [*base, "--resolution", "5m"])
    assert bad.exit_code == 2 and "--resolution: expected one of 1m, 1h, 1d" in bad.output


def test_stored_points_are_typed_history_points(served):
    """What the store keeps decodes as the kind's typed point (the live view's type)."""
    from collector.storage.states import POINTS

    web, _, _ = served
    for channel, kind in (("x", "linear"), ("yaw", "circular"), ("activity", "categorical")):
        points = _json(web, f"/api/channels/{channel}/history?resolution=1h&start=0"
                            f"&end=86400")["points"]
        assert points and all(msgspec.convert(p, POINTS[kind]) for p in points)
