"""Codec microbenchmarks: generated readers and builders (``capsvc gen``) against pycapnp.

    python -m bench codec [pyperf options]        e.g. --fast, -o codec.json

Theory of operation: the struct is carsales' ``Car`` (schemas/bench/carsales.capnp: text,
enum, numbers of four widths, bools, a nested struct and a list of four structs), the
values are a typical car. Its module is the serialization suite's checked-in generated
one (bench/serialization/generated, kept fresh by a test). Each benchmark is
a pyperf ``bench_time_func``; field reads repeat the read ten times per loop iteration,
and the figure is per read (loop overhead included, so the true cost is a little lower).
pycapnp is measured through its public attribute API and, for reads, also through its
private fast path ``_get_by_field`` with the field object looked up once (as the
serialization suite does). The parent prints each pair's ratio at the end; the machine's
CPU model, cpuidle state and load go into the output's metadata and the summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyperf

import capsvc
from bench.serialization.generated import carsales_capnp
from bench.serialization.schemas import load

READS = 10  # reads per loop iteration


gen: Any = carsales_capnp
ref: Any = load("carsales")  # pycapnp's module, shared with the serialization suite


def build_generated() -> bytes:
    car = gen.Car.new_message()
    car.make = "Toyota"
    car.model = "Camry"
    car.color = gen.Color.blue
    car.seats = 5
    car.doors = 4
    car.length = 190
    car.width = 72
    car.height = 58
    car.weight = 3200
    car.fuelCapacity = 15.5
    car.fuelLevel = 7.25
    car.hasPowerWindows = True
    car.hasPowerSteering = True
    car.hasCruiseControl = False
    car.cupHolders = 6
    car.hasNavSystem = True
    engine = car.init_engine()
    engine.horsepower = 200
    engine.cylinders = 6
    engine.cc = 3500
    engine.usesGas = True
    engine.usesElectric = False
    for wheel in car.init_wheels(4):
        wheel.diameter = 18
        wheel.airPressure = 32.5
        wheel.snowTires = False
    return car.to_bytes()


def build_pycapnp() -> bytes:
    car = ref.Car.new_message()
    car.make = "Toyota"
    car.model = "Camry"
    car.color = "blue"
    car.seats = 5
    car.doors = 4
    car.length = 190
    car.width = 72
    car.height = 58
    car.weight = 3200
    car.fuelCapacity = 15.5
    car.fuelLevel = 7.25
    car.hasPowerWindows = True
    car.hasPowerSteering = True
    car.hasCruiseControl = False
    car.cupHolders = 6
    car.hasNavSystem = True
    engine = car.init("engine")
    engine.horsepower = 200
    engine.cylinders = 6
    engine.cc = 3500
    engine.usesGas = True
    engine.usesElectric = False
    for wheel in car.init("wheels", 4):
        wheel.diameter = 18
        wheel.airPressure = 32.5
        wheel.snowTires = False
    return bytes(car.to_bytes())


_WHEEL = {"diameter": 18, "airPressure": 32.5, "snowTires": False}


def build_generated_fields() -> bytes:
    """The same Car in the constructor form: ``new_message(**fields)``, nested structs as
    dicts (capsvc.codec.values writes the whole tree), as pycapnp's form below."""
    car = gen.Car.new_message(
        make="Toyota", model="Camry", color=gen.Color.blue, seats=5, doors=4,
        length=190, width=72, height=58, weight=3200, fuelCapacity=15.5, fuelLevel=7.25,
        hasPowerWindows=True, hasPowerSteering=True, hasCruiseControl=False,
        cupHolders=6, hasNavSystem=True,
        engine={"horsepower": 200, "cylinders": 6, "cc": 3500, "usesGas": True},
        wheels=[_WHEEL, _WHEEL, _WHEEL, _WHEEL],
    )  # fmt: skip
    return car.to_bytes()


def build_pycapnp_kwargs() -> bytes:
    """pycapnp's constructor form: ``new_message(**fields)``, nested structs as dicts."""
    car = ref.Car.new_message(
        make="Toyota", model="Camry", color="blue", seats=5, doors=4,
        length=190, width=72, height=58, weight=3200, fuelCapacity=15.5, fuelLevel=7.25,
        hasPowerWindows=True, hasPowerSteering=True, hasCruiseControl=False,
        cupHolders=6, hasNavSystem=True,
        engine={"horsepower": 200, "cylinders": 6, "cc": 3500, "usesGas": True},
        wheels=[_WHEEL, _WHEEL, _WHEEL, _WHEEL],
    )  # fmt: skip
    return bytes(car.to_bytes())


