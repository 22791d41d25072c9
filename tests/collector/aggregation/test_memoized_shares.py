"""A memoized categorical channel's total (L-GRR): its reports are counted per agent, and
the shares' intervals take an agent's reports together (cluster-robust), since they share
one memo.  The variance against a slow reference, the intervals' coverage over many
windows against the independent ones', and the per-agent counts through merges and saved
states (fixed seeds)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from collector.aggregation.series import Series, new_series
from collector.aggregation.stats import AgentSupportCounts, StateError
from collector.estimation.frequencies import cluster_robust_variance, frequency_summary
from edge_agent import protocol
from edge_agent.mechanisms.categorical import LongitudinalGRR

ORACLE = LongitudinalGRR(epsilon=3.0, memo_epsilon=1.0, categories=3)
SETTINGS = dict(bins=50, window_seconds=60.0, keep_windows=5)


def memoized_series(oracle=ORACLE) -> Series:
    return new_series(kind="categorical", channel="act", description=protocol.describe(oracle),
                      **SETTINGS)


def reference_variance(oracle, reports_of: dict[str, list[int]]) -> list[float]:
    """The sandwich variance as its definition reads, one report at a time: each report's
    term (supports v - q) / (p - q), an agent's sum T_g of its n_g terms, the mean m of
    all terms, then G / (G - 1) · Σ_g (T_g - n_g m)² / n²."""
    p, q = (float(x) for x in oracle.support_probabilities)
    n = sum(len(codes) for codes in reports_of.values())
    clusters = len(reports_of)
    variances = []
    for v in range(oracle.categories):
        sums = {agent: sum(((code == v) - q) / (p - q) for code in codes)
                for agent, codes in reports_of.items()}
        mean = sum(sums.values()) / n
        spread = sum((sums[agent] - len(codes) * mean) ** 2
                     for agent, codes in reports_of.items())
        variances.append(clusters / (clusters - 1) * spread / n ** 2)
    return variances


def test_the_cluster_robust_variance_is_the_sandwich_of_the_per_report_terms():
    reports_of = {"w1": [0, 0, 0, 1, 0], "w2": [2, 2, 1], "w3": [1, 1, 1, 1, 0, 1, 2],
                  "w4": [0]}
    statistic = AgentSupportCounts(ORACLE.name, ORACLE.epsilon, ORACLE.categories,
                                   ORACLE.delta, ORACLE.memo_epsilon)
    for agent, codes in reports_of.items():  # one message per agent, in two batches
        half = len(codes) // 2
        for part in (codes[:half], codes[half:]):
            statistic.update((np.full(len(part), agent), np.array(part, dtype=np.int64)))
    per_agent = statistic.get()
    assert per_agent["agents"] == ["w1", "w2", "w3", "w4"]
    assert per_agent["reports"].tolist() == [5, 3, 7, 1]
    variance = cluster_robust_variance(ORACLE, per_agent["support"], per_agent["reports"])
    assert np.allclose(variance, reference_variance(ORACLE, reports_of), rtol=1e-12)
    # One agent: no spread between agents to measure.
    assert cluster_robust_variance(ORACLE, per_agent["support"][:1],
                                   per_agent["reports"][:1]) is None
    # The interval takes the larger of it and the independent reports' variance.
    counts, n = per_agent["support"].sum(axis=0), 16
    independent = frequency_summary(ORACLE, counts, n)
    clustered = frequency_summary(ORACLE, counts, n, cluster_variance=variance)
    assert clustered["cluster_stderr"] == pytest.approx(np.sqrt(variance).tolist())
    assert clustered["stderr"] == pytest.approx(
        np.maximum(independent["stderr"], np.sqrt(variance)).tolist())


def test_the_totals_interval_covers_a_memoized_fleets_shares_over_many_windows():
    """100 wearers, each with one activity for good (50/30/20%), report it 2 times a window
    for 20 windows through the real L-GRR (memo ε 1, drawn once per wearer; instantaneous
    ε 3): 40 reports of one memo each.  The total's 95% intervals, from the collector's
    series, cover the fleet's shares in 96% of 400 runs (measured: 0.96 for seeds 1-5);
    the intervals that take the 4,000 reports as independent cover them in 29% (0.27-0.30):
    the memos' noise shrinks with the wearers, not with their reports."""
    rng = np.random.default_rng(3)
    agents, windows, per_message = 100, 20, 2
    values = np.repeat(np.arange(3), [50, 30, 20])
    truth = np.bincount(values) / agents
    names = [f"w{i:03d}" for i in range(agents)]
    hits, independent_hits = [], []
    for _ in range(400):
        memos = ORACLE.memoize(values, rng)
        reports = ORACLE.respond(np.repeat(memos, windows * per_message), rng).reshape(
            agents, windows, per_message)
        series = memoized_series()
        series.update_many([(names[a], 60.0 * w, reports[a, w])
                            for w in range(windows) for a in range(agents)])
        low, high = np.array(series.get()["frequencies"]["ci95"]).T
        hits.append((low <= truth) & (truth <= high))
        independent = frequency_summary(ORACLE, series.total["value"].support.counts,
                                        series.count())
        low, high = np.array(independent["ci95"]).T
        independent_hits.append((low <= truth) & (truth <= high))
    assert np.mean(hits) >= 0.94, np.mean(hits, axis=0)
    assert np.mean(independent_hits) < 0.5, np.mean(independent_hits)


