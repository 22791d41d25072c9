"""The ble source's connection logic, against a fake at bleak's interface.

Why a fake and not a real BLE host stack: bleak on Linux talks to BlueZ over the
D-Bus system bus, and BlueZ needs a kernel Bluetooth controller (an hci device,
or the virtual one /dev/vhci that Google's bumble can emulate a peripheral
through).  This machine's kernel has no Bluetooth at all (socket(AF_BLUETOOTH)
fails with EAFNOSUPPORT, no /dev/vhci, no system bus), and neither has CI's: no
peripheral, real or emulated, can be reached through bleak here.  So
``FakeBle`` stands in for ``bleak.BleakScanner`` (``find_device_by_address``,
``find_device_by_name``) and ``bleak.BleakClient`` (constructed with the device,
``disconnected_callback`` and ``timeout``; ``connect``, ``disconnect``,
``start_notify``, ``write_gatt_char``), with the same calls, arguments and
threading as bleak: coroutines and callbacks on the source's own asyncio loop.
The notifications it delivers are byte strings built per the specifications
(tests/edge_agent/sources/test_ble_parsers.py).  The back-off wait is a fake too: it records
each wait and returns only when the test allows, so no test depends on how fast
the machine is; the readings' clock is a fake the test sets.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import sys
import threading

import numpy as np
import pytest

from edge_agent.agent import AgentCore
from edge_agent.config import ConfigError, parse_config
from edge_agent.fleet import check_fleet, fleet_sources, single_agent_problems
from edge_agent.sources import BleSource, build_source
from edge_agent.sources.ble.heart_rate import HEART_RATE_MEASUREMENT
from edge_agent.sources.ble.polar_pmd import PMD_CONTROL_POINT, PMD_DATA, start_acc_request
from edge_agent.sources.ble.source import backoff_seconds, failure_kind
from edge_agent.state import StateStore
from tests.support import agent_config, returns_within, wait_until
from tests.support.configs import commented_source

H10 = "A0:9E:1A:00:00:01"
STRAP = "C0:FF:EE:00:00:02"
WAIT = 10.0  # generous: how long a test waits for the source's thread to act


# -- the fake bleak ---------------------------------------------------------------------------

class BleakError(Exception):
    """Named like bleak's errors (the source classifies them by name)."""


class Characteristic:
    def __init__(self, uuid: str):
        self.uuid = uuid


class Peripheral:
    """A wearable in range (or not): what it advertises, serves and answers."""

    def __init__(self, ble: FakeBle, address: str, name: str, services: set[str]):
        self.ble, self.address, self.name, self.services = ble, address, name, services
        self.advertising = True
        self.connect_error: Exception | None = None
        self.connect_hangs = False
        self.pmd_status = 0  # the control point's answer to a start request
        self.pmd_factor: float | None = None
        self.client: FakeClient | None = None
        self.subscriptions: dict[str, object] = {}
        self.writes: list[tuple[str, bytes, bool | None]] = []
        self.connects = 0

    @property
    def streaming(self) -> bool:
        return self.client is not None and bool(self.subscriptions)

    def notify(self, uuid: str, data: bytes) -> None:
        """Send a notification (from the test's thread, as BlueZ's D-Bus signal would
        arrive on the loop)."""
        callback = self.subscriptions[uuid]
        self.client.loop.call_soon_threadsafe(callback, Characteristic(uuid), bytearray(data))

    def drop(self) -> None:
        """The link is lost (out of range, battery): bleak calls disconnected_callback."""
        client = self.client
        client.loop.call_soon_threadsafe(client.lost)


