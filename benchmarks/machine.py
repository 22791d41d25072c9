"""Name the machine a benchmark ran on, for docs/benchmarks/BENCHMARKS.md."""

from __future__ import annotations

import os
import platform


def describe_machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numba
    import numpy

    return (f"{cpu}, {os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}, "
            f"Python {platform.python_version()}, numpy {numpy.__version__}, "
            f"numba {numba.__version__}")


def print_table(table: str, markdown: str | None = None) -> None:
    """Print a benchmark's table, and write it to ``markdown`` when given (--markdown)."""
    print(table)
    if markdown:
        with open(markdown, "w") as f:
            f.write(table + "\n")
