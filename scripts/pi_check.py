"""``make pi-check``: the agent on 64-bit ARM (a Raspberry Pi's arm64), inside the project,
under qemu-user in an arm64 Debian userland.

1. Builds the project's wheel.
2. Creates an arm64 Debian bookworm userland with debootstrap and qemu-user-static
   (installed with apt-get when missing, binfmt_misc mounted and qemu-aarch64
   registered) and caches it outside the repository (``EDGE_LDP_PI_CACHE``, default
   ``~/.cache/edge-ldp/pi-check``), with a venv holding the dependencies.
3. Installs the wheel there.
4. Runs the mechanism tests that pin exact values and privacy losses (``TESTS``).
5. Compares seeded outputs and exact losses with this machine's, bit for bit
   (``scripts/pi_digest.py`` on both).
6. Runs ``edge-agent run`` in the userland for a minute against a Mosquitto on this
   machine, and checks that every report decodes and that each channel reported.
7. Runs ``scripts/install-agent.sh`` there with the wheel, twice (the first run installs,
   or upgrades the install a previous pi-check left; the second must change nothing), and
   checks the unit and its drop-ins with this machine's ``systemd-analyze verify``, the
   configuration, the warmed kernel cache and that a state file survives.

Where the machine cannot run it (not root, no binfmt_misc) it says so in one line and
exits 1.  Timing under qemu-user is the emulator's, not a Pi's.

Run: ``sudo make pi-check`` (or ``python scripts/pi_check.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("EDGE_LDP_PI_CACHE", Path.home() / ".cache" / "edge-ldp" / "pi-check"))
ROOT = CACHE / "bookworm-arm64"
MIRROR = os.environ.get("EDGE_LDP_DEBIAN_MIRROR", "http://deb.debian.org/debian")
INSIDE = Path("/opt/pi-check")  # in the userland: venv, copied tests, state
HOST_CA = Path("/etc/ssl/certs/host-ca-bundle.crt")  # this machine's CA bundle, copied in
VENV = INSIDE / "venv"
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100", "scipy>=1.11"]
CONSTRAINTS = "requirements/agent.txt"  # the agent's locked versions (make lock)
# The tests that pin exact values and privacy losses (no conftest: they need no broker).
TESTS = ["tests/edge_agent/mechanisms/test_privacy.py",
         "tests/edge_agent/mechanisms/test_kernels.py",
         "tests/edge_agent/mechanisms/test_categorical.py"]
# Under qemu-user a test runs 10-20 times slower: the exact ones here (pinned losses,
# kernels against their references, exact pmfs); the goodness-of-fit and the loss over
# every grid and weight run on x86_64 in `make test` (their arithmetic is the same).
SELECT = ("not over_grid and not every_weight and not property and not reports_follow "
          "and not goodness and not unbiased_with")
TEST_SUPPORT = ["tests/__init__.py", "tests/edge_agent/__init__.py",
                "tests/edge_agent/mechanisms/__init__.py",
                "tests/edge_agent/mechanisms/helpers.py",
                "tests/edge_agent/mechanisms/reference.py"]
AGENT_SECONDS = 60
INSTALLER_FILES = ["scripts/install-agent.sh", "systemd/edge-agent.service",
                   "systemd/edge-agent-ble.conf", "systemd/edge-agent-i2c.conf",
                   "configs/agent.toml", "pyproject.toml", "requirements/agent.txt"]
CHANNELS = [
    {"name": "ax", "kind": "linear", "field": "accel_x", "domain": [-2.0, 2.0]},
    {"name": "hr", "kind": "linear", "field": "heart_rate", "mechanism": "pm-c",
     "domain": [40.0, 200.0]},
    {"name": "roll", "kind": "circular", "field": "roll"},
    {"name": "hm", "kind": "polar", "fields": ["accel_h_mag", "accel_h_dir"],
     "radius_max": 2.0, "epsilon": 3.0},
    {"name": "acc", "kind": "vector", "fields": ["accel_x", "accel_y", "accel_z"],
     "domain": [-2.0, 2.0]},
    {"name": "act", "kind": "categorical", "field": "activity",
     "categories": ["rest", "walk", "run"]},
]


class Unavailable(Exception):
    """This machine cannot run arm64 programs (said in one line)."""


def step(name: str):
    print(f"pi-check: {name} ...", flush=True)
    return time.monotonic()


def done(began: float, what: str = "") -> float:
    took = time.monotonic() - began
    print(f"pi-check:   {what or 'done'} ({took:.1f} s)", flush=True)
    return took


# -- the machine ---------------------------------------------------------------------------

def ensure_tools() -> None:
    if os.geteuid() != 0:
        raise Unavailable("needs root (debootstrap, binfmt_misc and chroot): run "
                          "`sudo make pi-check`")
    if shutil.which("debootstrap") and Path("/usr/bin/qemu-aarch64-static").exists():
        return
    if not shutil.which("apt-get"):
        raise Unavailable("needs debootstrap and qemu-user-static, and this machine has no "
                          "apt-get to install them")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "qemu-user-static", "debootstrap",
                    "binfmt-support"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def ensure_binfmt(binfmt: Path = BINFMT) -> None:
    if not (binfmt / "status").exists():
        result = subprocess.run(["mount", "binfmt_misc", "-t", "binfmt_misc", str(binfmt)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise Unavailable(f"no binfmt_misc on this machine ({result.stderr.strip()}): "
                              f"arm64 programs cannot run here")
    if not (binfmt / "qemu-aarch64").exists() and shutil.which("update-binfmts"):
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True)
    if not (binfmt / "qemu-aarch64").exists():
        raise Unavailable("qemu-aarch64 is not registered in binfmt_misc: arm64 programs "
                          "cannot run here")


def ensure_userland() -> bool:
    """The cached arm64 userland (built when missing); whether it was built now."""
    if (ROOT / "usr" / "bin" / "python3").exists():
        return False
    partial = ROOT.with_name(ROOT.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(["debootstrap", "--arch=arm64", "--variant=minbase",
                    "--include=python3,python3-venv,python3-pip,ca-certificates", "bookworm",
                    str(partial), MIRROR], check=True, stdout=subprocess.DEVNULL)
    partial.rename(ROOT)
    return True


@contextmanager
def mounted():
    """/proc and /dev bound into the userland, the host's DNS and CA bundle copied in (a
    network that inspects TLS has its own CA there)."""
    shutil.copy("/etc/resolv.conf", ROOT / "etc" / "resolv.conf")
    bundle = os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    if Path(bundle).exists():
        shutil.copy(bundle, to_inside(HOST_CA))
    mounts = []
    try:
        for name in ("proc", "dev"):
            target = ROOT / name
            subprocess.run(["mount", "--bind", f"/{name}", str(target)], check=True)
            mounts.append(target)
        yield
    finally:
        for target in reversed(mounts):
            subprocess.run(["umount", "-l", str(target)], check=False)


def inside(*command: str, check: bool = True, capture: bool = False, timeout: float = 3600,
           cwd: Path = INSIDE) -> subprocess.CompletedProcess:
    """``command`` run in the arm64 userland (through qemu-user)."""
    env = {"PATH": f"{VENV}/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "NUMBA_CACHE_DIR": str(INSIDE / "numba-cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    if to_inside(HOST_CA).exists():
        env.update(SSL_CERT_FILE=str(HOST_CA), PIP_CERT=str(HOST_CA))
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"  # found with this machine's PATH
    return subprocess.run([chroot, str(ROOT), "/usr/bin/env", "-C", str(cwd), *command],
                          check=check, env=env, timeout=timeout, text=True,
                          capture_output=capture)


def to_inside(path: Path) -> Path:
    return ROOT / path.relative_to("/")


# -- the checks ------------------------------------------------------------------------------

def build_wheel(work: Path) -> Path:
    # build (a test dependency), not pip: the venv uv made has no pip.
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work),
                    str(REPO)], check=True, capture_output=True)
    return next(work.glob("edge_ldp-*.whl"))


def install(wheel: Path) -> None:
    to_inside(INSIDE).mkdir(parents=True, exist_ok=True)
    if not to_inside(VENV / "bin" / "python").exists():
        inside("/usr/bin/python3", "-m", "venv", str(VENV), cwd=Path("/"))
    target = to_inside(INSIDE / wheel.name)
    shutil.copy(wheel, target)
    shutil.copy(REPO / CONSTRAINTS, to_inside(INSIDE / "agent.txt"))
    # The dependencies once (they stay in the cached venv), the project every time: the
    # lean install (no collector) at the versions tested, as install-agent.sh does.
    inside("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--constraint", str(INSIDE / "agent.txt"), str(INSIDE / wheel.name), *TEST_DEPS)
    inside("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--force-reinstall", "--no-deps", str(INSIDE / wheel.name))


def run_tests() -> str:
    source = to_inside(INSIDE / "src")
    shutil.rmtree(source, ignore_errors=True)
    for name in TESTS + TEST_SUPPORT:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    result = inside("python", "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider",
                    "-k", SELECT, *TESTS, cwd=INSIDE / "src", capture=True, check=False)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if result.returncode != 0:
        print(result.stdout[-6000:], result.stderr[-3000:], sep="\n")
        raise SystemExit(f"pi-check: the mechanism tests failed on arm64: {summary}")
    return summary


def compare_digests() -> int:
    host = json.loads(subprocess.run([sys.executable, str(REPO / "scripts" / "pi_digest.py")],
                                     check=True, capture_output=True, text=True,
                                     cwd=REPO).stdout)
    shutil.copy(REPO / "scripts" / "pi_digest.py", to_inside(INSIDE / "pi_digest.py"))
    arm = json.loads(inside("python", str(INSIDE / "pi_digest.py"), capture=True).stdout)
    differ = sorted(name for name in host if host[name] != arm.get(name))
    if differ or set(host) != set(arm):
        raise SystemExit(f"pi-check: arm64 differs from x86_64 in: {', '.join(differ)}")
    return len(host)


def agent_settings(port: int, state_dir: Path) -> dict:
    """The arm64 agent's configuration: every channel kind, a report a second each."""
    return {"agent_id": "pi-check", "fleet": "pi", "batch_seconds": 1.0,
            "broker": {"host": "127.0.0.1", "port": port},
            "privacy": {"budget_epsilon": 100000.0, "state_dir": str(state_dir)},
            "sources": [{"name": "imu", "type": "synthetic", "rate_hz": 50}],
            "channels": [{"epsilon": 1.0, "report_interval": 1.0, "source": "imu", **c}
                         for c in CHANNELS]}


