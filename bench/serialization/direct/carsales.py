"""carsales with direct segment access (specs/benchmarks.md §2; wire.py for the encoding).

Theory of operation
-------------------
Layouts (checked against schemas/bench/carsales.capnp at start-up by ``check_layout``):

- Car: 3 data words + 4 pointers. Bytes 0-1 color, 2 seats, 3 doors, 4-5 length, 6-7
  width, 8-9 height, 10 the four Bools (bit 0 hasPowerWindows, 1 hasPowerSteering, 2
  hasCruiseControl, 3 hasNavSystem), 11 cupHolders, 12-15 weight, 16-19 fuelCapacity,
  20-23 fuelLevel; pointers make, model, wheels, engine.
- Wheel: one word: diameter, snowTires (bit 16), airPressure at byte 4.
- Engine: one word: horsepower, cylinders, usesGas (bit 24), usesElectric (bit 25), cc.

The writer lays a request out in one segment: root pointer, the ParkingLot (one pointer),
the composite list's tag and the cars (7 words each), then per car, in car order, its
wheels (tag + 4 words), its engine and its two texts. Every pointer offset follows from
the running distance between a car and its tail block, so a car costs two
``Struct.pack`` calls. The client then reads every car back out of the finished segment
(upstream reads each car back from its builder, §2 "Request"), with the same code the
server uses: one ``iter_unpack`` over the car list, then one ``unpack_from`` for the four
wheels (with their list tag) and one for the engine, at offsets taken from the pointers.
The four Bools worth money are one byte here, so their contribution is one table look-up.
Pointers of other shapes (far, null, other counts) take the general slow path.
"""

from __future__ import annotations

import struct
from typing import Any

from bench.serialization import carsales
from bench.serialization.base import CheckFailed
from bench.serialization.direct.wire import (
    POINTER,
    LayoutError,
    Message,
    check_layout,
    composite_elements,
    list_target,
    root_struct,
    struct_target,
)

__all__ = ["DirectCarsales"]

_CAR_BITS = "bits:hasPowerWindows,hasPowerSteering,hasCruiseControl,hasNavSystem"
_CAR_WRITE = ("<HBBHHHBBIff" + "iI" * 4, (
    "color", "seats", "doors", "length", "width", "height", _CAR_BITS, "cupHolders",
    "weight", "fuelCapacity", "fuelLevel",
    "make", "make", "model", "model", "wheels", "wheels", "engine", "engine",
))  # fmt: skip
_CAR_READ = ("<2xBBHHHBB12x16xiIiI", (
    "seats", "doors", "length", "width", "height", _CAR_BITS, "cupHolders",
    "wheels", "wheels", "engine", "engine",
))  # fmt: skip
_WHEEL_WRITE = ("<HBxf", ("diameter", "bits:snowTires", "airPressure"))
_WHEEL_READ = ("<HB5x", ("diameter", "bits:snowTires"))
_ENGINE_WRITE = ("<HBBI", ("horsepower", "cylinders", "bits:usesGas,usesElectric", "cc"))
_ENGINE_READ = ("<HxB4x", ("horsepower", "bits:usesGas,usesElectric"))
_TOTAL = ("<Q", ("amount",))

_HEAD = struct.Struct("<iIiIiI")  # root pointer, ParkingLot.cars, the list's tag word
_RESPONSE = struct.Struct("<iIQ")  # root pointer + TotalValue
_WHEELS4 = struct.Struct("<iI" + _WHEEL_READ[0][1:] * 4)  # tag + four wheels, read side
_WHEELS_HI = (4 << 3) | 7  # composite list of 4 one-word elements
_WHEELS_TAG = 4 << 2  # 4 elements

# §2: hasPowerWindows +100, hasPowerSteering +200, hasCruiseControl +400, hasNavSystem +2000,
# indexed by the Bool byte (bits 0-3).
_BOOL_VALUE = tuple(
    100 * (b & 1) + 200 * (b >> 1 & 1) + 400 * (b >> 2 & 1) + 2000 * (b >> 3 & 1) for b in range(16)
)