class FakeBle:
    """``scanner`` and ``client_factory`` for ``BleSource``; remembers every call."""

    def __init__(self):
        self.peripherals: dict[str, Peripheral] = {}
        self.calls: list[tuple] = []

    def add(self, address: str, name: str = "", services=(HEART_RATE_MEASUREMENT,)):
        peripheral = Peripheral(self, address, name, set(services))
        self.peripherals[address] = peripheral
        return peripheral

    # BleakScanner's class methods
    async def find_device_by_address(self, address: str, timeout: float = 10.0, **options):
        self.calls.append(("find_device_by_address", address, timeout, options))
        await asyncio.sleep(0)
        found = self.peripherals.get(address)
        return found if found is not None and found.advertising else None

    async def find_device_by_name(self, name: str, timeout: float = 10.0, **options):
        self.calls.append(("find_device_by_name", name, timeout, options))
        await asyncio.sleep(0)
        return next((p for p in self.peripherals.values() if p.name == name and p.advertising),
                    None)

    # BleakClient's constructor
    def client_factory(self, device, disconnected_callback=None, *, timeout: float = 10.0,
                       **options):
        self.calls.append(("BleakClient", device.address, timeout, options))
        return FakeClient(device, disconnected_callback)


class FakeClient:
    def __init__(self, peripheral: Peripheral, disconnected_callback):
        self.peripheral = peripheral
        self.disconnected_callback = disconnected_callback
        self.is_connected = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.disconnects = 0

    async def connect(self, **_):
        self.loop = asyncio.get_running_loop()
        peripheral = self.peripheral
        if peripheral.connect_hangs:
            await asyncio.Event().wait()
        if peripheral.connect_error is not None:
            raise peripheral.connect_error
        peripheral.connects += 1
        peripheral.subscriptions = {}
        peripheral.client = self
        self.is_connected = True

    async def disconnect(self):
        self.disconnects += 1
        self.is_connected = False
        if self.peripheral.client is self:
            self.peripheral.client = None

    def lost(self):
        self.is_connected = False
        self.peripheral.client = None
        self.peripheral.subscriptions = {}
        self.disconnected_callback(self)

    async def start_notify(self, uuid: str, callback, **_):
        if uuid not in self.peripheral.services:
            raise BleakError(f"Characteristic {uuid} was not found!")
        self.peripheral.subscriptions[uuid] = callback

    async def write_gatt_char(self, uuid: str, data, response=None):
        peripheral = self.peripheral
        peripheral.writes.append((uuid, bytes(data), response))
        if uuid == PMD_CONTROL_POINT and data[0] == 0x02:  # start: answer by indication
            answer = bytes([0xF0, 0x02, data[1], peripheral.pmd_status, 0])
            if peripheral.pmd_factor is not None:
                answer += bytes([5, 1]) + struct.pack("<f", peripheral.pmd_factor)
            callback = peripheral.subscriptions[PMD_CONTROL_POINT]
            self.loop.call_soon(callback, Characteristic(uuid), bytearray(answer))


class GatedSleep:
    """The back-off wait: records each delay and returns once the test allows it."""

    def __init__(self, free: bool = False):
        self.delays: list[float] = []
        self.free = free
        self._permits = threading.Semaphore(0)

    def allow(self, count: int = 1) -> None:
        for _ in range(count):
            self._permits.release()

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        while not (self.free or self._permits.acquire(blocking=False)):
            await asyncio.sleep(0.002)


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- helpers ----------------------------------------------------------------------------------

def ble_source_config(devices, *, field="heart_rate", **settings):
    """A config whose one source is a ble source of ``devices`` (``settings``: more keys),
    with a channel on ``field``."""
    source = {"name": "ble", "type": "ble", "devices": devices,
              "reconnect": {"initial_seconds": 1, "max_seconds": 8, "jitter": 0}, **settings}
    channel = {"name": "hr", "source": "ble", "kind": "linear", "field": field,
               "epsilon": 1.0, "domain": [30, 220]}
    return parse_config(agent_config(state_dir="/tmp/unused", sources=[source],
                                     channels=[channel]))


def make_source(ble, devices, *, sleep=None, clock=None, **settings):
    """A source of ``devices`` on the fake ``ble``, not started."""
    config = ble_source_config(devices, **settings)
    source = BleSource(config.sources[0], client_factory=ble.client_factory, scanner=ble,
                       sleep=sleep or GatedSleep(), clock=clock or Clock(),
                       rng=random.Random(7))
    return source


