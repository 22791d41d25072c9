"""One guarded ASGI server: an app served by uvicorn in a thread of its own, with the
connection limits uvicorn lacks.  The collector's dashboard and API
(collector/api/server.py) and the agent's http source (sources/http/server.py) both
run on it.

The socket is bound here, not by uvicorn: ``port`` is known at once (port 0), and
asyncio would resolve the host in a thread of its own.  uvicorn logs every malformed
request (scanners, port probes) at WARNING: quietened to ERROR unless an operator set
a level for it.  Imported only where a server runs (the agent loads no server stack
without an http source).

uvicorn runs on asyncio with its pure-Python h11 protocol: a connection costs a
protocol object, not a thread.  uvicorn itself does not bound what a client can hold:
it arms its keep-alive timer only once a response is complete and cancels it at the
next byte received, so a connection that never completes its request (or sends it a
byte at a time) is kept forever, and its ``limit_concurrency`` answers 503 only to
requests that did arrive.  ``GuardedH11Protocol`` adds what is missing, per
``ConnectionLimits``:

* at most ``max_connections`` open.  One more is refused at once with a 503; or,
  with ``evict_waiting``, it makes the connection that has waited longest for a
  request (new, idle or slow) close, and is refused only when every connection is
  busy with a request or a stream;
* a request (line, headers and body) must arrive whole within ``request_seconds``
  of its first byte (or of the connection, for the first request): 408 where
  nothing was answered yet, then closed;
* a keep-alive connection idle for ``idle_seconds`` is closed, and so is one whose
  client stopped reading our answer for that long.

Malformed requests are answered with a JSON error, as every refusal is, and the
connection lingers a moment to read what the client still sends (closing with unread
input makes the kernel send a reset, which can destroy the answer in transit).  Each
refusal is counted by reason (``REFUSAL_REASONS``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

START_SECONDS = 5.0
JSON_TYPE = "application/json"
RETRY_AFTER = "5"  # seconds: how soon a client refused with a 503 may try again
LINGER_SECONDS = 1.0  # after an error answer, reading what the client still sends ...
LINGER_BYTES = 1 << 20  # ... up to this much, before closing
# Why the guard closed or refused a connection.
REFUSAL_REASONS = ("connections", "evicted", "header_timeout", "write_timeout")
_ASGI = {"interface": "asgi3", "ws": "none", "lifespan": "off", "proxy_headers": False,
         "log_config": None, "access_log": False}


@dataclass(frozen=True)
class ConnectionLimits:
    """What clients can make a server hold."""

    max_connections: int = 256
    request_seconds: float = 10.0  # a request must arrive whole within this
    idle_seconds: float = 60.0  # between requests, and for a client to read our answer
    evict_waiting: bool = True  # at the cap, close a connection waiting for a request
    retry_after: str = RETRY_AFTER  # seconds, with the 503 for too many connections
    # A client that half-closes once its request is sent (`nc -N`, some HTTP/1.0 clients)
    # is answered; False: its end of input is a hang-up (the request is cancelled).
    answer_after_eof: bool = True


class ConnectionGuard:
    """The connections of one server and what its limits did (used in its event loop
    only).  ``limits`` is read at every connection and deadline, so it may be replaced
    while the server runs; ``on_refusal(reason)`` is told of every refusal too."""

    def __init__(self, limits: ConnectionLimits,
                 on_refusal: Callable[[str], None] | None = None):
        self.limits = limits
        self.on_refusal = on_refusal
        self.open: set[GuardedH11Protocol] = set()
        # Connections waiting for a request (new, idle between requests, or receiving
        # one slowly), longest-waiting first: at the cap, the first makes room.
        self.waiting: dict[GuardedH11Protocol, None] = {}
        self.refused = collections.Counter(dict.fromkeys(REFUSAL_REASONS, 0))

    def admit(self, connection: GuardedH11Protocol) -> bool:
        if len(self.open) >= self.limits.max_connections:
            if not (self.limits.evict_waiting and self.waiting):
                self.count("connections")
                return False
            next(iter(self.waiting)).close_for("evicted")
        self.open.add(connection)
        return True

    def forget(self, connection: GuardedH11Protocol) -> None:
        self.open.discard(connection)
        self.waiting.pop(connection, None)

    def count(self, reason: str) -> None:
        self.refused[reason] += 1
        if self.on_refusal is not None:
            self.on_refusal(reason)


def json_error(message: str) -> bytes:
    """The body of every error answer: ``{"error": message}``."""
    return json.dumps({"error": message}, separators=(",", ":")).encode()


def raw_answer(status: int, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A complete JSON error response, for the protocol to write when no request (or no
    valid one) was read, so none of the ASGI app's machinery applies."""
    body = json_error(message)
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Content-Type: {JSON_TYPE}",
             f"Content-Length: {len(body)}", "Cache-Control: no-store",
             "X-Content-Type-Options: nosniff", "Connection: close",
             *(f"{key}: {value}" for key, value in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits of ``ConnectionLimits`` (module docstring).

    It leans on ``H11Protocol``'s internals (``cycle``, ``conn``, ``flow``,
    ``timeout_keep_alive_task``, ``on_response_complete``, ``send_400_response``),
    which is why pyproject.toml names the uvicorn tested; the tests of both servers
    (tests/collector/api/, tests/edge_agent/sources/test_http_source.py) exercise each."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.refused = False    # over the cap: answered 503 and closed
        self.lingering = False  # an error was answered: reading the rest, then closing
        self.lingered = 0  # bytes read away meanwhile
        self.request_deadline: asyncio.TimerHandle | None = None
        self.write_deadline: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.Transport) -> None:
        if not self.guard.admit(self):
            self.refused = True
            self.transport = transport
            transport.write(raw_answer(503, "too many connections",
                                       {"Retry-After": self.guard.limits.retry_after}))
            transport.close()
            return
        super().connection_made(transport)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self)
        self._cancel_deadlines()
        if self.refused:  # never made: uvicorn has nothing of it to clean up
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # read and dropped (see _linger)
            self.lingered += len(data)
            if self.lingered > LINGER_BYTES:
                self.transport.close()
            return
        if self.refused:
            return
        super().data_received(data)
        self._watch()

    def eof_received(self) -> bool | None:
        # A client may half-close once its request is sent (`nc -N`, some HTTP/1.0
        # clients): answer it, then close.  uvicorn would close at once, answerless.
        if self.guard.limits.answer_after_eof and not self.lingering \
                and self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
            return True
        return None  # asyncio closes the transport

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.write_deadline is None:
            self.write_deadline = self.loop.call_later(
                self.guard.limits.idle_seconds, self.close_for, "write_timeout")

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.write_deadline is not None:
            self.write_deadline.cancel()
            self.write_deadline = None

    # -- uvicorn's hooks --

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def send_400_response(self, msg: str) -> None:
        log.debug("malformed request from %s: %s", self.client, msg)
        self.transport.write(raw_answer(400, "bad request"))
        self._linger()

    def timeout_keep_alive_handler(self) -> None:
        if self.transport.get_write_buffer_size():  # the client never read our answer
            self.transport.abort()
        else:
            super().timeout_keep_alive_handler()

    # -- the limits --

    def _watch(self) -> None:
        """Track whether the connection waits for a request and hold it to the request
        deadline meanwhile: armed at the connection, or at the first byte after a
        keep-alive wait (uvicorn's timer covers the wait itself), and ended once the
        whole request (its body too) has arrived."""
        if self.transport.is_closing() or self.lingering:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:  # a request is in
            self.guard.waiting.pop(self, None)
            if not cycle.more_body and self.request_deadline is not None:
                self.request_deadline.cancel()
                self.request_deadline = None
            return
        self.guard.waiting.setdefault(self, None)
        if self.timeout_keep_alive_task is None and self.request_deadline is None:
            self.request_deadline = self.loop.call_later(
                self.guard.limits.request_seconds, self.close_for, "header_timeout")

    def close_for(self, reason: str) -> None:
        """Close the connection because of a limit (``REFUSAL_REASONS``), counted."""
        self.guard.forget(self)  # at once: a new connection may be taking its place
        self._cancel_deadlines()
        if self.transport.is_closing():
            return
        self.guard.count(reason)
        if reason == "write_timeout":
            self.transport.abort()  # what is buffered will never be read
            return
        if reason == "header_timeout" and self.conn.our_state is h11.IDLE:
            self.transport.write(raw_answer(408, "the request did not arrive in time"))
        self.transport.close()

    def _linger(self) -> None:
        """Close after an error answer, but read the client's leftovers first (for up
        to ``LINGER_SECONDS`` and ``LINGER_BYTES``)."""
        self.lingering = True
        self.guard.waiting.pop(self, None)
        self._cancel_deadlines()
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.request_deadline = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _cancel_deadlines(self) -> None:
        for deadline in (self.request_deadline, self.write_deadline):
            if deadline is not None:
                deadline.cancel()
        self.request_deadline = self.write_deadline = None


class ServerThread:
    """``app`` on ``host:port``, guarded by ``guard`` (a ``ConnectionGuard``), with further
    ``uvicorn.Config`` options; ``on_loop``, if given, runs in the server's event loop
    before it serves."""

    def __init__(self, app, *, host: str, port: int, guard: ConnectionGuard, name: str,
                 on_loop: Callable[[], Awaitable[None]] | None = None, **options):
        self.app, self.host, self.requested_port = app, host, port
        self.guard, self.name, self.on_loop, self.options = guard, name, on_loop, options
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
        protocol = functools.partial(GuardedH11Protocol, guard=self.guard)
        self.server = uvicorn.Server(uvicorn.Config(
            self.app, http=protocol, timeout_keep_alive=self.guard.limits.idle_seconds,
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
        """Connections held (refused ones are not)."""
        return len(self.guard.open)
