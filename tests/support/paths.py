"""Where the repository is, and the environment the tests' child processes run in."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# numba's on-disk cache must be writable (numba #4908) and is slow to fill: every
# child shares the one `make test` uses instead of compiling again into the tree.
NUMBA_CACHE = REPO / ".venv" / "numba-cache"


def load_script(name: str):
    """``scripts/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def child_env() -> dict[str, str]:
    """This process's environment, with NUMBA_CACHE_DIR set unless it already is."""
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(NUMBA_CACHE))
    return env
