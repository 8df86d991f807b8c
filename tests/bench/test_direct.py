"""The direct accessors against pycapnp: both directions, far pointers, nulls, layouts."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from bench.serialization.direct.wire import (
    LayoutError,
    check_layout,
    flat_segments,
    frame_flat,
    root_struct,
)
from bench.serialization.modes import generate_batch, load_benchmark, make_case

BENCHMARKS = ("carsales", "catrank", "eval")


def _types(benchmark: str) -> tuple[Any, Any]:
    module = load_benchmark(benchmark)
    schema = module.load_schema()
    return getattr(schema, module.REQUEST_TYPE), getattr(schema, module.RESPONSE_TYPE)


def _result(benchmark: str, response: Any) -> Any:
    """A pycapnp response reader's payload, comparable across implementations."""
    if benchmark == "carsales":
        return response.amount
    if benchmark == "eval":
        return response.value
    return [(r.url, r.score, r.snippet) for r in response.results]


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_pycapnp_reads_what_direct_writes(benchmark: str) -> None:
    request_type, response_type = _types(benchmark)
    direct = make_case(benchmark, "capnp-direct")
    pycapnp = make_case(benchmark, "capnp")
    for inputs in generate_batch(benchmark, 3):
        request, expectation = direct.setup(inputs)
        reference, same_expectation = pycapnp.setup(inputs)
        assert expectation == same_expectation
        # the same message: pycapnp sees the same content in both
        assert request_type.from_segments(request).to_dict() == reference.as_reader().to_dict()
        ours = response_type.from_segments(direct.handle(request))
        theirs = pycapnp.handle(request_type.from_segments(request)).as_reader()
        assert _result(benchmark, ours) == _result(benchmark, theirs)
        pycapnp.check(ours, expectation)


@pytest.mark.parametrize("first_segment_words", [1, 2, 5, 64])
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_direct_reads_multi_segment_pycapnp_messages(
    benchmark: str, first_segment_words: int
) -> None:
    # Tiny first segments make libcapnp spread the message and use far pointers.
    direct = make_case(benchmark, "capnp-direct")
    pycapnp = make_case(benchmark, "capnp")
    for inputs in generate_batch(benchmark, 2):
        reference, expectation = pycapnp.setup(inputs)
        copy = reference.as_reader().as_builder(num_first_segment_words=first_segment_words)
        segments = copy.to_segments()
        if first_segment_words < 5:
            assert len(segments) > 1
        direct.check(direct.handle(segments), expectation)


def test_double_far_root_pointer() -> None:
    # segment 0: a double-far root pointer to segment 1, word 0 (the landing pad);
    # segment 1: a far pointer to segment 2, word 0, then the tag (struct of 1 data word);
    # segment 2: the EvaluationResult content.
    root = struct.pack("<iI", (0 << 3) | 0b110, 1)  # double-far: pad at word 0 of segment 1
    pad = struct.pack("<iI", (0 << 3) | 0b010, 2) + struct.pack("<iI", 0, 1)
    content = struct.pack("<i4x", -42)
    direct = make_case("eval", "capnp-direct")
    direct.check([root, pad, content], -42)
    _request_type, response_type = _types("eval")
    assert response_type.from_segments([root, pad, content]).value == -42


def test_null_pointers_read_as_defaults() -> None:
    request_type, _ = _types("carsales")
    direct = make_case("carsales", "capnp-direct")
    empty = request_type.new_message()  # cars: null
    direct.check(direct.handle(empty.to_segments()), 0)
    lot = request_type.new_message()
    car = lot.init("cars", 1)[0]
    car.seats = 4  # no wheels, no engine, no texts: null pointers
    car.hasNavSystem = True
    direct.check(direct.handle(lot.to_segments()), 4 * 200 + 2000)
    eval_type, _ = _types("eval")
    tree = eval_type.new_message()
    tree.op = "subtract"
    tree.left.value = 7
    tree.right.init("expression")  # an all-default child: add 0 0
    direct_eval = make_case("eval", "capnp-direct")
    direct_eval.check(direct_eval.handle(tree.to_segments()), 7)


def test_struct_of_other_sizes_is_refused() -> None:
    # A root pointer announcing 2 data words for TotalValue (1 in this schema).
    segment = struct.pack("<iI", 0, 2) + bytes(16)
    with pytest.raises(LayoutError, match="2 data words"):
        root_struct([segment], 1)


def test_check_layout_catches_wrong_offsets() -> None:
    schema = load_benchmark("carsales").load_schema()
    assert (
        check_layout(
            schema.Engine, "<HBBI", ("horsepower", "cylinders", "bits:usesGas,usesElectric", "cc")
        )
        == 1
    )
    with pytest.raises(LayoutError):  # cylinders and the Bool byte swapped
        check_layout(
            schema.Engine, "<HBBI", ("horsepower", "bits:usesGas,usesElectric", "cylinders", "cc")
        )
    with pytest.raises(LayoutError):  # wrong width
        check_layout(
            schema.Engine, "<IBBH", ("horsepower", "cylinders", "bits:usesGas,usesElectric", "cc")
        )
    with pytest.raises(LayoutError):  # wrong size
        check_layout(
            schema.Engine, "<HBB", ("horsepower", "cylinders", "bits:usesGas,usesElectric")
        )


def test_flat_framing_round_trip() -> None:
    segment = bytes(range(16))
    framed = frame_flat(segment)
    assert framed[:8] == struct.pack("<II", 0, 2)
    assert flat_segments(framed) == [segment]
    with pytest.raises(LayoutError):
        flat_segments(framed[:-8])
