"""Exactly-once counting across shards (collector.claims.ClaimBook), simulated in process.

Three shards get the report stream round-robin, as Mosquitto's shared
subscription does (a dead shard's share waits in its session).  Copies of
reports (re-sends, replays) land on any shard.  Claims travel between the
shards with random delays, retained for shards that restart, and shards
crash: a restart loads the last checkpoint and replays the journal since.
At the end the merged shards must equal one collector that saw everything.
"""

from __future__ import annotations

import collections

import numpy as np
import orjson
import pytest

from collector import checkpoint, dedup
from collector.claims import ClaimBook
from collector.ingest import Ingestor
from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM
from edge_agent.protocol import decode_report as parse_report
from edge_agent.protocol.states import MAX_SEQS_PER_KEY

FLEET = "sim"
TIMEOUT = 1.0
STEP = 0.05
LINEAR = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
CIRCULAR = CircularOGPM(epsilon=1.0)


def report_stream(rng, *, agents=5, messages=60, copies=0.2):
    """(topic, payload) in publication order: every report once, plus copies of
    some of them re-published later (soon, as a re-send, or much later, a replay)."""
    originals = []
    for seq in range(messages):
        for a in range(agents):
            for channel, mechanism, kind in (("x", LINEAR, "linear"),
                                             ("yaw", CIRCULAR, "circular")):
                codes = rng.integers(0, mechanism.n_cells, rng.integers(1, 20)).tolist()
                payload = protocol.report(agent=f"a{a}", channel=channel, kind=kind, seq=seq,
                                          t=1000.0 + seq, dt=1.0,
                                          mechanism=mechanism.describe(), codes=codes)
                originals.append((protocol.data_topic(FLEET, f"a{a}", channel), payload))
    stream = list(originals)
    for message in originals:
        if rng.random() < copies:
            later = len(stream) if rng.random() < 0.3 else rng.integers(0, 40)
            stream.insert(min(len(stream), stream.index(message) + 1 + int(later)), message)
    return stream


class Reference(Ingestor):
    """One collector that saw everything; the copies only the shards see (redispatched by
    the broker) are duplicates there too."""

    def __init__(self):
        super().__init__(fleet=FLEET, bins=20, window_seconds=10, keep_windows=4)
        self.redispatched = 0

    @property
    def counters(self) -> collections.Counter:
        totals = super().counters
        totals["duplicates"] += self.redispatched
        totals["redispatched"] = self.redispatched
        return totals


class Shard:
    def __init__(self, name, clock):
        self.name, self.clock = name, clock
        self.ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=10, keep_windows=4)
        self.ingestor.claims = ClaimBook(name, "g", peer_timeout=TIMEOUT)
        self.ingestor.claims.configure(name, "g", peer_timeout=TIMEOUT, clock=clock)
        self.saved, self.journal = checkpoint.dump(self.ingestor), []
        self.alive = True
        self.reports = collections.deque()  # the broker's queue for this shard's session
        self.claims = collections.deque()  # peers' claims messages on their way to us

    def step(self, rng, now):
        for _ in range(rng.integers(0, 4)):  # the network child journals, we ingest
            if self.reports:
                topic, payload = self.reports.popleft()
                self.journal.append((topic, payload, now))
                self.ingestor.ingest(topic, payload, now)
        for _ in range(rng.integers(0, len(self.claims) + 1)):  # in order, some late
            name, payload, retained = self.claims.popleft()
            assert self.ingestor.claims.receive(name, payload, self.ingestor.trackers,
                                                retained=retained) == "accepted"
        self.ingestor.settle()

    def checkpoint(self):
        claims = self.ingestor.claims
        written = claims.snapshot()
        self.saved, self.journal = checkpoint.dump(self.ingestor), []
        claims.promote(written)

    def restart(self, retained):
        """Last checkpoint plus the journal replayed; the peers' retained claims arrive."""
        ingestor, held = checkpoint.load(self.saved)
        ingestor.claims = ClaimBook(self.name, "g", peer_timeout=TIMEOUT, held=held)
        ingestor.claims.configure(self.name, "g", peer_timeout=TIMEOUT, clock=self.clock)
        for topic, payload, received in self.journal:
            ingestor.ingest(topic, payload, received)
        self.ingestor, self.alive = ingestor, True
        self.claims = collections.deque((name, payload, True)
                                        for name, payload in retained.items()
                                        if name != self.name)


