"""The collector's network process against a real Mosquitto: it journals what agents
send, and acknowledges the collectors' own topics (retained snapshots, confirmations,
which its subscription also matches) without journaling them."""

from __future__ import annotations

from collector.broker.network import NetworkProcess
from collector.broker.settings import network_settings
from collector.config import parse_collector_config
from collector.storage.store import CollectorStore
from edge_agent import protocol
from tests.support import FLEET, MqttClient, collector_config, wait_until


def test_the_collectors_own_topics_are_acknowledged_not_journaled(tmp_path, mosquitto):
    config = parse_collector_config(collector_config(
        mosquitto, storage={"path": str(tmp_path / "collector.sqlite")}))
    settings = network_settings(config)
    assert settings.unjournaled_prefix == f"ldp/v1/{FLEET}/_"
    store = CollectorStore(config.storage.path)
    device = MqttClient(mosquitto, v5=False).connect()
    published = [(protocol.data_topic(FLEET, "dev-a", "ax"), b'{"a report": 1}'),
                 (protocol.confirm_topic(FLEET, "dev-a"), b'{"ours": 1}'),
                 (protocol.aggregates_topic(FLEET, "ax"), b'{"ours": 2}'),
                 (protocol.data_topic(FLEET, "dev-a", "ay"), b'{"a report": 2}')]

    def journaled() -> list[tuple[str, bytes]]:
        rows, _ = store.read_journal(0)
        return [(topic, payload) for _, topic, payload, _ in rows]

    network = NetworkProcess(settings)
    network.start()
    try:
        assert wait_until(lambda: store.network()["connected"]), "not subscribed"
        for topic, payload in published:
            device.acked(device.publish(topic, payload))
        reports = [published[0], published[3]]
        assert wait_until(lambda: journaled() == reports), journaled()
        network.stop()
        # Everything was acknowledged, ours too: the persistent session gives nothing
        # again, and what comes next is journaled after the rest.
        network = NetworkProcess(settings)
        network.start()
        last = (protocol.data_topic(FLEET, "dev-a", "az"), b'{"a report": 3}')
        device.acked(device.publish(*last))
        assert wait_until(lambda: len(journaled()) == 3), journaled()
        assert journaled() == [*reports, last]
    finally:
        device.close()
        network.stop()
        store.close()
