"""Input sources: synthetic, CSV, JSON lines, MQTT (real broker), I2C (fake bus)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.publish as mqtt_publish
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.config import (
    SYNTHETIC_FIELDS,
    CsvSourceConfig,
    I2cSourceConfig,
    JsonlSourceConfig,
    MqttSourceConfig,
    SyntheticSourceConfig,
)
from edge_agent.readings import Readings
from edge_agent.sources import (
    CsvSource,
    I2cSource,
    JsonlSource,
    MqttSource,
    SyntheticSource,
    build_source,
)
from edge_agent.sources import csv_source as csv_module
from edge_agent.sources.derive import apply_derive, horizontal, tilt, wrap_2pi, wrap_pi
from edge_agent.sources.i2c import ACCEL_XOUT_H, PWR_MGMT_1, decode_block
from edge_agent.sources.synthetic import stable_seed
from tests.support import HANG_GUARD_SECONDS, REPO, wait_until

DATA = REPO / "tests" / "data"
MOTIONSENSE = DATA / "motionsense_sample.csv"
T0 = 1_700_000_000.0
PI = math.pi


def wait_for(condition, timeout=HANG_GUARD_SECONDS):
    """``wait_until`` at this module's pace: sources are polled every 10 ms, for 10 s."""
    return wait_until(condition, timeout, interval=0.01)


_STARTED: list = []


@pytest.fixture(autouse=True)
def _stop_sources():
    """Sources a test started through the helpers below are stopped after it."""
    yield
    while _STARTED:
        _STARTED.pop().stop()


def assert_times(times, offsets, base=T0):
    """Timestamps equal base + offsets (absolute tolerance: epoch times are large)."""
    np.testing.assert_allclose(np.asarray(times) - base, offsets, rtol=0, atol=1e-6)


def drain(source, until, timeout=HANG_GUARD_SECONDS) -> Readings:
    """Poll (with the real clock) until ``until(batches)`` holds; all batches joined."""
    parts: list[Readings] = []

    def check():
        parts.append(source.poll(time.time()))
        return until(parts)

    wait_for(check, timeout)
    return Readings.concat(parts)


# -- derive ---------------------------------------------------------------------------

class TestDerive:
    def test_horizontal_by_hand(self):
        ax = np.array([3.0, 0.0, -1.0, 1.0, 0.0, -2.0])
        ay = np.array([4.0, -1.0, -0.0, -1e-300, 0.0, 2.0])
        mag, direction = horizontal(ax, ay)
        np.testing.assert_allclose(mag, [5.0, 1.0, 1.0, 1.0, 0.0, math.sqrt(8)])
        # atan2(4, 3); -pi/2 wrapped; atan2(-0, -1) = -pi -> pi; a tiny negative
        # angle must wrap to 0, not to 2pi; the undefined direction of 0 is 0.
        np.testing.assert_allclose(direction, [math.atan2(4, 3), 1.5 * PI, PI, 0.0, 0.0,
                                               0.75 * PI])
        assert np.all((direction >= 0) & (direction < 2 * PI))

    def test_tilt_by_hand(self):
        ax = np.array([0.0, -1.0, 0.0, 0.5, 0.0, 0.0])
        ay = np.array([0.0, 0.0, 1.0, 0.5, -0.0, 1.0])
        az = np.array([1.0, 0.0, 1.0, 0.5, -1.0, 0.0])
        roll, pitch = tilt(ax, ay, az)
        np.testing.assert_allclose(roll, [0.0, 0.0, PI / 4, PI / 4, PI, PI / 2], atol=1e-15)
        np.testing.assert_allclose(
            pitch, [0.0, PI / 2, 0.0, math.atan2(-0.5, math.sqrt(0.5)), 0.0, 0.0], atol=1e-15)

    def test_wrapping_edges(self):
        just_above_pi = np.nextafter(PI, 4.0)  # rounds onto the -pi edge without care
        edge = wrap_pi(np.array([just_above_pi]))[0]
        assert -PI < edge <= PI and math.isclose(math.cos(edge), -1.0)
        np.testing.assert_array_equal(wrap_pi(np.array([-PI, PI, 3 * PI, -3 * PI])), PI)
        np.testing.assert_array_equal(wrap_2pi(np.array([-1e-300, 2 * PI, -2 * PI])), 0.0)

    @given(st.floats(-1e6, 1e6))
    def test_wrapping_ranges(self, angle):
        full, half = float(wrap_2pi(np.array(angle))), float(wrap_pi(np.array(angle)))
        assert 0.0 <= full < 2 * PI
        assert -PI < half <= PI
        # Same angle modulo 2pi (up to the rounding of large angles).
        assert math.isclose(math.cos(full), math.cos(angle), abs_tol=1e-9)
        assert math.isclose(math.sin(half), math.sin(angle), abs_tol=1e-9)

    def test_apply_adds_fields_and_fills_only_missing_rows(self):
        readings = Readings([1.0, 2.0], {
            "accel_x": [0.0, 0.0], "accel_y": [1.0, 0.0], "accel_z": [1.0, 1.0],
            "roll": [0.3, math.nan],  # the device's own roll in the first row only
        })
        apply_derive(readings, ["tilt", "horizontal"])
        np.testing.assert_allclose(readings.fields["roll"], [0.3, 0.0])
        np.testing.assert_allclose(readings.fields["pitch"], [0.0, 0.0])
        np.testing.assert_allclose(readings.fields["accel_h_mag"], [1.0, 0.0])
        np.testing.assert_allclose(readings.fields["accel_h_dir"], [PI / 2, 0.0])

    def test_apply_without_inputs_gives_nan(self):
        readings = apply_derive(Readings([1.0], {"temperature": [20.0]}), ["horizontal"])
        assert np.isnan(readings.fields["accel_h_mag"][0])


