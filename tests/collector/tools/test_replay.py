"""Offline replay and journal export (collector/tools/replay.py; ``edge-collector replay`` and
``export``): a recording goes through the live collector's checks, de-duplication and
estimators, and the export of a collector's journal replays to the collector's own
``GET /api/channels`` document."""

from __future__ import annotations

import base64
import collections
import io
import json
import sqlite3
import subprocess
import time
import tracemalloc
import zlib

import numpy as np
import pytest

from collector.aggregation.ingest import Ingestor
from collector.aggregation.limits import ingest_limits
from collector.api.documents import Views
from collector.config import load_collector_config, parse_collector_config
from collector.estimation.jsonsafe import json_safe
from collector.service import CollectorService
from collector.tools.export import export_line
from collector.tools.replay import (
    MAX_LINE_BYTES,
    ReplayError,
    bounded_lines,
    replay_lines,
)
from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM
from tests.support import (
    REPO,
    AgentProcess,
    CollectorProcess,
    MqttClient,
    child_env,
    python_module,
    run_module,
    wait_for_api,
    write_agent_config,
    write_toml,
)
from tests.support.streams import Publisher, comparable

FLEET = "demo"
LINEAR = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
CIRCULAR = CircularOGPM(epsilon=1.0)
T0 = 1_700_000_000.0  # November 2023: far behind any live collector's clock


# -- recordings -------------------------------------------------------------------------------

def report(agent: str = "w1", channel: str = "x", seq: int = 0, *, fleet: str = FLEET,
           t: float = T0, mechanism=LINEAR, **changes) -> tuple[str, bytes]:
    """A report of 10 perturbed values (the same for the same agent, channel and seq);
    ``changes`` replace fields of the message (a hostile sender)."""
    kind = "circular" if isinstance(mechanism, CircularOGPM) else "linear"
    rng = np.random.default_rng(zlib.crc32(f"{agent}/{channel}/{seq}".encode()))
    truth = rng.vonmises(0.5, 2.0, 10) if kind == "circular" else rng.uniform(-1.5, 1.5, 10)
    payload = protocol.report(agent=agent, channel=channel, kind=kind, seq=seq, t=t + seq,
                              dt=1.0, mechanism=mechanism.describe(),
                              codes=mechanism.perturb_codes(truth, rng).tolist())
    if changes:
        payload = json.dumps({**json.loads(payload), **changes}).encode()
    return protocol.data_topic(fleet, agent, channel), payload


def stream(agents=("w1", "w2", "w3"), seqs=range(8), t: float = T0) \
        -> list[tuple[str, bytes, float]]:
    """(topic, payload, received) of a linear and a circular channel of every agent."""
    return [(*report(agent, channel, seq, t=t, mechanism=mechanism), t + seq + 1.0)
            for seq in seqs for agent in agents
            for channel, mechanism in (("x", LINEAR), ("yaw", CIRCULAR))]


def line(topic, payload: bytes, received: float | None = None) -> str:
    entry = {"topic": topic, "payload": json.loads(payload)}
    if received is not None:
        entry["received"] = received
    return json.dumps(entry)


def lines_of(messages) -> list[str]:
    return [line(*message) for message in messages]


def without_rejects(document: dict) -> dict:
    """The document but its counts of refused messages: what a refused line must not
    change."""
    return {**document,
            "ingest": {k: v for k, v in document["ingest"].items() if k != "rejects"},
            "agents": {name: {k: v for k, v in agent.items() if k != "rejects"}
                       for name, agent in document["agents"].items()}}


