"""numba kernels of the mechanisms with discrete outputs: the categorical frequency
oracles (``categorical.py``) and Duchi et al.'s multi-dimensional mechanism
(``multidimensional.py``).

Each kernel consumes CSPRNG words handed in from outside (``randomness.py``) and
decides with the top 53 bits of a word against integer weights out of 2**53, so
every output probability is an exact ratio of integers.  The validating
wrappers live in ``categorical.py`` and ``multidimensional.py``;
``tests/edge_agent/mechanisms/test_categorical.py`` compares the oracles' kernels with slow
obvious versions, and ``test_multidimensional.py`` the sign patterns and the sampled
axes with slow obvious versions and with their exact distribution.
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


@njit(cache=True)
def _popcount(word):
    count = 0
    while word:
        word &= word - np.uint64(1)
        count += 1
    return count


@njit(cache=True)
def sign_vectors(x, words, alpha, out, start):
    """Duchi et al.'s multi-dimensional mechanism (Wang et al. arXiv:1906.01777 Algorithm 1/4) from
    report ``start`` on: bit j of ``out[i]`` is 1 for +B on axis j.  V_j = +1 for
    r < floor((1 + x_j) 2**52); u = 1 for r < alpha; then a uniform sign pattern of
    T+(V) (more agreements than disagreements) or T-(V) by rejection from the low d
    bits of a word.  Returns (the report it stopped at, the words used): it stops
    early when ``words`` run out."""
    n, d = x.shape
    mask = (np.uint64(1) << np.uint64(d)) - np.uint64(1)
    used = 0
    for i in range(start, n):
        if used + d + 1 > words.shape[0]:
            return i, used
        v = np.uint64(0)
        for j in range(d):
            threshold = np.uint64(np.floor((1.0 + x[i, j]) * 4503599627370496.0))
            if (words[used] >> _SHIFT) < threshold:
                v |= np.uint64(1) << np.uint64(j)
            used += 1
        plus = (words[used] >> _SHIFT) < alpha
        used += 1
        while True:
            if used >= words.shape[0]:
                return i, used  # this report is drawn again from fresh words
            s = words[used] & mask
            used += 1
            agreements = _popcount(~(s ^ v) & mask)
            if (2 * agreements > d) == plus:
                out[i] = s
                break
    return n, used


@njit(cache=True)
def sampled_axes(words, k, order, out, start):
    """k distinct axes of d = ``order.size`` per report, uniformly (Wang et al. arXiv:1906.01777
    Algorithm 3, line 2), from report ``start`` on: bit j of ``out[i]`` is set for a
    chosen axis.  A partial Fisher-Yates shuffle of ``order`` (scratch, d entries):
    step t swaps entry t with entry t + r mod (d - t), r a whole word, words below
    2**64 mod (d - t) rejected so that every remainder has exactly the same number of
    words (exactly uniform, no modulo bias).  Returns (the report it stopped at, the
    words used): it stops early when ``words`` run out."""
    d = order.shape[0]
    used = 0
    for i in range(start, out.shape[0]):
        for j in range(d):
            order[j] = j
        mask = np.uint64(0)
        t = 0
        while t < k:
            if used >= words.shape[0]:
                return i, used  # this report is drawn again from fresh words
            r = words[used]
            used += 1
            m = np.uint64(d - t)
            if r < (np.uint64(0) - m) % m:  # 2**64 mod m, in wrapping uint64
                continue
            j = t + np.int64(r % m)
            chosen = order[j]
            order[j] = order[t]
            order[t] = chosen
            mask |= np.uint64(1) << np.uint64(chosen)
            t += 1
        out[i] = mask
    return out.shape[0], used
