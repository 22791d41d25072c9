"""The http source's server: Starlette on uvicorn, in one thread of the agent.

Imported only when an http source starts (``HttpSource.start``): an agent without
one loads none of the server stack.  uvicorn runs as the collector runs it, on the
guarded server of ``edge_agent.common.asgi``, which bounds what a sender can make it
hold:

* at most ``MAX_CONNECTIONS`` connections; one more is answered 503 and closed;
* one request per connection (every answer says ``Connection: close``), and that
  request must arrive whole (line, headers and body) within ``REQUEST_SECONDS`` of
  the connection, else the connection is closed (408 if nothing was answered);
* the body: refused on its Content-Length, or as soon as it passes
  ``max_body_bytes``; uvicorn itself stops reading a body the app does not read
  past 64 KiB.  Before a refusal the rest of the body is read and dropped (up to
  ``LINGER_BYTES`` within ``LINGER_SECONDS``), so that closing does not reset
  the connection under the answer.

``http_batches`` parses bodies, ``HttpSource`` (http_source.py) queues the readings
and settles the requests; this module only moves bytes and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from edge_agent.common.asgi import JSON_TYPE, ConnectionGuard, ConnectionLimits, ServerThread
from edge_agent.sources.http.batches import NOT_RECORDED, PATH, RECORDED, Refused, Ticket

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32
REQUEST_SECONDS = 30.0
LINGER_BYTES = 1 << 20
LINGER_SECONDS = 2.0
RETRY_AFTER = "2"  # seconds, with every 503
GRACEFUL_SHUTDOWN_SECONDS = 2.0
HEADERS = {"Cache-Control": "no-store", "Connection": "close"}
# The source's refusal reasons (its local status) for the server guard's.
SOURCE_REASONS = {"header_timeout": "timeout", "write_timeout": "timeout",
                  "evicted": "connections"}


def _json(status: int, document: dict[str, Any], headers: dict[str, str] | None = None):
    return Response(json.dumps(document).encode(), status_code=status, media_type=JSON_TYPE,
                    headers={**HEADERS, **(headers or {})})


class HttpServer:
    """Serves ``POST /readings`` for ``source`` (an ``HttpSource``, not imported here:
    it imports this module) from a thread: ``start()``, ``stop()``."""

    def __init__(self, source: Any, *, host: str, port: int):
        self.source = source
        self.host = host
        self.max_body = source.config.max_body_bytes
        self.commit_timeout = source.config.commit_timeout_seconds
        self._app = Starlette(
            routes=[Route(PATH, self._readings, methods=["POST"])],
            exception_handlers={HTTPException: self._http_error,
                                Exception: self._internal_error})
        self.guard = ConnectionGuard(
            ConnectionLimits(max_connections=MAX_CONNECTIONS, request_seconds=REQUEST_SECONDS,
                             idle_seconds=REQUEST_SECONDS, evict_waiting=False,
                             retry_after=RETRY_AFTER, answer_after_eof=False),
            on_refusal=lambda reason: source.count(SOURCE_REASONS.get(reason, reason)))
        self._http = ServerThread(
            self._app, host=host, port=port, name=f"http-{source.name}", guard=self.guard,
            server_header=False, headers=[("X-Content-Type-Options", "nosniff")],
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> HttpServer:
        self._http.start()
        log.info("http source %s: POST readings to http://%s:%d%s", self.source.name,
                 f"[{self.host}]" if ":" in self.host else self.host, self.port, PATH)
        return self

    def stop(self) -> None:
        """End the server once the answers already settled are sent (uvicorn's graceful
        shutdown; what still runs after GRACEFUL_SHUTDOWN_SECONDS is cancelled)."""
        self._http.stop(GRACEFUL_SHUTDOWN_SECONDS + 3.0)

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def open_connections(self) -> int:
        return self._http.connections

    # -- the endpoint -------------------------------------------------------------------------
    async def _readings(self, request: Request) -> Response:
        source = self.source
        body = _Body(request)
        try:
            if not source.authorized(request.headers.get("authorization")):
                raise Refused(401, "unauthorized",
                              "a missing or wrong token (Authorization: Bearer <token>)")
            if source.stopping:
                raise Refused(503, "stopping", "the agent is stopping: send it again later")
            readings, skipped = source.parser.parse(await self._read(request, body))
            if len(readings):
                outcome = await self._settled(request, readings)
                if outcome == NOT_RECORDED:
                    raise Refused(503, "not_recorded", "the agent's batch was not recorded: "
                                                      "send it again")
                if outcome != RECORDED:
                    raise Refused(503, "stopping", "the agent is stopping: send it again later")
            source.accepted(len(readings), skipped)
            return _json(200, {"accepted": len(readings)})
        except Refused as refused:
            source.count(refused.reason)
            await self._drain(request, body)
            headers = {"Retry-After": RETRY_AFTER} if refused.status == 503 else \
                {"WWW-Authenticate": "Bearer"} if refused.status == 401 else {}
            return _json(refused.status, {"error": refused.message}, headers)

    async def _read(self, request: Request, body: _Body) -> bytes:
        """The whole body, or ``Refused``: refused on its Content-Length before any of it
        is read, and as soon as a streamed body passes ``max_body_bytes``."""
        declared = _content_length(request)
        if declared is not None and declared > self.max_body:
            raise Refused(413, "too_large", f"the body is over {self.max_body} bytes")
        data = bytearray()
        try:
            async for chunk in body.chunks():
                data += chunk
                if len(data) > self.max_body:
                    raise Refused(413, "too_large", f"the body is over {self.max_body} bytes")
        except ClientDisconnect:
            raise Refused(400, "disconnected", "the request ended early") from None
        return bytes(data)

    async def _drain(self, request: Request, body: _Body) -> None:
        """Before a refusal: read what is left of the body and drop it (at most
        LINGER_BYTES, for LINGER_SECONDS), so that closing the connection does not
        reset it under the answer.  A body declared far larger is not waited for."""
        declared = _content_length(request)
        if body.complete or body.gone or (
                declared is not None and declared > self.max_body + LINGER_BYTES):
            return
        if not body.started and request.headers.get("expect", "").lower() == "100-continue":
            return  # the sender waits for a 100 Continue before its body: none comes

        async def drop() -> None:
            dropped = 0
            async for chunk in body.chunks():
                dropped += len(chunk)
                if dropped > LINGER_BYTES:
                    return

        with contextlib.suppress(TimeoutError, ClientDisconnect):
            await asyncio.wait_for(drop(), LINGER_SECONDS)

    async def _settled(self, request: Request, readings) -> str:
        """Queue the readings and wait for their batch to be committed: the outcome, or
        ``Refused`` when the sender hung up or commit_timeout_seconds passed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()

        def settle(outcome: str) -> None:  # the agent's thread
            with contextlib.suppress(RuntimeError):  # the loop has ended
                loop.call_soon_threadsafe(_resolve, done, outcome)

        ticket = Ticket(len(readings), settle)
        self.source.offer(readings, ticket)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({done, gone}, timeout=self.commit_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if done.done():
            return done.result()
        if self.source.withdraw(ticket):  # not taken: a resend duplicates nothing
            reason, message = "not_committed", "the agent did not take the readings in time: " \
                                               "send them again"
        else:  # in a batch being committed: they will be recorded
            reason, message = "not_committed", "not committed yet: send it again (its " \
                                               "readings may then be recorded twice)"
        if gone.done() and not gone.cancelled():
            reason = "disconnected"
        raise Refused(503, reason, message)

    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        self.source.count("not_found")
        message = f"POST {PATH} only" if exc.status_code in (404, 405) else "bad request"
        headers = {"Allow": "POST"} if exc.status_code == 405 else {}
        return _json(exc.status_code, {"error": message}, headers)

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        log.error("http source %s: %s while answering a request", self.source.name,
                  type(exc).__name__)  # never the request: it holds readings
        return _json(500, {"error": "internal error"})


class _Body:
    """A request's body as it arrives (ASGI receive), and whether it has all arrived."""

    def __init__(self, request: Request):
        self.receive = request.receive
        self.started = False  # asked for (a sender waiting for 100 Continue gets it then)
        self.complete = False
        self.gone = False  # the sender hung up

    async def chunks(self):
        self.started = True
        while not self.complete:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                raise ClientDisconnect()
            self.complete = not message.get("more_body", False)
            yield message.get("body", b"")


def _content_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")  # h11 has checked it is digits
    return int(declared) if declared is not None and declared.isdigit() else None


def _resolve(future: asyncio.Future, outcome: str) -> None:
    if not future.done():
        future.set_result(outcome)


async def _disconnected(request: Request) -> None:
    """Returns when the sender hangs up (the body has been read: uvicorn's receive then
    waits for the disconnection)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
