"""The ``capsvc`` and ``capsvc-fields`` formats: checked-in generated modules, and their
messages against pycapnp."""

from __future__ import annotations

import glob
import importlib
import os
import subprocess
import sys
from typing import Any

import pytest

from bench.serialization.modes import generate_batch, load_benchmark, make_case

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = ("carsales", "catrank", "eval")
#: Rows (whole structs at a time) and a field at a time: the two ways the suite uses them.
GENERATED_FORMATS = ("capsvc", "capsvc-fields")


def test_checked_in_generated_modules_are_fresh() -> None:
    """bench/serialization/generated is what capsvc gen makes of schemas/bench now."""
    schemas = sorted(glob.glob(os.path.join(ROOT, "schemas", "bench", "*.capnp")))
    assert [os.path.basename(path) for path in schemas] == [f"{b}.capnp" for b in BENCHMARKS]
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "capsvc"), "gen", *schemas,
         "-o", "bench/serialization/generated", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _types(benchmark: str) -> tuple[Any, Any]:
    module = load_benchmark(benchmark)
    schema = module.load_schema()
    return getattr(schema, module.REQUEST_TYPE), getattr(schema, module.RESPONSE_TYPE)


def built(benchmark: str, side: str, message: Any) -> Any:
    """A generated builder of a ``capsvc`` case's request or response (``side``): a row
    (what the codec encodes) is built with ``from_row``; a builder is itself."""
    if type(message) is not tuple:
        return message
    generated = importlib.import_module(f"bench.serialization.generated.{benchmark}_capnp")
    module = load_benchmark(benchmark)
    root = module.REQUEST_TYPE if side == "request" else module.RESPONSE_TYPE
    return getattr(generated, root).from_row(message)


def _pycapnp(message_type: Any, builder: Any) -> Any:
    return message_type.from_segments([bytes(segment) for segment in builder.to_segments()])


@pytest.mark.parametrize("fmt", GENERATED_FORMATS)
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_pycapnp_reads_what_the_generated_codecs_write(benchmark: str, fmt: str) -> None:
    request_type, response_type = _types(benchmark)
    ours = make_case(benchmark, fmt)
    reference = make_case(benchmark, "capnp")
    for inputs in generate_batch(benchmark, 2):
        request, expectation = ours.setup(inputs)
        request = built(benchmark, "request", request)
        theirs, same_expectation = reference.setup(inputs)
        assert expectation == same_expectation
        assert _pycapnp(request_type, request).to_dict() == theirs.as_reader().to_dict()
        answer = built(benchmark, "response", ours.handle(request.as_reader()))
        response = _pycapnp(response_type, answer)
        assert response.to_dict() == reference.handle(theirs.as_reader()).as_reader().to_dict()
        reference.check(response, expectation)


@pytest.mark.parametrize("fmt", GENERATED_FORMATS)
@pytest.mark.parametrize("first_segment_words", [1, 3, 64])
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_generated_readers_serve_multi_segment_pycapnp_messages(
    benchmark: str, first_segment_words: int, fmt: str
) -> None:
    # Tiny first segments make libcapnp spread the message and use far pointers.
    ours = make_case(benchmark, fmt)
    reference = make_case(benchmark, "capnp")
    generated = importlib.import_module(f"bench.serialization.generated.{benchmark}_capnp")
    request_root = getattr(generated, load_benchmark(benchmark).REQUEST_TYPE)
    for inputs in generate_batch(benchmark, 2):
        theirs, expectation = reference.setup(inputs)
        copy = theirs.as_reader().as_builder(num_first_segment_words=first_segment_words)
        segments = copy.to_segments()
        if first_segment_words < 64:
            assert len(segments) > 1
        answer = built(benchmark, "response", ours.handle(request_root.read(segments)))
        ours.check(answer.as_reader(), expectation)


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_packed_messages_are_libcapnps(benchmark: str) -> None:
    request_type, _ = _types(benchmark)
    ours = make_case(benchmark, "capsvc")
    request = built(benchmark, "request", ours.setup(generate_batch(benchmark, 1)[0])[0])
    reference = _pycapnp(request_type, request).as_builder(
        num_first_segment_words=len(request.to_bytes()) // 8
    )
    assert request.to_bytes_packed() == reference.to_bytes_packed()
