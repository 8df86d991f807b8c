"""List fields of generated builders as pycapnp's: ``builder.items = [...]`` sets a new
list from plain values (``new_message``'s), ``builder.items`` gives the list as built
so far, to read and to set element by element; a refused value changes nothing, and a
union member's list becomes the member set."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given

from capsvc.codegen.render import python_name
from tests.codegen.conftest import Generated
from tests.codegen.test_roundtrip import SETTINGS, _reference_root, new_reference
from tests.codegen.values import struct_named, values


def test_every_kind_of_list_assigned_as_pycapnp_assigns_it(generated: Generated) -> None:
    """Every field of kitchen's ``Lists`` (each element kind, lists of lists) assigned one
    by one builds what pycapnp's ``new_message`` builds from the same values, and each
    getter reads back what was assigned."""
    struct = struct_named(generated.schema, "Lists", 0)
    ours, reference = generated.kitchen.Lists, generated.reference.Lists

    @SETTINGS
    @given(values(generated.schema, struct))
    def check(data: dict[str, Any]) -> None:
        builder = ours.new_message()
        for name, value in data.items():
            setattr(builder, python_name(name), value)
        expected = new_reference(reference, data).as_reader().to_dict()
        segments = [bytes(s) for s in builder.to_segments()]
        assert _reference_root(reference, segments).to_dict() == expected
        assert ours.Reader.read(segments).to_dict() == expected
        for name in ("bools", "i8s", "u64s", "f64s", "texts", "datas"):
            if name in data:
                assert [getattr(builder, name)[i] for i in range(len(data[name]))] == [
                    getattr(builder.as_reader(), name)[i] for i in range(len(data[name]))
                ]

    check()


def test_the_getter_gives_the_list_to_set_element_by_element(generated: Generated) -> None:
    k = generated.kitchen
    tree = k.Tree.new_message(value=1)
    assert len(tree.children) == 0  # null: an empty list, nothing allocated
    assert not tree.as_reader()._has(1)
    tree.children = [{"value": 2}, {"value": 3, "children": [{"value": 4}]}]
    tree.children[0].value = 20
    tree.children[1].children[0].left = {"value": 5}
    assert tree.as_reader().to_dict() == {
        "value": 1,
        "children": [
            {"value": 20},
            {"value": 3, "children": [{"value": 4, "left": {"value": 5}}]},
        ],
    }
    lists = k.Lists.new_message()
    lists.init_texts(2)
    lists.texts[1] = "set through the getter"
    assert list(lists.texts) == ["", "set through the getter"]
    lists.nested = [[1, 2]]
    lists.nested.init(0, 3)[2] = 7  # a list of lists: init an element anew
    assert [list(inner) for inner in lists.as_reader().nested] == [[0, 0, 7]]
    again = k.Lists.new_message()
    again.texts = lists.texts  # a list being built: copied
    assert list(again.texts) == list(lists.texts)
    copy = k.Tree.new_message()
    copy.children = tree.as_reader().children  # a reader of another message: deep-copied
    assert copy.as_reader().to_dict()["children"] == tree.as_reader().to_dict()["children"]
    lists.texts = None
    assert not lists.as_reader()._has(12)


def test_a_refused_list_changes_nothing_and_names_the_element(generated: Generated) -> None:
    lists = generated.kitchen.Lists.new_message(i32s=[1, 2], texts=["kept"])
    with pytest.raises(ValueError, match=r"^Lists\.i32s\[1\]: .* out of range for Int32"):
        lists.i32s = [3, 1 << 40]
    with pytest.raises(TypeError, match=r"^Lists\.texts\[0\]: expected str \(Text\), got int"):
        lists.texts = [5]
    with pytest.raises(TypeError, match=r"^Lists\.texts: expected a sequence"):
        lists.texts = "not a list"
    with pytest.raises(ValueError, match=r"^Lists\.i32s\[1\]: .* out of range for Int32"):
        lists.set_i32s([3, 1 << 40])  # (the older setter: the same checks)
    assert lists.as_reader().to_dict() == {"i32s": [1, 2], "texts": ["kept"]}


def test_a_union_members_list(generated: Generated) -> None:
    """Assigning ``Shapes.points`` makes it the member set; its getter while another
    member is set (one whose pointer may hold the slot) is an error naming the field and
    the member set, not a misread, as pycapnp's builders refuse it."""
    shapes = generated.kitchen.Shapes.new_message(name="s", circle=1.5)
    shapes.points = [1, -1]
    assert shapes.which() == "points"
    assert list(shapes.points) == [1, -1]
    shapes.square.label = "a label in the same pointer"
    with pytest.raises(ValueError, match=r"^Shapes\.points: not the union member set \(which"):
        shapes.points  # noqa: B018
    shapes.circle = 2.0
    with pytest.raises(ValueError, match=r"\(which\(\) is 'circle'\)"):
        shapes.points  # noqa: B018
    shapes.points = []
    got = shapes.as_reader().to_dict()
    assert (got["name"], got["points"], shapes.which()) == ("s", [], "points")


