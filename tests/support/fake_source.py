"""A stand-in for the aggregation engine, shaped exactly like docs/reference/API.md.

Four channels, one of each kind: linear ``accel_x``, circular ``roll``, polar
``accel_polar`` and vector ``accel`` (axes ``accel_x``, ``accel_y``,
``accel_z``).  The numbers are made up but coherent: histograms are masses of
a normal / von Mises shape, the raw histogram is flattened by "noise", the
circular statistics are computed from the estimated histogram, the 95%
interval is estimate ± 1.96 stderr.  ``step()`` moves time on, adds reports
and drifts the means, so live views have something to follow; each step starts
a window of the history (``WINDOWS_KEPT`` kept), or updates the one under way;
``add_channel()`` makes a channel appear later, with no data yet (null
statistics).  It is a snapshot source (``collector.api.documents.SnapshotSource``):
``capture`` copies the document under the fake's lock, ``documents`` builds
every API document from that copy; both count their calls.  Thread-safe.
"""

from __future__ import annotations

import copy
import math
import random
import threading

from collector.aggregation.series import series_type
from collector.api.documents import Capture, Documents, history_document

FLEET = "demo"
T0 = 1763780000.0
LINEAR_BINS = 50
CIRCULAR_BINS = 36
WINDOWS_KEPT = 6
WINDOW_SECONDS = 10.0
# What each kind's entry says of its units (collector.aggregation.series.Series.units).
UNITS = {"linear": {"unit": "g"}, "circular": {"unit": "rad"},
         "polar": {"unit": "g", "angle_unit": "rad"}, "vector": {"unit": "g"},
         "categorical": {"unit": None}}
TAU = 2 * math.pi
Z95 = 1.959964

LINEAR_MECHANISM = {"name": "ogpm", "epsilon": 1.0, "low": -2.0, "high": 2.0, "grid_bits": 16}
CIRCULAR_MECHANISM = {"name": "ogpm-circular", "epsilon": 1.0, "period": TAU,
                      "origin": -math.pi, "grid_bits": 16}
POLAR_MECHANISM = {"name": "ogpm-polar", "epsilon": 2.0, "r_max": 3.0, "radius_share": 0.5,
                   "period": TAU, "origin": -math.pi, "grid_bits": 16}
VECTOR_MECHANISM = {"name": "ogpm", "epsilon": 2.0, "low": -2.0, "high": 2.0, "grid_bits": 16}


# -- distribution helpers -------------------------------------------------

def _normal_cdf(x: float, mu: float, sigma: float) -> float:
    return 0.5 * (1 + math.erf((x - mu) / (sigma * math.sqrt(2))))


def _edges(low: float, high: float, bins: int) -> list[float]:
    return [low + (high - low) * i / bins for i in range(bins + 1)]


