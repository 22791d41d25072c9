"""Sensor batches that phone and watch apps push as JSON over HTTP (``type = "http"``).

Many sensor-logging apps POST what they record, a batch every second or so, to a
URL on the local network: the phone, or a watch paired with it, becomes the
wearable.  This source listens on ``host``:``port`` (an address on the local
network only: loopback, private or link-local; never every interface) for
``POST /readings`` with ``Authorization: Bearer <token>`` (the token in
``token_file``, compared in constant time).  The server (Starlette on uvicorn, in
``http_server``) is imported only when an http source starts: the agent without
one loads none of it.

The formats (``format = "records"`` or ``"sensor-logger"``) are described and
parsed in ``http_batches``.

Answers (a short JSON ``{"error": ...}`` that never repeats a reading):

* 200 ``{"accepted": n}``: the request's readings are handled for good (below);
* 401 a missing or wrong token; 413 a body over ``max_body_bytes`` (refused on its
  Content-Length before any of it is read, or as soon as a streamed body passes
  it) or over ``max_readings`` readings; 400 not JSON, the wrong shape, a value
  that is not a finite number, a reading without a usable time;
* 503 (with Retry-After) when the queue of ``queue_readings`` readings awaiting
  the agent's next batch is full, when the agent is stopping, or when the
  readings were not committed within ``commit_timeout_seconds`` (below).

Every refusal is counted by reason in the device-only status (``edge-agent
status``), never published.  Memory is bounded whatever senders do: the body
(``max_body_bytes``), the readings of a request, the queue, and the connections
(``http_server``).

**Nothing acknowledged is lost.**  A request is answered 200 only once the agent's
batch that took its readings from the source (``poll``) has been committed to the
state file (``Source.committed``, called after every tick's commit, also when the
batch selected nothing): its readings are then in the spool, perturbed, or were
dropped by the agent's own policy (report_interval, the budget, a clock behind; a
channel that failed counts them in its errors), which a resend would not change.
A tick whose commit fails acknowledges nothing: its requests get 503 and may be
sent again.  On SIGTERM the agent's last tick commits what the source holds and
those requests get their 200; a request arriving after that last poll gets 503.

**A 503 means "not recorded yet: send it again".**  When a request has waited
``commit_timeout_seconds`` (the agent is stalled: it must exceed
``batch_seconds``), or its sender hung up: if the agent has not taken its
readings yet they are withdrawn, so a resend duplicates nothing; if it has taken
them (its batch is being committed) they will be recorded, and a resend records
them a second time.  A crash (SIGKILL, power loss) between the commit and the
200 leaves the sender without an answer for readings that are recorded: its
resend duplicates them too.  So a sender that resends until it gets a 200 loses
nothing, and what may be recorded twice is bounded by the requests that were
unanswered or timed out while the agent was taking their readings: at most one
request per sender per crash or timeout (a sender that waits for each answer
before the next request).  Duplicates are reports like any other: they cost
budget and weigh in the fleet's estimates like one more reading.
"""

from __future__ import annotations

import hmac
import threading
from collections import Counter, deque
from dataclasses import dataclass

from edge_agent.config import HttpSourceConfig
from edge_agent.readings import Readings
from edge_agent.sources.base import Source
from edge_agent.sources.derive import apply_derive
from edge_agent.sources.http.batches import (
    NOT_RECORDED,
    RECORDED,
    STOPPING,
    Parser,
    Refused,
    Ticket,
)

MIN_TOKEN_CHARS = 16

# Why a request was refused (counted in the local status).
REJECT_REASONS = ("unauthorized", "too_large", "too_many_readings", "bad_json", "bad_shape",
                  "bad_value", "bad_timestamp", "queue_full", "stopping", "not_committed",
                  "not_recorded", "disconnected", "not_found", "connections", "timeout")


@dataclass
class _Queued:
    readings: Readings
    ticket: Ticket


# -- the source ---------------------------------------------------------------------------------

