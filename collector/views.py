"""The collector's aggregates as documents: the HTTP API (docs/API.md) and Prometheus text."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edge_agent.protocol import as_dict

from .ingest import Ingestor

# An agent counts as online if its retained status says so, or, for agents
# without a status, if it sent a report this recently.
ONLINE_SECONDS = 120.0


class Views:
    """Read-only views over an ``Ingestor``, taken under the collector's lock."""

    def __init__(self, get_ingestor: Callable[[], Ingestor], lock: threading.RLock | None = None,
                 clock: Callable[[], float] = time.time,
                 broker_status: Callable[[], dict] | None = None,
                 range_results: Callable[[], dict] | None = None,
                 extra: Callable[[], dict] | None = None):
        """``extra``: more top-level fields for /api/channels (a shard's or the merge
        view's ``shard``/``shards``, docs/SCALE_OUT.md)."""
        self._get = get_ingestor
        self._extra = extra
        self._lock = lock or threading.RLock()
        self._clock = clock
        self._broker_status = broker_status or (lambda: {"connected": None, "since": None})
        self._range_results = range_results or dict

    def range_json(self) -> dict:
        """GET /api/range: the latest range-discovery result per channel and side."""
        results = self._range_results()
        return {"t": self._clock(),
                "channels": {name: {side: sides.get(side) for side in ("min", "max")}
                             for name, sides in sorted(results.items())}}

    def channels_json(self) -> dict:
        with self._lock:
            ingestor = self._get()
            now = self._clock()
            return {
                "fleet": ingestor.fleet, "t": now, "broker": self._broker_status(),
                "agents_online": sum(self.online(s, now) for s in ingestor.agents.values()),
                "agents": {name: {"online": self.online(s, now), "messages": s.messages,
                                  "values": s.values, "last_seen": s.last_seen,
                                  "rejects": s.rejects, "duplicates": s.duplicates}
                           for name, s in sorted(ingestor.agents.items())},
                "ingest": {**ingestor.counters,
                           "rejects": dict(ingestor.rejects)},
                "channels": {name: self._channel(ingestor, name, windows=False)
                             for name in sorted(ingestor.series)},
                "range": self.range_json()["channels"],
                **(self._extra() if self._extra is not None else {}),
            }

    def channel_json(self, name: str) -> dict | None:
        with self._lock:
            ingestor = self._get()
            if name not in ingestor.series:
                return None
            return self._channel(ingestor, name, windows=True)

    def dead_letters(self) -> list[dict]:
        with self._lock:
            return list(self._get().dead_letters)

    @staticmethod
    def online(stats, now: float) -> bool:
        if stats.online is not None:
            return stats.online
        return stats.last_seen is not None and now - stats.last_seen < ONLINE_SECONDS

    @staticmethod
    def _channel(ingestor: Ingestor, name: str, *, windows: bool) -> dict:
        by_identity = ingestor.series[name]
        latest = ingestor.latest[name]
        view = by_identity[latest].get(windows=windows)
        view["other_series"] = [{"mechanism": as_dict(s.description), "count": s.count()}
                                for identity, s in by_identity.items() if identity != latest]
        return view

    def metrics_text(self) -> str:
        document = self.channels_json()
        ingest = document["ingest"]
        lines = [
            "# HELP ldp_ingest_messages_total Report messages accepted.",
            "# TYPE ldp_ingest_messages_total counter",
            f"ldp_ingest_messages_total {ingest['messages']}",
            "# HELP ldp_ingest_values_total Perturbed values accepted.",
            "# TYPE ldp_ingest_values_total counter",
            f"ldp_ingest_values_total {ingest['values']}",
            "# HELP ldp_ingest_duplicates_total Redelivered or replayed messages ignored.",
            "# TYPE ldp_ingest_duplicates_total counter",
            f"ldp_ingest_duplicates_total {ingest['duplicates']}",
            "# HELP ldp_ingest_rejects_total Messages rejected, by reason.",
            "# TYPE ldp_ingest_rejects_total counter",
        ]
        lines += [f'ldp_ingest_rejects_total{{reason="{r}"}} {n}'
                  for r, n in sorted(ingest["rejects"].items())]
        connected = document["broker"]["connected"]
        if connected is not None:
            lines += ["# HELP ldp_broker_connected 1 while the collector holds its subscription.",
                      "# TYPE ldp_broker_connected gauge",
                      f"ldp_broker_connected {int(connected)}"]
        lines += ["# HELP ldp_agents_online Agents online.", "# TYPE ldp_agents_online gauge",
                  f"ldp_agents_online {document['agents_online']}"]
        if "shards" in document:  # the merge view
            lines += ["# HELP ldp_shard_state_age_seconds Age of each shard's latest state.",
                      "# TYPE ldp_shard_state_age_seconds gauge"]
            lines += [f'ldp_shard_state_age_seconds{{shard="{name}"}} {shard["age"]}'
                      for name, shard in document["shards"].items() if shard["age"] is not None]
            lines += ["# HELP ldp_shard_state_rejects_total Shard states rejected, by reason.",
                      "# TYPE ldp_shard_state_rejects_total counter"]
            lines += [f'ldp_shard_state_rejects_total{{reason="{r}"}} {n}'
                      for r, n in sorted(document["shard_rejects"].items())]
        gauges = {
            "ldp_channel_count": ("Values accepted per channel.", lambda c: c["count"]),
            "ldp_channel_mean_estimate": (
                "Estimated true mean (linear channels).",
                lambda c: (c.get("mean") or {}).get("estimate")),
            "ldp_channel_mean_stderr": (
                "Standard error of the mean estimate.",
                lambda c: (c.get("mean") or {}).get("stderr")),
            "ldp_channel_resultant_length": (
                "Corrected mean resultant length (circular channels).",
                lambda c: (c.get("resultant_length") or {}).get("estimate")),
        }
        for metric, (help_text, extract) in gauges.items():
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
            for name, channel in document["channels"].items():
                value = extract(channel)
                if value is not None:
                    lines.append(f'{metric}{{channel="{name}"}} {value}')
        return "\n".join(lines) + "\n"
