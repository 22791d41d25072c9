"""Issue 12's defects, each reproduced through a real Mosquitto into a real collector.

1. a report with seq 2**63 stopped ingestion for good (and 2**33 cost 2 GB);
2. a sequence jump dropped the device's next 16,384 reports;
3. a failed checkpoint left a write transaction open, and the network child died;
4. SIGTERM deadlocked once the network child had been killed;
5. (tests/collector/tools/test_demo.py) a killed demo orphaned its children;
6. (tests/collector/test_confirm.py) a broker restart without persistence lost
   acknowledged reports;
10. retained reports were ingested again at every reconnect.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

from collector.config import load_collector_config
from collector.service import CollectorService
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import CollectorProcess, MqttClient
from tests.support import wait_for_api as wait_until

MECHANISM = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0).describe()


def report(seq: int, agent: str = "w1", codes=(1, 2, 3)) -> tuple[str, bytes]:
    return protocol.data_topic("demo", agent, "ax"), protocol.report(
        agent=agent, channel="ax", kind="linear", seq=seq, t=time.time(), dt=1.0,
        mechanism=MECHANISM, codes=list(codes))


def send(publisher: MqttClient, seqs, **options) -> None:
    for seq in seqs:
        publisher.publish(*report(seq, **options))
    publisher.flush()


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def children(pid: int) -> dict[int, str]:
    """pid -> command line of ``pid``'s children."""
    found = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listed:
            for child in map(int, listed.read().split()):
                with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                    found[child] = cmdline.read().replace(b"\0", b" ").decode()
    return found


def test_huge_and_jumping_sequence_numbers_stop_nothing_and_drop_nothing(tmp_path, mosquitto):
    """Defects 1 and 2, and a restart that replays them."""
    collector = CollectorProcess(tmp_path, mosquitto).start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    send(publisher, range(100))
    # Measured once the estimators have run: their compiled kernels load then, once.
    assert wait_until(lambda: any(channel.get("mean", {}).get("estimate") is not None
                                  for channel in collector.api()["channels"].values()), 30)
    before = rss_kb(collector.pid)
    send(publisher, [2**63, 2**64 + 5])  # beyond the type: refused
    send(publisher, [2**33, 2**52, protocol.SEQ_LIMIT - 1, 131_072 + 100])  # valid jumps
    send(publisher, range(100, 300))  # the device's next reports: all counted
    send(publisher, range(0, 300, 7))  # and copies of old ones: duplicates
    expected = {"messages": 304, "values": 912, "duplicates": 43}
    assert wait_until(lambda: {key: collector.api()["ingest"][key] for key in expected}
                      == expected, 30), collector.api()["ingest"]
    assert collector.api()["ingest"]["rejects"] == {"schema": 2}
    assert rss_kb(collector.pid) - before < 50_000  # kB: 2**33 once cost 2 GB
    assert collector.terminate() == 0
    again = CollectorProcess(tmp_path, mosquitto).start()  # checkpoint + journal replay
    assert {key: again.api()["ingest"][key] for key in expected} == expected
    send(publisher, [150, 2**33, 300])
    assert wait_until(lambda: again.api()["ingest"]["messages"] == 305, 30)
    assert again.api()["ingest"]["duplicates"] == 45
    publisher.close()
    assert again.terminate() == 0


def connected_to(pid: int, port: int) -> bool:
    """Whether ``pid`` holds a TCP connection to loopback ``port``: the network process
    is the collector's only child with one (the estimate workers, spawned like it, hold
    none)."""
    sockets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    with open(f"/proc/{pid}/net/tcp") as table:
        next(table)  # the header
        return any(fields[2].endswith(f":{port:04X}") and fields[9] in sockets
                   for fields in map(str.split, table))


