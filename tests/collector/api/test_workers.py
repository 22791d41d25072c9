"""History estimates in worker processes (real ones, spawned): the same estimates as the
push's own, taken only where the sums still count what they are of, the latest windows
never waiting for them, and no process left once stopped."""

from __future__ import annotations

import msgspec
import psutil
import pytest

from collector.aggregation.ingest import Ingestor
from collector.api.documents import Views
from collector.api.workers import EstimateWorkers
from collector.estimation.jsonsafe import json_safe
from edge_agent.common.memory import clean_mappings
from tests.support import wait_until
from tests.support.burst import burst, channel_names
from tests.support.configs import FLEET

NOW = 1_700_000_000.0


def burst_ingestor(windows: int = 8) -> Ingestor:
    ingestor = Ingestor(fleet=FLEET, window_seconds=60.0, keep_windows=windows,
                        coarser=(60,))
    for topic, payload in burst(channels=channel_names(3), agents=["a", "b", "c"],
                                windows=windows, values=40, now=NOW):
        assert ingestor.ingest(topic, payload, now=NOW) == "accepted"
    return ingestor


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_worker_estimates_a_window_as_the_series_itself_does():
    ingestor = burst_ingestor()
    series = next(iter(ingestor.series["ch000"].values()))
    before = children()
    workers = EstimateWorkers(2)
    try:
        keys = [*series.starts[:-1], (1, max(series.levels[1]))]
        for key in keys:
            workers.submit(series.identity, key, series.bare(key))
        got = {}

        def all_back() -> bool:
            results, seconds = workers.finished()
            got.update({key: result for _, key, result in results})
            return len(got) == len(keys)

        assert wait_until(all_back, timeout=120)
        assert workers.errors == 0 and not workers.in_flight()
        for key in keys:
            assert msgspec.json.encode(got[key]) == msgspec.json.encode(series.estimated(key))
        # Each worker gave LLVM's code pages back after its first job (about 67 MB
        # resident otherwise on x86_64, 40 MB from numba's import alone): the later jobs,
        # with the kernels the first loaded, did not read them again.
        pids = [p.pid for p in psutil.Process().children(recursive=True)
                if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())]
        assert len(pids) == 2
        for pid in pids:
            resident = sum(r for *_, r in clean_mappings(smaps=f"/proc/{pid}/smaps"))
            assert resident < 10 * 2**20, (pid, resident / 2**20)
    finally:
        workers.stop()
    assert wait_until(lambda: children() <= before)


def test_views_send_what_the_budget_leaves_to_the_workers_and_keep_what_still_counts():
    ingestor = burst_ingestor()
    workers = EstimateWorkers(2, idle_seconds=0.0)
    # No budget: every push computes the first tier only, the history goes to the workers.
    views = Views(lambda: ingestor, clock=lambda: NOW, budget_seconds=0.0, workers=workers)
    reference = Views(lambda: burst_ingestor(), clock=lambda: NOW, budget_seconds=None)
    before = children()
    try:
        documents = views.documents(views.capture())
        assert views.last_work.beyond and workers.in_flight()
        assert all(detail["state"] == "computing"
                   for detail in documents.channel_details.values())

        def complete() -> bool:
            found = views.documents(views.capture())
            # Every shown estimate ready, and nothing else still with a worker (a coarser
            # window's result can come back a push after the documents are all ready).
            return views.estimates.pending == 0 and all(
                detail["state"] == "ready" for detail in found.channel_details.values())

        assert wait_until(complete, timeout=120)
        assert workers.restarts == 1
        expected = reference.channels_json()
        for name in expected["channels"]:
            assert json_safe(views.channel_json(name)) == json_safe(reference.channel_json(name))
        # Idle: the workers stop at the next look.
        views.documents(views.capture())
        assert wait_until(lambda: children() <= before)
    finally:
        views.stop()
    assert wait_until(lambda: children() <= before)


def test_a_result_for_sums_that_counted_more_since_is_not_kept():
    ingestor = burst_ingestor()
    series = next(iter(ingestor.series["ch000"].values()))
    oldest = series.starts[0]
    result = series.bare(oldest).estimated(oldest)
    more = ingestor.copy_aggregates()
    grown = next(iter(more.series["ch000"].values()))
    grown.levels[0][oldest] = series.bare(oldest).levels[0][oldest]
    grown.keep_result(oldest, (result[0] - 1, result[1]))  # of fewer reports: refused
    assert grown.points.get(oldest) != (result[0] - 1, result[1])
    grown.keep_result(oldest, result)
    assert grown.points[oldest] == result


def test_workers_refuse_a_bad_count():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        EstimateWorkers(0)
