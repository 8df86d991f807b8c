"""Every mode, format and compression round-trips a few iterations (specs/benchmarks.md §6).

The pipe modes run against a real server process (``python -m bench.serialization.server``)
over two anonymous pipes; one server per benchmark and codec serves every pipe test of it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench.serialization.base import CheckFailed
from bench.serialization.codecs import LengthPrefixDecoder, make_codec
from bench.serialization.modes import (
    generate_batch,
    load_benchmark,
    make_case,
    run_bytes,
    run_object,
)
from bench.serialization.peer_capnpy import available as capnpy_available
from bench.serialization.pipe import CPU_LOG, PipeSession, ServerGone
from tests.bench.test_typed import built

BENCHMARKS = ("carsales", "catrank", "eval")
CODECS = (
    ("capnp", "none"),
    ("capnp", "packed"),
    ("capsvc", "none"),
    ("capsvc", "packed"),
    ("capnp-direct", "none"),
    ("capnp-direct", "packed"),
    ("msgpack", "none"),
    *((("capnpy", "none"),) if capnpy_available() else ()),  # an optional package
)
ITERATIONS = {"carsales": 3, "catrank": 2, "eval": 12}


def _codec(benchmark: str, fmt: str, compression: str) -> Any:
    return make_codec(load_benchmark(benchmark), fmt, compression)


@pytest.mark.parametrize(("fmt", "compression"), CODECS)
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_object_and_bytes(benchmark: str, fmt: str, compression: str) -> None:
    batch = generate_batch(benchmark, ITERATIONS[benchmark])
    case = make_case(benchmark, fmt)
    codec = _codec(benchmark, fmt, compression)
    run_object(case, codec, batch)
    assert run_bytes(case, codec, batch) > 0


def _as_pycapnp(message_type: Any, message: Any) -> Any:
    """A pycapnp reader of a message from either capnp implementation."""
    if isinstance(message, list):  # capnp-direct: segments
        return message_type.from_segments(message)
    if hasattr(message, "to_segments"):  # pycapnp or generated builders
        return message_type.from_segments([bytes(s) for s in message.to_segments()])
    return message_type.from_bytes(message.dumps()).__enter__()  # capnpy


def test_packed_capnp_is_smaller_and_msgpack_ignores_packing() -> None:
    batch = generate_batch("eval", 20)
    case = make_case("eval", "capnp")
    unpacked = run_bytes(case, _codec("eval", "capnp", "none"), batch)
    packed = run_bytes(case, _codec("eval", "capnp", "packed"), batch)
    assert packed < unpacked / 2  # §4: eval is mostly pointers and zeros
    capsvc = make_case("eval", "capsvc")
    generated_packed = run_bytes(capsvc, _codec("eval", "capsvc", "packed"), batch)
    assert generated_packed == packed  # the same packed bytes as libcapnp's
    assert run_bytes(capsvc, _codec("eval", "capsvc", "none"), batch) == unpacked
    msgpack_case = make_case("eval", "msgpack")
    assert run_bytes(msgpack_case, _codec("eval", "msgpack", "none"), batch) == run_bytes(
        msgpack_case, _codec("eval", "msgpack", "packed"), batch
    )


SessionFactory = Callable[[str, str, str], PipeSession]


@pytest.fixture(scope="module")
def session_for() -> Iterator[SessionFactory]:
    """One server process per (benchmark, format, compression), shared by the module."""
    started: dict[tuple[str, str, str], PipeSession] = {}

    def get(benchmark: str, fmt: str, compression: str) -> PipeSession:
        key = (benchmark, fmt, compression)
        if key not in started:
            case = make_case(benchmark, fmt)
            started[key] = PipeSession(benchmark, case, _codec(benchmark, fmt, compression))
        return started[key]

    yield get
    for session in started.values():
        session.close()


@pytest.mark.parametrize(("fmt", "compression"), CODECS)
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_pipe_modes_with_a_server_process(
    session_for: SessionFactory, benchmark: str, fmt: str, compression: str
) -> None:
    session = session_for(benchmark, fmt, compression)
    batch = generate_batch(benchmark, ITERATIONS[benchmark])
    for depth in (None, 1, 4, 0):  # pipe, then pipe-async with 1, 4 and unbounded in flight
        assert session.run(batch, depth) > 0
        client_cpu, server_cpu, iterations = CPU_LOG[-1]
        assert iterations == len(batch)
        assert client_cpu > 0
        assert server_cpu >= 0


class _WrongExpectations:
    """A client that expects something else than the server computes."""

    def __init__(self, case: Any) -> None:
        self.format = case.format
        self._case = case
        self.handle = case.handle
        self.check = case.check

    def setup(self, inputs: Any) -> tuple[Any, Any]:
        request, expectation = self._case.setup(inputs)
        return request, expectation + 1


@pytest.mark.parametrize("depth", [None, 4])
@pytest.mark.parametrize(("fmt", "compression"), CODECS)
def test_a_wrong_response_over_the_pipe_stops_the_run(
    fmt: str, compression: str, depth: int | None
) -> None:
    batch = generate_batch("eval", 6)
    session = PipeSession(
        "eval", _WrongExpectations(make_case("eval", fmt)), _codec("eval", fmt, compression)
    )
    try:
        with pytest.raises(ExceptionGroup if depth is not None else CheckFailed) as info:
            session.run(batch, depth)
        if depth is not None:
            assert info.group_contains(CheckFailed)
    finally:
        session.close()


def test_a_dead_server_is_reported() -> None:
    batch = generate_batch("eval", 3)
    session = PipeSession("eval", make_case("eval", "msgpack"), _codec("eval", "msgpack", "none"))
    os.kill(session.pid, signal.SIGKILL)
    with pytest.raises(ServerGone):
        session.run(batch, None)
    with pytest.raises(ServerGone):
        session.close()


def test_length_prefix_decoder_handles_any_split() -> None:
    records = [b"", b"x" * 5, b"y" * 70_000, b"z"]
    stream = b"".join(len(r).to_bytes(4, "little") + r for r in records)
    for chunk in (1, 3, 4096, len(stream)):
        decoder = LengthPrefixDecoder()
        out = []
        for start in range(0, len(stream), chunk):
            decoder.feed(stream[start : start + chunk])
            while (body := decoder.next_body()) is not None:
                out.append(body)
        assert out == records


@pytest.mark.parametrize(("fmt", "compression"), CODECS)
def test_stream_decoders_split_byte_by_byte(fmt: str, compression: str) -> None:
    case = make_case("eval", fmt)
    codec = _codec("eval", fmt, compression)
    batch = generate_batch("eval", 3)
    stream = codec.frame_all([case.setup(inputs)[0] for inputs in batch])
    decoder = codec.request_decoder()
    values = []
    for index in range(len(stream)):
        decoder.feed(stream[index : index + 1])
        while (request := decoder.next()) is not None:
            response = case.handle(request)
            if fmt == "msgpack":
                values.append(response)
            else:
                result_type = load_benchmark("eval").load_schema().EvaluationResult
                answer = built("eval", "response", response)
                values.append(_as_pycapnp(result_type, answer).value)
    assert values == [value for _tokens, value in batch]


@pytest.mark.parametrize(("benchmark", "text_type"), [("carsales", bytes), ("catrank", str)])
def test_msgpack_text_representation(benchmark: str, text_type: type) -> None:
    # carsales never reads its texts (left undecoded, as the direct readers leave them);
    # catrank searches snippets, faster on str.
    case = make_case(benchmark, "msgpack")
    codec = _codec(benchmark, "msgpack", "none")
    request, expectation = case.setup(generate_batch(benchmark, 1)[0])
    seen: list[Any] = []

    def handle(message: Any) -> Any:
        seen.append(message)
        return case.handle(message)

    reply = codec.serve_bytes(handle, codec.encode(request))
    assert type(seen[0][0][0]) is text_type  # the first car's make, the first result's url
    codec.check_bytes(case.check, reply, expectation)
