"""User mistakes on the dynamic (``load_schema``) path are Python errors in schema terms,
never pycapnp's C++ text with stack addresses (issue 9 item 5; capsvc.mistakes,
capsvc.checked). The generated path's are tested in tests/codegen and
tests/interop/test_generated_stubs.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import capsvc
from bench.serialization.schemas import load
from capsvc.checked import Checked, CheckedList
from tests.support.tester import TesterImpl, echo_schema, testing


@asynccontextmanager
async def served(server: Any) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        yield await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", server)
        nursery.cancel_scope.cancel()


def echo_client() -> capsvc.Client:
    return capsvc.client.null_client(echo_schema.Echo)


def test_unknown_keyword_names_the_method_and_its_parameters() -> None:
    with pytest.raises(
        TypeError, match=r"^Echo\.ping\(\) has no parameter kee; its parameters are msg$"
    ):
        echo_client().ping(kee="x")


def test_positional_arguments_are_refused() -> None:
    with pytest.raises(
        TypeError, match=r"^Echo\.ping\(\) takes keyword arguments only \(1 positional"
    ):
        echo_client().ping("x")


def test_wrong_type_names_the_field_and_the_schema_type() -> None:
    with pytest.raises(TypeError, match=r"^Echo\.ping\$Params\.msg: expected Text, got int$"):
        echo_client().ping(msg=5)


def test_request_params_are_checked_too() -> None:
    request = echo_client().ping_request()
    with pytest.raises(
        TypeError, match=r"^Echo\.ping\$Params has no field kee; its fields are msg$"
    ):
        request.params.kee = "x"
    with pytest.raises(TypeError, match=r"^Echo\.ping\$Params\.msg: expected Text, got int$"):
        request.params.msg = 3
    with pytest.raises(TypeError, match=r"^Echo\.ping\$Params\.msg: expected Text, got float$"):
        request.msg = 1.5
    with pytest.raises(AttributeError, match=r"^Echo\.ping\$Params has no field kee"):
        request.params.kee  # noqa: B018 (the read is the test)
    request.params.msg = "fine"
    assert request.params.msg == "fine"


def test_structs_holding_capabilities_are_checked() -> None:
    client = capsvc.client.null_client(testing.Tester)
    request = client.holdCaps_request()
    with pytest.raises(TypeError, match=r"^Holder has no field nmae; its fields are name, cap,"):
        request.params.holder.nmae = "x"
    with pytest.raises(TypeError, match=r"^Holder\.name: expected Text, got int$"):
        request.params.holder.name = 7
    with pytest.raises(TypeError, match=r"^Holder\.inner: expected Holder, got str$"):
        request.params.holder.inner = "x"


def test_nested_structs_and_lists_of_structs_are_checked_views() -> None:
    carsales = load("carsales")
    car = Checked(carsales.Car.new_message(), carsales.Car.schema)
    engine = car.init("engine")
    assert isinstance(engine, Checked)
    with pytest.raises(TypeError, match=r"^Engine has no field horsepowr; its fields are"):
        engine.horsepowr = 5
    with pytest.raises(TypeError, match=r"^Engine\.horsepower: expected UInt16, got str$"):
        engine.horsepower = "many"
    with pytest.raises(TypeError, match=r"^Car has no field wheel; its fields are make,"):
        car.init("wheel", 4)
    wheels = car.init("wheels", 2)
    assert isinstance(wheels, CheckedList)
    with pytest.raises(TypeError, match=r"^Wheel\.snowTires: expected Bool, got str$"):
        wheels[0].snowTires = "yes"
    with pytest.raises(IndexError, match=r"^list index 2 out of range \(2 elements\)$"):
        wheels[2]
    wheels[1].diameter = 17
    reader = Checked(car._raw.as_reader(), carsales.Car.schema)
    assert [w.diameter for w in reader.wheels] == [0, 17]
    with pytest.raises(AttributeError, match=r"^Car has no field colour; its fields are"):
        reader.colour  # noqa: B018
    # A checked reader given to a builder is unwrapped for pycapnp.
    other = Checked(carsales.Car.new_message(), carsales.Car.schema)
    other.engine = engine
    assert other.engine.horsepower == 0


async def test_mistakes_in_a_server_method_reach_the_caller_without_cpp_text() -> None:
    class Sloppy(capsvc.Server, interface=echo_schema.Echo):
        def ping(self, params: Any, results: Any) -> None:
            results.replay = params.msg

    async with served(Sloppy()) as address, capsvc.connect(address) as conn:
        echo = conn.bootstrap(echo_schema.Echo)
        with pytest.raises(capsvc.Failed) as failed:
            await echo.ping(msg="x")
    reason = str(failed.value)
    assert "Echo.ping$Results has no field replay; its fields are reply" in reason
    assert ".c++" not in reason
    assert "stack:" not in reason


async def test_the_calls_still_work() -> None:
    async with served(TesterImpl()) as address, capsvc.connect(address) as conn:
        tester = conn.bootstrap(testing.Tester)
        assert (await tester.echo(msg="ok")).reply == "ok"
        holder = await tester.holdCaps(holder={"name": "h"})
        assert holder.holder.name == "h"