@pytest.fixture
def sources():
    """Sources a test starts; each is stopped, and its thread must be gone."""
    started = []
    yield started
    for source in started:
        source.stop()
        assert not source.running, f"{source!r} left its thread running"


def started(sources, source):
    source.start()
    sources.append(source)
    return source


def hrm(heart_rate: int, *, rr=(), energy=None, contact: int = 0) -> bytes:
    flags = (contact << 1) | (0x08 if energy is not None else 0) | (0x10 if rr else 0)
    out = bytes([flags, heart_rate])
    if energy is not None:
        out += struct.pack("<H", energy)
    return out + b"".join(struct.pack("<H", v) for v in rr)


def acc_frame(samples) -> bytes:
    return bytes([2]) + bytes(8) + bytes([1]) + b"".join(
        struct.pack("<3h", *sample) for sample in samples)


def device_counters(source, label):
    return source.local_counters()["devices"][label]


def wait_state(source, label, state):
    assert wait_until(lambda: device_counters(source, label)["state"] == state, WAIT), \
        device_counters(source, label)


def take(source, rows: int):
    """Poll until ``rows`` readings have arrived; all of them, as one batch."""
    parts = []

    def enough():
        parts.append(source.poll(0.0))
        return sum(len(p) for p in parts) >= rows

    assert wait_until(enough, WAIT), sum(len(p) for p in parts)
    from edge_agent.readings import Readings
    return Readings.concat(parts)


# -- connect and stream ------------------------------------------------------------------------

def test_connects_by_address_and_streams_through_poll(sources):
    ble, clock = FakeBle(), Clock(1000.0)
    strap = ble.add(STRAP, "HRM-Pro")
    source = started(sources, make_source(ble, [{"address": STRAP.lower()}], clock=clock,
                                          scan_seconds=7, connect_seconds=9))
    wait_state(source, STRAP, "streaming")
    assert ("find_device_by_address", STRAP, 7.0, {}) in ble.calls
    assert ("BleakClient", STRAP, 9.0, {}) in ble.calls
    empty = source.poll(0.0)
    assert len(empty) == 0 and set(empty.fields) == {"heart_rate", "rr_interval", "energy"}
    # 72 bpm, 300 kJ, two RR intervals: 1.0 s then 0.5 s (the last ends at the arrival).
    strap.notify(HEART_RATE_MEASUREMENT, hrm(72, rr=(1024, 512), energy=300))
    readings = take(source, 3)
    order = np.argsort(readings.times)
    np.testing.assert_array_equal(readings.times[order], [999.5, 1000.0, 1000.0])
    hr = readings.column("heart_rate")
    assert sorted(hr[np.isfinite(hr)]) == [72.0]
    assert list(readings.column("energy")[np.isfinite(readings.column("energy"))]) == [300.0]
    rr = readings.column("rr_interval")
    rr_rows = np.isfinite(rr)
    assert sorted(zip(readings.times[rr_rows], rr[rr_rows])) == [(999.5, 1.0), (1000.0, 0.5)]
    counters = device_counters(source, STRAP)
    assert counters["connections"] == 1 and counters["failures"] == {}
    assert source.error is None and not source.finished


def test_finds_a_device_by_its_advertised_name(sources):
    ble = FakeBle()
    ble.add(H10, "Polar H10 1A2B3C4D")
    source = started(sources, make_source(ble, [{"name": "Polar H10 1A2B3C4D"}],
                                          adapter="hci1"))
    label = "name='Polar H10 1A2B3C4D'"
    wait_state(source, label, "streaming")
    assert ("find_device_by_name", "Polar H10 1A2B3C4D", 10.0,
            {"bluez": {"adapter": "hci1"}}) in ble.calls
    assert ("BleakClient", H10, 20.0, {"bluez": {"adapter": "hci1"}}) in ble.calls
    assert "Polar H10 1A2B3C4D" in repr(source)


# -- drop-outs and back-off ---------------------------------------------------------------------

