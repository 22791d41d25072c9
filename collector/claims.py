"""Exactly-once counting across collector shards: the claims exchange (docs/SCALE_OUT.md).

The broker gives each message to one shard, but a *copy* of a report (an agent
re-sending its spool after a restart, a replay) is a new message and may go to
another shard, whose own sequence tracker has never seen it.  So every shard
holds each new report, publishes a claim on its (agent, channel, seq) on
``ldp/v1/<fleet>/_shards/<shard>/claims`` (typed: ``protocol.states.Claims``),
and applies it only once every live peer has answered with a claims message
that saw that claim.  Two shards holding the same report keep it on the one
whose name sorts first; a report another shard has already applied is dropped
as a duplicate.
"""

from __future__ import annotations

import collections
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_agent.protocol import Rejected, ValidReport
from edge_agent.protocol.states import (
    CLAIMS_VERSION,
    Claims,
    HeldReport,
    decode_claims,
    encode_claims,
    parse_key,
)

from .dedup import SeqTracker

log = logging.getLogger(__name__)

PEER_TIMEOUT = 5.0  # the default of [shard] peer_timeout_seconds
REPEATS = 2  # each applied number goes out in this many claims messages


@dataclass
class Held:
    report: ValidReport
    received: float  # when the shard journaled it (wall clock)
    claimed_in: int | None = None  # the version of our first claims message naming it


@dataclass
class Peer:
    incarnation: str  # new at every start of the peer: its versions count from 1 again
    version: int
    seen: dict[str, tuple[str, int]]  # shard -> (incarnation, version) of its claims read
    pending: dict[tuple[str, str], set[int]]  # held there
    have: dict[tuple[str, str], set[int]]  # of the numbers its peers hold: counted there
    durable: int  # everything it announced as applied up to this version is checkpointed
    heard: float  # our monotonic clock when it last spoke live (-inf: only retained so far)
    t: float  # the peer's wall clock when it published
    # Announced as applied and not yet durable; collected over its messages.
    applied: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    announced: collections.deque = field(default_factory=collections.deque)  # (version, key, seq)


