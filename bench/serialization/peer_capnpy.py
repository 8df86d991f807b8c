"""capnpy as a peer format: the same benchmarks on the ``capnpy`` package (PyPI).

Theory of operation
-------------------
capnpy compiles a schema into Python classes (Cython-compiled on CPython) whose fields
are read lazily at precomputed offsets from a bytes buffer (specs/codegen.md §3). Objects
are immutable: a struct is built in one constructor call with every field as a keyword
(lists as Python lists of built structs, groups as ``Type.Group(member=...)`` tuples), so
the client builds each car, wheel and engine bottom up, the way capnpy's documentation
shows. Messages are single-segment, in the standard stream framing (``dumps`` /
``loads``). Field names stay camelCase (``--no-convert-case``) and Text reads as ``str``
(``--text-type=unicode``), which is what the server searches.

capnpy has no packed encoding (nor multi-segment writing), so it runs with compression
``none`` only, like msgpack. Compiling a schema with Cython takes ~15 s, so the three
schemas are compiled once per capnpy version and schema content into a cache directory
(``$TMPDIR/capsvc-bench-capnpy-*``) and imported from there.

The package is optional (``pip install -e '.[capnpy]'``): :func:`available` tells the CLI
whether to include the format by default.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from operator import itemgetter
from types import ModuleType
from typing import Any

from bench.serialization.base import CheckFailed
from bench.serialization.catrank import CatrankInput, scores
from bench.serialization.eval import EvalInput
from bench.serialization.rng import div32, mod32
from capsvc.framing import FrameDecoder, encode_message

__all__ = [
    "CapnpyCarsales",
    "CapnpyCatrank",
    "CapnpyEval",
    "available",
    "compiled",
    "make_capnpy_codec",
]

_SCHEMAS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "schemas",
    "bench",
)
_MODULES: dict[str, ModuleType] = {}
_FIRST = itemgetter(0)


def available() -> bool:
    """True if the capnpy package is installed."""
    return importlib.util.find_spec("capnpy") is not None


def compiled(benchmark: str) -> ModuleType:
    """capnpy's module for ``schemas/bench/<benchmark>.capnp`` (compiled once, cached)."""
    module = _MODULES.get(benchmark)
    if module is not None:
        return module
    import capnpy

    with open(os.path.join(_SCHEMAS, f"{benchmark}.capnp"), "rb") as schema:
        source = schema.read()
    key = hashlib.sha256(source + capnpy.__version__.encode()).hexdigest()[:16]
    directory = os.path.join(tempfile.gettempdir(), f"capsvc-bench-capnpy-{key}")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = os.path.join(directory, benchmark + suffix)
    if not os.path.exists(target):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"{benchmark}.capnp"), "wb") as copy:
            copy.write(source)
        subprocess.run(
            [sys.executable, "-m", "capnpy", "compile", f"{benchmark}.capnp",
             "--no-convert-case", "--text-type=unicode"],
            cwd=directory, check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    # The extension's init function is named after the schema: import it by that name.
    spec = importlib.util.spec_from_file_location(benchmark, target)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(benchmark, module)
    spec.loader.exec_module(module)
    _MODULES[benchmark] = module
    return module


# --------------------------------------------------------------------------- carsales


def _car_value(car: Any) -> int:
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


class CapnpyCarsales:
    """carsales on capnpy: cars built bottom up, read back through their properties."""

    format = "capnpy"

    def __init__(self) -> None:
        self._m = compiled("carsales")

    def setup(self, inputs: tuple[tuple[Any, ...], ...]) -> tuple[Any, int]:
        m = self._m
        car_type, wheel_type, engine_type = m.Car, m.Wheel, m.Engine
        cars = []
        for (
            make, model, color, seats, doors,
            d0, p0, s0, d1, p1, s1, d2, p2, s2, d3, p3, s3,
            length, width, height, horsepower, cylinders, cc, uses_electric,
            capacity, level, windows, steering, cruise, cups, nav,
        ) in inputs:  # fmt: skip
            wheels = [
                wheel_type(diameter=d0, airPressure=p0, snowTires=s0),
                wheel_type(diameter=d1, airPressure=p1, snowTires=s1),
                wheel_type(diameter=d2, airPressure=p2, snowTires=s2),
                wheel_type(diameter=d3, airPressure=p3, snowTires=s3),
            ]
            engine = engine_type(
                horsepower=horsepower, cylinders=cylinders, cc=cc, usesGas=True,
                usesElectric=uses_electric,
            )  # fmt: skip
            cars.append(
                car_type(
                    make=make, model=model, color=color, seats=seats, doors=doors,
                    wheels=wheels, length=length, width=width, height=height,
                    weight=length * width * height // 200, engine=engine,
                    fuelCapacity=capacity, fuelLevel=level, hasPowerWindows=windows,
                    hasPowerSteering=steering, hasCruiseControl=cruise, cupHolders=cups,
                    hasNavSystem=nav,
                )
            )  # fmt: skip
        lot = m.ParkingLot(cars=cars)
        return lot, sum(map(_car_value, lot.cars))  # read back, as upstream (§2)

    def handle(self, request: Any) -> Any:
        return self._m.TotalValue(amount=sum(map(_car_value, request.cars)))

    def check(self, response: Any, expectation: int) -> None:
        if response.amount != expectation:
            raise CheckFailed(f"carsales: total {response.amount}, expected {expectation}")


# --------------------------------------------------------------------------- catrank


class CapnpyCatrank:
    """catrank on capnpy: results built in one constructor each."""

    format = "capnpy"

    def __init__(self) -> None:
        self._m = compiled("catrank")

    def setup(self, inputs: CatrankInput) -> tuple[Any, int]:
        results, good = inputs
        result_type = self._m.SearchResult
        built = [
            result_type(url=url, score=score, snippet=snippet)
            for score, (url, snippet) in zip(scores(len(results)), results, strict=True)
        ]
        return self._m.SearchResultList(results=built), good

    def handle(self, request: Any) -> Any:
        scored = []
        append = scored.append
        for result in request.results:
            score = result.score
            snippet = result.snippet
            if " cat " in snippet:
                score *= 10000.0
            if " dog " in snippet:
                score /= 10000.0
            append((score, snippet, result))
        scored.sort(key=_FIRST, reverse=True)  # scores are unique (§3)
        result_type = self._m.SearchResult
        return self._m.SearchResultList(
            results=[
                result_type(url=result.url, score=score, snippet=snippet)
                for score, snippet, result in scored
            ]
        )

    def check(self, response: Any, expectation: int) -> None:
        count = 0
        for result in response.results:
            if result.score > 1001:
                count += 1
            else:
                break
        if count != expectation:
            raise CheckFailed(f"catrank: {count} good results, expected {expectation}")


# --------------------------------------------------------------------------- eval


class CapnpyEval:
    """eval on capnpy: trees built bottom up (a child is copied into its parent)."""

    format = "capnpy"

    def __init__(self) -> None:
        m = self._m = compiled("eval")
        expression, left_of, right_of = m.Expression, m.Expression.Left, m.Expression.Right

        def build(nxt: Callable[[], int]) -> Any:
            op = nxt()
            value = nxt()
            left = left_of(value=value) if value else left_of(expression=build(nxt))
            value = nxt()
            right = right_of(value=value) if value else right_of(expression=build(nxt))
            return expression(op=op, left=left, right=right)

        def evaluate(node: Any) -> int:
            side = node.left
            left = side.value if side.is_value() else evaluate(side.expression)
            side = node.right
            right = side.value if side.is_value() else evaluate(side.expression)
            op = node.op
            if op == 0:
                value = (left + right) & 0xFFFFFFFF
            elif op == 1:
                value = (left - right) & 0xFFFFFFFF
            elif op == 2:
                value = (left * right) & 0xFFFFFFFF
            elif op == 3:
                return div32(left, right)
            else:
                return mod32(left, right)
            return value - 0x100000000 if value & 0x80000000 else value

        self._build = build
        self._evaluate = evaluate

    def setup(self, inputs: EvalInput) -> tuple[Any, int]:
        tokens, value = inputs
        return self._build(iter(tokens).__next__), value

    def handle(self, request: Any) -> Any:
        return self._m.EvaluationResult(value=self._evaluate(request))

    def check(self, response: Any, expectation: int) -> None:
        if response.value != expectation:
            raise CheckFailed(f"eval: value {response.value}, expected {expectation}")


# --------------------------------------------------------------------------- codec


class _Framed:
    """A stream of framed messages: capsvc's FrameDecoder finds each, capnpy loads it."""

    __slots__ = ("_frames", "_loads")

    def __init__(self, loads: Callable[[bytes], Any]) -> None:
        self._frames = FrameDecoder()
        self._loads = loads

    def feed(self, data: bytes) -> None:
        self._frames.feed(data)

    def next(self) -> Any | None:
        segments = self._frames.next_message()
        return None if segments is None else self._loads(encode_message(segments))


class CapnpyCodec:
    """capnpy's ``dumps`` / ``loads`` (stream framing, one segment); no packed form."""

    format = "capnpy"

    def __init__(self, request_type: Any, response_type: Any, compression: str) -> None:
        if compression != "none":
            raise ValueError("capnpy has no packed encoding: compression must be none")
        self.compression = compression
        self._request_loads = request_type.loads
        self._response_loads = response_type.loads

    def view(self, message: Any) -> Any:
        return message  # a capnpy object is its own reader

    view_response = view  # (a request and a response are made the same way)

    def encode(self, message: Any) -> bytes:
        data: bytes = message.dumps()
        return data

    def serve_bytes(self, handle: Callable[[Any], Any], data: bytes) -> bytes:
        return handle(self._request_loads(data)).dumps()  # type: ignore[no-any-return]

    def check_bytes(self, check: Callable[[Any, Any], None], data: bytes, expected: Any) -> None:
        check(self._response_loads(data), expected)

    def frame(self, message: Any) -> bytes:
        return message.dumps()  # type: ignore[no-any-return]

    frame_response = frame  # (a request and a response are made the same way)

    def frame_all(self, messages: Sequence[Any]) -> bytes:
        return b"".join([message.dumps() for message in messages])

    def request_decoder(self) -> Any:
        return _Framed(self._request_loads)

    def response_decoder(self) -> Any:
        return _Framed(self._response_loads)


def make_capnpy_codec(benchmark_module: Any, compression: str) -> CapnpyCodec:
    name = benchmark_module.__name__.rsplit(".", 1)[1]
    module = compiled(name)
    return CapnpyCodec(
        getattr(module, benchmark_module.REQUEST_TYPE),
        getattr(module, benchmark_module.RESPONSE_TYPE),
        compression,
    )
