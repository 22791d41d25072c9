"""Bounded state: what a sender can make an ingestor hold, and what it may refuse.

Every limit refuses with its own reason, changes nothing else, and is logged once;
the through-the-broker version of these is tests/collector/test_hostile.py."""

from __future__ import annotations

import logging
import pickle
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest

from collector.aggregation.ingest import IngestLimits, Ingestor
from collector.aggregation.limits import ingest_limits, load_registry
from collector.aggregation.series import LinearSeries
from collector.config import parse_collector_config
from collector.range.results import RangeResults
from edge_agent import protocol
from edge_agent.config import ConfigError
from edge_agent.mechanisms import ClassicalOGPM
from edge_agent.protocol import RangeResult
from tests.support import REPO, CollectorProcess, MqttClient, child_env, wait_for_api, write_toml
from tests.support.processes import python_module

FLEET = "demo"
NOW = 1_800_000_000.0
LINEAR = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)


def report(agent="w1", channel="ax", seq=0, t=NOW - 1.0, dt=1.0, mechanism=LINEAR,
           codes=(1, 2, 3)) -> tuple[str, bytes]:
    payload = protocol.report(agent=agent, channel=channel, kind="linear", seq=seq, t=t, dt=dt,
                              mechanism=mechanism.describe(), codes=list(codes))
    return protocol.data_topic(FLEET, agent, channel), payload


def status(agent: str, state="online") -> tuple[str, bytes]:
    return protocol.status_topic(FLEET, agent), protocol.status(agent=agent, state=state, t=NOW)


def state_of(ingestor: Ingestor) -> bytes:
    """Everything a message could change, except the reject counters."""
    return pickle.dumps((ingestor.series, ingestor.latest, ingestor.latest_at,
                         {key: (tracker.floor, tracker.skipped, tracker.runs)
                          for key, tracker in ingestor.trackers.items()},
                         {name: (a.messages, a.values, a.duplicates, a.online, a.status)
                          for name, a in ingestor.agents.items()}))


def test_sequence_numbers_are_bounded_in_the_type():
    ingestor = Ingestor(fleet=FLEET)
    assert ingestor.ingest(*report(seq=protocol.SEQ_LIMIT - 1), NOW) == "accepted"
    before = state_of(ingestor)
    for seq in (protocol.SEQ_LIMIT, 2**63, 2**64, -1):
        topic, payload = report()
        payload = payload.replace(b'"seq":0', b'"seq":%d' % seq)
        assert ingestor.ingest(topic, payload, NOW) == "rejected:schema"
    assert state_of(ingestor) == before


def test_reports_dated_ahead_of_the_clock_are_refused_and_windows_kept():
    """Issue 12, defect 7: 61 reports dated in the future replaced all 60 windows."""
    ingestor = Ingestor(fleet=FLEET, window_seconds=60, keep_windows=60,
                        limits=IngestLimits(future_seconds=300, max_age_seconds=86_400))
    for seq in range(60):
        assert ingestor.ingest(*report(seq=seq, t=NOW - 3600 + 60 * seq), NOW) == "accepted"
    series = next(iter(ingestor.series["ax"].values()))
    windows = sorted(series.windows)
    for seq in range(60, 121):
        topic, payload = report(seq=seq, t=NOW + 86_400 * (seq - 59))
        assert ingestor.ingest(topic, payload, NOW) == "rejected:future"
    assert ingestor.ingest(*report(seq=121, t=NOW + 270, dt=40), NOW) == "rejected:future"
    assert ingestor.ingest(*report(seq=122, t=NOW + 270, dt=40), NOW + 10) == "accepted"
    assert ingestor.ingest(*report(seq=123, t=NOW - 86_401), NOW) == "rejected:stale"
    assert ingestor.ingest(*report(seq=124, t=NOW - 86_399), NOW) == "accepted"
    assert sorted(series.windows)[:-1] == windows[1:]  # one new window, for seq 122
    assert ingestor.rejects == {"future": 62, "stale": 1}
    assert ingestor.agents["w1"].rejects == 63
    # Refused reports of a known channel are settled: a re-send is a duplicate, and the
    # agent's spool can let them go once confirmed.
    assert ingestor.ingest(*report(seq=70, t=NOW + 86_400), NOW) == "duplicate"


