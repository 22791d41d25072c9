"""The range results a collector serves (``GET /api/range``): the latest retained result
per channel and side, from the configured coordinator only.

A channel's min and max of the same time are both served ``insufficient`` when the min
exceeds the max (``edge_agent.mechanisms.rangefind.pair_conflict``).
"""

from __future__ import annotations

import collections
import logging
import threading

from edge_agent import protocol
from edge_agent.mechanisms.rangefind import pair_conflict
from edge_agent.protocol import RangeResult, Rejected

log = logging.getLogger(__name__)


class RangeResults:
    """The latest retained range result per channel and side (``GET /api/range``).

    Only results that name the configured coordinator (``[range_discovery] client_id``)
    and the channel and side of their topic are kept, for at most ``limit`` channels;
    others are counted in ``ignored`` by reason."""

    def __init__(self, fleet: str, *, coordinator: str, limit: int):
        self.fleet = fleet
        self.coordinator = coordinator
        self.limit = limit
        self.ignored: collections.Counter = collections.Counter()
        self._results: dict[str, dict[str, dict]] = {}  # channel -> side -> result
        self._lock = threading.Lock()

    def on_message(self, client, userdata, message) -> None:
        try:
            channel, side, result = self._check(message.topic, message.payload)
        except Rejected as exc:
            log.debug("ignored a range result on %s: %s", message.topic[:256], exc.detail)
            with self._lock:
                self.ignored[exc.reason] += 1
            return
        with self._lock:
            if result is None:  # a cleared retained result
                self._results.get(channel, {}).pop(side, None)
                if not self._results.get(channel, True):
                    del self._results[channel]
            elif channel in self._results or len(self._results) < self.limit:
                self._results.setdefault(channel, {})[side] = protocol.as_dict(result)
            else:
                self.ignored["limit_range_results"] += 1

    def _check(self, topic: str, payload: bytes) -> tuple[str, str, RangeResult | None]:
        where = protocol.range_result_levels(topic, self.fleet)
        if where is None:
            raise Rejected("topic", "not a range result topic of this fleet")
        result = protocol.decode_range_result(payload)
        if result is not None:
            if (result.channel, result.side) != where:
                raise Rejected("topic", "channel or side differs from the topic's")
            if result.coordinator != self.coordinator:
                raise Rejected("coordinator", f"from {result.coordinator!r}, not the "
                                              f"configured coordinator {self.coordinator!r}")
        return *where, result

    def get(self) -> dict[str, dict[str, dict]]:
        """channel -> side -> result; a min and max of the same time whose min exceeds the
        max are both served ``insufficient`` (``published_status`` keeps what was sent)."""
        with self._lock:
            results = {channel: dict(sides) for channel, sides in self._results.items()}
        for sides in results.values():
            low, high = sides.get("min"), sides.get("max")
            if low is None or high is None or not same_time(low, high):
                continue
            conflict = pair_conflict(low.get("estimate"), high.get("estimate"))
            if conflict is not None:
                for side, result in (("min", low), ("max", high)):
                    sides[side] = {**result, "status": "insufficient",
                                   "published_status": result.get("status"),
                                   "reason": "; ".join(filter(None, (conflict,
                                                                     result.get("reason"))))}
        return results

    def ignored_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.ignored)


PAIR_SECONDS = 60.0


def same_time(a: dict, b: dict) -> bool:
    """Whether two results (a channel's min and max) describe the same time: one run
    started at most ``PAIR_SECONDS`` after the other finished (a schedule runs them one
    after the other), or they overlapped."""
    first, second = sorted((a, b), key=lambda r: r["started_at"])
    end = first.get("finished_at") or first["started_at"]
    return second["started_at"] <= end + PAIR_SECONDS
