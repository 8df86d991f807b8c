"""carsales through the generated codecs (``capsvc gen schemas/bench/carsales.capnp``).

Theory of operation
-------------------
Two ways a user of ``capsvc gen`` writes it, both through the generated API only:

- ``capsvc`` (``CapsvcCarsales``), whole structs at a time: a car is its generated
  ``Car.Row``, the tuple of its 18 fields in schema order (the shape the msgpack format
  sends, specs/benchmarks.md §8); the request is ``ParkingLot.new_message(cars=rows)``.
  Every read is one ``VALUE_FIELDS.rows(lot.cars)`` call (capsvc.codec.rows): a
  ``Car.select`` of the fields a car's value needs, as upstream's ``carValue`` reads only
  those (the msgpack format leaves make and model undecoded for the same reason), then
  the arithmetic on tuples (``selected_car_value``).
- ``capsvc-fields`` (``CapsvcFieldsCarsales``), a field at a time: the request is built in one
``ParkingLot.new_message(cars=[...])`` from plain values (a dict per car, its wheels and
its engine: the generated ``Init`` types, what pycapnp's ``new_message`` takes too), which
the value encoder (capsvc.codec.values) writes straight into the message; the server and
the client's read-back (upstream reads every car back, specs/benchmarks.md §2 "Request")
use the generated readers' properties. No offsets, no ``struct`` formats: everything below
the generated API is capsvc's runtime.
"""

from __future__ import annotations

from typing import Any

from bench.serialization.base import CheckFailed
from bench.serialization.generated.carsales_capnp import Car, Engine, ParkingLot, TotalValue

__all__ = ["VALUE_FIELDS", "CapsvcCarsales", "CapsvcFieldsCarsales", "lot_value"]

#: What a car's value is made of (§2 "adds to value"), read as one row per car.
VALUE_FIELDS = Car.select(
    "seats", "doors", "length", "width", "height",
    "hasPowerWindows", "hasPowerSteering", "hasCruiseControl", "cupHolders", "hasNavSystem",
    wheels=("diameter", "snowTires"),
    engine=Engine.select("horsepower", "usesGas", "usesElectric"),
)  # fmt: skip


def selected_car_value(car: tuple[Any, ...]) -> int:
    """The value of a car given as its ``VALUE_FIELDS`` row (§2 "adds to value")."""
    (
        seats, doors, wheels, length, width, height, engine,
        windows, steering, cruise, cups, nav,
    ) = car  # fmt: skip
    value = seats * 200 + doors * 350
    for diameter, snow in wheels:
        value += diameter * diameter
        if snow:
            value += 100
    value += length * width * height // 50
    horsepower, uses_gas, uses_electric = engine
    value += horsepower * 40
    if uses_electric:
        value += 5000 if uses_gas else 3000
    if windows:
        value += 100
    if steering:
        value += 200
    if cruise:
        value += 400
    value += cups * 25
    if nav:
        value += 2000
    return value


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
    """carsales on generated rows: one call builds the request, one reads the fields of
    its cars that their values need."""

    format = "capsvc"

    def setup(self, inputs: tuple[tuple[Any, ...], ...]) -> tuple[ParkingLot.Builder, int]:
        cars: list[Car.Row] = [
            (
                make, model, color, seats, doors,
                [(d0, p0, s0), (d1, p1, s1), (d2, p2, s2), (d3, p3, s3)],
                length, width, height,
                length * width * height // 200,  # weight: no draw (§2 row 9)
                (horsepower, cylinders, cc, True, uses_electric),  # usesGas: always (row 10)
                capacity, level, windows, steering, cruise, cups, nav,
            )
            for (
                make, model, color, seats, doors,
                d0, p0, s0, d1, p1, s1, d2, p2, s2, d3, p3, s3,
                length, width, height, horsepower, cylinders, cc, uses_electric,
                capacity, level, windows, steering, cruise, cups, nav,
            ) in inputs
        ]  # fmt: skip
        lot = ParkingLot.new_message(cars=cars)
        # Upstream reads each car back from the builder (§2 "Request"): here once the lot
        # is complete, from the finished message.
        return lot, sum(map(selected_car_value, VALUE_FIELDS.rows(lot.as_reader().cars)))

    def handle(self, request: ParkingLot.Reader) -> TotalValue.Builder:
        return TotalValue.new_message(
            amount=sum(map(selected_car_value, VALUE_FIELDS.rows(request.cars)))
        )

    def check(self, response: TotalValue.Reader, expectation: int) -> None:
        amount = response.amount
        if amount != expectation:
            raise CheckFailed(f"carsales: total {amount}, expected {expectation}")


class CapsvcFieldsCarsales:
    """carsales on generated builders and readers a field at a time."""

    format = "capsvc-fields"

    def setup(self, inputs: tuple[tuple[Any, ...], ...]) -> tuple[ParkingLot.Builder, int]:
        lot = ParkingLot.new_message(
            cars=[
                {
                    "make": make, "model": model, "color": color, "seats": seats, "doors": doors,
                    "wheels": [
                        {"diameter": d0, "airPressure": p0, "snowTires": s0},
                        {"diameter": d1, "airPressure": p1, "snowTires": s1},
                        {"diameter": d2, "airPressure": p2, "snowTires": s2},
                        {"diameter": d3, "airPressure": p3, "snowTires": s3},
                    ],
                    "length": length, "width": width, "height": height,
                    "weight": length * width * height // 200,  # no draw (§2 row 9)
                    "engine": {
                        "horsepower": horsepower, "cylinders": cylinders, "cc": cc,
                        "usesGas": True,  # no draw (§2 row 10)
                        "usesElectric": uses_electric,
                    },
                    "fuelCapacity": capacity, "fuelLevel": level, "hasPowerWindows": windows,
                    "hasPowerSteering": steering, "hasCruiseControl": cruise,
                    "cupHolders": cups, "hasNavSystem": nav,
                }
                for (
                    make, model, color, seats, doors,
                    d0, p0, s0, d1, p1, s1, d2, p2, s2, d3, p3, s3,
                    length, width, height, horsepower, cylinders, cc, uses_electric,
                    capacity, level, windows, steering, cruise, cups, nav,
                ) in inputs
            ]
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
