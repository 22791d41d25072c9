"""An MPU-6050-class IMU on an I2C bus (Raspberry Pi and similar).

``start()`` opens the bus (smbus2, imported there so this module imports on
machines without it), wakes the device (PWR_MGMT_1 = 0) and starts a daemon
thread that reads the 14 bytes from ACCEL_XOUT_H at ``rate_hz``: accel x, y,
z, temperature, gyro x, y, z as big-endian signed 16-bit words.  The thread
keeps the raw bytes; ``poll`` decodes the batch with numpy:

* accel / 16384 -> g (the power-on +-2 g range),
* gyro / 131 -> deg/s (the power-on +-250 deg/s range),
* temperature / 340 + 36.53 -> degrees C.

A bus error (OSError) is counted in ``io_errors`` and retried at the next
sample (waking the device again, in case it was reset);
``MAX_CONSECUTIVE_FAILURES`` in a row fail the source.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from edge_agent.config import I2C_FIELDS, I2cSourceConfig
from edge_agent.readings import Readings
from edge_agent.sources.base import ThreadedSource
from edge_agent.sources.derive import apply_derive

PWR_MGMT_1 = 0x6B
ACCEL_XOUT_H = 0x3B
BLOCK_BYTES = 14
ACCEL_LSB_PER_G = 16384.0
GYRO_LSB_PER_DPS = 131.0
TEMP_LSB_PER_C = 340.0
TEMP_OFFSET_C = 36.53
MAX_CONSECUTIVE_FAILURES = 50
# Samples kept while the agent does not poll (the oldest go first).
MAX_BUFFERED_SAMPLES = 100_000


def decode_block(raw: np.ndarray) -> dict[str, np.ndarray]:
    """Fields from an (n, 14) array of register bytes (ACCEL_XOUT_H onwards)."""
    raw = np.ascontiguousarray(np.asarray(raw, dtype=np.int64) & 0xFF, dtype=np.uint8)
    words = raw.reshape(-1, BLOCK_BYTES).view(">i2").astype(np.float64)  # (n, 7)
    accel = words[:, 0:3] / ACCEL_LSB_PER_G
    gyro = words[:, 4:7] / GYRO_LSB_PER_DPS
    return {
        "accel_x": accel[:, 0], "accel_y": accel[:, 1], "accel_z": accel[:, 2],
        "gyro_x": gyro[:, 0], "gyro_y": gyro[:, 1], "gyro_z": gyro[:, 2],
        "temperature": words[:, 3] / TEMP_LSB_PER_C + TEMP_OFFSET_C,
    }


class I2cSource(ThreadedSource):
    def __init__(self, config: I2cSourceConfig, *, bus: Any | None = None):
        """``bus``: an object with write_byte_data / read_i2c_block_data (tests)."""
        super().__init__(config.name, derive=config.derive, base_fields=I2C_FIELDS)
        self.config = config
        self.address = config.address
        self.rate_hz = float(config.rate_hz)
        #: bus errors so far (each retried)
        self.io_errors = 0
        self._bus = bus
        self._owns_bus = False
        self._times: list[float] = []
        self._raw: list[list[int]] = []
        self._lock = threading.Lock()
        self._failure: str | None = None

    def origin(self) -> dict[str, object]:
        return {"bus": self.config.bus, "address": f"0x{self.address:02x}",
                "rate_hz": f"{self.rate_hz:g}"}

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        if self._bus is None and not self._open_bus():
            return
        try:
            self._wake()
        except OSError as exc:
            self.fail(f"i2c source {self.name!r}: no device answers at 0x{self.address:02x} "
                      f"on bus {self.config.bus}: {_reason(exc)}")
            self._close_bus()
            return
        self._start_reading(self._run, kind="i2c")

    def stop(self) -> None:
        self._stop_reading(join_seconds=2.0)
        self._close_bus()

    def _open_bus(self) -> bool:
        try:
            import smbus2
        except ImportError:
            self.fail(f"i2c source {self.name!r}: the smbus2 package is missing: "
                      "pip install smbus2")
            return False
        try:
            self._bus = smbus2.SMBus(self.config.bus)
        except OSError as exc:
            self.fail(f"i2c source {self.name!r}: cannot open /dev/i2c-{self.config.bus}: "
                      f"{_reason(exc)}")
            return False
        self._owns_bus = True
        return True

    def _close_bus(self) -> None:
        if self._owns_bus and self._bus is not None:
            self._bus.close()
            self._bus = None
            self._owns_bus = False

    def _wake(self) -> None:
        self._bus.write_byte_data(self.address, PWR_MGMT_1, 0)

    # -- the sampling thread ---------------------------------------------------------
    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        due = time.monotonic()
        failures = 0
        while not self._stopping.is_set():
            try:
                if failures:
                    self._wake()  # the device may have been reset (and sleeps again)
                block = self._bus.read_i2c_block_data(self.address, ACCEL_XOUT_H, BLOCK_BYTES)
                if len(block) != BLOCK_BYTES:
                    raise OSError(f"short read ({len(block)} of {BLOCK_BYTES} bytes)")
            except OSError as exc:
                self.io_errors += 1
                failures += 1
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    self._failure = (f"i2c read failed: {failures} attempts in a row "
                                     f"({_reason(exc)})")
                    return
            else:
                failures = 0
                self._keep(time.time(), list(block))
            due += period
            delay = due - time.monotonic()
            if delay < -period:  # fell behind (a slow bus): resume the rate, do not burst
                due = time.monotonic()
            self._stopping.wait(max(0.0, delay))

    def _keep(self, timestamp: float, block: list[int]) -> None:
        with self._lock:
            if len(self._times) >= MAX_BUFFERED_SAMPLES:
                del self._times[0], self._raw[0]
            self._times.append(timestamp)
            self._raw.append(block)

    # -- polling -----------------------------------------------------------------------
    def poll(self, now: float) -> Readings:
        with self._lock:
            times, self._times = self._times, []
            raw, self._raw = self._raw, []
        if times:
            readings = Readings(times, decode_block(np.asarray(raw)))
            readings = apply_derive(readings, self.derive)
        else:
            readings = Readings.empty(self.fields)
        if self._failure is not None and not self.finished:
            self.fail(self._failure)
        return readings


def _reason(exc: OSError) -> str:
    """An OSError's reason without its arguments (no register contents)."""
    return exc.strerror or (str(exc.args[0]) if exc.args else type(exc).__name__)
