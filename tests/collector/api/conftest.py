"""Fixtures of the API and dashboard tests: a FakeSource, a WebServer serving it, and a
dashboard page on it (the browser is tests/conftest.py's)."""

from __future__ import annotations

import pytest

from collector.api.server import WebServer
from tests.support.fake_source import FakeSource
from tests.support.web import PUSH, Dashboard


@pytest.fixture
def source():
    return FakeSource()


@pytest.fixture
def server(source):
    web = WebServer(source, host="127.0.0.1", port=0, push_seconds=PUSH).start()
    yield web
    web.stop()


@pytest.fixture
def dashboard(browser, server):
    board = Dashboard(browser, server)
    yield board
    board.close()