def run_agent(work: Path) -> dict[str, int]:
    sys.path.insert(0, str(REPO))
    from edge_agent.protocol.reports import decode_report
    from tests.support import Mosquitto, Subscriber, write_toml

    broker_dir = work / "broker"
    broker_dir.mkdir()
    broker = Mosquitto(broker_dir).start()
    subscriber = Subscriber(broker, "ldp/v1/pi/+/+")
    state = INSIDE / "state"
    shutil.rmtree(to_inside(state), ignore_errors=True)
    write_toml(to_inside(INSIDE / "agent.toml"), agent_settings(broker.port, state))
    try:
        inside("timeout", "-s", "TERM", str(AGENT_SECONDS), "edge-agent", "run", "--config",
               str(INSIDE / "agent.toml"), check=False)
        time.sleep(2)
        counts: dict[str, int] = {}
        for topic, payload, _ in list(subscriber.messages):
            if topic.endswith("/status") or not payload:
                continue
            report = decode_report(topic, payload, "pi")  # raises if it does not decode
            counts[report.channel] = counts.get(report.channel, 0) + 1  # messages
    finally:
        subscriber.close()
        broker.stop()
    missing = [c["name"] for c in CHANNELS if not counts.get(c["name"])]
    if missing:
        raise SystemExit(f"pi-check: the arm64 agent reported nothing on {', '.join(missing)}")
    return counts


