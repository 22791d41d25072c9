"""The fleet simulator (``edge-agent fleet``): CSV striding, one transaction per batch,
and N virtual agents against a real Mosquitto with a real paho subscriber."""

from __future__ import annotations

import csv
import json
import signal
import sqlite3
import textwrap
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import edge_agent.agent as agent_module
from edge_agent.agent import AgentService
from edge_agent.config import ConfigError, CsvSourceConfig, parse_config
from edge_agent.fleet import check_fleet, fleet_service, virtual_agent_ids
from edge_agent.readings import Readings
from edge_agent.sources import CsvSource
from edge_agent.state import StateStore
from tests.edge_agent.test_e2e_agent import check_messages, run_cli
from tests.support import (
    AX_CHANNEL,
    REPO,
    FakeTransport,
    FleetProcess,
    Subscriber,
    agent_config,
    write_agent_config,
)
from tests.support.ports import HANG_GUARD_SECONDS

T0 = 1_700_000_000.0


# -- CSV striding ----------------------------------------------------------------------------

def write_rows(tmp_path: Path, n: int, *, name="rows.csv", timestamps=False) -> Path:
    """A CSV whose column x holds the data row's number (0-based)."""
    path = tmp_path / name
    header = "t,x\n" if timestamps else ",x\n"
    path.write_text(header + "".join(f"{1000 + 0.1 * i:.1f},{i}\n" if timestamps
                                     else f"{i},{i}\n" for i in range(n)))
    return path


def strided(path, offset, stride, **kw) -> CsvSource:
    kw.setdefault("columns", {"x": "x"})
    source = CsvSource(CsvSourceConfig(type="csv", name="rec", path=path, **kw),
                       offset=offset, stride=stride)
    source.start()
    return source


def drain(source, *, step=0.1, limit=10_000) -> Readings:
    parts, i = [], 0
    while not source.finished and i < limit:
        parts.append(source.poll(T0 + step * i))
        i += 1
    source.stop()
    return Readings.concat(parts)


@pytest.mark.parametrize("pace", ["fast", "fixed"])
def test_csv_stride_takes_rows_i_i_plus_n(tmp_path, pace):
    path = write_rows(tmp_path, 23)
    taken = []
    for i in range(5):
        source = strided(path, i, 5, pace=pace, rate_hz=20)
        data = drain(source)
        assert data.fields["x"].tolist() == list(range(i, 23, 5))
        assert source.error is None and source.rejected_rows == 0
        # Own rows are numbered 0, 1, ... at rate_hz: each virtual agent runs at rate_hz.
        np.testing.assert_allclose(data.times - T0, np.arange(len(data)) / 20, atol=1e-6)
        taken += data.fields["x"].tolist()
    assert sorted(taken) == list(range(23))  # a partition of the file


def test_csv_stride_with_loop_replays_the_same_rows_every_pass(tmp_path):
    path = write_rows(tmp_path, 7)
    for i, rows in enumerate([[0, 3, 6], [1, 4], [2, 5]]):
        source = strided(path, i, 3, pace="fixed", rate_hz=10, loop=True)
        data = Readings.concat([source.poll(T0), source.poll(T0 + 1.15)])  # rows 0..11 due
        assert data.fields["x"].tolist() == (rows * 12)[:12]
        np.testing.assert_allclose(data.times - T0, np.arange(12) / 10, atol=1e-6)
        assert not source.finished and source.error is None
        source.stop()


def test_csv_stride_recorded_pace_keeps_the_files_time_line(tmp_path):
    path = write_rows(tmp_path, 6, timestamps=True)  # t = 1000.0, 1000.1, ..., 1000.5
    for i in range(3):
        source = strided(path, i, 3, pace="recorded", timestamp_column="t", rate_hz=10,
                         loop=True)
        data = Readings.concat([source.poll(T0 + 0.05 * k) for k in range(40)])  # ~2 s
        x = data.fields["x"].tolist()
        assert x[:6] == [i, i + 3] * 3
        # Offsets relative to the file's first row, not the agent's; the next pass
        # starts 1/rate_hz after the file's last row (0.5 + 0.1), for every agent.
        np.testing.assert_allclose(data.times[:4] - T0,
                                   [0.1 * i, 0.1 * i + 0.3, 0.6 + 0.1 * i, 0.9 + 0.1 * i],
                                   atol=1e-6)
        source.stop()


