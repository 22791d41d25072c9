"""The scale-out roles as processes, for the tests and the benchmarks: an ingress and the
members (``Role``: ready once its log says so), and their ``[scale_out]`` table."""

from __future__ import annotations

from tests.support.ports import wait_until
from tests.support.processes import CollectorProcess

STREAM = "ldp_reports"
PARTITIONS = 8
DUPLICATE_WINDOW = 2.0


def scale_out(cluster, **extra) -> dict:
    return {"servers": cluster.urls, "partitions": PARTITIONS, "lease_seconds": 10,
            "checkpoint_seconds": 0.5, "duplicate_window_seconds": DUPLICATE_WINDOW, **extra}


class Role(CollectorProcess):
    """An ingress or a member: no HTTP API; ready once its log says so."""

    def __init__(self, tmp_path, broker, cluster, command: str, name: str, ready: str,
                 **settings):
        super().__init__(tmp_path, broker, name=name, command=command,
                         broker_settings={"client_id": name},
                         scale_out=scale_out(cluster, member=name, **settings))
        self.ready = ready

    def start_raw(self) -> Role:
        """Start without waiting for anything."""
        super(CollectorProcess, self).start()
        return self

    def start(self) -> Role:
        mark = len(self.output())
        self.start_raw()

        def ready() -> bool:
            if not self.running():
                raise RuntimeError(self.output()[-3000:])
            return self.ready in self.output()[mark:]

        if not wait_until(ready, 60, interval=0.1):
            raise RuntimeError(f"{self.log.stem} did not start:\n{self.output()[-3000:]}")
        return self


def ingress(tmp_path, broker, cluster, **settings) -> Role:
    return Role(tmp_path, broker, cluster, "ingress", "ingress", "MQTT subscription up",
                **settings)


def member(tmp_path, broker, cluster, name: str, **settings) -> Role:
    return Role(tmp_path, broker, cluster, "member", name, "took partition", **settings)


def merge_view(tmp_path, broker, cluster, **settings) -> CollectorProcess:
    """The merge view (``edge-collector merge``), started: ready once its API answers."""
    return CollectorProcess(tmp_path, broker, name="merge", command="merge",
                            broker_settings={"client_id": "merge"},
                            scale_out=scale_out(cluster, **settings)).start()


def pipeline(tmp_path, broker, cluster, members: int = 2, **settings) \
        -> tuple[Role, list[Role], CollectorProcess]:
    """An ingress, ``members`` members (m0, m1, ...) and the merge view, started in that
    order with the same ``[scale_out]`` settings."""
    entry = ingress(tmp_path, broker, cluster, **settings).start()
    started = [member(tmp_path, broker, cluster, f"m{i}", **settings).start()
               for i in range(members)]
    return entry, started, merge_view(tmp_path, broker, cluster, **settings)
