"""A study's aggregates at fleet scale: a burst of history, a restart, a flood.

A real Mosquitto and a collector process with the default aggregates (60 s windows, an
hour of history: 61 windows) and push period (1 s).  For each ``--channels`` count:

* **burst**: channels x 50 agents x 61 windows of reports of 50 values (every window of
  the history), published at once; the time from the last publish acknowledged to a
  complete API (every channel counts all its values and says ``"state": "ready"``:
  its total and every window estimated);
* **restart**: SIGTERM, a new process on the same state file; the time from its start to
  a complete API (the same documents, nothing computed again: ``ldp_estimates_total``
  of the new process is reported beside, and where the documents differ);
* **cost**: the collector's own ``ldp_estimate_seconds_total`` / ``ldp_estimates_total``
  (its mean time per estimate, a channel's total or one window; how many its estimate
  workers computed), and the median and 95th percentile of one window's estimate in this
  process (``Series.compute``), data in the middle of the domain and near an end;
* **RSS**: the collector's process tree (main, network and estimate-worker processes)
  after the burst and at most during it (sampled every 0.2 s), with its PSS (shared pages
  counted once: the workers share the interpreter's libraries);
* **flood** (``--flood``, at the first channel count): one device publishes under 300
  channel names (``[limits] channels = 256`` takes what fits) while 10 agents report a
  valid channel; the delay from a valid report acknowledged by the broker to the API
  counting it, with the flood and without.
* **limits** (``--limits``): a fresh collector filled to every default ``[limits]`` a
  sender reaches with reports (256 channels x 16 series, each with 61 windows: one
  device's reports of one value under 16 values of epsilon); the process tree's RSS once
  it has counted and estimated them and the results store has taken every window older
  than ``close_after_seconds`` (its main process and its network child apart), the
  in-process size of those sums with and without their estimates (8 channels measured,
  scaled), and of one series' sums.

Run: ``python -m benchmarks.bench_collector_scale [--channels 32 256] [--flood]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from benchmarks.machine import describe_machine
from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import new_series
from collector.api.documents import Views
from collector.storage.states import AggregateSettings
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from edge_agent.protocol import describe
from tests.support import CollectorProcess, Mosquitto, MqttClient, wait_for_api
from tests.support.burst import MECHANISM, burst, channel_names, complete
from tests.support.configs import FLEET

AGENTS = 50
WINDOWS = 61  # an hour of 60-s windows and the one under way (the default history)
VALUES = 50
GUARD_SECONDS = 3600.0


def publish(broker: Mosquitto, messages) -> int:
    client = MqttClient(broker, v5=False)
    client.client.max_inflight_messages_set(1000)
    client.connect()
    sent = 0
    for topic, payload in messages:
        client.publish(topic, payload)
        sent += 1
        if sent % 20_000 == 0:
            client.flush(600)
    client.flush(600)
    client.close()
    return sent


def tree_rss_mb(collector: CollectorProcess) -> float:
    main = psutil.Process(collector.process.pid)
    return sum(p.memory_info().rss for p in [main, *main.children(recursive=True)]) / 2**20


def tree_pss_mb(collector: CollectorProcess) -> float:
    """The tree's proportional set size: pages the processes share (the estimate workers'
    libraries, numpy's, scipy's, numba's) counted once, split among them, where the RSS
    counts them in each."""
    main = psutil.Process(collector.process.pid)
    return sum(p.memory_full_info().pss for p in [main, *main.children(recursive=True)]) / 2**20


def window_estimate_ms(centre: float, windows: int = 40) -> tuple[float, float, float]:
    """Median, 95th percentile and mean time of one window's estimate (50 agents x 50
    values around ``centre``, sd 0.3), in this process, newest first as the collector
    computes a history.  Near an end: ``centre`` 1.5, most of the data where classical
    OGPM at eps 1 on [-2, 2] reports alike (beyond 1.245)."""
    series = new_series(kind="linear", channel="x", description=describe(MECHANISM))
    rng = np.random.default_rng(1)
    for w in range(windows + 1):
        codes = MECHANISM.perturb_codes(rng.normal(centre, 0.3, AGENTS * VALUES).clip(-2, 2),
                                        rng)
        series.update(agent="a", t=60.0 * w + 1, codes=codes)
    series.compute(0)  # compiled, tuned
    times = []
    for start in range(windows, 0, -1):
        began = time.perf_counter()
        series.compute(start)
        times.append(time.perf_counter() - began)
    return (1000 * statistics.median(times), 1000 * float(np.percentile(times, 95)),
            1000 * statistics.fmean(times))


def valid_delays(broker: Mosquitto, collector: CollectorProcess, *, flood: bool,
                 first: int, reports: int = 15) -> list[float]:
    """Seconds from a report of the valid channel (from each of 10 agents) acknowledged to
    the API counting it (and its estimates ready), ``reports`` times from sequence number
    ``first`` on, with a flooding device or without."""
    name = "pulse"
    agents = [f"p{i}" for i in range(10)]
    client = MqttClient(broker, v5=False).connect()
    stop, flooder = threading.Event(), None
    if flood:
        def run_flood() -> None:
            intruder = MqttClient(broker, v5=False).connect()
            round_ = 0
            while not stop.is_set():  # every window of an hour, under 300 names, again
                for topic, payload in burst(channels=channel_names(300, "junk"),
                                            agents=["intruder"], windows=WINDOWS,
                                            seed=round_, first_seq=round_ * WINDOWS):
                    if stop.is_set():
                        break
                    intruder.publish(topic, payload)
                intruder.flush(600)
                round_ += 1
            intruder.close()

        flooder = threading.Thread(target=run_flood, daemon=True)
        flooder.start()
        time.sleep(5.0)  # the flood under way
    delays = []
    try:
        for seq in range(first, first + reports):
            for topic, payload in burst(channels=[name], agents=agents, windows=1,
                                        seed=100 + seq, first_seq=seq):
                client.publish(topic, payload)
            client.flush(60)
            sent = time.monotonic()
            expected = (seq + 1) * len(agents) * VALUES

            def counted() -> bool:
                entry = collector.api(f"/api/channels/{name}")
                return entry["count"] == expected and entry["state"] == "ready"

            if not wait_for_api(counted, GUARD_SECONDS):
                raise RuntimeError(f"{name}: report {seq} never counted")
            delays.append(time.monotonic() - sent)
    finally:
        stop.set()
        if flooder is not None:
            flooder.join(600)
        client.close()
    return delays


def one_size(workdir: Path, broker: Mosquitto, channels: int, flood: bool) -> dict:
    names = channel_names(channels)
    agents = [f"a{i:02d}" for i in range(AGENTS)]
    expected = {name: AGENTS * WINDOWS * VALUES for name in names}
    tables = {"aggregates": {"window_seconds": 60, "history_seconds": 3600},
              "http": {"push_seconds": 1.0}}
    collector = CollectorProcess(workdir, broker, checkpoint_seconds=10, name=f"c{channels}",
                                 **tables).start()
    try:
        began = time.monotonic()
        with PeakRss(collector) as peak:
            sent = publish(broker, burst(channels=names, agents=agents, windows=WINDOWS))
            published = time.monotonic()
            if not wait_for_api(lambda: complete(collector.api(), expected), GUARD_SECONDS):
                raise RuntimeError("the burst was never complete in the API")
            done = time.monotonic()
        result = {"channels": channels, "reports": sent, "publish": published - began,
                  "burst": done - published, "rss": tree_rss_mb(collector),
                  "pss": tree_pss_mb(collector), "rss_peak": peak.peak,
                  "pss_peak": peak.pss_peak,
                  "estimates": collector.metric("ldp_estimates_total"),
                  "by_workers": collector.metric("ldp_estimates_by_workers_total"),
                  "estimate_seconds": collector.metric("ldp_estimate_seconds_total")}
        history = collector.api(f"/api/channels/{names[0]}/history")
        # The live view's recent points: a window the results store closed before the live
        # view estimated it is the store's only (a burst older than close_after_seconds).
        assert history["state"] == "ready", history
        result["live_points"] = len(history["points"])
        before = {name: collector.api(f"/api/channels/{name}") for name in names[:4]}
        assert collector.terminate() == 0
        restarted = time.monotonic()
        collector.start()
        if not wait_for_api(lambda: complete(collector.api(), expected), GUARD_SECONDS):
            raise RuntimeError("the restarted collector was never complete")
        result["restart"] = time.monotonic() - restarted
        result["recomputed"] = collector.metric("ldp_estimates_total")
        result["rss_restarted"] = tree_rss_mb(collector)
        after = {name: collector.api(f"/api/channels/{name}") for name in names[:4]}
        result["differences"] = [f"{name}: {path}" for name in before
                                 for path in differences(_without_times(before[name]),
                                                         _without_times(after[name]))]
        if flood:
            result["quiet"] = valid_delays(broker, collector, flood=False, first=0)
            result["flooded"] = valid_delays(broker, collector, flood=True, first=15)
            result["rss_flooded"] = tree_rss_mb(collector)
        return result
    finally:
        collector.kill()


def limit_reports(channels: int = 256, series: int = 16):
    """(topic, payload) of the reports that fill the default limits: one device's reports
    of one value on ``channels`` channels under ``series`` values of epsilon, one in each
    window of the history."""
    now = time.time()
    newest = int(now // 60)
    rng = np.random.default_rng(5)
    for k in range(series):
        mechanism = ClassicalOGPM(epsilon=0.5 + 0.25 * k, low=-2.0, high=2.0)
        description = mechanism.describe()
        for w in range(WINDOWS):
            t = min((newest - WINDOWS + 1 + w) * 60 + 1.0, now)
            for name in channel_names(channels):
                codes = mechanism.perturb_codes(rng.normal(0, 0.3, 1).clip(-2, 2), rng)
                yield protocol.data_topic(FLEET, "device", name), protocol.report(
                    agent="device", channel=name, kind="linear", seq=k * WINDOWS + w,
                    t=t, dt=1.0, mechanism=description, codes=codes.tolist())


def _role(process: psutil.Process) -> str:
    """What a process of the collector's tree is, from its command line."""
    line = " ".join(process.cmdline())
    for mark, role in (("-m collector", "main"), ("resource_tracker", "resource tracker"),
                       ("spawn_main", "spawned child")):
        if mark in line:
            return role
    return process.name()


