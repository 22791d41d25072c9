"""The systemd unit, its I2C drop-in and the sd_notify implementation.

The unit is checked with the real ``systemd-analyze`` (``verify`` and the
offline ``security`` score); those tests skip only when ``systemd-analyze``
is not installed.  The sd_notify tests talk to real AF_UNIX datagram sockets.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from edge_agent import sdnotify
from tests.support import REPO
from tests.support.systemd_units import (
    analyze,  # noqa: F401  (a fixture)
    environment,
    exposure,
    is_true,
    last,
    parse_unit,
    values,
    verify,
)
from tests.support.systemd_units import stage_unit as _stage_unit

UNIT = REPO / "systemd" / "edge-agent.service"
I2C_DROPIN = REPO / "systemd" / "edge-agent-i2c.conf"
BLE_DROPIN = REPO / "systemd" / "edge-agent-ble.conf"
EXEC_START = ("/opt/edge-agent/venv/bin/edge-agent run --config "
              "/etc/edge-agent/agent.toml")
MAX_EXPOSURE = 3.0


# -- helpers: tests/support/systemd_units.py ----------------------------------------------------

def stage_unit(directory: Path, *, dropins: dict[str, str] | None = None) -> Path:
    return _stage_unit(UNIT, directory, dropins=dropins)


# -- (a) verify ----------------------------------------------------------------------

def test_unit_verifies_cleanly(analyze, tmp_path):
    code, ours = verify(analyze, stage_unit(tmp_path))
    assert code == 0 and ours == [], "\n".join(ours)


def test_verify_would_catch_unknown_directives(analyze, tmp_path):
    # The harness must be able to fail: a misspelt key in a drop-in is reported
    # (verify exits 0 for it, so the tests look at the output, not the status).
    unit = stage_unit(tmp_path, dropins={"typo.conf": "[Service]\nProtectSytem=strict\n"})
    code, ours = verify(analyze, unit)
    assert any("Unknown key" in line and "ProtectSytem" in line for line in ours), ours


def test_unstaged_unit_only_misses_the_binary(analyze):
    # Verifying the file in place must fail only because /opt/edge-agent is
    # not installed here, never for any other reason.
    code, ours = verify(analyze, UNIT)
    if Path(EXEC_START.split()[0]).exists():
        assert code == 0 and ours == [], ours
    else:
        assert ours and all("/opt/edge-agent/venv/bin/edge-agent" in line for line in ours), ours


# -- (b) security score ----------------------------------------------------------------

def test_security_exposure_is_low(analyze, tmp_path):
    score, text = exposure(analyze, stage_unit(tmp_path))
    assert score <= MAX_EXPOSURE, text


def test_security_exposure_with_i2c_dropin_is_low(analyze, tmp_path):
    unit = stage_unit(tmp_path, dropins={"i2c.conf": I2C_DROPIN.read_text()})
    score, text = exposure(analyze, unit)
    assert score <= MAX_EXPOSURE, text
    assert "/dev/i2c-1" in text  # the drop-in was really applied


# -- (c) what the unit must (not) say -------------------------------------------------------

@pytest.fixture(scope="module")
def unit() -> dict:
    return parse_unit(UNIT.read_text())


def test_no_memory_deny_write_execute(unit):
    # numba JIT-compiles into executable memory; MemoryDenyWriteExecute=yes breaks it.
    assert not is_true(last(unit, "Service", "MemoryDenyWriteExecute"))
    assert not re.search(r"^\s*MemoryDenyWriteExecute\s*=\s*(yes|true|on|1)", UNIT.read_text(),
                         re.MULTILINE | re.IGNORECASE)
    assert not is_true(last(parse_unit(I2C_DROPIN.read_text()), "Service",
                            "MemoryDenyWriteExecute"))


def test_numba_cache_is_inside_the_cache_directory(unit):
    cache_dirs = " ".join(values(unit, "Service", "CacheDirectory")).split()
    assert cache_dirs, "CacheDirectory= is needed for numba's cache"
    numba_dir = environment(unit).get("NUMBA_CACHE_DIR")
    assert numba_dir, "Environment=NUMBA_CACHE_DIR=... is missing"
    assert any(Path(numba_dir).is_relative_to(Path("/var/cache") / d) for d in cache_dirs), (
        numba_dir, cache_dirs)


def test_notify_and_watchdog(unit):
    assert last(unit, "Service", "Type") == "notify"
    assert last(unit, "Service", "NotifyAccess") == "main"
    watchdog = last(unit, "Service", "WatchdogSec")
    assert watchdog and re.fullmatch(r"\d+s?", watchdog) and int(watchdog.rstrip("s")) > 0
    # Start-up (the first numba JIT on a Pi) gets much longer than one ping interval.
    start = last(unit, "Service", "TimeoutStartSec")
    assert start and int(start.rstrip("s")) >= 60


def test_address_families(unit):
    families = " ".join(values(unit, "Service", "RestrictAddressFamilies")).split()
    assert families and not families[0].startswith("~")  # an allow list
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)  # notify socket, MQTT


def test_command_user_and_directories(unit):
    assert last(unit, "Service", "ExecStart") == EXEC_START
    assert is_true(last(unit, "Service", "DynamicUser"))
    for key in ("StateDirectory", "CacheDirectory", "ConfigurationDirectory"):
        assert last(unit, "Service", key) == "edge-agent", key
    assert last(unit, "Service", "CapabilityBoundingSet") == ""
    assert is_true(last(unit, "Service", "PrivateDevices"))
    assert last(unit, "Service", "MemoryMax")
    assert last(unit, "Install", "WantedBy") == "multi-user.target"


def test_i2c_dropin_opens_only_the_i2c_device():
    dropin = parse_unit(I2C_DROPIN.read_text())
    assert set(dropin) == {"Service"}
    assert last(dropin, "Service", "PrivateDevices") == "no"
    assert last(dropin, "Service", "DevicePolicy") == "closed"
    assert values(dropin, "Service", "DeviceAllow") == ["/dev/i2c-1 rw"]
    assert last(dropin, "Service", "SupplementaryGroups") == "i2c"
    # Nothing else of the sandbox is relaxed.
    assert {k for k, _ in dropin["Service"]} == {
        "PrivateDevices", "DevicePolicy", "DeviceAllow", "SupplementaryGroups"}


# -- the BLE drop-in (systemd/edge-agent-ble.conf) ---------------------------------------------

def test_ble_dropin_verifies_cleanly(analyze, tmp_path):
    unit = stage_unit(tmp_path, dropins={"ble.conf": BLE_DROPIN.read_text()})
    code, ours = verify(analyze, unit)
    assert code == 0 and ours == [], "\n".join(ours)


def test_security_exposure_with_ble_dropin_is_low(analyze, tmp_path):
    unit = stage_unit(tmp_path, dropins={"ble.conf": BLE_DROPIN.read_text()})
    score, text = exposure(analyze, unit)
    assert score <= MAX_EXPOSURE, text
    assert "Service runs with supplementary groups" in text  # the drop-in was applied
    # Still no Bluetooth (or other exotic) socket: bleak goes through BlueZ over D-Bus.
    assert "Service cannot allocate exotic sockets" in text
    assert "Service cannot allocate netlink sockets" in text


def test_ble_dropin_only_adds_the_bluetooth_group_and_ordering():
    dropin = parse_unit(BLE_DROPIN.read_text())
    assert set(dropin) == {"Unit", "Service"}
    assert {k for k, _ in dropin["Service"]} == {"SupplementaryGroups"}
    # The group Debian's bluez D-Bus policy (bluetooth.conf) lets send to org.bluez.
    assert last(dropin, "Service", "SupplementaryGroups") == "bluetooth"
    assert {k for k, _ in dropin["Unit"]} == {"Wants", "After"}
    assert "bluetooth.service" in last(dropin, "Unit", "After").split()
    # The unit's address families already allow the system bus socket (AF_UNIX) and
    # nothing Bluetooth-specific is opened up.
    families = " ".join(values(parse_unit(UNIT.read_text()), "Service",
                               "RestrictAddressFamilies")).split()
    assert "AF_UNIX" in families and "AF_BLUETOOTH" not in families
    assert not is_true(last(dropin, "Service", "MemoryDenyWriteExecute"))


# -- (d) the drop-in combined with the unit --------------------------------------------------

def test_unit_with_i2c_dropin_verifies_cleanly(analyze, tmp_path):
    unit = stage_unit(tmp_path, dropins={"i2c.conf": I2C_DROPIN.read_text()})
    code, ours = verify(analyze, unit)
    assert code == 0 and ours == [], "\n".join(ours)


# -- (e) sd_notify against real sockets ----------------------------------------------------------

def _receiver_path(tmp_path: Path) -> Path:
    path = tmp_path / "notify.sock"
    if len(os.fsencode(path)) < 100:  # sun_path holds 108 bytes
        return path
    return Path(tempfile.mkdtemp(prefix="sdn-")) / "notify.sock"


class Receiver:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    def get(self, timeout: float = 2.0) -> str:
        self.sock.settimeout(timeout)
        return self.sock.recv(4096).decode()

    def drain(self) -> list[str]:
        self.sock.setblocking(False)
        messages = []
        try:
            while True:
                messages.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            return messages


@pytest.fixture
def receiver(tmp_path, monkeypatch):
    path = _receiver_path(tmp_path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield Receiver(sock)
    sock.close()


@pytest.fixture
def abstract_receiver(monkeypatch):
    name = f"edge-agent-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    yield Receiver(sock)
    sock.close()


def test_ready_arrives(receiver):
    assert sdnotify.ready() is True
    assert receiver.get() == "READY=1"


def test_ready_with_status_is_one_line(receiver):
    assert sdnotify.ready("3 channels\nbroker up")
    assert receiver.get() == "READY=1\nSTATUS=3 channels broker up"


def test_status_stopping_and_extend_timeout(receiver):
    assert sdnotify.status("compiling kernels")
    assert sdnotify.stopping()
    assert sdnotify.extend_timeout(90)
    assert receiver.get() == "STATUS=compiling kernels"
    assert receiver.get() == "STOPPING=1"
    assert receiver.get() == "EXTEND_TIMEOUT_USEC=90000000"


def test_abstract_socket(abstract_receiver):
    assert sdnotify.ready("abstract") is True
    assert abstract_receiver.get() == "READY=1\nSTATUS=abstract"


def test_no_notify_socket_returns_false(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert sdnotify.ready() is False


def test_unreachable_or_foreign_socket_returns_false(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    assert sdnotify.ready() is False


@pytest.mark.parametrize("usec, pid, expected", [
    ("30000000", None, 15.0),
    ("30000000", "self", 15.0),
    ("200000", None, 0.1),
    ("30000000", "other", None),
    ("0", None, None),
    ("-5", None, None),
    ("soon", None, None),
    (None, None, None),
    ("30000000", "garbage", None),
])
def test_watchdog_interval(monkeypatch, usec, pid, expected):
    for name, value in (("WATCHDOG_USEC", usec),
                        ("WATCHDOG_PID", {"self": str(os.getpid()),
                                          "other": str(os.getpid() + 1)}.get(pid, pid))):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert sdnotify.watchdog_interval() == expected


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_watchdog_cadence_is_half_of_watchdog_usec(receiver, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")  # WatchdogSec=2 -> ping every 1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    clock = FakeClock()
    dog = sdnotify.Watchdog(clock=clock)
    assert dog.enabled and dog.interval == 1.0

    sent_at = []
    start = clock.now
    for step in range(0, 1001):  # a main loop turning every 10 ms for 10 s
        clock.now = start + step * 0.01
        if dog.tick():
            sent_at.append(round(clock.now - start, 2))
    assert sent_at == [float(i) for i in range(11)]
    assert receiver.drain() == ["WATCHDOG=1"] * 11
    assert dog.pings == 11
    # Between pings never more than the interval, i.e. half of WatchdogSec.
    assert max(b - a for a, b in zip(sent_at, sent_at[1:])) <= 1.0


def test_watchdog_with_a_slow_loop_pings_every_iteration_it_is_due(receiver, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    clock = FakeClock()
    dog = sdnotify.Watchdog(clock=clock)
    assert dog.tick()
    clock.now += 0.4
    assert not dog.due() and not dog.tick()
    assert dog.seconds_until_due() == pytest.approx(0.6)
    assert dog.clamp_timeout(5.0) == pytest.approx(0.6)
    assert dog.clamp_timeout(0.2) == pytest.approx(0.2)
    assert dog.clamp_timeout(None) == pytest.approx(0.6)
    clock.now += 1.7  # late: ping at once, next one a full interval later
    assert dog.due() and dog.tick()
    assert dog.seconds_until_due() == pytest.approx(1.0)
    assert receiver.drain() == ["WATCHDOG=1", "WATCHDOG=1"]


def test_watchdog_pid_mismatch_disables_it(receiver, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    clock = FakeClock()
    dog = sdnotify.Watchdog(clock=clock)
    assert not dog.enabled
    for _ in range(5):
        clock.now += 1.0
        assert not dog.due() and not dog.tick() and not dog.ping()
    assert dog.seconds_until_due() is None and dog.clamp_timeout(3.0) == 3.0
    assert receiver.drain() == []


def test_child_process_that_inherited_the_environment_does_not_ping(receiver, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))  # as systemd sets it for us
    code = ("from edge_agent import sdnotify; d = sdnotify.Watchdog(); "
            "print(d.enabled, d.tick())")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.split() == ["False", "False"], result.stderr
    assert receiver.drain() == []


def test_no_watchdog_without_systemd(monkeypatch):
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    dog = sdnotify.Watchdog()
    assert not dog.enabled and not dog.tick() and dog.seconds_until_due() is None


def test_watchdog_enabled_but_no_socket_does_not_raise(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    dog = sdnotify.Watchdog(clock=FakeClock())
    assert dog.enabled and dog.tick() is False and dog.pings == 0


def test_watchdog_rejects_bad_interval():
    with pytest.raises(ValueError, match="interval"):
        sdnotify.Watchdog(0)
    with pytest.raises(ValueError, match="interval"):
        sdnotify.Watchdog(float("nan"))


def test_ping_interval_matches_the_unit(unit, monkeypatch):
    # What systemd passes for this unit's WatchdogSec gives a ping every WatchdogSec/2.
    seconds = int(last(unit, "Service", "WatchdogSec").rstrip("s"))
    monkeypatch.setenv("WATCHDOG_USEC", str(seconds * 1_000_000))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() == seconds / 2
