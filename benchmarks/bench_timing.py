"""Timing side channel: does a report's computation depend on its value?

A kernel whose work depends on the value it perturbs, or on the secret randomness that
together with the report tells about the value, lets whoever sees how long a report took
(a process on the device, a network observer timing the messages) learn more than the
report itself (Jin et al., "Are We There Yet? Timing and Floating-Point Attacks on
Differential Privacy Systems", IEEE S&P 2022: the discrete Gaussian sampler's running
time grows with |noise|, so time and report together narrow down the value).

For each mechanism (built from the registry as a channel builds it, ε = 1, 16-bit grid,
on [-2, 2]; Opt-GM at δ = 1e-6; the vector mechanisms on 4 axes, where Duchi et al.'s
half-spaces T+ and T- differ in size):

* **Batches.**  Batches of ``--batch`` values all at the domain's low end, all in the
  middle, all at the high end, and a fixed random mix; ``--rounds`` rounds, each timing
  every mechanism on every value set (the sets' order rotated from round to round, so
  that the machine's load falls on all alike) through ``perturb_codes``, the call a
  channel makes, twice: with the CSPRNG (what a device does) and with words drawn from it
  beforehand and handed out again in turn (the mechanism's own computation, without the
  CSPRNG's cost and noise).  Median and p95 of ns per value (per tuple for the vector
  mechanisms), and the ratio to the middle's median.
* **Words.**  How many CSPRNG words each value's draw reads, exactly: the kernels are
  called one value at a time on seeded words and report their own word positions
  (``_kernels._gaussian_cells``, ``tent._tent_linear``, ``_categorical.sign_vectors`` and
  ``sampled_axes``; the three-piece kernels read word i for value i).  A source wrapped to
  count (``bench_mechanisms.CountingSource``) sees only what a batch *asks* for, a fixed
  multiple of its size: the words a draw reads are the exact, load-independent measure of
  its work.  Also conditioned on the hidden randomness the work follows: Opt-GM's
  |noise| / σ, II-PTT's tent or floor, Duchi's half-space (at the ends, where V is the
  value's own sign pattern).
* **One value a call.**  Opt-GM's single report (a batch of 1), at each end and in the
  middle, interleaved: through ``perturb_codes`` with the CSPRNG, and the kernel alone on
  words drawn beforehand, by input value and by the |noise| / σ it drew (read off the
  code: the code minus the value's lattice position).

Run: ``python -m benchmarks.bench_timing [--batch 4096] [--rounds 2000] [--singles 100000]
[--draws 200000] [--markdown FILE]`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import gc
import math
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.machine import describe_machine, print_table
from edge_agent.mechanisms import _categorical, _kernels
from edge_agent.mechanisms.gaussian import OptimalGaussian
from edge_agent.mechanisms.multidimensional import DuchiVector, SampledDuchi
from edge_agent.mechanisms.randomness import SeededRandom, SystemRandom
from edge_agent.mechanisms.registry import VECTOR, linear_mechanism
from edge_agent.mechanisms.tent import _SHIFT as TENT_SHIFT
from edge_agent.mechanisms.tent import TypeIIPTT, _tent_linear

EPSILON = 1.0
DELTA = 1e-6
GRID_BITS = 16
LOW, HIGH = -2.0, 2.0
DIMENSIONS = 4
SETS = ("low", "middle", "high", "mix")
# |noise| / σ bins of Opt-GM's conditioning.
SIGMA_BINS = ((0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, math.inf))
# Words-read bins of the kernel's single calls.
WORD_BINS = ((1, 8), (9, 16), (17, 32), (33, 64), (65, 1 << 30))
SEED = 20261129


@dataclass
class Subject:
    label: str
    mechanism: Any
    vector: bool = False
    values: dict[str, np.ndarray] = field(default_factory=dict)


def subjects() -> list[Subject]:
    def linear(name: str, **extra: float) -> Any:
        return linear_mechanism(name, epsilon=EPSILON, low=LOW, high=HIGH,
                                grid_bits=GRID_BITS, **extra)

    def vector(name: str) -> Any:
        return VECTOR[name](epsilon=EPSILON, dimensions=DIMENSIONS, low=LOW, high=HIGH)

    return [
        Subject("OGPM", linear("ogpm")),
        Subject("PM-C", linear("pm-c")),
        Subject("Duchi", linear("duchi")),
        Subject(f"duchi-vector (d {DIMENSIONS})", vector("duchi-vector"), vector=True),
        Subject(f"sampled-duchi (d {DIMENSIONS})", vector("sampled-duchi"), vector=True),
        Subject("II-PTT", linear("ii-ptt")),
        Subject(f"Opt-GM (δ {DELTA:g})", linear("opt-gm", delta=DELTA)),
    ]


def value_sets(subject: Subject, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shape = (n, DIMENSIONS) if subject.vector else (n,)
    return {"low": np.full(shape, LOW), "middle": np.full(shape, 0.5 * (LOW + HIGH)),
            "high": np.full(shape, HIGH), "mix": rng.uniform(LOW, HIGH, shape)}


class PredrawnSource:
    """CSPRNG words drawn once and handed out again in turn, from a pool several batches
    long (so that no branch predictor learns them, and small enough to stay in cache):
    times the kernels without the CSPRNG's cost.  For timing only: the words repeat."""

    def __init__(self, total: int):
        self.pool = SystemRandom().words(total)
        self.at = 0

    def words(self, count: int) -> np.ndarray:
        if count > self.pool.size:
            raise ValueError(f"a pool of {self.pool.size:,} words cannot give {count:,}")
        if self.at + count > self.pool.size:
            self.at = 0
        self.at += count
        return self.pool[self.at - count:self.at]


