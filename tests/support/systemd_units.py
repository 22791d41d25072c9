"""Helpers for checking a systemd unit file, shared by the agent's and the
collector's unit tests (tests/edge_agent/test_systemd.py, tests/deploy/test_collector_unit.py).

``systemd-analyze`` runs for real (``verify`` and the offline ``security``
score); the ``analyze`` fixture skips a test only when it is not installed.
A test module uses the fixture by importing it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Unit file -> {section: [(key, value), ...]} keeping repeated keys in order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    lines = iter(text.splitlines())
    for line in lines:
        while line.endswith("\\"):  # continuation lines
            line = line[:-1] + " " + next(lines, "")
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            current = stripped[1:-1]
            sections.setdefault(current, [])
            continue
        assert current is not None, f"assignment outside a section: {line!r}"
        key, sep, value = stripped.partition("=")
        assert sep, f"not a KEY=value line: {line!r}"
        sections[current].append((key.strip(), value.strip()))
    return sections


def values(unit: dict, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def last(unit: dict, section: str, key: str) -> str | None:
    found = values(unit, section, key)
    return found[-1] if found else None


def is_true(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "yes", "y", "true", "t", "on")


def environment(unit: dict) -> dict[str, str]:
    env = {}
    for value in values(unit, "Service", "Environment"):
        if not value:  # an empty assignment resets the list
            env.clear()
        for item in shlex.split(value):
            name, _, setting = item.partition("=")
            env[name] = setting
    return env


def find_systemd_analyze() -> str | None:
    return shutil.which("systemd-analyze") or next(
        (p for p in ("/usr/bin/systemd-analyze", "/bin/systemd-analyze") if os.access(p, os.X_OK)),
        None)


@pytest.fixture
def analyze():
    binary = find_systemd_analyze()
    if binary is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return binary


def existing_executable() -> str:
    return shutil.which("true") or sys.executable


def stage_unit(unit_file: Path, directory: Path, *,
               dropins: dict[str, str] | None = None) -> Path:
    """Copy ``unit_file`` (and drop-ins, into <unit>.d/) to ``directory``.

    Only ExecStart's binary is replaced, by one that exists here, because
    ``verify`` checks that it is executable; everything else is verbatim.
    """
    text = unit_file.read_text()
    pattern = re.compile(r"^(ExecStart=[-@:+!]*)(\S+)", re.MULTILINE)
    assert len(pattern.findall(text)) == 1
    staged = directory / unit_file.name
    staged.write_text(pattern.sub(lambda m: m.group(1) + existing_executable(), text))
    if dropins:
        dropin_dir = directory / (unit_file.name + ".d")
        dropin_dir.mkdir()
        for name, content in dropins.items():
            (dropin_dir / name).write_text(content)
    return staged


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="", LC_ALL="C.UTF-8")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def verify(analyze: str, unit: Path) -> tuple[int, list[str]]:
    """Run ``systemd-analyze verify``; return its status and the lines about our unit
    (those naming the unit file, its directory, or the unit's name without
    ``.service``, e.g. "edge-agent").

    verify also loads the host's units our unit refers to (network.target,
    multi-user.target); complaints about *those* are the host's business.
    """
    result = run([analyze, "verify", "--man=no", str(unit)], cwd=unit.parent)
    output = (result.stdout + result.stderr).splitlines()
    ours = [line for line in output
            if unit.name in line or str(unit.parent) in line or unit.stem in line]
    return result.returncode, ours


def exposure(analyze: str, unit: Path) -> tuple[float, str]:
    result = run([analyze, "security", "--offline=yes", str(unit)], cwd=unit.parent)
    text = result.stdout + result.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", text)
    assert match, f"no exposure level in the output:\n{text}"
    assert result.returncode == 0, text
    return float(match.group(1)), text
