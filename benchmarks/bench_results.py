"""The results store over a month: its size, the ingest rate with it, queries, memory.

A 30-day study simulated on a clock of its own (no sleeping): ``--channels`` linear channels
(classical OGPM, ε 2 on [0, 1]) reported by ``--agents`` devices in turn, one report of
``--values`` values per channel per minute, with the collector's default aggregates
(``[aggregates]`` unset: 1-minute windows, coarser 1 h and 1 d, 61 windows kept).  The
reports are fed minute by minute through ``Ingestor.ingest`` inside ``Ingestor.batch()``;
after each simulated minute, as a checkpoint does, ``close_windows(now, close_after_seconds)``
closes what ended (default grace, 120 s) and ``ResultsRecorder.record()`` writes it into a
SQLite results store (``collector.results.sqlite``: WAL, synchronous=FULL).  Three
processes, so that each one's memory is its own:

* **store** (``recording=True``): the default retention (minutes 7 days, hours 400 days,
  days for ever), applied at the end of every simulated day with the recorder's clock at
  that time; beside it, every batch also goes, outside the timed part, to a second store
  that keeps everything (once per simulated hour, one transaction).  Each store's size
  (file and write-ahead log) after the run per channel per day; the ingest rate: one
  simulated hour in ``--off-every`` the same reports (numbered apart: the trackers see no
  gaps) are fed also to an ingestor as collectors are without a store (``recording=False``,
  61 windows), alternately first and second, and the rates compared over those hours;
  queries of one channel (``ResultsStore.windows``): the month's hours (720 rows) and the
  last week's minutes (10,080), median of ``--query-runs``; RSS (VmRSS, after
  ``malloc_trim`` as the collector after a checkpoint) at the end of days 1, 10, 20 and 30;
  the checkpoint's size (``checkpoint.dump``: the open windows only) at those days.
* **history**: the same study kept in memory as a collector without a store does, at the
  most windows allowed (``keep_windows`` = 10,000: 6.9 days of minutes), for
  ``--history-days`` (8: its minutes are full from day 7 on, and without a store the coarser
  levels keep only their few newest windows, so it holds no more at a month); its RSS at
  days 1, 7 and the last, its ingest rate per day, and its checkpoint's size at the end.
* **estimates**: nothing in this benchmark computes a window's estimates (the live view
  does in a collector), so the recorder estimates every window it writes, 5-30 ms each:
  64 channels x 43,200 minutes would take hours.  The store and history runs therefore
  replace ``Series.estimate`` (this process only) by a fixed point of the right type
  (``LinearPoint``, full-precision floats, ``too_few`` under 100 values), and this run
  measures the real estimates for ``--estimate-minutes`` minutes from 23:45 (so that an
  hour and a day close on the way): the recorder's time per window at each resolution,
  and their JSON size against the stub's.

The store and history processes run side by side (two cores; ``--sequential``: one after
the other), the estimates one after history.  ``--profile``: the store run alone, for
``--days``, with cProfile around ``close_windows`` and ``record`` (top entries to stderr).

Run: ``python -m benchmarks.bench_results [--days 30] [--channels 64]
[--markdown docs/benchmarks/bench_results.md]`` (about 9 minutes on 2 cores; ``--days 2``
to try it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import numpy as np

from benchmarks.machine import describe_machine, print_table
from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import Series
from collector.config import MAX_WINDOWS, parse_collector_config
from collector.results.recorder import ResultsRecorder
from collector.results.sqlite import SqliteResultsStore
from collector.results.store import SeriesRecord
from collector.storage.checkpoint import dump
from collector.storage.states import LinearPoint, MeanPoint
from edge_agent import protocol
from edge_agent.common.memory import release_freed_heap
from edge_agent.mechanisms import ClassicalOGPM

FLEET = "bench"
DAY = 86400.0
MINUTES = 1440
T0 = 20_600 * DAY  # a midnight (UTC), 2026-05-27
MECHANISM = ClassicalOGPM(epsilon=2.0, low=0.0, high=1.0)
VARIANTS = 8  # code lists per (agent, channel), taken in turn
SEQ_MARK, T_MARK = 987_654_321_987, 0.125  # placeholders in a report's template
RESULT = "RESULT "  # a part's last stdout line: RESULT <json>


# -- reports, fast: one template per (agent, channel, code list) --------------------------------
class Reports:
    """One report per channel per simulated minute, as ``protocol.report`` encodes them (the
    first minute's are checked against it), each (agent, channel) numbered from 0."""

    def __init__(self, channels: int, agents: int, values: int, seed: int = 1):
        rng = np.random.default_rng(seed)
        description = MECHANISM.describe()
        self.channels = [f"ch{c:02d}" for c in range(channels)]
        self.agents = [f"dev{a}" for a in range(agents)]
        self.codes = [MECHANISM.perturb_codes(rng.beta(2.0, 5.0, values), rng).tolist()
                      for _ in range(VARIANTS)]
        self.description = description
        self.topics = {(a, c): protocol.data_topic(FLEET, a, c)
                       for a in self.agents for c in self.channels}
        self.templates = {}
        for agent in self.agents:
            for channel in self.channels:
                for variant, codes in enumerate(self.codes):
                    payload = protocol.report(agent=agent, channel=channel, kind="linear",
                                              seq=SEQ_MARK, t=T_MARK, dt=1.0, codes=codes,
                                              mechanism=description)
                    self.templates[agent, channel, variant] = _template(payload)
        self.seq = dict.fromkeys(self.topics, 0)
        self._checked = False

    def minute(self, m: int) -> list[tuple[str, bytes]]:
        """Minute ``m``'s reports (from T0), channel c's at second 1 + c % 50 of it."""
        out = []
        start = T0 + 60.0 * m
        for c, channel in enumerate(self.channels):
            agent = self.agents[(c + m) % len(self.agents)]
            seq = self.seq[agent, channel]
            self.seq[agent, channel] = seq + 1
            t = start + 1 + c % 50
            fields = {"seq": str(seq).encode(), "t": repr(float(t)).encode()}
            parts = self.templates[agent, channel, (7 * m + c) % VARIANTS]
            payload = b"".join(fields[p] if isinstance(p, str) else p for p in parts)
            if not self._checked:
                assert payload == protocol.report(
                    agent=agent, channel=channel, kind="linear", seq=seq, t=t, dt=1.0,
                    codes=self.codes[(7 * m + c) % VARIANTS], mechanism=self.description)
            out.append((self.topics[agent, channel], payload))
        self._checked = True
        return out


def _template(payload: bytes) -> list:
    """The payload's bytes around its placeholders, which become "seq" and "t"."""
    marks = {"seq": str(SEQ_MARK).encode(), "t": repr(T_MARK).encode()}
    for mark in marks.values():
        assert payload.count(mark) == 1, payload
    parts, rest = [], payload
    for name, mark in sorted(marks.items(), key=lambda item: payload.index(item[1])):
        before, rest = rest.split(mark)
        parts += [before, name]
    return [*parts, rest]


# -- the estimates, stubbed -----------------------------------------------------------------
def stub_estimate(self, blocks: dict, span: float, start: int):
    """A fixed point of a linear window's type and size (full-precision floats), instead of
    the estimates (5-30 ms each)."""
    count = self._count(blocks)
    return count, LinearPoint(start=start * span, end=(start + 1) * span, count=count,
                              too_few=count < 100,
                              mean=MeanPoint(estimate=0.2851239669421488,
                                             stderr=0.0410917478292134,
                                             ci95=(0.2045854310011905, 0.3656625028831071)))


# -- measurements -----------------------------------------------------------------------------
def rss_mb() -> dict[str, float]:
    """VmRSS and VmHWM (peak) in MB, after giving freed pages back as the collector does
    after each checkpoint (``edge_agent.common.memory.release_freed_heap``)."""
    release_freed_heap()
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return {"rss": int(fields["VmRSS"].split()[0]) / 1024,
            "peak": int(fields["VmHWM"].split()[0]) / 1024}


def report_days(days: int) -> list[int]:
    return sorted({1, *(d for d in (10, 20, 30) if d < days), days})


def median_ms(call, runs: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(runs):
        began = time.perf_counter()
        rows = len(call())
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times), rows


class Teed:
    """The recorder's store: writes go to ``store``, and are kept to be written to
    ``mirror`` (a store without retention) later, outside the timed part."""

    def __init__(self, store: SqliteResultsStore, mirror: SqliteResultsStore | None):
        self.store, self.mirror = store, mirror
        self.series: dict[str, SeriesRecord] = {}
        self.rows: list = []

    def applied(self, source):
        return self.store.applied(source)

    def read_sums(self, keys):
        return self.store.read_sums(keys)

    def write(self, source, batch, series, rows, now):
        done = self.store.write(source, batch, series, rows, now)
        if done and self.mirror is not None:
            self.series.update((record.key, record) for record in series)
            self.rows.extend(rows)
        return done

    def retain(self, span, before):
        return self.store.retain(span, before)

    def flush(self, now: float) -> None:
        if self.mirror is not None and self.rows:
            self.mirror.write("bench", None, list(self.series.values()), self.rows, now)
            self.rows = []


def config():
    return parse_collector_config({"fleet": FLEET})


# -- the parts (each in a process of its own) ---------------------------------------------------
def run_store(args) -> dict:
    """The study with a results store (default retention) beside one without retention,
    and an ingestor without a store fed the same reports one hour in ``off_every``."""
    Series.estimate = stub_estimate
    cfg = config()
    settings, grace = cfg.aggregate_settings, cfg.results.close_after_seconds
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="bench-results-") as tmp:
        store = SqliteResultsStore(Path(tmp) / "results.sqlite")
        mirror = SqliteResultsStore(Path(tmp) / "forever.sqlite")
        teed = Teed(store, mirror)
        ingestor = Ingestor.from_settings(FLEET, settings, recording=True)
        off = Ingestor.from_settings(FLEET, settings)
        clock = [T0]
        recorder = ResultsRecorder(teed, source=f"{FLEET}/bench", aggregates=lambda: ingestor,
                                   lock=threading.RLock(), retention=cfg.retention(),
                                   clock=lambda: clock[0])
        reports = Reports(args.channels, args.agents, args.values)
        off_reports = Reports(args.channels, args.agents, args.values)
        times = dict.fromkeys(("ingest", "close", "record", "retain", "off", "same_ingest",
                               "same_close", "same_record", "mirror", "reports"), 0.0)
        messages = same_messages = 0
        memory, checkpoints, began = {0: rss_mb()}, {}, time.monotonic()
        wanted, daily = report_days(args.days), []
        for day in range(args.days):
            before = dict(times)
            for minute in range(MINUTES):
                m = day * MINUTES + minute
                t0 = time.perf_counter()
                batch = reports.minute(m)
                times["reports"] += time.perf_counter() - t0
                end = T0 + 60.0 * (m + 1)
                same = (m // 60) % args.off_every == 0
                if same and m % 2:
                    times["off"] += ingest_off(off, off_reports.minute(m), end)
                t0 = time.perf_counter()
                with ingestor.batch():
                    for topic, payload in batch:
                        ingestor.ingest(topic, payload, now=end)
                t1 = time.perf_counter()
                if profiler is not None:
                    profiler.enable()
                clock[0] = end
                ingestor.close_windows(end, grace)
                recorder.durable = ingestor.flushes  # the checkpoint keeps them now
                t2 = time.perf_counter()
                recorder.record()
                t3 = time.perf_counter()
                if profiler is not None:
                    profiler.disable()
                times["ingest"] += t1 - t0
                times["close"] += t2 - t1
                times["record"] += t3 - t2
                messages += len(batch)
                if same:
                    times["same_ingest"] += t1 - t0
                    times["same_close"] += t2 - t1
                    times["same_record"] += t3 - t2
                    same_messages += len(batch)
                    if not m % 2:
                        times["off"] += ingest_off(off, off_reports.minute(m), end)
                if minute % 60 == 59:
                    t0 = time.perf_counter()
                    teed.flush(end)
                    times["mirror"] += time.perf_counter() - t0
            if day + 1 == args.days:  # the next checkpoint: everything ended is closed
                checkpoints[day + 1] = len(dump(ingestor))
                final = T0 + DAY * args.days
                t0 = time.perf_counter()
                clock[0] = final + grace
                ingestor.close_windows(final + grace, grace)
                recorder.durable = ingestor.flushes
                recorder.record()
                times["record"] += time.perf_counter() - t0
                teed.flush(final + grace)
            clock[0] = T0 + DAY * (day + 1)
            t0 = time.perf_counter()
            recorder.retain()
            times["retain"] += time.perf_counter() - t0
            daily.append({name: times[name] - before[name] for name in ("ingest", "record")})
            if day + 1 in wanted:
                memory[day + 1] = rss_mb()
                if day + 1 not in checkpoints:
                    checkpoints[day + 1] = len(dump(ingestor))
            print(f"store: day {day + 1}/{args.days}, {time.monotonic() - began:.0f} s; so far "
                  + ", ".join(f"{name} {spent:.1f} s" for name, spent in times.items()),
                  file=sys.stderr, flush=True)
        if profiler is not None:
            import pstats

            for order in ("tottime", "cumulative"):
                pstats.Stats(profiler, stream=sys.stderr).sort_stats(order).print_stats(25)
        key = SeriesRecord.of(next(iter(ingestor.series[reports.channels[0]].values()))).key
        first_hour, last_minute = int(T0 // 3600), int(T0 // 60) + args.days * MINUTES - 1
        week = min(7, args.days) * MINUTES
        queries = {}
        for name, target in (("store", store), ("forever", mirror)):
            queries[name] = {
                "hours": median_ms(lambda: target.windows(
                    key, 3600.0, first_hour, first_hour + 24 * args.days - 1, 100_000),
                    args.query_runs),
                "minutes": median_ms(lambda: target.windows(
                    key, 60.0, last_minute - week + 1, last_minute, 100_000), args.query_runs)}
        result = {
            "days": args.days, "channels": args.channels, "messages": messages,
            "same_messages": same_messages, "times": times, "daily": daily, "memory": memory,
            "checkpoints": checkpoints, "checkpoint_off": len(dump(off)),
            "size": store.size_bytes(), "size_forever": mirror.size_bytes(),
            "wal": wal_bytes(store), "wal_forever": wal_bytes(mirror),
            "written": recorder.written_windows, "deleted": recorder.deleted,
            "queries": queries, "seconds": time.monotonic() - began,
            "pending": len(ingestor.pending)}
        store.close()
        mirror.close()
    return result


def wal_bytes(store: SqliteResultsStore) -> int:
    wal = Path(f"{store.path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def ingest_off(off: Ingestor, batch: list, now: float) -> float:
    began = time.perf_counter()
    with off.batch():
        for topic, payload in batch:
            off.ingest(topic, payload, now=now)
    return time.perf_counter() - began


def run_history(args) -> dict:
    """The study kept in memory, without a store: 10,000 windows a level (the most allowed),
    for ``--history-days``."""
    Series.estimate = stub_estimate  # never called without a store; as the store run
    cfg = config()
    settings = msgspec.structs.replace(cfg.aggregate_settings, keep_windows=MAX_WINDOWS)
    ingestor = Ingestor.from_settings(FLEET, settings)
    reports = Reports(args.channels, args.agents, args.values)
    days = args.history_days
    full = -(-MAX_WINDOWS // MINUTES)  # the day the finest level fills up
    wanted = sorted({1, full, days} & set(range(1, days + 1)))
    memory, daily = {0: rss_mb()}, []
    began = time.monotonic()
    for day in range(days):
        ingest = 0.0
        for minute in range(MINUTES):
            m = day * MINUTES + minute
            ingest += ingest_off(ingestor, reports.minute(m), T0 + 60.0 * (m + 1))
        daily.append(ingest)
        if day + 1 in wanted:
            memory[day + 1] = rss_mb()
        print(f"history: day {day + 1}/{days}, {time.monotonic() - began:.0f} s, ingest "
              f"{ingest:.1f} s", file=sys.stderr, flush=True)
    windows = [sum(len(series.levels[level]) for by_identity in ingestor.series.values()
                   for series in by_identity.values()) for level in range(3)]
    t0 = time.perf_counter()
    checkpoint = len(dump(ingestor))
    dumped = time.perf_counter() - t0
    return {"days": days, "memory": memory, "daily": daily, "windows": windows,
            "messages_per_day": args.channels * MINUTES, "checkpoint": checkpoint,
            "dump_seconds": dumped, "after_dump": rss_mb(),
            "seconds": time.monotonic() - began}


def run_estimates(args) -> dict:
    """The recorder estimating every window itself, as in the store run without the stub:
    ``--estimate-minutes`` from 23:45 of the first day."""
    cfg = config()
    settings, grace = cfg.aggregate_settings, cfg.results.close_after_seconds
    real = Series.estimate
    costs: dict[float, list[float]] = {}
    sizes: dict[float, list[tuple[int, int]]] = {}

    def timed(self, blocks, span, start):
        t0 = time.perf_counter()
        found = real(self, blocks, span, start)
        costs.setdefault(span, []).append(time.perf_counter() - t0)
        stub = stub_estimate(self, blocks, span, start)
        sizes.setdefault(span, []).append((len(msgspec.json.encode(found[1])),
                                           len(msgspec.json.encode(stub[1]))))
        return found

    reports = Reports(args.channels, args.agents, args.values)
    with tempfile.TemporaryDirectory(prefix="bench-results-") as tmp:
        # compiled and warmed up first, on a series of its own
        warm = Ingestor.from_settings(FLEET, settings, recording=True)
        with warm.batch():
            for topic, payload in Reports(1, 1, args.values).minute(0):
                warm.ingest(topic, payload, now=T0 + 60)
        for by_identity in warm.series.values():
            for series in by_identity.values():
                series.estimate(series.windows[int(T0 // 60)], 60.0, int(T0 // 60))
        store = SqliteResultsStore(Path(tmp) / "results.sqlite")
        ingestor = Ingestor.from_settings(FLEET, settings, recording=True)
        clock = [T0]
        recorder = ResultsRecorder(store, source=f"{FLEET}/bench", aggregates=lambda: ingestor,
                                   lock=threading.RLock(), retention=cfg.retention(),
                                   clock=lambda: clock[0])
        Series.estimate = timed
        first = MINUTES - 15
        spent = {"ingest": 0.0, "record": 0.0}
        messages = 0
        for m in range(first, first + args.estimate_minutes):
            batch = reports.minute(m)
            end = T0 + 60.0 * (m + 1)
            t0 = time.perf_counter()
            with ingestor.batch():
                for topic, payload in batch:
                    ingestor.ingest(topic, payload, now=end)
            t1 = time.perf_counter()
            clock[0] = end
            ingestor.close_windows(end, grace)
            recorder.durable = ingestor.flushes
            recorder.record()
            spent["ingest"] += t1 - t0
            spent["record"] += time.perf_counter() - t1
            messages += len(batch)
        end = T0 + 60.0 * (first + args.estimate_minutes) + 3600 * 24
        ingestor.close_windows(end, grace)  # the rest, as the study's end would
        recorder.durable = ingestor.flushes
        recorder.record()
        Series.estimate = real
        store.close()
    return {"costs": {str(span): times for span, times in costs.items()},
            "sizes": {str(span): pairs for span, pairs in sizes.items()},
            "spent": spent, "messages": messages, "minutes": args.estimate_minutes}


PARTS = {"store": run_store, "history": run_history, "estimates": run_estimates}


# -- the table ----------------------------------------------------------------------------------
def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


def _per_window(t: dict, n: int) -> str:
    """What the store's share would be with more reports per window, its cost being per
    window and the ingest's per report (an extrapolation from the measured hours, with the
    ingest costing the same with and without a store)."""
    ingest, store, off = (1e6 * x / n for x in (t["same_ingest"],
                                                 t["same_close"] + t["same_record"], t["off"]))
    return (f"Where the time goes: the store's cost is per window closed ({store:.1f} µs for "
            f"each minute window, its hour's and day's shares included: `close_windows` "
            f"{1e6 * t['same_close'] / n:.1f}, `record` {1e6 * t['same_record'] / n:.1f}), the "
            f"ingest's per report ({ingest:.1f} µs with the store, {off:.1f} µs without, "
            f"{ingest / off:.0%}); here one report per window, the worst case.  Extrapolated "
            f"with the ingest costing the same with and without, R reports per channel-minute "
            f"would give "
            + ", ".join(f"{off / (off + store / r):.0%} at R = {r}" for r in (2, 5, 10, 50))
            + f"; 90% from R ≈ {9 * store / off:.1f}.")


def _days(n: int, after: int | None = None) -> str:
    """"n days", or with ``after`` the days numbered after it ("day 8", "days 8-30")."""
    if after is not None:
        return f"day {after + 1}" if n == 1 else f"days {after + 1}-{after + n}"
    return "1 day" if n == 1 else f"{n} days"


def markdown(args, store: dict, history: dict, estimates: dict, wall: float) -> str:
    days, channels = store["days"], store["channels"]
    t = store["times"]
    on_same = t["same_ingest"] + t["same_close"] + t["same_record"]
    n_same = store["same_messages"]
    off_rate, on_rate = n_same / t["off"], n_same / on_same
    on_all = t["ingest"] + t["close"] + t["record"]
    per_message = {k: 1e6 * t[k] / store["messages"] for k in ("ingest", "close", "record")}
    week = min(7, days) * MINUTES
    lines = [
        f"The results store over {_days(days)}, simulated (benchmarks/bench_results.py): "
        f"{channels} linear channels (classical OGPM, ε 2 on [0, 1]), {args.agents} agents in "
        f"turn, one report of {args.values} values per channel per minute "
        f"({store['messages']:,} reports), the default aggregates (1m / 1h / 1d, 61 windows) "
        f"and retention; {describe_machine()}; {wall:.0f} s.", "",
        "**Point estimates stubbed.**  In the store and history runs `Series.estimate` is "
        "replaced, in the benchmark's process only, by a fixed `LinearPoint` of full-precision "
        "floats (nothing here computes the windows' estimates, as a collector's live view "
        "does, so the recorder would estimate every window itself, 5-30 ms each: hours for "
        "a month).  Sizes, rates and memory below are with that stub; the real estimates' "
        "cost is measured apart (last table).", "",
        "| results store | windows written / deleted | file + WAL after the run (WAL) | "
        "per channel per day |",
        "|---|---:|---:|---:|",
        f"| default retention (minutes 7 d, hours 400 d, days for ever; applied each "
        f"simulated day) | {store['written']:,} / {store['deleted']:,} | {_mb(store['size'])} "
        f"({_mb(store['wal'])}) | {store['size'] / channels / days / 1024:,.1f} kB |",
        f"| no retention (written an hour at a time) | {store['written']:,} / 0 | "
        f"{_mb(store['size_forever'])} ({_mb(store['wal_forever'])}) | "
        f"{store['size_forever'] / channels / days / 1024:,.1f} kB |", "",
        f"Ingest through `Ingestor.ingest` in `batch()` (one batch per simulated minute), the "
        f"same {n_same:,} reports (one simulated hour in {args.off_every}) to both, "
        f"alternately first:", "",
        "| collector | messages/s | µs per message | share of without |",
        "|---|---:|---:|---:|",
        f"| without a store (`recording=False`, 61 windows) | {off_rate:,.0f} | "
        f"{1e6 / off_rate:.1f} | 100% |",
        f"| with the store (ingest + `close_windows` + `record` each minute) | {on_rate:,.0f} "
        f"| {1e6 / on_rate:.1f} | {on_rate / off_rate:.0%} |",
        f"| the same, all {store['messages']:,} reports: ingest / close / record | "
        f"{store['messages'] / on_all:,.0f} | {per_message['ingest']:.1f} / "
        f"{per_message['close']:.1f} / {per_message['record']:.1f} | "
        f"{store['messages'] / on_all / off_rate:.0%} |",
        f"| with the store, the daily retention counted too ({t['retain'] / days:.2f} s a "
        f"day) | {store['messages'] / (on_all + t['retain']):,.0f} | "
        f"{1e6 * (on_all + t['retain']) / store['messages']:.1f} | "
        f"{store['messages'] / (on_all + t['retain']) / off_rate:.0%} |", "",
        _per_window(t, n_same), "",
        "Queries of one channel (`ResultsStore.windows`, median of "
        f"{args.query_runs}):", "",
        "| query | rows | store with retention | store without |",
        "|---|---:|---:|---:|"]
    for name, label in (("hours", f"{_days(days)} of hours"),
                        ("minutes", f"{_days(week // MINUTES)} of minutes")):
        (ms, rows), (ms_forever, _) = store["queries"]["store"][name], \
            store["queries"]["forever"][name]
        lines.append(f"| {label} | {rows:,} | {ms:.1f} ms | {ms_forever:.1f} ms |")
    lines += ["", "Memory: VmRSS in MB (after `malloc_trim`, as the collector after a checkpoint) "
              "at the start and at the end of simulated days; the checkpoint "
              "(`len(checkpoint.dump(ingestor))`) at the same days:", "",
              "| process | RSS at start | RSS at the end of day: MB | peak (VmHWM) | "
              "checkpoint |",
              "|---|---:|---|---:|---|"]
    memory = store["memory"]
    checkpoints = {int(d): size for d, size in store["checkpoints"].items()}
    wanted = sorted(int(d) for d in memory if int(d))
    lines.append(
        "| with the store (its open windows and recent points; the process also holds the "
        "61-window ingestor without a store and the second store's connection) | "
        f"{memory['0']['rss']:.0f} | "
        + " · ".join(f"{d}: {memory[str(d)]['rss']:.0f}" for d in wanted)
        + f" | {memory[str(wanted[-1])]['peak']:.0f} | "
        + " · ".join(f"{d}: {_mb(checkpoints[d])}" for d in wanted) + " |")
    hist = history["memory"]
    hist_days = sorted(int(d) for d in hist if int(d))
    minutes, hours, whole_days = history["windows"]
    lines.append(
        f"| in-memory history without a store, {MAX_WINDOWS:,} windows a level (the most "
        f"allowed: {MAX_WINDOWS / MINUTES:.1f} days of minutes), {history['days']} days "
        f"({minutes:,} + {hours:,} + {whole_days:,} windows at the end) | "
        f"{hist['0']['rss']:.0f} | "
        + " · ".join(f"{d}: {hist[str(d)]['rss']:.0f}" for d in hist_days)
        + f" | {history['after_dump']['peak']:.0f} | {history['days']}: "
        f"{_mb(history['checkpoint'])} |")
    daily, per_day = store["daily"], channels * MINUTES
    hist_rate = [history["messages_per_day"] / spent for spent in history["daily"]]
    full = -(-MAX_WINDOWS // MINUTES)  # the day the finest level fills up (7)
    held = (minutes + hours + whole_days) / channels  # windows a channel
    extra = 24 * 30 + 30 - (hours + whole_days) / channels  # more at 30 days, if kept
    capped = hours < 24 * history["days"] * channels  # the coarser levels keep a few
    month = ("it holds no more at a month (without a store the coarser levels keep their "
             f"{hours // channels} and {whole_days // channels} newest windows)" if capped
             else f"at a month it would hold {extra:,.0f} more hours and days a channel "
                  f"({extra / held:.0%} more windows)")
    lines += ["", f"Per simulated day with the store, day 1 / {days}: ingest "
              f"{1e6 * daily[0]['ingest'] / per_day:.1f} / "
              f"{1e6 * daily[-1]['ingest'] / per_day:.1f} µs a report, record "
              f"{1000 * daily[0]['record'] / MINUTES:.2f} / "
              f"{1000 * daily[-1]['record'] / MINUTES:.2f} ms a minute.  The 61-window "
              f"ingestor's checkpoint: {_mb(store['checkpoint_off'])}.  History: peak with its "
              f"checkpoint's encoding ({history['dump_seconds']:.1f} s); {month}; its ingest "
              f"(in its own process, beside the store's) "
              f"{statistics.fmean(hist_rate[:full - 1]):,.0f} reports/s while its minutes "
              f"fill (days 1-{full - 1})"
              + (f", {statistics.fmean(hist_rate[full:]):,.0f} once full "
                 f"({_days(len(hist_rate) - full, after=full)}: each new window drops the "
                 f"oldest, found by `min` over {MAX_WINDOWS:,})" if len(hist_rate) > full
                 else "") + "."]
    lines += ["", f"Real estimates (`Series.estimate`, not stubbed), by the recorder, "
              f"{channels} channels for {estimates['minutes']} minutes from 23:45 (an hour "
              f"and a day close on the way; the rest at the end):", "",
              "| resolution | windows | median ms | mean ms | JSON bytes, real / stub |",
              "|---|---:|---:|---:|---:|"]
    for span in sorted(estimates["costs"], key=float):
        costs, sizes = estimates["costs"][span], estimates["sizes"][span]
        real = statistics.fmean(a for a, _ in sizes)
        stub = statistics.fmean(b for _, b in sizes)
        lines.append(f"| {float(span):g} s | {len(costs):,} | "
                     f"{1000 * statistics.median(costs):.1f} | "
                     f"{1000 * statistics.fmean(costs):.1f} | {real:.0f} / {stub:.0f} |")
    minute_cost = statistics.fmean(estimates["costs"]["60.0"])
    spent = estimates["spent"]
    per_minute = {k: 1000 * v / estimates["minutes"] for k, v in spent.items()}
    lines += ["", f"With them the recorder took {per_minute['record']:.0f} ms per simulated "
              f"minute against {per_minute['ingest']:.1f} ms of ingest; in real time "
              f"{channels} channels' minute windows cost "
              f"{channels * minute_cost:.2f} s of each minute, {channels * minute_cost / 60:.1%} "
              "of a core, in the recorder's thread off the collector's lock (a collector whose "
              "live view estimated them already reuses those)."]
    return "\n".join(lines)


def run_part(name: str, args, nice: int = 0) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchmarks.bench_results", "--run", name,
               "--days", str(args.days), "--channels", str(args.channels),
               "--agents", str(args.agents), "--values", str(args.values),
               "--off-every", str(args.off_every), "--query-runs", str(args.query_runs),
               "--history-days", str(args.history_days),
               "--estimate-minutes", str(args.estimate_minutes)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: os.nice(nice)) if nice else None)


def result_of(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode:
        raise SystemExit(f"{process.args[4]} run failed ({process.returncode})")
    return json.loads(out.strip().splitlines()[-1].removeprefix(RESULT))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--values", type=int, default=20, help="values per report")
    parser.add_argument("--off-every", type=int, default=10,
                        help="one simulated hour in this many also fed without a store")
    parser.add_argument("--history-days", type=int, default=8,
                        help="days of the in-memory history run (its minutes are full "
                             "from day 7 on)")
    parser.add_argument("--query-runs", type=int, default=7)
    parser.add_argument("--estimate-minutes", type=int, default=30)
    parser.add_argument("--sequential", action="store_true",
                        help="the store and history runs one after the other")
    parser.add_argument("--profile", action="store_true",
                        help="only the store run, cProfile around close_windows and record")
    parser.add_argument("--run", choices=sorted(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args()
    if args.run or args.profile:
        # stopped: the temporary stores are removed on the way out
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
        result = PARTS[args.run or "store"](args)
        print(RESULT + json.dumps(result))
        return
    began = time.monotonic()
    store = run_part("store", args)
    try:
        if args.sequential:
            stored = result_of(store)
        # beside the store run, below its priority: only its memory is compared
        history = result_of(run_part("history", args, nice=0 if args.sequential else 10))
        estimates = result_of(run_part("estimates", args))
        if not args.sequential:
            stored = result_of(store)
    finally:
        if store.poll() is None:
            store.terminate()
    print_table(markdown(args, stored, history, estimates, time.monotonic() - began),
                args.markdown)


if __name__ == "__main__":
    main()
