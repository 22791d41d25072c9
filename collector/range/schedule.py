"""Range discovery on a schedule: ``[[range_discovery.schedule]]``, run by the designated
coordinator only."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from collector.config import CollectorConfig
from collector.range.coordinator import RangeCoordinator, RunRequest, connect_client

log = logging.getLogger(__name__)


class RangeSchedule:
    """Runs ``[[range_discovery.schedule]]`` in a thread (on the designated coordinator only).

    ``channel_domain(channel)`` gives a channel's declared domain when the schedule
    names none; ``agents_online()`` how many agents a run can expect."""

    def __init__(self, config: CollectorConfig, *,
                 channel_domain: Callable[[str], tuple[float, float] | None],
                 agents_online: Callable[[], int]):
        self.config = config
        self.channel_domain = channel_domain
        self.agents_online = agents_online
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="collector-range", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        settings = self.config.range_discovery
        due = {(entry.channel, side): time.monotonic() + min(60.0, entry.every_seconds)
               for entry in settings.schedule for side in entry.sides}
        entries = {entry.channel: entry for entry in settings.schedule}
        coordinator = None
        while not self._stop.wait(1.0):
            for (channel, side), when in sorted(due.items(), key=lambda item: item[1]):
                if time.monotonic() < when or self._stop.is_set():
                    continue
                due[(channel, side)] = time.monotonic() + entries[channel].every_seconds
                domain = entries[channel].domain or self.channel_domain(channel)
                if domain is None:
                    log.info("range discovery for %s waits for its first reports", channel)
                    continue
                try:
                    if coordinator is None:
                        coordinator = RangeCoordinator(
                            connect_client(self.config, settings.client_id),
                            fleet=self.config.fleet, settings=settings)
                    coordinator.run(RunRequest(channel, side, *domain),
                                    expected_agents=self.agents_online())
                except Exception:
                    log.exception("range discovery for %s/%s failed", channel, side)
                    coordinator = None
        if coordinator is not None:
            coordinator.client.stop()
