"""A channel whose wearers report under guarantees of their own: its series are strata of
one fleet mean (``fleet_mean``, ``fleet_windows``), each weighed by its wearers."""

from __future__ import annotations

import msgspec
import numpy as np

from collector.aggregation.ingest import Ingestor
from collector.api.documents import Views
from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, linear_mechanism

FLEET = "demo"
WINDOW = 10.0
STUDY = linear_mechanism("pm-c", epsilon=4.0, low=-2.0, high=2.0, grid_bits=16)
STRICT = linear_mechanism("pm-c", epsilon=1.0, low=-2.0, high=2.0, grid_bits=16)


def send(ingestor: Ingestor, agent: str, mechanism, seq: int, t: float, values, rng,
         channel: str = "x", kind: str = "linear", unit: str | None = "g") -> None:
    payload = protocol.report(agent=agent, channel=channel, kind=kind, seq=seq, t=t, dt=1.0,
                              codes=mechanism.perturb_codes(values, rng).tolist(),
                              mechanism=mechanism.describe(), unit=unit)
    assert ingestor.ingest(protocol.data_topic(FLEET, agent, channel), payload,
                           t + 1.0) == "accepted"


def fleet(rng) -> tuple[Ingestor, float]:
    """Three windows: six study wearers around -0.5 (300 reports each a window) and two
    stricter ones around 1.0 (100 each); returns the ingestor and the wearers' mean."""
    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=WINDOW, keep_windows=4)
    means = []
    for i in range(3):
        t = 1000.0 + WINDOW * i
        for agent, mechanism, centre, n in [*((f"s{a}", STUDY, -0.5, 300) for a in range(6)),
                                            *((f"p{a}", STRICT, 1.0, 100) for a in range(2))]:
            values = np.clip(rng.normal(centre, 0.3, n), -2, 2)
            means.append(values.mean())
            send(ingestor, agent, mechanism, i, t, values, rng)
    return ingestor, float(np.mean(means))


def test_series_of_one_quantity_under_different_guarantees_make_one_fleet_mean():
    rng = np.random.default_rng(45)
    ingestor, truth = fleet(rng)
    views = Views(lambda: ingestor, clock=lambda: 1040.0, budget_seconds=None)
    detail = views.channel_json("x")
    fleet_mean = detail["fleet_mean"]
    assert fleet_mean["state"] == "ready"
    assert sorted((s["mechanism"]["epsilon"], s["agents"], s["weight"], s["count"])
                  for s in fleet_mean["strata"]) == [(1.0, 2, 0.25, 600), (4.0, 6, 0.75, 5400)]
    mean = fleet_mean["mean"]
    assert abs(mean["estimate"] - truth) <= 5 * mean["stderr"] + mean["bias_bound"]
    assert mean["ci95"][0] <= mean["estimate"] <= mean["ci95"][1] and mean["share"] == 1.0
    by_epsilon = {s["mechanism"]["epsilon"]: s for s in fleet_mean["strata"]}
    assert mean["estimate"] == np.clip(0.75 * by_epsilon[4.0]["estimate"]
                                       + 0.25 * by_epsilon[1.0]["estimate"], -2, 2)
    # every kept window, both strata in each
    windows = detail["fleet_windows"]
    assert [w["start"] for w in windows] == [1000.0, 1010.0, 1020.0]
    assert all(w["strata"] == 2 and w["count"] == 2000 and w["mean"]["share"] == 1.0
               for w in windows)
    # /api/channels carries the total's fleet mean, not the windows
    entry = views.channels_json()["channels"]["x"]
    assert entry["fleet_mean"] == fleet_mean and "fleet_windows" not in entry


def test_a_window_without_a_stratum_is_the_others_mean_and_says_whose():
    rng = np.random.default_rng(46)
    ingestor, _ = fleet(rng)
    send(ingestor, "s0", STUDY, 3, 1030.0, np.full(50, -0.5), rng)  # the study's alone
    detail = Views(lambda: ingestor, clock=lambda: 1040.0).channel_json("x")
    newest = detail["fleet_windows"][-1]
    assert newest["start"] == 1030.0 and newest["strata"] == 1
    assert newest["mean"]["share"] == 0.75


def test_another_unit_kind_or_a_single_series_makes_no_fleet_mean():
    rng = np.random.default_rng(47)
    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=WINDOW, keep_windows=4)
    send(ingestor, "a", STUDY, 0, 1000.0, np.zeros(100), rng)
    send(ingestor, "b", STRICT, 0, 1000.0, np.zeros(100), rng, unit="m/s²")
    for seq, epsilon in enumerate((1.0, 2.0)):
        send(ingestor, "a", CircularOGPM(epsilon=epsilon, period=360.0), seq, 1000.0,
             np.full(50, 90.0), rng, channel="yaw", kind="circular", unit=None)
    channels = Views(lambda: ingestor, clock=lambda: 1020.0).channels_json()["channels"]
    assert "fleet_mean" not in channels["x"] and len(channels["x"]["other_series"]) == 1
    assert "fleet_mean" not in channels["yaw"] and len(channels["yaw"]["other_series"]) == 1


def test_a_device_in_many_strata_weighs_as_one_wearer():
    """One sender cycling its epsilon starts a series each time (at most the
    series_per_channel limit): it counts 1/k in each, never k wearers."""
    rng = np.random.default_rng(48)
    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=WINDOW, keep_windows=4)
    for a in range(3):
        send(ingestor, f"s{a}", STUDY, 0, 1000.0, np.full(200, -1.0), rng)
    for seq, epsilon in enumerate((0.5, 0.7, 0.9, 1.1)):
        mechanism = linear_mechanism("pm-c", epsilon=epsilon, low=-2.0, high=2.0, grid_bits=16)
        send(ingestor, "hostile", mechanism, seq, 1000.0, np.full(200, 2.0), rng)
    strata = Views(lambda: ingestor, clock=lambda: 1020.0).channel_json("x")["fleet_mean"][
        "strata"]
    assert sum(s["weight"] for s in strata if s["mechanism"]["epsilon"] != 4.0) == 0.25


