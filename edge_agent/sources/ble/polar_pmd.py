"""Polar Measurement Data (PMD): the accelerometer stream, byte for byte (pure functions).

The specification read is Polar's public "Polar Measurement Data" document
(polar-ble-sdk, technical_documentation/online_measurement.pdf, version 1.0,
August 2024; it calls itself a description of the current status, "not any kind
of official specification").  What is implemented, with the document's tables:

* UUIDs (Table 3): PMD service FB005C80-02E7-F387-1CAD-8ACD2D8DF0C8, PMD Control
  Point ...C81, PMD Data MTU Characteristic ...C82 (notifications).
* Start (sections 1 and 3, Tables 1, 2, 4, 5): a write to the control point of
  ``[0x02 (request measurement start), (recording type << 7) | measurement type]``
  followed by the serialized settings, each ``[setting type, count = 1, value]``
  with the value little-endian in the size Table 5 gives: sample rate (type 0,
  uint16, Hz), resolution (type 1, uint16, bits), range (type 2, uint16, ±G).
  Online recording (0) of ACC (2): ``02 02 00 01 <rate> 01 01 10 00 02 01 <range>``.
* The device answers on the control point (an indication):
  ``[0xF0, op code, measurement type, status, more, parameters...]``; status 0
  is success, and the parameters are settings in the same serialization (a
  conversion factor, type 5, IEEE 754 float32, may be among them).  The status
  codes' names are the SDK's (PmdControlPointResponse); the document does not
  list them.
* Data frames (section 4.1, Table 6, 4.2.9): ``data[0] & 0x3F`` measurement
  type, ``data[1:9]`` timestamp (uint64, ns since 2000-01-01 UTC; little-endian
  as every PMD field), ``data[9]`` frame type (bit 7: compressed, bits 0-6:
  type), samples from ``data[10]`` to the end.

Supported frames: uncompressed ACC frames of type 1 (three int16 per sample,
Table 8) and type 2 (three signed 24-bit values per sample, Table 9), in mG,
multiplied by the conversion factor the start response gave (1 without one:
section 3 says the factor applies to every sample) and returned in g.  The Polar
H10 sends type 1 at the 16-bit resolution this module asks for.  Refused and
counted, never guessed:

* compressed (delta) frames ("compressed_frame"): section 4.3.2-4.3.3 do not say
  precisely enough how the delta bits are laid out to decode them byte for byte
  (devices that stream only compressed ACC, such as the Verity Sense, are not
  supported);
* uncompressed type 0 ("unsupported_frame"): Table 7 says its unit is G on the
  Verity Sense and mG on other devices, so a value cannot be read without
  knowing the model; any other frame type likewise;
* frames of another measurement ("not_acc"), shorter than the 10-octet header
  ("truncated"), without samples ("no_samples"), ending inside a sample
  ("partial_sample"), or longer than ``max_length`` ("oversized").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from edge_agent.sources.ble.gatt import MAX_ATTRIBUTE_BYTES, MalformedNotification

PMD_SERVICE = "fb005c80-02e7-f387-1cad-8acd2d8df0c8"
PMD_CONTROL_POINT = "fb005c81-02e7-f387-1cad-8acd2d8df0c8"
PMD_DATA = "fb005c82-02e7-f387-1cad-8acd2d8df0c8"

# Control point op codes (Table 4) and the response's first octet.
OP_GET_SETTINGS = 0x01
OP_START = 0x02
OP_STOP = 0x03
RESPONSE = 0xF0
# Measurement types (Table 2), recording types (Table 1).
MEASUREMENT_ACC = 2
RECORDING_ONLINE = 0
MEASUREMENT_TYPE_MASK = 0x3F
# Settings (Table 5): type -> value size in octets.
SETTING_SAMPLE_RATE = 0
SETTING_RESOLUTION = 1
SETTING_RANGE = 2
SETTING_CHANNELS = 4
SETTING_FACTOR = 5
SETTING_SIZES = {SETTING_SAMPLE_RATE: 2, SETTING_RESOLUTION: 2, SETTING_RANGE: 2,
                 SETTING_CHANNELS: 1, SETTING_FACTOR: 4}
ACC_RESOLUTION_BITS = 16
# Data frames (Table 6).
HEADER_BYTES = 10
COMPRESSED = 0x80
FRAME_TYPE_MASK = 0x7F
# Uncompressed ACC frame type -> octets per axis value (Tables 8 and 9).
ACC_FRAME_VALUE_BYTES = {1: 2, 2: 3}
MILLI_G_PER_G = 1000.0

REASONS = ("oversized", "truncated", "not_acc", "compressed_frame", "unsupported_frame",
           "no_samples", "partial_sample")
# Status codes of a control point response, by the SDK's names.
STATUS_SUCCESS = 0
STATUS_ALREADY_IN_STATE = 6
STATUS_NAMES = {
    0: "success", 1: "invalid op code", 2: "invalid measurement type", 3: "not supported",
    4: "invalid length", 5: "invalid parameter", 6: "already in state",
    7: "invalid resolution", 8: "invalid sample rate", 9: "invalid range", 10: "invalid MTU",
    11: "invalid number of channels", 12: "invalid state", 13: "device in charger",
    14: "disk full",
}


def start_acc_request(sample_rate_hz: int, range_g: int) -> bytes:
    """The control point write that starts the online ACC stream (16-bit resolution)."""
    for name, value in (("sample rate", sample_rate_hz), ("range", range_g)):
        if not 0 < value <= 0xFFFF:
            raise ValueError(f"{name} must fit a uint16 above 0, got {value}")
    settings = b"".join(struct.pack("<BBH", kind, 1, value) for kind, value in (
        (SETTING_SAMPLE_RATE, sample_rate_hz), (SETTING_RESOLUTION, ACC_RESOLUTION_BITS),
        (SETTING_RANGE, range_g)))
    return bytes([OP_START, (RECORDING_ONLINE << 7) | MEASUREMENT_ACC]) + settings


def stop_request(measurement: int = MEASUREMENT_ACC) -> bytes:
    return bytes([OP_STOP, measurement])


@dataclass(frozen=True)
class ControlPointResponse:
    op_code: int
    measurement: int
    status: int
    more: bool
    settings: dict[int, list[int | float]]

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, f"status {self.status}")

    @property
    def factor(self) -> float | None:
        values = self.settings.get(SETTING_FACTOR)
        return float(values[0]) if values else None


def parse_control_point_response(value: bytes | bytearray | memoryview) -> ControlPointResponse:
    """A control point indication, or ``MalformedNotification``.  Settings after an
    unknown setting type (whose size is unknown) are not read."""
    data = bytes(value)
    if len(data) > MAX_ATTRIBUTE_BYTES:
        raise MalformedNotification("oversized")
    if len(data) < 4:
        raise MalformedNotification("truncated", f"{len(data)} octets, a response has 4 "
                                                 f"at least")
    if data[0] != RESPONSE:
        raise MalformedNotification("not_a_response", f"first octet 0x{data[0]:02x}")
    status = data[3]
    more = status == STATUS_SUCCESS and len(data) > 4 and data[4] != 0
    settings = parse_settings(data[5:]) if status == STATUS_SUCCESS else {}
    return ControlPointResponse(op_code=data[1], measurement=data[2], status=status, more=more,
                                settings=settings)


def parse_settings(data: bytes) -> dict[int, list[int | float]]:
    """Serialized settings (``type, count, count x value``) up to the first unknown type or
    the first incomplete one."""
    settings: dict[int, list[int | float]] = {}
    offset = 0
    while offset + 2 <= len(data):
        kind, count = data[offset], data[offset + 1]
        size = SETTING_SIZES.get(kind)
        if size is None or offset + 2 + count * size > len(data):
            break
        offset += 2
        values: list[int | float] = []
        for _ in range(count):
            raw = data[offset:offset + size]
            values.append(struct.unpack("<f", raw)[0] if kind == SETTING_FACTOR
                          else int.from_bytes(raw, "little"))
            offset += size
        settings[kind] = values
    return settings


@dataclass(frozen=True)
class AccFrame:
    timestamp_ns: int  # device time of the frame, ns since 2000-01-01 UTC
    frame_type: int
    samples: np.ndarray  # (n, 3) float64: x, y, z in g, oldest first


def parse_acc_frame(value: bytes | bytearray | memoryview, *, factor: float = 1.0,
                    max_length: int = MAX_ATTRIBUTE_BYTES) -> AccFrame:
    """One PMD data notification carrying accelerometer samples, or
    ``MalformedNotification`` saying why it is refused."""
    data = bytes(value)
    if len(data) > max_length:
        raise MalformedNotification("oversized", f"{len(data)} octets, at most {max_length}")
    if len(data) < HEADER_BYTES:
        raise MalformedNotification("truncated", f"{len(data)} octets, the header has "
                                                 f"{HEADER_BYTES}")
    measurement = data[0] & MEASUREMENT_TYPE_MASK
    if measurement != MEASUREMENT_ACC:
        raise MalformedNotification("not_acc", f"measurement type {measurement}")
    frame_byte = data[9]
    if frame_byte & COMPRESSED:
        raise MalformedNotification("compressed_frame", f"frame type 0x{frame_byte:02x}")
    frame_type = frame_byte & FRAME_TYPE_MASK
    size = ACC_FRAME_VALUE_BYTES.get(frame_type)
    if size is None:
        raise MalformedNotification("unsupported_frame", f"frame type {frame_type}")
    content = data[HEADER_BYTES:]
    if not content:
        raise MalformedNotification("no_samples")
    if len(content) % (3 * size):
        raise MalformedNotification("partial_sample", f"{len(content)} octets of samples, "
                                                      f"{3 * size} per sample")
    raw = np.frombuffer(content, dtype=np.uint8).reshape(-1, 3, size).astype(np.int64)
    values = np.zeros(raw.shape[:2], dtype=np.int64)
    for i in range(size):  # little-endian
        values |= raw[:, :, i] << (8 * i)
    sign = 1 << (8 * size - 1)
    values = (values ^ sign) - sign  # two's complement
    return AccFrame(timestamp_ns=int.from_bytes(data[1:9], "little"), frame_type=frame_type,
                    samples=values.astype(np.float64) * (factor / MILLI_G_PER_G))
