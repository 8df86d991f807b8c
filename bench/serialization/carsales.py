"""carsales, the "number-heavy" benchmark (specs/benchmarks.md §2).

Theory of operation
-------------------
A request is a parking lot of ``rand(200)`` cars, each filled from 31 draws in ordinal
order (§2 table). The client sums the cars' values and expects the server to return the
same total.

:func:`generate` consumes the RNG stream and returns, per iteration, a tuple of flat car
tuples holding the drawn values in draw order (:data:`CAR_INPUT_FIELDS`). The Float32
fields are rounded to float32 here, as storing them does upstream, so that ``fuelLevel``
is drawn from the *stored* capacity (§2 row 12) and so that every mode of every format
carries identical values. ``weight`` and ``usesGas`` take no draw and are set by
``setup``.

Both formats then follow upstream's client: fill one car, read it back to compute its
value (the reads are part of the timed work, §2 "Request"), next car. The value function
is :func:`car_value_of` (§2 "adds to value" column); the server applies it to every car
of the request it received.

- capnp: pycapnp builders and readers through the ``_set_by_field`` / ``_get_by_field``
  fast paths with field objects looked up once, nested builders hoisted into locals and
  the four wheels unrolled (§10 items 2 and 5).
- msgpack (§8): a car is an 18-item tuple, its wheels 3-item tuples and its engine a
  5-item tuple; ``use_single_float`` keeps Float32 fields 4 bytes. The response is a bare
  uint.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

from bench.serialization import schemas
from bench.serialization.base import CheckFailed

__all__ = [
    "CAR_INPUT_FIELDS",
    "MAKES",
    "MODELS",
    "MSGPACK_RAW",
    "MSGPACK_SINGLE_FLOAT",
    "REQUEST_TYPE",
    "RESPONSE_TYPE",
    "CapnpCarsales",
    "MsgpackCarsales",
    "car_value_of",
    "generate",
    "load_schema",
    "tuple_car_value",
]

REQUEST_TYPE = "ParkingLot"
RESPONSE_TYPE = "TotalValue"
MSGPACK_SINGLE_FLOAT = True  # §8: Float32 fields stay 4 bytes
MSGPACK_RAW = True  # make and model are never read: they stay bytes

MAKES = ("Toyota", "GM", "Ford", "Honda", "Tesla")  # §2 row 0
MODELS = ("Camry", "Prius", "Volt", "Accord", "Leaf", "Model S")  # §2 row 1

# The layout of one generated car, in draw order (§2 table). 31 values, 31 draws.
CAR_INPUT_FIELDS = (
    "make model color seats doors "
    "diameter0 airPressure0 snowTires0 diameter1 airPressure1 snowTires1 "
    "diameter2 airPressure2 snowTires2 diameter3 airPressure3 snowTires3 "
    "length width height horsepower cylinders cc usesElectric "
    "fuelCapacity fuelLevel hasPowerWindows hasPowerSteering hasCruiseControl "
    "cupHolders hasNavSystem"
).split()

_F32 = struct.Struct("<f")


def load_schema() -> Any:
    return schemas.load("carsales")


def _float32(value: float) -> float:
    """Round a double to the nearest float32, as storing it in a Float32 field does."""
    rounded: float = _F32.unpack(_F32.pack(value))[0]
    return rounded


def generate(draws: Iterator[int], iterations: int) -> list[tuple[tuple[Any, ...], ...]]:
    """The inputs of ``iterations`` requests: for each, a tuple of flat car tuples (§2)."""
    nxt = draws.__next__
    f32 = _float32
    makes, models = MAKES, MODELS
    requests = []
    for _ in range(iterations):
        cars = []
        for _ in range(nxt() % 200):  # §2 "Request": rand(200) cars
            make = makes[nxt() % 5]
            model = models[nxt() % 6]
            color = nxt() % 9
            seats = 2 + nxt() % 6
            doors = 2 + nxt() % 3
            wheels: list[Any] = []
            for _ in range(4):  # §2 row 5: diameter, airPressure, snowTires per wheel
                wheels.append(25 + nxt() % 15)
                wheels.append(f32(30 + nxt() * 20.0 / 4294967295.0))  # rand_double (§1.1)
                wheels.append(nxt() % 16 == 0)
            length = 170 + nxt() % 150
            width = 48 + nxt() % 36
            height = 54 + nxt() % 48
            horsepower = 100 * (nxt() % 400)
            cylinders = 4 + 2 * (nxt() % 3)
            cc = 800 + nxt() % 10000
            uses_electric = nxt() % 2 == 1
            capacity = f32(10 + nxt() * 30.0 / 4294967295.0)
            level = f32(nxt() * capacity / 4294967295.0)  # from the stored capacity (§2)
            cars.append(
                (
                    make,
                    model,
                    color,
                    seats,
                    doors,
                    *wheels,
                    length,
                    width,
                    height,
                    horsepower,
                    cylinders,
                    cc,
                    uses_electric,
                    capacity,
                    level,
                    nxt() % 2 == 1,  # hasPowerWindows
                    nxt() % 2 == 1,  # hasPowerSteering
                    nxt() % 2 == 1,  # hasCruiseControl
                    nxt() % 12,  # cupHolders
                    nxt() % 2 == 1,  # hasNavSystem
                )
            )
        requests.append(tuple(cars))
    return requests


def car_value_of(
    seats: int,
    doors: int,
    wheels: tuple[tuple[int, bool], ...],
    length: int,
    width: int,
    height: int,
    horsepower: int,
    uses_gas: bool,
    uses_electric: bool,
    power_windows: bool,
    power_steering: bool,
    cruise_control: bool,
    cup_holders: int,
    nav_system: bool,
) -> int:
    """The value of one car (§2 "adds to value"): the reference the fast paths inline."""
    value = seats * 200 + doors * 350
    for diameter, snow_tires in wheels:
        value += diameter * diameter + (100 if snow_tires else 0)
    value += length * width * height // 50
    value += horsepower * 40
    if uses_electric:
        value += 5000 if uses_gas else 3000
    if power_windows:
        value += 100
    if power_steering:
        value += 200
    if cruise_control:
        value += 400
    value += cup_holders * 25
    if nav_system:
        value += 2000
    return value


# --------------------------------------------------------------------------- msgpack


class MsgpackCarsales:
    """§8: a car is an 18-item tuple in ordinal order; wheels and engine nested tuples."""

    format = "msgpack"

    def setup(self, inputs: tuple[tuple[Any, ...], ...]) -> tuple[Any, int]:
        cars: list[tuple[Any, ...]] = []
        append = cars.append
        total = 0
        for (
            make,
            model,
            color,
            seats,
            doors,
            d0,
            p0,
            s0,
            d1,
            p1,
            s1,
            d2,
            p2,
            s2,
            d3,
            p3,
            s3,
            length,
            width,
            height,
            horsepower,
            cylinders,
            cc,
            uses_electric,
            capacity,
            level,
            windows,
            steering,
            cruise,
            cups,
            nav,
        ) in inputs:
            car = (
                make,
                model,
                color,
                seats,
                doors,
                ((d0, p0, s0), (d1, p1, s1), (d2, p2, s2), (d3, p3, s3)),
                length,
                width,
                height,
                length * width * height // 200,  # weight: no draw (§2 row 9)
                (horsepower, cylinders, cc, True, uses_electric),  # usesGas: always true
                capacity,
                level,
                windows,
                steering,
                cruise,
                cups,
                nav,
            )
            append(car)
            total += tuple_car_value(car)  # read the car back, as upstream (§2)
        return cars, total

    def handle(self, request: Any) -> int:
        total = 0
        for car in request:
            total += tuple_car_value(car)
        return total  # §8: TotalValue is a bare uint

    def check(self, response: Any, expectation: int) -> None:
        if response != expectation:
            raise CheckFailed(f"carsales: total {response!r}, expected {expectation}")


def tuple_car_value(car: Sequence[Any]) -> int:
    """The value of a car given as its 18 fields in schema order (§2 "adds to value"):
    msgpack's tuple (§8), or a generated ``Car.Row``."""
    (
        _make,
        _model,
        _color,
        seats,
        doors,
        wheels,
        length,
        width,
        height,
        _weight,
        engine,
        _capacity,
        _level,
        windows,
        steering,
        cruise,
        cups,
        nav,
    ) = car
    value = seats * 200 + doors * 350
    for diameter, _pressure, snow in wheels:
        value += diameter * diameter
        if snow:
            value += 100
    value += length * width * height // 50
    horsepower, _cylinders, _cc, uses_gas, uses_electric = engine
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