def test_a_channel_past_the_limit_is_refused_without_a_trace(caplog):
    ingestor = Ingestor(fleet=FLEET, limits=IngestLimits(channels=3))
    for i in range(3):
        assert ingestor.ingest(*report(channel=f"c{i}"), NOW) == "accepted"
    before = state_of(ingestor)
    with caplog.at_level(logging.WARNING, logger="collector.aggregation.ingest"):
        for i in range(3, 1000):
            assert ingestor.ingest(*report(channel=f"c{i}"), NOW) == "rejected:limit_channels"
    assert state_of(ingestor) == before and len(ingestor.trackers) == 3
    assert [r.getMessage() for r in caplog.records] == [
        "limit reached: 3 channels ([limits] channels); further ones are refused "
        "(reason limit_channels)"]
    assert ingestor.ingest(*report(channel="c1", seq=1), NOW) == "accepted"  # known: fine


def test_mechanism_variants_past_the_limit_are_refused():
    """Issue 12: 2,000 mechanism variants cost +528 MB."""
    ingestor = Ingestor(fleet=FLEET, limits=IngestLimits(series_per_channel=4))
    for seq in range(2000):
        mechanism = ClassicalOGPM(epsilon=1.0, low=-2.0 - seq, high=2.0)
        outcome = ingestor.ingest(*report(seq=seq, mechanism=mechanism), NOW)
        assert outcome == ("accepted" if seq < 4 else "rejected:limit_series")
    assert len(ingestor.series["ax"]) == 4
    assert ingestor.ingest(*report(seq=5000), NOW) == "accepted"  # a known series


def test_agents_and_status_only_agents_are_bounded():
    ingestor = Ingestor(fleet=FLEET, limits=IngestLimits(agents=10, statuses=3))
    for i in range(5):
        assert ingestor.ingest(*report(agent=f"a{i}"), NOW) == "accepted"
    outcomes = [ingestor.ingest(*status(f"s{i}"), NOW) for i in range(10)]
    assert outcomes == ["status"] * 3 + ["rejected:limit_statuses"] * 7
    assert ingestor.ingest(*status("a0", "offline"), NOW) == "status"  # a known agent
    assert ingestor.ingest(*report(agent="s0"), NOW) == "accepted"  # no longer status-only
    assert ingestor.ingest(*status("s3"), NOW) == "status"
    assert ingestor.ingest(*report(agent="a5"), NOW) == "accepted"  # status-only ones count
    assert len(ingestor.agents) == 10
    assert ingestor.ingest(*report(agent="a9"), NOW) == "rejected:limit_agents"
    assert ingestor.ingest(*status("s9"), NOW) == "rejected:limit_statuses"
    assert len(ingestor.agents) == 10
    # The count of status-only agents is derived again from a saved state.
    assert Ingestor.from_state(ingestor.to_state()).status_only == {"s1", "s2", "s3"}


def test_a_status_must_be_its_topics_agents():
    ingestor = Ingestor(fleet=FLEET)
    topic, _ = status("a1")
    _, payload = status("a2")
    assert ingestor.ingest(topic, payload, NOW) == "rejected:status"
    assert ingestor.agents == {}


def test_unregistered_agents_are_refused(tmp_path):
    registry = tmp_path / "agents.txt"
    registry.write_text("# study 7\nw1\n  w2   # spare\n\n")
    config = parse_collector_config({"fleet": FLEET, "registry": {
        "agents": "registered", "file": str(registry)}})
    limits = ingest_limits(config)
    assert limits.registry == {"w1", "w2"}
    assert limits.max_age_seconds == 86_400 + 300  # session expiry + future_seconds
    ingestor = Ingestor(fleet=FLEET, limits=limits)
    assert ingestor.ingest(*report(agent="w1"), NOW) == "accepted"
    assert ingestor.ingest(*report(agent="w3"), NOW) == "rejected:unknown_agent"
    assert ingestor.ingest(*status("w3"), NOW) == "rejected:unknown_agent"
    assert set(ingestor.agents) == {"w1"} and ingestor.rejects == {"unknown_agent": 2}
    # Removed from the registry (SIGHUP): refused from then on, counts kept.
    ingestor.limits = IngestLimits(registry=frozenset({"w2"}))
    assert ingestor.ingest(*report(agent="w1", seq=1), NOW) == "rejected:unknown_agent"
    assert ingestor.agents["w1"].messages == 1


