"""The production broker setup, for real: configs/mosquitto.conf + configs/mosquitto.acl
on Mosquitto, a throwaway CA and server certificate, and accounts made by
scripts/make-device-credentials.  Then the real collector and a real agent
connect through it with TLS and their own accounts.

Every refusal is checked next to a message that is allowed on the same
connection (a "sentinel"), so a test cannot pass because nothing arrived at all.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import ssl
import time
import tomllib
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from collector.broker.network import RECEIVE_MAXIMUM
from collector.config import parse_collector_config
from edge_agent import protocol
from edge_agent.config import parse_config
from edge_agent.mechanisms import ClassicalOGPM
from tests.deploy.secure_broker import (
    CONF,
    SecureBroker,
    _make_certificates_openssl,
    _readable_by_mosquitto,
    broker_workdir,
    directives,
    make_certificates,
    make_credentials,
)
from tests.support import AgentProcess, MqttClient, configs, wait_until, write_toml
from tests.support.ports import HANG_GUARD_SECONDS

FLEET = "demo"
NOT_AUTHORIZED = 135  # MQTT v5 reason code
ACCEL_X = {**configs.AX_CHANNEL, "name": "accel_x"}  # the channel of the sample agent config


@pytest.fixture
def broker(tmp_path):
    yield from _broker(tmp_path)


def _broker(tmp_path, **kwargs):
    workdir = broker_workdir(tmp_path)
    broker = None
    try:
        broker = SecureBroker(workdir, **kwargs)
        yield broker.start()
    finally:
        if broker is not None:
            broker.stop()
        if workdir != tmp_path / "broker":
            shutil.rmtree(workdir, ignore_errors=True)


def refused(broker, username, *, password=None, v5=True) -> mqtt.ReasonCode:
    client = MqttClient(broker, username, password=password, v5=v5)
    try:
        client.connect()
        return client.connack
    finally:
        client.close()


def report(agent: str, channel: str, seq: int = 0) -> bytes:
    mech = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
    codes = [int(c) for c in mech.perturb_codes([0.1, -0.5, 1.2])]
    return protocol.report(agent=agent, channel=channel, kind="linear", seq=seq, t=time.time(),
                           dt=1.0, mechanism=mech.describe(), codes=codes)


# -- the configuration file itself --------------------------------------------------------

def test_production_config_shape():
    settings = directives(CONF.read_text())
    options = dict(settings)
    listeners = [value for option, value in settings if option == "listener"]
    assert listeners == ["8883"], "exactly one listener, the TLS one"
    for key in ("cafile", "certfile", "keyfile", "password_file", "acl_file"):
        assert options.get(key, "").startswith("/etc/mosquitto/"), key
    assert options["allow_anonymous"] == "false"
    assert options["persistence"] == "true"
    assert options["persistence_location"].endswith("/")
    assert options.get("per_listener_settings", "false") == "false"
    assert int(options["max_inflight_messages"]) >= 10 * 20  # "well above" the default 20
    assert options["require_certificate"] in ("false", "true")


def test_queue_holds_one_hour_of_the_sample_fleet():
    # The comment's arithmetic, recomputed from the sample agent config: 1,000
    # devices, its channels, one message per channel per batch, a status every 30 s.
    agent = tomllib.loads((CONF.parents[0] / "agent.toml").read_text())
    per_device = len(agent["channels"]) / agent["batch_seconds"] + 1 / 30
    needed = math.ceil(1000 * per_device * 3600)
    queued = int(dict(directives(CONF.read_text()))["max_queued_messages"])
    assert needed <= queued <= 1.25 * needed, (needed, queued)
    assert f"{needed / 1e6:.2f} million" in CONF.read_text()  # the comment shows the sum


# -- who gets in -------------------------------------------------------------------------

@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
def test_anonymous_clients_are_refused(broker, v5):
    assert refused(broker, None, v5=v5).value == NOT_AUTHORIZED  # 3.1.1's 5 maps to 135
    assert wait_until(lambda: "disconnected, not authorised." in broker.log_text(), 5)
    # ... while a real account gets in over the same listener.
    assert refused(broker, "dev-a", v5=v5).value == 0


def test_wrong_password_and_unknown_user_are_refused(broker):
    assert refused(broker, "dev-a", password=broker.password("dev-b")).value == NOT_AUTHORIZED
    assert refused(broker, "dev-a", password="").value == NOT_AUTHORIZED
    assert refused(broker, "nobody", password=broker.password("dev-a")).value == NOT_AUTHORIZED
    assert refused(broker, "dev-a").value == 0


def test_plain_mqtt_to_the_tls_listener_fails(broker):
    client = MqttClient(broker, "dev-a", tls=False)
    client.client.connect(broker.host, broker.port, keepalive=30)
    client.client.loop_start()
    try:
        assert not client.connected_event.wait(3)
        assert client.connack is None
    finally:
        client.close()
    # The broker logs the plaintext CONNECT as a TLS record of the wrong version.
    assert wait_until(lambda: "wrong version number" in broker.log_text(), 5), \
        broker.log_text()[-2000:]


def test_client_that_trusts_another_ca_refuses_the_broker(broker):
    client = MqttClient(broker, "dev-a", ca=broker.certs["other_ca"])
    with pytest.raises(ssl.SSLCertVerificationError):
        client.client.connect(broker.host, broker.port)
    client.close()
    assert wait_until(lambda: "unknown ca" in broker.log_text(), 5)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")
def test_certificates_from_the_openssl_fallback_work(tmp_path):
    # Without the cryptography package the tests make their CA with the
    # openssl CLI instead; that path must give a working broker too.
    for broker in _broker(tmp_path, certificates=_make_certificates_openssl):
        assert refused(broker, "dev-a").value == 0
        assert refused(broker, None).value == NOT_AUTHORIZED


def test_tls_failures_are_logged_by_agent_and_collector(broker, tmp_path, caplog, capfd):
    # paho retries a failed TLS handshake silently; the agent and both of the
    # collector's clients must say why they cannot connect (here: they trust
    # another CA), once, not at every retry.
    import logging

    from collector.service import CollectorService
    from edge_agent.config import BrokerConfig
    from edge_agent.transport import PahoTransport

    caplog.set_level(logging.DEBUG)
    transport = PahoTransport(BrokerConfig(
        host=broker.host, port=broker.port, username="dev-a", password=broker.password("dev-a"),
        tls={"ca": str(broker.certs["other_ca"])}), client_id="dev-a")
    transport.client.reconnect_delay_set(min_delay=0.1, max_delay=0.2)
    transport.start()
    try:
        assert wait_until(lambda: sum("certificate verify failed" in r.getMessage()
                                      for r in caplog.records) >= 3, 10), caplog.text
    finally:
        transport.stop()
    agent_lines = [r for r in caplog.records if r.name == "edge_agent.transport"
                   and "cannot connect to broker localhost" in r.getMessage()]
    assert [r.levelno for r in agent_lines][:3] == [logging.WARNING, logging.DEBUG, logging.DEBUG]

    config = collector_config(broker, tmp_path)
    config = config.model_copy(update={"broker": config.broker.model_copy(
        update={"tls": config.broker.tls.model_copy(update={"ca": broker.certs["other_ca"]})})})
    service = CollectorService(config)
    service.start()
    err = ""
    try:
        def network_child_said_so():
            nonlocal err
            err += capfd.readouterr().err
            return "collector.broker.network: cannot connect to broker" in err
        assert wait_until(network_child_said_so, 20), err
        assert "certificate verify failed" in err
        assert wait_until(lambda: "snapshot publisher cannot connect" in caplog.text, 10)
        assert not service.store.network()["connected"]
    finally:
        service.stop()


def test_renewed_certificates_are_picked_up_by_reload(broker):
    # `systemctl reload mosquitto` (SIGHUP) is enough to roll the server's
    # certificate, as configs/mosquitto.conf and docs/guides/DEPLOYMENT.md say.
    old_ca = broker.workdir / "old-ca.crt"
    shutil.copy(broker.certs["ca"], old_ca)
    new = make_certificates(broker.workdir / "renewed", hosts=("localhost", "127.0.0.1"))
    for key in ("ca", "cert", "key"):
        shutil.copy(new[key], broker.certs[key])
    _readable_by_mosquitto(broker.workdir)
    before = MqttClient(broker, "dev-a", client_id="dev-a", ca=old_ca).connect()
    assert before.connack.value == 0  # not re-read yet
    broker.reload()
    time.sleep(0.3)
    assert before.client.is_connected()  # connected clients are not dropped
    before.close()
    with pytest.raises(ssl.SSLCertVerificationError):
        MqttClient(broker, "dev-a", ca=old_ca).client.connect(broker.host, broker.port)
    client = MqttClient(broker, "dev-a", ca=new["ca"]).connect()
    assert client.connack.value == 0
    client.close()


def test_reload_adds_and_removes_devices(broker):
    # A device added while the broker runs gets in after `systemctl reload`
    # (SIGHUP), and a removed one is refused after the next.
    result = make_credentials(broker.password_file, broker.secrets_dir, "dev-c")
    assert result.returncode == 0, result.stderr
    assert refused(broker, "dev-c").value == NOT_AUTHORIZED  # not re-read yet
    broker.reload()
    assert refused(broker, "dev-c").value == 0
    assert refused(broker, "dev-a").value == 0  # the others kept their entries
    # Revocation: removing dev-c and rotating dev-b's password take effect at
    # the reload, for connected clients too (Mosquitto re-checks them).
    connected_c = MqttClient(broker, "dev-c", client_id="dev-c").connect()
    connected_b = MqttClient(broker, "dev-b", client_id="dev-b").connect()
    connected_a = MqttClient(broker, "dev-a", client_id="dev-a").connect()
    old_b = broker.password("dev-b")
    result = make_credentials(broker.password_file, broker.secrets_dir, "dev-c",
                              extra_args=("--remove",))
    assert result.returncode == 0, result.stderr
    assert make_credentials(broker.password_file, broker.secrets_dir, "dev-b").returncode == 0
    broker.reload()
    try:
        assert refused(broker, "dev-c").value == NOT_AUTHORIZED
        assert refused(broker, "dev-b", password=old_b).value == NOT_AUTHORIZED
        assert refused(broker, "dev-b").value == 0  # the new password
        assert wait_until(lambda: not connected_c.client.is_connected(), 5)
        assert wait_until(lambda: not connected_b.client.is_connected(), 5)
        assert connected_a.client.is_connected()  # untouched account, untouched connection
    finally:
        for client in (connected_a, connected_b, connected_c):
            client.close()


# -- what each account may publish ----------------------------------------------------------

FORBIDDEN_FOR_DEVICE_A = [
    f"ldp/v1/{FLEET}/dev-b/accel_x",                  # another device's data
    f"ldp/v1/{FLEET}/dev-b/status",                   # ... its status
    f"ldp/v1/{FLEET}/dev-b/_range/run1",              # ... its range replies
    f"ldp/v1/{FLEET}/_range/control/run1",            # the coordinator's control
    f"ldp/v1/{FLEET}/_range/result/accel_x/min",      # ... and results
    f"ldp/v1/{FLEET}/_aggregates/accel_x",            # the collector's snapshots
    f"ldp/v1/{FLEET}/_other/x",                       # ... and any other reserved level
    f"ldp/v1/{FLEET}/_confirm/dev-a",                 # ... and confirmations, its own too
    f"ldp/v1/{FLEET}/_confirm/dev-b",
    "ldp/v1/other-fleet/dev-b/accel_x",
    "elsewhere/dev-a",
]


@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
def test_device_publishes_only_as_itself(broker, v5):
    watcher = MqttClient(broker, "collector", client_id="watcher").connect()
    watcher.subscribe("ldp/v1/#")
    # A coordinator-account watcher too: it may read devices' _range replies.
    coordinator = MqttClient(broker, "coordinator", client_id="coord-watch").connect()
    coordinator.subscribe(f"ldp/v1/{FLEET}/+/_range/#", f"ldp/v1/{FLEET}/_range/#")
    device = MqttClient(broker, "dev-a", client_id="dev-a", v5=v5).connect()
    try:
        denied = {topic: device.publish(topic, b'{"forged":true}') for topic in
                  FORBIDDEN_FOR_DEVICE_A}
        own = [f"ldp/v1/{FLEET}/dev-a/accel_x", f"ldp/v1/{FLEET}/dev-a/status",
               f"ldp/v1/{FLEET}/dev-a/_range/run1"]
        allowed = {topic: device.publish(topic, b"{}") for topic in own}
        for topic, mid in denied.items():
            # MQTT v5 says so in the PUBACK; 3.1.1 has no way to, and acks it (dropped).
            assert device.acked(mid) == (NOT_AUTHORIZED if v5 else 0), topic
        for topic, mid in allowed.items():
            assert device.acked(mid) == 0, topic
        assert wait_until(lambda: set(own) <= set(watcher.topics()), 5), watcher.topics()
        assert wait_until(lambda: own[2] in coordinator.topics(), 5)
        time.sleep(0.3)
        assert set(watcher.topics()) == set(own), "a forged message got through"
        assert coordinator.topics() == [own[2]]
    finally:
        for client in (device, watcher, coordinator):
            client.close()


def test_service_accounts_publish_where_they_should(broker):
    # The positive side of the ACL: the collector writes snapshots and
    # confirmations, the coordinator writes range control and results; neither
    # may write a device's topic, nor a reserved level nobody uses.
    watcher = MqttClient(broker, "collector", client_id="watcher").connect()
    watcher.subscribe("ldp/v1/#")
    collector = MqttClient(broker, "collector", client_id="collector-pub").connect()
    coordinator = MqttClient(broker, "coordinator", client_id="coordinator").connect()
    try:
        checks = [
            (collector, f"ldp/v1/{FLEET}/_aggregates/accel_x", 0),
            (collector, f"ldp/v1/{FLEET}/_confirm/dev-a", 0),
            (collector, f"ldp/v1/{FLEET}/_range/control/run1", 0),  # coordinator = true
            (collector, f"ldp/v1/{FLEET}/dev-a/accel_x", NOT_AUTHORIZED),
            (collector, f"ldp/v1/{FLEET}/_other/x", NOT_AUTHORIZED),
            (coordinator, f"ldp/v1/{FLEET}/_range/control/run1", 0),
            (coordinator, f"ldp/v1/{FLEET}/_range/result/accel_x/min", 0),
            (coordinator, f"ldp/v1/{FLEET}/_aggregates/accel_x", NOT_AUTHORIZED),
            (coordinator, f"ldp/v1/{FLEET}/_confirm/dev-a", NOT_AUTHORIZED),
            (coordinator, f"ldp/v1/{FLEET}/dev-a/accel_x", NOT_AUTHORIZED),
        ]
        for client, topic, expected in checks:
            assert client.acked(client.publish(topic, b"{}")) == expected, topic
        wanted = {topic for _, topic, code in checks if code == 0}
        assert wait_until(lambda: wanted <= set(watcher.topics()), 5), watcher.topics()
        time.sleep(0.3)
        assert set(watcher.topics()) == wanted
    finally:
        for client in (watcher, collector, coordinator):
            client.close()


# -- what a device may read -----------------------------------------------------------------

def test_device_cannot_read_other_devices(broker):
    reader = MqttClient(broker, "dev-a", client_id="dev-a").connect()
    # Every way of asking for dev-b's data: a wildcard over everything, its
    # topics by name, its status, and a shared subscription.
    reader.subscribe("ldp/v1/#", f"ldp/v1/{FLEET}/dev-b/#", f"ldp/v1/{FLEET}/+/status",
                     f"$share/g/ldp/v1/{FLEET}/+/+")
    device_b = MqttClient(broker, "dev-b", client_id="dev-b").connect()
    coordinator = MqttClient(broker, "coordinator", client_id="coordinator").connect()
    collector = MqttClient(broker, "collector", client_id="collector-pub").connect()
    try:
        for topic, retain in ((f"ldp/v1/{FLEET}/dev-b/accel_x", False),
                              (f"ldp/v1/{FLEET}/dev-b/status", True),
                              (f"ldp/v1/{FLEET}/dev-b/_range/run1", False)):
            assert device_b.acked(device_b.publish(topic, report("dev-b", "accel_x"),
                                                   retain=retain)) == 0
        assert collector.acked(collector.publish(f"ldp/v1/{FLEET}/_confirm/dev-b", b"{}",
                                                 retain=True)) == 0
        # Sentinels, published after dev-b's messages: what a device must see.
        control = f"ldp/v1/{FLEET}/_range/control/run1"
        result = f"ldp/v1/{FLEET}/_range/result/accel_x/min"
        confirm = f"ldp/v1/{FLEET}/_confirm/dev-a"
        snapshot = f"ldp/v1/{FLEET}/_aggregates/accel_x"  # what plan_spread = "auto" reads
        assert coordinator.acked(coordinator.publish(control, b"{}")) == 0
        assert coordinator.acked(coordinator.publish(result, b"{}", retain=True)) == 0
        assert collector.acked(collector.publish(confirm, b"{}", retain=True)) == 0
        assert collector.acked(collector.publish(snapshot, b"{}", retain=True)) == 0
        assert wait_until(lambda: {control, result, confirm, snapshot}
                          <= set(reader.topics()), 5), reader.topics()
        time.sleep(0.3)
        assert not [t for t in reader.topics() if "dev-b" in t], reader.topics()

        # A late subscriber gets the retained range result, snapshot and its own
        # confirmations, but never dev-b's retained status or confirmations.
        late = MqttClient(broker, "dev-a", client_id="dev-a-late").connect()
        late.subscribe("ldp/v1/#")
        assert wait_until(lambda: {result, confirm, snapshot} <= set(late.topics()), 5)
        time.sleep(0.3)
        assert sorted(late.topics()) == sorted([result, confirm, snapshot])
        late.close()
    finally:
        for client in (reader, device_b, coordinator, collector):
            client.close()


def test_collector_reads_through_a_shared_subscription(broker):
    ingress = MqttClient(broker, "collector", client_id="ingress-1").connect()
    ingress.subscribe(f"$share/collectors/ldp/v1/{FLEET}/+/+")
    assert ingress.subacks[-1][0].value == 1  # granted QoS 1
    device = MqttClient(broker, "dev-a", client_id="dev-a").connect()
    try:
        topic = f"ldp/v1/{FLEET}/dev-a/accel_x"
        device.acked(device.publish(topic, report("dev-a", "accel_x")))
        assert wait_until(lambda: topic in ingress.topics(), 5)
    finally:
        ingress.close()
        device.close()


# -- queues and persistence: nothing lost while the collector is away ----------------------

def test_queue_holds_far_more_than_the_default_for_an_offline_collector(broker):
    # Mosquitto's default max_queued_messages (1000) would drop most of these.
    collector = MqttClient(broker, "collector", client_id="edge-collector-q",
                           persistent=True).connect()
    collector.subscribe(f"ldp/v1/{FLEET}/+/+")
    collector.close()
    device = MqttClient(broker, "dev-a", client_id="dev-a", v5=False)
    device.client.max_inflight_messages_set(1000)
    device.connect()
    count = 5000
    mids = [device.publish(f"ldp/v1/{FLEET}/dev-a/accel_x", b"%d" % i) for i in range(count)]
    assert wait_until(lambda: all(m in device.pubacks for m in mids), 60)
    device.close()
    collector = MqttClient(broker, "collector", client_id="edge-collector-q",
                           persistent=True).connect()
    try:
        assert wait_until(lambda: len(collector.messages) >= count, 60), len(collector.messages)
        assert sorted(int(p) for _, p, _ in collector.messages) == list(range(count))
    finally:
        collector.close()
    assert "are being dropped" not in broker.log_text()


def test_inflight_window_for_subscribers_that_ack_late(broker):
    # A subscriber that acknowledges late (the collector acks after each
    # SQLite commit) gets max_inflight_messages unacknowledged messages at
    # once if it speaks MQTT 3.1.1 (the default would be 20), and its own
    # Receive Maximum with v5 (the collector asks for 4096).
    window = int(dict(directives(CONF.read_text()))["max_inflight_messages"])
    assert window + 500 < RECEIVE_MAXIMUM
    got = {}
    for v5 in (False, True):
        subscriber = MqttClient(broker, "collector", client_id=f"late-acker-{v5}", v5=v5,
                            manual_ack=True)  # it never acknowledges here
        subscriber.connect(receive_maximum=RECEIVE_MAXIMUM if v5 else None)
        subscriber.subscribe(f"ldp/v1/{FLEET}/+/+")
        device = MqttClient(broker, "dev-a", client_id="dev-a", v5=False)
        device.client.max_inflight_messages_set(1000)
        device.connect()
        mids = [device.publish(f"ldp/v1/{FLEET}/dev-a/accel_x", b"x")
                for _ in range(window + 500)]
        assert wait_until(lambda: all(m in device.pubacks for m in mids), 30)
        time.sleep(1.0)
        got[v5] = len(subscriber.messages)
        device.close()
        subscriber.close()
    assert got[False] == window, got
    assert got[True] == window + 500, got  # all of them: below its Receive Maximum


def test_queued_reports_survive_a_broker_restart(broker):
    # persistence true: a clean stop (systemctl restart) saves the queue.
    collector = MqttClient(broker, "collector", client_id="edge-collector-p",
                           persistent=True).connect()
    collector.subscribe(f"ldp/v1/{FLEET}/+/+")
    collector.close()
    device = MqttClient(broker, "dev-a", client_id="dev-a").connect()
    for seq in range(3):
        assert device.acked(device.publish(f"ldp/v1/{FLEET}/dev-a/accel_x", b"%d" % seq)) == 0
    device.close()
    broker.stop()  # SIGTERM, as systemd stops it
    broker.start()
    collector = MqttClient(broker, "collector", client_id="edge-collector-p",
                           persistent=True).connect()
    try:
        assert collector.session_present
        assert wait_until(lambda: len(collector.messages) == 3, 10), collector.messages
    finally:
        collector.close()


# -- client ids: a known limitation of Mosquitto 2.0, and the mitigation --------------------

def queued_for(broker, client_id: str, thief_guess: str) -> list[str]:
    """Messages a persistent collector session gets after a device, guessing
    ``thief_guess`` as its client id, connected while the collector was away."""
    collector = MqttClient(broker, "collector", client_id=client_id, persistent=True).connect()
    collector.subscribe(f"ldp/v1/{FLEET}/+/+")
    collector.close()
    device_b = MqttClient(broker, "dev-b", client_id="dev-b").connect()
    for seq in range(3):
        device_b.acked(device_b.publish(f"ldp/v1/{FLEET}/dev-b/accel_x",
                                        report("dev-b", "accel_x", seq)))
    device_b.close()
    thief = MqttClient(broker, "dev-a", client_id=thief_guess, persistent=True).connect()
    time.sleep(0.5)
    stolen = thief.topics()
    thief.close()
    assert stolen == [], "the ACL must still stop a device reading the session's messages"
    collector = MqttClient(broker, "collector", client_id=client_id, persistent=True).connect()
    time.sleep(1.0)
    collector.close()
    return collector.topics()


def test_guessable_collector_client_id_lets_a_device_destroy_its_queue(broker):
    # Mosquitto 2.0.11 hands a session to whoever connects with its client id,
    # whatever the username (upstream issues #3551/#3553).  The ACL keeps the
    # queued reports from the intruder, but they are gone.  docs/guides/DEPLOYMENT.md
    # says so; if a Mosquitto upgrade fixes it, this test tells.
    assert queued_for(broker, "edge-collector", thief_guess="edge-collector") == []


def test_the_credentials_script_gives_the_collector_an_unguessable_client_id(broker, tmp_path):
    ids = []
    for run in range(2):
        result = make_credentials(tmp_path / f"p{run}", tmp_path / f"s{run}", "collector")
        ids.append(snippet_tables(result.stdout)[0]["broker"]["client_id"])
    assert all(re.fullmatch(r"edge-collector-[0-9a-f]{16}", i) for i in ids) and ids[0] != ids[1]
    # With it, a device guessing the default id gets nowhere near the session.
    assert len(queued_for(broker, ids[0], thief_guess="edge-collector")) == 3


# -- the real collector and a real agent --------------------------------------------------------

def snippet_tables(text: str) -> list[dict]:
    """The TOML snippets the credentials script printed (one per account)."""
    blocks, current = [], []
    for line in text.splitlines():
        if line.startswith("# ---") and current:
            blocks.append("\n".join(current))
            current = []
        if not line.startswith("#"):
            current.append(line)
    blocks.append("\n".join(current))
    return [tomllib.loads(block) for block in blocks if block.strip()]


def account_table(broker: SecureBroker, snippet: dict, account: str) -> dict:
    """A printed snippet's [broker] table pointed at the test broker: its port, the
    account's real password file and the test CA; the rest as printed."""
    return dict(snippet["broker"], port=broker.port,
                password_file=str(broker.secrets_dir / f"{account}.password"),
                tls=dict(snippet["broker"]["tls"], ca=str(broker.certs["ca"])))