def same_aggregates(live: dict, replayed: dict, *, same_windows: bool = True) -> None:
    """Two /api/channels documents agree on everything but what depends on the clock
    or the broker connection of the collector showing them (``t``, ``broker``, who is
    online), and on the float sums of angles, which depend on how messages were grouped
    (``streams.comparable``); and on each channel's latest ``window`` (and
    ``fleet_window``) and ``resolutions`` (the finest is the window length) unless
    ``same_windows`` (both made with the same window length)."""
    def aggregates(document: dict) -> dict:
        document = {k: v for k, v in document.items()
                    if k not in ("t", "broker", "agents_online")}
        document["agents"] = {name: {k: v for k, v in agent.items() if k != "online"}
                              for name, agent in document["agents"].items()}
        document["channels"] = {name: comparable(channel)
                                for name, channel in document["channels"].items()}
        if not same_windows:
            for channel in document["channels"].values():
                channel.pop("window", None)
                channel.pop("fleet_window", None)
                channel.pop("resolutions", None)
        return document

    assert aggregates(replayed) == aggregates(live)


# -- the library -------------------------------------------------------------------------------

def test_the_document_is_the_one_the_live_collector_serves():
    messages = stream()
    result = replay_lines(lines_of(messages))
    ingestor = Ingestor.from_settings(FLEET, result.settings)  # the defaults: 1m, 1h, 1d
    for topic, payload, received in messages:
        assert ingestor.ingest(topic, payload, received) == "accepted"
    t = max(received for _, _, received in messages)
    live = json_safe(Views(lambda: ingestor, clock=lambda: t).channels_json())
    same_aggregates(live, result.channels)
    assert result.channels["t"] == live["t"] == t  # as of the last message received ...
    assert result.channels["agents"] == live["agents"]  # ... so who is online too
    assert result.channels["broker"] == {"connected": None, "since": None}  # none offline
    assert result.counts == {"accepted": len(messages)} and result.lines == len(messages)
    assert result.fleet == FLEET and result.settings.bins == 50  # the defaults
    assert result.channels["channels"]["x"]["count"] == 3 * 8 * 10


def test_hostile_lines_are_counted_by_reason_and_change_nothing_else():
    messages = stream()
    clean = replay_lines(lines_of(messages))
    topic = protocol.data_topic(FLEET, "w1", "x")
    good = json.loads(report(seq=99)[1])
    hostile = [
        ("not json at all", "line:not_json"),
        (b'{"topic": "\xff\xfe", "payload": {}}', "line:not_json"),  # not UTF-8
        ('{"topic": "ldp/v1/demo/w1/x", "payload": {"v": 1', "line:not_json"),  # cut off
        ("[1, 2, 3]", "line:not_an_object"),
        (json.dumps({"payload": good}), "line:no_topic"),
        (json.dumps({"topic": topic}), "line:no_payload"),
        (json.dumps({"topic": 5, "payload": good}), "line:wrong_type"),
        (json.dumps({"topic": topic, "payload": [good]}), "line:wrong_type"),
        (json.dumps({"topic": topic, "payload": json.dumps(good)}), "line:wrong_type"),
        (json.dumps({"topic": topic, "payload": good, "received": "yesterday"}),
         "line:wrong_type"),
        (json.dumps({"topic": topic, "payload": good, "payload_base64": ""}),
         "line:two_payloads"),
        (json.dumps({"topic": topic, "payload_base64": "not base64!"}), "line:bad_base64"),
        ("x" * (MAX_LINE_BYTES + 1), "line:too_long"),
        (json.dumps({"topic": topic, "payload": {**good, "pad": "p" * MAX_LINE_BYTES}}),
         "line:too_long"),
        ("   ", "blank"),
        # well-formed lines whose message the ingestor refuses, as a live collector does
        (line(*report(seq=100, codes=[70000])), "rejected:bad_code"),
        (line(topic, report(agent="w2", seq=101)[1]), "rejected:spoofed"),
        (line(*report(seq=102, v=2)), "rejected:version"),
        (json.dumps({"topic": topic, "payload_base64": base64.b64encode(b"{junk").decode()}),
         "rejected:json"),
        (json.dumps({"topic": topic, "payload": {"pad": "y" * protocol.MAX_REPORT_BYTES}}),
         "rejected:oversized"),
        (json.dumps({"topic": "sensors/raw", "payload": good}), "ignored"),  # no fleet's
    ]
    clean_lines = lines_of(messages)
    mixed = clean_lines[:1]  # a clean line first, so that both replays group alike
    for i, (text, _) in enumerate(hostile):
        mixed += [text, *clean_lines[1 + i:2 + i]]
    mixed += clean_lines[1 + len(hostile):]
    result = replay_lines(mixed)
    expected = collections.Counter(outcome for _, outcome in hostile)
    assert result.counts == expected + collections.Counter(accepted=len(messages))
    assert result.lines == len(messages) + len(hostile)
    assert without_rejects(result.channels) == without_rejects(clean.channels)
    assert result.channels["ingest"]["rejects"] == {"bad_code": 1, "spoofed": 1, "version": 1,
                                                   "json": 1, "oversized": 1}
    assert result.rejected["line:wrong_type"] == 4 and result.rejected["spoofed"] == 1
    summary = result.summary()
    assert f"replayed {len(mixed):,} lines of fleet demo" in summary
    assert f"{len(messages):,} accepted" in summary and "0 duplicates" in summary
    assert "line:not_json 3, first on line 2" in summary and "bad_code 1" in summary


