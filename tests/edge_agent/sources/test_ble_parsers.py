"""The BLE notification parsers, from byte strings built from the specifications.

Heart Rate Measurement (0x2A37, Bluetooth SIG Heart Rate Service 1.0): every flag
combination, several RR intervals, each length short of what the flags need, values
longer than the flags or the attribute limit allow, odd RR octet counts, and arbitrary
bytes (hypothesis).  Polar PMD (polar-ble-sdk technical_documentation/
online_measurement.pdf): the start request, control point responses and ACC frames of
the supported types and of refused ones.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.sources.ble import heart_rate as hrs
from edge_agent.sources.ble import polar_pmd as pmd
from edge_agent.sources.ble.gatt import MAX_ATTRIBUTE_BYTES, MalformedNotification, sig_uuid
from edge_agent.sources.ble.heart_rate import parse_heart_rate_measurement, rr_end_times

# -- building values per the HRS specification ---------------------------------------------


def hrm(heart_rate: int, *, wide: bool = False, contact: int = 0, energy: int | None = None,
        rr: list[int] | None = None, reserved: int = 0) -> bytes:
    """A Heart Rate Measurement value: ``contact`` is the two-bit Sensor Contact Status
    (bits 1-2), ``rr`` raw RR values in 1/1024 s."""
    flags = (0x01 if wide else 0) | (contact << 1) | (0x08 if energy is not None else 0) \
        | (0x10 if rr is not None else 0) | reserved
    out = bytes([flags]) + heart_rate.to_bytes(2 if wide else 1, "little")
    if energy is not None:
        out += struct.pack("<H", energy)
    for value in rr or ():
        out += struct.pack("<H", value)
    return out


def reason(data: bytes, **options) -> str:
    with pytest.raises(MalformedNotification) as caught:
        parse_heart_rate_measurement(data, **options)
    return caught.value.reason


def test_uuids_are_the_sig_assigned_numbers():
    assert hrs.HEART_RATE_SERVICE == "0000180d-0000-1000-8000-00805f9b34fb"
    assert hrs.HEART_RATE_MEASUREMENT == "00002a37-0000-1000-8000-00805f9b34fb"
    assert sig_uuid(0x2A37) == hrs.HEART_RATE_MEASUREMENT


@pytest.mark.parametrize("wide,contact,with_energy,with_rr", list(itertools.product(
    (False, True), range(4), (False, True), (False, True))))
def test_every_flag_combination(wide, contact, with_energy, with_rr):
    heart_rate = 300 if wide else 72  # 300 needs the uint16 format
    rr = [1024, 512 + 3, 900] if with_rr else None
    data = hrm(heart_rate, wide=wide, contact=contact, energy=4660 if with_energy else None,
               rr=rr)
    assert len(data) == 1 + (2 if wide else 1) + (2 if with_energy else 0) + 2 * len(rr or ())
    m = parse_heart_rate_measurement(data)
    assert m.heart_rate == heart_rate
    assert m.energy_kj == (4660 if with_energy else None)
    assert m.rr_intervals == ((1.0, 515 / 1024, 900 / 1024) if with_rr else ())
    # Sensor Contact Status: 0 and 1 not supported, 2 no contact, 3 contact.
    assert m.contact == {0: None, 1: None, 2: False, 3: True}[contact]
    assert m.reserved_flags == 0


def test_values_are_little_endian_and_unsigned():
    m = parse_heart_rate_measurement(bytes([0x19, 0x34, 0x12, 0xFF, 0xFF, 0x01, 0x80]))
    # flags 0x19: uint16 value, energy, RR; 0x1234 bpm, 65535 kJ, RR 0x8001 / 1024 s.
    assert (m.heart_rate, m.energy_kj, m.rr_intervals) == (0x1234, 0xFFFF, (0x8001 / 1024,))
    assert parse_heart_rate_measurement(bytes([0x00, 0xFF])).heart_rate == 255


def test_the_rr_intervals_fill_the_rest_of_the_value():
    rr = list(range(700, 700 + 9 * 10, 10))  # 9 intervals: 20 octets with an 8-bit value
    data = hrm(60, rr=rr)
    assert len(data) == 20
    assert parse_heart_rate_measurement(data).rr_intervals == tuple(v / 1024 for v in rr)


def test_reserved_flag_bits_are_ignored_and_reported():
    m = parse_heart_rate_measurement(hrm(80, reserved=0xE0, rr=[800]))
    assert (m.heart_rate, m.rr_intervals, m.reserved_flags) == (80, (800 / 1024,), 0xE0)


@pytest.mark.parametrize("wide,with_energy,with_rr", list(itertools.product(
    (False, True), (False, True), (False, True))))
def test_every_length_short_of_what_the_flags_need_is_truncated(wide, with_energy, with_rr):
    full = hrm(70, wide=wide, energy=10 if with_energy else None,
               rr=[1000] if with_rr else None)
    assert parse_heart_rate_measurement(full).heart_rate == 70
    assert reason(b"") == "empty"
    for length in range(1, len(full)):
        assert reason(full[:length]) == "truncated", length


def test_rr_flag_without_an_rr_interval_is_truncated():
    assert reason(bytes([0x10, 70])) == "truncated"
    assert reason(bytes([0x18, 70, 1, 0])) == "truncated"  # with energy expended


def test_odd_rr_octets_are_malformed():
    for rr_octets in (3, 5, 17):
        assert reason(bytes([0x10, 70]) + bytes(rr_octets)) == "odd_rr"


def test_octets_the_flags_do_not_announce_are_malformed():
    assert reason(hrm(70) + b"\x00") == "trailing_bytes"
    assert reason(hrm(70, energy=5) + b"\x00\x00") == "trailing_bytes"


def test_oversized_values_are_refused():
    longest = hrm(70, rr=[800] * ((MAX_ATTRIBUTE_BYTES - 2) // 2))
    assert len(longest) == MAX_ATTRIBUTE_BYTES
    assert len(parse_heart_rate_measurement(longest).rr_intervals) == 255
    assert reason(longest + b"\x00\x03") == "oversized"
    # A smaller limit (a known ATT_MTU of 23: 20 octets a notification).
    assert reason(hrm(70, rr=[800] * 10), max_length=20) == "oversized"
    assert len(parse_heart_rate_measurement(hrm(70, rr=[800] * 9), max_length=20)
               .rr_intervals) == 9


def test_the_message_never_carries_the_bytes():
    data = bytes([0x10, 0x41, 0x42, 0x43, 0x44])  # 'ABCD' would show in a repr
    with pytest.raises(MalformedNotification) as caught:
        parse_heart_rate_measurement(data)
    assert "ABC" not in str(caught.value) and "41" not in str(caught.value)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_parse_or_raise_only_malformed(data):
    try:
        m = parse_heart_rate_measurement(data)
    except MalformedNotification as exc:
        assert exc.reason in hrs.REASONS
        return
    assert 0 <= m.heart_rate <= 0xFFFF
    assert all(0 <= rr < 64 for rr in m.rr_intervals)
    # What parsed re-encodes to the same bytes.
    contact = (data[0] >> 1) & 3
    assert hrm(m.heart_rate, wide=bool(data[0] & 1), contact=contact, energy=m.energy_kj,
               rr=[round(v * 1024) for v in m.rr_intervals] if data[0] & 0x10 else None,
               reserved=data[0] & 0xE0) == data


def test_rr_end_times_chain_back_from_the_arrival():
    assert rr_end_times(100.0, (0.5, 0.25, 1.0)) == [98.75, 99.0, 100.0]
    assert rr_end_times(5.0, ()) == []


# -- Polar PMD -----------------------------------------------------------------------------

def acc_frame(samples, *, frame_type: int = 1, measurement: int = 2, timestamp: int = 12345,
              size: int | None = None) -> bytes:
    size = size or {0: 1, 1: 2, 2: 3}.get(frame_type & 0x7F, 2)
    body = b"".join(int(v).to_bytes(size, "little", signed=True)
                    for sample in samples for v in sample)
    return bytes([measurement]) + struct.pack("<Q", timestamp) + bytes([frame_type]) + body


def pmd_reason(data: bytes, **options) -> str:
    with pytest.raises(MalformedNotification) as caught:
        pmd.parse_acc_frame(data, **options)
    return caught.value.reason


def test_pmd_uuids_are_those_of_the_document():
    assert pmd.PMD_SERVICE == "FB005C80-02E7-F387-1CAD-8ACD2D8DF0C8".lower()
    assert pmd.PMD_CONTROL_POINT == "FB005C81-02E7-F387-1CAD-8ACD2D8DF0C8".lower()
    assert pmd.PMD_DATA == "FB005C82-02E7-F387-1CAD-8ACD2D8DF0C8".lower()


def test_start_request_serializes_the_settings():
    # op 2 (start), online ACC (0 << 7 | 2); sample rate 200 Hz, resolution 16, range 8 G,
    # each [type, count = 1, uint16 little-endian].
    assert pmd.start_acc_request(200, 8) == bytes.fromhex("0202 0001c800 01011000 02010800")
    assert pmd.start_acc_request(50, 2)[2:6] == bytes([0, 1, 50, 0])
    with pytest.raises(ValueError):
        pmd.start_acc_request(0, 8)
    with pytest.raises(ValueError):
        pmd.start_acc_request(50, 70000)
    assert pmd.stop_request() == bytes([3, 2])


def test_control_point_responses():
    ok = pmd.parse_control_point_response(bytes([0xF0, 0x02, 0x02, 0x00, 0x00]))
    assert (ok.op_code, ok.measurement, ok.status, ok.more, ok.factor) == (2, 2, 0, False, None)
    factor = struct.pack("<f", 0.5)
    with_factor = pmd.parse_control_point_response(
        bytes([0xF0, 0x02, 0x02, 0x00, 0x00, 0x05, 0x01]) + factor)
    assert with_factor.factor == 0.5
    refused = pmd.parse_control_point_response(bytes([0xF0, 0x02, 0x02, 0x08]))
    assert refused.status == 8 and refused.status_name == "invalid sample rate"
    # Settings after an unknown type (its size unknown) are not read.
    odd = pmd.parse_control_point_response(
        bytes([0xF0, 1, 2, 0, 0, 0, 1, 50, 0, 9, 1, 7, 7, 5, 1]) + factor)
    assert odd.settings == {0: [50]}
    for bad, why in ((b"\xf0\x02\x02", "truncated"), (b"\x01\x02\x02\x00", "not_a_response"),
                     (b"\xf0" + bytes(600), "oversized")):
        with pytest.raises(MalformedNotification) as caught:
            pmd.parse_control_point_response(bad)
        assert caught.value.reason == why


def test_settings_parse_by_table_5_sizes():
    data = bytes([0, 2, 25, 0, 200, 0, 1, 1, 16, 0, 2, 3, 2, 0, 4, 0, 8, 0, 4, 1, 3])
    assert pmd.parse_settings(data) == {0: [25, 200], 1: [16], 2: [2, 4, 8], 4: [3]}
    assert pmd.parse_settings(data[:-1]) == {0: [25, 200], 1: [16], 2: [2, 4, 8]}


def test_type1_frames_are_int16_milli_g():
    samples = [(1000, -1000, 0), (-32768, 32767, 1), (12, -7, 981)]
    frame = pmd.parse_acc_frame(acc_frame(samples, timestamp=599_000_000_000))
    assert frame.frame_type == 1 and frame.timestamp_ns == 599_000_000_000
    np.testing.assert_array_equal(frame.samples, np.array(samples) / 1000.0)


def test_type2_frames_are_int24_milli_g():
    samples = [(8_388_607, -8_388_608, -1), (1, 0, -981)]
    frame = pmd.parse_acc_frame(acc_frame(samples, frame_type=2))
    np.testing.assert_array_equal(frame.samples, np.array(samples) / 1000.0)


def test_the_factor_scales_every_sample():
    frame = pmd.parse_acc_frame(acc_frame([(100, -200, 300)]), factor=0.5)
    np.testing.assert_allclose(frame.samples, [[0.05, -0.1, 0.15]])


def test_the_measurement_type_is_the_low_six_bits():
    assert len(pmd.parse_acc_frame(acc_frame([(1, 2, 3)], measurement=0xC2)).samples) == 1
    assert pmd_reason(acc_frame([(1, 2, 3)], measurement=0)) == "not_acc"  # ECG
    assert pmd_reason(acc_frame([(1, 2, 3)], measurement=5)) == "not_acc"  # gyro


def test_refused_frames():
    assert pmd_reason(acc_frame([(1, 2, 3)], frame_type=0x81)) == "compressed_frame"
    assert pmd_reason(acc_frame([(1, 2, 3)], frame_type=0x80)) == "compressed_frame"
    assert pmd_reason(acc_frame([(1, 2, 3)], frame_type=0)) == "unsupported_frame"
    assert pmd_reason(acc_frame([(1, 2, 3)], frame_type=3, size=2)) == "unsupported_frame"
    full = acc_frame([(1, 2, 3), (4, 5, 6)])
    for length in range(pmd.HEADER_BYTES):
        assert pmd_reason(full[:length]) == "truncated"
    assert pmd_reason(full[:pmd.HEADER_BYTES]) == "no_samples"
    for length in range(pmd.HEADER_BYTES + 1, len(full)):
        if (length - pmd.HEADER_BYTES) % 6:
            assert pmd_reason(full[:length]) == "partial_sample"
    assert pmd_reason(acc_frame([(1, 2, 3)] * 84)) == "oversized"  # 10 + 504 > 512
    assert len(pmd.parse_acc_frame(acc_frame([(1, 2, 3)] * 83)).samples) == 83


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600), st.floats(0.001, 10))
def test_arbitrary_frames_parse_or_raise_only_malformed(data, factor):
    try:
        frame = pmd.parse_acc_frame(data, factor=factor)
    except MalformedNotification as exc:
        assert exc.reason in pmd.REASONS
        return
    assert frame.samples.shape == ((len(data) - 10) // (3 * (frame.frame_type + 1)), 3)
    assert np.all(np.abs(frame.samples) <= 8_388_608 / 1000 * factor)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_arbitrary_responses_parse_or_raise_only_malformed(data):
    try:
        pmd.parse_control_point_response(data)
    except MalformedNotification:
        pass
