"""A real collector gives memory back (``edge_agent.common.memory.release_freed_memory`` after
each checkpoint): LLVM's code pages, which its estimates never read once their kernels
are loaded, leave its RSS and stay out while it goes on estimating."""

from __future__ import annotations

import time

from edge_agent import protocol
from edge_agent.common.memory import clean_mappings
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import CollectorProcess, MqttClient
from tests.support import wait_for_api as wait_until

MECHANISM = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
LOADED = 30 * 2**20  # numba's import alone leaves about 40 MB of it resident (x86_64)


def llvm_code_resident(pid: int) -> int:
    return sum(resident for *_, resident in clean_mappings(smaps=f"/proc/{pid}/smaps"))


def send(publisher: MqttClient, seqs, agent: str) -> None:
    for seq in seqs:
        codes = MECHANISM.perturb_codes([0.5, -0.5, 1.0], None)
        publisher.publish(protocol.data_topic("demo", agent, "ax"), protocol.report(
            agent=agent, channel="ax", kind="linear", seq=seq, t=time.time(), dt=1.0,
            mechanism=MECHANISM.describe(), codes=codes.tolist()))
    publisher.flush()


def estimated(collector: CollectorProcess, messages: int) -> bool:
    document = collector.api()
    return document["ingest"]["messages"] == messages and all(
        channel.get("mean", {}).get("estimate") is not None
        for channel in document["channels"].values())


def test_the_collector_gives_llvm_code_pages_back_after_a_checkpoint(tmp_path, mosquitto):
    collector = CollectorProcess(tmp_path, mosquitto).start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    send(publisher, range(50), agent="w1")
    assert wait_until(lambda: estimated(collector, 50), 30), collector.api()
    # A checkpoint every 2 s: the pages go within a few.
    assert wait_until(lambda: llvm_code_resident(collector.pid) < LOADED / 10, 30), \
        llvm_code_resident(collector.pid) / 2**20
    # Estimating more with the same kernels does not bring them back.
    send(publisher, range(50), agent="w2")
    assert wait_until(lambda: estimated(collector, 100), 30), collector.api()
    assert llvm_code_resident(collector.pid) < LOADED / 10
    assert collector.terminate() == 0