def test_lines_are_read_with_a_bounded_readline():
    data = b'{"a": 1}\n' + b"y" * 100 + b"\n" + b"z" * 20 + b"\n" + b"q" * 50
    assert list(bounded_lines(io.BytesIO(data), limit=20)) == [
        b'{"a": 1}\n', b"y" * 21, b"z" * 20 + b"\n", b"q" * 21]


class _EndlessLine(io.RawIOBase):
    """A file whose first line is ``size`` bytes long, made up as it is read."""

    def __init__(self, size: int, after: bytes):
        self.left, self.after = size, after

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.left > 0:
            n = min(len(buffer), self.left)
            buffer[:n] = b"y" * n
            self.left -= n
            if self.left == 0:
                buffer[n - 1:n] = b"\n"
            return n
        n = min(len(buffer), len(self.after))
        buffer[:n], self.after = self.after[:n], self.after[n:]
        return n


def test_a_line_of_many_megabytes_costs_no_more_memory_than_the_bound():
    topic, payload, received = stream(seqs=range(1))[0]
    stream_ = io.BufferedReader(_EndlessLine(40 * MAX_LINE_BYTES,
                                             (line(topic, payload, received) + "\n").encode()))
    tracemalloc.start()
    try:
        result = replay_lines(bounded_lines(stream_))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.counts == {"line:too_long": 1, "accepted": 1}
    assert peak < 4 * MAX_LINE_BYTES  # the line is 40 times that


def test_duplicates_are_dropped_as_a_live_collector_drops_them():
    messages = stream()
    once = replay_lines(lines_of(messages))
    again = replay_lines(lines_of(messages) + lines_of(messages[::-3]))
    assert again.counts == {"accepted": len(messages), "duplicate": len(messages[::-3])}
    assert again.channels["channels"] == once.channels["channels"]
    assert again.channels["ingest"]["duplicates"] == len(messages[::-3])
    assert "duplicates" in again.summary()


def test_a_recording_mixing_fleets_needs_a_configuration_naming_one():
    messages = stream()
    mixed = lines_of(messages) + [line(*report(fleet="other"))] + lines_of(messages[:2])
    with pytest.raises(ReplayError, match="fleet 'other', earlier lines of fleet 'demo'"):
        replay_lines(mixed)
    demo = replay_lines(mixed, parse_collector_config({"fleet": "demo"}))
    assert demo.counts == {"accepted": len(messages), "duplicate": 2, "ignored": 1}
    other = replay_lines(mixed, parse_collector_config({"fleet": "other"}))
    assert other.counts == {"accepted": 1, "ignored": len(messages) + 2}
    assert list(other.channels["channels"]) == ["x"] and other.fleet == "other"
    # Topics of no fleet do not decide it; without any fleet, nothing can be replayed.
    assert replay_lines(['{"topic": "a/b", "payload": {}}'] + lines_of(messages)).fleet == "demo"
    with pytest.raises(ReplayError, match="no line is a message of a fleet"):
        replay_lines(["", '{"topic": "a/b", "payload": {}}'])
    assert replay_lines([], parse_collector_config({"fleet": "demo"})).channels["channels"] == {}