def test_a_drop_out_reconnects_with_exponential_backoff(sources, caplog):
    caplog.set_level(logging.INFO, logger="edge_agent.sources.ble.source")
    ble, sleep = FakeBle(), GatedSleep()
    strap = ble.add(STRAP)
    source = started(sources, make_source(ble, [{"address": STRAP}], sleep=sleep))
    wait_state(source, STRAP, "streaming")
    strap.advertising = False  # out of range: it drops, then cannot be found
    strap.drop()
    assert wait_until(lambda: len(sleep.delays) == 1, WAIT)
    assert device_counters(source, STRAP)["drops"] == 1
    sleep.allow(4)  # four searches that find nothing, each waiting twice as long (to 8 s)
    assert wait_until(lambda: len(sleep.delays) == 5, WAIT)
    assert sleep.delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    counters = device_counters(source, STRAP)
    assert counters["failures"] == {"not_found": 4}
    assert counters["failed_attempts_in_a_row"] == 4 and counters["state"] == "waiting"
    strap.advertising = True
    sleep.allow()
    wait_state(source, STRAP, "streaming")
    counters = device_counters(source, STRAP)
    assert counters["connections"] == 2 and counters["failed_attempts_in_a_row"] == 0
    strap.notify(HEART_RATE_MEASUREMENT, hrm(90))
    assert list(take(source, 1).column("heart_rate")) == [90.0]
    # Streaming resets the back-off: the next drop waits the initial second again.
    strap.drop()
    assert wait_until(lambda: len(sleep.delays) == 6, WAIT)
    assert sleep.delays[-1] == 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and STRAP in warnings[0] and "did not advertise" in warnings[0]
    assert any("streams again (after 4 failed attempts)" in r.getMessage()
               for r in caplog.records)


def test_backoff_is_bounded_and_jittered():
    rng = random.Random(3)
    for attempt in range(1, 80):
        base = min(60.0, 2.0 * 2 ** (attempt - 1))
        wait = backoff_seconds(attempt, initial=2.0, maximum=60.0, jitter=0.25, rng=rng)
        assert 0.75 * base <= wait <= base
    waits = {backoff_seconds(9, initial=2.0, maximum=60.0, jitter=0.25, rng=rng)
             for _ in range(20)}
    assert len(waits) == 20  # jittered: devices dropped together are not retried in step
    assert backoff_seconds(3, initial=1.0, maximum=8.0, jitter=0.0, rng=rng) == 4.0


def test_a_device_never_found_is_retried_logged_once_and_in_the_status(sources, caplog):
    caplog.set_level(logging.DEBUG, logger="edge_agent.sources.ble.source")
    ble, sleep = FakeBle(), GatedSleep()
    source = started(sources, make_source(ble, [{"address": STRAP}], sleep=sleep))
    sleep.allow(5)
    assert wait_until(lambda: len(sleep.delays) == 6, WAIT)
    counters = device_counters(source, STRAP)
    assert counters["failures"] == {"not_found": 6}
    assert counters["connections"] == 0 and counters["failed_attempts_in_a_row"] == 6
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "retrying" in warnings[0].getMessage()
    assert source.error is None and not source.finished  # never fails the agent


@pytest.mark.parametrize("error,kind,hint", [
    (BleakError("[org.freedesktop.DBus.Error.AccessDenied] Rejected send message"), "bluez",
     "the bluetooth group"),
    (FileNotFoundError(2, "No such file or directory"), "bluez",  # no system bus
     "/run/dbus/system_bus_socket"),
    (BleakError("[org.freedesktop.DBus.Error.ServiceUnknown] The name org.bluez was not "
                "provided by any .service files"), "bluez", "bluetoothd is not running"),
    (TimeoutError(), "timeout", "docs/guides/RASPBERRY_PI.md"),
    (RuntimeError("something else"), "error", ""),
])
def test_connection_failures_are_counted_by_kind_and_retried(sources, caplog, error, kind,
                                                             hint):
    caplog.set_level(logging.WARNING, logger="edge_agent.sources.ble.source")
    ble, sleep = FakeBle(), GatedSleep()
    strap = ble.add(STRAP)
    strap.connect_error = error
    source = started(sources, make_source(ble, [{"address": STRAP}], sleep=sleep))
    sleep.allow(2)
    assert wait_until(lambda: len(sleep.delays) == 3, WAIT)
    assert device_counters(source, STRAP)["failures"] == {kind: 3}
    strap.connect_error = None
    sleep.allow()
    wait_state(source, STRAP, "streaming")
    assert failure_kind(error) == kind
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and hint in warnings[0]


