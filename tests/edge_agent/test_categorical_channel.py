"""Categorical channels: categories from words, integers or bins, any oracle, through the
wire format, with the exact charge (pure epsilon, or epsilon and delta)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from edge_agent import protocol
from edge_agent.channels import Selection, build_channel
from edge_agent.config import ConfigError, parse_config
from edge_agent.mechanisms.categorical import ORACLES, best_oracle
from edge_agent.readings import Readings
from edge_agent.sources.jsonl import parse_record, records_to_readings
from edge_agent.state import NANO, delta_units_up
from tests.support import agent_config

ACTIVITY = {"name": "activity", "source": "imu", "field": "activity", "kind": "categorical",
            "categories": ["rest", "walk", "run"], "epsilon": 1.0}
FALSE_ALARM = 1e-6


def _config(*channels, privacy=None):
    return parse_config(agent_config(state_dir="/tmp/unused", channels=channels,
                                     privacy=privacy))


def _channel(**changes):
    config = _config({**ACTIVITY, **changes},
                     privacy={"budget_delta": 0.01} if changes.get("delta") else None)
    return build_channel(config.channels[0], agent_id="w1", fleet="demo")


def _error(**changes) -> str:
    with pytest.raises(ConfigError) as info:
        _config({**ACTIVITY, **changes})
    return str(info.value)


# -- configuration ---------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    (dict(categories=None), "categories: required"),
    (dict(categories=["rest"]), "categories: at least 2"),
    (dict(categories=["rest", "rest"]), "categories: must be distinct"),
    (dict(categories=["rest", "wa\nlk"]), "channels[0].categories"),
    (dict(categories=None, bin_edges=[0, 1]), "bin_edges: must be at least 3"),
    (dict(categories=None, bin_edges=[0, 2, 1]), "bin_edges: must be at least 3 finite, "
                                                 "increasing"),
    (dict(bin_edges=[0, 1, 2]), "categories: with bin_edges, names for the 2 bins"),
    (dict(oracle="rappor"), "channels[0].oracle: must be one of"),
    (dict(unknown="jog"), "unknown: 'drop' or one of the categories, got 'jog'"),
    (dict(delta=0.5), "channels[0].delta: must be <= 0.1"),
    (dict(delta=1e-6), "channels[0].delta: 1e-06 needs a delta budget: set "
                       "privacy.budget_delta"),
    (dict(categories=list(range(2000)), oracle="oue", field="accel_x"),
     "channels[0]: its mechanism refuses it: categories: must be in [2, 1024]"),
    (dict(field="blood_pressure"), "channels[0]: source 'imu' has no field 'blood_pressure'"),
])
def test_configuration_errors_name_the_key(changes, message):
    assert message in _error(**changes)


def test_auto_picks_the_oracle_of_least_variance():
    assert _channel().mechanism.name == "grr"  # 3 categories
    many = _channel(field="accel_x", categories=list(range(200)), epsilon=1.0)
    assert many.mechanism.name == "olh" == best_oracle(epsilon=1.0, categories=200)
    assert many.mechanism.labels == tuple(str(n) for n in range(200))


# -- readings to categories ------------------------------------------------------------

def test_words_integers_and_bins_become_category_numbers():
    times = np.arange(7.0)
    readings = Readings(times, {"accel_x": np.array([1, 2, 3, 2.5, np.nan, 7, 0.5])},
                        {"activity": np.array(["walk", "run", None, "rest", "jog", "walk",
                                               "run"], dtype=object)})
    words = _channel()
    assert words.select(readings).values[0].tolist() == [1, 2, 0, 1, 2]
    assert words.local["not_a_category"] == 2  # None and "jog"
    other = _channel(categories=["rest", "walk", "run", "other"], unknown="other")
    assert other.select(readings).values[0].tolist() == [1, 2, 3, 0, 3, 1, 2]
    integers = _channel(field="accel_x", categories=[3, 1, 2])
    assert integers.select(readings).values[0].tolist() == [1, 2, 0]  # 2.5, NaN, 7, 0.5 drop
    bins = _channel(field="accel_x", categories=None, bin_edges=[1, 2, 3])
    assert bins.mechanism.labels == ("[1, 2)", "[2, 3]")
    # 3 is the last edge (closed); 7 and 0.5 lie outside: clipped into the end bins
    assert bins.select(readings).values[0].tolist() == [0, 1, 1, 1, 1, 0]
    assert bins.local["clipped"] == 2 and bins.local["not_a_category"] == 1


def test_words_arrive_from_json_and_csv_sources(tmp_path):
    records = [parse_record({"activity": "walk", "x": 1}, None, 5.0),
               parse_record({"activity": " run ", "x": "7"}, None, 6.0),
               parse_record({"activity": "x" * 41}, None, 7.0)]
    readings = records_to_readings(records)
    assert readings.text_column("activity").tolist() == ["walk", "run", None]
    assert np.isnan(readings.column("activity")).all()
    assert readings.column("x")[0] == 1 and np.isnan(readings.column("x")[1:]).all()
    assert _channel().select(readings).values[0].tolist() == [1, 2]


# -- reports ---------------------------------------------------------------------------

@pytest.mark.parametrize("oracle", sorted(ORACLES))
def test_reports_decode_to_what_the_oracle_supports(oracle):
    channel = _channel(oracle=oracle)
    values = np.array([0, 1, 2, 2, 1, 0, 0], dtype=np.int64)
    topic, payload = channel.build_message(Selection(np.arange(7.0), (values,)), seq=0,
                                           allowed=5, t=100.0, dt=1.0, rng=np.random.default_rng(3))
    report = protocol.decode_report(topic, payload, "demo")
    assert report.kind == "categorical" and report.mechanism == channel.mechanism
    again = channel.mechanism.perturb(values[:5], np.random.default_rng(3))  # same draws
    expected = channel.mechanism.support(again)
    assert report.mechanism.support(report.codes).tolist() == expected.tolist()
    assert json.loads(payload)["mechanism"]["labels"] == ["rest", "walk", "run"]
    assert channel.counters == {"reports": 5, "messages": 1}


def test_the_reported_categories_follow_the_exact_probabilities():
    """Whole path (word -> number -> kernel -> wire -> decode): the GRR reports of
    'walk' have P[walk] = p and every other category q, exactly (chi-square, 1e-6)."""
    channel = _channel(epsilon=0.8)
    n = 60_000
    readings = Readings(np.arange(n, dtype=float),
                        text={"activity": np.full(n, "walk", dtype=object)})
    selection = channel.select(readings)
    assert isinstance(selection, Selection)
    topic, payload = channel.build_message(selection, seq=0, allowed=n, t=0.0, dt=1.0,
                                           rng=np.random.default_rng(11))
    report = protocol.decode_report(topic, payload, "demo")
    observed = np.bincount(report.codes, minlength=3)
    expected = n * np.array([float(x) for x in channel.mechanism.pmf(1)])
    statistic, p_value = stats.chisquare(observed, expected)
    assert p_value > FALSE_ALARM, (observed, expected)


def test_a_pure_channel_charges_its_exact_loss_and_a_delta_channel_epsilon_and_delta():
    pure = _channel(epsilon=1.0)
    assert pure.charge_delta == 0
    assert pure.charge_nano == pure.mechanism.exact_privacy_loss().ceiling(NANO)
    assert pure.charge_nano <= math.ceil(1.0 * NANO)
    for oracle in sorted(ORACLES):
        approximate = _channel(oracle=oracle, epsilon=1.0, delta=1e-6)
        assert approximate.charge_nano == NANO
        exact = approximate.mechanism.exact_delta()
        assert 0 < exact <= 1e-6 or oracle == "sue"
        assert approximate.charge_delta == delta_units_up(exact)
        assert approximate.charge_delta <= delta_units_up(1e-6)