class PeakRss:
    """The largest RSS of a collector's process tree, sampled every 0.2 s in a thread (a
    checkpoint's and a push's transient copies come and go between two readings)."""

    def __init__(self, collector: CollectorProcess):
        self.collector, self.peak, self._stop = collector, 0.0, threading.Event()
        self.pss_peak = 0.0
        # When the peak was (seconds from the start) and what it was made of: (role, RSS
        # MB) of each process in the tree then, the main process first.
        self.peak_at = 0.0
        self.peak_parts: list[tuple[str, float]] = []
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                main = psutil.Process(self.collector.process.pid)
                # Each process read once: the parts add up to the sum compared.
                parts = [(_role(p), p.memory_info().rss / 2**20)
                         for p in (main, *main.children(recursive=True))]
                rss = sum(part for _, part in parts)
                if rss > self.peak:
                    self.peak, self.peak_at = rss, time.monotonic() - self._started
                    self.peak_parts = parts
                self.pss_peak = max(self.pss_peak, tree_pss_mb(self.collector))
            except psutil.Error:  # a process of the tree ended between listing and reading
                pass

    def since_start(self) -> float:
        return time.monotonic() - self._started

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def at_the_limits(workdir: Path, broker: Mosquitto, channels: int = 256) -> dict:
    """RSS of a collector holding every channel and series the default limits allow, each
    with a full history: its main process and its network child apart, and the largest
    the tree reached meanwhile (checkpoints included: one a minute)."""
    collector = CollectorProcess(workdir, broker, checkpoint_seconds=60, name="limits",
                                 aggregates={"window_seconds": 60, "history_seconds": 3600},
                                 http={"push_seconds": 1.0}).start()
    try:
        with PeakRss(collector) as peak:
            found = _fill_the_limits(collector, broker, channels)
            filled = time.monotonic()
            found["filled_at"] = peak.since_start()
            # At rest: every window older than close_after_seconds written to the results
            # store (nearly all of them, each estimated by the recorder), then one more
            # checkpoint of the full state.
            if not wait_for_api(lambda: collector.metric("ldp_results_pending_windows") == 0
                                and collector.metric("ldp_results_windows_written_total") > 0,
                                GUARD_SECONDS):
                raise RuntimeError("the results store never took the closed windows")
            found["drained"] = time.monotonic() - filled
            found["written"] = collector.metric("ldp_results_windows_written_total")
            time.sleep(65)
            main = psutil.Process(collector.process.pid)
            found.update(rss=tree_rss_mb(collector), rss_main=main.memory_info().rss / 2**20)
        return {**found, "rss_peak": peak.peak, "pss_peak": peak.pss_peak,
                "peak_at": peak.peak_at, "peak_parts": peak.peak_parts}
    finally:
        collector.kill()


