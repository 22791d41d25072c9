"""The merge view's input in scale-out: every partition's state, as the KV bucket changes.

A thread with its own event loop watches the ``<stream>_state`` bucket and hands
each new value to ``on_state(key, payload)`` (``MergeView.update_partition``), read
from the object store where the value names an object (``state_objects``).
The watch starts with every key's latest value, so a merge view (stateless)
that restarts has the whole picture at once.

The watch is nats-py's ordered push consumer, which a node failure can silence
without an error (its consumer lived on that node).  Live members write every
partition at least every ``engine.rewrite_seconds``, so a watch that hears nothing
for twice that long is started again (and reads every partition's latest state).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from collector.config import ScaleOutConfig
from collector.scaleout.engine import CREATE_TIMEOUT, open_engine, rewrite_seconds
from collector.scaleout.partition_state import PartitionStateRejected, partition_of_key
from collector.scaleout.state_objects import StateObjectMissing

log = logging.getLogger(__name__)


class PartitionFeed:
    def __init__(self, config: ScaleOutConfig, on_state: Callable[[str, bytes], object], *,
                 on_rejected: Callable[[str, str, str], object], name: str):
        self.config, self.on_state, self.name = config, on_state, name
        self.on_rejected = on_rejected  # (key, reason, detail): a reference not followed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="partition-feed", daemon=True)
        self._started = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._started.wait(5)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        watching = asyncio.create_task(self._watch())
        await self._stop.wait()
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)

    async def _state(self, engine, key: str, value: bytes) -> bytes | None:
        """The state a value stands for (read from the object store where it names an
        object), or None: a bad reference (``on_rejected``), or its object is gone or
        unreadable now (a newer value follows within ``rewrite_seconds``)."""
        number = partition_of_key(key)
        if number is None:
            return value
        try:
            return (await engine.state_objects.resolve(number, value))[0]
        except PartitionStateRejected as exc:
            self.on_rejected(key, exc.reason, exc.detail)
            return None
        except StateObjectMissing:
            return None
        except Exception as exc:  # a failover while reading the chunks
            log.warning("the state object of partition %s could not be read (%r)", number, exc)
            return None

    async def _watch(self) -> None:
        engine, quiet = None, 2 * rewrite_seconds(self.config) + 1.0
        while True:
            watcher = None
            try:
                if engine is None:
                    engine = await open_engine(self.config, self.name)
                watcher = await asyncio.wait_for(engine.states.watchall(), CREATE_TIMEOUT)
                while True:
                    try:
                        entry = await asyncio.wait_for(watcher.updates(timeout=None), quiet)
                    except TimeoutError:
                        log.debug("no partition state for %.0f s: watching the bucket again",
                                 quiet)
                        break
                    if entry is not None and entry.value:
                        state = await self._state(engine, entry.key, entry.value)
                        if state is not None:
                            self.on_state(entry.key, state)
            except asyncio.CancelledError:
                if engine is not None:
                    await engine.close()
                raise
            except Exception as exc:  # the cluster failing over: watch again
                log.warning("watching the partition states failed (%r); again", exc)
                await asyncio.sleep(1.0)
            if watcher is not None:
                try:
                    await asyncio.wait_for(watcher.stop(), CREATE_TIMEOUT)
                except Exception:  # its connection or consumer is gone already
                    pass
