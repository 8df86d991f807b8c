"""Struct wrappers: capabilities at every depth, read back locally and after the wire."""

from __future__ import annotations

import gc
from typing import Any

import trio
import trio.testing

import capsvc
from tests.test_connection import Counter, testing


class Holding(capsvc.Server, interface=testing.Tester):
    async def holdCaps(self, params: Any, results: Any) -> None:
        holder = results.init("holder")
        holder.name = "made"
        holder.cap = Counter(10)
        holder.choice.counter = Counter(20)
        holder.extra.callback = None
        inner = holder.init("inner")
        inner.cap = Counter(30)
        holder.caps = [Counter(1), None, Counter(3)]
        items = holder.init("items", 2)
        items[1].cap = Counter(40)


async def check_holder(holder: Any) -> None:
    assert holder.name == "made"
    assert holder._has("cap")
    assert holder.choice.which() == "counter"
    assert (await holder.cap.increment(by=1)).value == 11
    assert (await holder.choice.counter.increment(by=1)).value == 21
    assert (await holder.inner.cap.increment(by=1)).value == 31
    caps = holder.caps
    assert len(caps) == 3
    assert (await caps[2].increment(by=1)).value == 4
    assert (await holder.items[1].cap.increment(by=1)).value == 41
    assert not holder.items[0]._has("cap")


async def test_local_results_show_their_capabilities() -> None:
    tester = capsvc.capability(Holding(), testing.Tester)
    await check_holder((await tester.holdCaps()).holder)


async def test_results_over_the_wire_show_their_capabilities() -> None:
    left, right = trio.testing.memory_stream_pair()
    async with (
        capsvc.open_connection(left, bootstrap=Holding()),
        capsvc.open_connection(right) as client,
    ):
        tester = client.bootstrap(testing.Tester)
        await check_holder((await tester.holdCaps()).holder)
        del tester
        gc.collect()
        # In-memory streams: once every task is blocked, every Release has been delivered
        # (no timer, no socket); no duration to guess.
        await trio.testing.wait_all_tasks_blocked()
        assert client.session.tables_empty(), client.session.table_sizes()


async def test_setting_another_union_member_forgets_the_capability() -> None:
    class Switching(capsvc.Server, interface=testing.Tester):
        async def holdCaps(self, params: Any, results: Any) -> None:
            holder = results.init("holder")
            holder.choice.counter = Counter(1)
            holder.choice.text = "plain text wins"

    tester = capsvc.capability(Switching(), testing.Tester)
    holder = (await tester.holdCaps()).holder
    assert holder.choice.which() == "text"
    assert holder.choice.text == "plain text wins"