def _fill_the_limits(collector: CollectorProcess, broker: Mosquitto, channels: int) -> dict:
    """Publish the reports that fill the limits and wait until every channel is counted and
    its estimates ready."""
    sent = publish(broker, limit_reports(channels))

    def counted() -> bool:
        document = collector.api()
        channels_seen = document["channels"].values()
        return document["ingest"]["messages"] >= sent \
            and all(c["state"] == "ready" for c in channels_seen)

    if not wait_for_api(counted, GUARD_SECONDS):
        raise RuntimeError("the limits were never filled")
    document = collector.api()
    return {"reports": sent, "channels": len(document["channels"]),
            "rejects": document["ingest"]["rejects"]}


def aggregates_at_the_limits_mb(sample: int = 8, channels: int = 256) -> tuple[float, float]:
    """The in-process size of the sums, and of the sums with every estimate computed and
    kept, at the default limits: ``sample`` channels measured (tracemalloc), scaled to
    ``channels``."""
    import gc
    import tracemalloc

    settings = AggregateSettings(bins=50, window_seconds=60.0, keep_windows=WINDOWS)
    ingestor = Ingestor.from_settings(FLEET, settings)
    reports = list(limit_reports(sample))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for topic, payload in reports:
        ingestor.ingest(topic, payload)
    gc.collect()
    sums = tracemalloc.get_traced_memory()[0] - before
    Views(lambda: ingestor).channels_json()  # every estimate, kept by the series
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    scale = channels / sample / 2**20
    return sums * scale, kept * scale