MESSAGE = build_generated()
assert MESSAGE == build_pycapnp(), "the two builders must make the same bytes"
# The constructor forms allocate in another order: the same values, not the same bytes.
with ref.Car.from_bytes(MESSAGE) as _reference:
    _VALUES = _reference.to_dict()
for _build in (build_generated_fields, build_pycapnp_kwargs):
    with ref.Car.from_bytes(_build()) as _built:
        assert _built.to_dict() == _VALUES, _build.__name__


def read_all_generated(data: bytes) -> int:
    car = gen.Car.from_bytes(data)
    total = car.seats + car.doors + car.length + car.width + car.height + car.weight
    total += car.cupHolders + int(car.color) + len(car.make) + len(car.model)
    total += int(car.fuelCapacity + car.fuelLevel)
    total += car.hasPowerWindows + car.hasPowerSteering + car.hasCruiseControl + car.hasNavSystem
    engine = car.engine
    total += engine.horsepower + engine.cylinders + engine.cc + engine.usesGas
    for wheel in car.wheels:
        total += wheel.diameter + int(wheel.airPressure) + wheel.snowTires
    return total


def read_all_generated_row(data: bytes) -> int:
    """The same sum from the car read whole as a row (``Car.row``, capsvc.codec.rows)."""
    (
        make, model, color, seats, doors, wheels, length, width, height, weight, engine,
        capacity, level, windows, steering, cruise, cups, nav,
    ) = gen.Car.row(gen.Car.from_bytes(data))  # fmt: skip
    total = seats + doors + length + width + height + weight
    total += cups + int(color) + len(make) + len(model)
    total += int(capacity + level)
    total += windows + steering + cruise + nav
    assert engine is not None
    horsepower, cylinders, cc, uses_gas, _electric = engine
    total += horsepower + cylinders + cc + uses_gas
    for diameter, pressure, snow in wheels:
        total += diameter + int(pressure) + snow
    return total


def read_all_pycapnp(data: bytes) -> int:
    with ref.Car.from_bytes(data) as car:
        total = car.seats + car.doors + car.length + car.width + car.height + car.weight
        total += car.cupHolders + car.color.raw + len(car.make) + len(car.model)
        total += int(car.fuelCapacity + car.fuelLevel)
        total += car.hasPowerWindows + car.hasPowerSteering + car.hasCruiseControl
        total += car.hasNavSystem
        engine = car.engine
        total += engine.horsepower + engine.cylinders + engine.cc + engine.usesGas
        for wheel in car.wheels:
            total += wheel.diameter + int(wheel.airPressure) + wheel.snowTires
        return int(total)


assert read_all_generated(MESSAGE) == read_all_pycapnp(MESSAGE) == read_all_generated_row(MESSAGE)


# ---------------------------------------------------------------------- timed functions
def field_reads(reader: Any, name: str) -> Callable[[int], float]:
    """Ten reads of ``reader.<name>`` per loop iteration (a compiled loop body)."""
    body = "\n".join(f"        reader.{name}" for _ in range(READS))
    source = (
        "def timed(loops, reader, clock):\n"
        "    start = clock()\n"
        "    for _ in range(loops):\n"
        f"{body}\n"
        "    return clock() - start\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<read {name}>", "exec"), namespace)
    timed = namespace["timed"]
    return lambda loops: timed(loops, reader, time.perf_counter)


def fast_reads(reader: Any, name: str) -> Callable[[int], float]:
    """pycapnp's private fast path: ``_get_by_field`` with the field looked up once."""
    field = reader.schema.fields[name]
    get = reader._get_by_field
    body = "\n".join("        get(field)" for _ in range(READS))
    source = (
        "def timed(loops, get, field, clock):\n"
        "    start = clock()\n"
        "    for _ in range(loops):\n"
        f"{body}\n"
        "    return clock() - start\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<fast read {name}>", "exec"), namespace)
    timed = namespace["timed"]
    return lambda loops: timed(loops, get, field, time.perf_counter)


def calls(function: Callable[[], object]) -> Callable[[int], float]:
    def timed(loops: int) -> float:
        start = time.perf_counter()
        for _ in range(loops):
            function()
        return time.perf_counter() - start

    return timed