def test_reports_dated_long_ago_or_ahead_are_replayed_though_a_live_collector_refuses_them():
    config = parse_collector_config({"fleet": FLEET})
    now = time.time()
    old = stream(seqs=range(3))  # dated November 2023
    ahead = [(*report("w9", seq=seq, t=now + 86400), now) for seq in range(3)]
    live = Ingestor.from_settings(FLEET, config.aggregate_settings, ingest_limits(config))
    assert [live.ingest(topic, payload, now) for topic, payload, _ in old + ahead] == \
        ["rejected:stale"] * len(old) + ["rejected:future"] * len(ahead)
    for recording in (lines_of(old + ahead), [line(t, p) for t, p, _ in old + ahead]):
        assert replay_lines(recording, config).counts == {"accepted": len(old + ahead)}


def test_more_channels_series_and_agents_than_the_live_limits_are_all_kept():
    config = parse_collector_config({"fleet": FLEET, "limits": {
        "agents": 2, "channels": 4, "series_per_channel": 1}})
    now = time.time()
    messages = [(*report(f"a{i % 3}", f"c{i}", t=now - 60), now) for i in range(10)]
    messages.append((*report("a0", "c0", seq=1, t=now - 60,
                             mechanism=ClassicalOGPM(epsilon=2.0, low=-2.0, high=2.0)), now))
    live = Ingestor.from_settings(FLEET, config.aggregate_settings, ingest_limits(config))
    refused = collections.Counter(live.ingest(*message) for message in messages)
    assert {"rejected:limit_agents", "rejected:limit_channels", "rejected:limit_series"} \
        <= set(refused)
    result = replay_lines(lines_of(messages), config)
    assert result.counts == {"accepted": len(messages)}
    channels = result.channels["channels"]
    assert sorted(channels) == sorted(f"c{i}" for i in range(10))
    assert len(result.channels["agents"]) == 3
    assert channels["c0"]["mechanism"]["epsilon"] == 2.0  # the newest series ...
    assert channels["c0"]["other_series"][0]["count"] == 10  # ... and the earlier one


def test_a_configuration_sets_the_aggregates_for_a_new_look_at_a_recording():
    config = parse_collector_config({"fleet": FLEET, "aggregates": {
        "histogram_bins": 200, "window_seconds": 2}})
    result = replay_lines(lines_of(stream()), config)
    x = result.channels["channels"]["x"]
    assert len(x["histogram"]["edges"]) == 201 and result.settings.window_seconds == 2
    default = replay_lines(lines_of(stream()))
    assert len(default.channels["channels"]["x"]["histogram"]["edges"]) == 51
    assert x["count"] == default.channels["channels"]["x"]["count"]


def test_a_registry_in_the_configuration_applies(tmp_path):
    (tmp_path / "agents.txt").write_text("w1\n")
    config = parse_collector_config({"fleet": FLEET, "registry": {
        "agents": "registered", "file": str(tmp_path / "agents.txt")}})
    result = replay_lines(lines_of(stream()), config)
    assert result.counts == {"accepted": 2 * 8, "rejected:unknown_agent": 2 * 2 * 8}