def series_kilobytes(windows: int = WINDOWS) -> float:
    """The in-process size of one linear series' sums with ``windows`` windows."""
    import tracemalloc

    rng = np.random.default_rng(2)
    codes = MECHANISM.perturb_codes(rng.normal(0, 0.3, 50).clip(-2, 2), rng)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    many = [new_series(kind="linear", channel=f"x{i}", description=describe(MECHANISM),
                       keep_windows=windows) for i in range(10)]
    for one in many:
        for w in range(windows):
            one.update(agent="a", t=60.0 * w + 1, codes=codes)
    size = (tracemalloc.get_traced_memory()[0] - before) / len(many) / 1024
    tracemalloc.stop()
    return size


def differences(before, after, path: str = "") -> list[str]:
    """Where two JSON documents differ (the first few paths)."""
    if isinstance(before, dict) and isinstance(after, dict):
        parts = [(f"{path}.{key}", before.get(key), after.get(key))
                 for key in sorted(set(before) | set(after))]
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        parts = [(f"{path}[{i}]", one, other) for i, (one, other) in enumerate(zip(before, after))]
    else:
        return [] if before == after else [f"{path} {str(before)[:60]} -> {str(after)[:60]}"]
    return [line for where, one, other in parts for line in differences(one, other, where)][:8]