# --------------------------------------------------------------------------- capnp


class CapnpCarsales:
    """pycapnp with the by-field fast paths (§10 items 2, 3 and 5)."""

    format = "capnp"

    def __init__(self) -> None:
        schema = load_schema()
        self._lot_type = schema.ParkingLot
        self._total_type = schema.TotalValue
        car = schema.Car
        self._cars = schemas.field(schema.ParkingLot, "cars")
        self._amount = schemas.field(schema.TotalValue, "amount")
        f = {name: schemas.field(car, name) for name in car.schema.fields}
        self._car_fields = f
        self._wheel_fields = tuple(
            schemas.field(schema.Wheel, n) for n in ("diameter", "airPressure", "snowTires")
        )
        self._engine_fields = tuple(
            schemas.field(schema.Engine, n)
            for n in ("horsepower", "cylinders", "cc", "usesGas", "usesElectric")
        )
        self._value = self._make_value_function()

    def _make_value_function(self) -> Any:
        """The car value (§2) over a car builder or reader, fields bound as defaults."""
        f = self._car_fields
        diameter_f, _pressure_f, snow_f = self._wheel_fields
        horsepower_f, _cyl_f, _cc_f, gas_f, electric_f = self._engine_fields

        def value_of(
            car: Any,
            seats_f: Any = f["seats"],
            doors_f: Any = f["doors"],
            wheels_f: Any = f["wheels"],
            length_f: Any = f["length"],
            width_f: Any = f["width"],
            height_f: Any = f["height"],
            engine_f: Any = f["engine"],
            windows_f: Any = f["hasPowerWindows"],
            steering_f: Any = f["hasPowerSteering"],
            cruise_f: Any = f["hasCruiseControl"],
            cups_f: Any = f["cupHolders"],
            nav_f: Any = f["hasNavSystem"],
            diameter_f: Any = diameter_f,
            snow_f: Any = snow_f,
            horsepower_f: Any = horsepower_f,
            gas_f: Any = gas_f,
            electric_f: Any = electric_f,
        ) -> int:
            get = car._get_by_field
            value = get(seats_f) * 200 + get(doors_f) * 350
            for wheel in get(wheels_f):
                wget = wheel._get_by_field
                value += wget(diameter_f) ** 2
                if wget(snow_f):
                    value += 100
            value += get(length_f) * get(width_f) * get(height_f) // 50
            engine = get(engine_f)._get_by_field
            value += engine(horsepower_f) * 40
            if engine(electric_f):
                value += 5000 if engine(gas_f) else 3000
            if get(windows_f):
                value += 100
            if get(steering_f):
                value += 200
            if get(cruise_f):
                value += 400
            value += get(cups_f) * 25
            if get(nav_f):
                value += 2000
            return value

        return value_of

    def setup(self, inputs: tuple[tuple[Any, ...], ...]) -> tuple[Any, int]:
        f = self._car_fields
        make_f, model_f, color_f = f["make"], f["model"], f["color"]
        seats_f, doors_f, wheels_f = f["seats"], f["doors"], f["wheels"]
        length_f, width_f, height_f, weight_f = f["length"], f["width"], f["height"], f["weight"]
        engine_f, capacity_f, level_f = f["engine"], f["fuelCapacity"], f["fuelLevel"]
        windows_f, steering_f = f["hasPowerWindows"], f["hasPowerSteering"]
        cruise_f, cups_f, nav_f = f["hasCruiseControl"], f["cupHolders"], f["hasNavSystem"]
        diameter_f, pressure_f, snow_f = self._wheel_fields
        horsepower_f, cylinders_f, cc_f, gas_f, electric_f = self._engine_fields
        value_of = self._value

        message = self._lot_type.new_message()
        cars = message._init_by_field(self._cars, len(inputs))
        total = 0
        index = 0
        for (
            make,
            model,
            color,
            seats,
            doors,
            d0,
            p0,
            s0,
            d1,
            p1,
            s1,
            d2,
            p2,
            s2,
            d3,
            p3,
            s3,
            length,
            width,
            height,
            horsepower,
            cylinders,
            cc,
            uses_electric,
            capacity,
            level,
            windows,
            steering,
            cruise,
            cups,
            nav,
        ) in inputs:
            car = cars[index]
            index += 1
            put = car._set_by_field
            put(make_f, make)
            put(model_f, model)
            put(color_f, color)
            put(seats_f, seats)
            put(doors_f, doors)
            wheels = car._init_by_field(wheels_f, 4)
            wheel = wheels[0]._set_by_field
            wheel(diameter_f, d0)
            wheel(pressure_f, p0)
            wheel(snow_f, s0)
            wheel = wheels[1]._set_by_field
            wheel(diameter_f, d1)
            wheel(pressure_f, p1)
            wheel(snow_f, s1)
            wheel = wheels[2]._set_by_field
            wheel(diameter_f, d2)
            wheel(pressure_f, p2)
            wheel(snow_f, s2)
            wheel = wheels[3]._set_by_field
            wheel(diameter_f, d3)
            wheel(pressure_f, p3)
            wheel(snow_f, s3)
            put(length_f, length)
            put(width_f, width)
            put(height_f, height)
            put(weight_f, length * width * height // 200)  # no draw (§2 row 9)
            engine = car._init_by_field(engine_f)._set_by_field
            engine(horsepower_f, horsepower)
            engine(cylinders_f, cylinders)
            engine(cc_f, cc)
            engine(gas_f, True)  # no draw (§2 row 10)
            engine(electric_f, uses_electric)
            put(capacity_f, capacity)
            put(level_f, level)
            put(windows_f, windows)
            put(steering_f, steering)
            put(cruise_f, cruise)
            put(cups_f, cups)
            put(nav_f, nav)
            total += value_of(car)  # read the car back, as upstream (§2 "Request")
        return message, total

    def handle(self, request: Any) -> Any:
        value_of = self._value
        total = 0
        for car in request._get_by_field(self._cars):
            total += value_of(car)
        response = self._total_type.new_message()
        response._set_by_field(self._amount, total)
        return response

    def check(self, response: Any, expectation: int) -> None:
        amount = response._get_by_field(self._amount)
        if amount != expectation:
            raise CheckFailed(f"carsales: total {amount}, expected {expectation}")
