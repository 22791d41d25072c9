"""Batch sampling kernels.

Private ``@njit`` functions work on plain arrays and scalars and allocate
nothing; each has a thin public wrapper that checks dtypes and lengths.
Randomness arrives as an array of uniform 64-bit words produced outside
numba (see ``randomness.py``); numba's ``np.random`` is never used.

The three-piece kernels draw exactly one word per value and are branch-free
in the hot path: whether the word falls in the 'base' layer (weight A on
every tick) or the 'extra' layer (weight D on the central ticks) is a data
dependent coin flip that a branch predictor cannot learn.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# --------------------------------------------------------------------------
# Three-piece mechanisms (see _layout.py for the integer construction)
# --------------------------------------------------------------------------


@njit(cache=True, nogil=True, boundscheck=False)
def _tpm_tick(word, left, shift, base_total, extra, inv_extra, mask):
    """Tick index drawn from one word, for a central interval starting at ``left``."""
    u = np.int64(word >> np.uint64(shift))  # uniform on [0, 2**TOTAL_BITS)
    e = u - base_total  # >= 0: inside the extra layer
    # Exact e // extra through the float reciprocal: e < 2**53, so the estimate
    # is off by at most one and the remainder test corrects it.
    q = np.int64(np.float64(e) * inv_extra)
    r = e - q * extra
    q += np.int64(r >= extra) - np.int64(r < 0)
    return (u & mask) if e < 0 else (left + q)


@njit(cache=True, nogil=True, boundscheck=False)
def _tpm_linear(x, words, out, value_origin, value_step, low, high, slope, intercept, max_left,
                shift, base_total, extra, inv_extra, cell_shift, mask):
    """Perturb ``x`` on a bounded line; returns (non-finite count, clipped count).

    Writes ``value_origin + cell * value_step`` to ``out``: the cell codes (a uint32
    ``out`` with 0 and 1) or the cells' centres (a float64 ``out``); numba compiles
    one loop for each.
    """
    bad = 0
    clipped = 0
    for i in range(x.shape[0]):
        v = x[i]
        bad += not math.isfinite(v)
        c = min(max(v, low), high)
        clipped += c != v
        # Ticks from the start of the output domain; truncation equals floor
        # after the clamp to [0, max_left].
        left = np.int64(slope * (c - low) + intercept)
        left = min(max(left, 0), max_left)
        tick = _tpm_tick(words[i], left, shift, base_total, extra, inv_extra, mask)
        out[i] = value_origin + (tick >> cell_shift) * value_step
    return bad, clipped


@njit(cache=True, nogil=True, boundscheck=False)
def _circle_offset(v, origin, period):
    """(v - origin) mod period in [0, period) for a v outside that turn, any finite size.

    v - origin, or v * scale, can overflow or keep none of the angle for a huge v; fmod
    is exact, so each remainder is the true one and only their difference rounds.
    ``CircularThreePiece.start_ticks`` (grid_pmf) does the same in numpy.
    """
    d = np.fmod(np.fmod(v, period) - np.fmod(origin, period), period)
    if d < 0.0:
        d += period
    return d if d < period else 0.0  # d + period rounded up to a whole turn


@njit(cache=True, nogil=True, boundscheck=False)
def _tpm_circular(x, words, out, value_origin, value_step, origin, period, scale, offset, shift,
                  base_total, extra, inv_extra, cell_shift, mask):
    """Perturb angles on a circle; returns (non-finite count, wrapped count).  ``out`` as
    for ``_tpm_linear``."""
    bad = 0
    wrapped = 0
    ticks = np.float64(mask + 1)
    inv_ticks = 1.0 / ticks  # exact: the tick count is a power of two
    for i in range(x.shape[0]):
        v = x[i]
        bad += not math.isfinite(v)
        d = v - origin
        outside = (d < 0.0) | (d >= period)
        wrapped += outside
        if outside:
            d = _circle_offset(v, origin, period)
        t = d * scale
        t -= math.floor(t * inv_ticks) * ticks  # wrap into [0, T)
        left = np.int64(math.floor(t + offset)) & mask
        tick = _tpm_tick(words[i], left, shift, base_total, extra, inv_extra, mask) & mask
        out[i] = value_origin + (tick >> cell_shift) * value_step
    return bad, wrapped


@njit(cache=True, nogil=True, boundscheck=False)
def _cell_values(codes, values, value_origin, value_step, n_cells):
    """Cell centres of ``codes``; returns how many codes are outside [0, n_cells)."""
    bad = 0
    for i in range(codes.shape[0]):
        c = np.int64(codes[i])
        bad += (c < 0) | (c >= n_cells)
        values[i] = value_origin + c * value_step
    return bad


def _is(array, kind, itemsize):
    # kind/itemsize tests: portable across platforms and cheaper than dtype equality.
    return array.dtype.kind == kind and array.dtype.itemsize == itemsize


def _check_batch(x, words, out, words_needed):
    if not _is(x, "f", 8) or x.ndim != 1 or not x.flags.c_contiguous:
        raise TypeError("x must be a contiguous 1-D float64 array")
    if not (_is(out, "u", 4) or _is(out, "f", 8)) or out.shape != x.shape:
        raise TypeError("out must be a uint32 (codes) or float64 (values) array shaped like x")
    if not _is(words, "u", 8) or words.ndim != 1 or words.shape[0] < words_needed:
        raise ValueError(f"need at least {words_needed} uint64 random words")


def linear_args(*, low, high, slope, intercept, max_left, constants):
    """The kernel's scalar parameters, built once per mechanism."""
    return (float(low), float(high), float(slope), float(intercept), int(max_left),
            *(int(c) if isinstance(c, int) else float(c) for c in constants))