def test_a_device_without_the_service_is_retried(sources):
    ble, sleep = FakeBle(), GatedSleep()
    ble.add(STRAP, services=())  # no Heart Rate Measurement characteristic
    source = started(sources, make_source(ble, [{"address": STRAP}], sleep=sleep))
    assert wait_until(lambda: len(sleep.delays) == 1, WAIT)
    assert device_counters(source, STRAP)["failures"] == {"bluez": 1}
    # The failed session disconnected what it had connected.
    assert ble.peripherals[STRAP].client is None


# -- malformed notifications ------------------------------------------------------------------

def test_malformed_notifications_are_counted_by_reason_and_dropped(sources):
    ble = FakeBle()
    strap = ble.add(STRAP)
    source = started(sources, make_source(ble, [{"address": STRAP}]))
    wait_state(source, STRAP, "streaming")
    for bad in (b"", bytes([0x10, 70]), bytes([0x10, 70, 1, 2, 3]), bytes([0x00, 70, 1]),
                bytes([0x10, 70]) + bytes(600)):
        strap.notify(HEART_RATE_MEASUREMENT, bad)
    strap.notify(HEART_RATE_MEASUREMENT, hrm(66, contact=2))  # supported, no skin contact
    strap.notify(HEART_RATE_MEASUREMENT, hrm(64, contact=3))
    readings = take(source, 1)
    assert list(readings.column("heart_rate")) == [64.0]
    assert device_counters(source, STRAP)["dropped_notifications"] == {
        "empty": 1, "truncated": 1, "odd_rr": 1, "trailing_bytes": 1, "oversized": 1}
    assert source.rejected_rows == 5
    assert source.local_counters()["no_contact"] == 1
    assert device_counters(source, STRAP)["state"] == "streaming"  # the source goes on


def test_the_queue_is_bounded_and_drops_the_oldest(sources):
    ble, clock = FakeBle(), Clock(0.0)
    strap = ble.add(STRAP)
    source = started(sources, make_source(ble, [{"address": STRAP}], clock=clock,
                                          max_queued=100))
    wait_state(source, STRAP, "streaming")
    for i in range(30):  # 10 readings each: a heart rate and 9 RR intervals
        clock.now = float(i)
        strap.notify(HEART_RATE_MEASUREMENT, hrm(60 + i, rr=[1024] * 9))
    assert wait_until(lambda: source.local_counters()["dropped_readings"] == 200, WAIT)
    readings = source.poll(0.0)
    assert len(readings) == 100
    hr = readings.column("heart_rate")
    assert sorted(hr[np.isfinite(hr)]) == [float(60 + i) for i in range(20, 30)]


# -- Polar PMD accelerometer and several devices ---------------------------------------------

