"""How long a configuration's budget lasts (edge_agent.spending): the rates per source
type, the shared budget, delta, and the text a person reads."""

import pytest

from edge_agent.cli import implied
from edge_agent.config import parse_config
from edge_agent.spending import budget_lines, duration_text, rate_text
from tests.support import agent_config

JSONL = {"name": "bridge", "type": "jsonl", "path": "-"}
IMU = {"name": "imu", "type": "synthetic", "rate_hz": 20}


def linear(name: str, source: str, report_interval: float, epsilon: float = 1.0) -> dict:
    return {"name": name, "source": source, "field": "accel_x", "kind": "linear",
            "epsilon": epsilon, "domain": [-2, 2], "report_interval": report_interval}


def plan(tmp_path, channels, sources=(IMU,), **privacy):
    config = parse_config(agent_config(state_dir=tmp_path, sources=sources, channels=channels,
                                       budget=privacy.pop("budget", 100.0), period="1h",
                                       privacy=privacy))
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
    assert budget["lasts_seconds"] == pytest.approx(100 / 30.1, rel=1e-12)
    assert channels["slow"]["alone_lasts_seconds"] == 1000.0
    assert lines[0].startswith("WARNING: budget_epsilon = 100 per 1h runs out 3.3 s into")


def test_a_source_without_a_fixed_rate_is_bounded_by_the_interval_or_unknown(tmp_path):
    budget, lines = plan(tmp_path, [linear("bounded", "bridge", 60.0)], sources=(JSONL,))
    assert budget["channels"]["bounded"]["rate_is_upper_bound"]
    assert budget["whole_period"] and budget["lasts_seconds"] == 3600
    assert "at most 1/min" in lines[1]
    budget, lines = plan(tmp_path, [linear("any", "bridge", 0.0)], sources=(JSONL,))
    assert budget["lasts_seconds"] is None and budget["unknown_rate"] == ["any"]
    assert "depends on how fast the data comes" in lines[0]
    assert "rate unknown; set report_interval" in lines[1]


def test_delta_can_be_what_runs_out_first(tmp_path):
    categorical = {"name": "activity", "source": "imu", "field": "activity",
                   "kind": "categorical", "categories": ["rest", "walk", "run"],
                   "epsilon": 0.1, "delta": 1e-6, "report_interval": 1.0}
    budget, lines = plan(tmp_path, [categorical], budget_delta=1e-4)
    # epsilon: 0.1 a second lasts 1000 s; delta: 1e-6 a second (at least: rounded up in
    # the ledger's units) lasts at most 100 s.
    assert budget["limited_by"] == "budget_delta"
    assert budget["lasts_seconds"] == pytest.approx(100, rel=1e-6)
    assert lines[0].startswith("WARNING: budget_delta = 0.0001 per 1h runs out 1 min 40 s")


@pytest.mark.parametrize("seconds, text", [
    (8.31, "8.3 s"), (82.0, "1 min 22 s"), (3600, "1 h"), (5000, "1 h 23 min"),
    (187200, "2 d 4 h"), (86460, "1 d"), (600, "10 min")])
def test_durations_read_in_two_units_at_most(seconds, text):
    assert duration_text(seconds) == text


@pytest.mark.parametrize("per_second, text", [
    (2.0, "2/s"), (0.1, "6/min"), (1 / 600, "6/h"), (1 / 86400, "1/d")])
def test_rates_read_in_the_unit_that_makes_them_whole(per_second, text):
    assert rate_text(per_second) == text
