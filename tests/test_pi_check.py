"""scripts/pi_check.py's parts that run without arm64 (the whole check is `make pi-check`,
outside `make test`: docs/guides/RASPBERRY_PI.md): where the machine cannot run it, one line
and exit 1; the agent configuration it writes is one the agent accepts."""

from __future__ import annotations

import importlib.util
import subprocess
import tomllib

import pytest

from edge_agent.config import parse_config
from tests.support import REPO
from tests.support.configs import to_toml


@pytest.fixture(scope="module")
def pi_check():
    spec = importlib.util.spec_from_file_location("pi_check", REPO / "scripts" / "pi_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_root_it_says_so_in_one_line_and_exits_1(pi_check, monkeypatch, capsys):
    monkeypatch.setattr(pi_check.os, "geteuid", lambda: 1000)
    assert pi_check.main() == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pi-check: needs root (debootstrap, binfmt_misc and chroot): run "
                   "`sudo make pi-check`"]


def test_without_binfmt_misc_it_says_why(pi_check, monkeypatch, tmp_path):
    """A container that cannot mount binfmt_misc: arm64 programs cannot run."""
    monkeypatch.setattr(pi_check.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 32, "", "mount: permission denied"))
    with pytest.raises(pi_check.Unavailable, match="no binfmt_misc on this machine "
                       r"\(mount: permission denied\): arm64 programs cannot run here"):
        pi_check.ensure_binfmt(tmp_path)


def test_the_agent_configuration_it_writes_is_accepted(pi_check, tmp_path):
    parsed = parse_config(tomllib.loads(to_toml(pi_check.agent_settings(1883, tmp_path))))
    assert [c.name for c in parsed.channels] == [c["name"] for c in pi_check.CHANNELS]
    assert {c.kind for c in parsed.channels} == {"linear", "circular", "polar", "vector",
                                                 "categorical"}
