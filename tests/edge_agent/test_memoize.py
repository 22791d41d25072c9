"""Memoized categorical reports (memoize = true, L-GRR): a value's memo is drawn once and
kept in the state file, through restarts; every report is charged the instantaneous
layer's exact loss; the lifetime account counts the distinct values memoized and stays on
the device; through a real Mosquitto a fleet's memoized reports reach the collector's
estimate of the shares."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from collector.estimation.frequencies import frequency_summary
from edge_agent.agent import AgentCore, AgentService
from edge_agent.config import ConfigError, parse_config
from edge_agent.mechanisms.categorical import LongitudinalGRR
from edge_agent.readings import Readings
from edge_agent.sources.base import Source
from edge_agent.state import NANO, StateStore
from tests.support import (
    CollectorProcess,
    FakeTransport,
    FleetProcess,
    SimulatedTime,
    Subscriber,
    agent_config,
    wait_until,
    write_agent_config,
)

LABELS = ["rest", "walk", "run", "cycle"]
MEMOIZED = {"name": "act", "source": "rec", "kind": "categorical", "field": "activity",
            "categories": LABELS, "epsilon": 20.0, "memo_epsilon": 0.5, "memoize": True}
T0 = 1_800_000_000.0


class Words(Source):
    """The scripted activity of each batch."""

    def __init__(self, script):
        super().__init__("rec")
        self.script = list(script)

    def poll(self, now):
        words = self.script.pop(0) if self.script else []
        return Readings(now - 1 + np.arange(len(words)) / max(1, len(words)), {},
                        {"activity": np.array(words, dtype=object)})


def config_of(tmp_path, **changes):
    return parse_config(agent_config(
        state_dir=tmp_path, budget=1e6, batch_seconds=1.0,
        sources=[{"name": "rec", "type": "jsonl"}], channels=[{**MEMOIZED, **changes}]))


def run(tmp_path, clock, script, seed, **changes):
    """One life of the agent: a batch per script entry; returns the reported codes and
    the core (its store closed)."""
    config = config_of(tmp_path, **changes)
    store = StateStore(tmp_path / "state.sqlite", monotonic=clock.monotonic,
                       boot_id=clock.boot_id)
    core = AgentCore(config, store, sources={"rec": Words(script)},
                     rng=np.random.default_rng(seed))
    before = len(store.pending(0, 10_000))  # the spool keeps earlier lives' (no broker)
    for _ in script:
        core.tick(clock.advance(1.0))
    codes = [json.loads(p)["codes"] for _, _, p, _ in store.pending(0, 10_000)[before:]]
    accounts = store.memo_account("w1")
    local = core.local_status()
    published = core.status()
    spending = store.budget_report("w1", 86400.0)
    store.close()
    return codes, accounts, local, published, spending, core


def test_memos_are_drawn_once_and_survive_a_restart(tmp_path):
    """Instantaneous ε 20 (a report is its memo but for 1e-8), memo ε 0.5 (memos are
    mostly other categories): after a restart with another random source every value is
    reported as before, and only a newly reported value counts its memo."""
    clock = SimulatedTime(T0)
    first, accounts, *_ = run(tmp_path, clock, [["rest", "walk"], ["walk", "rest"]], seed=1)
    assert accounts == {"act": (2, 2 * 500_000_000)}
    memo = {"rest": first[0][0], "walk": first[0][1]}
    assert first[1] == [memo["walk"], memo["rest"]]
    memos = []
    for seed in range(2, 7):  # restarts with other random sources
        again, accounts, *_ = run(tmp_path, clock, [["walk", "rest", "walk"]], seed=seed)
        memos += again
        assert accounts == {"act": (2, 2 * 500_000_000)}
    assert all(codes == [memo["walk"], memo["rest"], memo["walk"]] for codes in memos)
    codes, accounts, *_ = run(tmp_path, clock, [["run"]], seed=9)
    assert accounts == {"act": (3, 3 * 500_000_000)}


def test_every_category_is_memoized_before_the_first_batch_whatever_the_values(tmp_path):
    """The service draws every category's memo before its first batch (one transaction),
    so a value's first appearance draws nothing: the memos table is the same before and
    after reports of values, and whichever values a wearer has; only ``reported`` is set
    for the values reported."""
    config = config_of(tmp_path)
    service = AgentService(config, transport=FakeTransport(), rng=np.random.default_rng(5))
    service.cores[0].sources = {"rec": Words([])}
    service.draw_memos()
    drawn = memo_rows(service.store)
    assert [value for value, _, _ in drawn] == sorted(LABELS)
    assert all(reported is None for _, _, reported in drawn)
    assert service.store.memo_account("w1") == {}
    service.cores[0].sources = {"rec": Words([["run", "run"], ["rest"]])}
    service.tick(T0)
    service.tick(T0 + 1)
    after = memo_rows(service.store)
    assert [(v, m) for v, m, _ in after] == [(v, m) for v, m, _ in drawn]  # none new
    assert {v for v, _, reported in after if reported is not None} == {"run", "rest"}
    assert service.store.memo_account("w1") == {"act": (2, 2 * 500_000_000)}
    service.draw_memos()  # a restart draws none again
    assert memo_rows(service.store) == after
    service.store.close()


def memo_rows(store) -> list[tuple[str, int, float | None]]:
    return store._db.execute("SELECT value, memo, reported FROM memos ORDER BY value").fetchall()


def test_changed_categories_memoize_again_and_the_account_counts_both(tmp_path):
    clock = SimulatedTime(T0)
    run(tmp_path, clock, [["rest"]], seed=1)
    _, accounts, *_ = run(tmp_path, clock, [["rest"]], seed=1, categories=[*LABELS, "swim"])
    assert accounts == {"act": (2, 2 * 500_000_000)}  # one memo per domain, both counted


def test_each_report_is_charged_the_instantaneous_layer_and_the_account_stays_local(tmp_path):
    clock = SimulatedTime(T0)
    _, _, local, published, spending, core = run(
        tmp_path, clock, [["rest", "walk", "rest"]], seed=3, epsilon=1.0)
    channel = core.channels[0]
    assert channel.charge_nano == channel.mechanism.instant.exact_privacy_loss().ceiling(NANO)
    nano, reports, _ = spending["act"]
    assert reports == 3 and nano == 3 * channel.charge_nano
    assert local["channels"]["act"]["memoized_values"] == 2
    assert local["channels"]["act"]["memo_epsilon_spent"] == pytest.approx(1.0)
    # how many distinct values a wearer had depends on the readings: never published
    assert "memoized_values" not in json.dumps(published)
    assert "memo_epsilon" not in json.dumps(published)


@pytest.mark.parametrize("changes, message", [
    (dict(memo_epsilon=None), "channels[0]: memo_epsilon: required with memoize = true"),
    (dict(memoize=False), "channels[0]: memo_epsilon: only with memoize = true"),
    (dict(oracle="olh"), "channels[0]: oracle: memoized reports are GRR's"),
])
def test_memoize_configuration_errors_name_the_key(tmp_path, changes, message):
    with pytest.raises(ConfigError) as error:
        config_of(tmp_path, **changes)
    assert message in str(error.value)


def test_check_config_states_the_lifetime_bound_and_the_planner_plans_it(tmp_path):
    path = write_agent_config(
        tmp_path / "a.toml", state_dir=tmp_path, budget=None, batch_seconds=1.0,
        sources=[{"name": "imu", "type": "synthetic"}],
        channels=[{k: v for k, v in MEMOIZED.items() if k != "epsilon"} | {"source": "imu"}],
        privacy={"guarantees": [{"epsilon": 2, "per": "10m"}]})
    result = subprocess.run([sys.executable, "-m", "edge_agent", "check-config", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert ("act: memoized: over a wearer's whole life its reports reveal ε ≤ 0.5 about "
            "each value they had (at most 4 × 0.5 = 2 in all)") in result.stderr
    plan = json.loads(result.stdout)["plan"]["channels"]["act"]
    assert plan["epsilon_in_any"]["10m"] <= 2


def test_a_fleet_of_memoized_wearers_through_mosquitto_and_the_collector(tmp_path, mosquitto):
    """400 virtual wearers, each reporting its one activity twice (one memo): the two
    reports of a wearer agree (instantaneous ε 8), and the collector's shares, from the
    two layers' exact p and q, hold the true shares within 5 of their standard errors.
    These take a wearer's two reports together (``cluster_stderr``, cluster-robust by
    agent): about √2 times the errors of 800 independent reports."""
    count = 400
    rng = np.random.default_rng(4)
    activity = rng.choice(LABELS, count, p=[0.5, 0.3, 0.15, 0.05])
    path = tmp_path / "rows.csv"
    # the fleet's csv source strides: wearer i reads rows i and i + count
    path.write_text("activity\n" + "".join(f"{a}\n" for a in [*activity, *activity]))
    collector = CollectorProcess(tmp_path, mosquitto).start()
    config = write_agent_config(
        tmp_path / "fleet.toml", broker=mosquitto, state_dir=tmp_path / "state",
        sources=[{"name": "rec", "type": "csv", "path": str(path), "pace": "fast",
                  "columns": {"activity": "activity"}}],
        channels=[{**MEMOIZED, "epsilon": 8.0, "memo_epsilon": 1.0}])
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/+/act")  # also the collector's _aggregates
    wearers = lambda: [json.loads(p) for t, p, _ in list(subscriber.messages)  # noqa: E731
                       if "/_" not in t]
    fleet = FleetProcess(config, tmp_path / "fleet.log", count).start()
    try:
        assert fleet.wait(120) == 0, fleet.output()
    finally:
        fleet.kill()
    assert wait_until(lambda: sum(len(m["codes"]) for m in wearers()) == 2 * count, 30)
    reports: dict[str, list[int]] = {}
    for message in wearers():
        assert message["mechanism"]["name"] == "l-grr"
        assert message["mechanism"]["memo_epsilon"] == 1.0
        reports.setdefault(message["agent"], []).extend(message["codes"])
    subscriber.close()
    agree = np.mean([codes[0] == codes[1] for codes in reports.values()])
    assert agree > 0.98  # the same memo, reported nearly as is
    assert wait_until(lambda: collector.api()["channels"].get("act", {}).get("count")
                      == 2 * count, 30)
    frequencies = collector.api()["channels"]["act"]["frequencies"]
    true = np.array([np.mean(activity == label) for label in LABELS])
    estimate, stderr = np.array(frequencies["estimate"]), np.array(frequencies["stderr"])
    assert np.all(np.abs(estimate - true) <= 5 * stderr), (estimate, true)
    oracle = LongitudinalGRR(epsilon=8.0, memo_epsilon=1.0, categories=len(LABELS))
    independent = frequency_summary(oracle, np.round(np.array(frequencies["raw"]) * 2 * count
                                                     ).astype(np.int64), 2 * count)["stderr"]
    cluster = np.array(frequencies["cluster_stderr"])
    assert np.all(stderr >= cluster) and np.all(cluster > 1.2 * np.array(independent)), (
        cluster, independent)
    assert collector.terminate() == 0