FIELDS = [
    ("uint8", "seats"),
    ("float32", "fuelLevel"),
    ("bool", "hasNavSystem"),
    ("enum", "color"),
    ("text", "make"),
    ("struct", "engine"),
]


def machine_state() -> dict[str, str]:
    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return "n/a"

    model = "n/a"
    for line in read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "cpu_model": model,
        "cpuidle_driver": read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "cpuidle_governor": read("/sys/devices/system/cpu/cpuidle/current_governor_ro"),
        "haltpoll_ns": read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
        "loadavg": read("/proc/loadavg"),
        # Which capsvc build ran: mypyc-compiled codec runtime, or pure Python (CAPSVC_PURE=1).
        "capsvc_build": "compiled" if capsvc.COMPILED else "pure",
    }


#: A traversal limit no benchmark loop exhausts (words).
UNLIMITED = 1 << 62


def main() -> None:
    # Workers run this module as ``python -m bench.codec`` from the same directory (pyperf
    # would otherwise run the file as a script, where ``bench`` is not importable).
    runner = pyperf.Runner(program_args=("-m", "bench.codec"))
    for key, value in machine_state().items():
        runner.metadata[key] = value
    # The field-read loops read one message millions of times: both readers get a
    # traversal limit that cannot run out (each read of a pointer field is charged
    # against it, as libcapnp does; the default of 8 Mi words lasts ~0.1 s of Text reads).
    from capsvc.codec.reading import unframe

    gen_reader = gen.Car.read(unframe(MESSAGE), traversal_limit_words=UNLIMITED)
    ref_message = ref.Car.from_bytes(MESSAGE, traversal_limit_in_words=UNLIMITED)
    ref_reader = ref_message.__enter__()
    pairs: list[tuple[str, Any, Any, Any]] = []
    for kind, name in FIELDS:
        ours = runner.bench_time_func(
            f"read {kind} ({name}): capsvc", field_reads(gen_reader, name), inner_loops=READS
        )
        theirs = runner.bench_time_func(
            f"read {kind} ({name}): pycapnp", field_reads(ref_reader, name), inner_loops=READS
        )
        fast = runner.bench_time_func(
            f"read {kind} ({name}): pycapnp _get_by_field",
            fast_reads(ref_reader, name),
            inner_loops=READS,
        )
        pairs.append((f"read {kind}", ours, theirs, fast))
    ours = runner.bench_time_func("build Car + to_bytes: capsvc", calls(build_generated))
    theirs = runner.bench_time_func("build Car + to_bytes: pycapnp", calls(build_pycapnp))
    pairs.append(("build Car", ours, theirs, None))
    ours = runner.bench_time_func(
        "build Car (new_message(**fields)) + to_bytes: capsvc", calls(build_generated_fields)
    )
    theirs = runner.bench_time_func(
        "build Car (new_message(**fields)) + to_bytes: pycapnp", calls(build_pycapnp_kwargs)
    )
    pairs.append(("build Car, ctor form", ours, theirs, None))
    ours = runner.bench_time_func(
        "decode + read every field: capsvc", calls(lambda: read_all_generated(MESSAGE))
    )
    theirs = runner.bench_time_func(
        "decode + read every field: pycapnp", calls(lambda: read_all_pycapnp(MESSAGE))
    )
    pairs.append(("decode + read all", ours, theirs, None))
    ours = runner.bench_time_func(
        "decode + read every field as a row: capsvc", calls(lambda: read_all_generated_row(MESSAGE))
    )
    pairs.append(("decode + row", ours, theirs, None))
    if runner.args.worker or any(o is None for _, o, _, _ in pairs):
        return
    print()
    print("machine:", ", ".join(f"{k}={v}" for k, v in machine_state().items()))
    print(f"{'what':<20} {'capsvc':>10} {'pycapnp':>10} {'pycapnp fast':>13} {'speed-up':>9}")
    for what, ours, theirs, fast in pairs:
        a, b = ours.mean(), theirs.mean()
        f = f"{fast.mean() * 1e9:10.0f} ns" if fast is not None else f"{'':>13}"
        print(f"{what:<20} {a * 1e9:7.0f} ns {b * 1e9:7.0f} ns {f} {b / a:8.1f}x")


if __name__ == "__main__":
    main()
