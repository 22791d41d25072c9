"""Exact integer form of a three-piece (TPM) mechanism on the output grid.

A continuous TPM (OGPM paper, Definition 2.2) has density ``p`` on a central
interval and ``p / e**eps`` elsewhere.  Sampling it in floating point and
rounding leaks through the low bits (Mironov 2012), and even a careful
float sampler only approximates the e**eps ratio.  We therefore sample an
*integer* mechanism whose privacy loss is a ratio of integers:

* the output domain is split into ``T = 2**tick_bits`` ticks; a reported
  grid cell is ``2**cell_shift`` consecutive ticks;
* every tick outside the central interval has weight ``A`` (``low_weight``),
  every tick inside has weight ``A + D`` (``extra_weight = D``), except the
  last tick of the interval, whose weight is ``A + last_extra`` with
  ``0 < last_extra <= D`` (it plays the part of a fractional length);
* the weights add up to exactly ``2**TOTAL_BITS`` for every input, so the
  top ``TOTAL_BITS`` bits of one uniform 64-bit word pick a tick exactly, with
  no rejection and no floating point.

Every tick weight lies in ``[A, A + D]`` and the total is the same for every
input, so for any two inputs and any cell the probability ratio is at most
``(A + D) / A``.  ``D`` is the largest integer with ``(A + D) / A <= e**eps``,
decided in 80-digit decimal arithmetic, so the bound holds exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal, localcontext

import numpy as np

TOTAL_BITS = 53
TICK_BITS = 20


def max_extra_weight(low_weight: int, epsilon: float) -> int:
    """Largest integer D with (low_weight + D) / low_weight <= exp(epsilon), exactly."""
    with localcontext() as ctx:
        ctx.prec = 80
        # Decimal(epsilon) is the exact binary value; exp() is correctly rounded
        # to 80 digits, so a 1e-70 relative guard keeps D on the safe side.
        bound = Decimal(low_weight) * (Decimal(epsilon).exp() - 1)
        guarded = bound * (1 - Decimal(10) ** -70)
        return int(guarded.to_integral_value(rounding=ROUND_FLOOR))


def ratio_within(numerator: int, denominator: int, epsilon: float) -> bool:
    """Exactly decide numerator / denominator <= exp(epsilon) (both positive ints)."""
    with localcontext() as ctx:
        ctx.prec = 80
        return Decimal(numerator) <= Decimal(denominator) * Decimal(epsilon).exp() * (
            1 - Decimal(10) ** -70
        )


# Cells whose exact ratio is taken at once (max_cell_ratio): bounds its memory.
CELLS_PER_BLOCK = 4096


@dataclass(frozen=True)
class TickLayout:
    grid_bits: int
    low_weight: int
    extra_weight: int
    length: int
    last_extra: int
    tick_bits: int = TICK_BITS

    def __post_init__(self):
        if not 1 <= self.grid_bits <= self.tick_bits:
            raise ValueError("grid_bits must be between 1 and tick_bits")
        if self.low_weight < 1 or self.extra_weight < 0:
            raise ValueError("weights must be positive")
        if not 1 <= self.length <= self.ticks:
            raise ValueError(f"central interval of {self.length} ticks does not fit {self.ticks}")
        if not (0 < self.last_extra <= self.extra_weight
                or self.extra_weight == 0 == self.last_extra):
            raise ValueError("last_extra must be in (0, extra_weight]")
        if self.total != 1 << TOTAL_BITS:
            raise ValueError("tick weights must add up to 2**TOTAL_BITS")

    # -- construction -----------------------------------------------------
    @classmethod
    def for_fraction(
        cls, *, epsilon: float, fraction: float, grid_bits: int, tick_bits: int = TICK_BITS
    ) -> TickLayout:
        """Layout whose central interval covers ``fraction`` of the output domain.

        The low weight follows from the continuous normalisation
        p_low * (1 + (e**eps - 1) * fraction) = 1 (unit-width output domain);
        the interval length then follows from the integer normalisation.  A
        step of one in A moves it by about fraction*T/A ticks; A is around
        2**33 / (1 + e**eps * fraction), so for every mechanism here the
        length is right to well under a tick.
        """
        ticks = 1 << tick_bits
        if epsilon == 0.0:  # uniform component (used by PolarOGPM for a zero share)
            return cls(grid_bits, 1 << (TOTAL_BITS - tick_bits), 0, 1, 0, tick_bits)
        target = (1 << TOTAL_BITS) / (ticks * (1.0 + math.expm1(epsilon) * fraction))
        best = None
        for low in {max(math.floor(target), 1), math.ceil(target)}:
            extra = max_extra_weight(low, epsilon)
            if extra < 1:
                raise ValueError(f"epsilon={epsilon:g} is too small for an integer layout")
            remaining = (1 << TOTAL_BITS) - low * ticks
            miss = abs(remaining / extra - fraction * ticks)
            if best is None or miss < best[0]:
                best = (miss, low, extra, remaining)
        _, low, extra, remaining = best
        length = -(-remaining // extra)
        last = remaining - extra * (length - 1)
        return cls(grid_bits, low, extra, length, last, tick_bits)

    @classmethod
    def for_exact_length(
        cls, *, epsilon: float, length: int, grid_bits: int, tick_bits: int = TICK_BITS
    ) -> TickLayout:
        """Layout with exactly ``length`` full ticks (``length`` must divide T).

        Duchi's mechanism needs this: its 'interval' is exactly half the ticks,
        so that the probability of the upper report is affine in the input.
        """
        ticks = 1 << tick_bits
        if ticks % length:
            raise ValueError("length must divide the number of ticks")
        # Smallest A with (2**TOTAL - A*T) / length <= A*(e**eps - 1).
        low = math.ceil((1 << TOTAL_BITS) / (ticks + length * math.expm1(epsilon)))
        while True:
            extra, rest = divmod((1 << TOTAL_BITS) - low * ticks, length)
            if rest == 0 and ratio_within(low + extra, low, epsilon):
                return cls(grid_bits, low, extra, length, extra, tick_bits)
            low += 1

    # -- derived quantities --------------------------------------------------
    @property
    def ticks(self) -> int:
        return 1 << self.tick_bits

    @property
    def cell_shift(self) -> int:
        return self.tick_bits - self.grid_bits

    @property
    def ticks_per_cell(self) -> int:
        return 1 << self.cell_shift

    @property
    def n_cells(self) -> int:
        return 1 << self.grid_bits

    @property
    def base_total(self) -> int:
        return self.low_weight * self.ticks

    @property
    def total(self) -> int:
        return self.base_total + self.extra_weight * (self.length - 1) + self.last_extra

    @property
    def effective_length(self) -> float:
        """Central length in ticks, counting the partial last tick fractionally."""
        if self.extra_weight == 0:
            return 0.0
        return (self.length - 1) + self.last_extra / self.extra_weight

    @property
    def tick_ratio(self) -> float:
        return (self.low_weight + self.extra_weight) / self.low_weight

    def kernel_constants(self) -> tuple[int, int, int, float, int, int]:
        """(shift, base_total, extra, 1/extra, cell_shift, mask) for the njit kernels."""
        extra = max(self.extra_weight, 1)  # D = 0 never reaches the extra branch
        return (
            64 - TOTAL_BITS,
            self.base_total,
            extra,
            1.0 / extra,
            self.cell_shift,
            self.ticks - 1,
        )

    # -- exact cell probabilities -------------------------------------------------
    def cell_weights(self, left: np.ndarray, cells: np.ndarray, circular: bool) -> np.ndarray:
        """Integer weight of ``cells`` when the central interval starts at tick ``left``.

        Broadcasts ``left`` against ``cells``.  The result divided by
        2**TOTAL_BITS is the exact probability the kernel gives each cell.
        """
        left = np.asarray(left, dtype=np.int64)
        cells = np.asarray(cells, dtype=np.int64)
        per_cell = self.ticks_per_cell
        start = cells * per_cell
        full = self.length - 1  # ticks of weight A + D
        last = left + full  # position of the partial tick
        if circular:
            overlap = np.zeros(np.broadcast(left, cells).shape, dtype=np.int64)
            for shift in (-self.ticks, 0, self.ticks):
                overlap += _overlap(left + shift, full, start, per_cell)
            last = last % self.ticks
        else:
            overlap = _overlap(left, full, start, per_cell)
        in_cell = (last >= start) & (last < start + per_cell)
        return (
            self.low_weight * per_cell
            + self.extra_weight * overlap
            + self.last_extra * in_cell.astype(np.int64)
        )

    def max_cell_ratio(self, left_min: int, left_max: int, circular: bool) -> tuple[int, int]:
        """Exact max over cells k and reachable starts a, b of w_k(a) / w_k(b).

        Returned as (numerator, denominator).  A cell's weight is piecewise
        linear in the start tick, with kinks where an end of the interval
        crosses an end of the cell, so its extremes over an integer range sit
        at those kinks (or their neighbours) or at the ends of the range.
        Taken over the cells a block at a time (``CELLS_PER_BLOCK``), the blocks'
        maxima compared exactly: the whole grid's candidates at once were a 40 MB
        transient on a device.
        """
        best_num, best_den = 0, 1
        for first in range(0, self.n_cells, CELLS_PER_BLOCK):
            cells = np.arange(first, min(first + CELLS_PER_BLOCK, self.n_cells), dtype=np.int64)
            num, den = self._max_cell_ratio(cells, left_min, left_max, circular)
            if num * best_den > best_num * den:
                best_num, best_den = num, den
        return best_num, best_den

    def _max_cell_ratio(self, cells: np.ndarray, left_min: int, left_max: int,
                        circular: bool) -> tuple[int, int]:
        start = cells * self.ticks_per_cell
        stop = start + self.ticks_per_cell
        n = self.length
        # Starts where the full part or the partial last tick enters or leaves the cell.
        kinks = (start, stop, start - (n - 1), stop - (n - 1))
        candidates = np.stack([k + d for k in kinks for d in (-1, 0, 1)], axis=1)
        if circular:
            candidates = candidates % self.ticks
        else:
            candidates = np.clip(candidates, left_min, left_max)
            ends = np.broadcast_to(np.array([left_min, left_max]), (cells.size, 2))
            candidates = np.concatenate([candidates, ends], axis=1)
        weights = self.cell_weights(candidates, cells[:, None], circular)
        high = weights.max(axis=1)
        low = weights.min(axis=1)
        # Floats find the contenders; Python integers pick the exact maximum.
        ratio = high / low
        top = int(np.argmax(ratio))
        best_num, best_den = int(high[top]), int(low[top])
        others = (ratio >= ratio[top] * (1 - 1e-9)) & ((high != best_num) | (low != best_den))
        for h, lo in zip(high[others].tolist(), low[others].tolist()):
            if h * best_den > best_num * lo:
                best_num, best_den = h, lo
        return best_num, best_den


def _overlap(left: np.ndarray, length: int, start: np.ndarray, width: int) -> np.ndarray:
    """Length of [left, left + length) intersected with [start, start + width)."""
    lo = np.maximum(left, start)
    hi = np.minimum(left + length, start + width)
    return np.maximum(hi - lo, 0)
