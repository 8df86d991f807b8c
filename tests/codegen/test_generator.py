"""The generator itself: golden files, determinism, the CLI (``--check``), the compiler
plugin under the real ``capnp compile``, mypy --strict over generated code, and the errors
a user gets for a wrong value."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from capsvc.codegen import sources
from tests.codegen.conftest import SCHEMAS, Generated

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
ROOT = HERE.parent.parent
VENV_BIN = Path(sys.executable).parent
KITCHEN = os.path.join(SCHEMAS, "kitchen.capnp")
#: Real time: each command is another process (the generator's parse, capnp, mypy).
TIMEOUT = 300


def test_output_matches_the_golden_files(generated: Generated) -> None:
    """The renderer's output for every type kind, pinned (regenerate with
    ``./dev capsvc gen tests/schemas/kitchen.capnp -o tests/codegen/golden``)."""
    for name, text in sources(generated.schema).items():
        assert (GOLDEN / name).read_text(encoding="utf-8") == text, f"{name} changed"


def test_output_is_deterministic(generated: Generated) -> None:
    assert sources(generated.schema) == sources(generated.schema)


def capsvc(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "capsvc"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_gen_writes_the_modules_and_check_finds_stale_ones(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = capsvc("gen", KITCHEN, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["kitchen_capnp.py", "kitchen_other_capnp.py"]
    assert (out / "kitchen_capnp.py").read_text() == (GOLDEN / "kitchen_capnp.py").read_text()
    fresh = capsvc("gen", KITCHEN, "-o", str(out), "--check")
    assert fresh.returncode == 0, fresh.stderr
    (out / "kitchen_other_capnp.py").write_text("# edited by hand\n")
    stale = capsvc("gen", KITCHEN, "-o", str(out), "--check")
    assert stale.returncode == 1
    assert f"stale: {out / 'kitchen_other_capnp.py'}" in stale.stderr + stale.stdout
    assert (out / "kitchen_other_capnp.py").read_text() == "# edited by hand\n"  # untouched


def test_a_bad_schema_is_a_clear_error_not_a_crash(tmp_path: Path) -> None:
    bad = tmp_path / "bad.capnp"
    bad.write_text("@0xd0d0d0d0d0d0d0d1;\nstruct S { x @0 :NoSuchType; }\n")
    done = capsvc("gen", str(bad), "-o", str(tmp_path / "out"))
    assert done.returncode == 1
    assert "cannot parse" in done.stderr
    assert "NoSuchType" in done.stderr
    assert "stack:" not in done.stderr
    assert "what()" not in done.stderr  # kj's prefix: not ours to show


def test_capnp_compile_with_the_plugin_gives_the_same_modules(tmp_path: Path) -> None:
    """``capnp compile -ocapsvc:DIR`` (Debian's capnproto, installed by ./dev) runs
    capnpc-capsvc with a CodeGeneratorRequest: same bytes as ``capsvc gen``."""
    capnp_tool = shutil.which("capnp")
    assert capnp_tool is not None, "the capnp tool is missing (./dev installs capnproto)"
    done = subprocess.run(
        [
            capnp_tool,
            "compile",
            f"-I{SCHEMAS}",
            f"-o{VENV_BIN / 'capnpc-capsvc'}:{tmp_path}",
            KITCHEN,
            os.path.join(SCHEMAS, "kitchen_other.capnp"),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in ("kitchen_capnp.py", "kitchen_other_capnp.py"):
        assert (tmp_path / name).read_text() == (GOLDEN / name).read_text(), name


TYPED_USER = """
import kitchen_capnp as k

def total(lot: k.Lists.Reader) -> int:
    return sum(lot.i32s) + len(lot.texts[0]) + lot.structs[0].i64

def build() -> k.Shapes.Builder:
    shape = k.Shapes.new_message()
    shape.name = "box"
    shape.square.side = 2.5
    shape.style.color = k.Color.blue
    return shape

def lists(source: k.Lists.Builder, reader: k.Lists.Reader, tree: k.Tree.Builder) -> None:
    target = k.Lists.new_message(colors=["red", k.Color.blue, 2])
    target.i32s = [1, 2]
    target.texts = source.texts
    target.datas = reader.datas
    target.nested = [[1], []]
    target.nested = source.nested
    target.voids = source.voids
    deep: int = source.nested[0][0] + sum(source.deep[0][0]) + len(source.voids)
    shop: k.Shop.Client = k.Anything.new_message().shops[0]
    source.colors[0] = "green"
    source.colors[1] = 2
    color: k.Color = source.colors[0]
    holder = k.Anything.new_message()
    holder.shop = shop
    holder.shop = None
    again: k.Shop.Client = holder.shop
    tree.children = [{"value": 1}, tree.as_reader()]
    for child in tree.children:
        child.value += 1

def tree_total(tree: k.Tree.Reader) -> int:
    value, children, left, _other, _anything = k.Tree.row(tree)
    total = value + sum(child[0] for child in children)
    if left is not None:
        total += left[0]
    return total

def pycapnp_idioms(data: bytes) -> int:
    with k.Tree.from_bytes(data, traversal_limit_words=1 << 20) as tree:
        copy: k.Tree.Builder = tree.as_builder()
        copy.value += 1
    return sum(t.value for t in k.Tree.read_multiple_bytes_packed(data)) + copy.value

def which(shape: k.Shapes.Reader) -> str:
    member = shape.which()
    if member is None:
        return "unknown"
    return member

class Shop(k.Shop.Server):
    def buy(self, params: k.Shop.BuyParams.Reader, results: k.Shop.BuyResults.Builder) -> None:
        results.total = params.count * 2.5
        results.receipt.u8 = 1

    async def list(
        self, params: k.Shop.ListParams.Reader, results: k.Shop.ListResults.Builder
    ) -> None:
        results.set_items(["a", "b"])

class Store(k.TextStore.Server):
    def put(
        self, params: k.Store_Text.PutParams.Reader, results: k.Store_Text.PutResults.Builder
    ) -> None:
        print(params.value.upper())

async def client(address: str) -> float:
    import capsvc

    async with capsvc.connect(address) as conn:
        shop = conn.bootstrap(k.Shop)
        total: float = (await shop.buy(item="pen", count=2)).total
        store = conn.bootstrap(k.TextStore)
        await store.put(value="x")
        text: str = (await store.get()).box.value
        diamond = conn.bootstrap(k.Diamond)
        again: k.Diamond.Client = diamond.tricky(self_="s").self_
        depth: int = (await again.cast_as(k.Base).depth()).depth
        return total + len(text) + depth
"""
#: Each line a deliberate type error that mypy must report (line number -> message part).
TYPE_ERROR = """
import kitchen_capnp as k

def wrong(numbers: k.Numbers.Builder) -> None:
    numbers.u16 = "seven"

class Shop(k.Shop.Server):
    def buy(self, params: k.Shop.ListParams.Reader, results: k.Shop.BuyResults.Builder) -> None:
        pass

async def call(shop: k.Shop.Client, store: k.TextStore.Client) -> None:
    await shop.buy(item=3)
    await shop.buy(itme="pen")
    number: int = (await store.get()).value

def read(numbers: k.Numbers.Reader) -> str:
    return numbers.u16

def row_text(tree: k.Tree.Reader) -> str:
    return k.Tree.row(tree)[0]

def enums_and_lists(numbers: k.Numbers.Builder, lists: k.Lists.Builder) -> None:
    numbers.color = "blue"
    numbers.color = "bleu"
    k.Numbers.new_message(color="gren")
    lists.texts = ["a", 2]
    lists.nested[0][0] = "x"
"""
TYPE_ERRORS = {
    5: 'Incompatible types in assignment (expression has type "str"',
    8: 'Argument 1 of "buy" is incompatible with supertype "kitchen_capnp.Shop.Server"',
    12: 'Argument "item" to "buy" of "Client" has incompatible type "int"',
    13: 'Argument "itme" to "buy" of "Client" has incompatible type "str"; expected "Never"',
    14: 'Incompatible types in assignment (expression has type "str", variable has type "int")',
    17: 'Incompatible return value type (got "int", expected "str")',  # a compiled descriptor
    20: 'Incompatible return value type (got "int", expected "str")',  # a row's position
    24: "expression has type \"Literal['bleu']\", variable has type \"Literal['red', 'green',",
    25: 'Argument "color" to "new_message" of "Numbers" has incompatible type "Literal[\'gren\']',
    26: 'List item 1 has incompatible type "int"; expected "str | None"',
    27: 'Incompatible types in assignment (expression has type "str", target has type "int")',
}


def mypy(tmp_path: Path, *files: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", *files],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_generated_code_and_its_users_pass_mypy_strict(tmp_path: Path) -> None:
    for name in ("kitchen_capnp.py", "kitchen_other_capnp.py"):
        shutil.copy(GOLDEN / name, tmp_path / name)
    (tmp_path / "typed_user.py").write_text(TYPED_USER)
    done = mypy(tmp_path, "kitchen_capnp.py", "kitchen_other_capnp.py", "typed_user.py")
    assert done.returncode == 0, done.stdout
    (tmp_path / "type_error.py").write_text(TYPE_ERROR)
    wrong = mypy(tmp_path, "type_error.py")
    assert wrong.returncode == 1
    for line, message in TYPE_ERRORS.items():
        reported = [text for text in wrong.stdout.splitlines() if f"type_error.py:{line}:" in text]
        assert any(message in text for text in reported), (line, message, wrong.stdout)


def test_wrong_values_name_the_field_and_the_schema_type(generated: Generated) -> None:
    kitchen = generated.kitchen
    numbers = kitchen.Numbers.new_message()
    with pytest.raises(TypeError, match=r"^Numbers\.u16: expected an int \(UInt16\), got str$"):
        numbers.u16 = "seven"
    with pytest.raises(
        ValueError, match=r"^Numbers\.u8: 300 is out of range for UInt8 \(0\.\.255\)$"
    ):
        numbers.u8 = 300
    with pytest.raises(ValueError, match=r"^Numbers\.i8: -129 is out of range for Int8"):
        numbers.i8 = -129
    with pytest.raises(TypeError, match=r"^Numbers\.b: expected bool \(Bool\), got int$"):
        numbers.b = 1
    with pytest.raises(TypeError, match=r"^Numbers\.f32: expected a number \(Float32\), got str$"):
        numbers.f32 = "x"
    lists = kitchen.Lists.new_message()
    with pytest.raises(TypeError, match=r"^Lists\.texts\[1\]: expected str \(Text\), got int$"):
        lists.set_texts(["a", 2])
    with pytest.raises(ValueError, match=r"^Lists\.u8s\[0\]: 256 is out of range for UInt8"):
        lists.init_u8s(1)[0] = 256
    with pytest.raises(TypeError, match=r"^Shapes\.name: expected str \(Text\), got bytes$"):
        kitchen.Shapes.new_message().name = b"box"  # type: ignore[assignment]
    assert numbers.as_reader().to_dict()["u16"] == 0  # nothing half-written


def test_defaults_and_constants(generated: Generated) -> None:
    kitchen = generated.kitchen
    empty = kitchen.Defaults.new_message().as_reader()
    assert (empty.b, empty.i8, empty.u64, empty.f32, empty.f64) == (
        True, -7, 18000000000000000000, 1.5, -2.25
    )  # fmt: skip
    assert empty.color is kitchen.Color.blue
    assert (empty.text, empty.data) == ("hello", b"\x01\x02\xfe")
    assert (empty.numbers.i32, empty.numbers.color, empty.numbers.b) == (
        42, kitchen.Color.green, True
    )  # fmt: skip
    assert list(empty.list) == [1, -2, 3]
    assert list(empty.texts) == ["a", "bc"]
    built = kitchen.Defaults.new_message()
    built.numbers.u8 = 9  # a builder's struct field starts as a copy of its default
    assert built.as_reader().numbers.to_dict()["i32"] == 42
    assert kitchen.answer == 42
    assert kitchen.greeting == "hi there"
    assert kitchen.origin.i16 == -5
    assert list(kitchen.primes) == [2, 3, 5, 7]
    assert kitchen.pi == 3.14159


def test_infinities_and_nan_have_python_spellings(generated: Generated) -> None:
    """``inf``, ``-inf`` and ``nan`` (constants, and a method parameter's default) are
    ``float("inf")`` and so on in the source: they have no Python literal."""
    kitchen = generated.kitchen
    assert kitchen.infinity == math.inf
    assert kitchen.lowest == -math.inf
    assert math.isnan(kitchen.notANumber)
    assert generated.reference.infinity == math.inf
    source = (GOLDEN / "kitchen_capnp.py").read_text()
    assert 'infinity: float = float("inf")' in source
    assert 'volume: float = float("inf"),' in source


def test_enum_constants_declared_before_their_enum(generated: Generated) -> None:
    """A constant of an enum that the schema declares after it (in a struct, and at the
    top level) holds that enum's member once the module is imported."""
    kitchen = generated.kitchen
    assert kitchen.Settings.fallback is kitchen.Mood.cross
    assert kitchen.bestMood is kitchen.Mood.calm
    assert generated.reference.Settings.fallback == "cross"  # pycapnp agrees
    assert generated.reference.bestMood == "calm"
    assert kitchen.Settings.new_message().as_reader().mood is kitchen.Mood.calm


def test_nested_nodes_no_field_uses_are_generated(generated: Generated) -> None:
    """Crate is reached through Parcel's field before its declaration; its nested enum
    and constant, which no field uses, are generated all the same (and the plugin test
    above checks ``capsvc gen`` and ``capnp compile`` agree on every node)."""
    crate = generated.kitchen.Crate
    assert [(m.name, int(m)) for m in crate.Seal] == [("open", 0), ("shut", 1)]
    assert crate.capacity == 12
    assert generated.reference.Crate.capacity == 12


def test_a_file_imported_relatively_and_absolutely_is_one_file(tmp_path: Path) -> None:
    """one.capnp imports ``shared.capnp`` next to it, two.capnp the same file as
    ``/pkg/shared.capnp`` through ``-I``: one file to the compiler, as to ``capnp
    compile`` (test.capnp's ``c++.capnp`` once failed as a duplicate ID)."""
    pkg = tmp_path / "src" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "shared.capnp").write_text("@0xd6b8e0a0a1a2a3c1;\nstruct Shared { n @0 :UInt8; }\n")
    (pkg / "one.capnp").write_text(
        '@0xd6b8e0a0a1a2a3c2;\nusing import "shared.capnp".Shared;\nstruct One { s @0 :Shared; }\n'
    )
    (pkg / "two.capnp").write_text(
        '@0xd6b8e0a0a1a2a3c3;\nusing import "/pkg/shared.capnp".Shared;\n'
        "struct Two { s @0 :Shared; }\n"
    )
    out = tmp_path / "out"
    done = capsvc(
        "gen", str(pkg / "one.capnp"), str(pkg / "two.capnp"), "-I", str(tmp_path / "src"),
        "-o", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "one_capnp.py",
        "shared_capnp.py",
        "two_capnp.py",
    ]


def test_a_streaming_method_imports_capsvcs_stream_module(tmp_path: Path) -> None:
    """``-> stream`` imports /capnp/stream.capnp implicitly: found in pycapnp's directory
    with no ``-I``, and imported from capsvc.generated rather than written beside."""
    schema = tmp_path / "sink.capnp"
    schema.write_text(
        "@0xd6b8e0a0a1a2a3a7;\ninterface Sink { write @0 (chunk :Data) -> stream; }\n"
    )
    out = tmp_path / "out"
    done = capsvc("gen", str(schema), "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["sink_capnp.py"]
    source = (out / "sink_capnp.py").read_text()
    assert "from capsvc.generated import stream_capnp\n" in source
    assert "-> _t.StreamCall:" in source  # the client: flow control (capsvc.streaming)
    assert "results: stream_capnp.StreamResult.Builder)" in source  # the server base


def test_fields_named_after_builtin_types_keep_their_names(generated: Generated) -> None:
    """``str``, ``bytes``, ``bool``, ``int``, ``list`` and ``type`` fields read and write
    under those names (the mypy test above checks the annotations that they shadow)."""
    k = generated.kitchen
    values = {"str": "s", "bytes": b"b", "bool": True, "int": -3, "list": ["x"], "type": 1.5}
    built = k.Builtins.new_message(**values)
    read = k.Builtins.from_bytes(built.to_bytes())
    assert (read.str, read.bytes, read.bool, read.int, list(read.list), read.type) == (
        "s", b"b", True, -3, ["x"], 1.5
    )  # fmt: skip
    assert k.Builtins.row(read) == ("s", b"b", True, -3, ["x"], 1.5)
    with generated.reference.Builtins.from_bytes(built.to_bytes()) as ref:
        assert ref.to_dict() == {**values, "list": ["x"]}
    source = (GOLDEN / "kitchen_capnp.py").read_text()
    assert "import builtins as _builtins\n" in source
    assert "str: _builtins.str | None = _e.MISSING," in source


def test_to_dict_names_the_union_member_set_even_when_null(generated: Generated) -> None:
    """An empty Choice has its first member, a Text, set and null: ``to_dict`` gives it
    (as ``""``), as pycapnp's does; other null pointers stay left out."""
    k = generated.kitchen
    data = k.Choice.new_message().to_bytes()
    assert k.Choice.from_bytes(data).to_dict() == {"note": ""}
    with generated.reference.Choice.from_bytes(data) as ref:
        assert ref.to_dict() == {"note": ""}
    numbers = k.Choice.new_message(numbers={})
    assert k.Choice.from_bytes(numbers.to_bytes()).to_dict()["numbers"]["i32"] == 0
    assert k.Tree.new_message(value=1).as_reader().to_dict() == {"value": 1}  # nulls left out


def test_names_that_collide_get_a_trailing_underscore(generated: Generated) -> None:
    kitchen = generated.kitchen
    message = kitchen.Keywords.new_message()
    message.return_ = 5
    message.which_ = 7
    message.class_ = "c"
    reader = message.as_reader()
    assert (reader.return_, reader.which_, reader.class_) == (5, 7, "c")
    assert kitchen.Tree.Reader_.Reader._DATA_WORDS == 1  # the nested struct named Reader


def test_a_keyword_for_a_field_keywords_cannot_set_names_the_request_form(
    generated: Generated,
) -> None:
    """``Store.put (value :T)``, T unbound: an AnyPointer, which no keyword sets. The error
    for ``put(value=...)`` says so and names ``put_request()``, which sets it."""
    from capsvc.rpc.hooks import null_hook

    store = generated.kitchen.Store.Client(null_hook())
    with pytest.raises(TypeError) as raised:
        store.put(value="x")
    assert str(raised.value) == (
        "Store.put() has no parameter value; its parameters are none"
        " (value: set them on put_request().params, then send())"
    )


def test_a_struct_field_takes_a_reader_a_builder_or_a_dict(generated: Generated) -> None:
    """``builder.field = value`` for a struct field, as pycapnp takes it: another
    message's reader or builder (copied), or a dict of its fields (or its row); anything
    else names the field and what it takes, and changes nothing."""
    k = generated.kitchen
    texts = k.Box_Text.new_message(value="from a builder")
    boxes = k.Boxes.new_message()
    boxes.texts = texts
    boxes.numbers = {"value": [1, 2, 3]}
    boxes.trees = k.Box_Tree.from_bytes(k.Box_Tree.new_message(value={"value": 7}).to_bytes())
    read = k.Boxes.from_bytes(boxes.to_bytes())
    assert read.texts.value == "from a builder"
    assert list(read.numbers.value) == [1, 2, 3]
    assert read.trees.value.value == 7
    with pytest.raises(TypeError) as raised:
        boxes.texts = "a str"
    assert str(raised.value) == (
        "Boxes.texts: expected a struct reader or builder, a dict of its fields, or its row,"
        " got str"
    )
    with pytest.raises(TypeError, match="has no field 'nope'"):
        boxes.texts = {"nope": 1}
    assert boxes.as_reader().texts.value == "from a builder"  # the refused one changed nothing
    boxes.texts = ("from a row", None, "label")
    assert (boxes.as_reader().texts.value, boxes.as_reader().texts.label) == ("from a row", "label")
