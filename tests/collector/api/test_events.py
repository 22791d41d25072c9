"""Server-sent events (/api/events): a document per push, keep-alives, the end of a
stream, and the limit on open streams."""

from __future__ import annotations

import threading
import time

import pytest

from collector.api.server import HttpLimits
from tests.support import HANG_GUARD_SECONDS, returns_within, wait_until
from tests.support.web import (
    EventReader,
    request,
    serve,
    strict_json,
)

# -- server-sent events ---------------------------------------------------------------------------

def test_event_stream_delivers_channel_documents(server, source):
    reader = EventReader(server)
    assert reader.response.status == 200
    assert reader.response.getheader("Content-Type").startswith("text/event-stream")
    assert reader.response.getheader("Cache-Control") == "no-store"
    events = [reader.read_event() for _ in range(2)]
    assert [name for name, _ in events] == ["channels", "channels"]
    for _, data in events:
        assert strict_json(data.encode()) == source.channels_json()
    count = source.channels_json()["channels"]["accel_x"]["count"]
    source.step()
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while time.monotonic() < deadline:
        _, data = reader.read_event()
        if strict_json(data.encode())["channels"]["accel_x"]["count"] > count:
            break
    else:
        pytest.fail("the stream did not follow source.step()")
    reader.close()


def test_first_event_is_immediate_and_keepalives_are_comments(source, monkeypatch):
    """The first event is the latest snapshot, at once: with an hour between pushes, a
    stream that waited for the next one would not deliver within the reader's guard."""
    monkeypatch.setattr("collector.api.server.KEEPALIVE_SECONDS", 0.1)
    web = serve(source, push_seconds=3600)
    try:
        reader = EventReader(web)
        name, _ = reader.read_event()
        assert name == "channels"
        lines = [reader.response.readline() for _ in range(4)]
        assert b": keep-alive\n" in lines
        reader.close()
    finally:
        web.stop()


def test_stream_ends_when_the_client_disconnects(server):
    reader = EventReader(server)
    reader.read_event()
    assert server.active_streams == 1
    reader.close()
    assert wait_until(lambda: server.active_streams == 0, timeout=3)
    assert request(server, "GET", "/api/channels")[0] == 200


def test_stop_ends_open_streams_promptly(source, monkeypatch):
    """The stop ends the streams itself: with an hour for uvicorn's graceful stop (and
    between pushes), a stop that waited for the streams would not return."""
    monkeypatch.setattr("collector.api.server.STOP_JOIN_SECONDS", 3600.0)
    monkeypatch.setattr("collector.api.server.GRACEFUL_SHUTDOWN_SECONDS", 3600.0)
    web = serve(source, push_seconds=3600)
    readers = [EventReader(web) for _ in range(3)]
    for reader in readers:
        reader.read_event()
    ended = []

    def drain(reader):
        try:
            while reader.response.readline():
                pass
        except OSError:
            pass
        ended.append(reader)

    threads = [threading.Thread(target=drain, args=(r,), daemon=True) for r in readers]
    for thread in threads:
        thread.start()
    assert returns_within(web.stop)
    for thread in threads:
        thread.join(HANG_GUARD_SECONDS)
    assert len(ended) == 3
    assert web.active_streams == 0


def test_stop_with_open_streams_leaves_no_thread_behind(source, monkeypatch):
    monkeypatch.setattr("collector.api.server.STOP_JOIN_SECONDS", 3600.0)
    monkeypatch.setattr("collector.api.server.GRACEFUL_SHUTDOWN_SECONDS", 3600.0)
    before = set(threading.enumerate())
    web = serve(source, push_seconds=3600)
    readers = [EventReader(web) for _ in range(5)]
    try:
        for reader in readers:
            assert reader.read_event()[0] == "channels"
        assert web.active_streams == 5
        assert returns_within(web.stop)
        assert wait_until(lambda: set(threading.enumerate()) <= before, timeout=5), \
            set(threading.enumerate()) - before
    finally:
        for reader in readers:
            reader.close()


def test_event_streams_beyond_the_limit_get_503(source):
    web = serve(source, limits=HttpLimits(max_event_streams=2))
    readers = [EventReader(web) for _ in range(2)]
    try:
        for reader in readers:
            reader.read_event()
        status, headers, body = request(web, "GET", "/api/events")
        assert status == 503 and headers["retry-after"] == "5"
        assert "too many event streams" in strict_json(body)["error"]
        assert web.guard.refused["event_streams"] == 1
        readers.pop().close()
        assert wait_until(lambda: web.active_streams == 1)
        readers.append(EventReader(web))
        assert readers[-1].read_event()[0] == "channels"
    finally:
        for reader in readers:
            reader.close()
        web.stop()
