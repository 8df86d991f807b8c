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


def _catrank_results(segments: list[bytes]) -> list[tuple[str, float, str]]:
    _request_type, response_type = _types("catrank")
    return _result("catrank", response_type.from_segments(segments))


def test_catrank_fast_and_general_paths_agree() -> None:
    # The column-wise fast path and the per-result general path build different layouts
    # (far pointers into the request's segment vs texts copied per result) with the same
    # content.
    request_type, _ = _types("catrank")
    direct = make_case("catrank", "capnp-direct")
    pycapnp = make_case("catrank", "capnp")
    for inputs in generate_batch("catrank", 3):
        request, expectation = direct.setup(inputs)
        reference, _ = pycapnp.setup(inputs)
        single = reference.as_reader().as_builder(num_first_segment_words=1 << 16).to_segments()
        assert len(single) == 1
        for segments in (list(request), single):
            seg, first, count = direct._results(segments)
            fast = direct._handle_plain(segments[seg], first, count)
            assert fast is not None  # both writers' layouts take the fast path
            general = direct._handle_general(segments, seg, first, count)
            assert _catrank_results(fast) == _catrank_results(general)
            # segment 0: root, list and results; segment 1: the request's own segment
            assert len(fast) == 2
            assert fast[1] is segments[seg]
            assert len(fast[0]) == 8 * (3 + 3 * count)
            direct.check(fast, expectation)
            pycapnp.check(request_type.from_segments(fast), expectation)


def test_catrank_non_ascii_texts_are_encoded_one_by_one() -> None:
    request_type, _ = _types("catrank")
    direct = make_case("catrank", "capnp-direct")
    results = (("http://example.com/é", " foo cat bär "), ("http://example.com/a", " ü dog "))
    request, expectation = direct.setup((results, 1))
    read = request_type.from_segments(request).results
    assert [(r.url, r.snippet) for r in read] == list(results)
    assert [r.score for r in read] == [1000.0, 999.0]
    response = direct.handle(request)
    assert _catrank_results(response) == [
        ("http://example.com/é", 1000.0 * 10000.0, " foo cat bär "),
        ("http://example.com/a", 999.0 / 10000.0, " ü dog "),
    ]
    direct.check(response, expectation)


def _one_result_list(snippet_pointer: bytes) -> bytes:
    """Root pointer, the url and snippet texts, then SearchResultList and its one result,
    whose url points backwards (a negative offset) and whose snippet is as given."""
    return b"".join(
        (
            struct.pack("<iI", 2 << 2, 1 << 16),  # root -> word 3
            b"u\0".ljust(8, b"\0"),  # word 1
            b" cat \0".ljust(8, b"\0"),  # word 2
            struct.pack("<iI", 1, 3 << 3 | 7),  # word 3: results -> word 4, 3 words
            struct.pack("<iI", 1 << 2, 1 | 2 << 16),  # tag: 1 element of 1 + 2 words
            struct.pack("<d", 5.0),
            struct.pack("<iI", -6 << 2 | 1, 2 << 3 | 2),  # url -> word 1
            snippet_pointer,
        )
    )


def test_catrank_texts_anywhere_in_the_segment() -> None:
    direct = make_case("catrank", "capnp-direct")
    # texts before the list (backward pointers): still the fast path
    segment = _one_result_list(struct.pack("<iI", -6 << 2 | 1, 6 << 3 | 2))  # -> word 2
    assert direct._texts_are_plain(segment, 5, 1)
    response = direct.handle([segment])
    assert len(response) == 2
    assert _catrank_results(response) == [("u", 50000.0, " cat ")]
    direct.check(response, 1)
    # a null snippet: the general path (no far pointer may land on a null pad)
    segment = _one_result_list(bytes(8))
    assert not direct._texts_are_plain(segment, 5, 1)
    response = direct.handle([segment])
    assert len(response) == 1
    assert _catrank_results(response) == [("u", 5.0, "")]
    direct.check(response, 0)
    # a snippet past the end of the segment: refused by the fast path's bounds check
    segment = _one_result_list(struct.pack("<iI", 4 << 2 | 1, 6 << 3 | 2))
    assert direct._handle_plain(segment, 5, 1) is None


def _eval_node(op: int, left: int | None, right: int | None, lptr: int, rptr: int) -> bytes:
    """An Expression: ``None`` for a side that is a child at pointer ``lptr``/``rptr``."""
    return struct.pack(
        "<HHiiH2xqq",
        op,
        left is None,
        left or 0,
        right or 0,
        right is None,
        lptr if left is None else 0,
        rptr if right is None else 0,
    )


def _struct_pointer(offset: int) -> int:
    return (2 | 2 << 16) << 32 | (offset << 2) & 0xFFFFFFFF


def test_eval_flat_and_general_paths_agree() -> None:
    direct = make_case("eval", "capnp-direct")
    pycapnp = make_case("eval", "capnp")
    for inputs in generate_batch("eval", 50):
        request, expectation = direct.setup(inputs)
        reference, _ = pycapnp.setup(inputs)
        (single,) = reference.to_segments()
        for buf in (request[0], single):
            assert direct._evaluate_flat(buf) == expectation
            assert direct._evaluate(request, buf, 0, 1) == expectation


def test_eval_unusual_layouts() -> None:
    direct = make_case("eval", "capnp-direct")
    # Root (multiply, left child, right 7) at word 5, its child (add 2 3) at word 1: the
    # root pointer is not the usual one and the child pointer points backwards.
    child = _eval_node(0, 2, 3, 0, 0)
    root = _eval_node(2, None, 7, _struct_pointer(1 - 7 - 1), 0)
    backwards = struct.pack("<iI", 4 << 2, 2 | 2 << 16) + child + root
    direct.check(direct.handle([backwards]), 35)
    # Root at word 1 whose left child is at word 9, past an unreferenced node at word 5
    # (harmlessly evaluated by the flat path, division by zero included).
    root = _eval_node(1, None, 100, _struct_pointer(9 - 3 - 1), 0)
    stray = _eval_node(3, 1, 0, 0, 0)
    child = _eval_node(4, 17, 5, 0, 0)
    skipping = struct.pack("<iI", 0, 2 | 2 << 16) + root + stray + child
    assert direct._evaluate_flat(skipping) == 2 - 100
    direct.check(direct.handle([skipping]), -98)
    # A child pointer off the node grid (into the middle of a node) is refused by the
    # flat path: a KeyError sends it to the general path, which reads what is there
    # (here zeros: an all-default child).
    off_grid = (
        struct.pack("<iI", 0, 2 | 2 << 16)
        + _eval_node(0, None, 1, _struct_pointer(2), 0)
        + bytes(64)
    )
    with pytest.raises(KeyError):
        direct._evaluate_flat(off_grid)
    direct.check(direct.handle([off_grid]), 0 + 1)  # the child read at word 6: add 0 0
