"""An upgrade keeps the agent's state: the state files of earlier releases
(tests/data/upgrade/state-<commit>.sqlite, made by scripts/make_upgrade_fixture.py with
those releases' own code) opened by this agent, run for real against Mosquitto.

* a175ef3 (2026-11-25): the ledger per UTC-aligned period (table ``ledger``);
* 3bd55f6 (2026-11-28, before issue 28): the rolling ledger, no memos;
* 22b6855 (2026-11-28, the release before issue 29): today's tables.

Each file holds reports the broker acknowledged and reports spooled while it was down.
The upgraded agent must send the spooled ones unchanged, continue every channel's
sequence numbers where they stopped, and keep every epsilon spent in its ledger.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
import tomllib
from pathlib import Path

import pytest

from edge_agent.channels import build_channels
from edge_agent.config import parse_config
from edge_agent.state import NANO, Budget, StateStore
from tests.support import (
    AgentProcess,
    Mosquitto,
    SimulatedTime,
    Subscriber,
    run_module,
    wait_for_api,
    write_toml,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "upgrade"
FIXTURES = sorted(DATA.glob("state-*.sqlite"))
# Time columns, shifted together so that the old agent stopped a minute ago: the
# upgrade happens right after it (as on a device), whenever the test runs.
TIME_COLUMNS = {"spending": ("until",), "ledger_clock": ("ledger_time", "wall", "wall_high"),
                "ledger": ("period_start",), "spool": ("created", "acked"),
                "range_runs": ("joined",), "memos": ("created",)}
NEW_REPORTS = 3  # per channel, after the spooled ones
DAY, WEEK = 86400.0, 7 * 86400.0


def tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def stopped_a_minute_ago(path: Path) -> None:
    with sqlite3.connect(path) as db:
        present = tables(db)
        last = max(value for (value,) in [
            *db.execute("SELECT MAX(created) FROM spool"),
            *(db.execute("SELECT wall_high FROM ledger_clock") if "ledger_clock" in present
              else [])] if value is not None)
        shift = time.time() - 60.0 - last
        for table, columns in TIME_COLUMNS.items():
            if table in present:
                for column in columns:
                    db.execute(f"UPDATE {table} SET {column} = {column} + ?", (shift,))


def ledger(db: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    """(nano-epsilon spent, reports) per channel, whichever ledger the file has."""
    table = "spending" if "spending" in tables(db) else "ledger"
    return {channel: (spent, reports) for channel, spent, reports in db.execute(
        f"SELECT channel, SUM(spent_nano), SUM(reports) FROM {table} GROUP BY channel")}


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_an_upgraded_agent_keeps_ledger_sequence_numbers_and_spool(tmp_path, fixture):
    assert len(FIXTURES) >= 3
    state = tmp_path / "state"
    state.mkdir()
    shutil.copy(fixture, state / "state.sqlite")
    stopped_a_minute_ago(state / "state.sqlite")
    with sqlite3.connect(state / "state.sqlite") as db:
        spooled = {(channel, seq): bytes(payload) for channel, seq, payload in db.execute(
            "SELECT channel, seq, payload FROM spool")}
        next_seq = dict(db.execute("SELECT channel, next FROM seq"))
        spent = ledger(db)
    assert spooled and next_seq and spent  # the fixture has something to keep

    settings = tomllib.loads((DATA / "agent.toml").read_text())
    with Mosquitto(tmp_path) as broker:
        settings["broker"] = {"host": broker.host, "port": broker.port}
        settings["privacy"]["state_dir"] = str(state)
        config = write_toml(tmp_path / "agent.toml", settings)
        subscriber = Subscriber(broker, f"ldp/v1/{settings['fleet']}/+/+")
        agent = AgentProcess(config, tmp_path / "agent.log").start()
        received: dict[tuple[str, int], bytes] = {}

        def collect() -> None:
            for topic, payload, _ in list(subscriber.messages):
                if not topic.endswith("/status") and payload:
                    report = json.loads(payload)
                    key = (topic.rsplit("/", 1)[1], report["seq"])
                    assert received.setdefault(key, payload) == payload  # no seq reused

        def caught_up() -> bool:
            collect()
            return all(key in received for key in spooled) and all(
                (channel, seq) in received for channel, start in next_seq.items()
                for seq in range(start, start + NEW_REPORTS))

        try:
            assert wait_for_api(caught_up, 120), agent.output()
        finally:
            assert agent.terminate(60) == 0, agent.output()
        with sqlite3.connect(state / "state.sqlite") as db:
            next_after = dict(db.execute("SELECT channel, next FROM seq"))
            unsent = {(channel, seq): bytes(payload) for channel, seq, payload in db.execute(
                "SELECT channel, seq, payload FROM spool")}

        def every_new_report_seen() -> bool:  # what the broker acknowledged last arrives
            collect()
            return all((channel, seq) in received or (channel, seq) in unsent
                       for channel, start in next_seq.items()
                       for seq in range(start, next_after[channel]))

        try:
            assert wait_for_api(every_new_report_seen, 30)
        finally:
            subscriber.close()

    # The spooled reports, byte for byte; then each channel from where it stopped.
    assert {key: received[key] for key in spooled} == spooled
    for channel, start in next_seq.items():
        seqs = sorted(seq for (name, seq) in received if name == channel)
        assert [s for s in seqs if s >= start] == list(range(start, seqs[-1] + 1)), channel
    # Every epsilon spent before is still charged, plus exactly what the new reports cost.
    charges = {channel.name: channel.charge_nano
               for channel in build_channels(parse_config(settings), settings["agent_id"])}
    with sqlite3.connect(state / "state.sqlite") as db:
        after = ledger(db)
    for channel, (nano, reports) in spent.items():
        # The new reports (a batch late under load carries two readings in one report),
        # sent or still spooled: their values, each charged the channel's exact loss.
        new = {seq: payload for (name, seq), payload in {**received, **unsent}.items()
               if name == channel and seq >= next_seq[channel]}
        assert sorted(new) == list(range(next_seq[channel], next_after[channel])), channel
        values = sum(len(json.loads(payload)["codes"]) for payload in new.values())
        assert values >= NEW_REPORTS
        assert after[channel] == (nano + values * charges[channel], reports + values), channel


ROLLING = [p for p in FIXTURES if p.stem != "state-a175ef3"]  # rolling ledgers kept a day


@pytest.mark.parametrize("fixture", ROLLING, ids=[p.stem for p in ROLLING])
def test_an_earlier_ledger_lengthened_to_a_week_counts_its_unknown_past_as_spent(tmp_path,
                                                                                 fixture):
    """A ledger of an earlier release deleted spending older than its longest period (a
    day): upgraded, it knows its past from a day before its last charge on.  Its day's
    guarantee goes on as before; a week's counts the unknown six days as fully spent
    (no report until its window lies in known spending), and check-config and the read-
    only inspection say so."""
    state = tmp_path / "state"
    state.mkdir()
    shutil.copy(fixture, state / "state.sqlite")
    stopped_a_minute_ago(state / "state.sqlite")
    with sqlite3.connect(state / "state.sqlite") as db:
        last_charge, = db.execute("SELECT ledger_time FROM ledger_clock").fetchone()
    settings = tomllib.loads((DATA / "agent.toml").read_text())
    settings["privacy"].update(state_dir=str(state), budget_period="1w")
    config = write_toml(tmp_path / "agent.toml", settings)

    checked = run_module("edge_agent", "check-config", str(config))  # read only, first
    assert checked.returncode == 0, checked.stderr
    assert "the week guarantee starts counting from" in checked.stderr, checked.stderr
    assert "allows no report until" in checked.stderr

    clock_now = SimulatedTime(time.time())  # a new boot; then six days pass in it
    store = StateStore(state / "state.sqlite", monotonic=clock_now.monotonic,
                       boot_id=clock_now.boot_id)
    now = clock_now.wall
    clock = store.clock(now)
    assert clock.known_since == pytest.approx(last_charge - DAY)
    assert clock.counts_fully_from(WEEK) == pytest.approx(now + 6 * DAY - 60, abs=5)
    assert not clock.reaches_unknown(DAY)
    week, day = Budget.of(1000.0, WEEK), Budget.of(1000.0, DAY)
    assert store.epsilon_room("upgraded-01", week, now) == 0
    with store.transaction(now) as tx:
        assert tx.charge("upgraded-01", "accel_x", cost=NANO, wanted=1, budget=week) == 0
        assert tx.charge("upgraded-01", "accel_x", cost=NANO, wanted=1, budget=day) == 1
    later = clock_now.advance(6 * DAY - 60 - 5)  # not yet: five seconds short
    with store.transaction(later) as tx:
        assert tx.charge("upgraded-01", "accel_x", cost=NANO, wanted=1, budget=week) == 0
    later = clock_now.advance(10)
    with store.transaction(later) as tx:
        assert tx.charge("upgraded-01", "accel_x", cost=NANO, wanted=1, budget=week) == 1
    store.close()
    # Read only, as edge-agent budget and check-config open it, the same.
    reader = StateStore(state / "state.sqlite", read_only=True)
    assert reader.clock(later).known_since == pytest.approx(last_charge - DAY)
    reader.close()