# -- synthetic ------------------------------------------------------------------------

def synthetic(agent_id="agent-1", **kw) -> SyntheticSource:
    source = SyntheticSource(SyntheticSourceConfig(type="synthetic", name="imu", **kw),
                             agent_id=agent_id)
    source.start()
    return source


def run(source, seconds, step=1.0, start=T0) -> Readings:
    parts = [source.poll(start)]
    parts += [source.poll(start + step * i) for i in range(1, int(seconds / step) + 1)]
    return Readings.concat(parts)


class TestSynthetic:
    def test_first_poll_one_sample_then_rate(self):
        source = synthetic(rate_hz=50)
        first = source.poll(T0)
        assert len(first) == 1 and first.times[0] == T0
        second = source.poll(T0 + 1.0)
        assert len(second) == 50
        assert_times(np.concatenate([first.times, second.times]), np.arange(51) / 50)
        assert second.times[0] > T0 and second.times[-1] <= T0 + 1.0 + 1e-9
        assert len(source.poll(T0 + 1.0)) == 0  # nothing new
        third = source.poll(T0 + 1.37)
        assert len(third) == 18  # samples at 1.02 .. 1.36
        assert set(first.fields) | set(first.text) == set(SYNTHETIC_FIELDS)
        assert set(first.text) == {"activity"}  # a word per sample: rest, walk or run

    def test_ranges_and_plausible_acceleration(self):
        data = run(synthetic(), 1200)
        f = data.fields
        assert len(data) == 1200 * 50 + 1
        assert np.all((f["roll"] > -PI) & (f["roll"] <= PI))
        assert np.all((f["pitch"] > -PI) & (f["pitch"] <= PI))
        assert np.all((f["yaw"] >= 0) & (f["yaw"] < 2 * PI))
        assert f["yaw"].max() - f["yaw"].min() > 1.0  # it drifts
        magnitude = np.sqrt(f["accel_x"] ** 2 + f["accel_y"] ** 2 + f["accel_z"] ** 2)
        assert 0.9 < np.median(magnitude) < 1.1  # gravity dominates
        assert magnitude.min() > 0.0 and magnitude.max() < 4.0
        # The horizontal fields are the derive formulas of the accelerometer.
        mag, direction = horizontal(f["accel_x"], f["accel_y"])
        np.testing.assert_array_equal(f["accel_h_mag"], mag)
        np.testing.assert_array_equal(f["accel_h_dir"], direction)
        for name in f:
            assert np.all(np.isfinite(f[name]))

    def test_activity_bursts_are_periodic_steps(self):
        data = run(synthetic(), 1200)
        f = data.fields
        magnitude = np.sqrt(f["accel_x"] ** 2 + f["accel_y"] ** 2 + f["accel_z"] ** 2)
        windows = magnitude[: (len(magnitude) // 200) * 200].reshape(-1, 200)  # 4 s each
        spread = windows.std(axis=1)
        resting, moving = spread < 0.05, spread > 0.12
        assert resting.mean() > 0.1 and moving.mean() > 0.1  # both kinds of period
        # Moving windows oscillate at a step frequency (walking ~1.9 Hz, running ~2.7 Hz).
        window = windows[np.argmax(spread)]
        spectrum = np.abs(np.fft.rfft(window - window.mean()))
        peak_hz = np.fft.rfftfreq(window.size, 1 / 50)[np.argmax(spectrum)]
        assert 1.4 < peak_hz < 6.0  # the step frequency or its first harmonic
        # The activity field names the state the signal shows (up to the 1.5 s ease
        # between states): "rest" in still windows, "walk" or "run" in moving ones.
        words = data.text["activity"][: windows.size].reshape(-1, 200)
        still = (words == "rest").mean(axis=1)
        assert set(data.text["activity"]) <= {"rest", "walk", "run"}
        assert np.median(still[resting]) > 0.9 and np.median(still[moving]) < 0.1

    def test_agents_differ_and_repeat(self):
        a1 = run(synthetic("agent-1"), 30)
        a1_again = run(synthetic("agent-1"), 30)
        a2 = run(synthetic("agent-2"), 30)
        for name in a1.fields:
            np.testing.assert_array_equal(a1.fields[name], a1_again.fields[name])
            assert not np.allclose(a1.fields[name], a2.fields[name])
        assert a1.text["activity"].tolist() == a1_again.text["activity"].tolist()
        # An explicit seed wins over the agent id.
        s1 = run(synthetic("agent-1", seed=7), 10)
        s2 = run(synthetic("agent-2", seed=7), 10)
        np.testing.assert_array_equal(s1.fields["accel_x"], s2.fields["accel_x"])
        assert not np.allclose(s1.fields["accel_x"], a1.fields["accel_x"][: len(s1)])

    def test_poll_schedule_does_not_change_the_data(self):
        coarse = run(synthetic(seed=3), 120, step=7.0)
        fine = run(synthetic(seed=3), 119, step=0.33)
        n = min(len(coarse), len(fine))
        assert n > 5000
        np.testing.assert_array_equal(fine.times[:n], coarse.times[:n])
        for name in coarse.fields:
            np.testing.assert_allclose(fine.fields[name][:n], coarse.fields[name][:n],
                                       rtol=0, atol=1e-9)
        assert fine.text["activity"][:n].tolist() == coarse.text["activity"][:n].tolist()
        assert set(coarse.fields) | set(coarse.text) == set(SYNTHETIC_FIELDS)

    def test_seed_is_stable_across_processes(self):
        code = "from edge_agent.sources.synthetic import stable_seed; print(stable_seed('a', 'b'))"
        seeds = {
            subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=REPO, env={**os.environ, "PYTHONHASHSEED": salt},
                           check=True).stdout.strip()
            for salt in ("1", "2")
        }
        assert seeds == {str(stable_seed("a", "b"))}

    def test_duration_makes_it_finite(self):
        source = synthetic(rate_hz=50, duration=2.0)
        total = 0
        for i in range(0, 30):
            total += len(source.poll(T0 + 0.25 * i))
            if total < 100:
                assert not source.finished
        assert total == 100 and source.finished
        assert len(source.poll(T0 + 100)) == 0

    def test_cheap(self):
        source = synthetic(rate_hz=50)
        source.poll(T0)
        started = time.process_time()
        for i in range(1, 601):
            source.poll(T0 + i)
        cpu = time.process_time() - started
        # 600 s of 50 Hz data; 1% CPU would be 6 s.  Generous for slow CI.
        assert cpu < 1.5

    def test_derive_tilt_keeps_own_attitude(self):
        plain = run(synthetic(seed=5), 5)
        tilted = run(synthetic(seed=5, derive=["tilt"]), 5)
        np.testing.assert_array_equal(plain.fields["roll"], tilted.fields["roll"])


# -- CSV ------------------------------------------------------------------------------

MOTION_COLUMNS = {"roll": "attitude.roll", "pitch": "attitude.pitch",
                  "accel_x": "userAcceleration.x", "accel_y": "userAcceleration.y",
                  "accel_z": "userAcceleration.z"}


def csv_source(path, **kw) -> CsvSource:
    kw.setdefault("columns", MOTION_COLUMNS)
    source = CsvSource(CsvSourceConfig(type="csv", name="replay", path=path, **kw))
    source.start()
    _STARTED.append(source)
    return source


def motionsense_rows() -> list[dict[str, str]]:
    with MOTIONSENSE.open(newline="") as f:
        return list(csv.DictReader(f))


def write(tmp_path, text, name="data.csv") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


class TestCsv:
    def test_motionsense_with_unnamed_index_column(self):
        source = csv_source(MOTIONSENSE, pace="fast", columns={**MOTION_COLUMNS, "index": ""})
        data = source.poll(T0)
        rows = motionsense_rows()
        assert len(data) == len(rows) == 200
        assert source.finished and source.error is None and source.rejected_rows == 0
        np.testing.assert_array_equal(data.fields["index"], np.arange(200))
        for field, column in MOTION_COLUMNS.items():
            np.testing.assert_array_equal(data.fields[field], [float(r[column]) for r in rows])
        assert_times(data.times, np.arange(200) / 50)

    def test_fixed_pace_follows_the_clock(self):
        source = csv_source(MOTIONSENSE, pace="fixed", rate_hz=50)
        assert len(source.poll(T0)) == 1
        assert len(source.poll(T0 + 0.37)) == 18  # rows at 0.02 .. 0.36
        batch = source.poll(T0 + 1.0)
        assert len(batch) == 32
        assert_times(batch.times, np.arange(19, 51) / 50)
        assert not source.finished
        rest = source.poll(T0 + 60)
        assert len(rest) == 200 - 51 and source.finished
        assert len(source.poll(T0 + 61)) == 0

    def test_fixed_pace_with_real_clock(self):
        source = csv_source(MOTIONSENSE, pace="fixed", rate_hz=100)
        start = time.time()
        n = len(source.poll(start))
        time.sleep(0.3)
        now = time.time()
        n += len(source.poll(now))
        assert abs(n - (100 * (now - start) + 1)) <= 1.5

    def test_recorded_pace(self, tmp_path):
        path = write(tmp_path, """
            t,x
            1000.0,1
            1000.1,2
            1000.25,3
            1000.3,4
            1001.0,5
            """)
        source = csv_source(path, pace="recorded", timestamp_column="t", columns={"x": "x"})
        assert source.poll(T0).fields["x"].tolist() == [1]
        assert source.poll(T0 + 0.2).fields["x"].tolist() == [2]
        batch = source.poll(T0 + 0.3)
        assert batch.fields["x"].tolist() == [3, 4]
        assert_times(batch.times, [0.25, 0.3])
        assert not source.finished
        assert len(source.poll(T0 + 0.9)) == 0
        last = source.poll(T0 + 1.0)
        assert last.fields["x"].tolist() == [5] and source.finished

    def test_recorded_pace_loops_with_increasing_times(self, tmp_path):
        path = write(tmp_path, """
            t,x
            5.0,1
            5.5,2
            """)
        source = csv_source(path, pace="recorded", timestamp_column="t", columns={"x": "x"},
                            loop=True, rate_hz=10)
        data = Readings.concat([source.poll(T0 + 0.05 * i) for i in range(60)])
        assert data.fields["x"].tolist()[:6] == [1, 2, 1, 2, 1, 2]
        # Second pass starts 1/rate_hz after the first ended.
        assert_times(data.times[:4], [0.0, 0.5, 0.6, 1.1])
        assert np.all(np.diff(data.times) > 0) and not source.finished

    def test_fast_pace_bounded_batches(self, tmp_path):
        path = tmp_path / "big.csv"
        path.write_text("x\n" + "".join(f"{i}\n" for i in range(12_000)))
        source = csv_source(path, pace="fast", columns={"x": "x"}, rate_hz=1000)
        sizes = []
        while not source.finished and len(sizes) < 10:
            batch = source.poll(T0)
            sizes.append(len(batch))
        assert sizes == [csv_module.MAX_FAST_ROWS, csv_module.MAX_FAST_ROWS, 2000]
        assert batch.fields["x"][-1] == 11_999
        assert_times(batch.times[-1:], [11.999])

    def test_loop_restarts_and_times_keep_increasing(self, tmp_path):
        path = write(tmp_path, """
            a
            1
            2
            3
            """)
        source = csv_source(path, pace="fixed", rate_hz=10, loop=True, columns={"a": "a"})
        data = Readings.concat([source.poll(T0), source.poll(T0 + 0.95)])
        assert data.fields["a"].tolist() == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
        assert_times(data.times, np.arange(10) / 10)
        assert not source.finished

    def test_bad_cells_nan_and_bad_rows_counted(self, tmp_path):
        path = write(tmp_path, """
            ,a,b
            0,1.5,abc
            1,,2
            2,3
            3,4,5,6

            4,inf,-7e-1
            """)
        source = csv_source(path, pace="fast", columns={"a": "a", "b": "b"})
        data = source.poll(T0)
        assert source.rejected_rows == 2 and source.finished
        a, b = data.fields["a"], data.fields["b"]
        assert a[0] == 1.5 and np.isnan(b[0])
        assert np.isnan(a[1]) and b[1] == 2
        assert a[2] == math.inf and b[2] == -0.7
        assert len(data) == 3

    def test_bom_and_spaces_in_header(self, tmp_path):
        path = tmp_path / "bom.csv"
        path.write_text("\ufeffa , b\n1,2\n", encoding="utf-8")
        data = csv_source(path, pace="fast", columns={"a": "a", "b": "b"}).poll(T0)
        assert data.fields["a"].tolist() == [1.0] and data.fields["b"].tolist() == [2.0]

    def test_missing_file(self, tmp_path):
        path = tmp_path / "nope.csv"
        source = CsvSource(CsvSourceConfig(type="csv", name="replay", path=path,
                                           columns={"x": "x"}))  # no I/O yet
        assert source.error is None
        source.start()
        assert source.finished and str(path) in source.error and "no such file" in source.error
        assert len(source.poll(T0)) == 0
        source.stop()
        source.stop()

    def test_missing_column(self, tmp_path):
        path = write(tmp_path, """
            a,b
            123.456,789.5
            """)
        source = csv_source(path, columns={"x": "a", "y": "gravity.z"})
        assert source.finished
        assert "'gravity.z'" in source.error and str(path) in source.error
        assert "123.456" not in source.error and "789" not in source.error

    def test_missing_timestamp_column(self, tmp_path):
        path = write(tmp_path, "a\n1\n")
        source = csv_source(path, pace="recorded", timestamp_column="time",
                            columns={"a": "a"})
        assert source.finished and "'time'" in source.error

    def test_loop_over_no_data_fails(self, tmp_path):
        path = write(tmp_path, "a\n")
        source = csv_source(path, loop=True, columns={"a": "a"})
        assert source.finished and "no readable data rows" in source.error

    def test_derive_horizontal(self):
        source = csv_source(MOTIONSENSE, pace="fast", derive=["horizontal"])
        assert "accel_h_mag" in source.fields
        data = source.poll(T0)
        mag, _ = horizontal(data.fields["accel_x"], data.fields["accel_y"])
        np.testing.assert_array_equal(data.fields["accel_h_mag"], mag)


# -- JSON lines -----------------------------------------------------------------------

def jsonl_config(**kw) -> JsonlSourceConfig:
    return JsonlSourceConfig(type="jsonl", name="lines", **kw)


class TestJsonl:
    def test_from_file(self):
        source = JsonlSource(jsonl_config(path=str(DATA / "readings.jsonl"),
                                          timestamp_field="ts", derive=["horizontal"]))
        source.start()
        data = drain(source, lambda _: source.finished)
        source.stop()
        assert source.finished and source.error is None
        # Not JSON, not an object, and a line without its timestamp.
        assert source.rejected_rows == 3
        assert_times(data.times, [0.0, 0.02, 0.04, 0.08])
        f = data.fields
        assert "ts" not in f
        np.testing.assert_array_equal(f["accel_x"], [0.1, 0.3, 0.0, -1.0])
        assert np.isnan(f["accel_y"][2])  # null
        assert np.isnan(f["label"][1]) and np.isnan(f["moving"][2])  # not numbers
        assert np.isnan(f["temperature"][0]) and f["temperature"][3] == 21.5  # absent -> NaN
        assert f["accel_h_mag"][1] == pytest.approx(0.5)

    def test_missing_file(self, tmp_path):
        source = JsonlSource(jsonl_config(path=str(tmp_path / "none.jsonl")))
        source.start()
        assert source.finished and "none.jsonl" in source.error
        source.stop()

    def test_from_a_subprocess_pipe_with_arrival_times(self):
        producer = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent("""
                import json, sys, time
                for i in range(5):
                    print(json.dumps({"x": i, "y": 2 * i}), flush=True)
                    time.sleep(0.05)
                print("{broken", flush=True)
                sys.stdin.readline()  # wait until the test lets us finish
                print(json.dumps({"x": 99}), flush=True)
            """)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        source = JsonlSource(jsonl_config(), stream=producer.stdout)
        before = time.time()
        source.start()
        try:
            data = drain(source, lambda parts: sum(map(len, parts)) >= 5)
            assert data.fields["x"].tolist() == [0, 1, 2, 3, 4]
            assert data.fields["y"].tolist() == [0, 2, 4, 6, 8]
            assert np.all((data.times >= before) & (data.times <= time.time()))
            assert np.all(np.diff(data.times) > 0.02)  # read as they were written
            assert wait_for(lambda: source.rejected_rows == 1)
            assert not source.finished  # the pipe is still open
            producer.stdin.write(b"go\n")
            producer.stdin.close()
            rest = drain(source, lambda _: source.finished)
            assert rest.fields["x"].tolist() == [99]
        finally:
            source.stop()
            producer.wait(HANG_GUARD_SECONDS)
            producer.stdout.close()

    def test_standard_input(self):
        # The source reads path '-' (standard input) in a child process.
        reader = textwrap.dedent("""
            import json, time
            from edge_agent.config import JsonlSourceConfig
            from edge_agent.readings import Readings
            from edge_agent.sources import JsonlSource
            source = JsonlSource(JsonlSourceConfig(type="jsonl", name="in", path="-",
                                                   timestamp_field="t"))
            source.start()
            parts = []
            deadline = time.monotonic() + 60
            while not source.finished and time.monotonic() < deadline:
                parts.append(source.poll(time.time()))
                time.sleep(0.01)
            data = Readings.concat(parts)
            print(json.dumps({"finished": source.finished, "times": data.times.tolist(),
                              "v": data.column("v").tolist(),
                              "rejected": source.rejected_rows}))
        """)
        lines = "".join(json.dumps({"t": 10.0 + i, "v": i * 0.5}) + "\n" for i in range(100))
        result = subprocess.run([sys.executable, "-c", reader], input=lines + "nope\n",
                                capture_output=True, text=True, cwd=REPO, timeout=60)
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        assert out["finished"] and out["rejected"] == 1
        assert out["times"] == [10.0 + i for i in range(100)]
        assert out["v"] == [i * 0.5 for i in range(100)]


# -- MQTT -----------------------------------------------------------------------------

def publish(broker, topic, payload) -> None:
    """Publish as a wearable would: raw JSON, QoS 1, from its own client."""
    payload = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
    mqtt_publish.single(topic, payload, qos=1, hostname=broker.host, port=broker.port,
                        client_id="test-wearable")


def mqtt_source(mosquitto, **kw) -> MqttSource:
    config = MqttSourceConfig(type="mqtt", name="wearables", host=mosquitto.host,
                              port=mosquitto.port, topic="wearables/+/raw", **kw)
    source = MqttSource(config, agent_id="gateway-1")
    source.start()
    assert wait_for(lambda: source.subscribed), "source did not subscribe"
    return source


def rows(parts) -> int:
    return sum(len(p) for p in parts)


class TestMqtt:
    def test_objects_and_lists_arrive(self, mosquitto):
        source = mqtt_source(mosquitto, timestamp_field="ts", derive=["tilt"])
        try:
            publish(mosquitto, "wearables/w1/raw",
                    {"ts": 100.0, "accel_x": 0.0, "accel_y": 0.0, "accel_z": 1.0})
            publish(mosquitto, "wearables/w2/raw",
                    [{"ts": 101.0, "accel_x": -1.0, "accel_y": 0.0, "accel_z": 0.0},
                     {"ts": 102.0, "hr": 72}])
            publish(mosquitto, "elsewhere/raw", {"ts": 103.0, "accel_x": 5.0})  # not ours
            data = drain(source, lambda parts: rows(parts) >= 3)
            time.sleep(0.2)
            data = Readings.concat([data, source.poll(time.time())])
            assert sorted(data.times.tolist()) == [100.0, 101.0, 102.0]
            order = np.argsort(data.times)
            np.testing.assert_allclose(data.fields["pitch"][order][:2], [0.0, PI / 2])
            assert np.isnan(data.fields["accel_x"][order][2])
            assert data.fields["hr"][order][2] == 72
            assert source.rejected_rows == 0 and not source.finished
        finally:
            source.stop()
            source.stop()

    def test_malformed_payloads_are_counted_and_dropped(self, mosquitto):
        source = mqtt_source(mosquitto)
        try:
            before = time.time()
            publish(mosquitto, "wearables/w1/raw", b"\xff\xfe not json")
            publish(mosquitto, "wearables/w1/raw", '[1, {"x": 1.0}, "a"]')
            publish(mosquitto, "wearables/w1/raw", "42")
            publish(mosquitto, "wearables/w1/raw", {"x": 2.0, "y": "high"})
            data = drain(source, lambda parts: rows(parts) >= 2)
            assert data.fields["x"].tolist() == [1.0, 2.0]
            assert np.isnan(data.fields["y"][1])
            assert np.all((data.times >= before) & (data.times <= time.time()))
            assert source.rejected_rows == 4  # bad JSON, 1, "a", 42
            assert source.error is None
        finally:
            source.stop()

    def test_reconnects_after_broker_restart(self, mosquitto):
        source = mqtt_source(mosquitto)
        try:
            mosquitto.restart()
            assert wait_for(lambda: not source.subscribed, 10), "disconnect not noticed"
            assert wait_for(lambda: source.subscribed, 30), "no resubscription"
            publish(mosquitto, "wearables/w9/raw", {"x": 7.0})
            data = drain(source, lambda parts: rows(parts) >= 1)
            assert data.fields["x"].tolist() == [7.0]
        finally:
            source.stop()


# -- I2C ------------------------------------------------------------------------------

def words_to_bytes(words) -> list[int]:
    return list(np.asarray(words, dtype=">i2").tobytes())


# accel x, y, z; temperature; gyro x, y, z (raw register words)
KNOWN_WORDS = [16384, -16384, 8192, -340, 131, -262, -32768]


class FakeBus:
    def __init__(self, block=None, fail_after=None, fail_times=None):
        self.block = block or words_to_bytes(KNOWN_WORDS)
        self.writes: list[tuple[int, int, int]] = []
        self.reads = 0
        self.fail_after = fail_after  # fail every read from this one on
        self.fail_times = fail_times or set()  # fail these reads only
        self.lock = threading.Lock()

    def write_byte_data(self, address, register, value):
        self.writes.append((address, register, value))

    def read_i2c_block_data(self, address, register, length):
        assert (address, register, length) == (0x68, ACCEL_XOUT_H, 14)
        with self.lock:
            self.reads += 1
            n = self.reads
        if (self.fail_after is not None and n > self.fail_after) or n in self.fail_times:
            raise OSError(121, "Remote I/O error")
        return list(self.block)


def i2c_source(bus, **kw) -> I2cSource:
    kw.setdefault("rate_hz", 200)
    source = I2cSource(I2cSourceConfig(type="i2c", name="imu", **kw), bus=bus)
    source.start()
    return source


class TestI2c:
    def test_decode_scaling_and_signs(self):
        fields = decode_block(np.array([words_to_bytes(KNOWN_WORDS),
                                        words_to_bytes([1, -1, 0, 0, 0, 0, 32767])]))
        np.testing.assert_allclose(fields["accel_x"], [1.0, 1 / 16384])
        np.testing.assert_allclose(fields["accel_y"], [-1.0, -1 / 16384])
        np.testing.assert_allclose(fields["accel_z"], [0.5, 0.0])
        np.testing.assert_allclose(fields["temperature"], [35.53, 36.53])
        np.testing.assert_allclose(fields["gyro_x"], [1.0, 0.0])
        np.testing.assert_allclose(fields["gyro_y"], [-2.0, 0.0])
        np.testing.assert_allclose(fields["gyro_z"], [-32768 / 131, 32767 / 131])

    def test_bytes_by_hand(self):
        # 0xC0 0x00 is -16384 (-1 g); 0xFF 0x7E is -130 (-130/131 deg/s).
        block = [0x40, 0x00, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0xFF, 0x7E, 0, 0, 0, 0]
        fields = decode_block(np.array([block]))
        assert fields["accel_x"][0] == 1.0 and fields["accel_y"][0] == -1.0
        assert fields["gyro_x"][0] == pytest.approx(-130 / 131)

    def test_reads_the_device(self):
        bus = FakeBus()
        source = i2c_source(bus, derive=["tilt"])
        try:
            assert bus.writes[0] == (0x68, PWR_MGMT_1, 0)  # woken first
            data = drain(source, lambda parts: rows(parts) >= 10)
        finally:
            source.stop()
            source.stop()
        assert source.error is None and not source.finished
        f = data.fields
        assert np.all(f["accel_x"] == 1.0) and np.all(f["accel_y"] == -1.0)
        assert np.all(f["accel_z"] == 0.5) and np.all(f["gyro_y"] == -2.0)
        np.testing.assert_allclose(f["temperature"], 35.53)
        np.testing.assert_allclose(f["roll"], math.atan2(-1.0, 0.5))
        np.testing.assert_allclose(f["pitch"], math.atan2(-1.0, math.hypot(-1.0, 0.5)))
        assert np.all(np.diff(data.times) > 0)
        assert set(source.fields) >= {"accel_x", "gyro_z", "temperature", "roll", "pitch"}

    def test_rate(self):
        source = i2c_source(FakeBus())
        try:
            source.poll(time.time())
            time.sleep(0.5)
            n = len(source.poll(time.time()))
        finally:
            source.stop()
        assert 50 <= n <= 110  # 200 Hz for 0.5 s, with scheduling slack

    def test_transient_errors_are_retried(self):
        # 60 errors in all, more than the limit, but never two in a row.
        bus = FakeBus(fail_times=set(range(2, 122, 2)))
        source = i2c_source(bus, rate_hz=1000)
        try:
            data = drain(source, lambda parts: rows(parts) >= 70)
        finally:
            source.stop()
        assert source.io_errors == 60 and source.error is None and not source.finished
        assert np.all(data.fields["accel_x"] == 1.0)
        assert len(bus.writes) == 61  # woken again after each error

    def test_persistent_errors_fail(self):
        source = i2c_source(FakeBus(fail_after=2), rate_hz=1000)
        try:
            data = drain(source, lambda _: source.finished)
        finally:
            source.stop()
        assert len(data) == 2
        assert source.error.startswith("i2c read failed") and "Remote I/O error" in source.error
        assert source.io_errors >= 50

    def test_wake_failure(self):
        class Absent(FakeBus):
            def write_byte_data(self, *args):
                raise OSError(6, "No such device or address")

        source = i2c_source(Absent())
        assert source.finished and "0x68" in source.error
        source.stop()

    def test_without_smbus2(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "smbus2", None)  # makes the import fail
        source = I2cSource(I2cSourceConfig(type="i2c", name="imu"))
        source.start()
        assert source.finished and "pip install smbus2" in source.error
        source.stop()


# -- building -------------------------------------------------------------------------

def test_build_source_maps_each_config(tmp_path):
    configs = [
        (SyntheticSourceConfig(type="synthetic", name="s"), SyntheticSource),
        (CsvSourceConfig(type="csv", name="c", path=tmp_path / "absent.csv",
                         columns={"x": "x"}), CsvSource),
        (JsonlSourceConfig(type="jsonl", name="j", path=str(tmp_path / "absent")), JsonlSource),
        (MqttSourceConfig(type="mqtt", name="m", topic="a/b", port=1), MqttSource),
        (I2cSourceConfig(type="i2c", name="i"), I2cSource),
    ]
    for config, cls in configs:
        source = build_source(config, agent_id="agent-1")  # constructors do no I/O
        assert type(source) is cls and source.name == config.name
        assert source.error is None and not source.finished


def test_keep_newest_bounds_a_queue_and_counts_what_it_drops():
    from collections import deque

    from edge_agent.sources.base import keep_newest

    queue = deque(maxlen=5)
    assert keep_newest(queue, range(3)) == 0 and list(queue) == [0, 1, 2]
    assert keep_newest(queue, range(3, 7)) == 2 and list(queue) == [2, 3, 4, 5, 6]
    assert keep_newest(queue, range(10, 22)) == 12 and list(queue) == list(range(17, 22))