def simulate(seed, *, crash=None, claims=True, shards=3, redispatch=False, copies=0.2):
    """crash: (shard index, step it dies, steps it stays dead) or None.

    redispatch: when the shard dies, the broker gives what it had not acknowledged
    (its last journaled reports, which it still has) and its queue to the others,
    as EMQX may (MQTT 5 allows it); Mosquitto keeps both for the dead session."""
    rng = np.random.default_rng(seed)
    stream = report_stream(rng, copies=copies)
    single = Reference()
    for topic, payload in stream:
        single.ingest(topic, payload, 0.0)
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    members = [Shard(f"s{i}", clock) for i in range(shards)]
    if not claims:
        for shard in members:
            shard.ingestor.claims = None
    retained: dict[str, bytes] = {}
    position, step = 0, 0
    while True:
        step += 1
        now[0] += STEP
        for _ in range(rng.integers(0, 6)):  # round robin over all sessions, dead or not
            if position < len(stream):
                members[position % shards].reports.append(stream[position])
                position += 1
        if crash is not None:
            index, at, down = crash
            if step == at:
                dead = members[index]
                dead.alive = False
                if redispatch:
                    unacked = [(topic, payload) for topic, payload, _ in dead.journal[-10:]]
                    single.redispatched += len(unacked)
                    others = [m for m in members if m is not dead]
                    for i, message in enumerate(unacked + list(dead.reports)):
                        others[i % len(others)].reports.append(message)
                    dead.reports.clear()
            elif step == at + down:
                members[index].restart(retained)
        for shard in members:
            if not shard.alive:
                continue
            shard.step(rng, now[0])
            if claims and rng.random() < 0.3:
                payload = shard.ingestor.claims.message(now[0], shard.ingestor.trackers)
                retained[shard.name] = payload
                for other in members:
                    if other is not shard and other.alive:
                        other.claims.append((shard.name, payload, False))
            if claims and rng.random() < 0.05:
                shard.checkpoint()
        done = position == len(stream) and all(
            s.alive and not s.reports and (not claims or not s.ingestor.claims.held)
            for s in members)
        if done or step > 20_000:
            break
    merged = Ingestor(fleet=FLEET, bins=20, window_seconds=10, keep_windows=4)
    for shard in members:
        merged.merge(shard.ingestor)
    return single, merged, step


def assert_same(single, merged):
    assert merged.counters["values"] == single.counters["values"]
    assert merged.counters["messages"] == single.counters["messages"]
    assert merged.counters["duplicates"] == single.counters["duplicates"]
    for channel, by_identity in single.series.items():
        assert merged.series[channel].keys() == by_identity.keys()
        for identity, series in by_identity.items():
            assert merged.series[channel][identity] == series


@pytest.mark.parametrize("seed", range(6))
def test_shards_count_each_report_once(seed):
    single, merged, steps = simulate(seed)
    assert steps < 20_000, "the shards never settled"
    assert single.counters["duplicates"] > 20  # the stream does contain copies
    assert_same(single, merged)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("down_steps", [5, 200])  # back before / long after peer_timeout
def test_a_shard_crashing_and_restarting_loses_and_doubles_nothing(seed, down_steps):
    single, merged, steps = simulate(seed, crash=(seed % 3, 150, down_steps))
    assert steps < 20_000, "the shards never settled"
    assert_same(single, merged)


@pytest.mark.parametrize("seed", range(4))
def test_unacknowledged_reports_redispatched_to_other_shards_count_once(seed):
    single, merged, steps = simulate(seed, crash=(seed % 3, 150, 200), redispatch=True)
    assert steps < 20_000, "the shards never settled"
    assert single.counters["redispatched"] > 0
    assert_same(single, merged)  # the redispatched copies are all duplicates


@pytest.mark.parametrize("seed", range(4))
def test_an_outage_longer_than_the_trackers_bound_loses_nothing(seed, monkeypatch):
    """While a shard is down its share is a gap in its peers' trackers.  A tracker
    bounds its memory by giving up on old gaps; that give-up is local and must
    never reach the restarted shard, or it would drop the reports its session
    queued (they were never counted anywhere).  No copies here: a copy older
    than a tracker's oldest gap may be counted twice, by design (SeqTracker)."""
    monkeypatch.setattr(dedup, "MAX_RUNS", 4)
    single, merged, steps = simulate(seed, crash=(seed % 3, 60, 600), copies=0)
    assert steps < 20_000, "the shards never settled"
    assert_same(single, merged)


def test_without_claims_copies_on_other_shards_are_counted_twice():
    """Why the claims exist: per-shard dedup alone over-counts copies."""
    single, merged, _ = simulate(1, claims=False)
    assert merged.counters["messages"] > single.counters["messages"]
    assert merged.counters["duplicates"] < single.counters["duplicates"]


def _claims(shard="s2", group="g", **changes):
    message = orjson.loads(ClaimBook(shard, group).message(1.0, {}))
    message.update(changes)
    return orjson.dumps(message)


