"""Exactly-once counting over at-least-once delivery: which sequence numbers were counted.

Every report carries a sequence number per (agent, channel), persisted across
the agent's restarts; a collector counts each number once (``SeqTracker``).
"""

from __future__ import annotations

from edge_agent.protocol.states import TrackerState

MAX_SPAN = 1 << 17  # sequence numbers a tracker spans before giving up on old gaps (16 kB)


class SeqTracker:
    """Which sequence numbers of one (agent, channel) have been counted.

    ``floor``: every number up to it was counted here.  Numbers past a gap
    (QoS 1 re-sends can arrive after newer ones; a shard sees only its share)
    are bits of ``bits``: bit i stands for ``base + 1 + i``.  A bitmap keeps
    memory at one bit per number whatever the gaps: a shard's tracker is
    about two thirds gaps.  Once the numbers span more than ``MAX_SPAN``, the
    oldest gaps are given up on (the agent's spool may have dropped them):
    numbers up to ``skipped`` then count as seen here, so a late copy of one
    is dropped.  The give-up is local: ``counted`` (what a shard tells its
    peers it has) never includes it.
    """

    def __init__(self, floor: int = -1, skipped: int = -1, bits: int = 0):
        self.floor = floor
        self.skipped = skipped
        self.bits = bits

    @property
    def base(self) -> int:
        return max(self.floor, self.skipped)

    def seen(self, seq: int) -> bool:
        base = self.base
        return seq <= base or (self.bits >> (seq - base - 1)) & 1 == 1

    def counted(self, seq: int) -> bool:
        """Seen and not merely given up on."""
        return seq <= self.floor or (seq > self.skipped and self.seen(seq))

    def add(self, seq: int) -> None:
        base = self.base
        if seq <= base:
            return
        self.bits |= 1 << (seq - base - 1)
        if self.bits & 1:
            self._fold()
        if self.bits.bit_length() > MAX_SPAN:
            # Give up on the oldest eighth of the span at once (amortised shifting).
            shift = MAX_SPAN // 8
            self.skipped = self.base + shift
            self.bits >>= shift
            self._fold()

    def _fold(self) -> None:
        """Leading seen numbers join ``floor`` or, past a give-up, ``skipped``."""
        ones = ((self.bits ^ (self.bits + 1)).bit_length() - 1)  # trailing one bits
        if ones:
            self.bits >>= ones
            if self.floor >= self.skipped:
                self.floor += ones
            else:
                self.skipped += ones

    # -- checkpoints (edge_agent.protocol.states.TrackerState) --
    def to_state(self, agent: str, channel: str) -> TrackerState:
        bits = self.bits.to_bytes((self.bits.bit_length() + 7) // 8, "little")
        return TrackerState(agent, channel, self.floor, self.skipped, bits)

    @classmethod
    def from_state(cls, state: TrackerState) -> SeqTracker:
        return cls(state.floor, state.skipped, int.from_bytes(state.bits, "little"))