@pytest.mark.parametrize("text,problem", [
    ("w1\n_w2\n", "line 2: '_w2' is not an agent id"),
    ("w1\na/b\n", "line 2: 'a/b' is not an agent id"),
    (b"\xff\xfe", "cannot be read"),
])
def test_a_bad_registry_file_names_its_problem(tmp_path, text, problem):
    path = tmp_path / "agents.txt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=problem):
        load_registry(path)
    with pytest.raises(ConfigError, match="no such file"):
        load_registry(tmp_path / "missing.txt")
    with pytest.raises(ConfigError, match="registry: file: required"):
        parse_collector_config({"fleet": FLEET, "registry": {"agents": "registered"}})


@pytest.mark.parametrize("command, status", [("check-config", 2), ("run", 78)])
def test_a_missing_registry_file_is_a_configuration_error_naming_the_key(tmp_path, command,
                                                                         status):
    """Not a traceback when the service starts (exit 78: systemd does not restart it)."""
    config = write_toml(tmp_path / "collector.toml", {
        "fleet": FLEET, "broker": {"host": "127.0.0.1", "port": 1},
        "storage": {"path": str(tmp_path / "collector.sqlite")},
        "registry": {"agents": "registered", "file": str(tmp_path / "agents.txt")}})
    argv = [command, config] if command == "check-config" else [command, "--config", config]
    done = subprocess.run(python_module("collector", *argv), capture_output=True, text=True,
                          env=child_env(), cwd=REPO, timeout=120)
    assert done.returncode == status
    assert f"registry.file: {tmp_path / 'agents.txt'}: no such file" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command, table, problem", [
    # Several ingresses share a subscription; a collector on it would see a share only.
    ("run", {"broker": {"host": "127.0.0.1", "port": 1, "shared_group": "g"}},
     "broker.shared_group: only ingresses share a subscription"),
    ("merge", {}, "scale_out: the merge view needs a [scale_out] table"),
])
def test_a_command_refuses_a_configuration_it_cannot_serve(tmp_path, command, table, problem):
    """Valid for another command (check-config accepts it), so found by the command
    itself: exit 78 with the key named, never a traceback."""
    config = write_toml(tmp_path / "collector.toml", {
        "fleet": FLEET, "storage": {"path": str(tmp_path / "collector.sqlite")}, **table})
    checked = subprocess.run(python_module("collector", "check-config", config),
                             capture_output=True, text=True, env=child_env(), cwd=REPO,
                             timeout=120)
    assert checked.returncode == 0, checked.stderr
    done = subprocess.run(python_module("collector", command, "--config", config),
                          capture_output=True, text=True, env=child_env(), cwd=REPO,
                          timeout=120)
    assert done.returncode == 78
    assert f"{config}: invalid configuration:\n  {problem}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "collector.sqlite").exists()  # refused before anything started