def test_csv_stride_invalid_rows_counted_by_their_owner(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(textwrap.dedent("""\
        a,b
        0,0
        1
        2,2

        3,3,3
        4,4
        5,5
        """))  # data rows 1 and 3 have the wrong width; the blank line is not a row
    rows, rejected = {}, {}
    for i in range(2):
        source = strided(path, i, 2, pace="fast", columns={"a": "a"})
        rows[i] = drain(source).fields["a"].tolist()
        rejected[i] = source.rejected_rows
    assert rows == {0: [0, 2, 4], 1: [5]}
    assert rejected == {0: 0, 1: 2}


def test_strided_sources_together_read_what_one_source_reads(tmp_path):
    """N strided sources (each takes its records from the file parsed once) read together
    exactly what one source reading the whole file reads, over two passes of the recorded
    time line: the same rows at the same times, and the same refusals (wrong widths,
    rows without a time, a line the csv module cannot parse; blank lines are no rows)."""
    lines = ["t,x"]
    for i in range(40):
        if i % 7 == 3:
            lines.append(f"{1000 + 0.1 * i:.1f},{i},extra")  # wrong width
        elif i % 11 == 5:
            lines.append(f",{i}")  # no timestamp: cannot be placed in time
        elif i == 18:
            lines.append(f'{1000 + 0.1 * i:.1f},"{"x" * (csv.field_size_limit() + 1)}"')
        else:
            lines.append(f"{1000 + 0.1 * i:.1f},{i}")
        if i % 9 == 0:
            lines.append("")  # a blank line
    path = tmp_path / "mixed.csv"
    path.write_text("\n".join(lines) + "\n")

    def read(source, until: float) -> tuple[list[tuple[float, float]], int]:
        data = Readings.concat([source.poll(T0), source.poll(T0 + until)])
        source.stop()
        rows = [(round(t - T0, 6), x) for t, x in zip(data.times, data.fields["x"].tolist())]
        return rows, source.rejected_rows

    for loop, until in ((False, 10.0), (True, 7.95)):  # the file spans 3.9 s, the next
        # pass starts 0.1 s after its last row: two passes by 8 s
        options = dict(pace="recorded", timestamp_column="t", rate_hz=10, loop=loop)
        whole_rows, whole_rejected = read(strided(path, 0, 1, **options), until)
        parts = [read(strided(path, i, 4, **options), until) for i in range(4)]
        assert sorted(row for rows, _ in parts for row in rows) == sorted(whole_rows)
        if not loop:  # each read to the end of the file: every refusal counted once
            assert sum(rejected for _, rejected in parts) == whole_rejected == 10
        else:
            assert len(whole_rows) == 2 * len(read(strided(path, 0, 1, pace="recorded",
                                                           timestamp_column="t"), 10.0)[0])


def test_csv_stride_agent_without_rows(tmp_path):
    path = write_rows(tmp_path, 3)
    source = strided(path, 4, 5, pace="fast")
    assert len(drain(source)) == 0 and source.finished and source.error is None
    looping = strided(path, 4, 5, pace="fast", loop=True)
    assert looping.finished
    assert "no readable data rows among rows 4, 9, ..." in looping.error
    assert "the file has 3 data rows" in looping.error


def test_csv_stride_arguments_are_checked(tmp_path):
    config = CsvSourceConfig(type="csv", name="rec", path=tmp_path / "x.csv", columns={"x": "x"})
    with pytest.raises(ValueError, match="stride"):
        CsvSource(config, offset=0, stride=0)
    with pytest.raises(ValueError, match=r"offset: must be an integer in \[0, 2\], got 3"):
        CsvSource(config, offset=3, stride=3)


# -- the service: one transaction per batch, shared mechanisms -------------------------------

FLEET_CHANNELS = [
    AX_CHANNEL,
    {"name": "yaw", "source": "imu", "field": "yaw", "kind": "circular", "epsilon": 0.5},
]


def fleet_config(tmp_path, *, sources=None, channels=None, budget=1e6, agent_id="w1"):
    """A 50 Hz synthetic IMU on FLEET_CHANNELS in 0.05 s batches unless said otherwise."""
    return parse_config(agent_config(
        state_dir=tmp_path / "state", agent_id=agent_id, budget=budget, batch_seconds=0.05,
        sources=sources or [{"name": "imu", "type": "synthetic", "rate_hz": 50}],
        channels=channels or FLEET_CHANNELS))


def count_transactions(store: StateStore) -> list[str]:
    """Every BEGIN the store's connection executes from now on."""
    seen: list[str] = []
    store._db.set_trace_callback(
        lambda sql: seen.append(sql) if sql.strip().upper().startswith("BEGIN") else None)
    return seen


def spooled(store) -> list[dict]:
    return [json.loads(p) for _, _, p, _ in store.pending(0, 1_000_000)]


def test_one_record_transaction_per_batch_for_all_cores(tmp_path):
    service = fleet_service(fleet_config(tmp_path), count=40, transport=FakeTransport(),
                           rng=np.random.default_rng(0))
    for core in service.cores:
        core.start()
    begins = count_transactions(service.store)
    service.tick(T0)
    service.tick(T0 + 1.0)
    assert len(begins) == 2  # not 40 (or 80) per batch
    sent = spooled(service.store)
    assert len(sent) == 2 * 40 * 2  # two batches x 40 agents x 2 channels
    by_agent = defaultdict(list)
    for message in sent:
        by_agent[(message["agent"], message["channel"])].append(message["seq"])
    assert {agent for agent, _ in by_agent} == set(virtual_agent_ids("w1", 40))
    assert all(seqs == [0, 1] for seqs in by_agent.values())
    # Each virtual agent has its own ledger entry in the one shared file.
    ids = virtual_agent_ids("w1", 40)
    assert all(service.store.budget_report(agent, 86400.0) for agent in ids)
    assert not service.store.budget_report("w1", 86400.0)
    service.store.close()


def test_budget_is_per_virtual_agent(tmp_path, caplog):
    # 50 Hz, 1 s batches, budget 60 at 1 per report: each agent gets 51 + 9 reports.
    config = fleet_config(tmp_path, budget=60.0, channels=[
        {"name": "ax", "source": "imu", "field": "accel_x", "kind": "linear",
         "epsilon": 1.0, "domain": [-2, 2]}])
    service = fleet_service(config, count=5, transport=FakeTransport())
    for core in service.cores:
        core.start()
    service.tick(T0)
    service.tick(T0 + 1.0)
    service.tick(T0 + 2.0)
    for core in service.cores:
        assert core.store.spent(core.agent_id, core._period) == 60 * 10**9
        assert core.exhausted == {"ax"}
    exhausted = sorted(r.getMessage().split(":")[0] for r in caplog.records
                       if "budget exhausted" in r.getMessage())
    assert exhausted == [f"agent w1-{i}" for i in range(5)]  # once each, naming the agent
    service.store.close()


def test_run_loop_records_once_per_batch(tmp_path, monkeypatch):
    config = fleet_config(tmp_path, sources=[
        {"name": "imu", "type": "synthetic", "rate_hz": 50, "duration": 0.5}])
    service = fleet_service(config, count=12, transport=FakeTransport(), drain_timeout=5)
    ticks, records = [], []
    tick, record = service.tick, agent_module.record_batches
    service.tick = lambda now: (ticks.append(now), tick(now))[1]
    monkeypatch.setattr(agent_module, "record_batches",
                        lambda *a, **k: (records.append(1), record(*a, **k))[1])
    assert service.run() == 0
    assert len(ticks) >= 3 and 1 <= len(records) <= len(ticks)
    published = [json.loads(p) for t, p, _, _ in service.transport.published
                 if not t.endswith("/status")]
    per_agent = defaultdict(int)
    for message in published:
        if message["channel"] == "ax":
            per_agent[message["agent"]] += len(message["codes"])
    assert per_agent == {agent: 25 for agent in virtual_agent_ids("w1", 12)}


def test_virtual_agents_share_mechanisms_not_state(tmp_path):
    service = fleet_service(fleet_config(tmp_path), count=3, transport=FakeTransport())
    a, b = service.cores[0], service.cores[1]
    assert a.channels[0].mechanism is b.channels[0].mechanism
    assert a.channels[0].topic == "ldp/v1/demo/w1-0/ax"
    assert b.channels[0].topic == "ldp/v1/demo/w1-1/ax"
    assert a.channels[0].counters is not b.channels[0].counters
    assert a.sources["imu"] is not b.sources["imu"]
    assert a.sources["imu"].seed != b.sources["imu"].seed
    for core in (a, b):
        core.sources["imu"].start()
        core.sources["imu"].poll(T0)
    x_a = a.sources["imu"].poll(T0 + 1).fields["accel_x"]
    x_b = b.sources["imu"].poll(T0 + 1).fields["accel_x"]
    assert x_a.size == x_b.size == 50 and not np.allclose(x_a, x_b)
    service.store.close()


def test_configured_seed_still_gives_each_agent_its_own_stream(tmp_path):
    config = fleet_config(tmp_path, sources=[
        {"name": "imu", "type": "synthetic", "rate_hz": 50, "seed": 7}])
    seeds = [c.sources["imu"].seed for c in fleet_service(
        config, count=4, transport=FakeTransport()).cores]
    again = [c.sources["imu"].seed for c in fleet_service(
        config, count=4, transport=FakeTransport()).cores]
    assert len(set(seeds)) == 4 and seeds == again


def test_fleet_config_errors_name_the_key_and_range(tmp_path):
    jsonl = fleet_config(tmp_path, sources=[{"name": "imu", "type": "jsonl", "path": "-"}],
                         channels=[{"name": "ax", "source": "imu", "field": "accel_x",
                                    "kind": "linear", "epsilon": 1.0, "domain": [-2, 2]}])
    with pytest.raises(ConfigError, match=r"sources\[0\]\.type: must be one of 'synthetic', "
                                          r"'csv' in a fleet .* got 'jsonl'"):
        check_fleet(jsonl, 10)
    long_id = fleet_config(tmp_path, agent_id="a" * 60)
    check_fleet(long_id, 1000)  # a-...-999: 64 characters
    with pytest.raises(ConfigError, match=r"agent_id: .* with --count 10000 agent_id must be "
                                          r"at most 59 characters, got 60"):
        check_fleet(long_id, 10000)
    with pytest.raises(ConfigError, match=r"--count: must be in \[1, 100000\], got 0"):
        check_fleet(fleet_config(tmp_path), 0)


def test_cli_count_range_and_fleet_config_errors(tmp_path):
    config = REPO / "configs" / "agent.toml"
    for bad in ("0", "100001", "-3"):
        result = run_cli("fleet", "--config", str(config), "--count", bad)
        assert result.returncode == 2
        assert f"Invalid value for '--count': {bad} is not in the range 1<=x<=100000" \
            in result.stderr
    mqtt = write_agent_config(
        tmp_path / "mqtt.toml", broker=SimpleNamespace(host="127.0.0.1", port=1883),
        state_dir=tmp_path / "state",
        sources=[{"name": "imu", "type": "synthetic"},
                 {"name": "gw", "type": "mqtt", "topic": "raw/#"}],
        channels=[{"name": "ax", "source": "gw", "field": "accel_x", "kind": "linear",
                   "epsilon": 1.0, "domain": [-2, 2]}])
    result = run_cli("fleet", "--config", str(mqtt), "--count", "3")
    assert result.returncode == 2, result.stderr
    assert "sources[1].type: must be one of 'synthetic', 'csv' in a fleet" in result.stderr
    assert "got 'mqtt'" in result.stderr


# -- end to end: a real process, a real Mosquitto, a real paho subscriber --------------------

def ledgers(state_dir) -> dict[str, tuple[float, int]]:
    db = sqlite3.connect(f"file:{state_dir}/state.sqlite?mode=ro", uri=True)
    rows = db.execute("SELECT agent, SUM(spent_nano), SUM(reports) FROM spending "
                      "GROUP BY agent").fetchall()
    db.close()
    return {agent: (spent / 1e9, reports) for agent, spent, reports in rows}


def reports_per_agent(subscriber) -> dict[str, dict[str, list[dict]]]:
    grouped: dict[str, list[dict]] = defaultdict(list)
    for topic, payload, _ in list(subscriber.messages):
        if topic.endswith("/status"):
            continue
        message = json.loads(payload)
        assert topic == f"ldp/v1/demo/{message['agent']}/{message['channel']}"
        grouped[message["agent"]].append(message)
    return {agent: check_messages(messages) for agent, messages in grouped.items()}


def statuses_per_agent(subscriber) -> dict[str, list[str]]:
    states = defaultdict(list)
    for status in subscriber.statuses():
        states[status["agent"]].append(status["state"])
    return states


def test_fleet_of_50_synthetic_agents_end_to_end(tmp_path, mosquitto):
    count, rate, duration = 50, 20, 3.0
    config = write_agent_config(
        tmp_path / "fleet.toml", broker=mosquitto, state_dir=tmp_path / "state",
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": rate, "duration": duration}],
        channels=FLEET_CHANNELS, batch_seconds=0.5)
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/#")
    fleet = FleetProcess(config, tmp_path / "fleet.log", count).start()
    try:
        assert fleet.wait(120) == 0, fleet.output()  # finite sources: exits by itself
    finally:
        fleet.kill()
    ids = virtual_agent_ids("w1", count)
    expected = int(rate * duration)
    spent = ledgers(tmp_path / "state")
    assert set(spent) == set(ids)
    assert subscriber.wait_for(lambda: sum(
        len(m["codes"]) for _, p, _ in list(subscriber.messages) if b'"codes"' in p
        for m in [json.loads(p)]) >= 2 * count * expected, 20)
    per_agent = reports_per_agent(subscriber)  # schema, grid, contiguous seq from 0
    assert set(per_agent) == set(ids)
    for agent in ids:
        channels = per_agent[agent]
        counts = {name: sum(len(m["codes"]) for m in ms) for name, ms in channels.items()}
        assert counts == {"ax": expected, "yaw": expected}, agent
        # The persisted ledger is exactly what this agent sent.
        assert spent[agent][1] == 2 * expected
        assert spent[agent][0] == pytest.approx(expected * (1.0 + 0.5))
    # The budget command shows one virtual agent's ledger.
    budget = run_cli("budget", "--config", str(config), "--agent", "w1-17", "--json")
    assert budget.returncode == 0, budget.stderr
    report = json.loads(budget.stdout)
    assert report["agent"] == "w1-17"
    current = report  # the rolling period that ends now
    assert current["channels"]["ax"]["reports"] == expected
    assert current["spent"] == pytest.approx(spent["w1-17"][0])
    # Retained status per virtual agent: online first, offline at the clean exit.
    states = statuses_per_agent(subscriber)
    assert set(states) == set(ids)  # the base id's last will did not fire
    for agent in ids:
        assert states[agent][0] == "online" and states[agent][-1] == "offline", agent
    subscriber.close()


def test_csv_fleet_splits_the_rows(tmp_path, mosquitto):
    n_rows, count = 103, 4
    path = write_rows(tmp_path, n_rows)
    config = write_agent_config(
        tmp_path / "fleet.toml", broker=mosquitto, state_dir=tmp_path / "state",
        sources=[{"name": "rec", "type": "csv", "path": str(path), "pace": "fast",
                  "columns": {"ax": "x"}}],
        channels=[{"name": "ax", "source": "rec", "field": "ax", "kind": "linear",
                   "epsilon": 1.0, "domain": [0.0, 200.0]}])
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/#")
    fleet = FleetProcess(config, tmp_path / "fleet.log", count).start()
    try:
        assert fleet.wait(120) == 0, fleet.output()
    finally:
        fleet.kill()
    assigned = {f"w1-{i}": len(range(i, n_rows, count)) for i in range(count)}
    assert assigned == {"w1-0": 26, "w1-1": 26, "w1-2": 26, "w1-3": 25}
    assert subscriber.wait_for(lambda: sum(
        len(json.loads(p)["codes"]) for t, p, _ in list(subscriber.messages)
        if not t.endswith("/status")) >= n_rows, 20)
    per_agent = reports_per_agent(subscriber)
    assert {agent: sum(len(m["codes"]) for m in channels["ax"])
            for agent, channels in per_agent.items()} == assigned
    assert {agent: reports for agent, (_, reports) in ledgers(tmp_path / "state").items()} \
        == assigned
    states = statuses_per_agent(subscriber)
    assert all(states[a][0] == "online" and states[a][-1] == "offline" for a in assigned)
    subscriber.close()


def test_keep_running_stays_connected_until_sigterm(tmp_path, mosquitto):
    count = 5
    config = write_agent_config(
        tmp_path / "fleet.toml", broker=mosquitto, state_dir=tmp_path / "state",
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 20, "duration": 0.5}],
        channels=FLEET_CHANNELS[:1])
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/#")
    fleet = FleetProcess(config, tmp_path / "fleet.log", count, "--keep-running").start()
    try:
        assert subscriber.wait_for(
            lambda: "staying connected until SIGTERM" in fleet.output(), 60), fleet.output()
        assert subscriber.wait_for(lambda: sum(
            len(json.loads(p)["codes"]) for t, p, _ in list(subscriber.messages)
            if not t.endswith("/status")) >= count * 10, 20)
        time.sleep(3)
        assert fleet.process.poll() is None, fleet.output()  # still running, sources ended
        states = statuses_per_agent(subscriber)
        assert all(states[a] and states[a][-1] == "online"
                   for a in virtual_agent_ids("w1", count))
        fleet.process.send_signal(signal.SIGTERM)
        assert fleet.wait(30) == 0, fleet.output()
    finally:
        fleet.kill()
    assert subscriber.wait_for(lambda: all(
        statuses_per_agent(subscriber)[a][-1] == "offline"
        for a in virtual_agent_ids("w1", count)), 10)
    per_agent = reports_per_agent(subscriber)
    assert {a: sum(len(m["codes"]) for m in ch["ax"]) for a, ch in per_agent.items()} == {
        a: 10 for a in virtual_agent_ids("w1", count)}
    subscriber.close()


