"""numba kernels of the categorical frequency oracles (``categorical.py``).

Each kernel consumes CSPRNG words handed in from outside (``randomness.py``) and
decides with the top 53 bits of a word against integer weights out of 2**53, so
every output probability is an exact ratio of integers.  The validating
wrappers live in ``categorical.py``; ``tests/mechanisms/reference.py`` has a slow
obvious version of each.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_SHIFT = np.uint64(64 - 53)  # the top 53 bits of a word


@njit(cache=True)
def grr_codes(values, words, keep, other, out):
    """Generalized randomized response: value v stays v for r < keep (r the word's top
    53 bits), else it is the j-th of the other categories, j = (r - keep) // other:
    each of the k - 1 others has exactly ``other`` of the 2**53 values of r."""
    for i in range(values.shape[0]):
        r = words[i] >> _SHIFT
        v = np.uint64(values[i])
        if r < keep:
            out[i] = v
        else:
            j = (r - keep) // other
            out[i] = j if j < v else j + np.uint64(1)


@njit(cache=True)
def unary_bits(values, words, one_own, one_other, out):
    """Unary encoding: bit j of report i is 1 for r < one_own if j is the value, for
    r < one_other otherwise (one word per bit)."""
    n, k = out.shape
    for i in range(n):
        v = values[i]
        for j in range(k):
            r = words[i * k + j] >> _SHIFT
            out[i, j] = 1 if r < (one_own if j == v else one_other) else 0


@njit(cache=True)
def _mix(seed, value):
    """A keyed 64-bit hash of (seed, value): splitmix64's finaliser (Steele et al.)."""
    z = (np.uint64(seed) << np.uint64(32)) ^ np.uint64(value)
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def hash_to(seed, value, g):
    """H_seed(value) in [0, g): the top 32 bits of the mix, scaled (Lemire's reduction;
    uniform to within g / 2**32)."""
    return ((_mix(seed, value) >> np.uint64(32)) * np.uint64(g)) >> np.uint64(32)


@njit(cache=True)
def hashed_values(seeds, values, g, out):
    for i in range(values.shape[0]):
        out[i] = hash_to(seeds[i], values[i], g)


@njit(cache=True)
def support_counts(seeds, codes, g, counts):
    """counts[v] += 1 for every report i whose hashed value H_{seed_i}(v) is its code."""
    k = counts.shape[0]
    for i in range(seeds.shape[0]):
        seed, code = seeds[i], np.uint64(codes[i])
        for v in range(k):
            if hash_to(seed, v, g) == code:
                counts[v] += 1
