"""A simulated wearable: accelerometer and attitude signals for demos and tests.

The model, per sample at ``rate_hz``:

* attitude: roll and pitch wander around a per-agent mean
  (Ornstein-Uhlenbeck, a few tenths of a radian) and sway with each stride
  while moving; yaw drifts slowly (a per-agent turn rate plus a random walk)
  and wraps around;
* activity (the text field ``activity``): a continuous-time Markov chain
  over rest / walk / run whose segments last tens of seconds; walking and
  running give periodic step accelerations (a step-frequency fundamental plus harmonic, a forward
  component and a lateral sway at half the step frequency) whose amplitude
  eases in and out of each segment;
* accelerometer: gravity (1 g) rotated into the body frame by roll and pitch,
  plus the step accelerations, step-to-step jitter and sensor noise;
* heart (what a chest strap's Heart Rate Service gives): ``heart_rate`` (bpm)
  eases towards a per-state target around the wearer's resting rate (time
  constant 20 s) with a little measurement noise, and ``rr_interval`` (s), the
  beat-to-beat interval 60 / rate with a few percent of beat-to-beat
  variability.

Everything is computed per poll with numpy for all the samples due since the
previous poll; nothing runs between polls.  The per-sample randomness comes
from one ``(n, k)`` block per poll, which numpy fills in the same order
however the samples are split into polls, so a run depends on the seed and
the first poll's time, not on when the agent happens to poll.

The seed is ``config.seed`` or a stable hash of (agent_id, source name):
every simulated agent of a fleet differs, and each is reproducible.  numpy's
seeded generator is fine here: this is simulated raw data, not privacy noise.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from edge_agent.config import SYNTHETIC_FIELDS, SyntheticSourceConfig
from edge_agent.readings import Readings
from edge_agent.sources.base import Source
from edge_agent.sources.derive import TWO_PI, apply_derive, wrap_2pi, wrap_pi

REST, WALK, RUN = 0, 1, 2
# The activity field's words, by state (a categorical channel's categories).
ACTIVITIES = np.array(["rest", "walk", "run"], dtype=object)
# Mean seconds spent in each state, and where the chain goes next.
_HOLD_MEAN = (40.0, 30.0, 15.0)
_HOLD_MIN = 3.0
_NEXT = ((0.0, 0.8, 0.2), (0.6, 0.0, 0.4), (0.3, 0.7, 0.0))
# Step frequency (Hz) and vertical amplitude (g): mean and spread per state.
_STEP_HZ = ((0.0, 0.0), (1.85, 0.1), (2.7, 0.15))
_STEP_G = ((0.0, 0.0), (0.25, 0.05), (0.9, 0.15))
_EASE_SECONDS = 1.5  # time constant of the amplitude envelope between states
# Heart rate (bpm) above the wearer's resting rate in each state, how fast it follows,
# its measurement noise, and the beat-to-beat variability of the RR interval.
_HEART_ABOVE_REST = (0.0, 30.0, 80.0)
_HEART_REST = (66.0, 7.0)  # resting rate across wearers: mean, spread
_HEART_TAU = 20.0
_HEART_NOISE_BPM = 1.0
_RR_VARIABILITY = 0.03

_SENSOR_NOISE_G = 0.01
_JITTER = 0.15  # step-to-step irregularity, relative to the amplitude
_ATTITUDE_SD = (0.15, 0.12)  # roll, pitch (rad), stationary spread
_ATTITUDE_TAU = (20.0, 25.0)  # seconds to revert
_YAW_WALK = 0.01  # rad per sqrt(second)

# Columns of the per-sample normal block.
_ROLL, _PITCH, _YAW, _NOISE, _JIT = 0, 1, 2, slice(3, 6), slice(6, 9)
_NORMALS = 9

# A stalled agent catches up over several polls rather than in one huge batch.
MAX_SAMPLES_PER_POLL = 100_000


def stable_seed(agent_id: str, source_name: str) -> int:
    """A 64-bit seed from names; unlike hash() it is the same in every process."""
    digest = hashlib.blake2b(f"{agent_id}\x00{source_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ar1(state: float, decay: float, innovations: np.ndarray) -> np.ndarray:
    """x[k] = decay * x[k-1] + innovations[k] with x[-1] = state, vectorised.

    Uses x[k] = decay^k * (state + cumsum(innovations * decay^-j)), in blocks
    short enough that decay^-j stays below e^4 (no overflow, no lost digits).
    """
    out = np.empty_like(innovations)
    block = max(1, int(4.0 / -math.log(decay))) if 0.0 < decay < 1.0 else 1
    for start in range(0, innovations.size, block):
        chunk = innovations[start:start + block]
        powers = decay ** np.arange(1, chunk.size + 1)
        values = powers * (state + np.cumsum(chunk / powers))
        out[start:start + chunk.size] = values
        state = float(values[-1])
    return out


@dataclass
class _Segments:
    """Activity segments (offsets in seconds from the first sample)."""

    start: np.ndarray
    state: np.ndarray
    step_hz: np.ndarray
    amplitude: np.ndarray  # target amplitude of the segment
    envelope0: np.ndarray  # amplitude when the segment starts
    phase0: np.ndarray  # step phase when the segment starts
    heart0: np.ndarray  # heart rate when the segment starts

    @property
    def end(self) -> float:
        return float(self.start[-1]) if self.start.size else 0.0


class SyntheticSource(Source):
    def __init__(self, config: SyntheticSourceConfig, *, agent_id: str):
        super().__init__(config.name, derive=config.derive, base_fields=SYNTHETIC_FIELDS)
        self.config = config
        self.rate_hz = float(config.rate_hz)
        self.seed = config.seed if config.seed is not None else stable_seed(agent_id, config.name)
        self._total = (None if config.duration is None
                       else max(1, math.ceil(config.duration * self.rate_hz - 1e-9)))
        self._reset()

    def origin(self) -> dict[str, object]:
        return {"rate_hz": f"{self.rate_hz:g}"}

    def _reset(self) -> None:
        children = np.random.SeedSequence(self.seed).spawn(4)
        persona, self._noise_rng, self._chain_rng, self._heart_rng = (
            np.random.default_rng(c) for c in children)
        # Per-agent traits: how this wearer holds the device and turns.
        self._roll_mean = persona.normal(0.0, 0.1)
        self._pitch_mean = persona.normal(0.0, 0.1)
        self._turn_rate = persona.choice((-1.0, 1.0)) * persona.uniform(0.005, 0.03)
        self._roll_dev = persona.normal(0.0, _ATTITUDE_SD[0])
        self._pitch_dev = persona.normal(0.0, _ATTITUDE_SD[1])
        self._yaw = persona.uniform(0.0, TWO_PI)
        self._segments = _Segments(*(np.empty(0) for _ in range(7)))
        first = int(persona.choice(3, p=(0.5, 0.35, 0.15)))
        self._heart_rest = max(45.0, persona.normal(*_HEART_REST))
        self._append_segment(first, 0.0, 0.0, 0.0, self._heart_target(first))
        self._t0: float | None = None
        self._next = 0  # index of the next sample

    def start(self) -> None:
        self._reset()

    # -- the activity chain (a few segments per minute: Python per segment) --------
    def _heart_target(self, state) -> np.ndarray | float:
        return self._heart_rest + np.asarray(_HEART_ABOVE_REST)[state]

    def _append_segment(self, state: int, start: float, envelope0: float,
                        phase0: float, heart0: float) -> None:
        rng = self._chain_rng
        hold = max(_HOLD_MIN, rng.exponential(_HOLD_MEAN[state]))
        step_hz = max(0.0, rng.normal(*_STEP_HZ[state]))
        amplitude = max(0.0, rng.normal(*_STEP_G[state]))
        seg = self._segments
        self._segments = _Segments(
            np.append(seg.start, start), np.append(seg.state, state),
            np.append(seg.step_hz, step_hz), np.append(seg.amplitude, amplitude),
            np.append(seg.envelope0, envelope0), np.append(seg.phase0, phase0),
            np.append(seg.heart0, heart0))
        self._segment_end = start + hold

    def _cover(self, first: float, last: float) -> None:
        """Make the segments span [first, last]; forget those ending before first."""
        while self._segment_end <= last:
            seg, i = self._segments, -1
            span = self._segment_end - seg.start[i]
            envelope = self._envelope(seg.amplitude[i], seg.envelope0[i], span)
            phase = (seg.phase0[i] + TWO_PI * seg.step_hz[i] * span) % (2 * TWO_PI)
            heart = self._eased(self._heart_target(int(seg.state[i])), seg.heart0[i], span,
                                _HEART_TAU)
            state = int(self._chain_rng.choice(3, p=_NEXT[int(seg.state[i])]))
            self._append_segment(state, self._segment_end, float(envelope), float(phase),
                                 float(heart))
        keep = max(0, int(np.searchsorted(self._segments.start, first, side="right")) - 1)
        if keep:
            seg = self._segments
            self._segments = _Segments(*(a[keep:] for a in (
                seg.start, seg.state, seg.step_hz, seg.amplitude, seg.envelope0, seg.phase0,
                seg.heart0)))

    @staticmethod
    def _eased(target, start, elapsed, tau):
        """From ``start`` towards ``target`` with time constant ``tau``."""
        return target + (start - target) * np.exp(-elapsed / tau)

    @classmethod
    def _envelope(cls, target, envelope0, elapsed):
        return cls._eased(target, envelope0, elapsed, _EASE_SECONDS)

    # -- sampling --------------------------------------------------------------------
    def poll(self, now: float) -> Readings:
        if self.finished:
            return Readings.empty(self.fields)
        if self._t0 is None:
            self._t0 = now  # the clock starts at the first poll
        # Samples with offset <= now; the epsilon absorbs float rounding of now - t0.
        due = math.floor((now - self._t0) * self.rate_hz + 1e-6) + 1
        if self._total is not None:
            due = min(due, self._total)
        n = min(due - self._next, MAX_SAMPLES_PER_POLL)
        if n <= 0:
            return Readings.empty(self.fields)
        readings = self._generate(self._next, n)
        self._next += n
        if self._total is not None and self._next >= self._total:
            self.finished = True
        return readings

    def _generate(self, first: int, n: int) -> Readings:
        dt = 1.0 / self.rate_hz
        offsets = np.arange(first, first + n) / self.rate_hz
        normals = self._noise_rng.standard_normal((n, _NORMALS))
        self._cover(float(offsets[0]), float(offsets[-1]))

        envelope, phase = self._gait(offsets)
        roll, pitch, yaw = self._attitude(normals, dt, envelope, phase)
        accel = self._acceleration(roll, pitch, envelope, phase, normals)

        heart_rate, rr_interval = self._heart(offsets)
        readings = Readings(self._t0 + offsets, {
            "accel_x": accel[0], "accel_y": accel[1], "accel_z": accel[2],
            "roll": roll, "pitch": pitch, "yaw": yaw,
            "heart_rate": heart_rate, "rr_interval": rr_interval,
        }, {"activity": ACTIVITIES[self._activity(offsets)]})
        return apply_derive(readings, ("horizontal",) + self.derive)

    def _activity(self, offsets: np.ndarray) -> np.ndarray:
        """The state (REST, WALK, RUN) at each offset."""
        seg = self._segments
        return seg.state[np.searchsorted(seg.start, offsets, side="right") - 1].astype(np.int64)

    def _heart(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Heart rate (bpm, measured) and RR interval (s, one beat's) at each offset."""
        seg = self._segments
        index = np.searchsorted(seg.start, offsets, side="right") - 1
        rate = self._eased(self._heart_target(seg.state[index].astype(np.int64)),
                           seg.heart0[index], offsets - seg.start[index], _HEART_TAU)
        noise = self._heart_rng.standard_normal((offsets.size, 2))
        rr = 60.0 / rate * (1.0 + _RR_VARIABILITY * noise[:, 1])
        return rate + _HEART_NOISE_BPM * noise[:, 0], rr

    def _gait(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step amplitude envelope and step phase at each offset."""
        seg = self._segments
        index = np.searchsorted(seg.start, offsets, side="right") - 1
        since = offsets - seg.start[index]
        envelope = self._envelope(seg.amplitude[index], seg.envelope0[index], since)
        phase = seg.phase0[index] + TWO_PI * seg.step_hz[index] * since
        return envelope, phase

    def _attitude(self, normals, dt, envelope, phase):
        decay = [math.exp(-dt / tau) for tau in _ATTITUDE_TAU]
        scale = [sd * math.sqrt(1.0 - d * d) for sd, d in zip(_ATTITUDE_SD, decay)]
        roll_dev = ar1(self._roll_dev, decay[0], scale[0] * normals[:, _ROLL])
        pitch_dev = ar1(self._pitch_dev, decay[1], scale[1] * normals[:, _PITCH])
        self._roll_dev, self._pitch_dev = float(roll_dev[-1]), float(pitch_dev[-1])

        # The body rolls with each stride and pitches with each step.
        roll = wrap_pi(self._roll_mean + roll_dev + 0.08 * envelope * np.sin(phase / 2))
        pitch = wrap_pi(self._pitch_mean + pitch_dev + 0.05 * envelope * np.sin(phase))

        turns = self._turn_rate * dt + _YAW_WALK * math.sqrt(dt) * normals[:, _YAW]
        yaw = self._yaw + np.cumsum(turns)
        self._yaw = float(np.mod(yaw[-1], TWO_PI))
        return roll, pitch, wrap_2pi(yaw)

    @staticmethod
    def _acceleration(roll, pitch, envelope, phase, normals) -> np.ndarray:
        # Gravity seen by a device at this roll and pitch (the inverse of "tilt").
        cos_pitch = np.cos(pitch)
        gravity = np.stack([-np.sin(pitch), np.sin(roll) * cos_pitch, np.cos(roll) * cos_pitch])
        steps = envelope * np.stack([
            0.45 * np.sin(phase + 1.2),  # forward push-off
            0.25 * np.sin(phase / 2 + 0.3),  # lateral sway, once per stride
            np.sin(phase) + 0.35 * np.sin(2 * phase + 0.6),  # vertical impacts
        ])
        jitter = _JITTER * envelope * normals[:, _JIT].T
        return gravity + steps + jitter + _SENSOR_NOISE_G * normals[:, _NOISE].T


def simulated_readings(config: SyntheticSourceConfig, *, wearers: int = 8,
                       seconds: float = 600.0) -> Readings:
    """What a fleet of this source reads: ``wearers`` simulated wearers (agent ids
    ``sim-<i>``), ``seconds`` each, their numeric fields one after another.  Where the
    readings lie, for check-config (whether they reach a mechanism's flat ends)."""
    parts = []
    for wearer in range(wearers):
        source = SyntheticSource(config, agent_id=f"sim-{wearer}")
        source.poll(0.0)
        parts.append(source.poll(seconds))
    return Readings(np.concatenate([p.times for p in parts]),
                    {name: np.concatenate([p.fields[name] for p in parts])
                     for name in parts[0].fields})
