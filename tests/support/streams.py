"""A publisher of reports of several agents with copies and replays, remembering what it
sent (what the end-to-end scale-out tests compare the collectors' counts with)."""

from __future__ import annotations

import threading
import time

import numpy as np

from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM, UnbiasedOGPM
from tests.support import MqttClient

AGENTS = [f"d{i}" for i in range(6)]
CHANNELS = {
    "x": (ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0), "linear"),
    "xu": (UnbiasedOGPM(epsilon=2.0, low=-2.0, high=2.0), "linear"),
    "yaw": (CircularOGPM(epsilon=1.0), "circular"),
}


class Publisher:
    """Reports of several agents, re-published copies and late replays, all remembered."""

    def __init__(self, broker, rng):
        self.rng = rng
        self.sent: list[tuple[str, bytes]] = []
        self.values: dict[str, int] = {name: 0 for name in CHANNELS}
        self.copies = 0
        self.client = MqttClient(broker, v5=False).connect()
        self.t0 = time.time() - 3600  # report times within what a collector accepts

    def publish(self, topic, payload):
        self.client.publish(topic, payload)

    def seqs(self, seqs):
        for seq in seqs:
            for agent in AGENTS:
                for channel, (mechanism, kind) in CHANNELS.items():
                    truth = self.rng.uniform(-1.9, 1.9, 20) if kind == "linear" else \
                        self.rng.vonmises(1.0, 2.0, 20)
                    codes = mechanism.perturb_codes(truth, self.rng).tolist()
                    message = (protocol.data_topic("demo", agent, channel),
                               protocol.report(agent=agent, channel=channel, kind=kind, seq=seq,
                                               t=self.t0 + seq, dt=1.0,
                                               mechanism=mechanism.describe(), codes=codes))
                    self.publish(*message)
                    self.sent.append(message)
                    self.values[channel] += len(codes)
                    if self.rng.random() < 0.1:  # a re-send right away, as after a reconnect
                        self.publish(*message)
                        self.copies += 1
            time.sleep(0.01)
        self.flush()

    def replay(self, n):
        """Old reports again (an agent re-sending its spool after a restart)."""
        for i in self.rng.choice(len(self.sent), n, replace=False):
            self.publish(*self.sent[i])
        self.copies += n
        self.flush()

    def flush(self):
        self.client.flush(30)


def comparable(channel):
    """A channel's API entry; the float sums of angles depend on the order of summation
    (and so does everything computed from them: intervals, reasons at a threshold)."""
    channel = dict(channel)
    if channel["kind"] == "circular":
        for key in ("circular_mean", "direction", "resultant_length", "circular_std",
                    "circular_std_reason", "window"):
            channel.pop(key)
    return channel


class SteadyStream:
    """A steady stream of reports in the background, in phases: the agents of phase ``k``
    are ``p<k>-d<i>``, so a collector's per-agent counts tell how much of each phase it
    has counted (``count(api, phase)``) while the next phase is being published."""

    def __init__(self, broker, *, agents: int = 16, rate: float = 10.0, seed: int = 0):
        self.agents, self.period = agents, 1.0 / rate
        self.mechanism, self.rng = CHANNELS["x"][0], np.random.default_rng(seed)
        self.client = MqttClient(broker, v5=False).connect()
        self.sent: list[int] = [0]  # reports published in each phase
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="steady-stream", daemon=True)
        self.t0 = time.time() - 3600

    def start(self) -> SteadyStream:
        self._thread.start()
        return self

    def next_phase(self) -> int:
        """Start a new phase; returns the number of the one that ended, all of it
        acknowledged by the broker."""
        with self._lock:
            self.sent.append(0)
            ended = len(self.sent) - 2
        self.client.flush(30)
        return ended

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.flush(30)

    def _run(self) -> None:
        seq = 0
        while not self._stop.wait(self.period):
            with self._lock:
                phase = len(self.sent) - 1
                for i in range(self.agents):
                    agent = f"p{phase}-d{i}"
                    codes = self.mechanism.perturb_codes(self.rng.uniform(-1, 1, 4),
                                                         self.rng).tolist()
                    self.client.publish(protocol.data_topic("demo", agent, "x"),
                                        protocol.report(agent=agent, channel="x", kind="linear",
                                                        seq=seq, t=self.t0 + seq, dt=1.0,
                                                        mechanism=self.mechanism.describe(),
                                                        codes=codes))
                    self.sent[phase] += 1
            seq += 1

    def counted(self, api: dict, phase: int) -> int:
        """Reports of ``phase`` that the collector behind ``api`` has counted."""
        prefix = f"p{phase}-"
        return sum(entry["messages"] for agent, entry in api["agents"].items()
                   if agent.startswith(prefix))
