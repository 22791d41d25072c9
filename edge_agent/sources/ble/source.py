"""Wearables over Bluetooth LE: GATT notifications through BlueZ, with bleak.

``start()`` imports bleak (``pip install 'edge-ldp[ble]'``; imported there so that
this module imports without it) and starts a daemon thread running an asyncio
loop: one task per device, each

1. searching for the device (``BleakScanner.find_device_by_address`` or
   ``find_device_by_name``, ``scan_seconds`` at most),
2. connecting (``BleakClient``, ``connect_seconds`` at most) and subscribing to
   its profiles' notifications (``start_notify``; for ``polar_acc`` also the
   start-measurement write to the PMD control point, edge_agent.sources.ble.polar_pmd),
3. streaming until the connection drops (bleak's disconnected callback) or the
   source stops,

and starting again after a wait: exponential back-off from
``reconnect.initial_seconds`` doubling to ``reconnect.max_seconds``, shortened by
a random share of up to ``reconnect.jitter``; a connection that streamed resets
it.  One search or connection attempt at a time (BlueZ refuses concurrent ones
on an adapter with "InProgress").  Nothing a device or BlueZ does ends the
source: a failure is counted by kind (not_found, timeout, refused, bluez,
no_adapter, error), logged once per streak of failures (and once when the device
streams again), and retried.  Only a missing bleak fails the source.

Notifications are parsed on the loop's thread (edge_agent.sources.ble.heart_rate and
polar_pmd) and their readings queued with their timestamps: the arrival time
for a heart rate and the energy expended; for the RR intervals of one
notification, the last one ends at the arrival and each earlier one where the
next began (``heart_rate.rr_end_times``); for the accelerometer samples of a
frame, the last one at the arrival and each earlier one 1 / ``acc_rate_hz``
before the next.  Each reading is a row of its own (a heart rate row has no RR
interval: channels count a field a row lacks in ``non_finite_dropped``).  A
measurement whose sensor reports no skin contact is dropped (counted as
``no_contact``).  At most ``max_queued`` readings wait for ``poll``; past that
the oldest are dropped (counted).  A malformed notification is dropped and
counted by reason (also in ``rejected_rows``).

Every counter and each device's connection state are local (``local_counters``:
the state directory's status.json, never published): whether a wearable is in
range tells where its wearer is, and malformed readings depend on what arrived.
Logs name the device (its configured address or name) and what went wrong,
never a value.

In a fleet (``assign = "one_per_agent"``, edge_agent.fleet) each virtual agent's
source is given its one device (``devices``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from edge_agent.config import BleDeviceConfig, BleSourceConfig
from edge_agent.readings import Readings
from edge_agent.sources.base import ThreadedSource, keep_newest
from edge_agent.sources.ble.gatt import MalformedNotification
from edge_agent.sources.ble.heart_rate import (
    HEART_RATE_MEASUREMENT,
    parse_heart_rate_measurement,
    rr_end_times,
)
from edge_agent.sources.ble.polar_pmd import (
    MEASUREMENT_ACC,
    OP_START,
    PMD_CONTROL_POINT,
    PMD_DATA,
    STATUS_ALREADY_IN_STATE,
    STATUS_SUCCESS,
    parse_acc_frame,
    parse_control_point_response,
    start_acc_request,
)
from edge_agent.sources.derive import apply_derive
from edge_agent.sources.jsonl import Record, records_to_readings

log = logging.getLogger(__name__)

# How long the thread may take to disconnect every device when the source stops.
STOP_SECONDS = 10.0
# A disconnect that BlueZ does not confirm within this is given up (the device is gone).
DISCONNECT_SECONDS = 5.0
# Connection states in the local status.
STATES = ("idle", "searching", "connecting", "subscribing", "streaming", "waiting", "stopped")


class DeviceNotFound(Exception):
    """The device did not advertise within ``scan_seconds``."""


class ProfileRefused(Exception):
    """The device answered a profile's start request with an error."""


def backoff_seconds(attempt: int, *, initial: float, maximum: float, jitter: float,
                    rng: random.Random) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): ``initial * 2**(attempt - 1)`` up to
    ``maximum``, shortened by a random share of up to ``jitter``."""
    base = min(maximum, initial * 2.0 ** min(attempt - 1, 64))
    return base * (1.0 - jitter * rng.random())


def failure_kind(exc: BaseException) -> str:
    """A failed attempt's kind, as counted in the local status."""
    if isinstance(exc, DeviceNotFound) or type(exc).__name__ == "BleakDeviceNotFoundError":
        return "not_found"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, ProfileRefused):
        return "refused"
    if type(exc).__name__ == "BleakBluetoothNotAvailableError":
        return "no_adapter"
    if type(exc).__name__.startswith("Bleak") or isinstance(exc, OSError | EOFError):
        return "bluez"  # BlueZ or D-Bus said no (permission, no bus, in progress ...)
    return "error"


