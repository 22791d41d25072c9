"""Where the noise comes from.

Every kernel consumes independent, uniformly distributed 64-bit words that
are generated *outside* numba: numba's own ``np.random`` is a Mersenne
Twister that Python-side seeding cannot reach and that is not a
cryptographic generator, so it is never used for privacy noise.

* ``SystemRandom`` (the default, ``rng=None``) reads OpenSSL's DRBG through
  the standard library (``ssl.RAND_bytes``): the generator mature DP
  libraries use, seeded and reseeded from the operating system, and with
  AES-NI/ARMv8-crypto several times faster than ``os.urandom``.  Where the
  interpreter has no ``ssl`` module it falls back to ``os.urandom``.
* ``SeededRandom`` wraps a ``numpy.random.Generator`` for reproducible tests
  and benchmarks.  It must never be used for real reports.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import numpy as np

try:  # pragma: no cover - exercised implicitly on every machine with ssl
    import ssl

    _rand_bytes = ssl.RAND_bytes
    _SOURCE_NAME = "openssl-drbg"
except ImportError:  # pragma: no cover - interpreters built without OpenSSL
    _rand_bytes = os.urandom
    _SOURCE_NAME = "os.urandom"

# ssl.RAND_bytes takes an int length; stay far below 2**31 bytes per call.
_MAX_CHUNK_BYTES = 1 << 24


@runtime_checkable
class RandomSource(Protocol):
    """Anything that hands out fresh, independent, uniform 64-bit words."""

    def words(self, count: int) -> np.ndarray:  # pragma: no cover - protocol
        ...


class SystemRandom:
    """Cryptographically secure words from OpenSSL's DRBG (or os.urandom)."""

    name = _SOURCE_NAME
    cryptographic = True

    def words(self, count: int) -> np.ndarray:
        # Always a writable array, like the seeded sources' and the kernels' refills
        # (np.concatenate): numba types a read-only array apart, and a read-only first
        # batch made every kernel that takes words compile (and cache) twice.
        nbytes = 8 * count
        buffer = bytearray(nbytes)
        view = memoryview(buffer)
        for start in range(0, nbytes, _MAX_CHUNK_BYTES):
            stop = min(start + _MAX_CHUNK_BYTES, nbytes)
            view[start:stop] = _rand_bytes(stop - start)
        return np.frombuffer(buffer, dtype=np.uint64)


# Bit generators whose raw output is a full 64-bit word (MT19937's is 32-bit).
_RAW64 = ("PCG64", "PCG64DXSM", "Philox", "SFC64")


class SeededRandom:
    """Reproducible words from a numpy Generator: for tests and benchmarks only."""

    cryptographic = False

    def __init__(self, generator: np.random.Generator):
        if not isinstance(generator, np.random.Generator):
            raise TypeError(
                f"generator must be a numpy.random.Generator, got {type(generator).__name__}"
            )
        self.generator = generator
        self._raw = type(generator.bit_generator).__name__ in _RAW64
        self.name = f"numpy-{type(generator.bit_generator).__name__}"

    def words(self, count: int) -> np.ndarray:
        if self._raw:
            return self.generator.bit_generator.random_raw(count)
        return self.generator.integers(
            0, np.iinfo(np.uint64).max, size=count, dtype=np.uint64, endpoint=True
        )


_SYSTEM = SystemRandom()


def as_random_source(rng: object) -> RandomSource:
    """Resolve the ``rng`` argument of ``perturb``: None means the CSPRNG."""
    if rng is None:
        return _SYSTEM
    if isinstance(rng, np.random.Generator):
        return SeededRandom(rng)
    if isinstance(rng, (SystemRandom, SeededRandom)) or isinstance(rng, RandomSource):
        return rng
    raise TypeError(
        "rng must be None (OS-seeded CSPRNG), a numpy.random.Generator or a "
        f"RandomSource, got {type(rng).__name__}"
    )
