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
from tests.support import AgentProcess, Mosquitto, Subscriber, wait_for_api, write_toml

DATA = Path(__file__).resolve().parents[1] / "data" / "upgrade"
FIXTURES = sorted(DATA.glob("state-*.sqlite"))
# Time columns, shifted together so that the old agent stopped a minute ago: the
# upgrade happens right after it (as on a device), whenever the test runs.
TIME_COLUMNS = {"spending": ("until",), "ledger_clock": ("ledger_time", "wall", "wall_high"),
                "ledger": ("period_start",), "spool": ("created", "acked"),
                "range_runs": ("joined",), "memos": ("created",)}
NEW_REPORTS = 3  # per channel, after the spooled ones


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