def circular_args(*, origin, period, scale, offset, constants):
    return (float(origin), float(period), float(scale), float(offset),
            *(int(c) if isinstance(c, int) else float(c) for c in constants))


def _emit(out, grid_values):
    """How a kernel writes a draw into ``out``: codes as they are, or cell centres."""
    return (0, 1) if out.dtype.kind == "u" else (float(grid_values[0]), float(grid_values[1]))


def tpm_linear(x, words, out, args, grid_values=(0.0, 0.0)):
    """Validated entry to the bounded-line kernel; ``args`` from ``linear_args``.

    ``out`` uint32 receives codes; float64 receives cell centres
    ``origin + code * step`` with ``grid_values = (origin, step)``.
    """
    _check_batch(x, words, out, x.shape[0])
    return _tpm_linear(x, words, out, *_emit(out, grid_values), *args)


def tpm_circular(x, words, out, args, grid_values=(0.0, 0.0)):
    """Validated entry to the circle kernel; ``args`` from ``circular_args``."""
    _check_batch(x, words, out, x.shape[0])
    return _tpm_circular(x, words, out, *_emit(out, grid_values), *args)


def cell_values(codes, *, value_origin, value_step, n_cells):
    """(values, count of codes outside the grid) for a 1-D integer array."""
    if codes.ndim != 1 or codes.dtype.kind not in "iu":
        raise TypeError("codes must be a 1-D integer array")
    if codes.dtype not in (np.uint32, np.int64):
        if codes.dtype.kind == "u" and codes.size and codes.max() > np.iinfo(np.int64).max:
            return np.empty(codes.shape[0]), codes.shape[0]
        codes = codes.astype(np.int64)
    values = np.empty(codes.shape[0], dtype=np.float64)
    bad = _cell_values(codes, values, float(value_origin), float(value_step), int(n_cells))
    return values, bad


# --------------------------------------------------------------------------
# Discrete Laplace on the output grid (Canonne, Kamath, Steinke 2020, Alg. 1-2)
# --------------------------------------------------------------------------
# Every draw is an exact rejection or Bernoulli step on integers, so the
# distribution is exactly the discrete Laplace with the rational scale
# num / 2**den_shift.  A sampler call that runs out of words reports where its
# value started; the wrapper replays that value on the same words followed by
# fresh ones, so running out never biases the result.

_EXHAUSTED = -1


@njit(cache=True, nogil=True, boundscheck=False)
def _bit_length(m):
    bits = 0
    while m > 0:
        m >>= 1
        bits += 1
    return bits


@njit(cache=True, nogil=True, boundscheck=False)
def _uniform_below(m, words, pos):
    """Uniform integer in [0, m) by exact rejection; pos = -1 when out of words."""
    if m <= 1:
        return np.int64(0), pos
    shift = np.uint64(64 - _bit_length(m - 1))
    bound = np.uint64(m)
    while True:
        if pos >= words.shape[0]:
            return np.int64(0), _EXHAUSTED
        r = words[pos] >> shift
        pos += 1
        if r < bound:
            return np.int64(r), pos