def check_installer(wheel: Path) -> str:
    """install-agent.sh in the userland with the real paths; returns what it measured."""
    sys.path.insert(0, str(REPO))
    from tests.support.systemd_units import find_systemd_analyze, stage_unit, verify

    checkout = INSIDE / "installer"
    shutil.rmtree(to_inside(checkout), ignore_errors=True)
    for name in INSTALLER_FILES:
        to_inside(checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, to_inside(checkout / name))
    shutil.copy(wheel, to_inside(checkout / wheel.name))
    ledger = to_inside(Path("/var/lib/edge-agent/state.sqlite"))  # what a device had
    ledger.parent.mkdir(parents=True, exist_ok=True)
    if not ledger.exists():
        ledger.write_bytes(b"a ledger the installer must not touch")
    kept = ledger.read_bytes()
    seconds, outputs = [], []
    for _ in range(2):
        began = time.monotonic()
        result = inside("bash", str(checkout / "scripts" / "install-agent.sh"), "--wheel",
                        str(checkout / wheel.name), "--agent-id", "pi-check", "--extras",
                        "i2c", capture=True, check=False, cwd=Path("/"))
        seconds.append(time.monotonic() - began)
        outputs.append(result.stdout)
        if result.returncode != 0:
            raise SystemExit(f"pi-check: install-agent.sh failed on arm64:\n"
                             f"{result.stdout}{result.stderr}")
    if "creating" in outputs[1] or "kept /etc/edge-agent/agent.toml" not in outputs[1]:
        raise SystemExit(f"pi-check: install-agent.sh run again was not a no-op:\n{outputs[1]}")
    if ledger.read_bytes() != kept:
        raise SystemExit("pi-check: install-agent.sh changed /var/lib/edge-agent")
    if not list(to_inside(Path("/var/cache/edge-agent/numba")).rglob("*.nbc")):
        raise SystemExit("pi-check: install-agent.sh left no compiled kernels in the cache")
    units = to_inside(Path("/etc/systemd/system"))
    analyze = find_systemd_analyze()
    if analyze is None:
        return f"installed in {seconds[0]:.0f} s, again in {seconds[1]:.0f} s (no systemd-analyze)"
    with tempfile.TemporaryDirectory() as directory:
        staged = stage_unit(units / "edge-agent.service", Path(directory), dropins={
            p.name: p.read_text() for p in (units / "edge-agent.service.d").iterdir()})
        code, ours = verify(analyze, staged)
    if code != 0 or ours:
        raise SystemExit("pi-check: systemd-analyze verify of the installed unit:\n"
                         + "\n".join(ours))
    return (f"installed in {seconds[0]:.0f} s, again (a no-op) in {seconds[1]:.0f} s; "
            "unit and drop-ins verified, kernels cached, the state directory untouched")


def main() -> int:
    began = time.monotonic()
    try:
        ensure_tools()
        ensure_binfmt()
    except Unavailable as exc:
        print(f"pi-check: {exc}", file=sys.stderr)
        return 1
    t = step(f"arm64 userland in {ROOT}")
    built = ensure_userland()
    done(t, "built with debootstrap" if built else "cached")
    with tempfile.TemporaryDirectory() as directory, mounted():
        work = Path(directory)
        t = step("the wheel")
        wheel = build_wheel(work)
        done(t, wheel.name)
        t = step("installing it in the arm64 venv")
        install(wheel)
        done(t)
        t = step("mechanism tests on arm64")
        done(t, run_tests())
        t = step("seeded outputs and exact losses, arm64 against x86_64")
        done(t, f"{compare_digests()} mechanisms and settings bit for bit identical")
        t = step(f"the agent on arm64 for {AGENT_SECONDS} s against Mosquitto on the host")
        counts = run_agent(work)
        done(t, "reports decoded: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        t = step("install-agent.sh in the arm64 userland, twice")
        done(t, check_installer(wheel))
    print(f"pi-check: passed in {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
