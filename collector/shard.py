"""What makes a collector one shard of several (docs/SCALE_OUT.md).

With ``[broker] shared_group`` set, the broker gives each report to one shard.
``ShardRole`` adds to a collector what that takes: the claims exchange with
its peers (``collector.claims``: a copy delivered to another shard is still
counted once), its partial state published for the merge view, optionally the
merged view of all shards served locally, and a retiring shard's last settle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edge_agent import protocol
from edge_agent.protocol.states import encode_shard_state

from .config import CollectorConfig
from .ingest import Ingestor
from .merge import MergeView
from .publisher import CollectorClient, Handler

log = logging.getLogger(__name__)


class ShardRole:
    def __init__(self, config: CollectorConfig, ingestor: Ingestor, lock: threading.RLock, *,
                 clock: Callable[[], float] = time.time, started: float | None = None):
        """``ingestor``: the shard's own (with its claim book); ``lock``: the one that
        guards it; ``started``: when this incarnation started (replayed reports are held
        again, and the state waits until they are settled)."""
        self.config, self.ingestor, self.lock, self.clock = config, ingestor, lock, clock
        self.name = config.shard_name
        self.group = config.broker.shared_group
        self.client: CollectorClient | None = None  # set by the service before start
        self.claims_arrived = threading.Event()
        self.last_report: float | None = None  # when the newest report was journaled
        self._started = clock() if started is None else started
        self._replay_settled = False
        self.merge_view = None
        if config.shard.serve_merged:
            self.merge_view = MergeView(config.fleet, config.aggregate_settings,
                                        group=self.group, exclude=self.name, clock=clock)

    # -- what the shard follows --
    def follow(self) -> dict[str, Handler]:
        topics = {protocol.shard_topic(self.config.fleet, "+", "claims"): self._on_claims}
        if self.merge_view is not None:
            topics[protocol.shard_topic(self.config.fleet, "+", "state")] = \
                lambda client, userdata, m: self.merge_view.update(m.topic, m.payload)
        return topics

    def on_subscribed(self, client, userdata, mid, reason_codes, properties=None) -> None:
        # Peers are heard from only now: a replay or a slow connect must not have used up
        # the wait for them, or held reports would be applied unanswered.
        with self.lock:
            self.ingestor.claims.restart_grace()

    def _on_claims(self, client, userdata, message) -> None:
        name = protocol.shard_of(message.topic, self.config.fleet, "claims")
        if name is None:
            return
        with self.lock:
            self.ingestor.claims.receive(name, message.payload, self.ingestor.trackers,
                                         retained=bool(message.retain))
        self.claims_arrived.set()

    # -- what it publishes --
    def publish_claims(self) -> None:
        with self.lock:
            payload = self.ingestor.claims.message(self.clock(), self.ingestor.trackers)
        self.client.publish(protocol.shard_topic(self.config.fleet, self.name, "claims"),
                            payload)

    def publish_state(self):
        with self.lock:  # encoding (11-14 ms at 326 kB) need not block ingest
            state, now = self.ingestor.to_state(), self.clock()
        payload = encode_shard_state(state, shard=self.name, group=self.group,
                                     every=self.config.shard.state_seconds, now=now)
        return self.client.publish(protocol.shard_topic(self.config.fleet, self.name, "state"),
                                   payload)

    def state_ready(self) -> bool:
        """After a restart the replayed journal is held again: publishing before it is
        applied would show the merge view fewer values than our previous state."""
        if self._replay_settled:
            return True
        with self.lock:
            self._replay_settled = not self.ingestor.claims.held_since_before(self._started)
        return self._replay_settled

    def settle(self) -> None:
        self.claims_arrived.clear()
        with self.lock, self.ingestor.batch():
            self.ingestor.settle()

    def apply_held(self) -> None:
        """A retiring shard's last stop: settle what it holds while the peers still answer
        (its session ends, and a report it kept holding would never be counted)."""
        claims = self.ingestor.claims
        deadline = time.monotonic() + 4 * self.config.shard.peer_timeout_seconds
        while claims.held and time.monotonic() < deadline and self.client.connected:
            self.publish_claims()
            self.claims_arrived.wait(self.config.shard.claims_seconds)
            self.settle()
        if claims.held:
            log.error("retiring shard %s stops with %d report(s) still held; restart it to "
                      "settle them", self.name, len(claims.held))

    def last_word(self) -> None:
        """At a clean stop: the merge view's last word from us."""
        if not self.client.connected:
            return
        try:
            self.publish_claims()
            if self.state_ready():
                self.publish_state().wait_for_publish(5)
        except (RuntimeError, ValueError) as exc:
            log.warning("could not publish the final shard state: %s", exc)

    # -- the API --
    def merged(self) -> Ingestor:
        """All shards, this one live (``serve_merged``)."""
        return self.merge_view.ingestor(local=self.ingestor)

    def json(self) -> dict:
        """``shard`` (and, serving the merged view, ``shards``) of ``/api/channels``."""
        with self.lock:
            claims = self.ingestor.claims.peers_json()
            counters = dict(self.ingestor.counters)
        document = {"shard": {"name": self.name, "group": self.group,
                              "serve_merged": self.merge_view is not None,
                              "retiring": self.config.shard.retiring,
                              "last_report": self.last_report, **claims}}
        if self.merge_view is not None:
            now = self.clock()
            own = {self.name: {"t": now, "age": 0.0, "received": now, "stale": False,
                               "group": self.group, **counters, "bytes": None, "error": None}}
            document.update(self.merge_view.shards_json(local=own))
        return document
