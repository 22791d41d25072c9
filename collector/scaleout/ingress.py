"""``edge-collector ingress``: MQTT in, JetStream out, acknowledged once stored.

The collector's network process with the stream as its journal
(``collector.scaleout.journal``), supervised as in a single collector: restarted
if it dies; unacknowledged MQTT messages come again, and the stream's duplicate
window drops those it stored already.  Several ingresses can share the load
with ``[broker] shared_group`` (an MQTT 5 shared subscription): copies of a
report land in the same partition whichever ingress takes them.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from collector.broker.network import NetworkProcess
from collector.broker.settings import network_settings
from collector.config import CollectorConfig
from collector.scaleout.engine import open_engine
from collector.scaleout.journal import JetStreamJournalSpec

log = logging.getLogger(__name__)


class Ingress:
    def __init__(self, config: CollectorConfig):
        if config.scale_out is None:
            raise ValueError("scale_out: an ingress needs the [scale_out] table")
        self.config = config
        journal = JetStreamJournalSpec(config.scale_out, config.fleet, config.broker.client_id)
        self.network = NetworkProcess(network_settings(config, journal))

    def check_engine(self) -> None:
        """Create or check the stream and buckets before anything is acknowledged
        (``EngineError`` if they were made with other settings)."""
        async def check() -> None:
            engine = await open_engine(self.config.scale_out, f"{self.config.broker.client_id}"
                                                              f"-setup")
            await engine.close()

        asyncio.run(check())

    def run_forever(self) -> int:
        self.check_engine()
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        self.network.start()
        log.info("ingress: MQTT %s -> stream %s (%d partitions)",
                 self.config.broker.endpoint().host, self.config.scale_out.stream,
                 self.config.scale_out.partitions)
        try:
            while not stop.wait(0.5):
                self.network.supervise()
        finally:
            self.network.stop(timeout=30)
        return 0
