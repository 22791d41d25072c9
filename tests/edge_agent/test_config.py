"""Configuration: the commented sample loads, and every mistake names its key and range."""

from __future__ import annotations

import copy

import pytest

from edge_agent.config import ConfigError, load_config, parse_config, parse_period
from edge_agent.protocol import KINDS
from tests.support import REPO
from tests.support.configs import AX_CHANNEL, agent_config

BASE = {
    "agent_id": "w1", "fleet": "demo",
    "privacy": {"budget_epsilon": 500, "state_dir": "/tmp/state"},
    "sources": [{"name": "imu", "type": "synthetic"}],
    "channels": [
        {"name": "ax", "source": "imu", "field": "accel_x", "kind": "linear", "epsilon": 1,
         "domain": [-2, 2]},
        {"name": "roll", "source": "imu", "field": "roll", "kind": "circular", "epsilon": 1},
        {"name": "p", "source": "imu", "fields": ["accel_h_mag", "accel_h_dir"],
         "kind": "polar", "epsilon": 3, "radius_max": 2},
    ],
}


def test_sample_config_loads_with_every_kind():
    config = load_config(REPO / "configs" / "agent.toml")
    assert config.agent_id == "wearable-01" and config.fleet == "demo"
    assert {c.kind for c in config.channels} == set(KINDS)
    assert config.privacy.period_seconds == 86400
    assert config.broker.port == 1883 and config.batch_seconds == 1.0


def error_for(mutate) -> str:
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["channels"][2].update(epsilon=-1),
     "channels[2].epsilon: must be in [1e-05, 20], got -1"),
    (lambda d: d["channels"][0].update(epsilon=0),
     "channels[0].epsilon: must be in [1e-05, 20], got 0"),
    # Below EPSILON_MIN the mechanisms have no integer sampler: refused here, not at start-up.
    (lambda d: d["channels"][1].update(epsilon=1e-12),
     "channels[1].epsilon: must be in [1e-05, 20], got 1e-12"),
    (lambda d: d["privacy"].update(budget_epsilon=0), "privacy.budget_epsilon: must be > 0, got 0"),
    # What only the mechanism can tell is said here too, not at the agent's start.
    (lambda d: d["channels"][0].update(domain=[1.0, 1.0 + 1e-12]),
     "channels[0]: its mechanism refuses it: low, high: the width must be at least 1e-100"),
    (lambda d: d["channels"][0].update(domain=[-8e307, 8e307]),
     "channels[0]: its mechanism refuses it: low, high: [-8e+307, 8e+307] is too wide"),
    (lambda d: d["channels"].append({"name": "v", "source": "imu", "kind": "vector",
                                     "fields": ["accel_x", "accel_y", "accel_z"],
                                     "epsilon": 2e-5, "domain": [-1.0, 1.0]}),
     "channels[3]: its mechanism refuses it: epsilon 2e-05 over 3 axes is 6.67e-06 per axis, "
     "below the least a mechanism takes (1e-05)"),
    (lambda d: d["broker"] if "broker" in d else d.update(broker={"port": 70000}),
     "broker.port: must be <= 65535, got 70000"),
    (lambda d: d.update(batch_seconds=0.001), "batch_seconds: must be >= 0.05, got 0.001"),
    (lambda d: d["channels"][0].update(domain=[2, 1]),
     "channels[0].domain: must be [low, high] with finite low < high, got [2.0, 1.0]"),
    (lambda d: d["channels"][1].update(kind="spiral"),
     "channels[1].kind: must be one of 'linear', 'circular', 'polar', 'vector', 'categorical', "
     "got 'spiral'"),
    (lambda d: d["channels"][0].update(mechanism="gauss"), "channels[0].mechanism: must be one of"),
    (lambda d: d["channels"][1].update(unit="grad"),
     "channels[1].unit: must be one of 'rad' or 'deg', got 'grad'"),
    (lambda d: d["channels"][0].update(name="status"),
     "channels[0].name: 'status' is reserved for the agent's status topic"),
    (lambda d: d.update(agent_id="_collector"), "agent_id: must be 1-64 letters"),
    (lambda d: d.update(fleet="a/b"), "fleet: must be 1-64 letters"),
    (lambda d: d["channels"][0].update(field="blood_pressure"),
     "channels[0]: source 'imu' has no field 'blood_pressure'"),
    (lambda d: d["channels"][0].update(source="gps"), "channels[0].source: no source named 'gps'"),
    (lambda d: d["channels"].append(dict(d["channels"][0])),
     "channels[3].name: 'ax' is used twice"),
    (lambda d: d["privacy"].update(budget_period="1 day"),
     "privacy.budget_period: must look like 30m, 12h, 1d or 1w, got '1 day'"),
    (lambda d: d["privacy"].update(budget_period="10s"), "must be at least 1 minute"),
    (lambda d: d.update(colour="red"), "colour: is not a known key"),
    (lambda d: d["sources"][0].update(rate_hz=-5), "sources[0].rate_hz: must be > 0, got -5"),
    (lambda d: d["sources"][0].update(type="gps"), "sources[0].type: must be one of"),
    (lambda d: d.pop("privacy"), "privacy: is required"),
    (lambda d: d["channels"].append({"name": "v", "source": "imu", "kind": "vector",
                                     "fields": ["accel_x", "accel_y"], "epsilon": 1,
                                     "domain": [-1, 1], "strategy": "sample", "k": 3}),
     "k must be in [1, 2], got 3"),
    (lambda d: d.update(broker={"password": "a", "password_file": "/x"}),
     "set password or password_file, not both"),
])
def test_errors_name_the_key_and_the_range(mutate, message):
    assert message in error_for(mutate)