def collector_config(broker: SecureBroker, tmp_path: Path, *, shared_group=None):
    snippet = next(t for t in snippet_tables(broker.snippets)
                   if t.get("broker", {}).get("username") == "collector")
    broker_table = account_table(broker, snippet, "collector")
    assert broker_table["host"] == "localhost"  # as printed (--host localhost)
    if shared_group:
        broker_table["shared_group"] = shared_group
    return parse_collector_config(configs.collector_config(
        broker_table, fleet=snippet["fleet"],
        http={"host": "127.0.0.1", "port": 0, "push_seconds": 0.5},
        storage={"path": str(tmp_path / "collector.sqlite"), "checkpoint_seconds": 1},
        snapshots={"interval_seconds": 0.5}))


def start_collector(config):
    from collector.service import CollectorService

    service = CollectorService(config)
    service.start()
    try:
        # Set by the network process once the broker granted its subscriptions.
        assert wait_until(lambda: service.store.network()["connected"], 30), \
            "the collector's network process did not subscribe"
        assert wait_until(lambda: service.connected, 10), "the snapshot publisher did not connect"
    except BaseException:
        service.stop()
        raise
    return service


def api(service, path="/api/channels"):
    url = service.front.web.url.rstrip("/") + path
    with urllib.request.urlopen(url, timeout=HANG_GUARD_SECONDS) as response:
        return json.loads(response.read())


