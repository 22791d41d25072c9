"""The fleet's mean over a channel's strata in the results store's history
(GET /api/channels/<name>/history?series=fleet): every resolution, stored windows and
open ones, through a real SQLite store and the real web server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from collector.cli import main
from collector.estimation.strata import WindowMean, fleet_windows
from edge_agent.mechanisms import linear_mechanism
from tests.support.configs import FLEET
from tests.support.results import HOUR, RecordedFleet
from tests.support.web import request

STUDY = linear_mechanism("pm-c", epsilon=4.0, low=0.0, high=1.0, grid_bits=16)
STRICT = linear_mechanism("pm-c", epsilon=1.0, low=0.0, high=1.0, grid_bits=16)
# Three study wearers around 0.3 and one stricter wearer around 0.8 (fewer readings).
WEARERS = [("s0", STUDY, 0.3, 300), ("s1", STUDY, 0.3, 300), ("s2", STUDY, 0.3, 300),
           ("p0", STRICT, 0.8, 100)]


def record_strata(fleet: RecordedFleet, start: float, end: float,
                  channels: tuple[str, ...] = ("x",)) -> None:
    """Every wearer's report every 10 minutes from ``start`` to ``end`` on ``channels``
    (a channel other than "x": the study's wearers alone, one series), then every window
    closed before the last hour written to the store."""
    rng = np.random.default_rng(45)
    for seq, t in enumerate(np.arange(start, end, 600.0).tolist()):
        for agent, mechanism, centre, n in WEARERS:
            for channel in channels:
                if channel != "x" and mechanism is STRICT:
                    continue
                codes = mechanism.perturb_codes(np.clip(rng.normal(centre, 0.1, n), 0, 1), rng)
                fleet.send(agent, channel, "linear", seq, t, codes.tolist(), mechanism,
                           unit="g")
    fleet.record(before=end - HOUR)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A day of reports every 10 minutes from each wearer at 1m/1h/1d, the windows before
    the last hour closed into the store; a channel "one" of a single series."""
    fleet = RecordedFleet(tmp_path_factory.mktemp("results") / "results.sqlite")
    record_strata(fleet, 0.0, 86400.0, channels=("x", "one"))
    yield fleet.serve(lambda: 86400.0), fleet.path
    fleet.close()


def get(web, path) -> tuple[int, bytes]:
    status, _, body = request(web, "GET", path)
    return status, body


def document(web, path) -> dict:
    status, body = get(web, path)
    assert status == 200, body
    return json.loads(body)


def test_the_fleets_hours_combine_each_stratums_stored_and_open_hours(served):
    web, _ = served
    query = "/api/channels/x/history?resolution=1h&start=0&end=86400"
    fleet = document(web, query + "&series=fleet")
    assert fleet["series"] == "fleet" and fleet["kind"] == "linear" and fleet["unit"] == "g"
    assert len(fleet["other_series"]) == 2  # both strata, by their keys
    points = fleet["points"]
    assert [p["start"] for p in points] == [HOUR * h for h in range(24)]  # the last one open
    assert all(p["strata"] == 2 and p["count"] == 6 * 1000 for p in points)
    # The same as combining each stratum's own history, weighed by its wearers (3 and 1).
    strata = document(web, "/api/channels/x")["fleet_mean"]["strata"]
    assert sorted(s["weight"] for s in strata) == [0.25, 0.75]
    own = [(s["weight"], [WindowMean(p["start"], p["end"], p["count"], p["mean"]["estimate"],
                                     p["mean"]["stderr"], p["mean"]["ci95"])
                          for p in document(web, f"{query}&series={s['series']}")["points"]])
           for s in strata]
    assert points == json.loads(json.dumps(fleet_windows(own, low=0.0, high=1.0)))
    truth = 0.75 * 0.3 + 0.25 * 0.8
    for point in points:
        mean = point["mean"]
        assert abs(mean["estimate"] - truth) <= 5 * mean["stderr"] + mean["bias_bound"] + 0.01
    day = document(web, "/api/channels/x/history?resolution=1d&start=0&end=86400"
                        "&series=fleet")["points"]
    assert len(day) == 1 and day[0]["count"] == 144 * 1000
    assert abs(day[0]["mean"]["estimate"] - truth) < 0.02


def test_the_fleets_history_is_a_table_too(served):
    web, _ = served
    status, body = get(web, "/api/channels/x/history?resolution=1h&start=0&end=7200"
                            "&series=fleet&format=csv")
    assert status == 200
    rows = body.decode().splitlines()
    assert rows[0].startswith("start,end,count") and len(rows) == 3


def test_no_fleet_mean_where_there_are_no_strata_or_no_live_view(served, tmp_path):
    web, path = served
    status, body = get(web, "/api/channels/one/history?resolution=1h&series=fleet")
    assert status == 400 and json.loads(body)["error"].startswith("series: no fleet mean")
    config = tmp_path / "collector.toml"
    config.write_text(f'fleet = "{FLEET}"\n[results]\npath = "{path}"\n')
    found = CliRunner().invoke(main, ["results", "--config", str(config), "--channel", "x",
                                      "--resolution", "1h", "--series", "fleet"])
    assert found.exit_code == 2 and "--series: the fleet's mean comes from a running " \
                                    "collector" in found.output
