"""The edge agent: sources -> channels -> state store (budget, seq, spool) -> MQTT.

``AgentCore`` is one agent's logic with no network.  ``collect(now)`` polls its
sources and lets every channel select readings (a ``Batch``); ``record(batch,
tx)`` charges the budget, takes sequence numbers and spools the perturbed
messages through one state-store transaction, which the core drives.
``tick(now)`` is both.  ``AgentService`` runs one or more cores as a service:
JIT warm-up before READY, watchdog pings, the outbox pumping the spool to the
broker, a retained status, and a clean exit on SIGTERM or when every finite
source has ended (or, with ``keep_running``, only on SIGTERM).

The service is composed from its parts: by default one core built from the
configuration; the fleet simulator (``edge_agent.fleet``) builds its own cores,
transport and hooks and hands them in.  With several cores a batch is still one
transaction: ``record_batches`` records every core's batch in it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent import protocol, sdnotify
from edge_agent.channels import Channel, Selection, build_channels
from edge_agent.common.memory import release_code_pages
from edge_agent.config import AgentConfig
from edge_agent.fleet_spreads import FleetSpreads
from edge_agent.mechanisms.registry import AUTO_REPORTS
from edge_agent.range_responder import RangeResponder
from edge_agent.readings import Readings
from edge_agent.sources import build_source
from edge_agent.sources.base import Source
from edge_agent.spending import guarantee_text, unknown_past_lines, utc_text
from edge_agent.state import DELTA_UNIT, NANO, Budget, StateStore, Transaction, period_start
from edge_agent.transport import Outbox, PahoTransport, Transport

log = logging.getLogger(__name__)

STATE_FILE = "state.sqlite"


def open_state(config: AgentConfig) -> StateStore:
    """The agent's state file in ``[privacy] state_dir``."""
    return StateStore(Path(config.privacy.state_dir) / STATE_FILE,
                      max_messages=config.spool.max_messages)


# The loop wakes for a batch, a status, the watchdog, a transport event or a stop, and
# at least this often (the outbox's resend timers).  It used to poll 20 times a second:
# 0.9% of a core of the sample configuration's 1.1% (BENCHMARKS.md).
IDLE_WAKE_SECONDS = 1.0
# A stop (SIGTERM, the end of the sources) waits for the broker at most this long, so
# that the agent exits within 5 s whether or not the broker answers (a wearable out of
# range, a Pi shutting down offline): the spool is durable, and what the broker has not
# acknowledged by then is sent at the next start.  The last quarter is kept for the
# offline status.
STOP_SECONDS = 4.0

LOCAL_STATUS_FILE = "status.json"
LOCAL_STATUS_AGENTS = 100


def write_local_status(state_dir: Path, status: dict[str, Any]) -> None:
    """Atomically, readable by the owner and its group only (it holds counters that
    depend on readings)."""
    path = state_dir / LOCAL_STATUS_FILE
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(descriptor, "w") as file:
        json.dump(status, file, indent=1)
    os.replace(temporary, path)


def budget_of(config: AgentConfig) -> Budget:
    """``[privacy]``: every guarantee (or the shorthand's one), each over every rolling
    window of its length."""
    return Budget.of_guarantees([(g.epsilon, g.seconds, g.delta)
                                 for g in config.privacy.horizons])


@dataclass
class Batch:
    """One core's readings selected for release in one tick (raw, in memory only)."""

    core: AgentCore
    now: float
    t: float  # the batch's start and length, as reports carry them
    dt: float
    selections: list[tuple[Channel, Selection]] = field(default_factory=list)
    # filled by record(): per channel, readings wanted and reports the budget allowed
    outcomes: list[tuple[Channel, int, int]] = field(default_factory=list)


def record_batches(batches: list[Batch], store: StateStore) -> None:
    """Record several cores' batches in one transaction, then book their outcomes.

    The cores of one service share a state file, so a batch of a whole fleet is one
    commit however many virtual agents it has."""
    recorded = [batch for batch in batches if batch.selections]
    if recorded:
        with store.transaction(recorded[0].now) as tx:
            for batch in recorded:
                batch.core.record(batch, tx)
        for batch in recorded:  # after the commit: what is booked is on disk
            batch.core.settle(batch)
    # Every reading the sources handed out for these batches is now handled: spooled
    # (perturbed), or dropped by report_interval, the budget or the clock.  Not reached
    # when the commit failed (Source.committed).
    for batch in batches:
        if batch.core.acknowledging:
            batch.core.committed()


