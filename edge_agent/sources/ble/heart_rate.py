"""The Heart Rate Measurement characteristic, parsed byte for byte (a pure function).

Bluetooth SIG Heart Rate Service (HRS 1.0, service 0x180D), Heart Rate Measurement
characteristic 0x2A37, notified by the sensor.  Its value, little-endian:

======  ===========================  ==================================================
octets  field                        present
======  ===========================  ==================================================
1       Flags                        always
1 or 2  Heart Rate Measurement Value always: uint8, or uint16 when flags bit 0 is set
2       Energy Expended (kJ, uint16) when flags bit 3 is set
2 x n   RR-Interval (1/1024 s each)  when flags bit 4 is set: n >= 1, the rest of the
                                     value, oldest first
======  ===========================  ==================================================

Flags: bit 0 Heart Rate Value Format (0: uint8, 1: uint16); bits 1-2 Sensor
Contact Status (bit 2: the feature is supported, bit 1: contact detected; 0b00
and 0b01 mean not supported, 0b10 supported but no contact, 0b11 contact);
bit 3 Energy Expended Status; bit 4 RR-Interval present; bits 5-7 reserved for
future use.

Choices where the specification leaves room (counted, never raised past the
source):

* Reserved flag bits (5-7) are ignored, as the Core Specification asks of a
  receiver for fields reserved for future use: the value is parsed by the
  bits it defines and ``reserved_flags`` tells which reserved bits were set.
* A value longer than its flags account for is malformed ("trailing_bytes")
  unless RR-Intervals are present (they take the rest of the value); an odd
  number of RR-Interval octets is malformed ("odd_rr"), as is a value whose
  flags ask for more octets than it has ("truncated", one RR-Interval at least
  when bit 4 is set), an empty value ("empty") and one longer than
  ``max_length`` ("oversized", by default the longest attribute value:
  ``gatt.MAX_ATTRIBUTE_BYTES``).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.sources.ble.gatt import MAX_ATTRIBUTE_BYTES, MalformedNotification, sig_uuid

HEART_RATE_SERVICE = sig_uuid(0x180D)
HEART_RATE_MEASUREMENT = sig_uuid(0x2A37)

FLAG_VALUE_UINT16 = 0x01
FLAG_CONTACT_DETECTED = 0x02
FLAG_CONTACT_SUPPORTED = 0x04
FLAG_ENERGY_EXPENDED = 0x08
FLAG_RR_INTERVALS = 0x10
FLAGS_RESERVED = 0xE0
# RR-Interval resolution: 1/1024 second.
RR_UNITS_PER_SECOND = 1024

REASONS = ("oversized", "empty", "truncated", "odd_rr", "trailing_bytes")


@dataclass(frozen=True)
class HeartRateMeasurement:
    heart_rate: int  # beats per minute
    contact: bool | None  # None: the sensor does not report skin contact
    energy_kj: int | None  # cumulative energy expended, when the value carries it
    rr_intervals: tuple[float, ...]  # seconds, oldest first
    reserved_flags: int = 0  # the reserved flag bits that were set (ignored)


def parse_heart_rate_measurement(value: bytes | bytearray | memoryview, *,
                                 max_length: int = MAX_ATTRIBUTE_BYTES) -> HeartRateMeasurement:
    """One notification's value, or ``MalformedNotification`` saying why not."""
    data = bytes(value)
    if len(data) > max_length:
        raise MalformedNotification("oversized", f"{len(data)} octets, at most {max_length}")
    if not data:
        raise MalformedNotification("empty")
    flags = data[0]
    value_size = 2 if flags & FLAG_VALUE_UINT16 else 1
    energy = bool(flags & FLAG_ENERGY_EXPENDED)
    has_rr = bool(flags & FLAG_RR_INTERVALS)
    needed = 1 + value_size + (2 if energy else 0) + (2 if has_rr else 0)
    if len(data) < needed:
        raise MalformedNotification("truncated", f"{len(data)} octets, the flags need "
                                                 f"{needed}")
    offset = 1
    heart_rate = int.from_bytes(data[offset:offset + value_size], "little")
    offset += value_size
    energy_kj = None
    if energy:
        energy_kj = int.from_bytes(data[offset:offset + 2], "little")
        offset += 2
    rest = data[offset:]
    if not has_rr and rest:
        raise MalformedNotification("trailing_bytes", f"{len(rest)} octets after the fields "
                                                      f"the flags announce")
    if len(rest) % 2:
        raise MalformedNotification("odd_rr", f"{len(rest)} RR-Interval octets")
    rr = tuple(int.from_bytes(rest[i:i + 2], "little") / RR_UNITS_PER_SECOND
               for i in range(0, len(rest), 2))
    contact_bits = flags & (FLAG_CONTACT_SUPPORTED | FLAG_CONTACT_DETECTED)
    contact = None if not contact_bits & FLAG_CONTACT_SUPPORTED else \
        bool(contact_bits & FLAG_CONTACT_DETECTED)
    return HeartRateMeasurement(heart_rate=heart_rate, contact=contact, energy_kj=energy_kj,
                                rr_intervals=rr, reserved_flags=flags & FLAGS_RESERVED)


def rr_end_times(arrival: float, rr_intervals: tuple[float, ...]) -> list[float]:
    """When each RR interval of one notification ended: the last one at ``arrival`` (the
    beat that completed it was just detected), each earlier one that much before the
    interval that follows it."""
    times, end = [], arrival
    for interval in reversed(rr_intervals):
        times.append(end)
        end -= interval
    return times[::-1]
