"""Each benchmark's data, server and check, in both formats (specs/benchmarks.md §2-§5)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from bench.serialization import carsales, catrank
from bench.serialization import eval as eval_bench
from bench.serialization.base import CheckFailed
from bench.serialization.codecs import make_codec
from bench.serialization.modes import generate_batch, load_benchmark, make_case
from bench.serialization.peer_capnpy import available as capnpy_available
from tests.bench.test_typed import built

FORMATS = (
    "capnp",
    "capsvc",
    "capsvc-fields",
    "capnp-direct",
    "msgpack",
    *(("capnpy",) if capnpy_available() else ()),  # an optional package
)

# §5: the expectations of a run's first iterations (fresh generator per process).
CARSALES_VECTORS = [(179, 135060640), (86, 70033924), (141, 114656075)]
CATRANK_VECTORS = [(779, 104), (311, 34), (840, 106)]
EVAL_VECTORS = [(22, 0), (54, -369557), (26, 8096), (32, 294), (36, 903)]


def _reference_car_value(car: tuple[Any, ...]) -> int:
    fields = dict(zip(carsales.CAR_INPUT_FIELDS, car, strict=True))
    wheels = tuple((fields[f"diameter{i}"], fields[f"snowTires{i}"]) for i in range(4))
    return carsales.car_value_of(
        fields["seats"],
        fields["doors"],
        wheels,
        fields["length"],
        fields["width"],
        fields["height"],
        fields["horsepower"],
        True,
        fields["usesElectric"],
        fields["hasPowerWindows"],
        fields["hasPowerSteering"],
        fields["hasCruiseControl"],
        fields["cupHolders"],
        fields["hasNavSystem"],
    )


def test_carsales_vectors() -> None:
    batch = generate_batch("carsales", 3)
    assert [(len(cars), sum(map(_reference_car_value, cars))) for cars in batch] == (
        CARSALES_VECTORS
    )
    assert all(len(car) == len(carsales.CAR_INPUT_FIELDS) == 31 for car in batch[0])


def test_catrank_vectors() -> None:
    batch = generate_batch("catrank", 3)
    assert [(len(results), good) for results, good in batch] == CATRANK_VECTORS
    for results, _good in batch:
        for url, snippet in results:
            assert url.startswith("http://example.com/")
            assert len(url) - 19 < 100
            assert set(url[19:]) <= set("abcdefghijklmnopqrstuvwxyz")
            assert snippet.startswith(" ")
            assert snippet.endswith(" ")


def test_eval_vectors() -> None:
    batch = generate_batch("eval", 5)
    assert [(eval_bench.count_nodes(tokens), value) for tokens, value in batch] == EVAL_VECTORS


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("benchmark", "vectors"),
    [
        ("carsales", [total for _n, total in CARSALES_VECTORS]),
        ("catrank", [good for _n, good in CATRANK_VECTORS]),
        ("eval", [value for _n, value in EVAL_VECTORS]),
    ],
)
def test_setup_expectations_match_the_vectors(benchmark: str, fmt: str, vectors: list[int]) -> None:
    # carsales computes its expectation by reading the built request back (§2).
    case = make_case(benchmark, fmt)
    batch = generate_batch(benchmark, len(vectors))
    assert [case.setup(inputs)[1] for inputs in batch] == vectors


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("benchmark", ["carsales", "catrank", "eval"])
def test_server_answers_pass_the_check(benchmark: str, fmt: str) -> None:
    case = make_case(benchmark, fmt)
    codec = make_codec(load_benchmark(benchmark), fmt, "none")
    for inputs in generate_batch(benchmark, 4):
        request, expectation = case.setup(inputs)
        case.check(codec.view_response(case.handle(codec.view(request))), expectation)


def test_eval_server_computes_int32_semantics() -> None:
    # (INT32_MIN / -1) is guarded, a product wraps, a zero divisor is guarded (§1.2, §4).
    tokens = (
        4,  # modulus
        0,
        3,  # divide: (multiply 128 128 ...) / 0 -> INT32_MAX
        0,
        2,  # multiply
        128,
        128,
        0,
        1,  # subtract 5 - 5 = 0
        5,
        5,
        7,  # right of modulus: 7
    )
    expected = eval_bench.apply_op(4, eval_bench.apply_op(3, 128 * 128, 0), 7)
    assert expected == 2147483647 % 7
    for fmt in FORMATS:
        case = make_case("eval", fmt)
        codec = make_codec(eval_bench, fmt, "none")
        request, _ = case.setup((tokens, expected))
        case.check(codec.view_response(case.handle(codec.view(request))), expected)


def _corrupt_capnp(benchmark: str, response: Any) -> None:
    if benchmark == "carsales":
        response.amount = response.amount + 1
    elif benchmark == "catrank":
        response.results[0].score = 0.0  # the first cat result drops below 1001
    else:
        response.value = response.value + 1


def _corrupt_msgpack(benchmark: str, response: Any) -> Any:
    if benchmark == "catrank":
        first = response[0]
        return [(first[0], 0.0, first[2]), *response[1:]]
    return response + 1


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("benchmark", ["carsales", "catrank", "eval"])
def test_check_rejects_a_corrupted_response(benchmark: str, fmt: str) -> None:
    case = make_case(benchmark, fmt)
    codec = make_codec(load_benchmark(benchmark), fmt, "none")
    inputs = generate_batch(benchmark, 1)[0]  # catrank: 104 good results, carsales: 179 cars
    request, expectation = case.setup(inputs)
    response = case.handle(codec.view(request))
    module = load_benchmark(benchmark)
    response_type = getattr(module.load_schema(), module.RESPONSE_TYPE)
    if fmt == "capnp":
        _corrupt_capnp(benchmark, response)
        response = codec.view_response(response)
    elif fmt in ("capnp-direct", "capsvc", "capsvc-fields", "capnpy"):
        # through pycapnp: copy the message into a builder, corrupt, back to this format
        if fmt == "capnpy":
            segments = response_type.from_bytes(response.dumps()).__enter__().as_builder()
        else:
            if fmt == "capnp-direct":
                segments = response
            else:
                segments = built(benchmark, "response", response).to_segments()
            segments = response_type.from_segments([bytes(s) for s in segments]).as_builder()
        _corrupt_capnp(benchmark, segments)
        response = _in_format(benchmark, fmt, segments)
    else:
        response = codec.view_response(_corrupt_msgpack(benchmark, response))
    with pytest.raises(CheckFailed):
        case.check(response, expectation)


def _in_format(benchmark: str, fmt: str, pycapnp_builder: Any) -> Any:
    """What ``fmt``'s check reads, holding a pycapnp builder's message."""
    if fmt == "capnp-direct":
        return pycapnp_builder.to_segments()
    module = load_benchmark(benchmark)
    if fmt == "capnpy":
        from bench.serialization.peer_capnpy import compiled

        return getattr(compiled(benchmark), module.RESPONSE_TYPE).loads(pycapnp_builder.to_bytes())
    generated = importlib.import_module(f"bench.serialization.generated.{benchmark}_capnp")
    return getattr(generated, module.RESPONSE_TYPE).read(pycapnp_builder.to_segments())


@pytest.mark.parametrize("fmt", FORMATS)
def test_catrank_check_stops_at_the_first_low_score(fmt: str) -> None:
    case = make_case("catrank", fmt)
    codec = make_codec(catrank, fmt, "none")
    results = (("http://example.com/a", " cat "), ("http://example.com/b", " foo "))
    results += (("http://example.com/c", " cat "),)
    request, expectation = case.setup((results, 2))
    assert expectation == 2
    response = case.handle(codec.view(request))
    case.check(codec.view_response(response), 2)  # sorted: both cats first
    # Unsorted order (cat, plain, cat) must count 1: the walk stops at the first low score.
    if fmt == "msgpack":
        unsorted = [(url, 1000.0 * (10000.0 if " cat " in s else 1.0), s) for url, s in results]
    else:
        unsorted = make_case("catrank", "capnp").setup((results, 2))[0]
        for index, (_url, snippet) in enumerate(results):
            unsorted.results[index].score = 50000.0 if " cat " in snippet else 5.0
        if fmt != "capnp":
            unsorted = _in_format("catrank", fmt, unsorted)
        else:
            unsorted = codec.view_response(unsorted)
    if fmt == "msgpack":
        unsorted = codec.view_response(unsorted)
    with pytest.raises(CheckFailed, match="1 good results, expected 2"):
        case.check(unsorted, 2)


def test_carsales_capnp_layout_is_15_words_per_car() -> None:
    # §2 "Size": 15 words (120 B) per car, wheels, engine and both texts included.
    case = make_case("carsales", "capnp")
    codec = make_codec(carsales, "capnp", "none")
    cars = next(cars for cars in generate_batch("carsales", 10) if 0 < len(cars) < 60)
    request, _ = case.setup(cars)
    # header word, root pointer, ParkingLot's one pointer, list tag, then the cars
    assert len(codec.encode(request)) == 8 * (4 + 15 * len(cars))


def test_serialized_sizes_are_in_the_spec_range() -> None:
    # §2-§4: request + response per iteration, roughly (the spec's figures are approximate).
    expected = {"carsales": (12_000, 8_000), "eval": (1_100, 330)}
    for benchmark, (unpacked, packed) in expected.items():
        module = load_benchmark(benchmark)
        case = make_case(benchmark, "capnp")
        batch = generate_batch(benchmark, 200 if benchmark == "eval" else 30)
        for compression, target in (("none", unpacked), ("packed", packed)):
            codec = make_codec(module, "capnp", compression)
            total = 0
            for inputs in batch:
                data = codec.encode(case.setup(inputs)[0])
                total += len(data) + len(codec.serve_bytes(case.handle, data))
            assert 0.8 * target < total / len(batch) < 1.25 * target, (benchmark, compression)
