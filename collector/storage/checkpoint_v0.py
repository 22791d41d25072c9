"""Migrating checkpoints written before the typed codec: pickles of the whole ``Ingestor``.

Such a checkpoint is read with an unpickler that builds no class of ours: every
object of the collector's modules becomes a plain record of its attributes, and
only numpy arrays and the standard containers are rebuilt.  The records are
then written out as a typed checkpoint (``collector.storage.states``), which
the normal path decodes and checks like any other.  The pickle's attribute
names are those of the collector up to protocol version 1's first release.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import msgspec

from collector.storage.states import HeldReport, IngestorState, TrackerState, encode_checkpoint
from edge_agent.protocol import Report, describe

_PICKLE_MAGIC = b"\x80"  # pickle protocol 2 and later start with PROTO
_OURS = ("collector.", "edge_agent.")
# What numpy arrays and the standard containers unpickle through (numpy 1 and 2 names).
_ALLOWED = {("collections", "Counter"), ("collections", "deque"), ("copyreg", "_reconstructor"),
            ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "object"),
            ("numpy", "ndarray"), ("numpy", "dtype"),
            *((f"numpy.{core}.{module}", name) for core in ("core", "_core")
              for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"),
                                   ("numeric", "_frombuffer")))}


def is_legacy(payload: bytes) -> bool:
    return payload[:1] == _PICKLE_MAGIC


class _Record:
    """Any object of the old collector: just its attributes."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple):  # (dict, slots) form
            state = {**(state[0] or {}), **(state[1] or {})}
        self.__dict__.update(state)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.startswith(_OURS):
            return _Record
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} has no place in a checkpoint")


def migrate(payload: bytes) -> bytes:
    """A pickled checkpoint as the typed checkpoint's JSON."""
    old = _Unpickler(io.BytesIO(payload)).load()
    series, index = [], {}
    for by_identity in old.series.values():
        for identity, one in by_identity.items():
            index[identity] = len(series)
            series.append(_series(one))
    agents = {name: {"messages": a.messages, "values": a.values, "duplicates": a.duplicates,
                     "rejects": a.rejects, "last_seen": a.last_seen, "online": a.online,
                     "status": a.status} for name, a in old.agents.items()}
    latest_at = getattr(old, "latest_at", {})
    state = {"fleet": old.fleet,
             "settings": {"bins": old.bins, "window_seconds": old.window_seconds,
                          "keep_windows": old.keep_windows},
             "rejects": dict(old.rejects), "agents": agents, "series": series,
             "latest": {channel: [index[identity], latest_at.get(channel)]
                        for channel, identity in old.latest.items()},
             "dead_letters": list(old.dead_letters)}
    trackers = [tracker_state(agent, channel, tracker.__dict__)
                for (agent, channel), tracker in old.trackers.items()]
    claims = getattr(old, "claims", None)
    held = [] if claims is None else [_held(entry) for entry in claims.held.values()]
    return encode_checkpoint(msgspec.convert(state, IngestorState), trackers, held)


def _bins(s) -> list:
    return [s.counts.tolist(), s.outside_count]


# A block's statistics by attribute name, as their typed states (collector.aggregation.stats).
_STATISTICS = {"count": lambda s: [s.n], "moments": lambda s: [s.n, s.sum, s.sum_sq],
               "trig": lambda s: [s.n, s.cos, s.sin], "cross": lambda s: [s.n, s.x, s.y],
               "raw": _bins, "out": _bins, "hist": _bins}


def _blocks(blocks: dict) -> dict:
    return {name: {stat: make(getattr(block, stat)) for stat, make in _STATISTICS.items()
                   if stat in block.__dict__}
            for name, block in blocks.items()}


def _series(old) -> dict:
    return {"kind": old.kind, "channel": old.channel, "mechanism": old.mechanism,
            "fields": old.fields, "strategy": old.strategy, "messages": old.messages,
            "agents": sorted(old.agents), "total": _blocks(old.total),
            "windows": [[start, _blocks(blocks)] for start, blocks in sorted(old.windows.items())]}


def tracker_state(agent: str, channel: str, state: dict) -> TrackerState:
    """An old sequence tracker's attributes, in either form it was pickled in."""
    floor = state["floor"]
    if "above" in state:  # the set form, before the bitmap
        bits, skipped = sum(1 << (seq - floor - 1) for seq in state["above"]), -1
    else:
        bits, skipped = state["bits"], state["skipped"]
    return TrackerState(agent, channel, floor, skipped,
                        bits.to_bytes((bits.bit_length() + 7) // 8, "little"))


def _held(entry) -> HeldReport:
    report = entry.report
    codes = report.codes
    codes = codes.tolist() if hasattr(codes, "tolist") else [c.tolist() for c in codes]
    message = {"v": 1, "agent": report.agent, "channel": report.channel, "kind": report.kind,
               "seq": report.seq, "t": report.t, "dt": 0.0,
               "mechanism": msgspec.to_builtins(describe(report.mechanism)), "codes": codes}
    if report.fields is not None:
        message["fields"], message["strategy"] = report.fields, report.strategy
    return HeldReport(msgspec.convert(message, Report), entry.received)