class ClaimBook:
    """One shard's side of the claim exchange (module docstring, docs/SCALE_OUT.md).

    A claims message says, per (agent, channel):

    * ``held``: the sequence numbers held here, waiting for the peers' answers;
    * ``have``: of the numbers the peers hold, those this shard has counted
      (its tracker's ``counted``: never a give-up);
    * ``applied``: newly applied here, each in ``REPEATS`` messages.

    and once, ``durable``: the newest version whose ``applied`` numbers are
    all in a checkpoint written to disk.  Peers collect a shard's applied
    numbers and refrain from counting them.  Once durable they record them
    in their trackers, so that a copy arriving while this shard is dead is
    still dropped.  Before that they must not: a crash undoes what was not
    checkpointed (the journal replay holds it again), and a peer that had
    recorded it would make the restarted shard drop it.

    No list grows with history: a list of everything past a gap would grow for
    as long as a dead peer's share is missing.

    A shard applies a held report once every live peer has answered a claims
    message naming it (its ``seen`` shows our version) and none has it;
    two holders keep it on the one whose name sorts first.  No floor is ever
    sent: a tracker's give-up is local, and a peer told to skip a gap would
    drop the reports its broker session still holds for it.

    Its held reports are checkpointed with the aggregates (``held_reports``);
    the rest is per incarnation: the peers' claims come again.
    """

    def __init__(self, shard: str, group: str, *, peer_timeout: float = PEER_TIMEOUT,
                 held: list[tuple[ValidReport, float]] = ()):
        self.held: dict[tuple[str, str, int], Held] = {
            (report.agent, report.channel, report.seq): Held(report, received)
            for report, received in held}
        self.configure(shard, group, peer_timeout=peer_timeout)

    def configure(self, shard: str, group: str, *, peer_timeout: float,
                  clock: Callable[[], float] = time.monotonic) -> None:
        """Start an incarnation: after construction and after a restore."""
        self.shard, self.group = shard, group
        self.peer_timeout = peer_timeout
        self.clock = clock
        # Versions count from 1 in each incarnation: no wall clock, which can step back.
        self.incarnation = secrets.token_hex(8)
        self.version = 0
        self.durable = 0
        self.peers: dict[str, Peer] = {}
        self.rejected = collections.Counter()
        # (first version, key, seq) to announce as applied; what a restore brings back is
        # in the checkpoint already, so it is never announced (peers need not wait on it).
        self.news: collections.deque = collections.deque()
        for held in self.held.values():  # claims of an earlier incarnation were never answered
            held.claimed_in = None
        self.restart_grace()

    def restart_grace(self) -> None:
        """Apply nothing until live peers had time to speak (call when subscribed)."""
        self.grace_until = self.clock() + self.peer_timeout

    def held_reports(self) -> list[HeldReport]:
        """What a checkpoint keeps of the claim book."""
        return [HeldReport(held.report.message, held.received) for held in self.held.values()]

    # -- the ingestor's side --
    def is_held(self, report: ValidReport) -> bool:
        return (report.agent, report.channel, report.seq) in self.held

    def hold(self, report: ValidReport, received: float) -> None:
        self.held[(report.agent, report.channel, report.seq)] = Held(report, received)

    def accepted(self, report: ValidReport) -> None:
        self.news.append((self.version + 1, (report.agent, report.channel), report.seq))

    def _answered(self, peer: Peer, version: int) -> bool:
        incarnation, seen = peer.seen.get(self.shard, ("", -1))
        return incarnation == self.incarnation and seen >= version

    def settle(self, trackers: dict[tuple[str, str], SeqTracker],
               now: float | None = None
               ) -> tuple[list[tuple[ValidReport, float]], list[ValidReport]]:
        """Held reports to apply (with their arrival time) and to drop."""
        now = self.clock() if now is None else now
        live = [peer for peer in self.peers.values() if now - peer.heard <= self.peer_timeout]
        ready = now >= self.grace_until
        accept, drop = [], []
        for key3, held in list(self.held.items()):
            agent, channel, seq = key3
            key = (agent, channel)
            tracker = trackers.get(key)
            if (tracker is not None and tracker.seen(seq)) or any(
                    seq in peer.have.get(key, ()) or seq in peer.applied.get(key, ())
                    or (name < self.shard and seq in peer.pending.get(key, ()))
                    for name, peer in self.peers.items()):
                drop.append(held.report)  # counted elsewhere, or held by a shard first in order
            elif ready and held.claimed_in is not None and all(
                    self._answered(peer, held.claimed_in) for peer in live):
                accept.append((held.report, held.received))
            else:
                continue
            del self.held[key3]
        return accept, drop

    def held_since_before(self, t: float) -> bool:
        """Whether something received before ``t`` (e.g. replayed at a restart) is held."""
        return any(held.received < t for held in self.held.values())

    # -- checkpoints --
    def snapshot(self) -> int:
        """Taken with the checkpoint, under the same lock; ``promote`` it once written.

        Whatever our messages up to now announced as applied was applied before
        this moment, so it is in the checkpoint."""
        return self.version

    def promote(self, version: int) -> None:
        """The checkpoint taken at ``snapshot() == version`` is on disk."""
        self.durable = max(self.durable, version)

    # -- messages --
    def message(self, now: float, trackers: dict[tuple[str, str], SeqTracker]) -> bytes:
        """Our claims: [held, have, applied] per "agent/channel" (class docstring)."""
        self.version += 1
        keys: dict[tuple[str, str], tuple[list[int], ...]] = collections.defaultdict(
            lambda: ([], [], []))
        for (agent, channel, seq), held in self.held.items():
            if held.claimed_in is None:
                held.claimed_in = self.version
            keys[agent, channel][0].append(seq)
        for peer in self.peers.values():
            for key, seqs in peer.pending.items():
                tracker = trackers.get(key)
                if tracker is not None:
                    keys[key][1].extend(seq for seq in seqs if tracker.counted(seq))
        while self.news and self.news[0][0] <= self.version - REPEATS:
            self.news.popleft()
        for _, key, seq in self.news:
            keys[key][2].append(seq)
        return encode_claims(Claims(
            v=CLAIMS_VERSION, type="claims", shard=self.shard, group=self.group, t=now,
            incarnation=self.incarnation, version=self.version, durable=self.durable,
            seen={name: (peer.incarnation, peer.version) for name, peer in self.peers.items()},
            keys={f"{agent}/{channel}": tuple(sorted(set(part)) for part in parts)
                  for (agent, channel), parts in keys.items() if any(parts)}))

    def receive(self, name: str, payload: bytes, trackers: dict[tuple[str, str], SeqTracker],
                *, retained: bool = False) -> str:
        """A peer's claims: remember them, and record what it checkpointed as seen.

        A retained message (delivered when we subscribe) tells what the peer last
        said, not that it is alive: only a live message makes it live."""
        if name == self.shard:
            return "own"
        try:
            parsed = self._parse(name, payload)
        except Rejected as exc:
            self.rejected[exc.reason] += 1
            log.warning("claims of shard %s rejected: %s: %s", name, exc.reason, exc.detail)
            return "rejected"
        if parsed is None:
            return "other group"
        peer, applied = parsed
        known = self.peers.get(name)
        if known is not None and known.incarnation == peer.incarnation:
            if peer.version < known.version:
                return "stale"
            peer.applied, peer.announced = known.applied, known.announced
        # A new incarnation starts empty: what the old one had not checkpointed was undone.
        for key, seqs in applied.items():
            mine = peer.applied.setdefault(key, set())
            for seq in seqs - mine:
                mine.add(seq)
                peer.announced.append((peer.version, key, seq))
        while peer.announced and peer.announced[0][0] <= peer.durable:
            _, key, seq = peer.announced.popleft()
            trackers.setdefault(key, SeqTracker()).add(seq)
            mine = peer.applied.get(key)
            if mine is not None:
                mine.discard(seq)
                if not mine:
                    del peer.applied[key]
        if retained:
            peer.heard = known.heard if known is not None else -math.inf
        self.peers[name] = peer
        return "accepted"

    def _parse(self, name: str, payload: bytes) -> tuple[Peer, dict] | None:
        """(the peer as its message describes it, what it newly applied), None for another
        group's claims, or ``Rejected``."""
        message = decode_claims(payload, name)
        if message.group != self.group:
            return None
        parts = ({}, {}, {})  # held, have, applied
        for text, entry in message.keys.items():
            key = parse_key(text)
            if key is None:
                raise Rejected("schema", f"bad claims entry {text[:140]!r}")
            for into, seqs in zip(parts, entry):
                if seqs:
                    into[key] = set(seqs)
        pending, have, applied = parts
        peer = Peer(message.incarnation, message.version, dict(message.seen), pending, have,
                    message.durable, self.clock(), message.t)
        return peer, applied

    def peers_json(self) -> dict:
        """What the claim exchange looks like from here (for the API)."""
        mono = self.clock()
        return {"held": len(self.held),
                "peers": {name: {"t": peer.t, "heard_seconds_ago": mono - peer.heard
                                 if math.isfinite(peer.heard) else None,
                                 "live": mono - peer.heard <= self.peer_timeout,
                                 "held": sum(len(s) for s in peer.pending.values())}
                          for name, peer in sorted(self.peers.items())},
                "rejected": dict(self.rejected)}


