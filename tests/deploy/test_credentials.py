"""scripts/make-device-credentials, run as a program (the broker tests use it too)."""

from __future__ import annotations

import base64
import hashlib
import re
import stat
import subprocess
import tomllib

import pytest
from pydantic import ValidationError

from collector.config import parse_collector_config
from edge_agent.config import NAME_PATTERN, AgentConfig, BrokerConfig, ConfigError, parse_config
from tests.deploy.secure_broker import CREDENTIALS, make_credentials

IDS_VALID = ["wearable-01", "a", "A.b_c-9", "x" * 64, "0pi", "collector"]
IDS_INVALID = ["", "_hidden", "-dash", ".dot", "a/b", "a+b", "a#", "x" * 65, "with space",
               "ümlaut", "a:b", "$SYS"]


def entries(path) -> dict[str, str]:
    return dict(line.split(":", 1) for line in path.read_text().splitlines()
                if line and not line.startswith("#"))


def check_hash(entry: str, password: str) -> bool:
    _, kind, iterations, salt, key = entry.split("$")
    assert kind == "7"
    return base64.b64decode(key) == hashlib.pbkdf2_hmac(
        "sha512", password.encode(), base64.b64decode(salt), int(iterations))


def test_the_script_uses_the_agents_id_rule():
    text = CREDENTIALS.read_text()
    match = re.search(r'^NAME_PATTERN = r"(.*)"$', text, re.MULTILINE)
    assert match and match.group(1) == NAME_PATTERN


@pytest.mark.parametrize("name", IDS_INVALID)
def test_invalid_ids_are_refused_like_the_agent_refuses_them(tmp_path, name):
    with pytest.raises((ConfigError, ValidationError)):
        AgentConfig.model_validate({"agent_id": name, "fleet": "f",
                                    "privacy": {"budget_epsilon": 1},
                                    "sources": [{"name": "s", "type": "synthetic"}],
                                    "channels": [{"name": "c", "source": "s", "field": "roll",
                                                  "kind": "circular", "epsilon": 1}]})
    passwd = tmp_path / "passwd"
    passwd.write_text("keep:$7$101$AAAA$BBBB\n")
    result = make_credentials(passwd, tmp_path / "secrets", "ok-device", name)
    assert result.returncode == 2
    assert f"{name!r} is not a valid agent id" in result.stderr
    assert "letters, digits" in result.stderr
    # Nothing was changed, not even for the valid id given with it.
    assert passwd.read_text() == "keep:$7$101$AAAA$BBBB\n"
    assert not (tmp_path / "secrets").exists()
    assert result.stdout == ""


@pytest.mark.parametrize("name", IDS_VALID)
def test_valid_ids_are_accepted(tmp_path, name):
    result = make_credentials(tmp_path / "passwd", tmp_path / "secrets", name)
    assert result.returncode == 0, result.stderr
    assert name in entries(tmp_path / "passwd")


def test_entries_secrets_and_modes(tmp_path):
    passwd = tmp_path / "passwd"
    passwd.write_text("# comment kept\nother:$7$101$c2FsdA==$a2V5\n")
    passwd.chmod(0o640)
    result = make_credentials(passwd, tmp_path / "secrets", "dev-a", "collector")
    assert result.returncode == 0, result.stderr
    lines = passwd.read_text().splitlines()
    assert lines[:2] == ["# comment kept", "other:$7$101$c2FsdA==$a2V5"]  # untouched
    assert stat.S_IMODE(passwd.stat().st_mode) == 0o640  # kept
    secrets_dir = tmp_path / "secrets"
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    found = entries(passwd)
    for name in ("dev-a", "collector"):
        secret = secrets_dir / f"{name}.password"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        password = secret.read_text().strip()
        assert len(password) >= 40  # 256 random bits, url-safe base64
        assert check_hash(found[name], password)
        # The password is in the 0600 file only: never on the terminal.
        assert password not in result.stdout and password not in result.stderr
    assert (secrets_dir / "dev-a.password").read_text() != \
        (secrets_dir / "collector.password").read_text()


def test_rotation_replaces_only_that_entry(tmp_path):
    passwd, secrets_dir = tmp_path / "passwd", tmp_path / "secrets"
    assert make_credentials(passwd, secrets_dir, "dev-a", "dev-b").returncode == 0
    before = entries(passwd)
    old = (secrets_dir / "dev-a.password").read_text()
    assert make_credentials(passwd, secrets_dir, "dev-a").returncode == 0
    after = entries(passwd)
    assert after["dev-b"] == before["dev-b"]
    assert after["dev-a"] != before["dev-a"]
    new = (secrets_dir / "dev-a.password").read_text()
    assert new != old and check_hash(after["dev-a"], new.strip())
    assert len(passwd.read_text().splitlines()) == 2  # replaced, not appended

    assert make_credentials(passwd, secrets_dir, "dev-a", extra_args=("--remove",)) \
        .returncode == 0
    assert entries(passwd) == {"dev-b": before["dev-b"]}


