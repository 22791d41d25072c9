"""A collector's aggregates recording into a real SQLite results store, served with the
results store's history queries: what the history, CSV and dashboard tests read."""

from __future__ import annotations

import threading
from pathlib import Path

from collector.aggregation.ingest import Ingestor
from collector.api.documents import Views
from collector.api.server import WebServer
from collector.results.query import HistoryQuery
from collector.results.recorder import ResultsRecorder
from collector.results.sqlite import SqliteResultsStore
from edge_agent import protocol
from tests.support.configs import FLEET

HOUR = 3600.0
SPANS = [60.0, HOUR, 86400.0]  # minutes, hours and days


class RecordedFleet:
    """An ingestor at 1m/1h/1d (an hour of minutes kept) recording into ``path``."""

    def __init__(self, path: Path):
        self.path = path
        self.store = SqliteResultsStore(path)
        self.ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=60.0, coarser=(60, 24),
                                 keep_windows=61, recording=True)
        self.lock = threading.RLock()
        self.recorder = ResultsRecorder(self.store, source="test",
                                        aggregates=lambda: self.ingestor, lock=self.lock,
                                        retention={})
        self.web: WebServer | None = None

    def send(self, agent: str, channel: str, kind: str, seq: int, t: float, codes,
             mechanism, **extra) -> None:
        """A report of ``codes`` (a list) at ``t``, counted (``extra``: e.g. its unit)."""
        payload = protocol.report(agent=agent, channel=channel, kind=kind, seq=seq, t=t,
                                  dt=1.0, codes=codes, mechanism=mechanism.describe(), **extra)
        with self.lock:
            assert self.ingestor.ingest(protocol.data_topic(FLEET, agent, channel), payload,
                                        now=1e10) == "accepted"

    def record(self, before: float) -> None:
        """Every window closed before ``before``, written to the store."""
        self.recorder.durable = self.ingestor.close_windows(now=before, grace=0.0)
        self.recorder.record()

    def serve(self, clock) -> WebServer:
        """The web server over the live view (at ``clock()``) and the store."""
        views = Views(lambda: self.ingestor, self.lock, clock=clock, budget_seconds=None)
        self.web = WebServer(views, host="127.0.0.1", port=0, push_seconds=0.2,
                             history=HistoryQuery(self.store, SPANS)).start()
        return self.web

    def close(self) -> None:
        if self.web is not None:
            self.web.stop()
        self.store.close()
