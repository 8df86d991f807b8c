"""An app for ``capsvc serve tests.apps.echo_app:factory``: schemas/echo.capnp's Echo.

Theory of operation: the smallest possible capsvc app. ``factory`` builds the bootstrap
object; ``instance`` is a ready-made one (``module:instance`` works too); ``not_a_server``
and ``bad_factory`` exist so that the CLI's error paths can be tested.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import capsvc

ECHO: Any = capsvc.load_schema(Path(__file__).resolve().parents[2] / "schemas" / "echo.capnp")


class EchoService(capsvc.Server, interface=ECHO.Echo):
    """Echo: replies with what it was sent."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    async def ping(self, params: Any, results: Any) -> str:
        return self.prefix + str(params.msg)

    async def pingData(self, params: Any, results: Any) -> bytes:
        return bytes(params.data)


def factory() -> EchoService:
    return EchoService()


async def async_factory() -> EchoService:
    return EchoService(prefix="async:")


instance = EchoService(prefix="instance:")

not_a_server = 42


def bad_factory() -> object:
    return object()
