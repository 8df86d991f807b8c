"""carsales through the generated codecs (``capsvc gen schemas/bench/carsales.capnp``).

Theory of operation
-------------------
This is the code a user of ``capsvc gen`` writes: ``ParkingLot.new_message()``,
``init_cars(n)``, then per car one ``assign(...)`` (the generated constructor-style setter:
the whole data section in one pack), ``init_wheels(4)`` and ``init_engine()`` with an
``assign`` each; the server and the client's read-back (upstream reads every car back,
specs/benchmarks.md §2 "Request") use the generated readers' properties. No offsets, no
``struct`` formats: everything below the generated API is capsvc's runtime.
"""

from __future__ import annotations

from typing import Any

from bench.serialization.base import CheckFailed
from bench.serialization.generated.carsales_capnp import Car, ParkingLot, TotalValue

__all__ = ["CapsvcCarsales", "lot_value"]


def car_value(car: Car.Reader) -> int:
    """The value of one car (§2 "adds to value")."""
    value = car.seats * 200 + car.doors * 350
    for wheel in car.wheels:
        diameter = wheel.diameter
        value += diameter * diameter
        if wheel.snowTires:
            value += 100
    value += car.length * car.width * car.height // 50
    engine = car.engine
    value += engine.horsepower * 40
    if engine.usesElectric:
        value += 5000 if engine.usesGas else 3000
    if car.hasPowerWindows:
        value += 100
    if car.hasPowerSteering:
        value += 200
    if car.hasCruiseControl:
        value += 400
    value += car.cupHolders * 25
    if car.hasNavSystem:
        value += 2000
    return value


def lot_value(lot: ParkingLot.Reader) -> int:
    """The sum of the car values of a parking lot (the server's work, §2)."""
    return sum(map(car_value, lot.cars))


class CapsvcCarsales:
    """carsales on generated builders and readers; messages are builders / readers."""

    format = "capsvc"

    def setup(self, inputs: tuple[tuple[Any, ...], ...]) -> tuple[ParkingLot.Builder, int]:
        lot = ParkingLot.new_message()
        cars = lot.init_cars(len(inputs))
        for car, (
            make, model, color, seats, doors,
            d0, p0, s0, d1, p1, s1, d2, p2, s2, d3, p3, s3,
            length, width, height, horsepower, cylinders, cc, uses_electric,
            capacity, level, windows, steering, cruise, cups, nav,
        ) in zip(cars, inputs, strict=True):  # fmt: skip
            car.assign(
                make=make, model=model, color=color, seats=seats, doors=doors,
                length=length, width=width, height=height,
                weight=length * width * height // 200,  # no draw (§2 row 9)
                fuelCapacity=capacity, fuelLevel=level, hasPowerWindows=windows,
                hasPowerSteering=steering, hasCruiseControl=cruise, cupHolders=cups,
                hasNavSystem=nav,
            )  # fmt: skip
            wheel0, wheel1, wheel2, wheel3 = car.init_wheels(4)
            wheel0.assign(diameter=d0, airPressure=p0, snowTires=s0)
            wheel1.assign(diameter=d1, airPressure=p1, snowTires=s1)
            wheel2.assign(diameter=d2, airPressure=p2, snowTires=s2)
            wheel3.assign(diameter=d3, airPressure=p3, snowTires=s3)
            car.init_engine().assign(
                horsepower=horsepower, cylinders=cylinders, cc=cc,
                usesGas=True,  # no draw (§2 row 10)
                usesElectric=uses_electric,
            )  # fmt: skip
        # Upstream reads each car back from the builder (§2 "Request"): here once the lot
        # is complete, through a reader of the finished message.
        return lot, lot_value(lot.as_reader())

    def handle(self, request: ParkingLot.Reader) -> TotalValue.Builder:
        response = TotalValue.new_message()
        response.amount = lot_value(request)
        return response

    def check(self, response: TotalValue.Reader, expectation: int) -> None:
        amount = response.amount
        if amount != expectation:
            raise CheckFailed(f"carsales: total {amount}, expected {expectation}")
