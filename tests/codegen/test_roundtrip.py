"""Generated codecs against pycapnp (the C++ reference), both ways (Hypothesis).

For each struct of tests/schemas/kitchen.capnp (every type kind: numbers with and without
defaults, unions, groups, lists of every element size, nested lists, recursion, imports,
keyword names, generics bound to concrete types): values pycapnp builds read back equal
by generated readers, also spread over many segments with far pointers; values generated
builders make read back equal by pycapnp; and generated builder -> generated reader.
"""

from __future__ import annotations

from typing import Any

import capnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.codegen.conftest import Generated
from tests.codegen.values import fill, struct_named, values

STRUCTS = [
    ("Numbers", 0),
    ("Defaults", 0),
    ("Lists", 0),
    ("Shapes", 0),
    ("Tree", 0),
    ("Keywords", 0),
    ("Shop.buy$Params", 0),
    ("Shop.buy$Results", 0),
    ("Boxes", 0),
    ("Shelves", 0),
    ("Layered", 0),
    ("Parcel", 0),
    ("Builtins", 0),
    ("Choice", 0),
    ("Thing", 1),
]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def reference_type(generated: Generated, scope: str, file_index: int) -> Any:
    if file_index == 1:  # through kitchen.capnp's import (loading it again would clash)
        return generated.reference.Tree.schema.fields["other"].schema
    if "$" in scope:
        interface, _, rest = scope.partition(".")
        method, _, kind = rest.partition("$")
        methods = getattr(generated.reference, interface).schema.methods[method]
        return methods.param_type if kind == "Params" else methods.result_type
    target = generated.reference
    for part in scope.split("."):
        target = getattr(target, part)
    return target


def generated_type(generated: Generated, scope: str, file_index: int) -> Any:
    module = generated.other if file_index == 1 else generated.kitchen
    target: Any = module
    for part in (
        scope.replace("buy$Params", "BuyParams").replace("buy$Results", "BuyResults").split(".")
    ):
        target = getattr(target, part)
    return target


def new_reference(kind: Any, data: dict[str, Any]) -> Any:
    if hasattr(kind, "new_message"):
        # pycapnp's which() shadows a field named "which": set that one with _set.
        builder = kind.new_message(**{k: v for k, v in data.items() if k != "which"})
    else:
        builder = capnp._MallocMessageBuilder().init_root(kind)
        for key, value in data.items():
            if key != "which":
                setattr(builder, key, value)
    if "which" in data:
        builder._set("which", data["which"])
    return builder


def spread(message: Any) -> list[bytes]:
    """The same message copied into one-word first segments: far pointers everywhere."""
    builder = capnp._MallocMessageBuilder(1)
    builder.set_root(message.as_reader())
    return [bytes(segment) for segment in builder.get_segments_for_output()]


@pytest.mark.parametrize(("scope", "file_index"), STRUCTS)
def test_pycapnp_builds_generated_reads(generated: Generated, scope: str, file_index: int) -> None:
    struct = struct_named(generated.schema, scope, file_index)
    ours = generated_type(generated, scope, file_index)
    reference = reference_type(generated, scope, file_index)

    @SETTINGS
    @given(values(generated.schema, struct), st.booleans())
    def check(data: dict[str, Any], far: bool) -> None:
        message = new_reference(reference, data)
        expected = message.as_reader().to_dict()
        segments = spread(message) if far else [bytes(s) for s in message.to_segments()]
        assert ours.Reader.read(segments).to_dict() == expected

    check()


@pytest.mark.parametrize(("scope", "file_index"), STRUCTS)
def test_generated_builds_pycapnp_reads(generated: Generated, scope: str, file_index: int) -> None:
    struct = struct_named(generated.schema, scope, file_index)
    ours = generated_type(generated, scope, file_index)
    reference = reference_type(generated, scope, file_index)

    @SETTINGS
    @given(values(generated.schema, struct))
    def check(data: dict[str, Any]) -> None:
        builder = ours.Builder.new_message()
        fill(generated.schema, builder, struct, data)
        segments = [bytes(s) for s in builder.to_segments()]
        expected = new_reference(reference, data).as_reader().to_dict()
        root = _reference_root(reference, segments)
        assert root.to_dict() == expected
        assert builder.as_reader().to_dict() == expected
        assert ours.Reader.read(segments).to_dict() == expected

    check()


def _reference_root(reference: Any, segments: list[bytes]) -> Any:
    if hasattr(reference, "from_segments"):
        return reference.from_segments(segments)
    from capsvc.rpc.payload import struct_module

    return struct_module(reference).from_segments(segments)