def test_agent_service_default_still_exits_when_sources_end(tmp_path):
    """keep_running is off for `edge-agent run` (and by default)."""
    config = fleet_config(tmp_path, sources=[
        {"name": "imu", "type": "synthetic", "rate_hz": 50, "duration": 0.2}])
    service = AgentService(config, transport=FakeTransport(), drain_timeout=2)
    assert service.keep_running is False
    assert service.run() == 0


def test_crash_fires_the_connections_last_will_only(tmp_path, mosquitto):
    count = 3
    config = write_agent_config(
        tmp_path / "fleet.toml", broker=mosquitto, state_dir=tmp_path / "state",
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 20}],
        channels=FLEET_CHANNELS[:1])
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/+/status")
    fleet = FleetProcess(config, tmp_path / "fleet.log", count).start()
    try:
        ids = virtual_agent_ids("w1", count)
        assert subscriber.wait_for(lambda: set(statuses_per_agent(subscriber)) >= set(ids),
                                   60), fleet.output()
        fleet.process.kill()  # no clean shutdown: only the broker's last will speaks
        fleet.wait(HANG_GUARD_SECONDS)
    finally:
        fleet.kill()
    assert subscriber.wait_for(lambda: "w1" in statuses_per_agent(subscriber), 10)
    will = [s for s in subscriber.statuses() if s["agent"] == "w1"]
    assert will == [{"v": 1, "agent": "w1", "state": "offline",
                     "simulator": {"agents": 3, "first": "w1-0", "last": "w1-2"}}]
    states = statuses_per_agent(subscriber)
    assert all(states[agent] == ["online"] for agent in ids)  # stale, as documented
    subscriber.close()


def test_strided_csv_sources_share_one_copy_and_hold_no_file(tmp_path):
    """Thousands of agents on one CSV must not use a descriptor each: paho's
    select() cannot use a socket numbered above 1023 (a 1,024-agent fleet
    could not connect when every agent kept the file open)."""
    import os

    from edge_agent.sources.csv_source import shared_recording

    path = write_rows(tmp_path, 40)
    before = len(os.listdir("/proc/self/fd"))
    sources = [CsvSource(CsvSourceConfig(type="csv", name="rec", path=path, pace="fast",
                                         columns={"x": "x"}), offset=i, stride=2000)
               for i in range(2000)]
    for source in sources:
        source.start()
    assert len(os.listdir("/proc/self/fd")) - before < 5
    assert all(s._shared is shared_recording(path) for s in sources)
    first = sources[3].poll(1000.0)
    assert first.column("x").tolist() == [3.0]
    for source in sources:
        source.stop()
