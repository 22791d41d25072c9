"""Each channel's time series of windowed estimates (GET /api/channels/<name>/history),
units from the reports to every document, and the polar, axis and info metrics."""

from __future__ import annotations

import json
import math

import msgspec
import numpy as np
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from collector.aggregation.ingest import Ingestor
from collector.api.documents import Views
from collector.api.metrics import document_metrics
from collector.api.server import WebServer
from collector.config import ConfigError, parse_collector_config
from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM, PolarOGPM
from tests.support.ports import wait_until
from tests.support.web import request, strict_json

FLEET = "demo"
WINDOW = 10.0
LINEAR = ClassicalOGPM(epsilon=2.0, low=-2.0, high=2.0)
POLAR = PolarOGPM(epsilon=4.0, radius_max=2.0, period=360.0)
CIRCULAR = CircularOGPM(epsilon=2.0, period=360.0)


def send(ingestor: Ingestor, channel: str, kind: str, seq: int, t: float, codes, mechanism,
         unit: str | None = None, agent: str = "w1", **extra) -> str:
    payload = protocol.report(agent=agent, channel=channel, kind=kind, seq=seq, t=t, dt=1.0,
                              codes=codes, mechanism=mechanism.describe(), unit=unit, **extra)
    return ingestor.ingest(protocol.data_topic(FLEET, agent, channel), payload, t + 1.0)


def linear_codes(rng, mean: float, n: int = 2000) -> list[int]:
    return LINEAR.perturb_codes(np.clip(rng.normal(mean, 0.3, n), -2, 2), rng).tolist()


@pytest.fixture
def ingestor() -> Ingestor:
    """Five 10 s windows of a linear channel in g whose mean steps from -1 to 1, a polar
    channel in g and degrees, and a circular one in degrees."""
    rng = np.random.default_rng(3)
    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=WINDOW, keep_windows=4)
    for i, mean in enumerate((-1.0, -0.5, 0.0, 0.5, 1.0)):
        t = 1000.0 + WINDOW * i
        assert send(ingestor, "x", "linear", i, t, linear_codes(rng, mean), LINEAR,
                    unit="g") == "accepted"
        radius, angle = POLAR.components
        codes = [radius.perturb_codes(rng.uniform(0.5, 1.5, 200), rng).tolist(),
                 angle.perturb_codes(rng.vonmises(0.5, 4, 200) * 180 / math.pi % 360,
                                     rng).tolist()]
        assert send(ingestor, "p", "polar", i, t, codes, POLAR, unit="g") == "accepted"
        codes = CIRCULAR.perturb_codes(rng.uniform(80, 100, 200), rng).tolist()
        assert send(ingestor, "yaw", "circular", i, t, codes, CIRCULAR) == "accepted"
    return ingestor


def test_the_history_is_every_kept_windows_estimate_oldest_first(ingestor):
    views = Views(lambda: ingestor, clock=lambda: 1060.0, budget_seconds=None)
    documents = views.documents(views.capture())
    # History points are typed (collector.storage.states.POINTS): as JSON has them.
    histories = msgspec.to_builtins(documents.histories)
    history = histories["x"]
    assert history["unit"] == "g" and history["window_seconds"] == WINDOW
    points = history["points"]
    # Four windows kept: the means -0.5 .. 1, each inside its own 95% interval.
    assert [p["start"] for p in points] == [1010.0, 1020.0, 1030.0, 1040.0]
    assert all(p["count"] == 2000 for p in points)
    for point, mean in zip(points, (-0.5, 0.0, 0.5, 1.0)):
        estimate, stderr = point["mean"]["estimate"], point["mean"]["stderr"]
        low, high = point["mean"]["ci95"]
        assert abs(estimate - mean) < 5 * stderr < 0.25 and low < estimate < high
        assert set(point) == {"start", "end", "count", "mean"}  # no histograms
    # The channel's entry carries the latest point, for the dashboard to extend its chart.
    assert documents.channels["channels"]["x"]["window"] == points[-1]
    assert views.channels_json()["channels"]["x"]["window"] == points[-1]
    polar = histories["p"]
    assert polar["unit"] == "g" and polar["angle_unit"] == "deg"
    angle = polar["points"][-1]["angle"]
    assert abs(angle["circular_mean"] - 0.5 * 180 / math.pi) < 3 * angle["half_width"]
    assert 0.5 < polar["points"][-1]["radius"]["mean"]["estimate"] < 1.5
    assert histories["yaw"]["unit"] == "deg"
    assert 80 < histories["yaw"]["points"][-1]["circular_mean"] < 100


