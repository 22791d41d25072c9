"""Snapshots: the documents computed once per push, outside the collector's lock, and a
source that fails (the previous snapshot is served, 503 before the first)."""

from __future__ import annotations

import threading
import time

from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import Series
from collector.api import snapshots as snapshots_module
from collector.api.documents import Views
from collector.api.snapshots import Snapshots
from collector.estimation.jsonsafe import json_safe
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import wait_until
from tests.support.ports import HANG_GUARD_SECONDS
from tests.support.web import (
    PUSH,
    EventReader,
    FlakySource,
    request,
    serve,
    strict_json,
)

# -- a failing source -----------------------------------------------------------------------------

def test_a_source_failing_from_the_start_gives_503_until_it_succeeds(source, caplog):
    flaky = FlakySource(source)
    with caplog.at_level("ERROR", logger="collector.api.snapshots"):
        web = serve(flaky)
        try:
            assert wait_until(lambda: web.snapshots.errors >= 3)
            for path in ("/api/channels", "/api/channels/roll", "/api/range", "/api/rejects"):
                status, headers, body = request(web, "GET", path)
                assert status == 503, path
                assert headers["content-type"] == "application/json"
                assert headers["retry-after"] == "5"
                assert "could not be computed" in strict_json(body)["error"]
            assert request(web, "GET", "/")[0] == 200
            assert request(web, "GET", "/metrics")[0] == 200  # the server's own metrics
            # Logged once for the failing streak, not at every push.
            failures = [r for r in caplog.records if r.exc_info is not None]
            assert len(failures) == 1 and "engine exploded" in str(failures[0].exc_info[1])
            flaky.failing = False
            assert wait_until(lambda: request(web, "GET", "/api/channels")[0] == 200)
            assert strict_json(request(web, "GET", "/api/channels")[2])["fleet"] == "demo"
        finally:
            web.stop()


def test_a_failing_computation_keeps_the_previous_snapshot(source, caplog):
    flaky = FlakySource(source)
    flaky.failing = False
    web = serve(flaky)
    try:
        before = request(web, "GET", "/api/channels")[2]
        with caplog.at_level("ERROR", logger="collector.api.snapshots"):
            flaky.failing = True
            source.step()
            errors = web.snapshots.errors
            assert wait_until(lambda: web.snapshots.errors >= errors + 3)
            assert request(web, "GET", "/api/channels")[2] == before  # as of its own t
            assert request(web, "GET", "/api/channels/roll")[0] == 200
        assert len([r for r in caplog.records if r.exc_info is not None]) == 1
        flaky.failing = False
        assert wait_until(lambda: request(web, "GET", "/api/channels")[2] != before)
    finally:
        web.stop()


def test_event_stream_survives_a_failing_source(source, caplog):
    flaky = FlakySource(source)
    web = serve(flaky)
    try:
        reader = EventReader(web)
        with caplog.at_level("ERROR", logger="collector.api.snapshots"):
            name, data = reader.read_event()
        assert name == "source-error" and "error" in strict_json(data.encode())
        flaky.failing = False
        while name != "channels":
            name, data = reader.read_event()
        assert strict_json(data.encode())["fleet"] == "demo"
        reader.close()
    finally:
        web.stop()


# -- snapshots: computed once per push, outside the collector's lock -----------------------------

def test_fifty_streams_and_requests_share_one_computation_per_push(source):
    web = serve(source)
    readers = []
    try:
        readers = [EventReader(web) for _ in range(50)]
        for reader in readers:
            assert reader.read_event()[0] == "channels"
        computes, started = source.computes, time.monotonic()
        for _ in range(3):
            for reader in readers:
                assert reader.read_event()[0] == "channels"
            for _ in range(10):
                assert request(web, "GET", "/api/channels")[0] == 200
                assert request(web, "GET", "/api/channels/roll")[0] == 200
                assert request(web, "GET", "/metrics")[0] == 200
        pushes = (time.monotonic() - started) / PUSH
        assert web.active_streams == 50
        # At most one computation per push (and one under way), for 50 streams and
        # 90 requests: 150 events and 90 answers from a handful of computations.
        assert source.computes - computes <= pushes + 2
        assert source.captures == source.computes
    finally:
        for reader in readers:
            reader.close()
        web.stop()


