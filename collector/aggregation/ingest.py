"""Aggregating report messages (no I/O here; see ``service.py``).

``Ingestor.ingest(topic, payload)`` decodes one message through the typed
protocol (``edge_agent.protocol``: every check of docs/reference/PROTOCOL.md), drops
duplicates by (agent, channel, seq) (``dedup.SeqTracker``), and adds the codes
to the channel's series.  A message that fails any check is rejected, counted
by reason and kept (truncated) in a bounded dead-letter log; it changes no
aggregate.

What a sender can make a collector hold is bounded (``IngestLimits``, the
``[limits]`` and ``[registry]`` of the configuration): agents, channels,
series per channel, agents known only from a status, how far a report's time
may run ahead of the collector's clock or lag behind it.  Past a limit the
message is refused with its own reason and a log line says which limit.

``to_state()`` / ``from_state()`` give the aggregates as the typed state of
``collector.storage.states``: what a checkpoint saves (with the trackers,
``collector.storage.checkpoint``) and what a scale-out member writes as a partition's
state for the merge view.  Totals are derived from the agents, never stored
beside them.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from collector.aggregation.dedup import SeqTracker
from collector.aggregation.series import ClosedWindow, Series, new_series, series_identity
from collector.aggregation.stats import StateError
from collector.storage.states import (
    DEAD_LETTERS,
    IN_THE_STORE,
    AgentState,
    AggregateSettings,
    DeadLetter,
    IngestorState,
    PendingBatch,
    PendingWindow,
    StatusSummary,
)
from edge_agent import protocol
from edge_agent.protocol import Confirm, Rejected, Report, ValidReport
from edge_agent.protocol.codec import encode

log = logging.getLogger(__name__)

COUNTERS = ("messages", "values", "duplicates")
# Recording: windows opened since the last close beyond which they are closed early
# (``overfull``).  Well above what a steady fleet at the default limits opens between two
# checkpoints (4,096 series: a minute each a minute, and an hour and a day at their turn).
OPENED_BEFORE_CLOSING = 16_384


@dataclass(frozen=True)
class IngestLimits:
    """What input may make an ``Ingestor`` hold (None: no bound); see ``[limits]``.

    ``registry``: the agent ids allowed to report, or None for any agent."""

    agents: int | None = None
    channels: int | None = None
    series_per_channel: int | None = None
    statuses: int | None = None  # agents known only from a status, not yet from a report
    future_seconds: float | None = None  # t + dt at most this far past the receiving clock
    max_age_seconds: float | None = None  # t at most this far before it
    categories: int | None = None  # categories of a categorical series
    registry: frozenset[str] | None = None

    def allows(self, agent: str) -> bool:
        return self.registry is None or agent in self.registry

    def offline(self) -> IngestLimits:
        """These limits for recorded messages replayed offline (``collector.tools.replay``):
        the registry stays, but no report is compared with a receiving clock (reasons
        ``future`` and ``stale``: a recording is re-read at any later time) and nothing
        is capped per collector (agents, channels, series, statuses, categories: only
        memory bounds a study).  Every message's own bounds (payload size, the typed
        protocol's field bounds) apply as always."""
        return IngestLimits(registry=self.registry)


# Why a limit refused a message, and the [limits] key to raise.
LIMIT_KEYS = {"limit_agents": "agents", "limit_channels": "channels",
              "limit_series": "series_per_channel", "limit_statuses": "statuses",
              "limit_categories": "categories"}


@dataclass
class AgentStats:
    messages: int = 0
    values: int = 0
    duplicates: int = 0
    rejects: int = 0
    last_seen: float | None = None
    online: bool | None = None  # from the retained status topic
    status: StatusSummary = field(default_factory=StatusSummary)

    @property
    def status_time(self) -> float:
        """When the agent published its status (its own clock), else -inf."""
        return self.status.t if self.status.t is not None else -math.inf