def test_readers_and_builders_show_their_fields(generated: Generated) -> None:
    """``repr`` of a generated reader or builder shows its fields (its ``to_dict()``),
    cut short for a large message; a message that cannot be read shows why instead of
    raising; a builder's ``to_dict()`` is its reader's, as in pycapnp."""
    from capsvc.codec.reading import REPR_LIMIT

    k = generated.kitchen
    tree = k.Tree.new_message(value=7, children=[{"value": 8}])
    shown = "{'value': 7, 'children': [{'value': 8}]}"
    assert repr(tree) == f"<Tree.Builder {shown}>"
    assert repr(tree.as_reader()) == f"<Tree.Reader {shown}>"
    assert tree.to_dict() == tree.as_reader().to_dict()
    big = k.Lists.new_message(texts=["x" * 100] * 100)
    assert len(repr(big.as_reader())) < REPR_LIMIT + 50
    assert repr(big.as_reader()).endswith(" ...}>")
    # The root's `left` pointer (word 3: a null struct pointer) made a list pointer.
    segment = bytearray(b"".join(bytes(s) for s in tree.to_segments()))
    segment[8 * 3 : 8 * 3 + 4] = (0x7FFF << 2 | 1).to_bytes(4, "little")
    hostile = repr(k.Tree.Reader.read([bytes(segment)]))
    assert hostile.startswith("<Tree.Reader (unreadable: DecodeError: "), hostile


def test_a_null_list_with_a_schema_default_gets_a_copy_of_it(generated: Generated) -> None:
    """As libcapnp's builders (and so pycapnp's): reading a null list field that has a
    schema default puts a copy of the default there, to read and to change."""
    defaults = generated.kitchen.Defaults.new_message()
    assert list(defaults.list) == [1, -2, 3]
    assert list(defaults.texts) == ["a", "bc"]
    defaults.list[0] = 10
    assert list(defaults.as_reader().list) == [10, -2, 3]
    reference = generated.reference.Defaults.new_message()
    assert list(reference.list) == [1, -2, 3]  # pycapnp's builder: the same


def test_lists_of_lists_void_lists_and_capability_lists_read_back_and_copy(
    generated: Generated,
) -> None:
    """As pycapnp's builders: a list of lists gives its element lists by index (to read
    and to set element by element), a List(Void) its Nones, and a capability list a
    client per element; each of them, being built, can be assigned to another message's
    field (copied)."""
    k = generated.kitchen
    lists = k.Lists.new_message()
    nested = lists.init_nested(3)
    nested.init(0, 2)
    lists.nested[0][1] = 7  # the element list, through the getters
    nested.init(2, 1)[0] = 9
    assert [list(inner) for inner in lists.nested] == [[0, 7], [], [9]]
    with pytest.raises(IndexError, match=r"^Lists\.nested: index 3 out of range for a list of 3"):
        lists.nested[3]
    lists.init_deep(2).init(1, 1).init(0, 2)[1] = 5
    assert list(lists.deep[1][0]) == [0, 5]
    lists.init_voids(3)
    assert list(lists.voids) == [None, None, None]
    with pytest.raises(IndexError, match=r"^Lists\.voids: index -4 out of range"):
        lists.voids[-4]
    copy = k.Lists.new_message()
    copy.nested = lists.nested
    copy.deep = lists.deep
    copy.voids = lists.voids
    got = copy.as_reader().to_dict()
    assert (got["nested"], got["deep"], got["voids"]) == (
        [[0, 7], [], [9]],
        [[], [[0, 5]]],
        [None] * 3,
    )
    lists.nested[0][0] = 1  # a copy, not a view of the other message
    assert list(copy.nested[0]) == [0, 7]


def test_void_fields_and_void_list_elements_take_none(generated: Generated) -> None:
    """As pycapnp's builders: a Void field reads None and takes None, and so does a
    List(Void) element; anything else is a TypeError naming the field."""
    k = generated.kitchen
    numbers = k.Numbers.new_message()
    assert numbers.v is None
    numbers.v = None
    with pytest.raises(TypeError, match=r"Numbers\.v"):
        numbers.v = 0  # type: ignore[assignment]
    voids = k.Lists.new_message().init_voids(2)
    voids[1] = None
    voids[-2] = None
    with pytest.raises(TypeError, match=r"Lists\.voids\[0\]"):
        voids[0] = 0
    with pytest.raises(IndexError, match=r"index 2 out of range"):
        voids[2] = None


async def test_a_capability_list_being_built_gives_its_clients(generated: Generated) -> None:
    k = generated.kitchen

    class Shop(k.Shop.Server):  # type: ignore[misc, name-defined]
        def list(self, params: Any, results: Any) -> None:
            results.items = ["from the shop"]

    holder = k.Anything.new_message(shops=[Shop(), None])
    first, second = holder.shops
    assert (await first.list()).items == ["from the shop"]
    assert second._capsvc_hook().is_null
    copy = k.Anything.new_message()
    copy.shops = holder.shops  # a list being built: copied, capabilities and all
    assert (await copy.as_reader().shops[0].list()).items == ["from the shop"]
    assert copy.as_reader().shops[1]._capsvc_hook().is_null