@njit(cache=True, nogil=True, boundscheck=False)
def _bernoulli_exp(numer, denom, words, pos):
    """Bernoulli(exp(-numer/denom)) for 0 <= numer <= denom (CKS Algorithm 1)."""
    k = 1
    while True:
        # Bernoulli(gamma / k) as Bernoulli(gamma) and Bernoulli(1 / k).
        u, pos = _uniform_below(denom, words, pos)
        if pos == _EXHAUSTED:
            return False, pos
        if not u < numer:
            break
        u, pos = _uniform_below(k, words, pos)
        if pos == _EXHAUSTED:
            return False, pos
        if u != 0:
            break
        k += 1
    return k % 2 == 1, pos


@njit(cache=True, nogil=True, boundscheck=False)
def _discrete_laplace(num, den_shift, words, pos):
    """Z with P(z) proportional to exp(-|z| * 2**den_shift / num) (CKS Algorithm 2)."""
    while True:
        u, pos = _uniform_below(num, words, pos)
        if pos == _EXHAUSTED:
            return np.int64(0), pos
        accept, pos = _bernoulli_exp(u, num, words, pos)
        if pos == _EXHAUSTED:
            return np.int64(0), pos
        if not accept:
            continue
        v = 0
        while True:
            more, pos = _bernoulli_exp(1, 1, words, pos)
            if pos == _EXHAUSTED:
                return np.int64(0), pos
            if not more:
                break
            v += 1
        y = (u + num * v) >> den_shift
        sign, pos = _uniform_below(2, words, pos)
        if pos == _EXHAUSTED:
            return np.int64(0), pos
        if sign == 1 and y == 0:
            continue
        return (y if sign == 0 else -y), pos


# floor(sqrt(2**63 - 1)): the largest a whose square an int64 holds.
_SQUARE_MAX = 3_037_000_499


@njit(cache=True, nogil=True, boundscheck=False)
def _bernoulli_exp_ratio(numer, denom, words, pos):
    """Bernoulli(exp(-numer/denom)) for any numer >= 0 (CKS Algorithm 1): one
    Bernoulli(exp(-1)) per whole unit of the exponent, then the fractional rest."""
    while numer > denom:
        keep, pos = _bernoulli_exp(1, 1, words, pos)
        if pos == _EXHAUSTED or not keep:
            return False, pos
        numer -= denom
    return _bernoulli_exp(numer, denom, words, pos)


@njit(cache=True, nogil=True, boundscheck=False)
def _bernoulli_exp_square(a, denom, words, pos):
    """Bernoulli(exp(-a*a/denom)) for a >= 0, without overflowing int64."""
    if a <= _SQUARE_MAX:
        return _bernoulli_exp_ratio(a * a, denom, words, pos)
    # exp(-a**2/denom) = exp(-a/denom)**a: a coins that must all land.  Reached only
    # by |Y| hundreds of thousands of standard deviations out; kept so the law is exact.
    for _ in range(a):
        keep, pos = _bernoulli_exp_ratio(a, denom, words, pos)
        if pos == _EXHAUSTED or not keep:
            return False, pos
    return True, pos


@njit(cache=True, nogil=True, boundscheck=False)
def _discrete_gaussian(t, m, words, pos):
    """Z with P(z) proportional to exp(-z**2 / (2 t m)) (CKS Algorithm 3 with
    sigma**2 = t m, so that sigma**2 / t = m is an integer and the acceptance
    exp(-(|Y| - m)**2 / (2 t m)) is a ratio of integers)."""
    denom = 2 * t * m
    while True:
        y, pos = _discrete_laplace(t, 0, words, pos)
        if pos == _EXHAUSTED:
            return np.int64(0), pos
        accept, pos = _bernoulli_exp_square(abs(abs(y) - m), denom, words, pos)
        if pos == _EXHAUSTED:
            return np.int64(0), pos
        if accept:
            return y, pos


@njit(cache=True, nogil=True, boundscheck=False)
def _gaussian_cells(x, words, out, start, low, inv_step, steps, offset, top, t, m):
    """Codes offset + i + Z clamped to [0, top] from ``start`` on, where i is x's
    lattice point (x clipped to the domain, rounded at random to one of its two
    neighbouring points so that E[i] is exact) and Z is discrete Gaussian; returns
    (next index, its word position)."""
    pos = 0
    for i in range(start, x.shape[0]):
        begin = pos
        if pos >= words.shape[0]:
            return i, begin
        position = (x[i] - low) * inv_step
        point = np.int64(math.floor(position))
        # Up with probability frac(position): a 53-bit uniform against the fraction.
        point += np.int64(np.float64(words[pos] >> np.uint64(11)) * 2.0**-53
                          < position - math.floor(position))
        pos += 1
        point = min(max(point, 0), steps)
        z, pos = _discrete_gaussian(t, m, words, pos)
        if pos == _EXHAUSTED:
            return i, begin
        out[i] = np.uint32(min(max(offset + point + z, 0), top))
    return x.shape[0], pos


