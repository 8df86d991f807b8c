"""An app on generated stubs for ``capsvc serve tests.apps.typed_echo_app:factory``.

Theory of operation: tests/apps/echo_app.py's Echo, written on the generated base
(capsvc.generated.echo_capnp): ``capsvc serve`` takes typed servers as well.
"""

from __future__ import annotations

from capsvc.generated.echo_capnp import Echo


class TypedEchoService(Echo.Server):
    """Echo: replies with what it was sent, prefixed."""

    def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        results.reply = "typed:" + params.msg

    async def pingData(
        self, params: Echo.PingDataParams.Reader, results: Echo.PingDataResults.Builder
    ) -> None:
        results.data = params.data


def factory() -> TypedEchoService:
    return TypedEchoService()