@pytest.mark.parametrize("command", ["run", "ingress", "member", "merge"])
def test_paths_the_service_cannot_use_are_named_at_start_up(tmp_path, command):
    """An unwritable [storage] path (run only), results store's directory (run and merge,
    which record results) and unreadable password or CA files: one line per key, exit 78,
    no traceback, nothing started."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = write_toml(tmp_path / "collector.toml", {
        "fleet": FLEET,
        "broker": {"host": "127.0.0.1", "port": 1, "username": "c",
                   "password_file": str(tmp_path / "no-password")},
        "storage": {"path": str(blocker / "state.sqlite")},
        "scale_out": {"servers": ["tls://127.0.0.1:1"], "tls_ca": str(tmp_path / "no-ca")}})
    done = subprocess.run(python_module("collector", command, "--config", config),
                          capture_output=True, text=True, env=child_env(), cwd=REPO,
                          timeout=120)
    assert done.returncode == 78 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith(f"{config}: invalid configuration: ") for line in lines)
    keys = [line.split(": ")[2] for line in lines]
    assert keys == ["broker.password_file", "scale_out.tls_ca"] + \
        {"run": ["storage.path", "results.path"], "merge": ["results.path"]}.get(command, [])
    assert f"cannot read {tmp_path / 'no-password'} (No such file or directory)" in lines[0]


def test_one_message_that_fails_does_not_stop_the_batch(monkeypatch):
    """Issue 12, defect 1: an exception inside a batch left its position behind, and
    the whole batch was applied again at every retry."""
    ingestor = Ingestor(fleet=FLEET)
    update = LinearSeries.values_in  # the reports below are linear

    def fail_for_w2(self, codes):
        if len(codes) == 2:
            raise MemoryError("injected")
        return update(self, codes)

    monkeypatch.setattr(LinearSeries, "values_in", fail_for_w2)
    with ingestor.batch():
        outcomes = [ingestor.ingest(*report(agent=agent, codes=codes), NOW)
                    for agent, codes in (("w1", (1, 2, 3)), ("w2", (1, 2)), ("w3", (4,)))]
    assert outcomes == ["accepted", "rejected:internal", "accepted"]
    assert ingestor.counters["values"] == 4 and ingestor.counters["messages"] == 2
    assert Ingestor.from_state(ingestor.to_state()).counters == ingestor.counters


def result(channel="ax", side="max", coordinator="range-coordinator") -> bytes:
    return protocol.encode(RangeResult(v=1, run="r1", coordinator=coordinator, channel=channel,
                                       side=side, domain=(-1.0, 1.0), started_at=1.0,
                                       status="done", estimate=0.5))


def test_only_the_configured_coordinators_range_results_are_shown():
    results = RangeResults(FLEET, coordinator="range-coordinator", limit=2)

    def deliver(topic_channel, topic_side, payload):
        results.on_message(None, None, SimpleNamespace(
            topic=protocol.range_result_topic(FLEET, topic_channel, topic_side), payload=payload))

    deliver("ax", "max", result())
    deliver("ax", "min", result(side="min", coordinator="mallory"))
    deliver("ay", "min", result(channel="ax"))
    deliver("ay", "max", b"{not json")
    deliver("ay", "max", result("ay"))
    deliver("az", "max", result("az"))  # a third channel: past the limit
    assert sorted(results.get()) == ["ax", "ay"] and list(results.get()["ax"]) == ["max"]
    assert results.ignored == {"coordinator": 1, "topic": 1, "json": 1,
                               "limit_range_results": 1}
    deliver("ay", "max", b"")  # a cleared result
    deliver("az", "max", result("az"))
    assert sorted(results.get()) == ["ax", "az"]


def test_sighup_reloads_the_registry_of_a_running_collector(tmp_path, mosquitto):
    """Through the broker: an agent refused, then added to the file, then accepted; a
    broken file keeps the registry in force."""
    registry = tmp_path / "agents.txt"
    registry.write_text("w1\n")
    collector = CollectorProcess(tmp_path, mosquitto,
                                 registry={"agents": "registered", "file": str(registry)})
    collector.start()
    publisher = MqttClient(mosquitto, v5=False).connect()

    def send(agent: str, seq: int) -> None:
        publisher.acked(publisher.publish(*report(agent=agent, seq=seq, t=time.time())))

    send("w1", 0)
    send("w2", 0)
    assert wait_for_api(lambda: collector.api()["ingest"]["rejects"] == {"unknown_agent": 1}
                        and collector.api()["ingest"]["messages"] == 1, 20)
    registry.write_text("w1\nw2\n")
    collector.process.send_signal(signal.SIGHUP)
    assert wait_for_api(lambda: "registry reloaded" in collector.output(), 20)
    send("w2", 1)
    assert wait_for_api(lambda: collector.api()["ingest"]["messages"] == 2, 20)
    registry.write_text("w1\n_not an id\n")
    collector.process.send_signal(signal.SIGHUP)
    assert wait_for_api(lambda: "registry not reloaded" in collector.output(), 20)
    send("w2", 2)  # still registered
    assert wait_for_api(lambda: collector.api()["ingest"]["messages"] == 3, 20)
    publisher.close()
    assert collector.terminate() == 0
