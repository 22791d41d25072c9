"""End-to-end confirmation: a report leaves an agent's spool once a collector has counted
it durably (``[delivery] confirm = "collector"``), through a real Mosquitto.

Issue 12, defect 6: agents deleted a spooled report on the broker's PUBACK, so a broker
restarted without persistence lost every report it had queued for a collector that was
down at the time (3,287 of 3,972).  The same scenario with ``confirm = "broker"`` is
run too, as the control that shows the scenario does lose reports without it."""

from __future__ import annotations

import sqlite3
import time

import pytest

from edge_agent.agent import STATE_FILE
from tests.support import CollectorProcess, FleetProcess, stays_false, write_agent_config
from tests.support import wait_for_api as wait_until

AGENTS = 3


def spool_state(state_dir) -> tuple[int, int, int]:
    """(sequence numbers taken, readings charged, reports still spooled) of the fleet."""
    db = sqlite3.connect(f"file:{state_dir / STATE_FILE}?mode=ro", uri=True)
    try:
        taken = db.execute("SELECT COALESCE(SUM(next), 0) FROM seq").fetchone()[0]
        charged = db.execute("SELECT COALESCE(SUM(reports), 0) FROM spending").fetchone()[0]
        spooled = db.execute("SELECT COUNT(*) FROM spool WHERE seq IS NOT NULL").fetchone()[0]
    finally:
        db.close()
    return taken, charged, spooled


def start_fleet(tmp_path, mosquitto, confirm: str, seconds: float) -> FleetProcess:
    config = write_agent_config(
        tmp_path / "fleet.toml", agent_id="w", broker=mosquitto, state_dir=tmp_path / "fleet",
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 50, "duration": seconds}],
        delivery={"confirm": confirm, "resend_seconds": 2})
    return FleetProcess(config, tmp_path / "fleet.log", AGENTS, "--keep-running").start()


def fleet_done(fleet: FleetProcess) -> bool:
    """Its sources have ended (it keeps running, to receive confirmations)."""
    return "all sources have ended" in fleet.output()


def counted(collector: CollectorProcess) -> tuple[int, int, int]:
    ingest = collector.api()["ingest"]
    return ingest["messages"], ingest["values"], ingest["duplicates"]


@pytest.mark.parametrize("confirm", ["collector", "broker"])
def test_a_broker_restarted_without_persistence_loses_nothing_confirmed_by_the_collector(
        tmp_path, mosquitto, confirm):
    collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=1).start()
    fleet = start_fleet(tmp_path, mosquitto, confirm, seconds=12)
    state_dir = tmp_path / "fleet"
    try:
        assert wait_until(lambda: counted(collector)[0] >= 30, 60), fleet.output()[-2000:]
        assert collector.terminate() == 0  # the broker queues for its session ...
        time.sleep(2)
        mosquitto.restart()  # ... and forgets the session and the queue: no persistence
        time.sleep(2)  # the agents reconnect meanwhile; their reports go nowhere
        collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=1).start()
        # The sources end after 12 s; then everything the fleet charged is either
        # counted or (confirm = "broker") lost for good.
        assert wait_until(lambda: fleet_done(fleet) and spool_state(state_dir)[2] == 0, 90), \
            fleet.output()[-3000:]
        taken, charged, _ = spool_state(state_dir)
        if confirm == "collector":
            settled = wait_until(lambda: counted(collector)[0] == taken)
        else:  # lost for good: never counted (checked for a while)
            settled = not stays_false(lambda: counted(collector)[0] == taken, 5)
        messages, values, duplicates = counted(collector)
        if confirm == "collector":
            assert settled, (messages, taken, fleet.output()[-3000:])
            assert values == charged  # every reading the agents charged, counted once
        else:
            assert not settled and messages < taken, "the control lost nothing"
    finally:
        fleet.terminate()
    assert collector.terminate() == 0


def test_a_collector_that_lost_its_disk_gets_every_unconfirmed_report_again(tmp_path,
                                                                            mosquitto):
    # No checkpoint, hence no confirmation, before the disk is lost.
    collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=3600).start()
    fleet = start_fleet(tmp_path, mosquitto, "collector", seconds=6)
    state_dir = tmp_path / "fleet"
    try:
        assert wait_until(lambda: counted(collector)[0] >= 30, 60), fleet.output()[-2000:]
        collector.kill()
        for path in tmp_path.glob("collector.sqlite*"):
            path.unlink()
        collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=1).start()
        assert wait_until(lambda: fleet_done(fleet) and spool_state(state_dir)[2] == 0, 90), \
            fleet.output()[-3000:]
        taken, charged, _ = spool_state(state_dir)
        assert wait_until(lambda: counted(collector)[0] == taken, 20), counted(collector)
        assert counted(collector)[1] == charged
    finally:
        fleet.terminate()
    assert collector.terminate() == 0