def test_several_devices_to_one_agent_with_distinct_fields(sources):
    ble, clock = FakeBle(), Clock(500.0)
    h10 = ble.add(H10, "Polar H10 1A2B3C4D",
                  services=(HEART_RATE_MEASUREMENT, PMD_CONTROL_POINT, PMD_DATA))
    h10.pmd_factor = 2.0
    arm = ble.add(STRAP, "arm band")
    source = started(sources, make_source(ble, [
        {"name": "Polar H10 1A2B3C4D", "profile": ["heart_rate", "polar_acc"],
         "acc_rate_hz": 100, "acc_range_g": 4},
        {"address": STRAP, "prefix": "arm_"}], clock=clock))
    assert set(source.fields) == {"heart_rate", "rr_interval", "energy", "accel_x", "accel_y",
                                  "accel_z", "arm_heart_rate", "arm_rr_interval", "arm_energy"}
    wait_state(source, "name='Polar H10 1A2B3C4D'", "streaming")
    wait_state(source, STRAP, "streaming")
    # The start request went to the control point, with a response asked for.
    assert h10.writes == [(PMD_CONTROL_POINT, start_acc_request(100, 4), True)]
    assert h10.writes[0][1] == bytes.fromhex("0202 00016400 01011000 02010400")
    h10.notify(HEART_RATE_MEASUREMENT, hrm(120))
    arm.notify(HEART_RATE_MEASUREMENT, hrm(118))
    h10.notify(PMD_DATA, acc_frame([(1000, 0, -500), (0, 250, 1000), (-1, 2, 3)]))
    readings = take(source, 5)
    assert list(readings.column("heart_rate")[np.isfinite(readings.column("heart_rate"))]) \
        == [120.0]
    arm_hr = readings.column("arm_heart_rate")
    assert list(arm_hr[np.isfinite(arm_hr)]) == [118.0]
    acc = np.isfinite(readings.column("accel_x"))
    # mG x factor 2 -> g; the last sample at the arrival, 1/100 s apart before it.
    np.testing.assert_allclose(readings.times[acc], [499.98, 499.99, 500.0])
    np.testing.assert_allclose(
        np.column_stack([readings.column(f"accel_{a}")[acc] for a in "xyz"]),
        [[2.0, 0.0, -1.0], [0.0, 0.5, 2.0], [-0.002, 0.004, 0.006]])
    assert np.isnan(readings.column("arm_heart_rate")[acc]).all()


def test_tilt_is_derived_from_the_polar_accelerometer(sources):
    ble = FakeBle()
    h10 = ble.add(H10, services=(PMD_CONTROL_POINT, PMD_DATA))
    source = started(sources, make_source(ble, [{"address": H10, "profile": "polar_acc"}],
                                          derive=["tilt"], field="roll"))
    wait_state(source, H10, "streaming")
    h10.notify(PMD_DATA, acc_frame([(0, 0, 1000)]))
    readings = take(source, 1)
    assert readings.column("roll")[0] == 0.0 and readings.column("pitch")[0] == 0.0


def test_refused_and_unsupported_pmd(sources):
    ble, sleep = FakeBle(), GatedSleep()
    h10 = ble.add(H10, services=(PMD_CONTROL_POINT, PMD_DATA))
    h10.pmd_status = 8  # invalid sample rate
    source = started(sources, make_source(ble, [{"address": H10, "profile": "polar_acc",
                                                 "acc_rate_hz": 33}], sleep=sleep,
                                          field="accel_x"))
    assert wait_until(lambda: len(sleep.delays) == 1, WAIT)
    assert device_counters(source, H10)["failures"] == {"refused": 1}
    h10.pmd_status = 6  # already streaming (from an earlier connection): fine
    sleep.allow()
    wait_state(source, H10, "streaming")
    compressed = bytes([2]) + bytes(8) + bytes([0x80]) + bytes(20)
    h10.notify(PMD_DATA, compressed)
    h10.notify(PMD_DATA, bytes([0]) + bytes(8) + bytes([0]) + bytes(3))  # ECG
    h10.notify(PMD_DATA, acc_frame([(1, 2, 3)]))
    take(source, 1)
    assert device_counters(source, H10)["dropped_notifications"] == {
        "compressed_frame": 1, "not_acc": 1}


# -- stopping ----------------------------------------------------------------------------------

def test_stop_while_waiting_to_reconnect_leaves_no_thread():
    ble = FakeBle()  # the device is never found; asyncio.sleep for real, hour-long waits
    config = ble_source_config([{"address": STRAP}],
                               reconnect={"initial_seconds": 3600, "max_seconds": 3600})
    source = BleSource(config.sources[0], client_factory=ble.client_factory, scanner=ble)
    source.start()
    thread = source._thread
    wait_state(source, STRAP, "waiting")
    assert returns_within(source.stop)  # it did not sit out the hour's back-off
    assert not thread.is_alive()
    assert device_counters(source, STRAP)["state"] == "stopped"
    source.stop()  # idempotent