class RequestCounter:
    """Counts the words a call *asks* for (what wrapping the source can see)."""

    def __init__(self, inner: Any):
        self.inner, self.count = inner, 0

    def words(self, count: int) -> np.ndarray:
        self.count += count
        return self.inner.words(count)


# -- words read, one value at a time ----------------------------------------------------

def _one_at_a_time(n: int, words: np.ndarray, call) -> np.ndarray:
    """Words read per value: ``call(i, w)`` runs the kernel on value i with the words ``w``
    and returns how many it read, or None when they ran out (then it is given more of the
    same words, as the wrappers replay a value)."""
    used = np.zeros(n, dtype=np.int64)
    pos = 0
    for i in range(n):
        chunk = 256
        while True:
            if pos + chunk > words.size:
                raise RuntimeError("not enough seeded words")
            read = call(i, words[pos:pos + chunk])
            if read is not None:
                break
            chunk *= 4
        used[i] = read
        pos += read
    return used


def words_read(mechanism: Any, x: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """{'words': per value, and what the work follows: 'noise_sigmas' (Opt-GM), 'tent'
    (II-PTT), 'plus' (Duchi's half-space, at the ends only; else absent)}."""
    n = x.shape[0]
    words = SeededRandom(np.random.default_rng(seed)).words(64 * n * max(1, x[0].size) + 4096)
    one32 = np.empty(1, dtype=np.uint32)
    if isinstance(mechanism, OptimalGaussian):
        m = mechanism
        clipped = np.clip(x, m.low, m.high)
        top = 2 * m.tail_cells + m.steps
        args = (float(m.low), 1.0 / float(m.step), int(m.steps), int(m.tail_cells), int(top),
                int(m.t), int(m.m))
        codes = np.empty(n, dtype=np.int64)

        def call(i, w):
            done, read = _kernels._gaussian_cells(clipped[i:i + 1], w, one32, 0, *args)
            codes[i] = one32[0]
            return read if done == 1 else None

        used = _one_at_a_time(n, words, call)
        noise = codes - m.tail_cells - (clipped - m.low) / m.step
        return {"words": used, "noise_sigmas": np.abs(noise) * m.step / m.sigma}
    if isinstance(mechanism, TypeIIPTT):
        m = mechanism
        codes = np.empty(n, dtype=np.int64)
        tent = np.zeros(n, dtype=bool)
        flat = np.uint64(m.ticks) * np.uint64(m.floor)
        accept = flat + np.uint64(m.slope) * np.uint64(m.half) * np.uint64(m.half)

        def call(i, w):
            done, read, _, _ = _tent_linear(x[i:i + 1], w, one32, 0, 0, 1, *m._kernel_args)
            if done != 1:
                return None
            codes[i] = one32[0]
            # The accepted word is the last one read (floor) or the one before the centre's
            # coin (tent, in [T F, accept)); a floor's earlier words were rejections.
            tent[i] = read >= 2 and flat <= (w[read - 2] >> TENT_SHIFT) < accept
            return read

        used = _one_at_a_time(n, words, call)
        near = np.abs(codes - m.centre_positions(x)) < m.half + 1
        return {"words": used, "tent": tent, "near_centre": near}
    if isinstance(mechanism, DuchiVector):
        m = mechanism
        xn, _ = m._normalized(x)
        out = np.zeros(1, dtype=np.uint64)
        signs = np.zeros(n, dtype=np.uint64)
        alpha = np.uint64(m.alpha_weight)

        def call(i, w):
            done, read = _categorical.sign_vectors(xn[i:i + 1], w, alpha, out, 0)
            signs[i] = out[0]
            return read if done == 1 else None

        used = _one_at_a_time(n, words, call)
        result = {"words": used}
        if np.all(np.abs(xn) == 1.0) and np.all(xn == xn[:1]):  # an end: V is x's signs
            v = sum(1 << j for j in range(m.dimensions) if xn[0, j] > 0)
            agree = np.array([m.dimensions - bin(int(s) ^ v).count("1") for s in signs])
            result["plus"] = 2 * agree > m.dimensions
        return result
    if isinstance(mechanism, SampledDuchi):
        m = mechanism
        xn, _ = m._normalized(x)
        order = np.empty(m.dimensions, dtype=np.int64)
        mask = np.zeros(1, dtype=np.uint64)
        out = np.zeros(1, dtype=np.uint64)
        alpha = np.uint64(m.axis.alpha_weight)

        def call(i, w):
            done, read = _categorical.sampled_axes(w, m.k, order, mask, 0)
            if done != 1:
                return None
            for j in range(m.dimensions):
                if int(mask[0]) >> j & 1:
                    done, more = _categorical.sign_vectors(np.array([[xn[i, j]]]), w[read:],
                                                           alpha, out, 0)
                    if done != 1:
                        return None
                    read += more
            return read

        return {"words": _one_at_a_time(n, words, call)}
    # The three-piece kernels (OGPM, PM, PM-C, SW, PTT, Duchi): word i for value i.
    return {"words": np.ones(n, dtype=np.int64)}


# -- timing ---------------------------------------------------------------------------------

def time_batches(items: list[Subject], rounds: int, asked: dict[str, int]):
    """{(label, source, set): ns per value of every round}.  ``asked``: the words a batch
    of each mechanism asks for, from which its predrawn pool is sized (eight batches'
    worth: small enough to stay in cache, the words never repeating in step)."""
    csprng = SystemRandom()
    pools = {s.label: PredrawnSource(max(8 * asked[s.label] + 1024, 1 << 15)) for s in items}
    times: dict[tuple[str, str, str], list[float]] = {}
    for s in items:  # JIT and allocator warm-up
        for source in (csprng, pools[s.label]):
            for x in s.values.values():
                s.mechanism.perturb_codes(x, source)
    gc.disable()
    try:
        for r in range(rounds):
            order = SETS[r % len(SETS):] + SETS[:r % len(SETS)]
            for s in items:
                for source_name, source in (("CSPRNG", csprng), ("predrawn", pools[s.label])):
                    for kind in order:
                        x = s.values[kind]
                        start = time.perf_counter_ns()
                        s.mechanism.perturb_codes(x, source)
                        elapsed = time.perf_counter_ns() - start
                        times.setdefault((s.label, source_name, kind), []).append(
                            elapsed / x.shape[0])
    finally:
        gc.enable()
    return times


def time_singles(mechanism: OptimalGaussian, singles: int, seed: int) -> dict[str, Any]:
    """Opt-GM one value a call, the three inputs interleaved.  Per input: the public call's
    ns, the |noise| / σ it drew and whether it had to ask for more words than its first 80
    (a refill); the kernel's ns on predrawn words, its |noise| / σ and words read; and the
    kernel called on no value at all (its dispatch)."""
    m = mechanism
    inputs = {"low": m.low, "middle": 0.5 * (m.low + m.high), "high": m.high}
    top = 2 * m.tail_cells + m.steps
    args = (float(m.low), 1.0 / float(m.step), int(m.steps), int(m.tail_cells), int(top),
            int(m.t), int(m.m))
    source = RequestCounter(SystemRandom())
    pool = SeededRandom(np.random.default_rng(seed)).words(24 * 3 * singles + (1 << 16))
    arrays = {k: np.array([v]) for k, v in inputs.items()}
    nothing = np.empty(0)
    keys = ("public_ns", "public_sigmas", "refill", "kernel_ns", "kernel_sigmas", "words",
            "empty_ns")
    result = {name: {key: np.empty(singles) for key in keys} for name in inputs}
    one32 = np.empty(1, dtype=np.uint32)
    for x in arrays.values():  # warm-up
        m.perturb_codes(x, source)
        _kernels._gaussian_cells(x, pool[:4096], one32, 0, *args)
        _kernels._gaussian_cells(nothing, pool[:4096], one32, 0, *args)
    first = 16 + 64  # what a batch of one asks for at once (_kernels.gaussian_cells)
    pos = 0
    gc.disable()
    try:
        for i in range(singles):
            for name, x in arrays.items():
                row = result[name]
                position = (x[0] - m.low) / m.step
                before = source.count
                start = time.perf_counter_ns()
                code = m.perturb_codes(x, source)
                row["public_ns"][i] = time.perf_counter_ns() - start
                row["refill"][i] = source.count - before > first
                row["public_sigmas"][i] = abs(int(code[0]) - m.tail_cells - position)
                chunk = 256
                while True:
                    if pos + chunk > pool.size:
                        pos = 0  # words again: timing only
                    w = pool[pos:pos + chunk]
                    start = time.perf_counter_ns()
                    done, read = _kernels._gaussian_cells(x, w, one32, 0, *args)
                    elapsed = time.perf_counter_ns() - start
                    if done == 1:
                        break
                    chunk *= 4
                pos += read
                row["kernel_ns"][i] = elapsed
                row["kernel_sigmas"][i] = abs(int(one32[0]) - m.tail_cells - position)
                row["words"][i] = read
                start = time.perf_counter_ns()
                _kernels._gaussian_cells(nothing, w, one32, 0, *args)
                row["empty_ns"][i] = time.perf_counter_ns() - start
    finally:
        gc.enable()
    scale = m.step / m.sigma
    for row in result.values():
        row["public_sigmas"] *= scale
        row["kernel_sigmas"] *= scale
        row["refill"] = row["refill"].astype(bool)
    return result


# -- the run --------------------------------------------------------------------------------

def run(batch: int, rounds: int, singles: int, draws: int) -> dict[str, Any]:
    rng = np.random.default_rng(SEED)
    items = subjects()
    for s in items:
        s.values = value_sets(s, batch, rng)
    # Words: exact, per value, and what a batch asks for.
    words, asked = {}, {}
    for k, s in enumerate(items):
        for j, kind in enumerate(SETS):
            read = words_read(s.mechanism, s.values[kind], SEED + 100 * k + j)
            counter = RequestCounter(SeededRandom(np.random.default_rng(SEED)))
            s.mechanism.perturb_codes(s.values[kind], counter)
            read["requested"] = counter.count / batch
            asked[s.label] = max(asked.get(s.label, 0), counter.count)
            words[(s.label, kind)] = read
    # What the work follows, on more draws: Opt-GM's noise (its tails are rare), II-PTT's
    # branch, Duchi's half-space at the two ends.
    hidden = {}
    for k, s in enumerate(items):
        m = s.mechanism
        if isinstance(m, OptimalGaussian):
            hidden[s.label] = words_read(m, rng.uniform(LOW, HIGH, draws), SEED + 1000 + k)
        elif isinstance(m, TypeIIPTT):
            hidden[s.label] = words_read(m, rng.uniform(LOW, HIGH, draws // 4), SEED + 1000 + k)
        elif isinstance(m, DuchiVector):
            ends = [words_read(m, np.full((draws // 8, DIMENSIONS), end), SEED + 1000 + k + e)
                    for e, end in enumerate((LOW, HIGH))]
            hidden[s.label] = {key: np.concatenate([part[key] for part in ends])
                               for key in ("words", "plus")}
        elif isinstance(m, SampledDuchi):  # its axis reports: Duchi's mechanism at d = 1
            ends = [words_read(m.axis, np.full((draws // 8, 1), end), SEED + 1000 + k + e)
                    for e, end in enumerate((-1.0, 1.0))]
            hidden[s.label] = {key: np.concatenate([part[key] for part in ends])
                               for key in ("words", "plus")}
    started = time.perf_counter()
    times = time_batches(items, rounds, asked)
    batch_seconds = time.perf_counter() - started
    gaussian = next(s for s in items if isinstance(s.mechanism, OptimalGaussian))
    started = time.perf_counter()
    single = time_singles(gaussian.mechanism, singles, SEED + 7)
    single_seconds = time.perf_counter() - started
    return {"items": items, "words": words, "hidden": hidden, "times": times,
            "single": single, "gaussian": gaussian, "batch": batch, "rounds": rounds,
            "singles": singles, "draws": draws, "seconds": (batch_seconds, single_seconds)}


def _q(values, q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=np.float64), q))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "-"


def _bin_label(lo: float, hi: float) -> str:
    return f"{lo:g}-{hi:g}" if math.isfinite(hi) else f"≥ {lo:g}"


def _batch_table(result: dict[str, Any]) -> list[str]:
    words, times = result["words"], result["times"]
    lines = [
        "| mechanism | values | CSPRNG median ns/value | p95 | ÷ middle | predrawn median "
        "ns/value | p95 | ÷ middle | words read/value | max | asked/value |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in result["items"]:
        mids = {src: _q(times[(s.label, src, "middle")], 0.5) for src in ("CSPRNG", "predrawn")}
        for kind in SETS:
            cells = []
            for src in ("CSPRNG", "predrawn"):
                t = times[(s.label, src, kind)]
                median = _q(t, 0.5)
                cells += [f"{median:.1f}", f"{_q(t, 0.95):.1f}", _ratio(median, mids[src])]
            w = words[(s.label, kind)]["words"]
            error = w.std() / math.sqrt(w.size)
            spread = f" ± {error:.2f}" if error > 0 else ""
            lines.append(f"| {s.label} | {kind} | {' | '.join(cells)} | {w.mean():.2f}{spread} "
                         f"| {w.max()} | {words[(s.label, kind)]['requested']:.2f} |")
    return lines


def _hidden_table(result: dict[str, Any]) -> list[str]:
    lines = [
        "| mechanism | condition | share | words read/value | p99 | max | note |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for s in result["items"]:
        h = result["hidden"].get(s.label)
        if h is None:
            continue
        w = h["words"]
        if "noise_sigmas" in h:
            for lo, hi in SIGMA_BINS:
                sel = (h["noise_sigmas"] >= lo) & (h["noise_sigmas"] < hi)
                if sel.any():
                    lines.append(
                        f"| {s.label} | \\|noise\\| / σ {_bin_label(lo, hi)} | {sel.mean():.4f} "
                        f"| {w[sel].mean():.2f} | {_q(w[sel], 0.99):.0f} | {w[sel].max()} | "
                        f"> 80 words (a lone value's refill): {np.mean(w[sel] > 80):.2%} |")
        if "tent" in h:
            for flag, label in ((False, "floor drawn"), (True, "tent drawn")):
                sel = h["tent"] == flag
                lines.append(f"| {s.label} | {label} | {sel.mean():.3f} | {w[sel].mean():.3f} | "
                             f"{_q(w[sel], 0.99):.0f} | {w[sel].max()} | report near the value: "
                             f"{h['near_centre'][sel].mean():.3f} |")
        if "plus" in h:
            where = "at the two ends"
            if isinstance(s.mechanism, SampledDuchi):
                where = "an axis report (d = 1) " + where
            for flag, label in ((True, "report in T+ (agrees with V)"), (False, "report in T-")):
                sel = h["plus"] == flag
                lines.append(f"| {s.label} | {label} | {sel.mean():.3f} | {w[sel].mean():.2f} | "
                             f"{_q(w[sel], 0.99):.0f} | {w[sel].max()} | {where} |")
    return lines


def _single_tables(result: dict[str, Any]) -> list[str]:
    single = result["single"]
    lines = [
        "| call | input | median ns | p99 ns | ÷ middle (median) | words read: mean | p99 |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for call, key in (("perturb_codes", "public_ns"), ("kernel", "kernel_ns"),
                      ("kernel, no value (dispatch)", "empty_ns")):
        mid = _q(single["middle"][key], 0.5)
        for name in ("low", "middle", "high"):
            t, w = single[name][key], single[name]["words"]
            words_cells = f"{w.mean():.2f} | {_q(w, 0.99):.0f}" if key == "kernel_ns" else "|"
            lines.append(f"| {call} | {name} | {_q(t, 0.5):.0f} | {_q(t, 0.99):.0f} | "
                         f"{_ratio(_q(t, 0.5), mid)} | {words_cells} |")
    lines += [
        "",
        "By the |noise| drawn (the three inputs pooled); *refill*: the public calls that asked "
        "for more words than the 80 a batch of one asks for first:",
        "",
        "| call | \\|noise\\| / σ | share | median ns | p99 ns | ÷ below 1 σ (median) "
        "| words read: mean | p99 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]

    def pooled(key):
        return np.concatenate([single[k][key] for k in single])

    for call, key, sig_key in (("perturb_codes", "public_ns", "public_sigmas"),
                               ("kernel", "kernel_ns", "kernel_sigmas")):
        t, sig, w = pooled(key), pooled(sig_key), pooled("words")
        base = _q(t[sig < 1.0], 0.5)
        for lo, hi in SIGMA_BINS:
            sel = (sig >= lo) & (sig < hi)
            if not sel.any():
                continue
            words_cells = (f"{w[sel].mean():.2f} | {_q(w[sel], 0.99):.0f}" if call == "kernel"
                           else "|")
            lines.append(f"| {call} | {_bin_label(lo, hi)} | {sel.mean():.4f} | "
                         f"{_q(t[sel], 0.5):.0f} | {_q(t[sel], 0.99):.0f} | "
                         f"{_ratio(_q(t[sel], 0.5), base)} | {words_cells} |")
        if call == "perturb_codes":
            refill = pooled("refill").astype(bool)
            for flag, label in ((False, "no refill"), (True, "refill")):
                sel = refill == flag
                if sel.any():
                    lines.append(f"| {call} | {label} | {sel.mean():.4f} | "
                                 f"{_q(t[sel], 0.5):.0f} | {_q(t[sel], 0.99):.0f} | "
                                 f"{_ratio(_q(t[sel], 0.5), base)} | | |")
    t, w = pooled("kernel_ns"), pooled("words")
    empty = _q(pooled("empty_ns"), 0.5)
    lines += [
        "",
        "The kernel alone by the words it read (the three inputs pooled); *own*: the median "
        f"less the empty call's ({empty:.0f} ns):",
        "",
        "| words read | share | median ns | own ns | p99 ns | ÷ fewest (own) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = None
    for lo, hi in WORD_BINS:
        sel = (w >= lo) & (w <= hi)
        if not sel.any():
            continue
        own = _q(t[sel], 0.5) - empty
        base = own if base is None else base
        label = f"{lo}-{hi}" if hi < 1 << 30 else f"≥ {lo}"
        lines.append(f"| {label} | {sel.mean():.4f} | {_q(t[sel], 0.5):.0f} | {own:.0f} | "
                     f"{_q(t[sel], 0.99):.0f} | {_ratio(own, base)} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    batch, rounds, singles = result["batch"], result["rounds"], result["singles"]
    g = result["gaussian"]
    batch_s, single_s = result["seconds"]
    return "\n".join([
        f"ε = {EPSILON:g}, {GRID_BITS}-bit grid, domain [{LOW:g}, {HIGH:g}]; Opt-GM δ = "
        f"{DELTA:g} (σ = {g.mechanism.sigma / g.mechanism.step:,.0f} lattice steps); the "
        f"vector mechanisms on {DIMENSIONS} axes (a value is a tuple).",
        "",
        f"**Batches of {batch:,} values**, {rounds:,} rounds of every mechanism x value set x "
        "source, the sets' order rotated each round. *low*, *middle*, *high*: every value at "
        "the domain's low end, its middle, its high end; *mix*: uniform over the domain. "
        "*CSPRNG*: perturb_codes drawing from the OS-seeded CSPRNG; *predrawn*: from words "
        "drawn from it beforehand (the mechanism's own computation). *÷ middle*: the median "
        "over the middle's. *words read*: CSPRNG words the kernel reads per value, exactly "
        "(seeded words, one value at a time; ± one standard error); *asked*: what "
        "perturb_codes asks its source for per value, all a wrapped source can count.",
        "",
        *_batch_table(result),
        "",
        "**Work that follows the hidden randomness** (words read per value, exact; Opt-GM "
        f"{result['draws']:,} values and II-PTT {result['draws'] // 4:,} uniform over the "
        f"domain, duchi-vector {result['draws'] // 8:,} tuples at each end, where V is the "
        "value's own sign pattern). *report near the value*: within the tent's half-width "
        "of the value's tent centre.",
        "",
        *_hidden_table(result),
        "",
        f"**{g.label}, one value a call** ({singles:,} calls per input, the three inputs "
        "interleaved): *perturb_codes*, the public call with the CSPRNG; *kernel*: "
        "_kernels._gaussian_cells alone on predrawn words, numba's dispatch included; "
        "*no value*: the same call on an empty batch (the dispatch alone).",
        "",
        *_single_tables(result),
        "",
        f"Timed batches {batch_s:.0f} s, single calls {single_s:.0f} s.",
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--singles", type=int, default=100_000,
                        help="Opt-GM single-value calls per input")
    parser.add_argument("--draws", type=int, default=200_000,
                        help="Opt-GM values whose words are counted by the noise drawn")
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args()
    result = run(args.batch, args.rounds, args.singles, args.draws)
    table = (f"Machine: {describe_machine()}, {ssl.OPENSSL_VERSION}\n\n" + markdown(result))
    print_table(table, args.markdown)


if __name__ == "__main__":
    main()