def _normalized(weights: list[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


def _jitter(rng: random.Random, probabilities: list[float], scale: float) -> list[float]:
    """Sampling noise on a histogram, renormalized (an EMS estimate is never exact)."""
    return _normalized([max(p * (1 + rng.gauss(0, scale)), 0.0) for p in probabilities])


def _flatten(probabilities: list[float], inside: float) -> list[float]:
    """What perturbed reports look like: the shape pulled towards uniform, and
    only ``inside`` of them within the input domain (enlarged output domain)."""
    uniform = 1 / len(probabilities)
    return [inside * (0.45 * p + 0.55 * uniform) for p in probabilities]


def linear_block(rng: random.Random, *, mu: float, sigma: float, low: float, high: float,
                 count: int, method: str = "inversion", note: str | None = None) -> dict:
    """``mean``, ``histogram`` and ``quantiles`` of a linear value."""
    edges = _edges(low, high, LINEAR_BINS)
    true = _normalized([_normal_cdf(b, mu, sigma) - _normal_cdf(a, mu, sigma)
                        for a, b in zip(edges, edges[1:])])
    stderr = 1.3 * (high - low) / 4 / math.sqrt(count)
    estimate = mu + rng.gauss(0, stderr)
    quantiles = {level: min(max(mu + z * sigma, low), high) for level, z in
                 (("0.05", -1.645), ("0.25", -0.674), ("0.5", 0.0), ("0.75", 0.674),
                  ("0.95", 1.645))}
    return {
        "mean": {"raw": 0.45 * estimate + rng.gauss(0, stderr), "estimate": estimate,
                 "stderr": stderr, "ci95": [estimate - Z95 * stderr, estimate + Z95 * stderr],
                 "method": method, "bias_bound": 0.02 * (high - low) / 4,
                 "candidates": {"raw": {"estimate": 0.45 * estimate, "rmse": 0.5 * abs(estimate)},
                                method: {"estimate": estimate, "rmse": stderr}},
                 "note": note},
        "histogram": {"edges": edges, "raw": _flatten(true, 0.93),
                      "estimate": _jitter(rng, true, 0.05), "method": "reconstruction",
                      "smoothing": 0.1},
        "quantiles": quantiles,
    }


def _resultant(edges: list[float], probabilities: list[float]) -> tuple[float, float]:
    """(circular mean, resultant length) of a histogram on [edges[0], edges[-1])."""
    period = edges[-1] - edges[0]
    c = s = 0.0
    for a, b, p in zip(edges, edges[1:], probabilities):
        angle = TAU * (a + b) / 2 / period
        c += p * math.cos(angle)
        s += p * math.sin(angle)
    return math.atan2(s, c) * period / TAU, math.hypot(c, s)


def circular_block(rng: random.Random, *, mu: float, kappa: float, count: int = 15500) -> dict:
    """``circular_mean`` with its ``direction`` interval, ``resultant_length`` with its,
    ``circular_std`` and ``histogram`` of an angle in radians on [-π, π) (standard errors
    as for rho = 0.3 and ``count`` reports)."""
    edges = _edges(-math.pi, math.pi, CIRCULAR_BINS)
    true = _normalized([math.exp(kappa * math.cos((a + b) / 2 - mu))
                        for a, b in zip(edges, edges[1:])])
    estimate = _jitter(rng, true, 0.04)
    raw = _flatten(true, 1.0)  # circular domains have no outside
    mean, length = _resultant(edges, estimate)
    _, raw_length = _resultant(edges, raw)
    length_se = 1 / (0.3 * math.sqrt(2 * count))
    direction_se = length_se / length
    half = math.asin(Z95 * direction_se)
    return {
        "circular_mean": mean,
        "direction": {"stderr": direction_se, "half_width": half,
                      "ci95": [mean - half, mean + half], "reason": None},
        "resultant_length": {"raw": raw_length, "estimate": length, "stderr": length_se,
                             "ci95": [max(length - Z95 * length_se, 0.0),
                                      min(length + Z95 * length_se, 1.0)]},
        "circular_std": math.sqrt(-2 * math.log(length)),
        "circular_std_reason": None,
        "covariance": "sample",
        "histogram": {"edges": edges, "raw": raw, "estimate": estimate},
    }


def with_latest_windows(document: dict, windows: dict[str, list[dict]]) -> None:
    """Each channel's entry gets its latest window as a history point (``window``), and
    its ``state`` (everything computed: "ready")."""
    for name, channel in document["channels"].items():
        kept = windows.get(name)
        channel["window"] = series_type(channel["kind"]).history_point(kept[-1]) \
            if kept else None
        channel.setdefault("state", "ready")


def history_points(kind: str, windows: list[dict]) -> list[dict]:
    """A channel's windows as its detail and history carry them (history points)."""
    return [series_type(kind).history_point(window) for window in windows]


def empty_linear_channel(*, low: float = 0.0, high: float = 100.0) -> dict:
    """A channel the engine knows (configured) but has no report for yet."""
    edges = _edges(low, high, LINEAR_BINS)
    return {
        "kind": "linear",
        "mechanism": {"name": "ogpm", "epsilon": 0.5, "low": low, "high": high, "grid_bits": 16},
        "count": 0, "messages": 0, "agents": 0, "unit": None,
        "mean": {"raw": None, "estimate": None, "stderr": None, "ci95": [None, None],
                 "method": None, "bias_bound": None},
        "histogram": {"edges": edges, "raw": [0.0] * LINEAR_BINS,
                      "estimate": [None] * LINEAR_BINS},
        "quantiles": {"0.05": None, "0.25": None, "0.5": None, "0.75": None, "0.95": None},
        "other_series": [],
    }


class FakeSource:
    """The web server's source interface over a made-up, evolving fleet."""

    def __init__(self, *, seed: int = 7, agents: int = 25):
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.steps = 0
        self._agents = [f"wearable-{i:02d}" for i in range(1, agents + 1)]
        self._offline = {self._agents[-1]}
        self._messages = {agent: 300 + 3 * i for i, agent in enumerate(self._agents)}
        self._duplicates = 12
        self._rejects = {"schema": 1, "bad_code": 2}
        # Drifting parameters of the made-up distributions.
        self._params = {"accel_x": 0.04, "roll": 0.12, "radius": 0.8, "angle": 1.1,
                        "accel_y": -0.3, "accel_z": 0.95}
        self._counts = {"accel_x": 15500, "roll": 15500, "accel_polar": 15500, "accel": 15501}
        self._extra: dict[str, dict] = {}
        self.broker_connected = True  # tests flip it, then step()
        self._windows: dict[str, list[dict]] = {}
        self._doc = self._build()
        self._record_windows()
        self.captures = 0   # capture() calls
        self.computes = 0   # documents() calls

    # -- the source interface -------------------------------------------

    def channels_json(self) -> dict:
        with self._lock:
            document = copy.deepcopy(self._doc)
            with_latest_windows(document, self._windows)
            return document

    def channel_json(self, name: str) -> dict | None:
        with self._lock:
            channel = self._doc["channels"].get(name)
            if channel is None:
                return None
            entry = copy.deepcopy(channel)
            with_latest_windows({"channels": {name: entry}}, self._windows)
            entry["windows"] = history_points(entry["kind"], self._windows.get(name, []))
            return entry

    def capture(self) -> Capture:
        with self._lock:
            self.captures += 1
            content = (copy.deepcopy(self._doc), copy.deepcopy(self._windows))
            return Capture(t=self._doc["t"], content=content)

    def documents(self, capture: Capture) -> Documents:
        with self._lock:
            self.computes += 1
        document, windows = capture.content
        with_latest_windows(document, windows)
        details = {name: {**channel,
                          "windows": history_points(channel["kind"], windows.get(name, []))}
                   for name, channel in document["channels"].items()}
        histories = {name: history_document(name, detail, WINDOW_SECONDS, WINDOWS_KEPT,
                                            capture.t)
                     for name, detail in details.items()}
        return Documents(channels=document, channel_details=details, histories=histories,
                         range={"t": capture.t, "channels": {}}, dead_letters=[])

    # -- test controls ----------------------------------------------------

    def step(self, *, new_window: bool = True) -> None:
        """One more push period's worth of reports: counts grow, means drift.  A new
        window of the history starts (``new_window``), or the one under way is updated
        (same ``start``)."""
        with self._lock:
            self.steps += 1
            for key in self._params:
                self._params[key] += self._rng.gauss(0, 0.02)
            for name in self._counts:
                self._counts[name] += 480 + self._rng.randrange(40)
            for agent in self._agents:
                if agent not in self._offline:
                    self._messages[agent] += 1
            self._duplicates += self._rng.randrange(2)
            self._doc = self._build()
            self._record_windows(new_window=new_window)

    def set_parameter(self, name: str, value: float) -> None:
        """Where a made-up distribution is centred from the next ``step()`` on (``accel_x``,
        ``roll``, ``radius``, ``angle``, ``accel_y``, ``accel_z``)."""
        with self._lock:
            if name not in self._params:
                raise KeyError(name)
            self._params[name] = value

    def add_channel(self, name: str, channel: dict | None = None) -> None:
        """Make a channel appear (default: a linear one without data yet)."""
        with self._lock:
            self._extra[name] = channel if channel is not None else empty_linear_channel()
            self._doc["channels"][name] = copy.deepcopy(self._extra[name])

    # -- building the document ----------------------------------------------

    def _build(self) -> dict:
        t = T0 + self.steps * 1.0
        rng = self._rng
        n_agents = len(self._agents) - len(self._offline)
        channels = {
            "accel_x": self._linear_channel(rng, n_agents),
            "roll": self._circular_channel(rng, n_agents),
            "accel_polar": self._polar_channel(rng, n_agents),
            "accel": self._vector_channel(rng, n_agents),
        }
        channels.update(copy.deepcopy(self._extra))
        agents = {
            agent: {"online": agent not in self._offline, "messages": self._messages[agent],
                    "values": 50 * self._messages[agent],
                    "last_seen": t - (0.4 if agent not in self._offline else 900.0),
                    "rejects": 1 if i == 3 else 0}
            for i, agent in enumerate(self._agents)
        }
        messages = sum(self._messages.values())
        return {
            "fleet": FLEET,
            "t": t,
            "broker": {"connected": self.broker_connected, "since": T0 - 3600.0},
            "agents_online": n_agents,
            "agents": agents,
            "ingest": {"messages": messages, "values": 50 * messages,
                       "duplicates": self._duplicates, "rejects": dict(self._rejects)},
            "guarantees": {"others": 1, "promises": [
                {"agents": n_agents - 2, "guarantees": [{"epsilon": 4.0, "per": "10m"},
                                                        {"epsilon": 120.0, "per": "1d"}]},
                {"agents": 1, "guarantees": [{"epsilon": 500.0, "per": "1d"}]}]},
            "channels": channels,
        }

    def _meta(self, kind: str, name: str, mechanism: dict, n_agents: int) -> dict:
        count = self._counts[name]
        return {"kind": kind, "mechanism": dict(mechanism), "count": count,
                "messages": count // 50, "agents": n_agents, **UNITS[kind]}

    def _linear_channel(self, rng: random.Random, n_agents: int) -> dict:
        channel = self._meta("linear", "accel_x", LINEAR_MECHANISM, n_agents)
        channel.update(linear_block(rng, mu=self._params["accel_x"], sigma=0.35, low=-2.0,
                                    high=2.0, count=channel["count"]))
        channel["other_series"] = [{"mechanism": {**LINEAR_MECHANISM, "epsilon": 0.5},
                                    "count": 1200}]
        return channel

    def _circular_channel(self, rng: random.Random, n_agents: int) -> dict:
        channel = self._meta("circular", "roll", CIRCULAR_MECHANISM, n_agents)
        channel.update(circular_block(rng, mu=self._params["roll"], kappa=1.9))
        channel["other_series"] = []
        return channel

    def _polar_channel(self, rng: random.Random, n_agents: int) -> dict:
        channel = self._meta("polar", "accel_polar", POLAR_MECHANISM, n_agents)
        radius = linear_block(rng, mu=self._params["radius"], sigma=0.4, low=0.0, high=3.0,
                              count=channel["count"], method="reconstruction",
                              note="78% of the data lies where ogpm at epsilon 0.9 reports the "
                                   "same distribution for every value")
        angle = circular_block(rng, mu=self._params["angle"], kappa=0.8)
        r = radius["mean"]["estimate"] * angle["resultant_length"]["estimate"]
        direction = angle["circular_mean"]
        channel.update({
            "radius": radius,
            "angle": angle,
            "mean_vector": {"x": r * math.cos(direction), "y": r * math.sin(direction),
                            "magnitude": r, "direction": direction},
            "other_series": [],
        })
        return channel

    def _vector_channel(self, rng: random.Random, n_agents: int) -> dict:
        channel = self._meta("vector", "accel", VECTOR_MECHANISM, n_agents)
        channel["strategy"] = {"k": 1, "d": 3, "epsilon": 2.0}
        axes = {}
        for i, axis in enumerate(("accel_x", "accel_y", "accel_z")):
            count = channel["count"] // 3 + (1 if i < channel["count"] % 3 else 0)
            axes[axis] = {"count": count, **linear_block(rng, mu=self._params[axis], sigma=0.3,
                                                          low=-2.0, high=2.0, count=count)}
        channel["axes"] = axes
        channel["other_series"] = []
        return channel

    def _record_windows(self, *, new_window: bool = True) -> None:
        """A tumbling window per step: the channel's statistics, oldest first; or
        (``new_window`` false) the latest window's statistics replaced, its span kept."""
        start = self._doc["t"] - WINDOW_SECONDS
        for name, channel in self._doc["channels"].items():
            stats = {key: copy.deepcopy(value) for key, value in channel.items()
                     if key not in ("kind", "mechanism", "messages", "agents", "other_series",
                                    "strategy", "unit", "angle_unit", "window")}
            stats["count"] = min(channel["count"], 480)
            windows = self._windows.setdefault(name, [])
            if not new_window and windows:
                windows[-1] = {"start": windows[-1]["start"], "end": windows[-1]["end"], **stats}
                continue
            windows.append({"start": start, "end": self._doc["t"], **stats})
            del windows[:-WINDOWS_KEPT]