class AgentCore:
    def __init__(self, config: AgentConfig, store: StateStore, *,
                 sources: dict[str, Source] | None = None, rng: Any = None,
                 agent_id: str | None = None, channels: list[Channel] | None = None,
                 log_prefix: str = "", log_shared: bool = True):
        """``sources``/``channels``: built from the config unless given (a fleet passes
        its own); ``log_prefix`` starts this core's log lines (a fleet names its virtual
        agent there); ``log_shared``: log what every virtual agent of a fleet shares (a
        discovered range adopted, the clock behind): a fleet logs it for one agent only."""
        self.config = config
        self.agent_id = agent_id or config.agent_id
        self.store = store
        self.rng = rng  # None: the OS-seeded CSPRNG; tests may pass a seeded Generator
        self.sources = sources if sources is not None else {
            s.name: build_source(s, agent_id=self.agent_id) for s in config.sources}
        self.channels: list[Channel] = channels if channels is not None else \
            build_channels(config, self.agent_id)
        self.period_seconds = config.privacy.period_seconds
        self.budget = budget_of(config)
        self.range: RangeResponder | None = None  # set by the service: range discovery
        # Set by the service with plan_spread = "auto": what the collector says of the fleet.
        self.fleet_spreads: FleetSpreads | None = None
        self.log_prefix = log_prefix
        self.log_shared = log_shared
        self._period: int | None = None
        self.exhausted: set[str] = set()
        self.clock_behind = False
        self._last_tick: float | None = None
        # The sources that acknowledge their senders once their readings are committed.
        self._acknowledging = [s for s in self.sources.values() if s.acknowledges]

    @property
    def acknowledging(self) -> bool:
        return bool(self._acknowledging)

    def committed(self) -> None:
        """After the commit of a tick (``record_batches``): what the sources handed out
        at that tick is handled (``Source.committed``)."""
        for source in self._acknowledging:
            try:
                source.committed()
            except Exception:  # a source bug must not stop the agent
                log.exception("source %s failed to acknowledge", source.name)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        for source in self.sources.values():
            source.start()
            if source.error:
                log.error("source %s failed to start: %s", source.name, source.error)

    def stop(self) -> None:
        for source in self.sources.values():
            source.stop()

    def warm_up(self) -> None:
        for channel in self.channels:
            channel.warm_up()

    @property
    def finished(self) -> bool:
        return all(source.finished for source in self.sources.values())

    @property
    def failed_sources(self) -> dict[str, str]:
        return {s.name: s.error for s in self.sources.values() if s.error}

    def _adopt_discovered_ranges(self) -> None:
        """Linear channels take the latest discovered range when a (UTC-aligned) budget
        period begins, never in the middle of one, a restart included: ``domain = "auto"``
        reports over it, ``mechanism = "auto"`` chooses again for a fleet there.  The
        range is what the results' intervals hold at their confidence (their outer
        ends), so that the fleet's extremes are inside it rather than at its edges."""
        if self.range is None:
            return
        for channel in self.channels:
            if channel.kind != "linear":
                continue
            found = discovered_range(self.range.results.get((channel.name, "min")),
                                     self.range.results.get((channel.name, "max")))
            if found is None:
                continue
            (low, high), participants = found
            if channel.adopt_range(low, high, reports=participants) and self.log_shared:
                log.info("%schannel %s now reports with %s over [%g, %g] (discovered range "
                         "[%g, %g])", self.log_prefix, channel.name, channel.mechanism.name,
                         channel.mechanism.low, channel.mechanism.high, low, high)
            flat = channel.flat_ends(low, high)
            if flat and self.log_shared:
                # The collector says so too; here it can still be changed.
                log.warning("%schannel %s: the fleet's range [%g, %g] reaches where %s at "
                            "epsilon %g reports the same distribution for every value (%s): "
                            "its mean there is estimated at that region's edge; mechanism = "
                            '"auto" chooses PM-C or SW-C for such data', self.log_prefix,
                            channel.name, low, high, channel.mechanism.name,
                            channel.mechanism.epsilon,
                            ", ".join(f"[{a:g}, {b:g}]" for a, b in flat))

    def _adopt_fleet_spreads(self) -> None:
        """``plan_spread = "auto"``: each planned linear channel takes the schedule of
        least error for the fleet the collector last described, when a (UTC-aligned)
        budget period begins (``edge_agent.fleet_spreads``): the same shares of the
        guarantees, another spacing and ε per report."""
        if self.fleet_spreads is None:
            return
        for channel in self.channels:
            planned = self.fleet_spreads.plan(self.config, channel.name)
            if planned is None:
                continue
            if channel.replan(planned.spacing, planned.epsilon) and self.log_shared:
                spread, fleet = self.fleet_spreads.latest[channel.name]
                log.info("%schannel %s now reports every %.4g s at epsilon %g (planned for "
                         "%d agents spread by %.3g of the domain's width)", self.log_prefix,
                         channel.name, planned.spacing, planned.epsilon, fleet, spread)

    # -- one batch --------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """One batch: poll every source once, select per channel, charge and spool."""
        record_batches([self.collect(now)], self.store)

    def collect(self, now: float) -> Batch:
        """Poll every source once and select what each channel would release.

        This is the only place a tick's readings are taken from the sources."""
        batch_start = self._last_tick if self._last_tick is not None else now
        self._last_tick = now
        readings = {name: self._poll(source, now) for name, source in self.sources.items()}
        if self.range is not None:  # range discovery answers from the raw readings
            for channel in self.channels:
                if channel.kind == "linear":
                    source = readings[channel.source]
                    self.range.observe(self.agent_id, channel.name, source.times,
                                       source.column(channel.config.field))
        start = period_start(now, self.period_seconds)
        if start != self._period:
            if self._period is not None:  # not at the first batch after a (re)start
                self._adopt_discovered_ranges()
                self._adopt_fleet_spreads()
            self._period = start
        batch = Batch(self, now, batch_start, now - batch_start)
        for channel in self.channels:
            selection = channel.select(readings[channel.source], now, self.rng)
            if len(selection):
                batch.selections.append((channel, selection))
        return batch

    def record(self, batch: Batch, tx: Transaction) -> None:
        """Charge what the budget allows of the batch, number it, perturb it and spool
        the messages, all in the caller's transaction.  Each channel in its own savepoint:
        a channel that fails costs only its own batch (counted and logged on the device)."""
        if tx.clock.behind(batch.now):
            self._clock_behind(batch, tx.clock.wall_high)
            return
        for channel, selection in batch.selections:
            try:
                with tx.savepoint():
                    allowed = tx.charge(self.agent_id, channel.name, cost=channel.charge_nano,
                                        wanted=len(selection), budget=self.budget,
                                        delta_cost=channel.charge_delta)
                    if allowed:
                        seq = tx.take_seq(self.agent_id, channel.name)
                        reported = channel.memoized(selection, allowed, tx, self.rng)
                        tx.spool(*channel.build_message(reported, seq=seq, allowed=allowed,
                                                        t=batch.t, dt=batch.dt, rng=self.rng),
                                 report=(self.agent_id, channel.name, seq))
            except Exception:
                channel.local["errors"] += 1
                log.exception("%schannel %s: its batch failed and was dropped",
                              self.log_prefix, channel.name)
                continue
            batch.outcomes.append((channel, len(selection), allowed))

    def _clock_behind(self, batch: Batch, wall_high: float) -> None:
        for channel, selection in batch.selections:
            channel.local["clock_behind"] += len(selection)
        if not self.clock_behind:
            self.clock_behind = True
            if self.log_shared:
                log.warning("%sthe clock is behind the latest time it showed (%s): nothing "
                            "is reported until it catches up (docs/guides/PRIVACY.md)",
                            self.log_prefix, utc_text(wall_high))

    def settle(self, batch: Batch) -> None:
        """Book what the budget refused of a recorded batch (logged once per exhaustion)."""
        if batch.outcomes and self.clock_behind:
            self.clock_behind = False
            if self.log_shared:
                log.info("%sthe clock has caught up: reporting again", self.log_prefix)
        for channel, wanted, allowed in batch.outcomes:
            if channel.spacing is not None:  # planned: a refused report stays due
                if allowed:
                    channel.reported(batch.now)
                else:
                    channel.local["budget_refused"] += wanted
                continue
            if allowed == wanted:
                if channel.name in self.exhausted:
                    self.exhausted.discard(channel.name)
                    log.info("%schannel %s reports again", self.log_prefix, channel.name)
                continue
            channel.local["budget_refused"] += wanted - allowed
            if channel.name not in self.exhausted:
                self.exhausted.add(channel.name)
                log.warning("%sprivacy budget exhausted: channel %s reports again as earlier "
                            "spending leaves its rolling window (%s)", self.log_prefix,
                            channel.name, guarantee_text(self.config.privacy.horizons))

    def _poll(self, source: Source, now: float) -> Readings:
        try:
            return source.poll(now)
        except Exception as exc:  # a source bug must not stop the other sources
            source.fail(f"{type(exc).__name__} while reading")
            log.exception("source %s failed", source.name)
            return Readings.empty()

    # -- status ----------------------------------------------------------------------------------
    def status(self, state: str = "online") -> dict[str, Any]:
        """What the retained status publishes: only what the reports themselves show
        (docs/guides/PRIVACY.md): the ε (and δ, with a δ budget) spent is what the reports
        charged, ``reports`` and ``messages`` count them."""
        guarantees = []
        for guarantee in self.config.privacy.horizons:
            spent = self.store.spent(self.agent_id, guarantee.seconds)
            entry = {"epsilon": guarantee.epsilon, "spent": round(spent / NANO, 9),
                     "period": guarantee.per}
            if guarantee.delta > 0:
                entry["delta"] = guarantee.delta
                entry["delta_spent"] = \
                    self.store.spent_delta(self.agent_id, guarantee.seconds) / DELTA_UNIT
            guarantees.append(entry)
        return {
            "state": state,
            # The longest guarantee's, as collectors before guarantees read it.
            "budget": guarantees[-1],
            "channels": {c.name: {"exhausted": c.name in self.exhausted, **c.counters}
                         for c in self.channels},
            "sources": {s.name: {"finished": s.finished, "error": s.error}
                        for s in self.sources.values()},
            "guarantees": guarantees,
        }

    def local_status(self) -> dict[str, Any]:
        """The device-only status: also the counters that depend on readings (non-finite,
        clipped or wrapped values, readings the budget or the clock refused, rows a
        source could not read).  Written to the state directory, never published."""
        status = self.status()
        status["clock_behind"] = self.clock_behind
        for channel in self.channels:
            status["channels"][channel.name].update(channel.local)
        # How many distinct values a wearer had depends on the readings: here only.
        for name, (count, nano) in self.store.memo_account(self.agent_id).items():
            if name in status["channels"]:
                status["channels"][name].update(memoized_values=count,
                                                memo_epsilon_spent=round(nano / NANO, 9))
        for source in self.sources.values():
            status["sources"][source.name]["rejected_rows"] = source.rejected_rows
            status["sources"][source.name].update(source.local_counters())
        return status