def test_strata_reporting_side_by_side_leave_the_channel_showing_the_most_wearers():
    """The entry shows one series (its mechanism, its history): reports alternating
    between strata must not make it flip at every push; a new series (a changed
    configuration) is shown at once, and any once the shown one is silent for a window."""
    rng = np.random.default_rng(49)
    ingestor, _ = fleet(rng)  # the last report of each window is a stricter wearer's
    shown = Views(lambda: ingestor, clock=lambda: 1040.0).channels_json()["channels"]["x"]
    assert shown["mechanism"]["epsilon"] == 4.0 and shown["agents"] == 6
    changed = linear_mechanism("pm-c", epsilon=3.0, low=-2.0, high=2.0, grid_bits=16)
    send(ingestor, "s0", changed, 5, 1031.0, np.zeros(10), rng)
    assert ingestor.series["x"][ingestor.latest["x"]].mechanism.epsilon == 3.0
    send(ingestor, "s1", STUDY, 5, 1032.0, np.zeros(10), rng)  # 6 wearers against 1
    assert ingestor.series["x"][ingestor.latest["x"]].mechanism.epsilon == 4.0
    send(ingestor, "p0", STRICT, 5, 1033.0, np.zeros(10), rng)  # 2 against 6: kept
    assert ingestor.series["x"][ingestor.latest["x"]].mechanism.epsilon == 4.0
    send(ingestor, "p0", STRICT, 6, 1033.0 + WINDOW, np.zeros(10), rng)  # silent: shown
    assert ingestor.series["x"][ingestor.latest["x"]].mechanism.epsilon == 1.0


def test_a_sender_stating_a_wide_domain_moves_the_mean_as_one_wearer_can():
    """A series of its own on [-1000, 1000] at its end: its mean is kept in the domain of
    the stratum of most wearers, so it moves the mean of all wearers by at most that
    domain's width over the wearers."""
    rng = np.random.default_rng(50)
    ingestor, _ = fleet(rng)
    honest = Views(lambda: ingestor, clock=lambda: 1040.0).channel_json("x")["fleet_mean"]
    wide = linear_mechanism("pm-c", epsilon=8.0, low=-1000.0, high=1000.0, grid_bits=16)
    send(ingestor, "hostile", wide, 0, 1020.0, np.full(500, 1000.0), rng)
    fleet_mean = Views(lambda: ingestor, clock=lambda: 1040.0).channel_json("x")["fleet_mean"]
    assert len(fleet_mean["strata"]) == 3
    shift = fleet_mean["mean"]["estimate"] - honest["mean"]["estimate"]
    assert 0 < shift <= 4.0 / 9 + 1e-9  # the domain [-2, 2], nine wearers
    assert -2.0 <= fleet_mean["mean"]["ci95"][0] <= fleet_mean["mean"]["ci95"][1] <= 2.0


def test_a_channel_with_strata_still_publishes_its_retained_snapshot():
    """The retained snapshot is the shown series' aggregates: the mean of all wearers is
    the API's (an unknown field would make the typed snapshot refuse the channel, and
    the publisher every channel after it)."""
    from collector.estimation.jsonsafe import json_safe
    from edge_agent.protocol.snapshots import SNAPSHOTS

    rng = np.random.default_rng(51)
    ingestor, _ = fleet(rng)
    document = Views(lambda: ingestor, clock=lambda: 1040.0).channels_json()
    entry = document["channels"]["x"]
    assert "fleet_mean" in entry
    payload = protocol.snapshot(json_safe(entry), channel="x", t=document["t"])
    decoded = msgspec.json.decode(payload, type=SNAPSHOTS["linear"])
    assert decoded.count == entry["count"] and decoded.agents == 6


def test_the_mean_of_all_wearers_is_a_prometheus_gauge():
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from collector.api.metrics import document_metrics

    rng = np.random.default_rng(52)
    ingestor, _ = fleet(rng)
    document = Views(lambda: ingestor, clock=lambda: 1040.0).channels_json()

    class Source:
        def collect(self):
            return document_metrics(document)

    registry = CollectorRegistry()
    registry.register(Source())
    text = generate_latest(registry).decode()
    mean = document["channels"]["x"]["fleet_mean"]["mean"]
    assert f'ldp_channel_fleet_mean_estimate{{channel="x"}} {mean["estimate"]!r}' in text
    assert f'ldp_channel_fleet_mean_stderr{{channel="x"}} {mean["stderr"]!r}' in text


def test_a_channel_its_snapshot_refuses_leaves_the_others_published():
    from collector.broker.publisher import CollectorClient
    from collector.config import parse_collector_config

    rng = np.random.default_rng(53)
    ingestor, _ = fleet(rng)
    document = Views(lambda: ingestor, clock=lambda: 1040.0).channels_json()
    document["channels"] = {"a": {**document["channels"]["x"], "unknown": 1},
                            "x": document["channels"]["x"]}
    client = CollectorClient(parse_collector_config({"fleet": FLEET}), role="test",
                             label="test", follow={})
    published = []
    client.publish = lambda topic, payload, retain=True: published.append(topic)
    client.publish_snapshots(document)
    assert published == [protocol.aggregates_topic(FLEET, "x")]
