"""Giving memory back: the pages of LLVM's own code once numba has what it needs, and the
pages glibc's allocator keeps after they were freed.

numba's first kernel call (compiling, or loading a cached kernel) runs LLVM's
initialisation, which touches about 50 MB of libllvmlite.so's machine code; after the
warm-up the agent does not run LLVM again unless it needs a kernel it never called
(then the pages come back).  Those pages are clean and file-backed: the kernel would
drop them under memory pressure anyway, but until then they count in the agent's RSS,
which is what an operator of a 1 GB board looks at (docs/benchmarks/BENCHMARKS.md, "Where the
memory goes": peak 164 -> 145 MB, steady 162 -> 95 MB with the sample configuration).

``madvise(MADV_DONTNEED)`` on a private file mapping that holds no written page only
unmaps it: the next access reads the same bytes from the page cache.  A mapping with any
dirty page (relocations, data) is never touched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

MADV_DONTNEED = 4
CODE_LIBRARIES = ("libllvmlite.so",)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def clean_mappings(names: tuple[str, ...] = CODE_LIBRARIES, *,
                   smaps: str = "/proc/self/smaps") -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of this process's read-only mappings of the named
    files with no dirty page; empty where /proc is not readable."""
    found, current, fields = [], None, {}

    def close():
        if current is not None and not fields.get("Private_Dirty:", 1) \
                and not fields.get("Shared_Dirty:", 1) and fields.get("Rss:", 0):
            found.append((*current, fields["Rss:"] * 1024))

    try:
        with open(smaps) as lines:
            for line in lines:
                parts = line.split()
                if not parts:
                    continue
                if parts[0].endswith(":"):
                    if current is not None and parts[0] in ("Rss:", "Private_Dirty:",
                                                            "Shared_Dirty:"):
                        fields[parts[0]] = int(parts[1])
                    continue
                close()
                current, fields = None, {}
                path = parts[5] if len(parts) > 5 else ""
                if "w" not in parts[1] and os.path.basename(path) in names:
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    current = (start, end)
        close()
    except OSError:
        return []
    return found


def release_code_pages(names: tuple[str, ...] = CODE_LIBRARIES) -> int:
    """Unmap the resident clean pages of ``names``' read-only mappings; returns the
    bytes that were resident (0 where this is not Linux or madvise is refused)."""
    mappings = clean_mappings(names)
    if not mappings:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    released = 0
    for start, end, resident in mappings:
        if start % _PAGE == 0 and madvise(start, end - start, MADV_DONTNEED) == 0:
            released += resident
        else:
            log.debug("madvise refused for %x-%x: errno %d", start, end, ctypes.get_errno())
    return released


def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def release_freed_heap() -> None:
    """Give the heap pages freed since the last call back to the system.  glibc keeps
    freed pages inside its heaps (one per thread that allocates) unless asked
    (``malloc_trim``); a no-op elsewhere."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def release_freed_memory() -> int:
    """Both of the above, for a long-running process that estimates with numba (the
    collector, its estimate workers): the freed heap pages, and LLVM's code pages,
    which estimating with kernels already loaded never reads (67 MB of each such
    process on x86_64; they come back from the page cache when a new kernel loads, and
    go at the next call).  Returns the code bytes released."""
    release_freed_heap()
    return release_code_pages()
