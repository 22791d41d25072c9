"""Estimates computed once, in order of priority: what each push computes (``compute``),
what a late report makes stale, and documents that say they are still computing."""

from __future__ import annotations

import msgspec
import pytest

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import TOTAL
from collector.api import documents
from collector.api.documents import FEW_AGENTS, Views, compute, plan
from collector.api.server import WebServer
from tests.support.burst import burst, channel_names
from tests.support.configs import FLEET
from tests.support.web import request, strict_json

WINDOW = 10.0
KEEP = 6
NOW = 100_000.0
VALID = channel_names(3, "valid")
JUNK = channel_names(20, "junk")


def ingest(ingestor: Ingestor, messages, now: float = NOW) -> None:
    for topic, payload in messages:
        assert ingestor.ingest(topic, payload, now) == "accepted"


@pytest.fixture
def ingestor() -> Ingestor:
    """Three channels of 5 agents and 20 channels one device invented, each with six
    10-s windows of history."""
    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=WINDOW, keep_windows=KEEP)
    ingest(ingestor, burst(channels=VALID, agents=[f"a{i}" for i in range(5)], windows=KEEP,
                           values=40, window_seconds=WINDOW, now=NOW))
    ingest(ingestor, burst(channels=JUNK, agents=["intruder"], windows=KEEP, values=40,
                           window_seconds=WINDOW, now=NOW, seed=1))
    return ingestor


def newest(ingestor: Ingestor, name: str) -> int:
    return max(ingestor.series[name][ingestor.latest[name]].starts)


def done_for(work, ingestor: Ingestor, name: str) -> list:
    return work.done.get(ingestor.latest[name], [])


def test_the_first_tier_is_every_fleet_channels_total_and_newest_window(ingestor):
    assert FEW_AGENTS == 2
    work_plan = plan(ingestor, None)
    twin = ingestor.copy_aggregates(work_plan.keys())
    work = compute(twin, work_plan, budget=0.0)  # no time beyond the first part
    for name in VALID:
        assert done_for(work, ingestor, name) == [TOTAL, newest(ingestor, name)]
    for name in JUNK:  # invented by one device: after everyone else's
        assert done_for(work, ingestor, name) == []
    assert work.left == len(VALID) * (KEEP - 1) + len(JUNK) * (KEEP + 1)


def test_the_budget_counts_from_the_start_of_the_push(ingestor, monkeypatch):
    """The first tier always completes, and the rest stops once the budget has passed
    since the push began: a first tier longer than the budget leaves no time for it.  (A
    clock that each estimate moves by 0.1 s: 6 first-tier estimates take 0.6 s.)"""
    clock = {"now": 0.0}
    monkeypatch.setattr(documents.time, "perf_counter", lambda: clock["now"])
    work_plan = plan(ingestor, None)

    def copy_taking_a_tenth_an_estimate() -> Ingestor:
        twin = ingestor.copy_aggregates(work_plan.keys())
        for by_identity in twin.series.values():
            for series in by_identity.values():
                def timed(key, compute=series.compute):
                    clock["now"] += 0.1
                    return compute(key)
                series.compute = timed
        return twin

    over = compute(copy_taking_a_tenth_an_estimate(), work_plan, budget=0.45)
    assert sum(map(len, over.done.values())) == len(work_plan.first) == 2 * len(VALID)
    assert (over.first_seconds, over.later_seconds) == (pytest.approx(0.6), 0.0)
    within = compute(copy_taking_a_tenth_an_estimate(), work_plan, budget=0.85)
    assert sum(map(len, within.done.values())) == len(work_plan.first) + 3  # 0.6 s, then 3


def test_the_rest_follows_within_the_budget_fleet_channels_first(ingestor):
    work_plan = plan(ingestor, None)
    twin = ingestor.copy_aggregates(work_plan.keys())
    work = compute(twin, work_plan, budget=None)
    assert work.left == 0
    order = list(work.done)
    # Every fleet channel's history before any invented channel's.
    assert {identity[0] for identity in order[:len(VALID)]} == set(VALID)
    for name in VALID + JUNK:
        assert sorted(done_for(work, ingestor, name), key=lambda k: -1 if k is None else k) \
            == [TOTAL, *sorted(ingestor.series[name][ingestor.latest[name]].starts)]
    # Kept by the live ingestor: nothing is left to compute.
    ingestor.keep(twin, work.done)
    assert all(series.stale() == [] for by_identity in ingestor.series.values()
               for series in by_identity.values())


def test_computed_estimates_are_kept_and_never_computed_again(ingestor):
    views = Views(lambda: ingestor, clock=lambda: NOW, budget_seconds=None)
    first = views.documents(views.capture())
    assert sum(len(keys) for keys in views.last_work.done.values()) == \
        (len(VALID) + len(JUNK)) * (KEEP + 1)
    second = views.documents(views.capture())
    assert views.last_work.done == {}
    assert msgspec.to_builtins(second.channel_details) == \
        msgspec.to_builtins(first.channel_details)
    assert all(detail["state"] == "ready" for detail in first.channel_details.values())