def report_ingestor(messages: int = 12) -> Ingestor:
    """A real ingestor with one linear channel over several windows."""
    ingestor = Ingestor(fleet="demo", bins=20, window_seconds=10.0, keep_windows=4)
    mechanism = ClassicalOGPM(epsilon=1.0, low=0.0, high=1.0).describe()
    for seq in range(messages):
        payload = protocol.report(agent=f"w{seq % 3}", channel="x", kind="linear", seq=seq,
                                  t=100.0 + 5 * seq, dt=1, codes=[1000 * seq % 65536, 7, 30000],
                                  mechanism=mechanism)
        assert ingestor.ingest(protocol.data_topic("demo", f"w{seq % 3}", "x"), payload,
                               200.0) == "accepted"
    return ingestor


def test_the_collectors_lock_is_free_while_a_snapshot_is_computed(monkeypatch):
    ingestor = report_ingestor()
    lock = threading.RLock()
    views = Views(lambda: ingestor, lock, clock=lambda: 300.0)
    computing, go_on = threading.Event(), threading.Event()
    real_compute = Series.compute

    def blocking_compute(self, key):  # runs only while documents are computed
        computing.set()
        assert go_on.wait(HANG_GUARD_SECONDS)
        return real_compute(self, key)

    monkeypatch.setattr(Series, "compute", blocking_compute)
    web = serve(views)
    try:
        assert computing.wait(HANG_GUARD_SECONDS)  # the first snapshot is being computed ...
        assert lock.acquire(timeout=HANG_GUARD_SECONDS)  # ... and the aggregation loop could go on
        lock.release()
        go_on.set()
        status, _, body = request(web, "GET", "/api/channels")
        assert status == 200 and strict_json(body)["channels"]["x"]["count"] == 36
        snapshot = web.snapshots.latest
        assert 0 < snapshot.lock_seconds < snapshot.compute_seconds
    finally:
        go_on.set()
        web.stop()


def test_snapshot_documents_equal_the_views_under_the_lock():
    ingestor = report_ingestor()
    # No share of a push period to keep to: on a busy machine a bounded push may leave
    # a window "computing", which is scheduling, not what this test compares.
    views = Views(lambda: ingestor, clock=lambda: 300.0, budget_seconds=None)
    live = Views(lambda: ingestor, clock=lambda: 300.0, budget_seconds=None)

    def same(documents):
        assert json_safe(documents.channels) == json_safe(live.channels_json())
        assert json_safe(documents.channel_details["x"]) == json_safe(live.channel_json("x"))

    same(views.documents(views.capture()))
    # More reports, in a new window: the unchanged windows' results are reused.
    mechanism = ClassicalOGPM(epsilon=1.0, low=0.0, high=1.0).describe()
    payload = protocol.report(agent="w1", channel="x", kind="linear", seq=99, t=170.0, dt=1,
                              codes=[5, 6], mechanism=mechanism)
    assert ingestor.ingest(protocol.data_topic("demo", "w1", "x"), payload, 200.0) == "accepted"
    same(views.documents(views.capture()))


def test_a_channels_points_are_serialised_again_only_when_they_change(monkeypatch):
    """Each push's bytes are those of its documents, as if everything were serialised
    afresh; a channel's history points are written once, and again only after one of them
    was computed again (a late report in a window already estimated)."""
    ingestor = report_ingestor()
    views = Views(lambda: ingestor, clock=lambda: 300.0, budget_seconds=None)
    snapshots = Snapshots(views, push_seconds=PUSH)
    written = []
    real = snapshots_module.to_json
    monkeypatch.setattr(snapshots_module, "to_json",
                        lambda value: written.append(value) or real(value))

    def pushed():
        written.clear()
        snapshot = snapshots.refresh()
        documents = snapshot.documents
        assert snapshot.channel_details["x"] == real(documents.channel_details["x"])
        assert snapshot.histories["x"] == real(documents.histories["x"])
        assert snapshot.channels == real(documents.channels)
        points = documents.histories["x"]["points"]
        return points, sum(value is points for value in written)

    points, writes = pushed()
    assert len(points) >= 2 and writes == 1
    again, writes = pushed()
    assert writes == 0 and all(a is b for a, b in zip(points, again))
    mechanism = ClassicalOGPM(epsilon=1.0, low=0.0, high=1.0).describe()
    payload = protocol.report(agent="w1", channel="x", kind="linear", seq=99, t=150.0, dt=1,
                              codes=[5, 6], mechanism=mechanism)  # the newest window's
    assert ingestor.ingest(protocol.data_topic("demo", "w1", "x"), payload, 200.0) == "accepted"
    changed, writes = pushed()
    assert writes == 1 and changed[-1] != points[-1]
    assert all(a is b for a, b in zip(points[:-1], changed[:-1]))