def test_stop_while_connecting_and_while_streaming(sources):
    ble = FakeBle()
    stuck, strap = ble.add(H10), ble.add(STRAP)
    stuck.connect_hangs = True
    # One search or connection at a time: the strap first, then the stuck one holds it.
    source = make_source(ble, [{"address": STRAP}, {"address": H10, "prefix": "a_"}])
    source.start()
    thread = source._thread
    wait_state(source, STRAP, "streaming")
    wait_state(source, H10, "connecting")
    client = strap.client
    source.stop()
    assert not thread.is_alive()
    assert client.disconnects == 1  # the streaming device was disconnected
    assert device_counters(source, STRAP)["drops"] == 0  # a stop is no drop-out


def test_stop_before_start_and_twice():
    ble = FakeBle()
    source = make_source(ble, [{"address": STRAP}])
    source.stop()
    source.start()
    source.stop()
    source.stop()
    assert not source.running


def test_without_bleak_the_source_fails_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "bleak", None)  # import bleak raises ImportError
    source = build_source(ble_source_config([{"address": STRAP}]).sources[0], agent_id="w1")
    source.start()
    assert source.finished and "pip install 'edge-ldp[ble]'" in source.error
    assert not source.running


# -- configuration and the fleet ---------------------------------------------------------------

def config_error(devices, **settings) -> str:
    with pytest.raises(ConfigError) as caught:
        ble_source_config(devices, **settings)
    return str(caught.value)


def test_config_errors_name_the_key():
    assert "sources[0].devices[0]: set address or name" in config_error([{}])
    assert "sources[0].devices[0]: set address or name" in config_error(
        [{"address": STRAP, "name": "x"}])
    assert "sources[0].devices[0].address: must be a Bluetooth address" in config_error(
        [{"address": "C0:FF:EE"}])
    assert "sources[0].devices[0].profile[0]: must be one of" in config_error(
        [{"address": STRAP, "profile": "ecg"}])
    assert "two devices provide field 'heart_rate' (devices[0] and devices[1])" in \
        config_error([{"address": STRAP}, {"address": H10}])
    assert "the same device twice" in config_error(
        [{"address": STRAP, "prefix": "a_"}, {"address": STRAP.lower()}])
    assert "sources[0].reconnect: max_seconds: must be >= initial_seconds" in config_error(
        [{"address": STRAP}], reconnect={"initial_seconds": 10, "max_seconds": 5})
    assert "sources[0]: derive: 'tilt' needs accel_x" in config_error(
        [{"address": STRAP}], derive=["tilt"])
    assert "sources[0].devices[0].prefix: must be at most 32" in config_error(
        [{"address": STRAP, "prefix": "a b"}])
    assert "sources[0].adapter: must be an adapter name" in config_error(
        [{"address": STRAP}], adapter="usb0")
    # A channel on a field no device provides is caught like any other source's.
    with pytest.raises(ConfigError, match="has no field 'heart_rate'"):
        ble_source_config([{"address": STRAP, "prefix": "arm_"}])


def fleet_config(devices, assign="one_per_agent"):
    return ble_source_config(devices, assign=assign)


def test_a_fleet_gives_virtual_agent_i_device_i():
    devices = [{"address": f"C0:FF:EE:00:00:0{i}"} for i in range(3)]
    config = fleet_config(devices)
    check_fleet(config, 3)
    for i in range(3):
        source = fleet_sources(config, f"w1-{i}", i, 3)["ble"]
        assert isinstance(source, BleSource)
        assert [d.address for d in source.devices] == [f"C0:FF:EE:00:00:0{i}"]
        assert "heart_rate" in source.fields


