"""The agent end to end: a real process, a real Mosquitto, a real paho subscriber."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from edge_agent.mechanisms import from_description
from edge_agent.spending import duration_text
from edge_agent.state import NANO, Budget, StateStore
from tests.support import (
    REPO,
    AgentProcess,
    Mosquitto,
    SimulatedTime,
    Subscriber,
    run_module,
    write_agent_config,
)
from tests.support.schema import protocol_validator


def check_messages(reports: list[dict]) -> dict[str, list[dict]]:
    """Schema, grid and seq continuity; returns the unique messages per channel in seq order."""
    by_channel: dict[str, dict[int, dict]] = defaultdict(dict)
    for message in reports:
        protocol_validator().validate(message)
        seen = by_channel[message["channel"]].setdefault(message["seq"], message)
        assert seen == message, "a redelivered seq must carry the same message"
        mechanism = from_description(message["mechanism"])
        components = getattr(mechanism, "components", None)
        codes = message["codes"]
        lists = codes if isinstance(codes[0] if codes else 0, list) else [codes]
        for i, code_list in enumerate(lists):
            grid = components[i] if components else mechanism
            assert all(0 <= c < grid.n_cells for c in code_list)
    ordered = {}
    for channel, seqs in by_channel.items():
        assert sorted(seqs) == list(range(len(seqs))), f"{channel}: seq gap"
        ordered[channel] = [seqs[i] for i in sorted(seqs)]
    return ordered


def decode(messages: list[dict], component: int | None = None) -> np.ndarray:
    values = []
    for message in messages:
        mechanism = from_description(message["mechanism"])
        codes = message["codes"]
        if component is None:
            values.append(mechanism.from_codes(np.array(codes, dtype=np.int64)))
        else:
            values.append(mechanism.components[component].from_codes(
                np.array(codes[component], dtype=np.int64)))
    return np.concatenate(values) if values else np.empty(0)


def ledger(state_dir) -> tuple[float, int]:
    db = sqlite3.connect(f"file:{state_dir}/state.sqlite?mode=ro", uri=True)
    spent, reports = db.execute("SELECT COALESCE(SUM(spent_nano), 0), "
                                "COALESCE(SUM(reports), 0) FROM spending").fetchone()
    db.close()
    return spent / 1e9, reports


# -- a recording replayed from CSV: the estimates match the data --------------------------------

def write_recording(path, n, rng):
    """A MotionSense-style export with an unnamed index column and known contents."""
    roll = rng.vonmises(1.0, 2.0, n)
    ax = np.clip(rng.gamma(2.0, 0.25, n) - 0.3, -2, 2)
    ay = np.clip(rng.normal(0.2, 0.4, n), -2, 2)
    with open(path, "w") as f:
        f.write(",attitude.roll,attitude.pitch,userAcceleration.x,userAcceleration.y\n")
        for i in range(n):
            f.write(f"{i},{roll[i]:.6f},0.1,{ax[i]:.6f},{ay[i]:.6f}\n")
    return roll, ax, ay


def test_csv_replay_end_to_end_estimates_match_the_data(tmp_path, mosquitto):
    n = 3000
    roll, ax, ay = write_recording(tmp_path / "rec.csv", n, np.random.default_rng(3))
    config = write_agent_config(
        tmp_path / "agent.toml", broker=mosquitto, state_dir=tmp_path / "state",
        sources=[{"name": "phone", "type": "csv", "path": str(tmp_path / "rec.csv"),
                  "pace": "fast", "derive": ["horizontal"],
                  "columns": {"roll": "attitude.roll", "accel_x": "userAcceleration.x",
                              "accel_y": "userAcceleration.y"}}],
        channels=[
            {"name": "ax_u", "source": "phone", "field": "accel_x", "kind": "linear",
             "mechanism": "ogpm-unbiased", "epsilon": 2.0, "domain": [-2.0, 2.0]},
            {"name": "ax", "source": "phone", "field": "accel_x", "kind": "linear",
             "mechanism": "ogpm", "epsilon": 2.0, "domain": [-2.0, 2.0]},
            {"name": "roll", "source": "phone", "field": "roll", "kind": "circular",
             "epsilon": 2.0, "origin": -math.pi},
            {"name": "h", "source": "phone", "fields": ["accel_h_mag", "accel_h_dir"],
             "kind": "polar", "epsilon": 6.0, "radius_max": 2.0},
        ])
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/#")
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    # The file ends: the agent sends everything and exits 0 by itself.
    assert agent.wait(120) == 0, agent.output()
    assert subscriber.wait_for(lambda: sum(
        len(m["codes"]) for m in subscriber.reports("ax")) >= n, 10)
    channels = check_messages(subscriber.reports())
    assert set(channels) == {"ax_u", "ax", "roll", "h"}
    for name in ("ax_u", "ax", "roll"):
        assert sum(len(m["codes"]) for m in channels[name]) == n

    # Unbiased OGPM: the plain mean of the reports estimates the mean reading.
    y = decode(channels["ax_u"])
    mech = from_description(channels["ax_u"][0]["mechanism"])
    se = math.sqrt(np.mean(mech.variance(ax)) / n)
    assert abs(y.mean() - ax.mean()) < 5 * se
    # Classical OGPM: reports average to the mean of E[M(x)], the known bias.
    y = decode(channels["ax"])
    mech = from_description(channels["ax"][0]["mechanism"])
    assert abs(y.mean() - np.mean(mech.mean_output(ax))) < 5 * math.sqrt(
        np.mean(mech.variance(ax)) / n)
    # Circular: E[exp(i M(x))] = rho exp(i x).
    y = decode(channels["roll"])
    rho = from_description(channels["roll"][0]["mechanism"]).mean_resultant_length()
    assert abs(np.cos(y).mean() - rho * np.cos(roll).mean()) < 5 / math.sqrt(n)
    assert abs(np.sin(y).mean() - rho * np.sin(roll).mean()) < 5 / math.sqrt(n)
    # Polar radius: classical OGPM on [0, radius_max].
    radius = np.hypot(ax, ay)
    polar = from_description(channels["h"][0]["mechanism"])
    y = decode(channels["h"], component=0)
    assert y.size == n
    assert abs(y.mean() - np.mean(polar.radius_mechanism.mean_output(radius))) < 5 * math.sqrt(
        np.mean(polar.radius_mechanism.variance(radius)) / n)
    # The ledger charged exactly what was sent.
    spent, reports = ledger(tmp_path / "state")
    assert reports == 4 * n and spent == pytest.approx(n * (2 + 2 + 2 + 6))
    statuses = subscriber.statuses()
    assert statuses[0]["state"] == "online" and statuses[-1]["state"] == "offline"
    subscriber.close()


# -- a synthetic wearable for ~10 s: topics, schema, seq, status, budget ---------------------------

SYNTHETIC_CHANNELS = [
    {"name": "accel_x", "source": "imu", "field": "accel_x", "kind": "linear",
     "epsilon": 1.0, "domain": [-2.0, 2.0]},
    {"name": "yaw", "source": "imu", "field": "yaw", "kind": "circular", "epsilon": 1.0},
    {"name": "accel_polar", "source": "imu", "fields": ["accel_h_mag", "accel_h_dir"],
     "kind": "polar", "epsilon": 3.0, "radius_max": 2.0},
    {"name": "accel", "source": "imu", "fields": ["accel_x", "accel_y", "accel_z"],
     "kind": "vector", "epsilon": 2.0, "domain": [-2.0, 2.0], "strategy": "sample", "k": 1},
]


def test_synthetic_wearable_streams_for_ten_seconds(tmp_path, mosquitto):
    config = write_agent_config(tmp_path / "agent.toml", broker=mosquitto,
                                state_dir=tmp_path / "state",
                                sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50}],
                                channels=SYNTHETIC_CHANNELS)
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/#")
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    assert subscriber.wait_for(lambda: len(subscriber.reports("accel_x")) >= 5, 60), \
        agent.output()
    time.sleep(10)
    assert agent.terminate() == 0, agent.output()
    time.sleep(0.5)
    topics = {t for t, _, _ in subscriber.messages}
    assert topics == {f"ldp/v1/demo/w1/{c['name']}" for c in SYNTHETIC_CHANNELS} | {
        "ldp/v1/demo/w1/status"}
    channels = check_messages(subscriber.reports())
    counts = {name: sum(len(m["codes"]) if m["kind"] != "vector"
                        else len(m["codes"][0]) + len(m["codes"][1]) + len(m["codes"][2])
                        for m in messages) for name, messages in channels.items()}
    assert counts["accel_x"] >= 450  # 50 Hz for ~10 s
    assert counts["accel_x"] == counts["yaw"] == counts["accel"]
    # Polar reports carry one radius and one angle code per reading.
    assert all(len(m["codes"][0]) == len(m["codes"][1]) for m in channels["accel_polar"])
    # The persisted ledger holds exactly the epsilon of what was published.
    spent, _ = ledger(tmp_path / "state")
    assert spent == pytest.approx(counts["accel_x"] * (1 + 1 + 3 + 2))
    budget = run_cli("budget", "--config", str(config), "--json")
    assert budget.returncode == 0, budget.stderr
    current = json.loads(budget.stdout)  # the rolling period that ends now
    assert current["spent"] == pytest.approx(spent)
    assert current["channels"]["yaw"]["reports"] == counts["yaw"]
    # Synthetic accelerations look like a wearable: gravity on z, within the domain.
    z = decode([{"mechanism": m["mechanism"], "codes": m["codes"][2]}
                for m in channels["accel"]])
    assert 0.3 < z.mean() < 1.5
    statuses = subscriber.statuses()
    assert statuses[0]["state"] == "online" and statuses[-1]["state"] == "offline"
    assert not any(str(v) in agent.output() for v in ("accel_x=", "value="))
    subscriber.close()
    # The device-only status, written at exit: counters that depend on readings, which
    # no published status carries.
    local = run_cli("status", "--config", str(config))
    assert local.returncode == 0, local.stderr
    mine = json.loads(local.stdout)["status"]["w1"]
    assert mine["channels"]["accel_x"]["reports"] == counts["accel_x"]
    for name in ("non_finite_dropped", "clipped", "budget_refused", "clock_behind", "errors"):
        assert name in mine["channels"]["accel_x"]
        assert all(name not in s.get("channels", {}).get("accel_x", {}) for s in statuses)
    assert (tmp_path / "state" / "status.json").stat().st_mode & 0o007 == 0


# -- failures: broker restarts and agent kills lose nothing --------------------------------------

def test_broker_outage_loses_nothing(tmp_path):
    work = tmp_path / "broker"
    work.mkdir()
    broker = Mosquitto(work, extra_conf=f"persistence true\npersistence_location {work}/\n"
                                        "autosave_interval 1\n").start()
    try:
        config = write_agent_config(tmp_path / "agent.toml", broker=broker,
                                    state_dir=tmp_path / "state",
                                    sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50}],
                                    channels=SYNTHETIC_CHANNELS[:2])
        # A persistent session: the broker queues for the subscriber across its restart.
        subscriber = Subscriber(broker, "ldp/v1/demo/+/+", client_id="outage-test")
        agent = AgentProcess(config, tmp_path / "agent.log").start()
        assert subscriber.wait_for(lambda: len(subscriber.reports("accel_x")) >= 5, 60)
        time.sleep(1.5)  # autosave the session
        broker.stop(graceful=True)
        time.sleep(5)  # the agent spools meanwhile
        broker.start()
        time.sleep(6)
        assert agent.terminate() == 0, agent.output()
        spent, reports = ledger(tmp_path / "state")
        assert subscriber.wait_for(
            lambda: sum(len(m["codes"]) for m in subscriber.reports()) >= reports, 20)
        channels = check_messages(subscriber.reports())
        sent = sum(len(m["codes"]) for messages in channels.values() for m in messages)
        assert sent == reports  # every charged report arrived, no seq gap
        assert channels["accel_x"][-1]["seq"] >= 40  # it kept streaming through the outage
        subscriber.close()
    finally:
        broker.stop()


def test_agent_killed_and_restarted_continues_seq_and_budget(tmp_path, mosquitto):
    config = write_agent_config(tmp_path / "agent.toml", broker=mosquitto,
                                state_dir=tmp_path / "state",
                                sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50}],
                                channels=SYNTHETIC_CHANNELS[:2])
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/+/+")
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    assert subscriber.wait_for(lambda: len(subscriber.reports("accel_x")) >= 10, 60)
    agent.kill()
    spent_before, reports_before = ledger(tmp_path / "state")
    seq_before = max(m["seq"] for m in subscriber.reports("accel_x"))
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    assert subscriber.wait_for(
        lambda: max(m["seq"] for m in subscriber.reports("accel_x")) >= seq_before + 10, 60)
    assert agent.terminate() == 0, agent.output()
    spent_after, reports_after = ledger(tmp_path / "state")
    assert spent_after > spent_before and reports_after > reports_before  # budget not reset
    assert subscriber.wait_for(
        lambda: sum(len(m["codes"]) for m in subscriber.reports()) >= reports_after, 20)
    channels = check_messages(subscriber.reports())  # duplicates allowed, gaps not
    assert sum(len(m["codes"]) for ms in channels.values() for m in ms) == reports_after
    subscriber.close()


# -- configuration on the command line ---------------------------------------------------------

def run_cli(*args, timeout=120):
    """An ``edge-agent`` command run to completion."""
    return run_module("edge_agent", *args, timeout=timeout)


def test_check_config_prints_effective_config_and_rejects_bad_ones(tmp_path):
    good = run_cli("check-config", str(REPO / "configs" / "agent.toml"))
    assert good.returncode == 0, good.stderr
    effective = json.loads(good.stdout)
    polar = effective["mechanisms"]["accel_polar"]["mechanism"]
    assert polar["epsilon_radius"] + polar["epsilon_angle"] == pytest.approx(polar["epsilon"])
    assert effective["channels"][2]["epsilon"] == polar["epsilon"]  # the planner's
    assert effective["batch_seconds"] == 1.0
    # The sample says nothing about itself but what a wearer gets and the plan: no
    # channel's readings reach flat ends, every part of every channel gets epsilon.
    for line in good.stderr.splitlines():
        assert line.startswith(("What a wearer gets: ", "Plan (", "  ")), line
    bad = tmp_path / "bad.toml"
    sample = (REPO / "configs" / "agent.toml").read_text()
    assert sample.count("radius_max = 2.0 ") == 1  # the polar channel, channels[2]
    bad.write_text(sample.replace("radius_max = 2.0 ", "radius_max = -1 "))
    result = run_cli("check-config", str(bad))
    assert result.returncode == 2
    assert "channels[2].radius_max: must be > 0, got -1" in result.stderr
    assert run_cli("run", "--config", str(bad)).returncode == 78  # EX_CONFIG: no restart loop
    missing = run_cli("check-config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_check_config_says_how_much_of_a_recording_lies_in_flat_ends(tmp_path):
    """A channel fed by a CSV recording: check-config reads it (derived fields too) and
    says which share of its readings lies in the mechanism's flat ends, exactly the share
    of the file's values inside the regions it names; a channel without flat ends (PM-C)
    gets no line."""
    rng = np.random.default_rng(5)
    heart = np.clip(rng.normal(65, 8, 3000), 40, 200)  # resting rates: OGPM's low flat end
    ax, ay = rng.normal(1.0, 0.3, 3000), rng.normal(0.0, 0.1, 3000)
    path = tmp_path / "rec.csv"
    path.write_text("hr,ax,ay\n" + "".join(f"{a:.3f},{b:.3f},{c:.3f}\n"
                                           for a, b, c in zip(heart, ax, ay)))
    config = write_agent_config(
        tmp_path / "agent.toml", state_dir=tmp_path / "state",
        sources=[{"name": "rec", "type": "csv", "path": str(path), "derive": ["horizontal"],
                  "columns": {"heart_rate": "hr", "accel_x": "ax", "accel_y": "ay"}}],
        channels=[{"name": "hr", "source": "rec", "field": "heart_rate", "kind": "linear",
                   "epsilon": 0.5, "domain": [40.0, 200.0]},
                  {"name": "ax", "source": "rec", "field": "accel_x", "kind": "linear",
                   "mechanism": "pm-c", "epsilon": 0.5, "domain": [-2.0, 2.0]},
                  {"name": "hm", "source": "rec", "fields": ["accel_h_mag", "accel_h_dir"],
                   "kind": "polar", "epsilon": 4.0, "radius_max": 2.0}])
    result = run_cli("check-config", str(config))
    assert result.returncode == 0, result.stderr
    from edge_agent.channels import build_channels
    from edge_agent.config import load_config
    channels = {c.name: c for c in build_channels(load_config(config), "w1")}
    regions = channels["hr"].flat_regions()[""][1]
    recorded = np.round(heart, 3)
    share = np.mean([any(a <= v <= b for a, b in regions) for v in recorded])
    assert share > 0.8
    assert (f"Flat ends: hr (ogpm at epsilon 0.5) reports the same distribution for every "
            f"value in [{regions[0][0]:.4g}, {regions[0][1]:.4g}]") in result.stderr
    assert (f"where {share:.1%} of the readings of the recording (its first 3,000 rows) of "
            f"source 'rec' lie") in result.stderr
    radius = np.hypot(np.round(ax, 3), np.round(ay, 3))
    radius_regions = channels["hm"].flat_regions()["radius"][1]
    radius_share = np.mean([any(a <= v <= b for a, b in radius_regions) for v in radius])
    radius_epsilon = channels["hm"].mechanism.epsilon_radius
    assert f"Flat ends: hm's radius (ogpm at epsilon {radius_epsilon:.3g})" in result.stderr
    assert f"where {radius_share:.1%} of the readings of the recording" in result.stderr
    assert "Flat ends: ax " not in result.stderr


def test_check_config_names_flat_ends_where_a_simulated_or_assumed_fleet_reads(tmp_path):
    """A synthetic source: check-config simulates a fleet of it, and the vertical axis
    (gravity and running's steps, up to 2.6 g) reaches OGPM's flat ends on [-3, 3] at
    epsilon 0.3 where the forward one (within 1.5 g) does not.  A source whose readings
    nothing shows (JSON lines from standard input): the plan's fleet decides (plan_spread
    around the middle: the exact normal share), and a narrower stated spread clears it.
    A polar split = "report" at a small epsilon leaves the radius nothing, and says so;
    split = "fleet" (the default) gives it a share."""
    from edge_agent.channels import build_channels
    from edge_agent.config import load_config
    from edge_agent.config.planning import FleetShape

    def check(spread, split):
        path = write_agent_config(
            tmp_path / "agent.toml", state_dir=tmp_path / "state",
            privacy={"plan_spread": spread},
            sources=[{"name": "imu", "type": "synthetic", "rate_hz": 20},
                     {"name": "pipe", "type": "jsonl", "path": "-"}],
            channels=[{"name": name, "source": "imu", "field": name, "kind": "linear",
                       "epsilon": 0.3, "domain": [-3.0, 3.0], "report_interval": 60.0}
                      for name in ("accel_x", "accel_z")] + [
                      {"name": "level", "source": "pipe", "field": "level", "kind": "linear",
                       "epsilon": 0.5, "domain": [0.0, 1.0], "report_interval": 60.0},
                      {"name": "hm", "source": "imu", "fields": ["accel_h_mag", "accel_h_dir"],
                       "kind": "polar", "epsilon": 0.5, "radius_max": 2.0, "split": split,
                       "radius_mechanism": "pm-c", "report_interval": 60.0}])
        result = run_cli("check-config", str(path))
        assert result.returncode == 0, result.stderr
        return result.stderr, {c.name: c for c in build_channels(load_config(path), "w1")}

    said, channels = check(0.15, "report")
    assert "Flat ends: accel_z (ogpm at epsilon 0.3)" in said
    assert "of the readings of a simulated fleet of source 'imu' lie" in said
    assert "Flat ends: accel_x" not in said
    regions = channels["level"].flat_regions()[""][1]
    share = FleetShape(0.15).share_in(regions, 0.0, 1.0)
    assert 0.01 < share < 0.2
    assert (f"where {share:.1%} of the readings of a fleet spread by plan_spread 0.15 of the "
            f"width around the domain's middle lie") in said
    assert "No epsilon: hm's radius gets none of the channel's epsilon" in said
    said, channels = check(0.05, "fleet")
    assert "Flat ends: level" not in said and "No epsilon" not in said
    assert channels["hm"].mechanism.epsilon_radius > 0


def test_check_config_states_the_sample_guarantees_and_its_plan():
    """The sample: two guarantees, planned; check-config says what a wearer gets, and
    per channel the worst case of each window, which all channels and the range reserve
    together keep within the guarantee."""
    result = run_cli("check-config", str(REPO / "configs" / "agent.toml"))
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    assert result.stderr.splitlines()[0] == (
        "What a wearer gets: any 10 minutes of a wearer's data: ε ≤ 4; any day of a "
        "wearer's data: ε ≤ 120")
    assert "WARNING" not in result.stderr
    channels = plan["channels"]
    assert len(channels) == 7
    for per, guarantee in (("10m", 4), ("1d", 120)):
        worst = sum(c["epsilon_in_any"][per] for c in channels.values())
        assert worst + plan["range_discovery_epsilon"] <= guarantee
        assert worst + plan["range_discovery_epsilon"] > guarantee * 0.95  # little left over
    accel_x = channels["accel_x"]
    assert accel_x["epsilon_in_any"]["1d"] == pytest.approx(
        accel_x["reports_in_any"]["1d"] * accel_x["epsilon_per_report"])
    line = next(x for x in result.stderr.splitlines() if x.startswith("  accel_x: "))
    assert line.startswith(f"  accel_x: one report every {duration_text(accel_x['every_seconds'])}"
                           f" at ε {accel_x['epsilon_per_report']:.6g} (a random phase per "
                           f"wearer); at most 1 in any 10 minutes")
    assert "range discovery: ε 1 kept free in every window" in result.stderr


MANUAL = [{"name": "accel_x", "source": "imu", "field": "accel_x", "kind": "linear",
           "epsilon": 1.0, "domain": [-2, 2], "report_interval": 900.0},
          {"name": "roll", "source": "imu", "field": "roll", "kind": "circular",
           "epsilon": 1.0, "report_interval": 1800.0}]


def test_check_config_says_how_long_the_budget_lasts(tmp_path):
    """Manual channels: one reporting every 15 minutes lasts the day; one reporting every
    half second runs out of its budget within minutes, and check-config says so."""
    path = write_agent_config(tmp_path / "a.toml", state_dir=tmp_path, budget=500.0,
                              batch_seconds=1.0, channels=MANUAL,
                              sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50}])
    good = run_cli("check-config", str(path))
    budget = json.loads(good.stdout)["budget"]
    [day] = budget["guarantees"]
    assert day["whole_period"] and day["lasts_seconds"] == 86400
    assert day["epsilon_per_period"] == pytest.approx(96 + 48)
    assert budget["channels"]["accel_x"]["reports_per_second"] == 1 / 900
    assert "WARNING" not in good.stderr and "lasts the whole window" in good.stderr
    assert "What a wearer gets: any day of a wearer's data: ε ≤ 500" in good.stderr
    busy = write_agent_config(tmp_path / "b.toml", state_dir=tmp_path, budget=500.0,
                              batch_seconds=1.0,
                              channels=[{**MANUAL[0], "report_interval": 0.5}, MANUAL[1]],
                              sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50}])
    result = run_cli("check-config", str(busy))
    assert result.returncode == 0, result.stderr
    [day] = json.loads(result.stdout)["budget"]["guarantees"]
    # accel_x: 2 reports a second at epsilon 1, and roll as before.
    spent_per_second = 2.0 + 48 / 86400
    assert day["lasts_seconds"] == pytest.approx(500 / spent_per_second, rel=1e-9)
    assert day["limited_by"] == "epsilon" and not day["whole_period"]
    assert "WARNING: ε ≤ 500 per 1d runs out 4 min 10 s into each 1d" in result.stderr
    assert "accel_x: 2/s × ε 1 = ε 172800 per 1d" in result.stderr


def test_budget_shows_every_guarantees_window(tmp_path):
    """Two guarantees: a charge an hour ago counts in the day's window only."""
    state = tmp_path / "state"
    config = write_agent_config(
        tmp_path / "agent.toml", state_dir=state, budget=None,
        privacy={"guarantees": [{"epsilon": 4, "per": "10m"}, {"epsilon": 120, "per": "1d"}]})
    clock = SimulatedTime(wall=time.time() - 3600)
    store = StateStore(state / "state.sqlite", monotonic=clock.monotonic,
                       boot_id=clock.boot_id)
    budget = Budget.of_guarantees([(4.0, 600.0, 0.0), (120.0, 86400.0, 0.0)])
    with store.transaction(clock.wall) as tx:
        assert tx.charge("w1", "ax", cost=3 * NANO, wanted=1, budget=budget) == 1
    with store.transaction(clock.advance(3600)) as tx:  # the ten minutes hold only these
        assert tx.charge("w1", "ax", cost=NANO, wanted=9, budget=budget) == 4
    store.close()
    report = json.loads(run_cli("budget", "--config", str(config), "--json").stdout)
    ten, day = report["guarantees"]
    assert (ten["period"], ten["spent"], ten["remaining"]) == ("10m", 4.0, 0.0)
    assert (day["period"], day["spent"], day["remaining"]) == ("1d", 7.0, 113.0)
    assert report["spent"] == 7.0 and report["channels"] == day["channels"]
    text = run_cli("budget", "--config", str(config)).stdout
    assert "ε 4 in every rolling 10m: spent 4, remaining 0" in text
    assert "ε 120 in every rolling 1d: spent 7, remaining 113" in text


