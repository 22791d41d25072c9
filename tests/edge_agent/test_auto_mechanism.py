"""mechanism = "auto" and OGPM's flat ends (issue 30): the error of a fleet's mean from
the exact closed forms, the choice it makes, the domain an auto-domain channel adopts,
and the range it adopts it from."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent import protocol
from edge_agent.agent import discovered_range
from edge_agent.channels import build_channels
from edge_agent.config import ConfigError, parse_config
from edge_agent.mechanisms import PolarOGPM
from edge_agent.mechanisms.registry import (
    AUTO_CANDIDATES,
    AUTO_REPORTS,
    LINEAR,
    flat_fraction,
    linear_mechanism,
    mechanism_for_data,
)
from tests.support import agent_config

EPSILONS = (0.5, 1.0, 4.0)
DOMAIN = (-1.0, 1.0)


def worst_error(mechanism, data, reports=1000) -> float:
    return float(np.max(mechanism.averaged_error(np.linspace(*data, 513), reports)))


@pytest.mark.parametrize("name", ["ogpm", "pm-c", "sw-c", "laplace", "ii-ptt"])
@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_averaged_error_is_the_grid_pmfs(name, epsilon):
    """E[(mean of n inverted reports - x)²] = Var/n + bias², here summed over the codes'
    exact probabilities (the cells' centres), flat ends included."""
    mechanism = LINEAR[name].build(epsilon=epsilon, low=-1.0, high=1.0, grid_bits=10)
    centres = mechanism.from_codes(np.arange(mechanism.n_cells))
    affine = mechanism.affine_mean()
    a, b = (affine[0], affine[1]) if affine else (1.0, 0.0)
    for x in (-1.0, -0.97, -0.7, -0.2, 0.0, 0.5, 0.95, 1.0):
        pmf = mechanism.grid_pmf(np.array([x]))[0]
        inverted = (centres - b) / a
        mean = pmf @ inverted
        variance = pmf @ (inverted - mean) ** 2
        for reports in (1, 1000):
            expected = variance / reports + (mean - x) ** 2 if affine else \
                (pmf @ (centres - x) ** 2) / reports
            got = float(mechanism.averaged_error(np.array([x]), reports)[0])
            # the closed forms are the continuous mechanism's; the grid's cells are 2/1024
            assert got == pytest.approx(expected, rel=0.02, abs=1e-6), (x, reports)


def test_averaged_error_refuses_a_bad_count():
    mechanism = LINEAR["ogpm"].build(epsilon=1.0, low=-1.0, high=1.0, grid_bits=10)
    with pytest.raises(TypeError):
        mechanism.averaged_error(0.0, 2.5)
    with pytest.raises(ValueError, match="reports"):
        mechanism.averaged_error(0.0, 0)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_auto_takes_pm_c_or_sw_c_near_an_end_and_ogpm_in_the_middle(epsilon):
    for data, expect_ogpm in (((-1.0, -0.85), False), ((0.8, 1.0), False),
                              ((-0.3, 0.3), True), ((-0.1, 0.2), True)):
        chosen = mechanism_for_data("auto", epsilon=epsilon, data=data, bounds=DOMAIN,
                                    grid_bits=16)
        errors = {name: worst_error(LINEAR[name].build(epsilon=epsilon, low=-1.0, high=1.0,
                                                       grid_bits=16), data)
                  for name in AUTO_CANDIDATES}
        assert worst_error(chosen, data) == min(errors.values()), (data, errors)
        assert (chosen.name == "ogpm") == expect_ogpm, (data, chosen, errors)
        if not expect_ogpm:  # OGPM's flat end: its bias does not average away
            assert errors["ogpm"] > 5 * min(errors.values())


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("data", [(-1.0, -0.6), (0.0, 1.0), (3.0, 3.5)])
def test_an_auto_domain_keeps_the_data_out_of_ogpms_flat_ends(epsilon, data):
    bounds, margin = (-10.0, 10.0), 0.1
    mechanism = mechanism_for_data("ogpm", epsilon=epsilon, data=data, bounds=bounds,
                                   grid_bits=16, margin=margin)
    _, _, x_lo, x_hi = mechanism.affine_mean()
    width = data[1] - data[0]
    assert x_lo <= data[0] + 1e-9 * width and data[1] - 1e-9 * width <= x_hi
    assert mechanism.low <= data[0] - margin * width + 1e-12
    assert mechanism.high >= data[1] + margin * width - 1e-12
    # No wider than it needs: the data touch the flat ends' edges or the plain margin.
    flat = flat_fraction("ogpm", epsilon=epsilon, grid_bits=16)
    total = max(width * (1 + 2 * margin), width / (1 - 2 * flat))
    assert mechanism.high - mechanism.low == pytest.approx(total, rel=1e-12)
    # PM-C has no flat ends: the plain margin.
    pm = mechanism_for_data("pm-c", epsilon=epsilon, data=data, bounds=bounds, grid_bits=16,
                            margin=margin)
    assert (pm.low, pm.high) == pytest.approx((data[0] - margin * width,
                                               data[1] + margin * width))


def test_an_auto_domain_stays_inside_its_initial_domain():
    mechanism = mechanism_for_data("ogpm", epsilon=1.0, data=(-1.0, -0.9), bounds=DOMAIN,
                                   grid_bits=16, margin=0.1)
    assert mechanism.low == -1.0 and mechanism.high < 1.0


def test_auto_over_a_whole_domain_and_unknown_names():
    # A fleet anywhere in the domain may sit at an end: PM-C's worst case is the least.
    assert linear_mechanism("auto", epsilon=1.0, low=-1.0, high=1.0, grid_bits=16) == \
        LINEAR["pm-c"].build(epsilon=1.0, low=-1.0, high=1.0, grid_bits=16)
    with pytest.raises(ValueError, match="auto"):
        linear_mechanism("pmc", epsilon=1.0, low=-1.0, high=1.0, grid_bits=16)


def channel(tmp_path, **settings):
    config = parse_config(agent_config(state_dir=tmp_path, channels=[{
        "name": "hr", "kind": "linear", "source": "imu", "field": "heart_rate",
        "epsilon": 1.0, "domain": [40.0, 200.0], **settings}]))
    return build_channels(config, "a")[0]


def test_an_auto_channel_chooses_again_when_the_range_is_discovered(tmp_path):
    auto = channel(tmp_path, mechanism="auto")
    assert auto.describe()["name"] == "pm"  # over the whole domain: PM-C
    assert auto.adopt_range(100.0, 140.0, reports=1000)  # the middle: OGPM
    assert auto.describe()["name"] == "ogpm" and (auto.mechanism.low, auto.mechanism.high) \
        == (40.0, 200.0)
    assert not auto.adopt_range(100.0, 140.0, reports=1000)  # nothing changes
    assert auto.adopt_range(40.0, 60.0, reports=1000)  # at an end: PM-C again
    assert auto.describe()["name"] == "pm"
    fixed = channel(tmp_path / "fixed")
    assert not fixed.adopt_range(40.0, 60.0) and fixed.describe()["name"] == "ogpm"
    assert fixed.flat_ends(40.0, 60.0) == [(40.0, 60.0)]  # all of it
    flat = 160.0 * flat_fraction("ogpm", epsilon=1.0, grid_bits=16)
    assert fixed.flat_ends(30.0, 195.0) == [(40.0, pytest.approx(40.0 + flat)),
                                            (pytest.approx(200.0 - flat), 195.0)]
    assert fixed.flat_ends(100.0, 140.0) == []


def test_vector_channels_take_auto_too(tmp_path):
    config = parse_config(agent_config(state_dir=tmp_path, channels=[{
        "name": "acc", "kind": "vector", "source": "imu", "epsilon": 3.0, "mechanism": "auto",
        "fields": ["accel_x", "accel_y", "accel_z"], "domain": [-2.0, 2.0],
        "strategy": "split"}]))
    assert build_channels(config, "a")[0].describe()["name"] in ("ogpm", "pm", "sw")


class Result:
    def __init__(self, estimate, interval=None, participants=None):
        self.estimate, self.interval, self.participants = estimate, interval, participants


def test_the_discovered_range_is_the_intervals_outer_ends():
    assert discovered_range(Result(1.0, (0.5, 1.2), 300), Result(9.0, (8.7, 9.6), 280)) == \
        ((0.5, 9.6), 280)
    # a coordinator that gave no interval: its estimates, and a thousand reports
    assert discovered_range(Result(1.0), Result(9.0)) == ((1.0, 9.0), 1000)
    assert discovered_range(None, Result(9.0)) is None


# -- a polar channel's radius ---------------------------------------------------------------

POLAR = {"name": "hm", "kind": "polar", "source": "imu",
         "fields": ["accel_h_mag", "accel_h_dir"], "epsilon": 4.0, "radius_max": 2.0}


@pytest.mark.parametrize("radius,expected", [("ogpm", "ogpm"), ("pm-c", "pm"), ("sw-c", "sw"),
                                             ("auto", "pm")])
def test_a_polar_radius_takes_a_mechanism_without_flat_ends(radius, expected):
    """The split stays the channel's (split = "fleet" by default); the radius's share
    goes to the named mechanism, or with "auto" to the candidate of least worst-case error
    over [0, radius_max] (PM-C at the radius's 2.27 here); what reports announce
    rebuilds it exactly, and only a
    radius that is not OGPM names itself on the wire (earlier reports stay valid)."""
    config = parse_config(agent_config(state_dir="/tmp/unused",
                                       channels=[{**POLAR, "radius_mechanism": radius}]))
    (channel,) = build_channels(config, "w1")
    polar = channel.mechanism
    reference = PolarOGPM(epsilon=4.0, radius_max=2.0, split="fleet")
    assert (polar.epsilon_radius, polar.epsilon_angle) == (reference.epsilon_radius,
                                                         reference.epsilon_angle)
    assert polar.radius_mechanism.name == expected
    assert polar.radius_mechanism.epsilon == polar.epsilon_radius
    assert polar.exact_privacy_loss().at_most(4.0)
    described = protocol.describe(polar)
    assert protocol.mechanism_of(described) == polar
    assert ("radius" in protocol.as_dict(described)) == (expected != "ogpm")
    flat = channel.flat_regions()["radius"][1]
    assert bool(flat) == (expected == "ogpm")  # OGPM's flat end at 0, the others none
    if radius == "auto":
        worst = {name: float(np.max(linear_mechanism(
            name, epsilon=polar.epsilon_radius, low=0.0, high=2.0, grid_bits=16)
            .averaged_error(np.linspace(0.0, 2.0, 257), AUTO_REPORTS)))
            for name in AUTO_CANDIDATES}
        assert min(worst, key=worst.get) == "pm-c"


def test_a_polar_radius_mechanism_is_checked():
    with pytest.raises(ValueError, match=r"radius: must be one of ogpm, pm-c, sw-c, got 'pm'"):
        PolarOGPM(epsilon=1.0, radius_max=1.0, radius="pm")
    with pytest.raises(ConfigError, match=r"radius_mechanism"):
        parse_config(agent_config(state_dir="/tmp/unused",
                                  channels=[{**POLAR, "radius_mechanism": "duchi"}]))
