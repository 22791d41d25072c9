"""A NATS JetStream cluster for the tests and the benchmarks: 3 servers on loopback.

The configuration is the product's (``collector.scaleout.local_cluster``, which the
demo uses too).  Every server is a tracked child (processes.py), killed after the
test however it ends; ``kill(i)`` and ``start_node(i)`` crash and bring back one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats

from collector.scaleout.local_cluster import NOT_INSTALLED, Node, find_nats_server, node_config
from tests.support.ports import LOOPBACK, free_port, port_open, wait_until
from tests.support.processes import ChildProcess


def require_nats_server() -> str:
    binary = find_nats_server()
    if binary is None:
        import pytest  # only here: the benchmarks use this module without pytest

        pytest.fail(NOT_INSTALLED)
    return binary


class NatsCluster:
    def __init__(self, workdir: Path, nodes: int = 3):
        binary = require_nats_server()
        workdir.mkdir(parents=True, exist_ok=True)
        self.nodes = [Node(f"n{i}", free_port(), free_port(), workdir / f"nats-n{i}")
                      for i in range(nodes)]
        self.servers: list[ChildProcess] = []
        for node in self.nodes:
            conf = workdir / f"nats-{node.name}.conf"
            conf.write_text(node_config(node, self.nodes))
            self.servers.append(ChildProcess([binary, "-c", conf],
                                             workdir / f"nats-{node.name}.log"))

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start_node(self, i: int) -> None:
        server, node = self.servers[i].start(), self.nodes[i]

        def listening() -> bool:
            if not server.running():
                raise RuntimeError(f"nats-server {node.name} exited: {server.output()[-2000:]}")
            return port_open(LOOPBACK, node.client_port, timeout=0.2)

        if not wait_until(listening, 15, interval=0.05):
            raise RuntimeError(f"nats-server {node.name} did not start listening")

    def start(self) -> NatsCluster:
        for i in range(len(self.nodes)):
            self.start_node(i)
        return self

    def stream_info(self, stream: str):
        """JetStream's information on ``stream`` now (from a client of its own; not from
        inside a running event loop)."""
        async def ask():
            client = await nats.connect(self.urls)
            try:
                return await client.jetstream().stream_info(stream)
            finally:
                await client.close()

        return asyncio.run(ask())

    def stream_leader(self, stream: str) -> int:
        """The index of the node leading ``stream`` now."""
        leader = self.stream_info(stream).cluster.leader
        return next(i for i, node in enumerate(self.nodes) if node.name == leader)

    def kill(self, i: int) -> None:
        self.servers[i].kill()

    def stop(self) -> None:
        for server in self.servers:
            server.kill()

    def output(self) -> str:
        return "\n".join(f"--- {node.name}\n{server.output()[-3000:]}"
                         for node, server in zip(self.nodes, self.servers))

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