def _without_times(detail: dict) -> dict:
    return {key: value for key, value in detail.items() if key not in ("t",)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, nargs="*", default=[32, 256],
                        help="channel counts of the burst (none: only --limits)")
    parser.add_argument("--flood", action="store_true",
                        help="measure the flood's delay at the first channel count")
    parser.add_argument("--limits", action="store_true",
                        help="measure the RSS of a collector at every default limit")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as workdir:
        broker = Mosquitto(Path(workdir)).start()
        try:
            limits = at_the_limits(Path(workdir), broker) if args.limits else None
            for i, channels in enumerate(args.channels):
                results.append(one_size(Path(workdir), broker, channels, args.flood and i == 0))
                r = results[-1]
                print(f"{channels} channels: {r['reports']} reports published in "
                      f"{r['publish']:.1f} s; complete {r['burst']:.1f} s after; restart "
                      f"{r['restart']:.1f} s", flush=True)
        finally:
            broker.stop()
    print(f"\nMachine: {describe_machine()}")
    for label, centre in (("in the middle", 0.2), ("near an end", 1.5)):
        median, p95, mean = window_estimate_ms(centre)
        print(f"estimate of one window (50 agents x 50 values, in-process), data {label}: "
              f"median {median:.2f} ms, p95 {p95:.2f} ms, mean {mean:.2f} ms")
    print()
    print("| channels | reports | burst: last publish to complete API | restart to complete "
          "API | estimates after restart | collector's time per estimate | RSS after burst "
          "| RSS peak during burst | RSS after restart |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        per = 1000 * r["estimate_seconds"] / r["estimates"] if r["estimates"] else float("nan")
        print(f"| {r['channels']} | {r['reports']:,} | {r['burst']:.1f} s | {r['restart']:.1f} s "
              f"| {r['recomputed']:.0f} | {per:.2f} ms ({r['by_workers']:.0f} by workers) "
              f"| {r['rss']:.0f} MB (PSS {r['pss']:.0f}) | {r['rss_peak']:.0f} MB (PSS "
              f"{r['pss_peak']:.0f}) | {r['rss_restarted']:.0f} MB |")
    if limits is not None:
        sums, kept = aggregates_at_the_limits_mb()
        print(f"\nat the default limits ({limits['channels']} channels x 16 series x "
              f"{WINDOWS} windows, {limits['reports']:,} reports, refused "
              f"{limits['rejects']}): RSS {limits['rss']:.0f} MB (main process "
              f"{limits['rss_main']:.0f} MB, network child "
              f"{limits['rss'] - limits['rss_main']:.0f} MB) once the results store took "
              f"the {limits['written']:,.0f} closed windows ({limits['drained']:.0f} s after "
              f"the last was counted), at most {limits['rss_peak']:.0f} "
              f"MB meanwhile (PSS at most {limits['pss_peak']:.0f} MB; the peak "
              f"{limits['peak_at']:.0f} s from the start, counted and estimated at "
              f"{limits['filled_at']:.0f} s: main process {limits['peak_parts'][0][1]:.0f} MB "
              f"of {len(limits['peak_parts'])} processes: "
              f"{', '.join(f'{role} {rss:.0f}' for role, rss in limits['peak_parts'])}); "
              f"in-process, the sums "
              f"{sums:.0f} MB, with every estimate kept {kept:.0f} MB; one linear series' "
              f"sums with {WINDOWS} windows of 50 values: {series_kilobytes():.0f} kB")
    for r in results:
        print(f"{r['channels']} channels: the live history holds {r['live_points']} of "
              f"{WINDOWS} windows (the rest closed into the results store first)")
        if r["differences"]:
            print(f"\n{r['channels']} channels: the restarted collector's documents differ:")
            print("\n".join(f"  {line}" for line in r["differences"]))
        if "flooded" in r:
            print(f"\nvalid channel's update delay at {r['channels']} channels (push 1 s, "
                  f"{len(r['quiet'])} reports): without a flood median "
                  f"{statistics.median(r['quiet']):.2f} s, max {max(r['quiet']):.2f} s; "
                  f"with one device flooding 300 names median "
                  f"{statistics.median(r['flooded']):.2f} s, max {max(r['flooded']):.2f} s; "
                  f"RSS then {r['rss_flooded']:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