class HttpSource(Source):
    """Listens for POSTed batches (module docstring); never finishes unless it fails to
    start (the token, the address)."""

    acknowledges = True

    def __init__(self, config: HttpSourceConfig):
        super().__init__(config.name, derive=config.derive, base_fields=config.fields)
        self.config = config
        self.parser = Parser(config)
        self.rejects: Counter[str] = Counter(dict.fromkeys(REJECT_REASONS, 0))
        self.accepted_requests = 0
        self.accepted_readings = 0
        #: readings of valid requests that carry none of the configured fields
        self.skipped_readings = 0
        self._lock = threading.Lock()
        self._queue: deque[_Queued] = deque()  # valid requests awaiting the next poll
        self._queued_readings = 0
        self._taken: list[Ticket] = []  # polled, awaiting the commit of their batch
        self._stopping = False
        self._token: bytes | None = None
        self._server = None

    def origin(self) -> dict[str, object]:
        return {"listen": f"{self.config.host}:{self.config.port}",
                "format": self.config.format}

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._server is not None:
            return
        where = f"http source {self.name!r}"
        try:
            token = self.config.token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            self.fail(f"{where}: cannot read token_file {self.config.token_file}: "
                      f"{getattr(exc, 'strerror', None) or type(exc).__name__}")
            return
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
            self.fail(f"{where}: token_file {self.config.token_file} must hold one token of "
                      f"at least {MIN_TOKEN_CHARS} characters without spaces (e.g. the output "
                      f"of `openssl rand -hex 24`)")
            return
        self._token = token.encode()
        with self._lock:
            self._stopping = False
        try:
            from edge_agent.sources.http.server import (
                HttpServer,  # the server stack: only with an http source
            )
        except ImportError as exc:
            self.fail(f"{where}: {exc.name or 'the server stack'} is missing: pip install "
                      f"'edge-ldp[http]'")
            return

        server = HttpServer(self, host=self.config.host, port=self.config.port)
        try:
            server.start()
        except (OSError, RuntimeError) as exc:
            self.fail(f"{where}: cannot listen on {self.config.host}:{self.config.port}: "
                      f"{getattr(exc, 'strerror', None) or exc}")
            return
        self._server = server

    def stop(self) -> None:
        """Refuse what arrives from now on, answer 503 to every request whose readings
        the agent has not taken (or whose batch was not committed), then close the
        server once the answers are out."""
        with self._lock:
            self._stopping = True
            queued = [entry.ticket for entry in self._queue]
            uncommitted, self._taken = self._taken, []
            self._queue.clear()
            self._queued_readings = 0
        for ticket in queued:
            ticket.settle(STOPPING)
        for ticket in uncommitted:  # the last batch was not committed
            ticket.settle(NOT_RECORDED)
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    @property
    def open_connections(self) -> int:
        return 0 if self._server is None else self._server.open_connections

    @property
    def port(self) -> int:
        """The port listened on."""
        if self._server is None:
            raise RuntimeError("the http source is not listening")
        return self._server.port

    # -- requests (the server's thread) ------------------------------------------------------
    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header carries the token (in constant time)."""
        if self._token is None or not header:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(credentials.strip().encode(), self._token)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def offer(self, readings: Readings, ticket: Ticket) -> None:
        """Queue a valid request's readings for the agent's next batch, or ``Refused``
        (the queue is full, the agent is stopping)."""
        with self._lock:
            if self._stopping:
                raise Refused(503, "stopping", "the agent is stopping: send it again later")
            if self._queued_readings + len(readings) > self.config.queue_readings:
                raise Refused(503, "queue_full",
                              "the agent is behind (its queue is full): send it again")
            self._queue.append(_Queued(readings, ticket))
            self._queued_readings += len(readings)

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a request's readings back if the agent has not taken them yet (True);
        False if they are in a batch being committed (they will be recorded)."""
        with self._lock:
            for index, entry in enumerate(self._queue):
                if entry.ticket is ticket:
                    del self._queue[index]
                    self._queued_readings -= len(entry.readings)
                    return True
        return False

    def count(self, reason: str) -> None:
        self.rejects[reason] += 1

    def accepted(self, readings: int, skipped: int) -> None:
        self.accepted_requests += 1
        self.accepted_readings += readings
        self.skipped_readings += skipped

    # -- the agent's thread ------------------------------------------------------------------
    def poll(self, now: float) -> Readings:
        with self._lock:
            # Taken at the previous poll and never committed: that tick failed.
            uncommitted, self._taken = self._taken, [entry.ticket for entry in self._queue]
            parts = [entry.readings for entry in self._queue]
            self._queue.clear()
            self._queued_readings = 0
        for ticket in uncommitted:
            ticket.settle(NOT_RECORDED)
        return apply_derive(Readings.concat(parts), self.derive)

    def committed(self) -> None:
        with self._lock:
            taken, self._taken = self._taken, []
        for ticket in taken:
            ticket.settle(RECORDED)

    # -- status ----------------------------------------------------------------------------
    def local_counters(self) -> dict[str, object]:
        return {"queued_readings": self._queued_readings,
                "accepted_requests": self.accepted_requests,
                "accepted_readings": self.accepted_readings,
                "skipped_readings": self.skipped_readings,
                "refused": dict(self.rejects)}