@pytest.mark.parametrize("command", [("run",), ("fleet", "--count", "2")])
def test_an_unwritable_state_dir_is_one_line_naming_the_key_and_exit_78(tmp_path, command):
    """A state_dir the agent cannot write (here: under a file, which fails even for
    root) is refused at start-up with the key and a way out, not a traceback."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    config = tmp_path / "agent.toml"
    sample = (REPO / "configs" / "agent.toml").read_text()
    assert sample.count('state_dir = "/var/lib/edge-agent"') == 1
    config.write_text(sample.replace('state_dir = "/var/lib/edge-agent"',
                                     f'state_dir = "{blocker}/state"'))
    result = run_cli(command[0], "--config", str(config), *command[1:])
    assert result.returncode == 78, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"privacy.state_dir: cannot write {blocker}/state" in lines[0]
    assert "~/.local/state/edge-agent" in lines[0]


def test_files_the_agent_cannot_read_are_named_at_start_up(tmp_path):
    config = write_agent_config(
        tmp_path / "agent.toml", state_dir=tmp_path / "state",
        broker=None, sources=[{"name": "rec", "type": "csv", "path": str(tmp_path / "no.csv"),
                               "columns": {"x": "x"}}],
        channels=[{"name": "x", "source": "rec", "field": "x", "kind": "linear",
                   "epsilon": 1.0, "domain": [0, 1]}])
    text = config.read_text().replace(
        "[privacy]", f'[broker]\npassword_file = "{tmp_path / "no-password"}"\n\n[privacy]')
    config.write_text(text)
    result = run_cli("run", "--config", str(config))
    assert result.returncode == 78 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [
        f"{config}: invalid configuration: broker.password_file: cannot read "
        f"{tmp_path / 'no-password'} (No such file or directory)",
        f"{config}: invalid configuration: sources[0].path: cannot read "
        f"{tmp_path / 'no.csv'} (No such file or directory)"]


def test_a_state_dir_under_home_is_expanded():
    from edge_agent.config import PrivacyConfig

    assert PrivacyConfig(budget_epsilon=1, state_dir="~/x").state_dir == Path.home() / "x"


def test_budget_shows_delta_spent_and_remaining(tmp_path):
    """`edge-agent budget` with (epsilon, delta) spending, on a ledger the agent wrote."""
    state = tmp_path / "state"
    config = write_agent_config(tmp_path / "agent.toml", state_dir=state, budget=10.0,
                                privacy={"budget_delta": 1e-6})
    store = StateStore(state / "state.sqlite")
    budget = Budget.of(10.0, 86400.0, 1e-6)  # 1e-6 rounds down to 999_999_999 units
    with store.transaction() as tx:  # now: the rolling period the command shows
        assert tx.charge("w1", "ax", cost=NANO, wanted=5, budget=budget,
                         delta_cost=400_000_000) == 2
        assert tx.charge("w1", "ay", cost=NANO, wanted=1, budget=budget) == 1
    store.close()
    result = run_cli("budget", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["spent"], report["remaining"]) == (3.0, 7.0)
    assert (report["budget_delta"], report["spent_delta"]) == (1e-6, 8e-7)
    assert report["remaining_delta"] == 199_999_999 / 10**15
    assert report["channels"] == {"ax": {"spent": 2.0, "reports": 2, "delta": 8e-7},
                                  "ay": {"spent": 1.0, "reports": 1, "delta": 0.0}}
    text = run_cli("budget", "--config", str(config))
    assert text.returncode == 0, text.stderr
    assert "delta: budget 1e-06; spent 8e-07, remaining 2e-07" in text.stdout
    assert [line.split()[-1] for line in text.stdout.splitlines()[-2:]] == ["8e-07", "0"]
    # Delta spent shows even after budget_delta went back to 0 (nothing of it remains);
    # an agent that never spent any and has no delta budget shows none.
    plain = write_agent_config(tmp_path / "plain.toml", state_dir=state, budget=10.0)
    report = json.loads(run_cli("budget", "--config", str(plain), "--json").stdout)
    assert (report["budget_delta"], report["spent_delta"], report["remaining_delta"]) == \
        (0.0, 8e-7, 0.0)
    other = json.loads(run_cli("budget", "--config", str(plain), "--agent", "w2",
                               "--json").stdout)
    assert other["channels"] == {} and "spent_delta" not in other and "budget_delta" not in other