def test_real_collector_ingests_through_its_own_account(broker, tmp_path):
    config = collector_config(broker, tmp_path)
    assert config.broker.username == "collector" and config.broker.tls is not None
    service = start_collector(config)
    device = MqttClient(broker, "dev-a", client_id="dev-a", v5=False).connect()
    forger = MqttClient(broker, "dev-b", client_id="dev-b", v5=False).connect()
    snapshots = MqttClient(broker, "collector", client_id="snapshot-reader").connect()
    try:
        # One real report, and one that dev-b forges in dev-a's name (dropped by the ACL).
        forger.acked(forger.publish(f"ldp/v1/{FLEET}/dev-a/accel_x", report("dev-a", "accel_x", 7)))
        device.acked(device.publish(f"ldp/v1/{FLEET}/dev-a/accel_x", report("dev-a", "accel_x")))
        assert wait_until(lambda: service.ingestor.counters["messages"] >= 1, 20), \
            service.ingestor.counters
        time.sleep(0.5)
        assert service.ingestor.counters["messages"] == 1
        assert service.ingestor.counters["values"] == 3
        assert sum(service.ingestor.rejects.values()) == 0
        # The API serves a snapshot computed every push period: it shows the report at
        # the next one.
        assert wait_until(lambda: api(service)["channels"].get("accel_x", {}).get("count")
                          == 3, 20), api(service)["channels"]
        # The snapshot publisher got through with the same account and TLS.
        snapshots.subscribe(f"ldp/v1/{FLEET}/_aggregates/#")
        expected = {f"ldp/v1/{FLEET}/_aggregates/accel_x"}
        assert wait_until(lambda: expected <= set(snapshots.topics()), 10)
    finally:
        for client in (device, forger, snapshots):
            client.close()
        service.stop()


