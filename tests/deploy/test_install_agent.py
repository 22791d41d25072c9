"""scripts/install-agent.sh, run for real: a venv with the wheel and its dependencies
(pip), the unit and its drop-ins checked with systemd-analyze, the configuration, the
credentials directory and the warmed kernel cache, in a temporary directory in place of
/opt, /etc and /var/cache.  Here systemd is not PID 1 (as in a chroot or an image being
built): it installs and enables without starting.  ``make pi-check`` runs it in the
arm64 userland with the real paths."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker

from edge_agent.config import NAME_PATTERN
from tests.support.systemd_units import analyze, verify  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-agent.sh"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build (a test dependency), not pip: the venv uv made has no pip.
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out),
                    str(REPO)], check=True, capture_output=True, timeout=600)
    return next(out.glob("edge_ldp-*.whl"))


def installed_versions(venv: Path) -> dict[str, str]:
    """Every distribution in ``venv`` by its normalised name."""
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m, json; print("
         "json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"],
        capture_output=True, text=True, check=True).stdout
    return {re.sub(r"[-_.]+", "-", name).lower(): version
            for name, version in json.loads(listed).items()}


def locked_versions() -> dict[str, str]:
    """What requirements/agent.txt (make lock, from uv.lock) pins for this Python."""
    pins = {}
    for line in (REPO / "requirements" / "agent.txt").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==(\S+)(?: ; (.*))?$", line)
        if match and (match.group(3) is None or Marker(match.group(3)).evaluate()):
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def paths(root: Path) -> dict[str, Path]:
    return {"prefix": root / "opt" / "edge-agent", "etc": root / "etc" / "edge-agent",
            "units": root / "etc" / "systemd" / "system", "cache": root / "cache"}


def install(root: Path, *args: str) -> subprocess.CompletedProcess:
    where = paths(root)
    env = {**os.environ, "PYTHON": sys.executable,
           "EDGE_AGENT_PREFIX": str(where["prefix"]), "EDGE_AGENT_ETC": str(where["etc"]),
           "EDGE_AGENT_UNIT_DIR": str(where["units"]), "EDGE_AGENT_CACHE": str(where["cache"])}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=900)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root (not the venv's) and its content."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "opt" not in p.relative_to(root).parts}


def test_the_script_uses_the_agents_id_rule():
    match = re.search(r"^NAME_PATTERN='(.*)'$", SCRIPT.read_text(), re.MULTILINE)
    assert match and match.group(1) == NAME_PATTERN


@pytest.mark.parametrize("args, says", [
    (["--extras", "ble,zigbee"], "unknown extra 'zigbee'"),
    (["--wheel", "/nonexistent/edge_ldp.whl"], "no such file"),
    (["--agent-id", "_hidden"], "'_hidden' is not an agent id"),
    (["--frobnicate"], "unknown option: --frobnicate"),
])
def test_bad_options_are_refused_before_anything_is_installed(tmp_path, args, says):
    run = install(tmp_path, *args)
    assert run.returncode == 1 and says in run.stderr, run.stderr
    assert not any(tmp_path.iterdir())


def test_install_twice_then_uninstall_keeps_only_the_state(tmp_path, wheel, analyze):
    where = paths(tmp_path)
    first = install(tmp_path, "--wheel", str(wheel), "--agent-id", "pi-07", "--extras", "ble")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "systemd is not running here" in first.stdout
    venv = where["prefix"] / "venv"
    agent = venv / "bin" / "edge-agent"
    assert subprocess.run([str(agent), "--help"], capture_output=True).returncode == 0
    # The lean install: the agent at the locked versions, nothing of the collector's web
    # stack; the collector's command says in one line what to install.
    installed = installed_versions(venv)
    assert not {"starlette", "uvicorn", "sse-starlette", "prometheus-client", "rich"} \
        & installed.keys(), sorted(installed)
    locked = locked_versions()
    for name in ("numpy", "numba", "llvmlite", "pydantic", "click", "paho-mqtt", "msgspec",
                 "bleak"):
        assert installed[name] == locked[name], name
    collector = subprocess.run([str(venv / "bin" / "edge-collector"), "run", "--config",
                                "c.toml"], capture_output=True, text=True)
    assert collector.returncode == 1
    assert collector.stderr.strip().splitlines() == [
        "edge-collector: starlette, uvicorn, sse_starlette, prometheus_client, rich not "
        "installed: install the collector extra, pip install 'edge-ldp[collector]'"]

    config = where["etc"] / "agent.toml"
    assert tomllib.loads(config.read_text())["agent_id"] == "pi-07"
    assert stat.S_IMODE(config.stat().st_mode) == 0o644
    assert stat.S_IMODE((where["etc"] / "credentials").stat().st_mode) == 0o700

    unit = where["units"] / "edge-agent.service"
    text = unit.read_text()
    assert f"ExecStart={agent} run --config {config}" in text
    dropins = sorted(p.name for p in (where["units"] / "edge-agent.service.d").iterdir())
    assert dropins == ["ble.conf", "credentials.conf"]
    assert f"LoadCredential=secret:{where['etc'] / 'credentials'}" in \
        (where["units"] / "edge-agent.service.d" / "credentials.conf").read_text()
    wants = where["units"] / "multi-user.target.wants" / "edge-agent.service"
    assert wants.is_symlink() and wants.resolve() == unit.resolve()
    code, ours = verify(analyze, unit)  # the installed unit with its drop-ins
    assert code == 0 and ours == [], "\n".join(ours)
    assert "the unit is clean" in first.stdout
    # The kernels the sample's channels use are compiled and cached.
    assert list((where["cache"] / "numba").rglob("*.nbc"))

    # A user's edits stay; the same install again changes nothing else.
    config.write_text(config.read_text().replace('fleet = "demo"', 'fleet = "study-3"'))
    python_inode = (venv / "bin" / "python").lstat().st_ino
    before = tree(tmp_path)
    again = install(tmp_path, "--wheel", str(wheel), "--extras", "ble")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "kept" in again.stdout and "creating" not in again.stdout
    assert (venv / "bin" / "python").lstat().st_ino == python_inode
    after = tree(tmp_path)
    changed = {name for name in before.keys() | after.keys()
               if before.get(name) != after.get(name) and "numba" not in name}
    assert changed == set(), changed
    # An extra no longer asked for loses its drop-in.
    assert install(tmp_path, "--wheel", str(wheel)).returncode == 0
    assert not (where["units"] / "edge-agent.service.d" / "ble.conf").exists()

    # The ledger's directory survives --uninstall, which says where it is.
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.sqlite").write_bytes(b"ledger")
    config.write_text(config.read_text().replace('state_dir = "/var/lib/edge-agent"',
                                                 f'state_dir = "{state}"'))
    gone = install(tmp_path, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert f"KEPT the state directory ({state})" in gone.stdout
    assert (state / "state.sqlite").read_bytes() == b"ledger"
    for name in ("prefix", "etc", "cache"):
        assert not where[name].exists(), name
    assert not unit.exists() and not wants.exists()
    assert not (where["units"] / "edge-agent.service.d").exists()