def test_a_late_report_recomputes_its_window_and_the_total_only(ingestor):
    views = Views(lambda: ingestor, clock=lambda: NOW, budget_seconds=None)
    views.documents(views.capture())
    name = VALID[1]
    oldest = min(ingestor.series[name][ingestor.latest[name]].starts)
    late = list(burst(channels=[name], agents=["late"], windows=KEEP, values=40,
                      window_seconds=WINDOW, now=NOW, seed=7))[0]  # into the oldest window
    ingest(ingestor, [late])
    assert ingestor.series[name][ingestor.latest[name]].stale() == [TOTAL, oldest]
    views.documents(views.capture())
    assert views.last_work.done == {ingestor.latest[name]: [TOTAL, oldest]}


def test_a_document_not_computed_yet_says_so_and_is_served(ingestor):
    # Budget 0: only the first tier is ever computed, so the invented channels' estimates
    # and the fleet channels' older windows stay "computing".
    views = Views(lambda: ingestor, clock=lambda: NOW, budget_seconds=0.0)
    web = WebServer(views, host="127.0.0.1", port=0, push_seconds=0.2).start()
    try:
        channels = strict_json(request(web, "GET", "/api/channels")[2])["channels"]
        junk = channels[JUNK[0]]
        assert junk["state"] == "computing" and junk["count"] == KEEP * 40
        assert junk["mean"]["estimate"] is None and junk["window"] is None
        valid = channels[VALID[0]]
        assert valid["state"] == "computing"  # its older windows are not computed
        assert valid["mean"]["estimate"] is not None and valid["window"] is not None
        for path in (f"/api/channels/{JUNK[0]}", f"/api/channels/{JUNK[0]}/history",
                     f"/api/channels/{VALID[0]}/history"):
            status, _, body = request(web, "GET", path)
            assert status == 200 and strict_json(body)["state"] == "computing", path
        history = strict_json(request(web, "GET", f"/api/channels/{VALID[0]}/history")[2])
        assert [point["start"] for point in history["points"]] == \
            [newest(ingestor, VALID[0]) * WINDOW]
    finally:
        web.stop()


def test_a_push_copies_the_sums_of_what_it_plans_to_compute_only(ingestor):
    work_plan = plan(ingestor, later_limit=5)
    assert len(work_plan.first) == 2 * len(VALID) and len(work_plan.later) == 5
    assert work_plan.left == len(VALID) * (KEEP - 1) + len(JUNK) * (KEEP + 1) - 5
    twin = ingestor.copy_aggregates(work_plan.keys())
    copied = sum(len(series.windows) + (series.total is not None)
                 for by_identity in twin.series.values() for series in by_identity.values())
    assert copied == len(work_plan.first) + len(work_plan.later)
    # The rest is not lost: it is still what the live series have to compute.
    ingestor.keep(twin, compute(twin, work_plan, None).done)
    assert sum(len(series.stale()) for by_identity in ingestor.series.values()
               for series in by_identity.values()) == work_plan.left


def test_a_report_older_than_every_kept_window_leaves_nothing_to_compute(ingestor):
    Views(lambda: ingestor, clock=lambda: NOW, budget_seconds=None).channels_json()
    name = VALID[0]
    series = ingestor.series[name][ingestor.latest[name]]
    oldest = min(series.starts)
    ancient = list(burst(channels=[name], agents=["old"], windows=KEEP + 3, values=40,
                         window_seconds=WINDOW, now=NOW, seed=8))[0]  # 3 windows too old
    ingest(ingestor, [ancient])
    assert min(series.starts) == oldest  # its window is not kept ...
    assert series.stale() == [TOTAL]  # ... and only the total changed


def test_the_fleets_promises_are_counted_bounded_and_only_of_online_agents():
    from types import SimpleNamespace

    from collector.storage.states import StatusSummary
    from edge_agent.protocol.statuses import BudgetStatus

    def agent(state, *guarantees, budget=None):
        stated = [BudgetStatus(epsilon=e, spent=0.0, period=p) for e, p in guarantees]
        return SimpleNamespace(status=StatusSummary(state=state, guarantees=stated or None,
                                                    budget=budget))

    agents = {f"a{i}": agent("online", (4.0, "10m"), (120.0, "1d")) for i in range(3)}
    agents["old"] = agent("online", budget=BudgetStatus(epsilon=500.0, spent=1.0, period="1d"))
    agents["gone"] = agent("offline", (1.0, "1h"))
    agents["silent"] = SimpleNamespace(status=StatusSummary())
    # A hostile fleet: 20 agents each stating a promise of its own.
    agents.update({f"h{i}": agent("online", (2.0 + i, "1h")) for i in range(20)})
    stated = documents.fleet_guarantees(agents)
    promises = stated["promises"]
    assert len(promises) == documents.MAX_PROMISES
    assert promises[0] == {"agents": 3, "guarantees": [{"epsilon": 4.0, "per": "10m"},
                                                       {"epsilon": 120.0, "per": "1d"}]}
    assert sum(p["agents"] for p in promises) + stated["others"] == 3 + 1 + 20
    # Ties ranked by the promise itself: the offline agent's (1 per hour) would come
    # second if it were counted.
    assert promises[1] == {"agents": 1, "guarantees": [{"epsilon": 2.0, "per": "1h"}]}