def discovered_range(low, high) -> tuple[tuple[float, float], int] | None:
    """((least, largest value), participants) from the latest min and max results: the
    outer ends of their intervals (the estimates where a coordinator gave none)."""
    if low is None or high is None:
        return None
    least = low.interval[0] if low.interval is not None else low.estimate
    largest = high.interval[1] if high.interval is not None else high.estimate
    participants = min(low.participants or AUTO_REPORTS, high.participants or AUTO_REPORTS)
    return (least, largest), participants


class AgentService:
    """Runs agent cores with one transport until stopped or their sources end."""

    def __init__(self, config: AgentConfig, *, store: StateStore | None = None,
                 cores: list[AgentCore] | None = None, transport: Transport | None = None,
                 outbox_window: int | None = None, rng: Any = None,
                 clock: Callable[[], float] = time.time,
                 drain_timeout: float = STOP_SECONDS,
                 status_interval: float = 30.0, keep_running: bool = False,
                 after_batch: Callable[[], None] | None = None):
        """One agent from ``config`` unless ``cores`` (sharing ``store``), ``transport``
        and ``outbox_window`` say otherwise; ``after_batch`` runs after every batch."""
        self.config = config
        self.store = store or open_state(config)
        self.cores = cores if cores is not None else [AgentCore(config, self.store, rng=rng)]
        self.status_topic = protocol.status_topic(config.fleet, config.agent_id)
        self.transport = transport or PahoTransport(
            config.broker, client_id=config.agent_id,
            will=(self.status_topic, protocol.status(agent=config.agent_id, state="offline")))
        self.clock = clock
        self.after_batch = after_batch
        self.range = RangeResponder(
            fleet=config.fleet, store=self.store, rng=rng,
            agents={core.agent_id: [c.name for c in core.channels if c.kind == "linear"]
                    for core in self.cores},
            budget=budget_of(config), range_epsilon_max=config.range_epsilon_limit)
        for core in self.cores:
            core.range = self.range
        self.agents = frozenset(core.agent_id for core in self.cores)
        subscriptions = list(self.range.subscriptions)
        self.fleet_spreads = None
        if config.plan is not None and config.privacy.plan_spread == "auto":
            widths = {c.name: c.start_domain[1] - c.start_domain[0] for c in config.channels
                      if c.kind == "linear"}
            if widths:
                self.fleet_spreads = FleetSpreads(config.fleet, widths)
                subscriptions += self.fleet_spreads.subscriptions
                for core in self.cores:
                    core.fleet_spreads = self.fleet_spreads
        if config.delivery.confirm == "collector":
            # A device reads only its own confirmations (configs/mosquitto.acl); the fleet
            # simulator's one connection carries many agents.
            subscriptions += [protocol.confirm_topic(config.fleet, agent) for agent in
                              (self.agents if len(self.agents) == 1 else ["+"])]
        self.transport.subscribe(subscriptions)
        self.outbox = Outbox(self.store, self.transport,
                             window=outbox_window or config.broker.max_inflight,
                             delivery=config.delivery, on_connect=self._publish_status,
                             on_message=self._on_message)
        self.drain_timeout = drain_timeout
        self.status_interval = status_interval
        # Stay connected after every finite source has ended, until SIGTERM/SIGINT.
        self.keep_running = keep_running
        self._next_overrun_warning = 0.0
        self._stop = threading.Event()
        # Set by a stop request and by every transport event (a connection, an
        # acknowledgement, a message): the loop sleeps until then or its next timer.
        self._wake = threading.Event()
        self.transport.on_event = self._wake.set
        self.watchdog = sdnotify.Watchdog()  # disabled unless systemd set WATCHDOG_USEC
        self.exit_code = 0

    def _on_message(self, topic: str, payload: bytes) -> None:
        if protocol.confirm_agent(topic, self.config.fleet) is not None:
            self.outbox.confirmed(topic, payload, self.config.fleet, self.agents)
        elif self.fleet_spreads is not None and self.fleet_spreads.handle(topic, payload):
            return
        else:
            self.range.handle(topic, payload, self.clock())

    def request_stop(self, *_: Any) -> None:
        self._stop.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def _publish_status(self, state: str = "online") -> None:
        for core in self.cores:
            self.outbox.publish(
                protocol.status_topic(self.config.fleet, core.agent_id),
                protocol.status(agent=core.agent_id, t=self.clock(), **core.status(state),
                                range=self.range.status(core.agent_id)),
                qos=1, retain=True)

    def _write_local_status(self) -> None:
        """The device-only status (``AgentCore.local_status``) in the state directory,
        readable by ``edge-agent status``; for a fleet, its first LOCAL_STATUS_AGENTS."""
        try:
            write_local_status(Path(self.config.privacy.state_dir), {
                "t": round(self.clock(), 3), "agents": len(self.cores),
                "status": {core.agent_id: {**core.local_status(),
                                           "range": self.range.status(core.agent_id)}
                           for core in self.cores[:LOCAL_STATUS_AGENTS]}})
        except OSError as exc:
            log.warning("local status not written: %s", exc)

    def draw_memos(self) -> None:
        """Every memoized channel's memos of every category, drawn before the first batch
        (one transaction for every core: a fleet's virtual agents too)."""
        memoized = [(core, channel) for core in self.cores for channel in core.channels
                    if getattr(channel.config, "memoize", False)]
        if memoized:
            with self.store.transaction(self.clock()) as tx:
                for core, channel in memoized:
                    channel.draw_memos(tx, core.rng)

    def tick(self, now: float) -> None:
        """One tick of the batch clock: the reports of the batches before it go out, then
        one batch of every core is recorded in one transaction (its reports go out at the
        next tick, whenever their computation ends: docs/guides/PRIVACY.md, "Timing")."""
        started = time.monotonic()
        self.outbox.release()
        self.outbox.pump()
        record_batches([core.collect(now) for core in self.cores], self.store)
        if self.after_batch is not None:
            self.after_batch()
        took = time.monotonic() - started
        if len(self.cores) > 1 and took > self.config.batch_seconds \
                and started >= self._next_overrun_warning:
            # A fleet too large for the CPU: batches stretch (nothing is lost, each
            # message carries more readings), and status, acks and signals wait longer.
            log.warning("a batch of %d agents took %.1f s (batch_seconds = %g): batches "
                        "stretch to what the CPU manages", len(self.cores), took,
                        self.config.batch_seconds)
            self._next_overrun_warning = started + 600.0

    def run(self) -> int:
        batch = self.config.batch_seconds
        release_code_pages()  # what numba's import touched
        for core in self.cores:
            core.warm_up()  # numba compiles here, before READY
            core.start()
        self.draw_memos()
        log.debug("LLVM's code pages released after the warm-up: %.1f MB",
                  release_code_pages() / 2**20)
        self.transport.start()
        sdnotify.ready("warmed up; reporting")
        # Batches are timed by the monotonic clock: a wall clock stepped back must not
        # stop them (the ledger decides what may be reported meanwhile).
        elapsed = time.monotonic
        began = elapsed()
        next_tick, next_status = began + batch, began + self.status_interval
        log.info("agent %s running: %d agent(s), %d channel(s), batches of %gs",
                 self.config.agent_id, len(self.cores),
                 sum(len(c.channels) for c in self.cores), batch)
        for line in unknown_past_lines(self.store.clock(self.clock()),
                                       self.config.privacy.horizons):
            log.warning(line)
        ended = False
        try:
            while not self._stop.is_set():
                now = elapsed()
                if now >= next_tick:
                    self.tick(self.clock())
                    # The batch clock keeps to its grid: a batch that overran (a fleet
                    # too large for the CPU) waits for the next tick after it ended.
                    next_tick = began + batch * (math.floor((elapsed() - began) / batch) + 1)
                self.outbox.pump()
                self.watchdog.tick()
                if now >= next_status:
                    self._write_local_status()
                    if self.transport.connected:
                        self._publish_status()
                    next_status = now + self.status_interval
                if not ended and all(core.finished for core in self.cores):
                    ended = True
                    if not self.keep_running:
                        log.info("all sources have ended")
                        break
                    log.info("all sources have ended; staying connected until SIGTERM")
                self._wake.wait(self.watchdog.clamp_timeout(max(0.0, min(
                    next_tick, next_status, elapsed() + IDLE_WAKE_SECONDS) - elapsed())))
                self._wake.clear()
        finally:
            self._shutdown()
        return self.exit_code

    def _shutdown(self) -> None:
        """The last batch into the spool, then what the broker acknowledges within
        ``drain_timeout`` (nothing to wait for while it is unreachable), the offline
        status, and out."""
        began = time.monotonic()
        sdnotify.stopping()
        self.tick(self.clock())  # whatever the sources still hold goes into the spool
        self._write_local_status()
        deadline = began + self.drain_timeout
        drained = began + 0.75 * self.drain_timeout  # the rest for the offline status
        # The last batch goes out a batch after the stop began, whenever its computation
        # ended, as every batch does (or, past the drain's time, at the next start).
        release_at = began + self.config.batch_seconds
        while (wait := min(release_at, drained) - time.monotonic()) > 0:
            self._wake.wait(self.watchdog.clamp_timeout(wait))  # acks, until then
            self._wake.clear()
            self.outbox.pump()
            self.watchdog.tick()
        if time.monotonic() >= release_at:
            self.outbox.release()
        for core in self.cores:
            core.stop()
        failed = [(core.agent_id, name, error) for core in self.cores
                  for name, error in core.failed_sources.items()]
        if failed:
            self.exit_code = 1
            for agent, name, error in failed[:10]:
                if len(self.cores) == 1:
                    log.error("source %s failed: %s", name, error)
                else:
                    log.error("agent %s: source %s failed: %s", agent, name, error)
            if len(failed) > 10:
                log.error("... and %d more failed source(s)", len(failed) - 10)
        while not self.outbox.idle and self.transport.connected \
                and time.monotonic() < drained:
            self.outbox.pump()
            self.watchdog.tick()
            time.sleep(0.02)
        if not self.outbox.idle:
            log.warning("%d message(s) stay in the spool; they are sent at the next start",
                        self.store.spooled)
        elif self.store.spooled:
            log.info("%d report(s) stay in the spool until a collector confirms them",
                     self.store.spooled)
        if self.transport.connected:
            # A clean disconnect does not fire the last will, so say it ourselves,
            # and wait (within the drain timeout) until the broker has them all.
            self._publish_status("offline")
            self.outbox.pump()
            while self.outbox.unacked_direct and self.transport.connected \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
                self.outbox.pump()
            if self.outbox.unacked_direct:
                log.warning("%d status message(s) not acknowledged at exit",
                            self.outbox.unacked_direct)
        self.transport.stop()
        self.store.close()
