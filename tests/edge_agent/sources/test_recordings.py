"""edge_agent/sources/recordings.py: a recording read ahead for check-config."""

from __future__ import annotations

import json

import numpy as np

from edge_agent.config.sources import CsvSourceConfig, JsonlSourceConfig, SyntheticSourceConfig
from edge_agent.sources import recordings


def test_a_csv_recording_is_read_with_its_derived_fields(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("t,x,y\n1,3,4\n2,bad,0\n3,0,-2\nshort\n")
    source = CsvSourceConfig(name="r", type="csv", path=path, derive=["horizontal"],
                             columns={"accel_x": "x", "accel_y": "y"})
    readings = recordings.recorded_readings(source)
    assert len(readings) == 3  # the short row is not a record of the header's width
    assert np.allclose(readings.column("accel_h_mag"), [5.0, np.nan, 2.0], equal_nan=True)


def test_a_jsonl_recording_is_read_and_what_is_not_a_record_skipped(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps({"hr": 60}), "not json", json.dumps([1]),
                               json.dumps({"hr": 70, "activity": "walk"})]) + "\n")
    readings = recordings.recorded_readings(JsonlSourceConfig(name="r", type="jsonl",
                                                              path=str(path)))
    assert readings.column("hr").tolist() == [60.0, 70.0]


def test_nothing_is_read_without_a_bounded_file(tmp_path, monkeypatch):
    assert recordings.recorded_readings(SyntheticSourceConfig(name="s", type="synthetic")) \
        is None
    assert recordings.recorded_readings(JsonlSourceConfig(name="r", type="jsonl")) is None
    missing = CsvSourceConfig(name="r", type="csv", path=tmp_path / "none.csv",
                              columns={"x": "x"})
    assert recordings.recorded_readings(missing) is None
    path = tmp_path / "big.csv"
    path.write_text("x\n" + "1\n" * 100)
    monkeypatch.setattr(recordings, "MAX_BYTES", 50)
    assert recordings.recorded_readings(CsvSourceConfig(name="r", type="csv", path=path,
                                                        columns={"x": "x"})) is None
    monkeypatch.setattr(recordings, "MAX_BYTES", 1 << 20)
    monkeypatch.setattr(recordings, "MAX_ROWS", 10)
    assert len(recordings.recorded_readings(CsvSourceConfig(name="r", type="csv", path=path,
                                                            columns={"x": "x"}))) == 10
