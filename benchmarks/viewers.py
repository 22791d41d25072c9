"""Dashboard viewers as load: open event streams and API requests at a steady rate.

``python -m benchmarks.viewers --port P --streams 50 --rate 10 --out result.json``
runs until SIGTERM (or ``--seconds``), in its own process so that its work does not
share the collector's interpreter.  Every stream reads ``/api/events`` for as long
as it runs; requests go to ``/api/channels`` (one in ``--detail-every`` to a
channel's detail) ``--rate`` times a second, each on its own connection, and their
latencies (request sent to the last byte read) are written as JSON at the end,
with the number of events the streams received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time

REQUEST_TIMEOUT = 30.0


async def stream(port: int, events: list[int], index: int, stop: asyncio.Event) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /api/events HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n")
    await writer.drain()
    try:
        while not stop.is_set():
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"event: channels"):
                events[index] += 1
    finally:
        writer.close()


async def request(port: int, path: str) -> float:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    status = await reader.readline()
    await reader.read()  # until the server closes: the whole answer
    writer.close()
    if b" 200 " not in status:
        raise RuntimeError(f"{path}: {status!r}")
    return time.perf_counter() - started


async def run(args) -> dict:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if args.seconds:
        loop.call_later(args.seconds, stop.set)
    events = [0] * args.streams
    streams = [asyncio.create_task(stream(args.port, events, i, stop))
               for i in range(args.streams)]
    latencies: list[float] = []
    failures: list[str] = []

    async def timed(path: str) -> None:
        try:
            latencies.append(await asyncio.wait_for(request(args.port, path), REQUEST_TIMEOUT))
        except Exception as exc:  # counted: a refused or failed request is a result too
            failures.append(f"{type(exc).__name__}: {exc}"[:200])

    requests = []
    started = time.monotonic()
    while not stop.is_set():
        sent = len(requests)
        detail = args.detail_every and sent % args.detail_every == args.detail_every - 1
        requests.append(asyncio.create_task(
            timed(f"/api/channels/{args.channel}" if detail else "/api/channels")))
        next_at = started + (sent + 1) / args.rate
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
        except TimeoutError:
            pass
    await asyncio.gather(*requests)
    for task in streams:
        task.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
    return {"latencies": latencies, "failures": failures, "events": events}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--channel", default="x")
    parser.add_argument("--detail-every", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.out, "w") as out:
        json.dump(asyncio.run(run(args)), out)


if __name__ == "__main__":
    main()
