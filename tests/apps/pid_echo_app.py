"""An Echo that says which process answered, for ``capsvc serve --workers`` tests.

``ping(msg)`` replies ``"PID msg"``; a message ``sleep:MS`` first sleeps MS milliseconds
(a call that stays in flight, for drain tests). ``CAPSVC_TEST_FAIL_AT_START`` set makes
the factory raise: a worker whose app cannot start.
"""

from __future__ import annotations

import os

import trio

from capsvc.generated.echo_capnp import Echo


class PidEcho(Echo.Server):
    async def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        msg = params.msg
        if msg.startswith("sleep:"):
            await trio.sleep(int(msg[len("sleep:") :]) / 1000)
        results.reply = f"{os.getpid()} {msg}"


def factory() -> PidEcho:
    if os.environ.get("CAPSVC_TEST_FAIL_AT_START"):
        raise RuntimeError("this app refuses to start (CAPSVC_TEST_FAIL_AT_START)")
    return PidEcho()