def test_network_process_on_a_shared_subscription_through_its_own_account(broker, tmp_path):
    """What each of several ingresses runs (docs/guides/SCALE_OUT.md): the network process on
    the group's share of the reports, and every status directly (retained messages skip
    shared subscriptions), with the collector account and TLS.  Journaled here to SQLite;
    an ingress's journal is the JetStream stream."""
    from collector.broker.network import NetworkProcess
    from collector.broker.settings import network_settings
    from collector.storage.store import CollectorStore

    config = collector_config(broker, tmp_path, shared_group="collectors")
    settings = network_settings(config)
    assert settings.subscriptions == [f"$share/collectors/ldp/v1/{FLEET}/+/+",
                                      f"ldp/v1/{FLEET}/+/status"]
    device = MqttClient(broker, "dev-a", client_id="dev-a", v5=False).connect()
    status = f"ldp/v1/{FLEET}/dev-a/status"
    assert device.acked(device.publish(status, b'{"retained": true}', retain=True)) == 0
    store = CollectorStore(config.storage.path)
    network = NetworkProcess(settings)
    network.start()
    try:
        assert wait_until(lambda: store.network()["connected"], 30), \
            "the network process did not subscribe"
        topic = f"ldp/v1/{FLEET}/dev-a/accel_x"
        device.acked(device.publish(topic, report("dev-a", "accel_x")))

        def journaled() -> set[str]:
            rows, _ = store.read_journal(0)
            return {row[1] for row in rows}

        assert wait_until(lambda: {topic, status} <= journaled(), 20), journaled()
    finally:
        device.close()
        network.stop()
        store.close()