def test_the_history_is_served_and_an_unknown_channel_is_a_404(ingestor):
    web = WebServer(Views(lambda: ingestor, clock=lambda: 1060.0), host="127.0.0.1", port=0,
                    push_seconds=0.2).start()
    try:
        def history() -> dict:
            status, headers, body = request(web, "GET", "/api/channels/x/history")
            assert status == 200 and headers["content-type"] == "application/json"
            return strict_json(body)

        # The newest window first; the older ones at the next pushes, within their budget.
        assert history()["state"] in ("computing", "ready")
        assert wait_until(lambda: history()["state"] == "ready")
        assert history()["channel"] == "x" and len(history()["points"]) == 4
        status, _, body = request(web, "GET", "/api/channels/nope/history")
        assert status == 404 and "nope" in strict_json(body)["error"]
        assert request(web, "HEAD", "/api/channels/x/history")[0] == 200
    finally:
        web.stop()


def test_reports_in_another_unit_are_another_series_never_mixed(ingestor):
    rng = np.random.default_rng(4)
    assert send(ingestor, "x", "linear", 9, 1045.0, linear_codes(rng, 9.0 / 9.81), LINEAR,
                unit="m/s²", agent="w2") == "accepted"
    entry = Views(lambda: ingestor, clock=lambda: 1060.0).channels_json()["channels"]["x"]
    assert entry["unit"] == "m/s²" and entry["count"] == 2000  # the newest series is shown
    assert entry["other_series"][0]["count"] == 10_000  # the values in g, apart


@pytest.mark.parametrize("unit, reason", [("{", "json"), ("x" * 17, "schema"),
                                          ("a\nb", "schema"), ("", "schema")])
def test_a_unit_out_of_bounds_is_refused(ingestor, unit, reason):
    payload = json.loads(protocol.report(agent="w3", channel="x", kind="linear", seq=0, t=1000,
                                         dt=1, codes=[1], mechanism=LINEAR.describe()))
    payload["unit"] = unit
    outcome = ingestor.ingest(protocol.data_topic(FLEET, "w3", "x"),
                              json.dumps(payload).encode(), 1001.0)
    assert outcome == f"rejected:{reason}" and ingestor.rejects[reason] == 1


def test_a_circular_report_carries_its_unit_in_its_period(ingestor):
    assert send(ingestor, "yaw", "circular", 50, 1045.0, [1, 2], CIRCULAR,
                unit="deg", agent="w2") == "rejected:schema"
    assert ingestor.rejects["schema"] == 1


def test_metrics_have_polar_axis_and_info_families(ingestor):
    document = Views(lambda: ingestor, clock=lambda: 1060.0).channels_json()
    registry = CollectorRegistry()

    class Families:
        def collect(self):
            return document_metrics(document)

    registry.register(Families())
    text = generate_latest(registry).decode()
    polar = document["channels"]["p"]
    assert f'ldp_channel_radius_mean_estimate{{channel="p"}} ' \
           f'{polar["radius"]["mean"]["estimate"]!r}' in text
    assert 'ldp_channel_angle_circular_mean{channel="p"}' in text
    assert 'ldp_channel_angle_resultant_length{channel="p"}' in text
    assert 'ldp_channel_info{angle_unit="deg",channel="p",kind="polar",unit="g"} 1.0' in text
    assert 'ldp_channel_info{angle_unit="",channel="x",kind="linear",unit="g"} 1.0' in text


def test_history_seconds_sets_the_windows_kept_and_names_its_key():
    def aggregates(**table):
        return parse_collector_config({"fleet": FLEET, "broker": {"client_id": "c"},
                                       "aggregates": table}).aggregates

    assert aggregates().kept_windows == 61  # an hour of minutes, and the one under way
    assert aggregates(window_seconds=10, history_seconds=600).kept_windows == 61
    assert aggregates(keep_windows=5).kept_windows == 5
    with pytest.raises(ConfigError, match=r"aggregates.keep_windows: give history_seconds "
                                          r"or keep_windows, not both"):
        aggregates(keep_windows=5, history_seconds=60)
    with pytest.raises(ConfigError, match=r"aggregates.history_seconds: at most 10000 "):
        aggregates(window_seconds=1, history_seconds=86400)
