"""Estimates computed once, end to end: a real Mosquitto and a real collector process.

* after a restart the collector serves the same documents as before it, and computes
  nothing again;
* a late report recomputes its own window and the total only;
* while one device floods invented channel names, a fleet channel's new reports are
  counted and estimated first (the invented channels' history waits).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import psutil

from tests.support import CollectorProcess, MqttClient
from tests.support import wait_for_api as wait_until  # every wait here asks the API
from tests.support.burst import burst, channel_names, complete
from tests.support.ports import HANG_GUARD_SECONDS

WINDOWS = 13  # the test collector's minute of 5-s windows and the one under way
VALUES = 20
AGENTS = [f"a{i}" for i in range(4)]


def raw(collector: CollectorProcess, path: str) -> dict:
    """A document as served, without its time (``t``)."""
    with urllib.request.urlopen(collector.url + path, timeout=60) as response:
        document = json.loads(response.read())
    document.pop("t", None)
    return document


def settled(collector: CollectorProcess, expected: dict[str, int]) -> bool:
    """Every channel counts what was sent, and nothing is left to estimate (the open hour
    and day included, which wait for the finest windows)."""
    return complete(collector.api(), expected) and \
        collector.metric("ldp_estimates_pending") == 0


def publish(mosquitto, messages) -> None:
    client = MqttClient(mosquitto, v5=False).connect()
    for topic, payload in messages:
        client.publish(topic, payload)
    client.flush(60)
    client.close()


def test_a_restart_serves_the_same_documents_and_computes_nothing_again(tmp_path, mosquitto):
    names = channel_names(3)
    collector = CollectorProcess(tmp_path, mosquitto).start()
    try:
        now = time.time()
        publish(mosquitto, burst(channels=names, agents=AGENTS, windows=WINDOWS, values=VALUES,
                                 window_seconds=5.0, now=now))
        expected = {name: len(AGENTS) * WINDOWS * VALUES for name in names}
        assert wait_until(lambda: settled(collector, expected))
        computed = collector.metric("ldp_estimates_total")
        assert computed >= len(names) * 2  # at least each total and newest window
        paths = [f"/api/channels/{name}{tail}" for name in names for tail in ("", "/history")]
        before = {path: raw(collector, path) for path in paths}
        assert all(len(before[f"/api/channels/{name}/history"]["points"]) == WINDOWS
                   for name in names)
        assert collector.terminate() == 0
        collector.start()
        assert wait_until(lambda: settled(collector, expected))
        assert {path: raw(collector, path) for path in paths} == before
        assert collector.metric("ldp_estimates_total") == 0  # served as they were saved

        # A late report (of an agent's earlier sequence numbers) into the oldest window:
        # its window, the total and the open hour and day holding it are estimated again,
        # nothing else.
        name = names[1]
        publish(mosquitto, list(burst(channels=[name], agents=["late"], windows=WINDOWS,
                                      values=VALUES, window_seconds=5.0, now=now,
                                      seed=9))[:1])
        expected[name] += VALUES
        assert wait_until(lambda: settled(collector, expected))
        assert collector.metric("ldp_estimates_total") == 4
        after = raw(collector, f"/api/channels/{name}/history")["points"]
        points = before[f"/api/channels/{name}/history"]["points"]
        assert after[0]["count"] == points[0]["count"] + VALUES
        assert after[1:] == points[1:]
    finally:
        collector.kill()


def test_a_flood_of_invented_channels_waits_behind_the_fleets_channel(tmp_path, mosquitto):
    collector = CollectorProcess(tmp_path, mosquitto).start()
    try:
        # One device's history under 40 names it made up: 560 estimates, under a minute
        # of them, within 30% of each push period (ESTIMATE_SHARE).
        junk = channel_names(40, "junk")
        publish(mosquitto, burst(channels=junk, agents=["intruder"], windows=WINDOWS,
                                 values=VALUES, window_seconds=5.0, seed=3))
        assert wait_until(lambda: len(collector.api()["channels"]) == len(junk))
        publish(mosquitto, burst(channels=["pulse"], agents=AGENTS, windows=1, values=VALUES,
                                 window_seconds=5.0))
        expected = {"pulse": len(AGENTS) * VALUES}
        assert wait_until(lambda: complete(collector.api(), expected))
        # The fleet's channel was estimated while the flood's were still waiting.
        channels = collector.api()["channels"]
        waiting = [name for name in junk if channels[name]["state"] == "computing"]
        assert waiting and collector.metric("ldp_estimates_pending") > 0
        # ... and follow, at most the budget's share of each push.
        counts = {name: WINDOWS * VALUES for name in junk}
        assert wait_until(lambda: complete(collector.api(), counts), 600), \
            {name: (c["count"], c["state"]) for name, c in collector.api()["channels"].items()
             if name in counts and (c["count"], c["state"]) != (counts[name], "ready")}
    finally:
        collector.kill()


def worker_processes(collector: CollectorProcess) -> list[psutil.Process]:
    """The collector's estimate workers (spawned multiprocessing children)."""
    return [child for child in psutil.Process(collector.process.pid).children(recursive=True)
            if "multiprocessing" in " ".join(child.cmdline())]


def test_a_bursts_history_is_estimated_by_worker_processes_that_end_with_the_collector(
        tmp_path, mosquitto):
    """More history than a push period's share computes (24 channels x 13 windows): what
    the pushes leave goes to worker processes, every window ends estimated, and the
    workers go when the collector is killed (SIGKILL to its own process only: nothing
    tells them but the pipe that closes)."""
    names = channel_names(24)
    collector = CollectorProcess(tmp_path, mosquitto).start()
    try:
        publish(mosquitto, burst(channels=names, agents=AGENTS, windows=WINDOWS, values=VALUES,
                                 window_seconds=5.0))
        workers = []

        def settled_watching() -> bool:
            workers.extend(p for p in worker_processes(collector) if p not in workers)
            return settled(collector, {name: len(AGENTS) * WINDOWS * VALUES for name in names})

        assert wait_until(settled_watching)
        assert collector.metric("ldp_estimates_by_workers_total") > 0
        assert workers
        workers.extend(p for p in worker_processes(collector) if p not in workers)
        os.kill(collector.process.pid, signal.SIGKILL)
        collector.process.wait(HANG_GUARD_SECONDS)
        _, alive = psutil.wait_procs(workers, timeout=HANG_GUARD_SECONDS)
        assert not alive, alive
    finally:
        collector.kill()