def test_real_agent_and_collector_through_their_own_accounts(broker, tmp_path):
    # The agent's [broker] table is the snippet the credentials script printed
    # for dev-a, with the broker's test port and the files' real paths.
    snippet = next(t for t in snippet_tables(broker.snippets) if t.get("agent_id") == "dev-a")
    assert snippet["broker"]["username"] == "dev-a" and "tls" in snippet["broker"]
    data = configs.agent_config(
        agent_id=snippet["agent_id"], fleet=snippet["fleet"],
        broker=account_table(broker, snippet, "dev-a"), state_dir=tmp_path / "agent-state",
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50, "duration": 2.0}],
        channels=[ACCEL_X], delivery={"confirm": "collector"})
    parse_config(data)  # valid before it is written
    config_path = write_toml(tmp_path / "agent.toml", data)

    service = start_collector(collector_config(broker, tmp_path))
    agent = AgentProcess(config_path, tmp_path / "agent.log").start()
    try:
        assert agent.wait(180) == 0, agent.output()
        # Everything the agent reported (its ledger) arrives in the collector.
        assert wait_until(lambda: service.ingestor.counters["values"] >= 100, 20), (
            service.ingestor.counters, agent.output()[-3000:])
        time.sleep(0.5)
        values = service.ingestor.counters["values"]
        assert values == 100  # 2 s at 50 Hz, every reading reported
        assert api(service)["channels"]["accel_x"]["count"] == values
        assert "dev-a" in service.ingestor.agents
        # The collector's confirmation reaches dev-a through the ACL: every report of
        # its ledger, durably counted.
        confirmations = MqttClient(broker, "dev-a", client_id="dev-a-confirm").connect()
        confirmations.subscribe(protocol.confirm_topic(FLEET, "dev-a"))
        messages = service.ingestor.agents["dev-a"].messages

        def confirmed() -> dict | None:  # the newest confirmation (one per checkpoint)
            return json.loads(confirmations.messages[-1][1])["channels"] \
                if confirmations.messages else None

        assert wait_until(lambda: confirmed() == {"accel_x": [[0, messages - 1]]}, 20), \
            (confirmed(), messages)
        confirmations.close()
        log = broker.log_text()
        assert "as dev-a (p2, c1, k30, u'dev-a')" in log  # MQTT 3.1.1, its own account
    finally:
        if agent.process.poll() is None:
            agent.kill()
        service.stop()