def kill_network_child_after_50(collector: CollectorProcess, publisher: MqttClient) -> None:
    """Seq 0-49 counted, then the collector's network process SIGKILLed."""
    send(publisher, range(50))
    assert wait_until(lambda: collector.api()["ingest"]["messages"] == 50, 30)
    (network,) = [pid for pid, command in children(collector.pid).items()
                  if "spawn_main" in command and connected_to(pid, publisher.broker.port)]
    os.kill(network, signal.SIGKILL)


def test_sigterm_after_the_network_child_was_killed_stops_at_once(tmp_path, mosquitto):
    """Defect 4: the child killed while it waited on a shared Event left the parent's
    Event.set() blocked for ever; systemd would SIGKILL it after the stop timeout."""
    collector = CollectorProcess(tmp_path, mosquitto).start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    kill_network_child_after_50(collector, publisher)
    assert collector.terminate(timeout=30) == 0, collector.output()[-3000:]
    publisher.close()


def test_a_killed_network_child_is_restarted_and_loses_nothing(tmp_path, mosquitto):
    collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=0.5).start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    kill_network_child_after_50(collector, publisher)
    send(publisher, range(50, 120))  # queued in the collector's session meanwhile
    assert wait_until(lambda: collector.api()["ingest"]["messages"] == 120, 60), \
        collector.output()[-3000:]
    assert "the network process exited" in collector.output()
    publisher.close()
    assert collector.terminate() == 0


def test_retained_reports_are_not_ingested_again_at_each_reconnect(tmp_path, mosquitto):
    """Defect 10: +71 duplicates and +16 rejects at every restart."""
    publisher = MqttClient(mosquitto, v5=False).connect()
    collector = CollectorProcess(tmp_path, mosquitto).start()
    for seq in range(5):
        publisher.acked(publisher.publish(*report(seq), retain=True))
    publisher.acked(publisher.publish(protocol.data_topic("demo", "w2", "ax"), b"{junk",
                                      retain=True))
    assert wait_until(lambda: collector.api()["ingest"]["messages"] == 5
                      and collector.api()["ingest"]["rejects"] == {"json": 1}, 30)
    ingest = collector.api()["ingest"]
    for _ in range(3):
        assert collector.terminate() == 0
        collector = CollectorProcess(tmp_path, mosquitto).start()
        time.sleep(1.0)  # what a replay would need to arrive
        assert collector.api()["ingest"] == ingest
    publisher.close()
    assert collector.terminate() == 0


def test_a_failing_checkpoint_keeps_ingest_going_and_loses_nothing(tmp_path, mosquitto):
    """Defect 3, with the collector's own service and network child: checkpoints fail
    (a state larger than SQLite then allows on the aggregator's connection) while reports
    flow; once they succeed again, a restart restores exactly what was counted."""
    collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=0.5)  # its config
    config = load_collector_config(collector.config)
    service = CollectorService(config, web=False)
    service.start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    try:
        assert wait_until(lambda: service.store.network()["connected"], 30)
        send(publisher, range(20))
        assert wait_until(lambda: service.ingestor.counters["messages"] == 20, 30)
        with service.lock:
            service.store._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 600)  # > a report (180)
        send(publisher, range(20, 220))  # journaled by the child, counted here
        assert wait_until(lambda: service.ingestor.counters["messages"] == 220, 30)
        # No checkpoint since (they fail) ...  (its journal position only: a checkpoint
        # written before the limit, if any, is itself over it)
        with service.store._lock:
            row = service.store._db.execute(
                "SELECT journal_upto FROM checkpoint WHERE id=1").fetchone()
        assert row is None or row[0] <= 20
        assert not service.store._db.in_transaction  # ... and none left a lock behind
        with service.lock:
            service.store._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1 << 30)
        assert wait_until(lambda: service.store.load()[1] >= 220, 30)  # the retry succeeds
    finally:
        publisher.close()
        service.stop()
    restored = CollectorService(config, web=False)
    assert restored.ingestor.counters == {"messages": 220, "values": 660, "duplicates": 0}
    restored.store.close()