def test_all_problems_are_reported_at_once():
    def two(d):
        d["channels"][0]["epsilon"] = -1
        d["channels"][2]["radius_max"] = 0
    text = error_for(two)
    assert "channels[0].epsilon" in text and "channels[2].radius_max: must be > 0" in text


def test_toml_syntax_and_missing_file(tmp_path):
    bad = tmp_path / "a.toml"
    bad.write_text("agent_id = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.toml")


def test_periods():
    assert parse_period("1d") == 86400 and parse_period("12h") == 43200
    assert parse_period("1w") == 604800 and parse_period("30m") == 1800


# -- [privacy] guarantees ----------------------------------------------------------------

def _guarantees(*guarantees, channels=None, **privacy):
    return parse_config(agent_config(
        state_dir="/tmp/unused", budget=None, batch_seconds=None,
        privacy={"guarantees": [dict(g) for g in guarantees], **privacy},
        **({"channels": channels} if channels is not None else {})))


def test_guarantees_are_kept_shortest_first_and_the_shorthand_is_one_of_them():
    config = _guarantees({"epsilon": 120, "per": "1d"}, {"epsilon": 4, "per": "10m"})
    assert [(g.epsilon, g.seconds) for g in config.privacy.horizons] == [(4, 600), (120, 86400)]
    assert config.privacy.period_seconds == 86400
    shorthand = parse_config(agent_config(state_dir="/tmp/unused", budget=500.0, period="1d"))
    assert [(g.epsilon, g.per, g.delta) for g in shorthand.privacy.horizons] == \
        [(500.0, "1d", 0.0)]


@pytest.mark.parametrize(("guarantees", "privacy", "message"), [
    ([{"epsilon": 4, "per": "10m"}, {"epsilon": 5, "per": "600s"}], {},
     r"guarantees\[1\]\.per: 600s is also guarantees\[0\]'s window"),
    ([{"epsilon": 8, "per": "10m"}, {"epsilon": 4, "per": "1d"}], {},
     r"guarantees\[0\]: implied by guarantees\[1\]: any 10m lies within a 1d"),
    ([{"epsilon": 4, "per": "10m", "delta": 1e-9}, {"epsilon": 40, "per": "1d"}], {},
     r"guarantees\[1\]\.delta: 0 per 1d"),
    ([{"epsilon": 4, "per": "10m"}], {"budget_epsilon": 10},
     r"budget_epsilon: the shorthand for one guarantee"),
    ([{"epsilon": 4, "per": "10s"}], {},
     r"privacy\.guarantees\[0\]\.per: must be at least 1 minute"),
    ([], {}, r"guarantees.*at least 1 item"),
])
def test_contradicting_or_redundant_guarantees_are_errors_naming_the_key(guarantees, privacy,
                                                                         message):
    with pytest.raises(ConfigError, match=message):
        _guarantees(*guarantees, **privacy)


def test_no_guarantee_at_all_is_an_error():
    with pytest.raises(ConfigError, match="guarantees: missing"):
        parse_config(agent_config(state_dir="/tmp/unused", budget=None))


def test_a_channel_no_guarantee_lets_report_is_an_error_naming_it():
    with pytest.raises(ConfigError, match=r"channels\[0\]\.epsilon: 2 per report is more than "
                                          r"the privacy guarantee allows in any 10m \(1\)"):
        _guarantees({"epsilon": 1, "per": "10m"}, {"epsilon": 50, "per": "1d"},
                    channels=[{**AX_CHANNEL, "epsilon": 2.0}])
