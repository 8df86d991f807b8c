"""Messages too large to send fail their call, not the connection (rpc-twoparty, as C++'s
TwoPartyVatNetwork does: a peer with the same limit would abort the connection on one).

Over TCP on 127.0.0.1 through kitchen.capnp's generated stubs, with a small
``Limits.max_message_words`` on the side that sends: results over it are an exception
Return (a typed client, and the C++ reference's client, see ``Failed`` naming the limit),
params over it fail the call before it leaves, and the connection serves the next call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType
from typing import Any

import pytest
import trio

import capsvc
from tests.codegen.conftest import Generated
from tests.codegen.test_hierarchies_rpc import cpp_client_checks, sink_server
from tests.support.checks import assert_tables

SMALL = capsvc.Limits(max_message_words=4096)  # 32 KiB


def converter(k: ModuleType) -> object:
    class Converter(k.Converter.Server):  # type: ignore[misc, name-defined]
        def str(self, params: Any, results: Any) -> None:
            results.str = "x" * params.int

    return Converter()


@asynccontextmanager
async def serving(server: object, limits: capsvc.Limits | None) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(
            lambda task_status: capsvc.serve(
                "tcp:127.0.0.1:0", server, limits=limits, task_status=task_status
            )
        )
        yield address
        nursery.cancel_scope.cancel()


async def test_results_too_large_to_send_fail_that_call_only(generated: Generated) -> None:
    k = generated.kitchen
    async with serving(converter(k), SMALL) as address, capsvc.connect(address) as conn:
        convert = conn.bootstrap(k.Converter)
        assert (await convert.str(int=5)).str == "xxxxx"
        with pytest.raises(capsvc.Failed) as failed:
            await convert.str(int=100_000)
        reason = str(failed.value)
        assert "results could not be sent: the Return would be" in reason
        assert "over the limit of 4096 words (Limits.max_message_words)" in reason
        assert (await convert.str(int=3)).str == "xxx"  # the same connection


async def test_params_too_large_to_send_fail_before_leaving(generated: Generated) -> None:
    k = generated.kitchen
    sink = sink_server(k)()
    async with serving(sink, None) as address, capsvc.connect(address, limits=SMALL) as conn:
        client = conn.bootstrap(k.Sink)
        await client.write(chunk=b"\x00")
        with pytest.raises(capsvc.Failed) as failed:
            await client.write(chunk=b"\x01" * 100_000)
        reason = str(failed.value)
        assert reason.startswith("the call could not be sent: the Call would be 125")
        assert "(Limits.max_message_words)" in reason
        await client.write(chunk=b"\x01")  # in order: the big one never arrived
        got = await client.total()
        assert (got.bytes, got.writes) == (2, 2)
        assert sink.writes == 2
        await assert_tables(conn, imports=1)  # the Sink: no question or export left over


async def test_the_cpp_client_gets_an_exception_not_a_disconnect(generated: Generated) -> None:
    async with serving(converter(generated.kitchen), SMALL) as address:
        checks = await cpp_client_checks(address, "converter")
    assert checks == ["small", "oversized", "after"]