def test_claims_survive_a_restore_and_refuse_hostile_messages():
    book = ClaimBook("s1", "g")
    report = parse_report(*report_stream(np.random.default_rng(0))[0], FLEET)
    book.hold(report, 5.0)
    book.message(1.0, {})
    ingestor = Ingestor(fleet=FLEET)
    ingestor.claims = book
    _, held = checkpoint.load(checkpoint.dump(ingestor))  # a checkpoint and a restart
    again = ClaimBook("s1", "g", held=held)
    # Held reports survive; the incarnation is new, so their claims must be made again.
    assert again.is_held(report) and again.held[(report.agent, report.channel,
                                                 report.seq)].claimed_in is None
    assert again.incarnation != book.incarnation and again.version == 0 and again.peers == {}
    hostile = [b"{", b"[]", b'{"v":1}', b"x" * (17 << 20),
               _claims(v=1),  # the old format with durable floors
               _claims(keys={"a0/x": [[1], [2], [3], [4]]}),
               _claims(keys={"a0/x": [[-1], [], []]}),
               _claims(keys={"a0/x": [[True], [], []]}),
               _claims(keys={"a 0/x": [[1], [], []]}),
               _claims(keys={"a0/x": [list(range(MAX_SEQS_PER_KEY + 1)), [], []]}),
               _claims(seen={"s1": 3}),
               _claims(version=-1),
               _claims(durable=5),  # durable must be older than the message
               _claims(t="now")]
    for payload in hostile:
        assert book.receive("s2", payload, {}) == "rejected"
    assert book.peers == {}  # nothing of a refused message is kept
    good = _claims()
    assert book.receive("s2", good, {}) == "accepted"
    assert book.receive("s3", good, {}) == "rejected"  # s2's message on s3's topic
    assert book.receive("s2", _claims(group="h"), {}) == "other group"
    assert sum(book.rejected.values()) == len(hostile) + 1


def test_a_retained_claims_message_is_not_a_live_peer():
    """On (re)subscribing, every peer's last claims arrive retained, also those of
    shards long gone: they must not count as live, or settling would wait for them."""
    clock = [100.0]
    book = ClaimBook("s1", "g")
    book.configure("s1", "g", peer_timeout=1.0, clock=lambda: clock[0])
    book.receive("gone", _claims("gone"), {}, retained=True)
    assert book.peers_json()["peers"]["gone"]["live"] is False
    clock[0] += 2  # past the grace period
    report = parse_report(*report_stream(np.random.default_rng(0))[0], FLEET)
    book.hold(report, 0.0)
    book.message(clock[0], {})
    accepted, dropped = book.settle({})
    assert [r for r, _ in accepted] == [report] and not dropped
    book.receive("live", _claims("live"), {})  # a live message
    assert book.peers_json()["peers"]["live"]["live"] is True


def test_a_peer_that_restarts_with_an_older_clock_is_heard():
    """Versions are per incarnation, not wall-clock: a restarted peer's version 1 is
    news, while within one incarnation an older version is stale."""
    book = ClaimBook("s1", "g")
    peer = ClaimBook("s2", "g")
    for _ in range(5):
        payload = peer.message(1.0, {})
    assert book.receive("s2", payload, {}) == "accepted"
    assert book.receive("s2", orjson.dumps({**orjson.loads(payload), "version": 2}), {}) \
        == "stale"
    restarted = ClaimBook("s2", "g")
    assert book.receive("s2", restarted.message(0.5, {}), {}) == "accepted"
    assert book.peers["s2"].incarnation == restarted.incarnation


def test_leaving_shard_mode_settles_held_reports_against_the_tracker():
    """A shard restarted as a single collector applies what it held, except copies
    of reports it had already counted."""
    from collector.checkpoint import attach_claims
    from collector.config import parse_collector_config

    ingestor = Ingestor(fleet=FLEET, bins=20, window_seconds=10, keep_windows=4)
    ingestor.claims = ClaimBook("s1", "g")
    first, second = report_stream(np.random.default_rng(0), copies=0)[:2]
    ingestor.claims.hold(parse_report(*first, FLEET), 1.0)
    ingestor.claims.hold(parse_report(*second, FLEET), 1.0)
    report = parse_report(*first, FLEET)
    ingestor.trackers.setdefault((report.agent, report.channel), dedup.SeqTracker()).add(
        report.seq)  # counted already: the held one is a copy
    held = [(entry.report, entry.received) for entry in ingestor.claims.held.values()]
    attach_claims(parse_collector_config({"fleet": FLEET}), ingestor, held)
    assert ingestor.claims is None
    assert ingestor.counters["messages"] == 1 and ingestor.counters["duplicates"] == 1