def _messages(rng, agents=4, count=24):
    """``count`` messages of 3 reports, from ``agents`` wearers in turn, each its own memo."""
    memos = ORACLE.memoize(np.arange(agents) % ORACLE.categories, rng)
    return [(f"w{i % agents}", 25.0 * i, ORACLE.respond(np.full(3, memos[i % agents]), rng))
            for i in range(count)]


def _from_state(state) -> Series:
    return Series.from_state(msgspec.json.decode(msgspec.json.encode(state)), **SETTINGS)


def test_counts_per_agent_merge_and_survive_saved_states():
    """Only the total counts per agent; a merge of two halves equals the whole, and a
    saved state (the checkpoint's and a partition's JSON) gives it back, intervals
    included."""
    rng = np.random.default_rng(5)
    messages = _messages(rng)
    whole, left, right = memoized_series(), memoized_series(), memoized_series()
    whole.update_many(messages)
    for i, message in enumerate(messages):
        (left if i % 2 else right).update(agent=message[0], t=message[1], codes=message[2])
    merged = left.merge(right)
    assert merged == whole and merged.get(windows=True) == whole.get(windows=True)
    assert whole.total["value"].agents.get()["reports"].tolist() == [18, 18, 18, 18]
    assert all(window["value"].agents is None for window in whole.windows.values())
    frequencies = whole.get()["frequencies"]
    assert len(frequencies["cluster_stderr"]) == 3
    assert all(w["frequencies"]["cluster_stderr"] is None
               for w in whole.get(windows=True)["windows"])
    again = _from_state(whole.to_state())
    assert again == whole and again.get() == whole.get()
    # A channel that does not memoize keeps nothing per agent, and writes what it wrote.
    grr = new_series(kind="categorical", channel="act", **SETTINGS,
                     description=protocol.describe(ORACLE.instant))
    grr.update(agent="w1", t=0.0, codes=np.array([0, 1, 2]))
    assert grr.total["value"].agents is None
    assert b'"agents":{' not in msgspec.json.encode(grr.to_state())
    assert grr.get()["frequencies"]["cluster_stderr"] is None


def test_a_total_saved_before_counts_per_agent_keeps_the_independent_interval():
    """A memoized total restored from a state without counts per agent (written before
    they were kept) has none from then on, and neither has a merge with it: counts of
    part of the reports would understate the spread between agents."""
    rng = np.random.default_rng(6)
    series = memoized_series()
    series.update_many(_messages(rng))
    state = msgspec.to_builtins(series.to_state())
    del state["total"]["value"]["agents"]
    old = _from_state(state)
    assert old.total["value"].agents is None
    old.update_many(_messages(rng))
    assert old.get()["frequencies"]["cluster_stderr"] is None
    assert old.total["value"].agents is None and "agents" not in msgspec.to_builtins(
        old.to_state())["total"]["value"]
    fresh = memoized_series()
    fresh.update_many(_messages(rng))
    assert fresh.merge(old).total["value"].agents is None


@pytest.mark.parametrize("change, message", [
    (lambda s: s["total"]["value"]["agents"]["w0"][1].__setitem__(0, 99),
     r"series\.total\.value\.agents\.w0: counts add up to"),
    (lambda s: s["total"]["value"]["agents"]["w0"].__setitem__(1, [0, 0]),
     r"agents\.w0: expected 3 counts"),
    (lambda s: s["total"]["value"]["agents"].__setitem__(
        "w9", s["total"]["value"]["agents"].pop("w0")),
     r"total\.value\.agents: reports of an agent the series does not list"),
    (lambda s: s["windows"][0][1]["value"].__setitem__("agents", {}),
     r"windows\[0\]\.value\.agents: only a memoized channel's total"),
    (lambda s: (s["total"]["value"]["agents"]["w0"].__setitem__(
        1, list(reversed(s["total"]["value"]["agents"]["w0"][1])))),
     r"total\.value\.agents: the agents' support counts do not add up"),
])
def test_a_state_whose_counts_per_agent_no_reports_could_give_is_refused(change, message):
    rng = np.random.default_rng(7)
    series = memoized_series()
    series.update_many(_messages(rng))
    state = msgspec.to_builtins(series.to_state())
    change(state)
    with pytest.raises(StateError, match=message):
        Series.from_state(state, **SETTINGS, where="series")