def _reason(exc: BaseException) -> str:
    """An exception in a few words for the log (bleak's and D-Bus's messages name the
    failure, never a reading)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _hint(kind: str, exc: BaseException) -> str:
    """What to check, for the log (docs/guides/RASPBERRY_PI.md has the troubleshooting list)."""
    text = str(exc)
    if kind == "not_found":
        return " (is it on, in range, and not connected to another device such as a phone?)"
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return " (no D-Bus system bus at /run/dbus/system_bus_socket: is dbus running?)"
    if isinstance(exc, PermissionError) or "AccessDenied" in text:
        return (" (BlueZ's D-Bus policy refuses this user: the bluetooth group, "
                "systemd/edge-agent-ble.conf)")
    if "ServiceUnknown" in text or "org.bluez was not provided" in text:
        return " (bluetoothd is not running: systemctl status bluetooth)"
    if kind == "no_adapter":
        return " (no powered Bluetooth adapter: bluetoothctl power on)"
    if kind in ("bluez", "timeout"):
        return " (docs/guides/RASPBERRY_PI.md, Wearables over Bluetooth)"
    return ""


class DeviceLink:
    """One device's connection state and counters (updated on the loop's thread)."""

    def __init__(self, device: BleDeviceConfig):
        self.device = device
        self.state = "idle"
        self.connections = 0  # times it streamed
        self.drops = 0  # connections that ended while the source was running
        self.failures: Counter[str] = Counter()  # failed attempts by kind
        self.dropped: Counter[str] = Counter()  # notifications dropped, by reason
        self.streak = 0  # failed attempts since it last streamed
        self.acc_factor = 1.0  # the PMD conversion factor the device last gave

    def counters(self) -> dict[str, object]:
        return {"state": self.state, "connections": self.connections, "drops": self.drops,
                "failures": dict(self.failures), "dropped_notifications": dict(self.dropped),
                "failed_attempts_in_a_row": self.streak}


class BleSource(ThreadedSource):
    def __init__(self, config: BleSourceConfig, *,
                 devices: Sequence[BleDeviceConfig] | None = None,
                 client_factory: Callable[..., Any] | None = None, scanner: Any = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None):
        """``devices``: the ones this source reads (a fleet's virtual agent gets one;
        default: the config's).  ``client_factory``/``scanner``: bleak's ``BleakClient``
        and ``BleakScanner`` unless given (tests); ``sleep``: the back-off wait (default
        ``asyncio.sleep``); ``clock``: the readings' timestamps (default ``time.time``)."""
        self.devices = tuple(config.devices if devices is None else devices)
        super().__init__(config.name, derive=config.derive,
                         base_fields=[n for d in self.devices for n in d.field_names])
        self.config = config
        self._given_devices = devices is not None
        self._client_factory = client_factory
        self._scanner = scanner
        self._sleep = sleep or asyncio.sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self.links = [DeviceLink(device) for device in self.devices]
        #: readings dropped because the agent did not poll in time
        self.dropped_readings = 0
        #: measurements dropped because the sensor reported no skin contact
        self.no_contact = 0
        self._queue: deque[Record] = deque(maxlen=config.max_queued)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._failure: str | None = None

    def origin(self) -> dict[str, object]:
        return {"devices": ", ".join(d.label for d in self.devices)}

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None or self.finished:
            return
        if self.config.assign == "one_per_agent" and not self._given_devices \
                and len(self.devices) > 1:
            self.fail(f"ble source {self.name!r}: assign = \"one_per_agent\" gives each "
                      f"virtual agent of `edge-agent fleet --count {len(self.devices)}` one "
                      f"of its {len(self.devices)} devices; one agent takes one device")
            return
        if self._client_factory is None or self._scanner is None:
            try:
                import bleak
            except ImportError:
                self.fail(f"ble source {self.name!r}: the bleak package is missing: "
                          "pip install 'edge-ldp[ble]'")
                return
            self._client_factory = self._client_factory or bleak.BleakClient
            self._scanner = self._scanner or bleak.BleakScanner
        self._start_reading(self._run, kind="ble")

    def stop(self) -> None:
        self._stopping.set()
        loop, event = self._loop, self._stop_event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has already closed
                pass
        self._stop_reading(join_seconds=STOP_SECONDS)

    @property
    def running(self) -> bool:
        """Whether its thread is alive (tests: nothing outlives ``stop``)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    # -- the loop's thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # a bug here must not pass silently
            self._failure = f"ble source {self.name!r}: {_reason(exc)}"
            log.exception("ble source %s: its thread failed", self.name)
        finally:
            for link in self.links:
                link.state = "stopped"

    async def _main(self) -> None:
        self._stop_event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stopping.is_set():  # stop() ran before the loop existed
            return
        adapter_lock = asyncio.Lock()
        tasks = [asyncio.create_task(self._keep_connected(link, adapter_lock),
                                     name=f"ble-{link.device.label}") for link in self.links]
        await self._stop_event.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep_connected(self, link: DeviceLink, adapter_lock: asyncio.Lock) -> None:
        attempt = 0
        while not self._stopping.is_set():
            streamed = False
            try:
                streamed = await self._session(link, adapter_lock)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever BlueZ or the device does: retry
                self._failed(link, exc)
            if self._stopping.is_set():
                return
            attempt = 1 if streamed else attempt + 1
            link.state = "waiting"
            reconnect = self.config.reconnect
            await self._sleep(backoff_seconds(attempt, initial=reconnect.initial_seconds,
                                              maximum=reconnect.max_seconds,
                                              jitter=reconnect.jitter, rng=self._rng))

    async def _session(self, link: DeviceLink, adapter_lock: asyncio.Lock) -> bool:
        """Find, connect, subscribe and stream until the connection ends; whether it
        streamed.  Raises what went wrong before it streamed."""
        config, device = self.config, link.device
        disconnected = asyncio.Event()
        client = None
        try:
            async with adapter_lock:
                link.state = "searching"
                # bleak ends the search after scan_seconds; the margin is for a BlueZ that
                # does not answer at all (the adapter lock would be held for ever).
                found = await asyncio.wait_for(self._find(device),
                                               config.scan_seconds + DISCONNECT_SECONDS)
                if found is None:
                    raise DeviceNotFound(f"it did not advertise within {config.scan_seconds:g} s")
                link.state = "connecting"
                options: dict[str, Any] = {"timeout": config.connect_seconds}
                if config.adapter:
                    options["bluez"] = {"adapter": config.adapter}
                client = self._client_factory(
                    found, disconnected_callback=lambda _client: disconnected.set(), **options)
                await asyncio.wait_for(client.connect(), config.connect_seconds)
            link.state = "subscribing"
            await asyncio.wait_for(self._subscribe(client, link), config.connect_seconds)
            link.state = "streaming"
            link.connections += 1
            if link.streak:
                log.info("ble source %s: device %s streams again (after %d failed attempts)",
                         self.name, device.label, link.streak)
            else:
                log.info("ble source %s: device %s connected", self.name, device.label)
            link.streak = 0
            await self._until_stopped_or(disconnected)
            if not self._stopping.is_set():
                link.drops += 1
                log.info("ble source %s: device %s disconnected; reconnecting", self.name,
                         device.label)
            return True
        finally:
            if client is not None:
                await self._disconnect(client)

    async def _find(self, device: BleDeviceConfig):
        options: dict[str, Any] = {"timeout": self.config.scan_seconds}
        if self.config.adapter:
            options["bluez"] = {"adapter": self.config.adapter}
        if device.address is not None:
            return await self._scanner.find_device_by_address(device.address, **options)
        return await self._scanner.find_device_by_name(device.name, **options)

    async def _until_stopped_or(self, disconnected: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(disconnected.wait()),
                 asyncio.ensure_future(self._stop_event.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    @staticmethod
    async def _disconnect(client) -> None:
        """Disconnect (BlueZ keeps a connection its client did not end), also when the
        source stops in the middle of it."""
        try:
            await asyncio.wait_for(client.disconnect(), DISCONNECT_SECONDS)
        except asyncio.CancelledError:
            try:  # the stop came first: finish the disconnect, then stop
                await asyncio.wait_for(client.disconnect(), DISCONNECT_SECONDS)
            except Exception:
                pass
            raise
        except Exception:  # gone already, or BlueZ does not answer: nothing to release
            pass

    def _failed(self, link: DeviceLink, exc: Exception) -> None:
        kind = failure_kind(exc)
        link.failures[kind] += 1
        link.streak += 1
        if link.streak == 1:
            log.warning("ble source %s: device %s: %s%s; retrying with back-off (logged "
                        "again when it streams)", self.name, link.device.label,
                        _reason(exc), _hint(kind, exc))
        else:
            log.debug("ble source %s: device %s: attempt %d failed: %s", self.name,
                      link.device.label, link.streak, _reason(exc))

    # -- profiles ----------------------------------------------------------------------
    async def _subscribe(self, client, link: DeviceLink) -> None:
        for profile in link.device.profile:
            if profile == "heart_rate":
                await client.start_notify(
                    HEART_RATE_MEASUREMENT,
                    lambda _char, data, link=link: self._on_heart_rate(link, data))
            elif profile == "polar_acc":
                await self._start_polar_acc(client, link)

    async def _start_polar_acc(self, client, link: DeviceLink) -> None:
        """Indications on the control point, notifications on PMD data, then the start
        request; waits for the device's answer to it."""
        responses: asyncio.Queue = asyncio.Queue()

        def on_control(_char, data) -> None:
            try:
                responses.put_nowait(parse_control_point_response(data))
            except MalformedNotification as exc:
                self._dropped(link, f"control_{exc.reason}")

        device = link.device
        await client.start_notify(PMD_CONTROL_POINT, on_control)
        await client.start_notify(PMD_DATA,
                                  lambda _char, data, link=link: self._on_acc(link, data))
        await client.write_gatt_char(
            PMD_CONTROL_POINT, start_acc_request(device.acc_rate_hz, device.acc_range_g),
            response=True)
        while True:  # the answer to our request (others, e.g. earlier ones, are skipped)
            answer = await responses.get()
            if answer.op_code == OP_START and answer.measurement == MEASUREMENT_ACC:
                break
        if answer.status == STATUS_SUCCESS:
            factor = answer.factor
            link.acc_factor = factor if factor is not None and math.isfinite(factor) \
                and factor > 0 else 1.0
        elif answer.status != STATUS_ALREADY_IN_STATE:  # already streaming: keep its factor
            raise ProfileRefused(f"the device refused to start the accelerometer at "
                                 f"{device.acc_rate_hz} Hz, ±{device.acc_range_g} g: "
                                 f"{answer.status_name}")

    # -- notifications (the loop's thread) -----------------------------------------
    def _on_heart_rate(self, link: DeviceLink, data) -> None:
        arrival = self._clock()
        try:
            measurement = parse_heart_rate_measurement(data)
        except MalformedNotification as exc:
            self._dropped(link, exc.reason)
            return
        if measurement.contact is False:
            self.no_contact += 1
            return
        prefix = link.device.prefix
        fields: dict[str, float | str] = {f"{prefix}heart_rate": float(measurement.heart_rate)}
        if measurement.energy_kj is not None:
            fields[f"{prefix}energy"] = float(measurement.energy_kj)
        records: list[Record] = [(arrival, fields)]
        rr_name = f"{prefix}rr_interval"
        records += [(end, {rr_name: interval}) for end, interval in
                    zip(rr_end_times(arrival, measurement.rr_intervals),
                        measurement.rr_intervals)]
        self._keep(records)

    def _on_acc(self, link: DeviceLink, data) -> None:
        arrival = self._clock()
        try:
            frame = parse_acc_frame(data, factor=link.acc_factor)
        except MalformedNotification as exc:
            self._dropped(link, exc.reason)
            return
        prefix, period = link.device.prefix, 1.0 / link.device.acc_rate_hz
        names = (f"{prefix}accel_x", f"{prefix}accel_y", f"{prefix}accel_z")
        count = len(frame.samples)
        self._keep([(arrival - (count - 1 - i) * period, dict(zip(names, map(float, sample))))
                    for i, sample in enumerate(frame.samples)])

    def _dropped(self, link: DeviceLink, reason: str) -> None:
        link.dropped[reason] += 1
        self.rejected_rows += 1

    def _keep(self, records: list[Record]) -> None:
        with self._lock:
            self.dropped_readings += keep_newest(self._queue, records)

    # -- polling -----------------------------------------------------------------------
    def poll(self, now: float) -> Readings:
        with self._lock:
            records, self._queue = self._queue, deque(maxlen=self._queue.maxlen)
        readings = apply_derive(records_to_readings(records), self.derive) if records \
            else Readings.empty(self.fields)
        if self._failure is not None and not self.finished:
            self.fail(self._failure)
        return readings

    def local_counters(self) -> dict[str, object]:
        return {"dropped_readings": self.dropped_readings, "no_contact": self.no_contact,
                "devices": {link.device.label: link.counters() for link in self.links}}
