"""Generics bound to concrete types (brands) and ``extends`` in generated code.

kitchen.capnp's ``Box(T)``, ``Pair(K, V)`` and ``Store(T)`` are used with bindings
(``Box(Text)``, ``Box(List(Int32))``, ``Box(Tree)``, ``Box(Shop)``, ``Pair(Text, Box(Text))``,
``extends(Store(Text))``) and bare (``Box``). Each binding is a specialized class whose
parameter fields have the bound type; the bytes are the generic's, and pycapnp (which
resolves brands itself) is the reference both ways.
"""

from __future__ import annotations

import pytest

from tests.codegen.conftest import Generated


def test_each_binding_is_a_class_with_the_bound_types(generated: Generated) -> None:
    k = generated.kitchen
    boxes = k.Boxes.new_message()
    boxes.texts.value = "hello"
    boxes.texts.label = "a text"
    boxes.texts.next.value = "next"  # Box(T).next is Box(T): still Box(Text)
    boxes.numbers.set_value([1, -2, 3])
    tree = boxes.trees.init_value()
    tree.value = 41
    boxes.pair.key = "k"
    boxes.pair.value.value = "inner"
    read = k.Boxes.from_bytes(boxes.to_bytes())
    assert type(read.texts) is k.Box_Text.Reader
    assert read.texts.value == "hello"
    assert read.texts.next.value == "next"
    assert list(read.numbers.value) == [1, -2, 3]
    assert read.trees.value.value == 41
    assert read.pair.key == "k"
    assert read.pair.value.value == "inner"
    assert type(read.pair.value) is k.Box_Text.Reader


def test_wrong_type_for_a_bound_parameter_names_the_field(generated: Generated) -> None:
    boxes = generated.kitchen.Boxes.new_message()
    with pytest.raises(TypeError, match=r"^Box_Text\.value: expected str \(Text\), got int$"):
        boxes.texts.value = 5


def test_pycapnp_reads_what_the_specializations_build(generated: Generated) -> None:
    k = generated.kitchen
    boxes = k.Boxes.new_message()
    boxes.texts.value = "hello"
    boxes.numbers.set_value([7, 8])
    boxes.trees.init_value().value = 41
    boxes.pair.key = "k"
    boxes.pair.value.value = "inner"
    boxes.bare.label = "bare"
    with generated.reference.Boxes.from_bytes(boxes.to_bytes()) as ref:
        assert ref.texts.value == "hello"
        assert list(ref.numbers.value) == [7, 8]
        assert ref.trees.value.value == 41
        assert ref.pair.key == "k"
        assert ref.pair.value.value == "inner"
        assert ref.bare.label == "bare"


def test_specializations_read_what_pycapnp_builds(generated: Generated) -> None:
    k = generated.kitchen
    ref = generated.reference.Boxes.new_message()
    ref.texts.value = "from C++"
    ref.numbers.value = [4, 5, 6]
    ref.trees.value.value = -3
    ref.pair.value.value = "deep"
    ref.bare.value.set_as_text("unbound")
    read = k.Boxes.from_bytes(ref.to_bytes())
    assert read.texts.value == "from C++"
    assert list(read.numbers.value) == [4, 5, 6]
    assert read.trees.value.value == -3
    assert read.pair.value.value == "deep"
    # A generic used bare reads its parameter as AnyPointer.
    assert read.bare.value.as_text() == "unbound"


def test_a_specialized_interface_keeps_the_generic_schema_id(generated: Generated) -> None:
    k = generated.kitchen
    assert k.Store_Text._ID == k.Store._ID
    assert k.Store_Text.Client._INTERFACE_ID == k.Store._ID
    assert k.Box_Text._ID == k.Box._ID
    assert issubclass(k.TextStore.Client, k.Store_Text.Client)
    methods = k.TextStore.Server._METHODS
    assert methods[(k.Store._ID, 0)][0] == "put"
    assert methods[(k.Store._ID, 0)][1] is k.Store_Text.PutParams
    assert methods[(k.TextStore._ID, 0)][0] == "size"
    params = k.Store_Text.PutParams.new_message()
    params.value = "v"
    assert params.as_reader().value == "v"


def test_the_diamond_reaches_every_base_once(generated: Generated) -> None:
    k = generated.kitchen
    mro = k.Diamond.Client.__mro__
    assert mro.index(k.Left.Client) < mro.index(k.Base.Client)
    assert mro.index(k.Right.Client) < mro.index(k.Base.Client)
    assert mro.count(k.Base.Client) == 1
    table = k.Diamond.Server._METHODS
    assert set(table) == {
        (k.Base._ID, 0),
        (k.Left._ID, 0),
        (k.Right._ID, 0),
        (k.Diamond._ID, 0),
    }
    assert table[(k.Base._ID, 0)][0] == "depth"


