"""Exactly-once counting over at-least-once delivery: which sequence numbers were settled.

Every report carries a sequence number per (agent, channel), persisted across
the agent's restarts; a collector counts each number once (``SeqTracker``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

from collector.storage.states import MAX_TRACKER_RUNS, TrackerState

# Runs of numbers a tracker keeps past its floor, i.e. gaps it remembers: 16 bytes each,
# so 16 kB at most per (agent, channel) whatever numbers arrive.
MAX_RUNS = MAX_TRACKER_RUNS


class SeqTracker:
    """Which sequence numbers of one (agent, channel) have been settled.

    ``floor``: every number up to it was counted here.  Numbers past a gap
    (QoS 1 re-sends can arrive after newer ones; an agent's full spool drops
    its oldest) are kept as a sorted set of
    disjoint runs ``[start, end]``, so memory depends on the number of gaps,
    never on the numbers themselves: 2**52 costs what 5 does.  Checking and
    adding are exact for any order of arrival, by binary search.

    Once ``MAX_RUNS`` gaps are open, the oldest gap is given up on (an agent's
    spool dropped those reports long ago, or a device plays games with its
    own numbers: it can only hurt its own tracker).  Numbers up to
    ``skipped`` then count as seen here, so a late copy of one is dropped.
    ``counted`` (seen, and not merely given up on) never includes those.
    """

    __slots__ = ("floor", "skipped", "_starts", "_ends")

    def __init__(self, floor: int = -1, skipped: int = -1):
        self.floor = floor
        self.skipped = skipped
        self._starts = array("q")  # run i is [_starts[i], _ends[i]], all past base + 1
        self._ends = array("q")

    @property
    def base(self) -> int:
        """Every number up to here is settled (counted, or given up on)."""
        return max(self.floor, self.skipped)

    @property
    def runs(self) -> list[tuple[int, int]]:
        """The runs past ``base``, oldest first: one per open gap."""
        return list(zip(self._starts, self._ends))

    def settled(self) -> list[tuple[int, int]]:
        """Every number this tracker holds as seen, as sorted [start, end] runs."""
        head = [(0, self.base)] if self.base >= 0 else []
        return head + self.runs

    def seen(self, seq: int) -> bool:
        if seq <= self.base:
            return True
        i = bisect_right(self._starts, seq) - 1
        return i >= 0 and seq <= self._ends[i]

    def counted(self, seq: int) -> bool:
        """Seen and not merely given up on."""
        return seq <= self.floor or (seq > self.skipped and self.seen(seq))

    def add(self, seq: int) -> None:
        self.add_run(seq, seq)

    def add_run(self, start: int, end: int) -> None:
        """Mark every number of [start, end] as seen."""
        base = self.base
        start = max(start, base + 1)
        if start > end:
            return
        starts, ends = self._starts, self._ends
        # The runs that touch or overlap [start, end] are [first, last): merge them all.
        first = bisect_right(ends, start - 2)  # runs ending before start - 1 stay apart
        last = bisect_right(starts, end + 1)
        if first < last:
            start, end = min(start, starts[first]), max(end, ends[last - 1])
            del starts[first:last], ends[first:last]
        if start == base + 1:  # joins the settled prefix
            self._extend_base(end)
            return
        starts.insert(first, start)
        ends.insert(first, end)
        if len(starts) > MAX_RUNS:
            self._give_up_oldest_gap()

    def _extend_base(self, end: int) -> None:
        if self.floor >= self.skipped:
            self.floor = end
        else:
            self.skipped = end

    def _give_up_oldest_gap(self) -> None:
        """The gap below the first run counts as seen from now on (locally)."""
        self.skipped = self._ends[0]
        del self._starts[0], self._ends[0]

    # -- checkpoints (collector.storage.states.TrackerState) --
    def to_state(self, agent: str, channel: str) -> TrackerState:
        return TrackerState(agent, channel, self.floor, self.skipped, self.runs)

    @classmethod
    def from_state(cls, state: TrackerState) -> SeqTracker:
        tracker = cls(state.floor, state.skipped)
        if isinstance(state.runs, bytes):  # checkpoint v1: a bitmap past the base
            for start, end in bitmap_runs(state.runs, tracker.base + 1):
                tracker.add_run(start, end)
        else:
            for start, end in state.runs:
                tracker.add_run(start, end)
        return tracker


def bitmap_runs(bits: bytes, origin: int) -> list[tuple[int, int]]:
    """The runs of set bits of a little-endian bitmap whose bit i stands for origin + i."""
    value = int.from_bytes(bits, "little")
    runs, position = [], 0
    while value:
        zeros = (value & -value).bit_length() - 1
        value >>= zeros
        ones = (value ^ (value + 1)).bit_length() - 1
        runs.append((origin + position + zeros, origin + position + zeros + ones - 1))
        value >>= ones
        position += zeros + ones
    return runs