class DirectCarsales:
    """carsales on raw segments; messages are ``list[bytes]`` (wire.Message when built)."""

    format = "capnp-direct"

    def __init__(self) -> None:
        schema = carsales.load_schema()
        self._lot_type = schema.ParkingLot
        self._total_type = schema.TotalValue
        self._lot_hi = check_layout(schema.ParkingLot, "<iI", ("cars", "cars"))
        self._car_hi = check_layout(schema.Car, *_CAR_WRITE)
        check_layout(schema.Car, *_CAR_READ)
        self._wheel_hi = check_layout(schema.Wheel, *_WHEEL_WRITE)
        check_layout(schema.Wheel, *_WHEEL_READ)
        self._engine_hi = check_layout(schema.Engine, *_ENGINE_WRITE)
        check_layout(schema.Engine, *_ENGINE_READ)
        self._total_hi = check_layout(schema.TotalValue, *_TOTAL)
        if (self._wheel_hi, self._engine_hi, self._total_hi) != (1, 1, 1):
            raise LayoutError("Wheel, Engine and TotalValue must be one data word each")
        self._car = struct.Struct(_CAR_WRITE[0])
        self._car_read = struct.Struct(_CAR_READ[0])
        self._wheel_read = struct.Struct(_WHEEL_READ[0])
        self._engine_read = struct.Struct(_ENGINE_READ[0])
        self._tails: dict[tuple[int, int], struct.Struct] = {}

    def _tail(self, make_words: int, model_words: int) -> struct.Struct:
        """A car's tail block: wheels tag + 4 wheels, engine, make and model texts."""
        tail = self._tails.get((make_words, model_words))
        if tail is None:
            tail = struct.Struct(
                "<iI" + _WHEEL_WRITE[0][1:] * 4 + _ENGINE_WRITE[0][1:]
                + f"{make_words * 8}s{model_words * 8}s"
            )  # fmt: skip
            self._tails[make_words, model_words] = tail
        return tail

    # ------------------------------------------------------------------ client

    def setup(self, inputs: tuple[tuple[Any, ...], ...]) -> tuple[Message, int]:
        count = len(inputs)
        car_pack = self._car.pack
        tails = self._tails
        cars = [_HEAD.pack(0, 1 << 16, 1, (7 * count) << 3 | 7, count << 2, self._car_hi)]
        append_car = cars.append
        blocks: list[bytes] = []
        append_block = blocks.append
        distance = 7 * count  # words from the current car to its tail block
        for (
            make, model, color, seats, doors,
            d0, p0, s0, d1, p1, s1, d2, p2, s2, d3, p3, s3,
            length, width, height, horsepower, cylinders, cc, uses_electric,
            capacity, level, windows, steering, cruise, cups, nav,
        ) in inputs:  # fmt: skip
            make_b = make.encode()
            model_b = model.encode()
            make_words = (len(make_b) + 8) >> 3  # text + NUL, padded to words
            model_words = (len(model_b) + 8) >> 3
            append_car(
                car_pack(
                    color, seats, doors, length, width, height,
                    windows | steering << 1 | cruise << 2 | nav << 3, cups,
                    length * width * height // 200,  # weight: no draw (§2 row 9)
                    capacity, level,
                    (distance + 2) << 2 | 1, (len(make_b) + 1) << 3 | 2,  # make -> tail + 6
                    (distance + 1 + make_words) << 2 | 1, (len(model_b) + 1) << 3 | 2,
                    (distance - 6) << 2 | 1, _WHEELS_HI,  # wheels -> tail + 0
                    (distance - 2) << 2, 1,  # engine -> tail + 5
                )
            )  # fmt: skip
            tail = tails.get((make_words, model_words)) or self._tail(make_words, model_words)
            append_block(
                tail.pack(
                    _WHEELS_TAG, 1,
                    d0, s0, p0, d1, s1, p1, d2, s2, p2, d3, s3, p3,
                    horsepower, cylinders, 1 | uses_electric << 1, cc,  # usesGas: always true
                    make_b, model_b,
                )
            )  # fmt: skip
            distance += 6 + make_words + model_words - 7
        cars += blocks
        message = Message([b"".join(cars)], self._lot_type)
        return message, self._lot_value(message)  # read the cars back (§2 "Request")

    # ------------------------------------------------------------------ server

    def handle(self, request: list[bytes]) -> Message:
        total = self._lot_value(request)
        return Message([_RESPONSE.pack(0, 1, total)], self._total_type)

    def check(self, response: list[bytes], expectation: int) -> None:
        seg, word = root_struct(response, self._total_hi)
        amount = 0 if word < 0 else struct.unpack_from("<Q", response[seg], word * 8)[0]
        if amount != expectation:
            raise CheckFailed(f"carsales: total {amount}, expected {expectation}")

    # ------------------------------------------------------------------ reading

    def _lot_value(self, segments: list[bytes]) -> int:
        """The sum of the car values (§2) of a ParkingLot message."""
        seg, word = root_struct(segments, self._lot_hi)
        if word < 0:
            return 0
        lo, hi = POINTER.unpack_from(segments[seg], word * 8)
        seg, word, hi = list_target(segments, seg, word, lo, hi)
        first, count = composite_elements(segments, seg, word, hi, self._car_hi)
        if not count:
            return 0
        buf = segments[seg]
        wheels4 = _WHEELS4.unpack_from
        engine_read = self._engine_read.unpack_from
        bool_value = _BOOL_VALUE
        total = 0
        car = first  # word of the current car
        with memoryview(buf) as view:
            cars = view[first * 8 : (first + 7 * count) * 8]
            for (
                seats, doors, length, width, height, bits, cups, wlo, whi, elo, ehi,
            ) in self._car_read.iter_unpack(cars):  # fmt: skip
                value = (
                    seats * 200 + doors * 350 + length * width * height // 50 + cups * 25
                    + bool_value[bits & 15]
                )  # fmt: skip
                if wlo & 3 == 1 and whi == _WHEELS_HI:
                    tag_lo, tag_hi, d0, s0, d1, s1, d2, s2, d3, s3 = wheels4(
                        buf, (car + 6 + (wlo >> 2)) * 8
                    )
                    if tag_lo != _WHEELS_TAG or tag_hi != 1:
                        value += self._wheels_value(segments, seg, car + 5, wlo, whi)
                    else:
                        value += d0 * d0 + d1 * d1 + d2 * d2 + d3 * d3
                        value += 100 * ((s0 & 1) + (s1 & 1) + (s2 & 1) + (s3 & 1))
                else:
                    value += self._wheels_value(segments, seg, car + 5, wlo, whi)
                if elo & 3 == 0 and ehi == 1:
                    horsepower, engine_bits = engine_read(buf, (car + 7 + (elo >> 2)) * 8)
                else:
                    horsepower, engine_bits = self._engine(segments, seg, car + 6, elo, ehi)
                value += horsepower * 40
                if engine_bits & 2:  # usesElectric
                    value += 5000 if engine_bits & 1 else 3000  # usesGas
                total += value
                car += 7
            del cars
        return total

    def _wheels_value(self, segments: list[bytes], seg: int, ptr: int, lo: int, hi: int) -> int:
        """Slow path: any wheel list (far pointer, null, any length)."""
        seg, word, hi = list_target(segments, seg, ptr, lo, hi)
        first, count = composite_elements(segments, seg, word, hi, 1)
        value = 0
        for index in range(count):
            diameter, snow = self._wheel_read.unpack_from(segments[seg], (first + index) * 8)
            value += diameter * diameter + (100 if snow & 1 else 0)
        return value

    def _engine(self, segments: list[bytes], seg: int, ptr: int, lo: int, hi: int) -> Any:
        """Slow path: an engine behind a far pointer, or a null one (all defaults)."""
        seg, word = struct_target(segments, seg, ptr, lo, hi, 1)
        if word < 0:
            return 0, 0
        return self._engine_read.unpack_from(segments[seg], word * 8)