async def test_a_capability_field_is_a_property_as_in_pycapnp(generated: Generated) -> None:
    """``builder.shop = Shop()`` as pycapnp's builders take it, and ``builder.shop`` reads
    it back as a client (null: a client whose calls fail); ``set_shop`` still works."""
    k = generated.kitchen

    class Shop(k.Shop.Server):  # type: ignore[misc, name-defined]
        def list(self, params: Any, results: Any) -> None:
            results.items = ["from the shop"]

    holder = k.Anything.new_message()
    assert holder.shop._capsvc_hook().is_null
    holder.shop = Shop()
    assert (await holder.shop.list()).items == ["from the shop"]
    assert (await holder.as_reader().shop.list()).items == ["from the shop"]
    with pytest.raises(TypeError, match=r"^Anything\.shop: expected a capability"):
        holder.shop = "not a capability"
    holder.shop = None
    assert holder.shop._capsvc_hook().is_null
    assert not holder.as_reader()._has(4)


def test_an_enum_list_being_built_reads_members_and_takes_names(generated: Generated) -> None:
    """As an enum field (and a reader's enum list): elements read as the enum's members
    and take a member, a code or a name; a refused one is an error naming the element
    and changes nothing."""
    k = generated.kitchen
    lists = k.Lists.new_message(colors=["red", 2])
    assert list(lists.colors) == [k.Color.red, k.Color.blue]
    lists.colors[0] = "green"
    lists.colors[1] = k.Color.red
    assert lists.as_reader().to_dict()["colors"] == ["green", "red"]
    with pytest.raises(ValueError, match=r"^Lists\.colors\[0\]: Color has no enumerant 'mauve'"):
        lists.colors[0] = "mauve"
    assert lists.colors[0] is k.Color.green
    copy = k.Lists.new_message()
    copy.colors = lists.colors  # members, copied
    assert list(copy.as_reader().colors) == [k.Color.green, k.Color.red]


def test_set_all_is_all_or_nothing(generated: Generated) -> None:
    """A refused element (the first one's error, naming it) leaves every element as it
    was, for numbers and for enums (found by a sweep against pycapnp)."""
    k = generated.kitchen
    lists = k.Lists.new_message()
    u32s = lists.init_u32s(3)
    u32s.set_all([10, 11, 12])
    with pytest.raises(ValueError, match=r"^Lists\.u32s\[2\]: -5 is out of range for UInt32"):
        u32s.set_all([1, 2, -5])
    assert list(u32s) == [10, 11, 12]
    colors = lists.init_colors(2)
    colors.set_all(["green", k.Color.blue])
    with pytest.raises(ValueError, match=r"Lists\.colors\[1\]"):
        colors.set_all(["red", "purple"])
    assert list(colors) == [k.Color.green, k.Color.blue]


def test_a_dict_set_in_place_takes_one_reference_per_capability() -> None:
    """A dict set on a struct field or a group is checked by encoding it alone first; that
    copy took a reference to each capability in it and kept it, so the server object
    stayed referenced after every reference of the message itself was gone. Now each
    capability set takes exactly the one reference its new cap table entry holds."""
    from tests.generated import testing_capnp as t

    class Counter(t.Counter.Server):  # type: ignore[misc]
        pass

    holder = t.Holder.new_message(cap=Counter())
    client = holder.cap
    hook = client._capsvc_hook()
    before = hook.refs
    holder.inner = {"name": "x", "cap": client}
    assert hook.refs == before + 1  # the inner struct's cap table entry
    holder.inner = {"name": "y"}  # no capability: no reference
    assert hook.refs == before + 1

    class Callback(t.Callback.Server):  # type: ignore[misc]
        pass

    callback = t.Holder.new_message(extra={"callback": Callback()}).extra.callback
    callback_hook = callback._capsvc_hook()
    before = callback_hook.refs
    holder.extra = {"number": 2, "callback": callback}  # a group: the same check
    assert callback_hook.refs == before + 1


def test_a_message_of_its_own_releases_its_capabilities_when_it_is_gone() -> None:
    """A builder of a message of its own holds one reference per cap-table entry (a field
    set twice has two, as in libcapnp) and releases them all when it is gone; a reader of
    it keeps the message, and so the references, while it lives. A call's params or
    results builder does not: its payload owns them (tests/interop: the imports)."""
    import gc

    from tests.generated import testing_capnp as t

    class Counter(t.Counter.Server):  # type: ignore[misc]
        pass

    client = t.Holder.new_message(cap=Counter()).cap
    hook = client._capsvc_hook()
    gc.collect()
    before = hook.refs
    holder = t.Holder.new_message(cap=client, caps=[client, client])
    holder.cap = client
    holder.inner = {"cap": client}
    assert hook.refs == before + 5
    del holder
    gc.collect()
    assert hook.refs == before
    reader = t.Holder.new_message(cap=client).as_reader()
    gc.collect()
    assert hook.refs == before + 1
    assert reader.cap._hook.shortest() is hook  # (its client holds one more, let go at once)
    del reader
    gc.collect()
    assert hook.refs == before
