"""A pure-Python MQTT 3.1.1 broker (amqtt) for the demo when Mosquitto is not installed.

``python -m collector.tools.embedded_broker --port 1883`` serves anonymous clients
on 127.0.0.1 until SIGTERM.  For demos and tests only: no TLS, no ACL, no
MQTT 5 (the collector is configured with ``mqtt_version = "3.1.1"``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal


async def serve(host: str, port: int) -> None:
    from amqtt.broker import Broker

    broker = Broker({
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin":
                    {"allow_anonymous": True}},
    })
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logging.getLogger(__name__).info("embedded MQTT broker on %s:%d", host, port)
    await stop.wait()
    await broker.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        import amqtt  # noqa: F401
    except ImportError:
        raise SystemExit("the embedded broker needs amqtt: pip install 'edge-ldp[demo]' "
                         "(or install Mosquitto, or pass --broker HOST:PORT)") from None
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
