"""Slow, obvious per-sample reference implementations of every kernel.

They use Python integers, plain ``//`` and explicit branches: no float
reciprocal trick, no branch-free selects.  The kernel tests feed both the same
random words and require identical codes.
"""

from __future__ import annotations

import math
from fractions import Fraction

from edge_agent.mechanisms._layout import TOTAL_BITS


def tpm_code(layout, left: int, word: int, circular: bool) -> int:
    """Code drawn from one 64-bit word when the central interval starts at ``left``."""
    u = word >> (64 - TOTAL_BITS)
    base = layout.low_weight * layout.ticks
    if u < base:
        # The base layer is A copies of every tick: u mod T is uniform over ticks.
        tick = u % layout.ticks
    else:
        tick = left + (u - base) // layout.extra_weight
    if circular:
        tick %= layout.ticks
    assert 0 <= tick < layout.ticks
    return tick // layout.ticks_per_cell


def tpm_linear_left(mech, x: float) -> int:
    c = min(max(x, mech.low), mech.high)
    raw = math.floor(mech._tick_slope * (c - mech.low) + mech._tick_intercept)
    return min(max(raw, 0), mech._max_left)


def tpm_circular_left(mech, x: float) -> int:
    d = x - mech.origin
    if not 0.0 <= d < mech.period:  # wrap the exact remainders (x may be huge)
        d = math.fmod(math.fmod(x, mech.period) - math.fmod(mech.origin, mech.period),
                      mech.period)
        if d < 0.0:
            d += mech.period
        if d >= mech.period:
            d = 0.0
    t = d * mech._tick_scale
    t -= math.floor(t / mech.layout.ticks) * mech.layout.ticks
    return math.floor(t + mech._tick_offset) % mech.layout.ticks


def duchi_left(mech, x: float) -> int:
    c = min(max(x, mech.low), mech.high)
    return math.floor(mech._tick_slope * (c - mech.low) + 0.5)


class WordStream:
    """Hands out words one at a time, like the kernel's cursor."""

    def __init__(self, words):
        self.words = [int(w) for w in words]
        self.pos = 0

    def next(self) -> int:
        word = self.words[self.pos]
        self.pos += 1
        return word


def uniform_below(m: int, stream: WordStream) -> int:
    if m <= 1:
        return 0
    shift = 64 - (m - 1).bit_length()
    while True:
        r = stream.next() >> shift
        if r < m:
            return r


def bernoulli_exp(numer: int, denom: int, stream: WordStream) -> bool:
    """Bernoulli(exp(-numer/denom)), 0 <= numer <= denom (Canonne-Kamath-Steinke Alg. 1)."""
    k = 1
    while True:
        if not uniform_below(denom, stream) < numer:
            break
        if uniform_below(k, stream) != 0:
            break
        k += 1
    return k % 2 == 1


def discrete_laplace(num: int, den_shift: int, stream: WordStream) -> int:
    """CKS Algorithm 2 with scale num / 2**den_shift."""
    while True:
        u = uniform_below(num, stream)
        if not bernoulli_exp(u, num, stream):
            continue
        v = 0
        while bernoulli_exp(1, 1, stream):
            v += 1
        y = (u + num * v) >> den_shift
        sign = uniform_below(2, stream)
        if sign == 1 and y == 0:
            continue
        return -y if sign else y


def laplace_code(mech, x: float, stream: WordStream) -> int:
    c = min(max(x, mech.low), mech.high)
    cell = min(max(int((c - mech.low) * (mech.n_cells / (mech.high - mech.low))), 0),
               mech.n_cells - 1)
    top = mech.n_cells - 1
    while True:
        y = cell + discrete_laplace(mech._num, 16, stream)
        if not mech.bounded:
            return min(max(y, 0), top)
        if 0 <= y <= top:
            return y


# -- II-PTT (edge_agent/mechanisms/tent.py) ------------------------------------------------

def tent_centre(mech, x: float) -> tuple[int, Fraction]:
    """(the tick below the tent's centre, the exact probability of the tick above), from
    the centre's position plus one, as the kernel computes it in floats."""
    c = min(max(x, mech.low), mech.high)
    lowest, highest = mech.first + 1, mech.last + 1
    lifted = min(max((c - mech.low) * mech._scale + lowest, lowest), highest)
    below = math.floor(lifted)
    return below - 1, Fraction(lifted) - below


def tent_code(mech, x: float, stream: WordStream) -> int:
    """II-PTT's tick for x: redraw a word until its top 53 bits fall under the total
    weight; under T F it is a floor tick (F words each), above it the tent's offset is the
    sum of two uniform integers on [0, A), and a second word moves the tent up a tick
    with the probability the centre's fraction."""
    centre, up = tent_centre(mech, x)
    ticks, floor, slope, half = mech.ticks, mech.floor, mech.slope, mech.half
    while True:
        r = stream.next() >> (64 - TOTAL_BITS)
        if r < ticks * floor + slope * half * half:
            break
    if r < ticks * floor:
        return r // floor
    first, second = divmod((r - ticks * floor) // slope, half)
    moved = Fraction(stream.next() >> (64 - TOTAL_BITS), 1 << TOTAL_BITS) < up
    return centre - (half - 1) + first + second + int(moved)


def tent_pmf(mech, x: float) -> list[Fraction]:
    """P[tick | x] for every tick, exactly."""
    return tent_pmf_at(mech, *tent_centre(mech, x))


def tent_pmf_at(mech, centre: int, up: Fraction) -> list[Fraction]:
    """P[tick] for every tick with the tent on ``centre`` or, with probability ``up``, on
    the tick above: F on every tick, plus E times the tent's height A - |j|."""
    half = mech.half

    def height(offset: int) -> int:
        return max(half - abs(offset), 0)

    total = mech.ticks * mech.floor + mech.slope * half * half
    return [(mech.floor + mech.slope * ((1 - up) * height(t - centre)
                                        + up * height(t - centre - 1))) / total
            for t in range(mech.ticks)]