@njit(cache=True, nogil=True, boundscheck=False)
def _quantize(x, cells, low, high, inv_cell, n_cells):
    """Clip to [low, high] and map to the index of the grid cell holding x."""
    bad = 0
    clipped = 0
    top = n_cells - 1
    for i in range(x.shape[0]):
        v = x[i]
        bad += not math.isfinite(v)
        c = min(max(v, low), high)
        clipped += c != v
        cells[i] = min(max(np.int64((c - low) * inv_cell), 0), top)
    return bad, clipped


@njit(cache=True, nogil=True, boundscheck=False)
def _laplace_cells(cells, words, out, start, num, den_shift, n_cells, bounded):
    """Noisy cell indices from ``start`` on; returns (next index, its word position).

    ``bounded`` False clamps x + Z into the grid (truncated Laplace, atoms at the
    ends); True redraws Z until x + Z is inside (bounded Laplace).
    """
    pos = 0
    top = n_cells - 1
    for i in range(start, cells.shape[0]):
        begin = pos
        while True:
            z, pos = _discrete_laplace(num, den_shift, words, pos)
            if pos == _EXHAUSTED:
                return i, begin
            y = cells[i] + z
            if not bounded:
                y = min(max(y, 0), top)
                break
            if 0 <= y <= top:
                break
        out[i] = np.uint32(y)
    return cells.shape[0], pos


def quantize(x, cells, *, low, high, n_cells):
    if x.dtype != np.float64 or x.ndim != 1 or not x.flags.c_contiguous:
        raise TypeError("x must be a contiguous 1-D float64 array")
    if cells.dtype != np.int64 or cells.shape != x.shape:
        raise TypeError("cells must be an int64 array shaped like x")
    return _quantize(x, cells, float(low), float(high), n_cells / (high - low), int(n_cells))


def laplace_cells(cells, source, *, num, den_shift, n_cells, bounded):
    """Discrete-Laplace noise on grid cells, drawing words from ``source`` as needed."""
    if cells.dtype != np.int64 or cells.ndim != 1:
        raise TypeError("cells must be a 1-D int64 array")
    if not 1 <= num < 1 << 50:
        raise ValueError("num out of range for exact 64-bit arithmetic")
    out = np.empty(cells.shape[0], dtype=np.uint32)
    # About 6 words per draw on average; ask for enough that a refill is rare.
    words = source.words(8 * cells.shape[0] + 64)
    done = 0
    while True:
        done, resume = _laplace_cells(cells, words, out, done, int(num), int(den_shift),
                                      int(n_cells), bool(bounded))
        if done == cells.shape[0]:
            return out
        # Replay the unfinished value on its own words followed by fresh ones, at least as
        # many as it has used: a value that needs many draws (bounded Laplace keeps about
        # epsilon / 2 of them) then costs a constant factor of its words, not their square.
        fresh = source.words(max(4 * (cells.shape[0] - done) + 64, words.shape[0] - resume))
        words = np.concatenate([words[resume:], fresh])


def gaussian_cells(x, source, *, low, step, steps, offset, top, t, m):
    """Discrete-Gaussian codes for values already clipped to [low, low + steps * step],
    drawing words from ``source`` as needed (replayed like ``laplace_cells``)."""
    if x.dtype != np.float64 or x.ndim != 1 or not x.flags.c_contiguous:
        raise TypeError("x must be a contiguous 1-D float64 array")
    if not (1 <= t and 1 <= m and 2 * t * m < 1 << 62 and 0 <= offset and
            offset + steps <= top < 1 << 32):
        raise ValueError("t, m, offset or top out of range for exact 64-bit arithmetic")
    out = np.empty(x.shape[0], dtype=np.uint32)
    # About 12 words per value on average; ask for enough that a refill is rare.
    words = source.words(16 * x.shape[0] + 64)
    done = 0
    while True:
        done, resume = _gaussian_cells(x, words, out, done, float(low), 1.0 / float(step),
                                       int(steps), int(offset), int(top), int(t), int(m))
        if done == x.shape[0]:
            return out
        fresh = source.words(max(8 * (x.shape[0] - done) + 64, words.shape[0] - resume))
        words = np.concatenate([words[resume:], fresh])
