"""An ASGI app served by uvicorn in a thread of its own: the collector's dashboard and API
(collector/api/server.py) and the agent's http source (sources/http_server.py).

The socket is bound here, not by uvicorn: ``port`` is known at once (port 0), and
asyncio would resolve the host in a thread of its own.  uvicorn logs every malformed
request (scanners, port probes) at WARNING: quietened to ERROR unless an operator set
a level for it.  Imported only where a server runs (the agent loads no server stack
without an http source).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import uvicorn

START_SECONDS = 5.0
_ASGI = {"interface": "asgi3", "ws": "none", "lifespan": "off", "proxy_headers": False,
         "log_config": None, "access_log": False}


class ServerThread:
    """``app`` on ``host:port`` with uvicorn's h11 ``protocol`` (a class, or a partial of
    one) and further ``uvicorn.Config`` options; ``on_loop``, if given, runs in the
    server's event loop before it serves."""

    def __init__(self, app, *, host: str, port: int, protocol, name: str,
                 on_loop: Callable[[], Awaitable[None]] | None = None, **options):
        self.app, self.host, self.requested_port = app, host, port
        self.protocol, self.name, self.on_loop, self.options = protocol, name, on_loop, options
        self.socket: socket.socket | None = None
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind, serve, and return once uvicorn has started; ``RuntimeError`` if it does
        not within START_SECONDS (stopped again)."""
        logger = logging.getLogger("uvicorn.error")
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.ERROR)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self.socket = socket.create_server((self.host, self.requested_port), family=family)
        self.server = uvicorn.Server(uvicorn.Config(self.app, http=self.protocol,
                                                    **_ASGI, **self.options))
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),),
                                       name=self.name, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_SECONDS
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop(0.0)
                raise RuntimeError(f"{self.name}: the server did not start (see the log)")
            time.sleep(0.005)

    async def _serve(self) -> None:
        if self.on_loop is not None:
            await self.on_loop()
        await self.server.serve(sockets=[self.socket])

    def stop(self, join_seconds: float) -> None:
        """uvicorn's graceful stop, forced after ``join_seconds``; idempotent."""
        thread = self.thread
        if thread is None:
            return
        self.server.should_exit = True  # uvicorn closes every connection
        thread.join(join_seconds)
        if thread.is_alive():
            self.server.force_exit = True
            thread.join(3.0)
        self.socket.close()
        self.thread = self.server = self.socket = None

    @property
    def running(self) -> bool:
        return self.thread is not None

    @property
    def port(self) -> int:
        if self.socket is None:
            raise RuntimeError(f"{self.name}: not started")
        return self.socket.getsockname()[1]

    @property
    def connections(self) -> int:
        server = self.server
        return 0 if server is None else len(server.server_state.connections)