# -- range discovery through the accounts --------------------------------------------------------

def agent_config(broker: SecureBroker, tmp_path: Path, agent_id: str, **source) -> Path:
    snippet = next(t for t in snippet_tables(broker.snippets) if t.get("agent_id") == agent_id)
    data = configs.agent_config(
        agent_id=agent_id, fleet=snippet["fleet"], broker=account_table(broker, snippet, agent_id),
        state_dir=tmp_path / f"{agent_id}-state",
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50, **source}],
        channels=[{**ACCEL_X, "report_interval": 1.0}])
    parse_config(data)
    return write_toml(tmp_path / f"{agent_id}.toml", data)


@pytest.mark.parametrize("account", ["coordinator", "collector"])
def test_range_discovery_runs_through_the_accounts(broker, tmp_path, account):
    # A real coordinator (edge-collector's RangeCoordinator, as `discover-range`
    # runs it) with the coordinator's or the collector's account, and two real
    # agents with their own: announce, joins, rounds, answers and the retained
    # result must all pass the ACL.
    from collector.config import RangeDiscoveryConfig
    from collector.range.coordinator import RangeCoordinator, RunRequest, connect_client

    watcher = MqttClient(broker, "collector", client_id="watcher").connect()
    watcher.subscribe(f"ldp/v1/{FLEET}/+/status")
    agents = [AgentProcess(agent_config(broker, tmp_path, name), tmp_path / f"{name}.log").start()
              for name in ("dev-a", "dev-b")]
    coordinator_client = None
    try:
        assert wait_until(lambda: {f"ldp/v1/{FLEET}/dev-a/status", f"ldp/v1/{FLEET}/dev-b/status"}
                          <= set(watcher.topics()), 60), [a.output()[-2000:] for a in agents]
        time.sleep(1.0)  # a few batches of readings for the window
        snippet = next(t for t in snippet_tables(broker.snippets)
                       if t.get("broker", {}).get("username") == "collector")
        config = parse_collector_config({
            "fleet": FLEET,
            "broker": {"host": broker.host, "port": broker.port, "username": account,
                       "password_file": str(broker.secrets_dir / f"{account}.password"),
                       "tls": {"ca": str(broker.certs["ca"])},
                       "client_id": snippet["broker"]["client_id"]},
        })
        # Two agents can answer one informative round at eps 2 (at eps 1, or in more
        # rounds, none could: the coordinator would not ask).  What the answers make
        # of the minimum does not matter here, only that every message got through.
        settings = RangeDiscoveryConfig(min_participants=2, strategy="sequential", epsilon=2.0,
                                        rounds=1, join_timeout_seconds=15,
                                        round_timeout_seconds=15)
        coordinator_client = connect_client(config, f"range-{account}")
        result = RangeCoordinator(coordinator_client, fleet=FLEET, settings=settings).run(
            RunRequest("accel_x", "min", -2.0, 2.0), expected_agents=2)
        assert result["status"] in ("done", "insufficient"), result
        assert result["participants"] == 2 and len(result["history"]) == 1, result
        assert result["history"][0]["answers"] == 2, result
        assert not result["ignored_replies"], result["ignored_replies"]
        # Devices read the retained result, as the agents' domain = "auto" needs.
        late = MqttClient(broker, "dev-a", client_id="dev-a-reader").connect()
        late.subscribe(f"ldp/v1/{FLEET}/_range/result/+/+")
        assert wait_until(lambda: late.messages, 5)
        assert json.loads(late.messages[0][1])["run"] == result["run"]
        late.close()
    finally:
        if coordinator_client is not None:
            coordinator_client.disconnect()
            coordinator_client.loop_stop()
        for agent in agents:
            if agent.process.poll() is None:
                agent.terminate(90)
        watcher.close()
