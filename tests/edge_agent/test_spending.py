"""How long a configuration's budget lasts (edge_agent.spending): the rates per source
type, the shared budget, delta, and the text a person reads."""

import pytest

from edge_agent.cli import implied
from edge_agent.config import parse_config
from edge_agent.spending import budget_lines, duration_text, period_words, rate_text
from tests.support import agent_config

JSONL = {"name": "bridge", "type": "jsonl", "path": "-"}
IMU = {"name": "imu", "type": "synthetic", "rate_hz": 20}


def linear(name: str, source: str, report_interval: float, epsilon: float = 1.0) -> dict:
    return {"name": name, "source": source, "field": "accel_x", "kind": "linear",
            "epsilon": epsilon, "domain": [-2, 2], "report_interval": report_interval}


def plan(tmp_path, channels, sources=(IMU,), **privacy):
    guarantees = "guarantees" in privacy
    config = parse_config(agent_config(state_dir=tmp_path, sources=sources, channels=channels,
                                       budget=None if guarantees else privacy.pop("budget",
                                                                                 100.0),
                                       period=None if guarantees else "1h", privacy=privacy))
    budget = implied(config)["budget"]
    return budget, budget_lines(config, budget)


def test_rates_come_from_the_source_and_the_report_interval(tmp_path):
    budget, lines = plan(tmp_path, [linear("every", "imu", 0.0), linear("slow", "imu", 10.0),
                                    linear("fast", "imu", 0.01, epsilon=0.5)])
    channels = budget["channels"]
    assert channels["every"]["reports_per_second"] == 20  # every reading of a 20 Hz source
    assert channels["slow"]["reports_per_second"] == 0.1
    assert channels["fast"]["reports_per_second"] == 20  # not faster than the readings
    # 20 + 0.1 + 10 epsilon a second against 100 an hour: 100 / 30.1 s.
    [hour] = budget["guarantees"]
    assert hour["lasts_seconds"] == pytest.approx(100 / 30.1, rel=1e-12)
    assert channels["slow"]["alone_lasts_seconds"] == {"1h": 1000.0}
    assert lines[0] == "What a wearer gets: any hour of a wearer's data: ε ≤ 100"
    assert lines[1].startswith("WARNING: ε ≤ 100 per 1h runs out 3.3 s into each 1h")


def test_a_source_without_a_fixed_rate_is_bounded_by_the_interval_or_unknown(tmp_path):
    budget, lines = plan(tmp_path, [linear("bounded", "bridge", 60.0)], sources=(JSONL,))
    assert budget["channels"]["bounded"]["rate_is_upper_bound"]
    [hour] = budget["guarantees"]
    assert hour["whole_period"] and hour["lasts_seconds"] == 3600
    assert "at most 1/min" in lines[2]
    budget, lines = plan(tmp_path, [linear("any", "bridge", 0.0)], sources=(JSONL,))
    assert budget["guarantees"][0]["lasts_seconds"] is None
    assert budget["unknown_rate"] == ["any"]
    assert "depends on how fast the data comes" in lines[1]
    assert "rate unknown; set report_interval" in lines[2]


def test_delta_can_be_what_runs_out_first(tmp_path):
    categorical = {"name": "activity", "source": "imu", "field": "activity",
                   "kind": "categorical", "categories": ["rest", "walk", "run"],
                   "epsilon": 0.1, "delta": 1e-6, "report_interval": 1.0}
    budget, lines = plan(tmp_path, [categorical], budget_delta=1e-4)
    # epsilon: 0.1 a second lasts 1000 s; delta: 1e-6 a second (at least: rounded up in
    # the ledger's units) lasts at most 100 s.
    [hour] = budget["guarantees"]
    assert hour["limited_by"] == "delta"
    assert hour["lasts_seconds"] == pytest.approx(100, rel=1e-6)
    assert lines[1].startswith("WARNING: ε ≤ 100, δ ≤ 0.0001 per 1h runs out 1 min 40 s")
    assert lines[1].endswith("Raise report_interval or the guarantee's delta")


def test_each_guarantee_lasts_as_its_own_window_allows_and_is_said_in_words(tmp_path):
    """Two guarantees: 4 per 10 minutes and 120 per day.  One report a minute at ε 0.5
    spends 5 per 10 minutes (runs out 8 minutes into each) and 720 per day (runs out 4 h
    into each)."""
    budget, lines = plan(tmp_path, [linear("x", "imu", 60.0, epsilon=0.5)],
                         guarantees=[{"epsilon": 120, "per": "1d"},
                                     {"epsilon": 4, "per": "10m"}])
    ten, day = budget["guarantees"]
    assert (ten["per"], day["per"]) == ("10m", "1d")
    assert ten["epsilon_per_period"] == pytest.approx(5.0)
    assert ten["lasts_seconds"] == pytest.approx(480.0)
    assert day["lasts_seconds"] == pytest.approx(14400.0)
    assert budget["channels"]["x"]["epsilon_per_period"] == {"10m": pytest.approx(5.0),
                                                             "1d": pytest.approx(720.0)}
    assert budget["promise"] == lines[0][len("What a wearer gets: "):] == \
        "any 10 minutes of a wearer's data: ε ≤ 4; any day of a wearer's data: ε ≤ 120"
    assert lines[1].startswith("WARNING: ε ≤ 4 per 10m runs out 8 min into each 10m")
    assert lines[2].startswith("WARNING: ε ≤ 120 per 1d runs out 4 h into each 1d")
    assert lines[3] == "  x: 1/min × ε 0.5 = ε 5 per 10m, ε 720 per 1d"


@pytest.mark.parametrize("per, words", [("10m", "10 minutes"), ("1d", "day"), ("1h", "hour"),
                                        ("12h", "12 hours"), ("1w", "week"),
                                        ("1.5h", "1.5 hours"), ("90s", "90 seconds")])
def test_periods_read_as_words(per, words):
    assert period_words(per) == words


@pytest.mark.parametrize("seconds, text", [
    (8.31, "8.3 s"), (82.0, "1 min 22 s"), (3600, "1 h"), (5000, "1 h 23 min"),
    (187200, "2 d 4 h"), (86460, "1 d"), (600, "10 min")])
def test_durations_read_in_two_units_at_most(seconds, text):
    assert duration_text(seconds) == text


@pytest.mark.parametrize("per_second, text", [
    (2.0, "2/s"), (0.1, "6/min"), (1 / 600, "6/h"), (1 / 86400, "1/d")])
def test_rates_read_in_the_unit_that_makes_them_whole(per_second, text):
    assert rate_text(per_second) == text
