"""A real Mosquitto started from configs/mosquitto.conf, with a throwaway CA.

Only ports, the listener's bind address and file paths of the production
configuration are rewritten (to a free loopback port and a tmp dir); every
other line runs verbatim.  Credentials come from scripts/make-device-credentials.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support import REPO, Mosquitto, wait_until

CONF = REPO / "configs" / "mosquitto.conf"
ACL = REPO / "configs" / "mosquitto.acl"
CREDENTIALS = REPO / "scripts" / "make-device-credentials"


# -- certificates ---------------------------------------------------------------------

def make_certificates(directory: Path, *, hosts=("localhost", "127.0.0.1")) -> dict[str, Path]:
    """A CA, a server certificate for ``hosts`` signed by it, and an unrelated CA."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _make_certificates_openssl(directory, hosts)
    return _make_certificates_cryptography(directory, hosts)


def _make_certificates_cryptography(directory: Path, hosts) -> dict[str, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(key, path: Path) -> Path:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
        return path

    def ca(common: str):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(common)).issuer_name(name(common))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                             crl_sign=True, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return key, cert

    ca_key, ca_cert = ca("edge-ldp test CA")
    _, other_cert = ca("some other CA")
    server_key = ec.generate_private_key(ec.SECP256R1())
    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_cert = (x509.CertificateBuilder().subject_name(name(hosts[0]))
                   .issuer_name(ca_cert.subject).public_key(server_key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName(names), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                                  critical=False)
                   .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = {"ca": directory / "ca.crt", "cert": directory / "server.crt",
             "key": directory / "server.key", "other_ca": directory / "other-ca.crt"}
    paths["ca"].write_bytes(ca_cert.public_bytes(pem))
    paths["cert"].write_bytes(server_cert.public_bytes(pem))
    write_key(server_key, paths["key"])
    paths["other_ca"].write_bytes(other_cert.public_bytes(pem))
    return paths


def _make_certificates_openssl(directory: Path, hosts) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("neither the cryptography package nor the openssl CLI is available: "
                    "run `make test` (it installs the test extras)")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    san = ",".join(f"IP:{h}" if re.fullmatch(r"[\d.]+|[0-9a-fA-F:]+:[0-9a-fA-F:]*", h)
                   else f"DNS:{h}" for h in hosts)
    for ca_name, common in (("ca", "edge-ldp test CA"), ("other-ca", "some other CA")):
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{ca_name}.key", "-out", f"{ca_name}.crt", "-days", "1",
            "-subj", f"/CN={common}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={hosts[0]}")
    (directory / "ext.cnf").write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "ext.cnf")
    return {"ca": directory / "ca.crt", "cert": directory / "server.crt",
            "key": directory / "server.key", "other_ca": directory / "other-ca.crt"}


# -- credentials ----------------------------------------------------------------------