class Ingestor:
    """All aggregation state of a collector; mergeable across partitions."""

    def __init__(self, *, fleet: str, bins: int = 50, window_seconds: float = 60.0,
                 keep_windows: int = 60, coarser: tuple[int, ...] = (),
                 limits: IngestLimits = IngestLimits(), recording: bool = False):
        """``coarser``: the coarser resolutions, each a multiple of the one before;
        ``recording``: closed windows go to a results store (``close_windows``)."""
        self.fleet = fleet
        self.limits = limits
        self.bins, self.window_seconds, self.keep_windows = bins, window_seconds, keep_windows
        self.coarser, self.recording = tuple(coarser), recording
        # Recording: batches of closed windows handed to the results store and not yet
        # confirmed written (a checkpoint keeps them), by number, and the last number given.
        self.pending: dict[int, list[ClosedWindow]] = {}
        self.flushes = 0
        self.opened = 0  # windows opened since the last ``close_windows`` (``overfull``)
        self.source: str | None = None  # the name its batches are written under
        self.series: dict[str, dict[tuple, Series]] = {}  # channel -> identity -> series
        self.latest: dict[str, tuple] = {}  # channel -> identity of the newest series
        self.latest_at: dict[str, float] = {}  # channel -> when ``latest`` was last reported
        self.trackers: dict[tuple[str, str], SeqTracker] = {}
        self.agents: dict[str, AgentStats] = {}
        self.rejects = collections.Counter()  # by reason
        self.dead_letters: collections.deque = collections.deque(maxlen=DEAD_LETTERS)
        self.status_only: set[str] = set()  # agents known from a status, not from a report
        # Agents whose settled numbers changed, or who sent one again (they lack our
        # confirmation), since the last ``confirmations()``.
        self.unconfirmed: set[str] = set()
        self.limits_reached: set[str] = set()  # logged once each (LIMIT_KEYS)
        self._batch: dict[int, tuple[Series, list]] | None = None  # see batch()

    @classmethod
    def from_settings(cls, fleet: str, settings: AggregateSettings,
                      limits: IngestLimits = IngestLimits(), *,
                      recording: bool = False) -> Ingestor:
        """An empty ingestor with these aggregates settings."""
        return cls(fleet=fleet, bins=settings.bins, window_seconds=settings.window_seconds,
                   keep_windows=settings.keep_windows, coarser=settings.coarser,
                   limits=limits, recording=recording)

    def settings(self) -> AggregateSettings:
        return AggregateSettings(bins=self.bins, window_seconds=self.window_seconds,
                                 keep_windows=self.keep_windows, coarser=self.coarser)

    def _series_settings(self) -> dict:
        return dict(bins=self.bins, window_seconds=self.window_seconds,
                    keep_windows=self.keep_windows, coarser=self.coarser,
                    recording=self.recording)

    def adapt(self, settings: AggregateSettings) -> None:
        """Take the configuration's resolutions and history length (a restored checkpoint's
        may differ): see ``Series.relevel``.  Bins and the finest window cannot change under
        sums already counted: those of the checkpoint stay (logged)."""
        if (settings.bins, settings.window_seconds) != (self.bins, self.window_seconds):
            log.warning("[aggregates] histogram_bins = %d and window_seconds = %g differ from "
                        "the stored aggregates' (%d, %g), which stay: move the storage and "
                        "results files away to start with the new ones", settings.bins,
                        settings.window_seconds, self.bins, self.window_seconds)
            return
        if (settings.coarser, settings.keep_windows) == (self.coarser, self.keep_windows):
            return
        dropped = sum(series.relevel(settings.coarser, settings.keep_windows)
                      for by_identity in self.series.values()
                      for series in by_identity.values())
        if settings.coarser != self.coarser:
            log.warning("[aggregates] resolutions changed: a new resolution's first window "
                        "counts the reports from now on; %d open window(s) of resolutions no "
                        "longer configured dropped", dropped)
        self.coarser, self.keep_windows = settings.coarser, settings.keep_windows

    # -- the results store (collector.results) ----------------------------------------------
    @property
    def overfull(self) -> bool:
        """Recording: windows should be closed now, not at the next checkpoint: some
        series holds more windows than ``keep_windows`` at a level (late reports spread
        over many windows), or more than ``OPENED_BEFORE_CLOSING`` windows opened since
        the last close (a burst of history: at the default limits a quarter of a million
        windows of about 900 bytes each, which a close makes about 100 bytes)."""
        return self.opened > OPENED_BEFORE_CLOSING or any(
            series.overfull for by_identity in self.series.values()
            for series in by_identity.values())

    def close_windows(self, now: float, grace: float) -> int | None:
        """Recording: every window that ended ``grace`` seconds before ``now``, of every
        series, as one numbered batch for the results store (``pending``, kept by
        checkpoints until ``written``); its number, or None if none closed."""
        closed = [window for by_identity in self.series.values()
                  for series in by_identity.values() for window in series.close(now, grace)]
        self.opened = 0
        if not closed:
            return None
        self.flushes += 1
        self.pending[self.flushes] = closed
        return self.flushes

    def written(self, batch: int, estimates: list | None = None) -> None:
        """The results store holds batch number ``batch``: it is no longer pending.
        ``estimates``: each of its windows' (count, point) as the store estimated them,
        which recent finest windows keep (``Series.recorded``)."""
        for window, point in zip(self.pending.pop(batch, ()), estimates or ()):
            window.series.recorded(window, point)

    @property
    def counters(self) -> collections.Counter:
        """Messages and values accepted and duplicates dropped, over all agents."""
        totals = collections.Counter(dict.fromkeys(COUNTERS, 0))
        for stats in self.agents.values():
            totals["messages"] += stats.messages
            totals["values"] += stats.values
            totals["duplicates"] += stats.duplicates
        return totals

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_batch"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({**state, "_batch": None})

    @contextlib.contextmanager
    def batch(self):
        """Messages ingested inside are checked, deduplicated and counted one by one
        as always, but their codes reach the statistics together at the end, one
        summary per series and window (``Series.update_many``): most of a
        message's aggregation cost is numpy's fixed cost per call."""
        if self._batch is not None:  # already batching
            yield
            return
        self._batch = {}
        try:
            yield
        finally:
            batch, self._batch = self._batch, None
            for series, messages in batch.values():
                self._update(series, messages)

    # -- messages -------------------------------------------------------------------------
    def ingest(self, topic: str, payload: bytes, now: float | None = None) -> str:
        """'accepted', 'duplicate', 'rejected:<reason>', 'ignored' or 'status'.  ``now``:
        when the message was received (the journal keeps it, so a replay decides alike).
        Never raises for a message."""
        now = time.time() if now is None else now
        kind = protocol.classify(topic, self.fleet)
        if kind == "ignore":
            return "ignored"
        try:
            if kind == "status":
                return self._status(topic, payload, now)
            return self._report(protocol.decode_report(topic, payload, self.fleet), now)
        except Rejected as rejection:
            return self._reject(topic, payload, rejection, now)
        except Exception as exc:  # defence in depth: no message may stop the ones after it
            log.exception("ingesting a message on %s failed", topic[:256])
            return self._reject(topic, payload, Rejected("internal", type(exc).__name__), now)

    def _report(self, report: ValidReport, now: float) -> str:
        message = report.message
        agent = self._agent(message.agent)
        agent.last_seen = now
        self.status_only.discard(message.agent)
        key = (message.agent, message.channel)
        tracker = self.trackers.get(key)
        if tracker is not None and tracker.seen(message.seq):
            return self.duplicate(report)
        try:
            self._check_time(message, now)
            self._series_for(message, create=False)  # a channel or series past its limit
        except Rejected:
            # Well-formed and from a known agent: settled (never counted, never asked for
            # again) when its channel is known, so that no refused name makes a tracker.
            if message.channel in self.series:
                self.trackers.setdefault(key, SeqTracker()).add(message.seq)
                self.unconfirmed.add(message.agent)
            raise
        self.accept(report, now)
        return "accepted"

    def confirmations(self, now: float) -> dict[str, bytes]:
        """The confirmation (``protocol.Confirm``) of every agent in ``unconfirmed``: per
        channel, the numbers its trackers hold as settled; ``unconfirmed`` is emptied."""
        agents, self.unconfirmed = self.unconfirmed, set()
        channels: dict[str, dict] = {agent: {} for agent in agents}
        for (agent, channel), tracker in self.trackers.items():
            if agent in channels:
                channels[agent][channel] = tracker.settled()
        return {agent: protocol.encode(Confirm(v=protocol.PROTOCOL_VERSION, agent=agent,
                                               t=now, channels=runs))
                for agent, runs in channels.items()}

    def _agent(self, name: str) -> AgentStats:
        """The stats of an allowed agent, made if new and the limit allows."""
        if not self.limits.allows(name):  # also one removed from the registry since
            raise Rejected("unknown_agent", f"{name} is not in the registry")
        stats = self.agents.get(name)
        if stats is not None:
            return stats
        self._within("limit_agents", len(self.agents), self.limits.agents)
        stats = self.agents[name] = AgentStats()
        return stats

    def _within(self, reason: str, used: int, limit: int | None) -> None:
        if limit is not None and used >= limit:
            if reason not in self.limits_reached:
                self.limits_reached.add(reason)
                log.warning("limit reached: %d %s ([limits] %s); further ones are refused "
                            "(reason %s)", limit, LIMIT_KEYS[reason].replace("_", " "),
                            LIMIT_KEYS[reason], reason)
            raise Rejected(reason, f"{LIMIT_KEYS[reason]} limit of {limit} reached")

    def _check_time(self, message: Report, now: float) -> None:
        """Reports dated in the future would replace every recent window of their channel
        (and the real reports would land in windows deleted at once)."""
        future, max_age = self.limits.future_seconds, self.limits.max_age_seconds
        if future is not None and message.t + message.dt > now + future:
            raise Rejected("future", f"t is {message.t + message.dt - now:.0f} s ahead of the "
                                     f"collector's clock")
        if max_age is not None and message.t < now - max_age:
            raise Rejected("stale", f"t is {now - message.t:.0f} s old")

    def duplicate(self, report: ValidReport) -> str:
        """Count a report already counted."""
        self.agents.setdefault(report.message.agent, AgentStats()).duplicates += 1
        self.unconfirmed.add(report.message.agent)
        return "duplicate"

    def accept(self, report: ValidReport, now: float) -> None:
        """Count a new report: its codes go to its series, its seq to the tracker."""
        message = report.message
        series = self._series_for(message, create=True)
        if self._shows(message.channel, series, now):
            self.latest[message.channel] = series.identity
            self.latest_at[message.channel] = now
        values = series.values_in(report.codes)
        if self._batch is None:
            self._update(series, [(message.agent, message.t, report.codes)])
        else:
            self._batch.setdefault(id(series), (series, []))[1].append(
                (message.agent, message.t, report.codes))
        key = (message.agent, message.channel)
        self.trackers.setdefault(key, SeqTracker()).add(message.seq)
        self.unconfirmed.add(message.agent)
        agent = self.agents.setdefault(message.agent, AgentStats())
        agent.messages += 1
        agent.values += values

    def _shows(self, channel: str, series: Series, now: float) -> bool:
        """Whether a report to ``series`` makes it the channel's newest (``latest``, the
        series its entry shows): a new series does (a changed configuration), and so does
        one with more agents than the newest, or any once the newest has been silent for a
        window.  Series that report side by side (wearers with guarantees of their own,
        the strata of the fleet's mean) then leave the one of most wearers shown, rather
        than the last to report."""
        current = self.latest.get(channel)
        if current is None or current == series.identity or series.messages == 0:
            return True
        shown = self.series[channel][current]
        return (len(series.agents) > len(shown.agents)
                or now - self.latest_at.get(channel, -math.inf) > self.window_seconds)

    def _update(self, series: Series, messages: list) -> None:
        opened = series.opened
        series.update_many(messages)
        self.opened += series.opened - opened

    def _series_for(self, message: Report, *, create: bool) -> Series | None:
        """The message's series; a new one is made if ``create``, and refused (``Rejected``)
        if the channel or its series are at their limit.  None: new, not made."""
        identity = series_identity(message.channel, message.kind, message.mechanism,
                                   message.fields, message.strategy, message.unit)
        by_identity = self.series.get(message.channel)
        if by_identity is None:
            self._within("limit_channels", len(self.series), self.limits.channels)
        elif identity in by_identity:
            return by_identity[identity]
        else:
            self._within("limit_series", len(by_identity), self.limits.series_per_channel)
        categories = getattr(message.mechanism, "categories", None)  # frequency oracles'
        if categories is not None:  # each category is a count in every window
            self._within("limit_categories", categories - 1, self.limits.categories)
        if not create:
            return None
        series = self.series.setdefault(message.channel, {})[identity] = new_series(
            channel=message.channel, kind=message.kind, description=message.mechanism,
            fields=message.fields, strategy=message.strategy, unit=message.unit,
            **self._series_settings())
        return series

    def _reject(self, topic: str, payload: bytes, rejection: Rejected, now: float) -> str:
        self.rejects[rejection.reason] += 1
        levels = topic.split("/")
        if len(levels) == 5:
            stats = self.agents.get(levels[3])
            if stats is not None:  # only agents that have sent valid data get an entry
                stats.rejects += 1
        self.dead_letters.append({"t": now, "topic": topic[:256], "reason": rejection.reason,
                                  "detail": rejection.detail[:200],
                                  "payload": payload[:256].decode("utf-8", "replace")})
        return f"rejected:{rejection.reason}"

    def _status(self, topic: str, payload: bytes, now: float) -> str:
        agent_id, message = protocol.decode_status(topic, payload)
        if not self.limits.allows(agent_id):
            raise Rejected("unknown_agent", f"{agent_id} is not in the registry")
        stats = self.agents.get(agent_id)
        if stats is None:
            if message is None:  # clearing the status of an agent never heard of: nothing
                return "status"
            self._within("limit_statuses", len(self.status_only), self.limits.statuses)
            stats = self._agent(agent_id)
            self.status_only.add(agent_id)
        if message is None:  # an empty retained message clears a status: not an error
            stats.online, stats.status = False, StatusSummary()
        else:
            stats.online = message.state == "online"
            stats.status = StatusSummary(state=message.state, budget=message.budget, t=message.t,
                                         guarantees=message.guarantees)
        return "status"

    # -- merging partitions --------------------------------------------------------------------
    def merge(self, other: Ingestor) -> Ingestor:
        """Combine another collector's state (disjoint message sets, e.g. partitions).

        A channel's newest series is the one reported most recently on either
        side; dead letters keep the most recent of both."""
        for channel, by_identity in other.series.items():
            mine = self.series.setdefault(channel, {})
            for identity, series in by_identity.items():
                if identity in mine:
                    mine[identity].merge(series)
                else:
                    mine[identity] = copy.deepcopy(series)
        for channel, identity in other.latest.items():
            at = other.latest_at.get(channel, -math.inf)
            if channel not in self.latest or at > self.latest_at.get(channel, -math.inf):
                self.latest[channel] = identity
                self.latest_at[channel] = at
        for name, stats in other.agents.items():
            mine = self.agents.setdefault(name, AgentStats())
            mine.messages += stats.messages
            mine.values += stats.values
            mine.duplicates += stats.duplicates
            mine.rejects += stats.rejects
            mine.last_seen = max(filter(None, (mine.last_seen, stats.last_seen)), default=None)
            # The newest status wins, whatever the merge order: an older state must not
            # override a status heard since.
            if stats.online is not None and (
                    mine.online is None or stats.status_time >= mine.status_time):
                mine.online, mine.status = stats.online, stats.status
        self.rejects.update(other.rejects)
        if other.dead_letters:
            letters = sorted([*self.dead_letters, *other.dead_letters], key=lambda d: d["t"])
            self.dead_letters.clear()
            self.dead_letters.extend(letters)  # the deque keeps the newest DEAD_LETTERS
        return self

    def copy_aggregates(self, keys: dict[tuple, list] | None = None) -> Ingestor:
        """A detached copy of what the documents show (series, agents, newest series,
        rejects, dead letters; no trackers), taken under the collector's lock and read
        without it.  Of each series it takes what was computed, and the sums of the total
        and windows named in ``keys`` (per series identity, as ``Series.stale`` names
        them: what is to be computed from the copy); None: every sum.  Our own state:
        copied as it is, not checked as a state from elsewhere is (``from_state``)."""
        twin = Ingestor.from_settings(self.fleet, self.settings(), self.limits,
                                      recording=self.recording)
        twin.series = {
            channel: {identity: series.detach(None if keys is None else keys.get(identity, []))
                      for identity, series in by_identity.items()}
            for channel, by_identity in self.series.items()}
        twin.latest, twin.latest_at = dict(self.latest), dict(self.latest_at)
        twin.agents = {name: dataclasses.replace(stats) for name, stats in self.agents.items()}
        twin.rejects.update(self.rejects)
        twin.dead_letters.extend(self.dead_letters)
        twin.status_only = set(self.status_only)
        return twin

    def keep(self, computed: Ingestor, done: dict[tuple, list]) -> None:
        """Take what ``computed`` (a detached copy) computed (``done``: the keys per series
        identity), where the sums have not counted more since."""
        for identity, keys in done.items():
            series = self.series.get(identity[0], {}).get(identity)
            if series is not None:
                series.keep(computed.series[identity[0]][identity], keys)

    def keep_results(self, results) -> None:
        """Take estimates computed elsewhere (``(identity, key, result)``, a worker
        process's ``Series.estimated``), where the sums still count what they are of."""
        for identity, key, result in results:
            series = self.series.get(identity[0], {}).get(identity)
            if series is not None:
                series.keep_result(key, result)

    def adopt(self, earlier: Ingestor) -> None:
        """Take what ``earlier`` computed for the same series (the merge view's previous
        merge), where the sums count the same."""
        for channel, by_identity in self.series.items():
            for identity, series in by_identity.items():
                theirs = earlier.series.get(channel, {}).get(identity)
                if theirs is not None:
                    series.adopt(theirs)

    # -- saved and exchanged state (collector.storage.states) --------------------------------
    def to_state(self, *, computed: bool = True, encoded: bool = False,
                 series_mark: msgspec.Raw | None = None,
                 pending_mark: msgspec.Raw | None = None) -> IngestorState:
        """Everything the merge view (and a checkpoint) needs of the aggregates: series,
        per-agent counters, newest series, rejects and dead letters (no trackers: those are
        the checkpoint's).  ``computed``: with what the sums gave (``Series.summary`` and
        ``points``: a checkpoint's, so that a restart computes nothing again; a partition's
        state leaves them out, since the merge view's sums are of every partition).

        ``encoded``: each series' state as its JSON (``msgspec.Raw``), built and encoded one
        series at a time, for a state that is only encoded: it encodes to the same bytes,
        and the typed tree of the whole state, about six times its JSON (a list of ints
        per histogram), never exists at once (at the default limits: ~440 MB beside
        ~70 MB of JSON, measured).

        ``series_mark`` / ``pending_mark``: ``series`` / ``pending`` holds this mark alone,
        and ``encoded_series`` / ``encoded_pending`` give what it stands for, a piece at a
        time (``collector.storage.checkpoint``: written as it is encoded, so no copy of the
        whole state ever exists)."""
        series, index = [], self._series_index()
        if series_mark is None:
            for by_identity in self.series.values():
                for one in by_identity.values():
                    state = one.to_state(computed=computed)
                    series.append(msgspec.Raw(encode(state)) if encoded else state)
        else:
            series = [series_mark]
        if pending_mark is None:
            pending = [self._pending_batch(flush, index) for flush in sorted(self.pending)]
        else:
            pending = [pending_mark]
        return IngestorState(
            fleet=self.fleet, settings=self.settings(), rejects=dict(self.rejects),
            agents={name: AgentState(a.messages, a.values, a.duplicates, a.rejects,
                                     a.last_seen, a.online, a.status)
                    for name, a in self.agents.items()},
            series=series,
            latest={channel: (index[identity], self.latest_at.get(channel))
                    for channel, identity in self.latest.items()},
            dead_letters=[DeadLetter(**letter) for letter in self.dead_letters],
            pending=pending, flushes=self.flushes, source=self.source)

    def _series_index(self) -> dict[tuple, int]:
        """Each series' place in the state's ``series`` (by identity)."""
        return {identity: i for i, identity in enumerate(
            identity for by_identity in self.series.values() for identity in by_identity)}

    def _pending_batch(self, flush: int, index: dict[tuple, int]) -> PendingBatch:
        """Batch ``flush`` of the closed windows, as the state names them: a closed window's
        sums are the collector store's (``closed``), saved with the checkpoint that holds
        this state (``unsaved``)."""
        return PendingBatch(flush, [
            PendingWindow(index[window.series.identity], window.span, window.start,
                          window.delta, IN_THE_STORE, window.count)
            for window in self.pending[flush]])

    def encoded_series(self, *, computed: bool = True) -> Iterator[bytes]:
        """Each series' state as JSON, in ``to_state``'s order, encoded as it is taken."""
        for by_identity in self.series.values():
            for one in by_identity.values():
                yield encode(one.to_state(computed=computed))

    def encoded_pending(self) -> Iterator[bytes]:
        """Each pending batch as JSON, in ``to_state``'s order, encoded as it is taken (at
        the default limits a burst leaves a quarter of a million closed windows pending
        for as long as the recorder takes: 9 MB of JSON, and 20 MB as typed values)."""
        index = self._series_index()
        for flush in sorted(self.pending):
            yield encode(self._pending_batch(flush, index))

    @classmethod
    def from_state(cls, state: IngestorState | dict, *, recording: bool = False) -> Ingestor:
        """An ingestor from ``to_state()`` (typed, or as plain JSON values, checked here),
        or ``StateError`` saying what is wrong.

        Besides types and bounds it checks what no sum of reports could break: the
        messages and values of all series and of all agents agree."""
        if not isinstance(state, IngestorState):
            try:
                state = msgspec.convert(state, IngestorState)
            except msgspec.ValidationError as exc:
                raise StateError(f"state: {exc}") from None
        settings = state.settings
        ingestor = cls.from_settings(state.fleet, settings, recording=recording)
        ingestor.rejects.update(state.rejects)
        for name, entry in state.agents.items():
            ingestor.agents[name] = AgentStats(entry.messages, entry.values, entry.duplicates,
                                               entry.rejects, entry.last_seen, entry.online,
                                               entry.status)
        loaded = []
        for i, series_state in enumerate(state.series):
            series = Series.from_state(series_state, where=f"series[{i}]",
                                       **ingestor._series_settings())
            by_identity = ingestor.series.setdefault(series.channel, {})
            if series.identity in by_identity:
                raise StateError(f"series[{i}]: the same series twice")
            by_identity[series.identity] = series
            loaded.append(series)
        if set(state.latest) != set(ingestor.series):
            raise StateError("latest: expected one entry per channel")
        for channel, (i, at) in state.latest.items():
            if not i < len(loaded) or loaded[i].channel != channel:
                raise StateError(f"latest.{channel}: not a series of the channel")
            ingestor.latest[channel] = loaded[i].identity
            if at is not None:
                ingestor.latest_at[channel] = at
        ingestor.dead_letters.extend(msgspec.structs.asdict(letter)
                                     for letter in state.dead_letters)
        ingestor.status_only = {name for name, agent in ingestor.agents.items()
                                if agent.last_seen is None}
        ingestor._check_totals(loaded)
        ingestor._load_pending(state, loaded)
        return ingestor

    def _load_pending(self, state: IngestorState, loaded: list[Series]) -> None:
        if state.pending and not self.recording:
            raise StateError("pending: closed windows for a results store, in a state read "
                             "without one")
        self.flushes, self.source = state.flushes, state.source
        for i, batch in enumerate(state.pending):
            where = f"pending[{i}]"
            if not 0 < batch.flush <= state.flushes or batch.flush in self.pending:
                raise StateError(f"{where}.flush: must be a new number up to flushes")
            windows = []
            for j, window in enumerate(batch.windows):
                if not window.series < len(loaded):
                    raise StateError(f"{where}.windows[{j}].series: not a series of the state")
                series = loaded[window.series]
                if bytes(window.blocks) == bytes(IN_THE_STORE):  # checked by ``check_saved``
                    if window.count is None:
                        raise StateError(f"{where}.windows[{j}].count: missing")
                    sums, count = None, window.count
                else:  # a checkpoint of a collector before the ``closed`` table
                    sums = bytes(window.blocks)  # a copy: not a view of the whole checkpoint
                    blocks = series.blocks_from(sums, f"{where}.windows[{j}].blocks")  # checked
                    count = series._count(blocks)
                windows.append(ClosedWindow(series, window.span, window.start, sums, count,
                                            window.delta))
            self.pending[batch.flush] = windows

    # -- closed windows' sums in the collector store ------------------------------------------
    def unsaved(self) -> list[tuple[int, list[ClosedWindow]]]:
        """The pending batches whose sums the collector store does not hold yet, oldest first:
        a checkpoint saves them (``seq``: a window's place in its batch) with the state,
        then calls ``saved``."""
        return [(batch, windows) for batch, windows in sorted(self.pending.items())
                if windows and windows[0].sums is not None]

    def saved(self, batches) -> None:
        """The collector store holds these batches' sums: forget them here (the recorder
        reads them from the store)."""
        for batch in batches:
            for window in self.pending.get(batch, ()):
                window.sums = None

    def check_saved(self, batch: int, rows) -> None:
        """``StateError`` unless ``rows`` ((seq, sums) as the collector store holds them)
        are exactly the sums of the windows of pending ``batch`` the state says it holds."""
        windows = self.pending.get(batch, [])
        expected = [seq for seq, window in enumerate(windows) if window.sums is None]
        found = 0
        for seq, sums in rows:
            where = f"closed batch {batch} window {seq}"
            if seq >= len(windows) or windows[seq].sums is not None:
                raise StateError(f"{where}: not a window the checkpoint holds")
            windows[seq].check(sums, where)
            found += 1
        if found != len(expected):
            raise StateError(f"closed batch {batch}: {len(expected) - found} window(s) missing "
                             "from the store")

    def _check_totals(self, series: list[Series]) -> None:
        totals = self.counters
        checks = {"messages": sum(s.messages for s in series),
                  "values": sum(s.count() for s in series)}
        for what, total in checks.items():
            if total != totals[what]:
                raise StateError(f"agents: the series' {what} add up to {total}, the "
                                 f"agents' to {totals[what]}")