def test_fleet_and_run_refuse_what_they_cannot_split():
    devices = [{"address": f"C0:FF:EE:00:00:0{i}"} for i in range(3)]
    with pytest.raises(ConfigError, match=r"sources\[0\].devices: virtual agent k takes "
                                          r"devices\[k\]: --count 4 needs 4 devices, the "
                                          r"source lists 3"):
        check_fleet(fleet_config(devices), 4)
    together = fleet_config([{"address": STRAP}, {"address": H10, "prefix": "b_"}],
                            assign="this_agent")
    with pytest.raises(ConfigError, match=r'sources\[0\].assign: must be "one_per_agent"'):
        check_fleet(together, 2)
    assert single_agent_problems(together) == []
    problems = single_agent_problems(fleet_config(devices))
    assert len(problems) == 1 and problems[0].startswith('sources[0].assign: "one_per_agent"')
    assert single_agent_problems(fleet_config(devices[:1])) == []
    # Devices of a fleet must provide the same fields (the channels are shared).
    with pytest.raises(ConfigError, match="every device provides the same fields"):
        fleet_config([{"address": STRAP}, {"address": H10, "prefix": "b_"}])
    # A one_per_agent source built for one agent refuses to start with several devices.
    source = build_source(fleet_config(devices).sources[0], agent_id="w1")
    source.start()
    assert source.finished and "one_per_agent" in source.error


# -- inside an agent core ------------------------------------------------------------------------

def test_an_agent_core_reports_heart_rate_and_keeps_device_state_local(tmp_path, sources):
    ble, clock = FakeBle(), Clock(20 * 86400.0)
    strap = ble.add(STRAP)
    config = parse_config(agent_config(
        state_dir=tmp_path, budget=100.0, sources=[{
            "name": "ble", "type": "ble", "devices": [{"address": STRAP}]}],
        channels=[{"name": "hr", "source": "ble", "kind": "linear", "field": "heart_rate",
                   "epsilon": 1.0, "domain": [30, 220], "unit": "bpm"}]))
    source = BleSource(config.sources[0], client_factory=ble.client_factory, scanner=ble,
                       sleep=GatedSleep(), clock=clock)
    store = StateStore(tmp_path / "state.sqlite")
    core = AgentCore(config, store, sources={"ble": source}, rng=np.random.default_rng(0))
    core.start()
    sources.append(source)
    wait_state(source, STRAP, "streaming")
    for bpm in (70, 71, 72):
        strap.notify(HEART_RATE_MEASUREMENT, hrm(bpm, rr=(900,)))
    strap.notify(HEART_RATE_MEASUREMENT, b"\x10\x46")  # truncated
    assert wait_until(lambda: len(source._queue) == 6 and source.rejected_rows == 1, WAIT)
    core.tick(clock.now + 1)
    sent = [json_message(p) for _, _, p, _ in store.pending(0, 100)]
    assert len(sent) == 1 and len(sent[0]["codes"]) == 3  # the three heart rates
    assert sent[0]["channel"] == "hr" and sent[0]["unit"] == "bpm"
    published = core.status()
    assert published["sources"]["ble"] == {"finished": False, "error": None}
    local = core.local_status()["sources"]["ble"]
    assert local["rejected_rows"] == 1
    assert local["devices"][STRAP]["state"] == "streaming"
    assert local["devices"][STRAP]["dropped_notifications"] == {"truncated": 1}
    # The RR rows have no heart rate: counted where channels count such rows.
    assert core.local_status()["channels"]["hr"]["non_finite_dropped"] == 3
    core.stop()
    assert not source.running
    store.close()


def json_message(payload: bytes) -> dict:
    import json
    return json.loads(payload)


def test_the_sample_configs_ble_example_is_valid():
    """The commented [[sources]] example of type ble in configs/agent.toml, uncommented,
    is a valid source whose devices' fields are distinct."""
    source = commented_source("ble")
    config = parse_config(agent_config(state_dir="/tmp/unused", sources=[source], channels=[
        {"name": name, "source": source["name"], "kind": "linear", "field": name,
         "epsilon": 1.0, "domain": [0, 250]}
        for name in ("heart_rate", "arm_heart_rate", "accel_x")]))
    ble = config.sources[0]
    assert ble.type == "ble" and len(ble.devices) == 2 and ble.reconnect.max_seconds == 60
    assert ble.devices[0].profile == ["heart_rate", "polar_acc"]
