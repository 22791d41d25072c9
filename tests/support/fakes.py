"""Test doubles that stand in for the outside world in logic tests."""

from __future__ import annotations

from edge_agent.transport import ACKED, CONNECTED, DISCONNECTED, MESSAGE


class FakeTransport:
    """In-memory transport for logic tests: records publishes, acks on demand.

    It implements edge_agent.transport's ``Transport`` interface and queues the
    same events (CONNECTED, DISCONNECTED, ACKED, MESSAGE) as the paho transport,
    so the agent, the fleet simulator and the outbox run on it unchanged."""

    def __init__(self, *, connected: bool = True, auto_ack: bool = True):
        self.connected = connected
        self.auto_ack = auto_ack
        self.published: list[tuple[str, bytes, int, bool]] = []
        self._events: list[tuple[str, object]] = [(CONNECTED, None)] if connected else []
        self._mid = 0
        self.unacked: list[int] = []
        self.subscriptions: list[str] = []
        self.on_event = None

    def _push(self, *events) -> None:
        self._events.extend(events)
        if self.on_event is not None:
            self.on_event()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.connected = False

    def publish(self, topic, payload, *, qos=1, retain=False):
        self._mid += 1
        self.published.append((topic, payload, qos, retain))
        if self.auto_ack and self.connected:
            self._push((ACKED, self._mid))
        else:
            self.unacked.append(self._mid)
        return self._mid

    def subscribe(self, topics: list[str]) -> None:
        self.subscriptions = list(topics)

    def deliver(self, topic: str, payload: bytes) -> None:
        """Simulate a message arriving on a subscribed topic."""
        self._push((MESSAGE, (topic, payload)))

    def set_connected(self, value: bool) -> None:
        self.connected = value
        self._push((CONNECTED if value else DISCONNECTED, None))

    def ack_all(self) -> None:
        self._push(*((ACKED, mid) for mid in self.unacked))
        self.unacked.clear()

    def events(self):
        events, self._events = self._events, []
        return events


class SimulatedTime:
    """A wall clock and a monotonic clock the test moves: ``advance`` moves both (time
    passes), ``step`` moves only the wall clock (someone set it), ``reboot`` starts the
    monotonic clock again.  ``monotonic`` and ``boot_id`` are what a ``StateStore`` paces
    its ledger clock with."""

    def __init__(self, wall: float = 10 * 86400.0):
        self.wall, self.elapsed, self.boots = wall, 1000.0, 1

    def boot_id(self) -> str:
        return f"simulated-boot-{self.boots}"

    def reboot(self, off_seconds: float) -> None:
        """The device was off: real time passed, the monotonic clock starts again."""
        self.wall += off_seconds
        self.elapsed, self.boots = 10.0, self.boots + 1

    def advance(self, seconds: float) -> float:
        self.wall += seconds
        self.elapsed += seconds
        return self.wall

    def step(self, seconds: float) -> float:
        self.wall += seconds
        return self.wall

    def monotonic(self) -> float:
        return self.elapsed
