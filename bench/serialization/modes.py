"""The in-process modes, ``object`` and ``bytes`` (specs/benchmarks.md §6), and the registry.

Theory of operation
-------------------
A *batch* is the first N requests of a fresh generator (§7 "Fidelity rule": every timed
run sees the same first-N request sequence, as upstream's process-per-measurement does).
The inputs of a batch are generated once, outside the timed region; each timed run then
replays the whole batch in one of the modes:

- ``object``: the client fills a request, the server reads it in place (the builder viewed
  as a reader; for msgpack the Python structure itself) and fills a response, which the
  client checks in place. Nothing is serialized.
- ``bytes``: the request is serialized to one flat byte string, the server parses it,
  handles it and serializes the response, the client parses that and checks it.

The pipe modes live in pipe.py. :func:`load_benchmark` maps a benchmark name to its module
and :func:`make_case` builds a case object, so that the pyperf driver, the pipe server and
the tests share one lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from bench.serialization.base import BENCHMARKS, Case, Codec
from bench.serialization.rng import Xorshift128

__all__ = ["generate_batch", "load_benchmark", "make_case", "run_bytes", "run_object"]

_CASE_CLASSES = {  # (benchmark, format) -> "module:class" under bench.serialization
    ("carsales", "capnp"): "carsales:CapnpCarsales",
    ("carsales", "capnp-direct"): "direct.carsales:DirectCarsales",
    ("carsales", "msgpack"): "carsales:MsgpackCarsales",
    ("catrank", "capnp"): "catrank:CapnpCatrank",
    ("catrank", "capnp-direct"): "direct.catrank:DirectCatrank",
    ("catrank", "msgpack"): "catrank:MsgpackCatrank",
    ("eval", "capnp"): "eval:CapnpEval",
    ("eval", "capnp-direct"): "direct.eval:DirectEval",
    ("eval", "msgpack"): "eval:MsgpackEval",
    ("carsales", "capsvc"): "typed.carsales:CapsvcCarsales",
    ("carsales", "capsvc-fields"): "typed.carsales:CapsvcFieldsCarsales",
    ("catrank", "capsvc"): "typed.catrank:CapsvcCatrank",
    ("catrank", "capsvc-fields"): "typed.catrank:CapsvcFieldsCatrank",
    ("eval", "capsvc"): "typed.eval:CapsvcEval",
    ("eval", "capsvc-fields"): "typed.eval:CapsvcFieldsEval",
    ("carsales", "capnpy"): "peer_capnpy:CapnpyCarsales",
    ("catrank", "capnpy"): "peer_capnpy:CapnpyCatrank",
    ("eval", "capnpy"): "peer_capnpy:CapnpyEval",
}


def load_benchmark(name: str) -> ModuleType:
    """The module implementing benchmark ``name`` (carsales, catrank or eval)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r} (choose from {', '.join(BENCHMARKS)})")
    import importlib

    return importlib.import_module(f"bench.serialization.{name}")


def make_case(benchmark: str, fmt: str) -> Case:
    """A fresh case object for ``benchmark`` in format ``fmt``."""
    import importlib

    load_benchmark(benchmark)  # validates the name
    try:
        module_name, class_name = _CASE_CLASSES[benchmark, fmt].split(":")
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}") from None
    module = importlib.import_module(f"bench.serialization.{module_name}")
    case: Case = getattr(module, class_name)()
    return case


def generate_batch(benchmark: str, iterations: int) -> list[Any]:
    """The inputs of the first ``iterations`` requests of a fresh generator (§7)."""
    stream = Xorshift128().stream()
    try:
        batch: list[Any] = load_benchmark(benchmark).generate(stream, iterations)
        return batch
    finally:
        stream.close()


def run_object(case: Case, codec: Codec, batch: Sequence[Any]) -> None:
    """§6 ``object``: build, handle and check in place, no serialization."""
    setup, handle, check, view = case.setup, case.handle, case.check, codec.view
    view_response = codec.view_response
    for inputs in batch:
        request, expectation = setup(inputs)
        check(view_response(handle(view(request))), expectation)


def run_bytes(case: Case, codec: Codec, batch: Sequence[Any]) -> int:
    """§6 ``bytes``: through flat byte strings both ways. Returns the bytes serialized."""
    setup, handle, check = case.setup, case.handle, case.check
    encode, serve, check_bytes = codec.encode, codec.serve_bytes, codec.check_bytes
    total = 0
    for inputs in batch:
        request, expectation = setup(inputs)
        data = encode(request)
        reply = serve(handle, data)
        check_bytes(check, reply, expectation)
        total += len(data) + len(reply)
    return total
