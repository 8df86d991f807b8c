"""A capsvc server on a nic: address, in its own process (for the two-process tests).

    python -m tests.nic.nic_server ADDRESS demo|echo

Prints ``LISTENING`` once the device is up, serves until SIGTERM/SIGINT. It does what
``capsvc serve --listen nic:...`` will do once the scheme is wired into
capsvc.transport (it calls capsvc.transport.nic.listen_nic directly).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import trio

from capsvc import demo
from capsvc.api import _bootstrap_hook
from capsvc.connection import Connection
from capsvc.transport.nic import listen_nic


async def serve(address: str, app: str) -> None:
    bootstrap: Any
    if app == "demo":
        bootstrap = demo.bootstrap()
    else:
        from tests.apps.echo_app import EchoService

        bootstrap = EchoService()
    hook = _bootstrap_hook(bootstrap)
    assert hook is not None
    listeners = await listen_nic(address)

    async def handle(stream: trio.abc.Stream) -> None:
        await Connection(stream, hook.add_ref()).run()

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handle, listeners)
            print("LISTENING", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


if __name__ == "__main__":
    trio.run(serve, sys.argv[1], sys.argv[2])