def make_credentials(password_file: Path, secrets_dir: Path, *ids: str,
                     extra_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run the real script; returns the finished process (its output: the snippets)."""
    return subprocess.run([str(CREDENTIALS), "--password-file", str(password_file),
                           "--secrets-dir", str(secrets_dir), "--host", "localhost",
                           *extra_args, "--", *ids],
                          capture_output=True, text=True, timeout=60)


# -- the broker -----------------------------------------------------------------------

def production_config(*, port: int, workdir: Path, certs: dict[str, Path], password_file: Path,
                      acl_file: Path) -> str:
    """configs/mosquitto.conf with ports and paths (and only those) pointed at ``workdir``."""
    text = CONF.read_text()
    replacements = [
        (r"^listener 8883$", f"listener {port} 127.0.0.1"),
        (r"^cafile \S+$", f"cafile {certs['ca']}"),
        (r"^certfile \S+$", f"certfile {certs['cert']}"),
        (r"^keyfile \S+$", f"keyfile {certs['key']}"),
        (r"^password_file \S+$", f"password_file {password_file}"),
        (r"^acl_file \S+$", f"acl_file {acl_file}"),
        (r"^persistence_location \S+$", f"persistence_location {workdir}/"),
        (r"^log_dest file \S+$", f"log_dest file {workdir / 'mosquitto.log'}"),
    ]
    for pattern, new in replacements:
        text, count = re.subn(pattern, lambda _m, new=new: new, text, flags=re.MULTILINE)
        assert count == 1, f"configs/mosquitto.conf has no single line matching {pattern}"
    return text


def directives(text: str) -> list[tuple[str, str]]:
    """(option, value) pairs of a mosquitto.conf, comments and blank lines skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            option, _, value = line.partition(" ")
            out.append((option, value.strip()))
    return out


class SecureBroker(Mosquitto):
    """Mosquitto running the production configuration on a free loopback port.

    The process handling (start, stop, reload, clean-up) is ``Mosquitto``'s; what is
    production-specific is here: certificates, accounts, the ACL, and a configuration
    whose log goes to its own file.  A stop is a SIGTERM, as systemd's, so the
    persistent queues survive a restart."""

    host = "localhost"  # the server certificate's name
    CONSOLE = "mosquitto.stdout"  # mosquitto.log is the configuration's log file

    def __init__(self, workdir: Path, *, ids=("dev-a", "dev-b", "collector", "coordinator"),
                 certificates=make_certificates):
        workdir.mkdir(parents=True, exist_ok=True)
        self.certs = certificates(workdir / "certs", hosts=("localhost", "127.0.0.1"))
        self.password_file = workdir / "passwd"
        self.secrets_dir = workdir / "secrets"
        self.acl_file = workdir / "edge-ldp.acl"
        shutil.copy(ACL, self.acl_file)
        result = make_credentials(self.password_file, self.secrets_dir, *ids)
        assert result.returncode == 0, result.stderr
        self.snippets = result.stdout
        super().__init__(workdir, graceful_stop=True)
        self.broker_log = workdir / "mosquitto.log"
        _readable_by_mosquitto(workdir)

    def start(self) -> SecureBroker:
        """Start, and return once a TLS handshake completes: Mosquitto 2.0 listens, drops
        privileges and only then loads its certificate, so an open port is not yet a
        broker serving the files it was started with (a test that replaced them in that
        gap saw the new certificate before any reload)."""
        super().start()
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        probe.check_hostname = False
        probe.verify_mode = ssl.CERT_NONE  # loaded is the question here, not trusted

        def handshakes() -> bool:
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as raw, \
                        probe.wrap_socket(raw):
                    return True
            except OSError:  # ssl.SSLError is one
                return False

        if not wait_until(handshakes, 10, interval=0.05):
            raise RuntimeError(f"mosquitto completes no TLS handshake: {self.log_text()[-2000:]}")
        return self

    def configuration(self) -> str:
        return production_config(port=self.port, workdir=self.workdir, certs=self.certs,
                                 password_file=self.password_file, acl_file=self.acl_file)

    def password(self, name: str) -> str:
        return (self.secrets_dir / f"{name}.password").read_text().strip()


def _readable_by_mosquitto(workdir: Path) -> None:
    """Run as root, Mosquitto drops to the ``mosquitto`` user BEFORE it opens its log,
    the server key, the password and ACL files and its database (measured on 2.0.11;
    in production they are root:mosquitto 0640).  Give that user the work dir, which
    ``broker_workdir`` put directly under /tmp so the user can reach it."""
    if os.geteuid() != 0:
        return
    import pwd

    for name in ("mosquitto", "nobody"):  # Mosquitto's own order of choice
        try:
            user = pwd.getpwnam(name)
            break
        except KeyError:
            continue
    else:  # neither exists: mosquitto stays root
        return
    for path in [workdir, *workdir.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid)


def broker_workdir(tmp_path: Path) -> Path:
    """tmp_path, or as root a fresh directory directly under /tmp (pytest's base
    directory is 0700 root, which the dropped-privilege broker cannot enter)."""
    if os.geteuid() != 0:
        return tmp_path / "broker"
    return Path(tempfile.mkdtemp(prefix="edge-ldp-broker-"))