def test_parameter_names_that_collide_are_renamed(generated: Generated) -> None:
    import inspect

    k = generated.kitchen
    signature = inspect.signature(k.Diamond.Client.tricky)
    assert [p for p in signature.parameters][:6] == [
        "self",
        "self_",
        "request",
        "params",
        "unknown",
        "from_",
    ]
    results = k.Diamond.TrickyResults.new_message()
    results.return_ = "r"
    assert results.as_reader().return_ == "r"


def test_any_pointer_kinds_are_explicit(generated: Generated) -> None:
    """AnyPointer, AnyStruct and AnyList read as AnyPointer views; Capability as a typed
    client of no particular interface (cast it with ``cast_as``)."""
    from capsvc.typed import Client

    k = generated.kitchen
    built = k.Anything.new_message()
    built.init_anyStruct_as(k.Numbers.Builder).i32 = -7
    built.init_pointer_as(k.Numbers.Builder).u8 = 9
    assert not hasattr(built, "init_anyList_as")  # an AnyList holds no struct
    read = k.Anything.from_bytes(built.to_bytes())
    assert read.anyStruct.as_struct(k.Numbers.Reader).i32 == -7
    assert read.pointer.as_struct(k.Numbers.Reader).u8 == 9
    assert read.anyList.is_null
    capability = read.capability
    assert type(capability) is Client  # null here: no cap table in a plain message
    assert isinstance(capability.cast_as(k.Shop), k.Shop.Client)
    with generated.reference.Anything.from_bytes(built.to_bytes()) as ref:
        assert ref.anyStruct.as_struct(generated.reference.Numbers).i32 == -7
        assert ref.pointer.as_struct(generated.reference.Numbers).u8 == 9


def test_any_pointers_are_set_from_values(generated: Generated) -> None:
    """``set_<field>`` of an AnyPointer takes Text, Data, a struct (reader or builder,
    copied), another AnyPointer (copied) or None; an AnyStruct only a struct or None; a
    wrong value names the field and what it takes. pycapnp reads what they wrote."""
    k = generated.kitchen
    numbers = k.Numbers.new_message(i32=-7, u8=9)
    built = k.Anything.new_message()
    built.set_pointer("some text")
    built.set_anyStruct(numbers)  # a builder: copied
    read = k.Anything.from_bytes(built.to_bytes())
    assert read.pointer.as_text() == "some text"
    assert read.anyStruct.as_struct(k.Numbers.Reader).i32 == -7
    again = k.Anything.new_message()
    again.set_pointer(read.anyStruct)  # an AnyPointer read elsewhere: copied
    again.set_anyStruct(numbers.as_reader())
    copied = k.Anything.from_bytes(again.to_bytes())
    assert copied.pointer.as_struct(k.Numbers.Reader).u8 == 9
    assert copied.anyStruct.as_struct(k.Numbers.Reader).i32 == -7
    data = k.Anything.new_message()
    data.set_pointer(b"\x00\xff")
    assert k.Anything.from_bytes(data.to_bytes()).pointer.as_data() == b"\x00\xff"
    data.set_pointer(None)
    assert k.Anything.from_bytes(data.to_bytes()).pointer.is_null
    with generated.reference.Anything.from_bytes(built.to_bytes()) as ref:
        assert ref.pointer.as_text() == "some text"
        assert ref.anyStruct.as_struct(generated.reference.Numbers).i32 == -7
    with pytest.raises(TypeError, match=r"^Anything\.anyStruct: expected a struct reader or"):
        built.set_anyStruct("text")
    with pytest.raises(TypeError, match=r"^Anything\.pointer: expected str \(Text\), bytes"):
        built.set_pointer(3.5)


def test_a_nested_generic_bound_two_ways_is_two_classes(generated: Generated) -> None:
    """``Shelf(Tree).Slot(Text)`` and ``Shelf(Tree).Slot(List(Int32))`` in one struct: each
    its own class inside ``Shelf_Tree`` (one name for both once overwrote the first, so
    the Text slot read as a list), and a binding through an alias (``TextSlot``) too."""
    k = generated.kitchen
    shelves = k.Shelves.new_message()
    shelves.texts.extra = "words"
    shelves.texts.init_item().value = 7
    shelves.numbers.set_extra([4, 5])
    read = k.Shelves.from_bytes(shelves.to_bytes())
    assert type(read.texts) is k.Shelf_Tree.Slot_Text.Reader
    assert type(read.numbers) is k.Shelf_Tree.Slot_List_Int32.Reader
    assert read.texts.extra == "words"
    assert read.texts.item.value == 7
    assert list(read.numbers.extra) == [4, 5]
    assert read.aliased.extra == "by alias"  # the field's default, through the alias
    with generated.reference.Shelves.from_bytes(shelves.to_bytes()) as ref:
        assert ref.texts.extra == "words"
        assert ref.texts.item.value == 7
        assert list(ref.numbers.extra) == [4, 5]
        assert ref.aliased.extra == "by alias"
