"""edge_agent.common.memory: LLVM's clean code pages given back after the warm-up."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from edge_agent.common.memory import clean_mappings

SMAPS = """\
7f0000000000-7f0000400000 r--p 00000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                 512 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
7f0000400000-7f0004000000 r-xp 00400000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:               20480 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
7f0004000000-7f0004100000 r--p 04000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Private_Dirty:       900 kB
Shared_Dirty:          0 kB
7f0004100000-7f0004200000 rw-p 04100000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                 100 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
7f0004200000-7f0004300000 r-xp 00000000 08:01 12 /usr/lib/libc.so.6
Rss:                 800 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
7f0004300000-7f0004400000 r-xp 00000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                   0 kB
Private_Dirty:         0 kB
Shared_Dirty:          0 kB
"""


def test_only_clean_read_only_resident_mappings_of_the_library(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert clean_mappings(smaps=str(smaps)) == [
        (0x7f0000000000, 0x7f0000400000, 512 * 1024),
        (0x7f0000400000, 0x7f0004000000, 20480 * 1024)]  # not relocated, written, libc, empty
    assert clean_mappings(smaps=str(tmp_path / "absent")) == []


def test_released_pages_leave_rss_and_numba_still_compiles_and_runs(tmp_path):
    """In a fresh interpreter: a kernel loaded, LLVM's pages released (the RSS of
    libllvmlite.so drops to almost nothing), then the old kernel runs and a new one
    compiles (LLVM's code read back from the page cache) with the right results."""
    script = textwrap.dedent("""
        import numpy as np
        from numba import njit
        from edge_agent.common.memory import clean_mappings, release_code_pages

        def resident():
            return sum(r for _, _, r in clean_mappings())

        @njit(cache=False)
        def twice(x):
            return 2.0 * x

        assert twice(np.arange(3.0)).tolist() == [0.0, 2.0, 4.0]
        before = resident()
        released = release_code_pages()
        after = resident()
        print(before, released, after)
        assert before > 10 * 2**20 and released >= before and after < before / 10

        @njit(cache=False)
        def total(x):
            s = 0.0
            for v in x:
                s += v * v
            return s

        assert total(np.arange(4.0)) == 14.0 and twice(np.ones(2)).tolist() == [2.0, 2.0]
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env={"NUMBA_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin"})
    assert run.returncode == 0 and run.stdout.endswith("ok\n"), run.stdout + run.stderr