def test_export_lines_keep_every_payload_byte_for_byte():
    topic = protocol.data_topic(FLEET, "w1", "x")
    payloads = [report()[1], b'{"a": 1, "b": [1, 2]}', b"{junk", b"", b"\x00\xff binary",
                b' {"a": 1}', b'{"a":\n1}', b'{"a": "\xff"}', b"[1, 2]", b'"text"']
    for payload in payloads:
        exported = export_line(topic, payload, 12.5)
        assert exported.endswith(b"\n") and exported.count(b"\n") == 1
        entry = json.loads(exported)
        assert entry["topic"] == topic and entry["received"] == 12.5
        if "payload" in entry:  # a JSON object as it stands: verbatim in the line
            assert payload in exported and entry["payload"] == json.loads(payload)
        else:
            assert base64.b64decode(entry["payload_base64"]) == payload
    assert "payload" in json.loads(export_line(topic, payloads[0]))  # a report: readable
    assert export_line(topic, b"x" * (MAX_LINE_BYTES * 3 // 4 + 10)) is None  # too long


# -- a store written by the collector, exported and replayed by the command line -------------------

def collector_toml(tmp_path, **tables):
    return write_toml(tmp_path / "collector.toml", {
        "fleet": FLEET, "storage": {"path": str(tmp_path / "state.sqlite"),
                                    "checkpoint_seconds": 3600},
        "aggregates": {"histogram_bins": 20, "window_seconds": 5}, **tables})


def export(config, out) -> str:
    done = run_module("collector", "export", "--config", config, "--out", out)
    assert done.returncode == 0, done.stderr
    return done.stderr


def replay(recording, *options) -> tuple[dict, str]:
    done = run_module("collector", "replay", recording, *options)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_export_of_the_journal_the_collector_wrote_replays_to_its_document(tmp_path):
    config_path = collector_toml(tmp_path)
    service = CollectorService(load_collector_config(config_path), web=False)
    now = time.time()
    messages = stream(t=now - 100) + [
        (protocol.data_topic(FLEET, "w1", "x"), b"{junk", now),
        (protocol.data_topic(FLEET, "w1", "x"), b"x" * (protocol.MAX_REPORT_BYTES + 10), now),
        (protocol.data_topic(FLEET, "w1", "x"), report(seq=50, t=now, codes=[-4])[1], now),
        (protocol.status_topic(FLEET, "w2"), protocol.status(agent="w2", state="online",
                                                             t=now), now),
        (protocol.status_topic(FLEET, "w3"), b"", now),  # a cleared retained status
        (protocol.status_topic(FLEET, "w4"), b"not a status", now)]
    messages += messages[:5]  # redelivered
    try:
        for topic, payload, received in messages:  # as the network child journals
            service.store.append(topic, payload, received)
        service.store.commit()
        while service.catch_up():  # as the aggregation loop applies the journal
            pass
        live = json_safe(service.front.views.channels_json())
        assert live["ingest"]["rejects"] == {"json": 1, "oversized": 1, "bad_code": 1,
                                             "status": 1}
        assert live["ingest"]["duplicates"] == 5

        summary = export(config_path, tmp_path / "all.jsonl")
        assert f"exported {len(messages)} messages" in summary
        assert "4 of them not JSON objects" in summary and "no checkpoint yet" in summary
        replayed, summary = replay(tmp_path / "all.jsonl", "--config", config_path)
        same_aggregates(live, replayed)
        assert replayed["agents"]["w2"]["online"] is True  # its status says so
        assert f"replayed {len(messages)} lines" in summary

        # A checkpoint deletes what it includes from the journal: an export then has only
        # what came after it, and says so.
        assert service.checkpoint()
        later = stream(agents=("w5",), seqs=range(3), t=now - 50)
        for topic, payload, received in later:
            service.store.append(topic, payload, received)
        service.store.commit()
        summary = export(config_path, tmp_path / "later.jsonl")
        assert f"exported {len(later)} messages" in summary
        assert f"the {len(messages)} messages journaled before it are in its aggregates" \
            in summary
        replayed, _ = replay(tmp_path / "later.jsonl", "--config", config_path)
        assert replayed["ingest"]["messages"] == len(later)
        assert list(replayed["agents"]) == ["w5"]
    finally:
        service.store.close()


def test_a_collector_keeping_its_journal_exports_the_whole_stream(tmp_path):
    """[storage] keep_journal: checkpoints no longer delete what they include, so an
    export after checkpoints (and a restart) is still everything, and replays to the
    live document; the restarted collector does not apply any message twice."""
    config_path = write_toml(tmp_path / "collector.toml", {
        "fleet": FLEET, "storage": {"path": str(tmp_path / "state.sqlite"),
                                    "checkpoint_seconds": 3600, "keep_journal": True},
        "aggregates": {"histogram_bins": 20, "window_seconds": 5}})
    config = load_collector_config(config_path)
    now = time.time()
    first, later = stream(t=now - 100), stream(agents=("w5",), seqs=range(3), t=now - 50)
    service = CollectorService(config, web=False)
    try:
        for batch in (first, later):
            for topic, payload, received in batch:
                service.store.append(topic, payload, received)
            service.store.commit()
            while service.catch_up():
                pass
            assert service.checkpoint()
    finally:
        service.store.close()
    restarted = CollectorService(config, web=False)  # loads the checkpoint
    try:
        while restarted.catch_up():
            pass
        live = json_safe(restarted.front.views.channels_json())
    finally:
        restarted.store.close()
    assert live["ingest"]["messages"] == len(first) + len(later)  # nothing applied twice
    summary = export(config_path, tmp_path / "all.jsonl")
    assert f"exported {len(first) + len(later)} messages" in summary
    assert "the journal holds every message received" in summary
    replayed, _ = replay(tmp_path / "all.jsonl", "--config", config_path)
    same_aggregates(live, replayed)


def test_replay_exit_codes_and_messages(tmp_path):
    recording = tmp_path / "recording.jsonl"
    recording.write_text("\n".join(lines_of(stream()) + ["not json"]) + "\n")
    done = run_module("collector", "replay", recording, "--out", tmp_path / "agg.json")
    assert done.returncode == 0 and done.stdout == "", done.stderr
    document = json.loads((tmp_path / "agg.json").read_text())
    assert document["channels"]["x"]["count"] == 240 and document["fleet"] == FLEET
    assert "48 accepted" in done.stderr
    assert "1 rejected (by reason: line:not_json 1, first on line 49)" in done.stderr

    done = run_module("collector", "replay", tmp_path / "missing.jsonl")
    assert done.returncode == 2 and "cannot read" in done.stderr and done.stdout == ""
    done = run_module("collector", "replay", tmp_path)  # a directory
    assert done.returncode == 2
    done = run_module("collector", "replay")  # no FILE
    assert done.returncode == 2 and "Missing argument" in done.stderr
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(lines_of(stream()) + [line(*report(fleet="other"))]))
    done = run_module("collector", "replay", mixed)
    assert done.returncode == 2 and done.stdout == ""
    assert "line 49 is a message of fleet 'other'" in done.stderr

    bad = write_toml(tmp_path / "bad.toml", {"fleet": FLEET, "aggregates": {
        "histogram_bins": 2}})
    done = run_module("collector", "replay", recording, "--config", bad)
    assert done.returncode == 78 and "histogram_bins" in done.stderr
    done = run_module("collector", "replay", recording, "--config", tmp_path / "none.toml")
    assert done.returncode == 78
    done = run_module("collector", "export", "--config", bad)
    assert done.returncode == 78
    done = run_module("collector", "export", "--config", collector_toml(tmp_path))
    assert done.returncode == 2 and "state.sqlite: no such file" in done.stderr
    (tmp_path / "state.sqlite").write_bytes(b"not a database")
    done = run_module("collector", "export", "--config", collector_toml(tmp_path))
    assert done.returncode == 2 and "cannot read the journal" in done.stderr

    other = write_toml(tmp_path / "other.toml", {"fleet": "other", "aggregates": {
        "histogram_bins": 10}})
    document, summary = replay(mixed, "--config", other)
    assert list(document["channels"]) == ["x"] and "48 ignored" in summary
    assert len(document["channels"]["x"]["histogram"]["edges"]) == 11


def test_replay_reads_standard_input():
    done = subprocess.run(python_module("collector", "replay", "-"),
                          input="\n".join(lines_of(stream())).encode(), capture_output=True,
                          cwd=REPO, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["channels"]["x"]["count"] == 240


# -- end to end: a live collector, its export and the replay ---------------------------------------

def ledger_values(state_dir) -> int:
    """The readings an agent reported (its budget ledger counts each)."""
    db = sqlite3.connect(f"file:{state_dir}/state.sqlite?mode=ro", uri=True)
    try:
        return db.execute("SELECT COALESCE(SUM(reports), 0) FROM spending").fetchone()[0]
    finally:
        db.close()


def test_export_and_replay_of_a_live_collector_give_its_document(tmp_path, mosquitto):
    """A collector runs against Mosquitto with an agent and a publisher of copies, replays
    and hostile messages; its journal exported while it runs and replayed offline gives
    the document it serves."""
    collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=3600).start()
    rows = 1500
    rng = np.random.default_rng(5)
    csv = tmp_path / "readings.csv"
    csv.write_text("x,activity\n" + "".join(
        f"{x:.5f},{a}\n" for x, a in zip(rng.normal(0.3, 0.5, rows),
                                          rng.choice(["rest", "run", "walk"], rows))))
    agent = AgentProcess(write_agent_config(
        tmp_path / "agent.toml", agent_id="wearable", broker=mosquitto,
        state_dir=tmp_path / "agent-state",
        sources=[{"name": "rec", "type": "csv", "path": str(csv), "pace": "fast",
                  "columns": {"x": "x", "activity": "activity"}}],
        channels=[{"name": "x", "source": "rec", "field": "x", "kind": "linear",
                   "epsilon": 2.0, "domain": [-2.0, 2.0]},
                  {"name": "activity", "source": "rec", "field": "activity",
                   "kind": "categorical", "categories": ["rest", "run", "walk"],
                   "epsilon": 2.0}]), tmp_path / "agent.log").start()
    publisher = Publisher(mosquitto, np.random.default_rng(6))
    hostile = MqttClient(mosquitto, v5=False).connect()
    try:
        publisher.seqs(range(12))
        publisher.replay(40)
        topic = protocol.data_topic(FLEET, "d0", "x")
        for payload in (b"{not json", b"x" * (protocol.MAX_REPORT_BYTES + 1000),
                        report("d0", seq=500, codes=[70000])[1]):
            hostile.acked(hostile.publish(topic, payload))
        hostile.acked(hostile.publish(protocol.status_topic(FLEET, "d2"), b""))
        assert agent.wait(120) == 0, agent.output()
        values = sum(publisher.values.values()) + ledger_values(tmp_path / "agent-state")

        def caught_up() -> bool:
            document = collector.api()
            return (document["ingest"]["values"] == values
                    and document["ingest"]["duplicates"] == publisher.copies
                    and sum(document["ingest"]["rejects"].values()) == 3
                    and document["agents"].get("wearable", {}).get("online") is False)

        assert wait_for_api(caught_up, 60), collector.api()["ingest"]
        # Counts first, estimates at the next pushes: compare once they caught up.
        assert wait_for_api(lambda: all(c["state"] == "ready"
                                        for c in collector.api()["channels"].values()))
        live = collector.api()
        summary = export(collector.config, tmp_path / "journal.jsonl")  # while it runs
        assert "no checkpoint yet" in summary
        replayed, summary = replay(tmp_path / "journal.jsonl", "--config", collector.config)
        same_aggregates(live, replayed)
        inferred, _ = replay(tmp_path / "journal.jsonl")  # the fleet from the topics, and
        same_aggregates(live, inferred, same_windows=False)  # the default aggregates: alike
        # but for the windows
        assert replayed["agents"]["wearable"]["online"] is False  # from statuses
        assert replayed["agents"]["d2"]["online"] is False == live["agents"]["d2"]["online"]
        assert replayed["ingest"]["rejects"] == {"json": 1, "oversized": 1, "bad_code": 1}
        assert set(replayed["channels"]) == {"x", "xu", "yaw", "activity"}
        assert f"{live['ingest']['messages']:,} accepted, {publisher.copies:,} duplicates" \
            in summary
        assert collector.running() and collector.api()["ingest"] == live["ingest"]
    finally:
        hostile.close()
        publisher.client.close()
    assert collector.terminate() == 0