@pytest.mark.parametrize("blocked", ["secrets-dir-is-a-file", "one-secret-is-a-directory"])
def test_failed_secret_write_leaves_the_password_file_alone(tmp_path, blocked):
    # Rotation must not revoke a password whose replacement was never saved:
    # the secret files are written (all or none) before the password file.
    # (A file or directory in the way, not chmod: root can write anywhere.)
    passwd, secrets_dir = tmp_path / "passwd", tmp_path / "secrets"
    assert make_credentials(passwd, secrets_dir, "dev-a", "dev-b").returncode == 0
    before = passwd.read_bytes()
    old_a = (secrets_dir / "dev-a.password").read_text()
    if blocked == "secrets-dir-is-a-file":
        target = tmp_path / "not-a-dir"
        target.write_text("")
    else:
        target = secrets_dir
        (secrets_dir / "dev-b.password").unlink()
        (secrets_dir / "dev-b.password").mkdir()
    result = make_credentials(passwd, target, "dev-a", "dev-b")
    assert passwd.read_bytes() == before
    assert result.returncode == 1, result.stderr
    assert "cannot write the passwords" in result.stderr and "not changed" in result.stderr
    # The old passwords still match the broker's hashes, and no temporary file is left.
    assert check_hash(entries(passwd)["dev-a"],
                      (secrets_dir / "dev-a.password").read_text().strip())
    assert (secrets_dir / "dev-a.password").read_text() == old_a
    assert sorted(p.name for p in secrets_dir.iterdir()) == ["dev-a.password",
                                                            "dev-b.password"]
    assert result.stdout == ""


def test_failed_password_file_update_is_reported(tmp_path):
    # The other failure: the secrets are written but the password file cannot
    # be replaced (here a directory stands where it should be).
    passwd = tmp_path / "passwd"
    passwd.mkdir()
    result = make_credentials(passwd, tmp_path / "secrets", "dev-a")
    assert result.returncode == 1
    assert f"cannot update {passwd}" in result.stderr and "run it again" in result.stderr
    assert result.stdout == "" and passwd.is_dir()


def test_new_password_file_is_not_world_readable(tmp_path):
    passwd = tmp_path / "new" / "passwd"
    assert make_credentials(passwd, tmp_path / "secrets", "dev-a").returncode == 0
    assert stat.S_IMODE(passwd.stat().st_mode) & 0o007 == 0


def test_hash_matches_mosquitto_passwd_format(tmp_path):
    # The same "$7$" layout mosquitto_passwd writes (when it is installed).
    import shutil

    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        pytest.skip("mosquitto_passwd is not installed")
    reference = tmp_path / "reference"
    subprocess.run([tool, "-c", "-b", str(reference), "someone", "pw"], check=True,
                   capture_output=True)
    theirs = entries(reference)["someone"]
    assert check_hash(theirs, "pw")
    ours = entries(_made(tmp_path))["dev-a"]
    assert [len(part) for part in theirs.split("$")] == [len(part) for part in ours.split("$")]
    assert theirs.split("$")[:3] == ours.split("$")[:3]


def _made(tmp_path):
    passwd = tmp_path / "passwd"
    assert make_credentials(passwd, tmp_path / "secrets", "dev-a").returncode == 0
    return passwd


def snippet_of(stdout: str) -> dict:
    return tomllib.loads("\n".join(line for line in stdout.splitlines()
                                   if not line.startswith("#")))


def test_device_snippet_is_a_valid_agent_config(tmp_path):
    result = make_credentials(tmp_path / "passwd", tmp_path / "secrets", "wearable-07",
                              extra_args=("--fleet", "north", "--port", "8884"))
    assert result.returncode == 0, result.stderr
    snippet = snippet_of(result.stdout)
    assert snippet["agent_id"] == "wearable-07" and snippet["fleet"] == "north"
    broker = BrokerConfig.model_validate(snippet["broker"])
    assert broker.username == "wearable-07" and broker.port == 8884
    assert broker.host == "localhost" and broker.tls is not None and broker.tls.ca
    assert str(broker.password_file) == "/run/credentials/edge-agent.service/mqtt-password"
    # ... and whole, with a source and a channel added.
    parse_config(dict(snippet, privacy={"budget_epsilon": 10},
                      sources=[{"name": "s", "type": "synthetic"}],
                      channels=[{"name": "c", "source": "s", "field": "roll",
                                 "kind": "circular", "epsilon": 1}]))


def test_collector_snippet_is_a_valid_collector_config(tmp_path):
    result = make_credentials(tmp_path / "passwd", tmp_path / "secrets", "collector")
    assert result.returncode == 0, result.stderr
    config = parse_collector_config(snippet_of(result.stdout))
    assert config.broker.username == "collector"
    assert config.broker.tls is not None
    assert "LoadCredential=mqtt-password:/etc/edge-collector/mqtt-password" in result.stdout


def test_fleet_name_is_checked_too(tmp_path):
    result = make_credentials(tmp_path / "passwd", tmp_path / "secrets", "dev-a",
                              extra_args=("--fleet", "_aggregates"))
    assert result.returncode == 2 and "--fleet" in result.stderr
    assert not (tmp_path / "passwd").exists()
