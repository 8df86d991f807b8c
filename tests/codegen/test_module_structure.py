"""How generated modules are laid out where Python's order of definition matters: a nested
interface extending a sibling or its enclosing interface (rendered at module level and
bound in place: capsvc.typed.nest), and schema files that import each other (modules
linked once all have made their classes: capsvc.linking). Each schema is generated with
``capsvc gen`` and with the compiler plugin (same bytes), imported in a fresh interpreter
in every order, used, and checked with mypy --strict."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.codegen.test_generator import ROOT, TIMEOUT, VENV_BIN, capsvc, mypy

NESTED = """@0xe0c1d2e3f4a5b611;
interface Outer {
  ping @0 () -> (n :UInt32);
  interface Base { base @0 (x :Int32) -> (y :Int32); }
  interface Derived extends(Base) {
    derived @0 (d :Derived) -> (again :Derived, info :Info);
    interface Inner extends(Derived) { inner @0 () -> (); }
  }
  interface Child extends(Outer) { child @0 () -> (s :Text); }
  struct Info { note @0 :Text; peer @1 :Derived; }
}
struct Holder {
  interface Base { ping @0 () -> (); }
  interface Derived extends(Base) {}
  held @0 :Derived;
}
interface Top extends(Outer.Derived.Inner, Holder.Derived) {}
"""

NESTED_USE = """
from __future__ import annotations

import trio

import capsvc
import nest_capnp as n


class Derived(n.Outer.Derived.Server):
    def base(
        self, params: n.Outer.Base.BaseParams.Reader, results: n.Outer.Base.BaseResults.Builder
    ) -> None:
        results.y = params.x + 1

    def derived(
        self,
        params: n.Outer.Derived.DerivedParams.Reader,
        results: n.Outer.Derived.DerivedResults.Builder,
    ) -> None:
        results.set_again(self)
        results.info.note = "derived"


class Child(n.Outer.Child.Server):
    def ping(self, params: n.Outer.PingParams.Reader, results: n.Outer.PingResults.Builder) -> None:
        results.n = 7

    async def child(
        self, params: n.Outer.Child.ChildParams.Reader, results: n.Outer.Child.ChildResults.Builder
    ) -> None:
        results.s = "child"


async def call(address: str, child_address: str) -> list[object]:
    async with capsvc.connect(address) as conn:
        derived = conn.bootstrap(n.Outer.Derived)
        as_base: n.Outer.Base.Client = derived  # a subclass, for mypy as at run time
        again = derived.derived().again  # pipelined: a typed Outer.Derived.Client
        got: list[object] = [(await as_base.base(x=41)).y, (await again.base(x=1)).y]
        got.append((await derived.derived()).info.note)
    async with capsvc.connect(child_address) as conn:
        child = conn.bootstrap(n.Outer.Child)
        got += [(await child.ping()).n, (await child.child()).s]
    return got


async def main() -> list[object]:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", Derived())
        child_address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", Child())
        got = await call(address, child_address)
        nursery.cancel_scope.cancel()
    return got


if __name__ == "__main__":
    print(trio.run(main))
    print(n.Outer.Derived.Client.derived.__qualname__, n.Outer.Derived.Inner.Server.__qualname__)
    print(n.Outer.Derived.DerivedParams.Reader.__qualname__, n.Holder.Derived.__name__)
    assert issubclass(n.Top.Client, n.Outer.Derived.Inner.Client)
    assert issubclass(n.Top.Client, n.Holder.Base.Client)
    assert n.Outer.Derived.Inner.Server._METHODS.keys() >= n.Outer.Base.Server._METHODS.keys()
"""

A_CAPNP = """@0xe1f2a3b4c5d6e721;
using B = import "b.capnp";
struct A {
  b @0 :B.B;
  color @1 :B.Color = green;
  colors @2 :List(B.Color) = [red, green];
  bs @3 :List(B.B);
  withDefault @4 :B.B = (n = 7);
  n @5 :Int32;
  union { x @6 :Void; y @7 :B.B; }
}
enum Shade { dark @0; light @1; }
interface Pinger extends(B.Base) { pong @0 (a :A) -> (b :B.B, shade :Shade); }
const defaultColor :B.Color = blue;
const sample :B.B = (n = 3);
"""
B_CAPNP = """@0xe1f2a3b4c5d6e722;
using A = import "a.capnp";
enum Color { red @0; green @1; blue @2; }
struct B {
  n @0 :Int32;
  a @1 :A.A;
  shade @2 :A.Shade;
  struct Inner { as @0 :List(A.A); }
}
interface Base { base @0 (s :A.Shade) -> (a :A.A); }
"""

CYCLE_USE = """
from __future__ import annotations

import sys

import trio

import capsvc

if sys.argv[1] == "b":
    import b_capnp
import a_capnp
import b_capnp


class Pinger(a_capnp.Pinger.Server):
    def base(
        self, params: b_capnp.Base.BaseParams.Reader, results: b_capnp.Base.BaseResults.Builder
    ) -> None:
        results.a.n = 40 + params.s

    def pong(
        self, params: a_capnp.Pinger.PongParams.Reader, results: a_capnp.Pinger.PongResults.Builder
    ) -> None:
        results.b.n = params.a.n
        results.shade = a_capnp.Shade.light


async def main() -> list[int]:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", Pinger())
        async with capsvc.connect(address) as conn:
            pinger = conn.bootstrap(a_capnp.Pinger)
            got = [(await pinger.base(s=1)).a.n]
            got.append((await pinger.pong(a=a_capnp.A.new_message(n=3).as_reader())).b.n)
        nursery.cancel_scope.cancel()
    return got


def main_sync() -> None:
    b_value: b_capnp.B.Init = {"a": {"n": 5}, "n": 2, "shade": "light"}
    a = a_capnp.A.new_message(b=b_value, colors=["blue"], y={"n": 4})
    read = a_capnp.A.from_bytes(a.to_bytes())
    print(read.to_dict())
    print(a_capnp.A.row(read))
    print(read.b.a.n, read.b.shade.name, read.withDefault.n, end=" ")
    print(a_capnp.defaultColor.name, a_capnp.sample.n)
    b = b_capnp.B.new_message(a={"b": {"n": 1}, "color": "red"}, shade=1)
    inner = b_capnp.B.Inner.new_message(as_=[{"n": 8}])
    print(b_capnp.B.from_bytes(b.to_bytes()).to_dict(), a_capnp.A.rows(inner.as_reader().as_))
    print(trio.run(main))


main_sync()
"""


def run(directory: Path, script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, script, *args],
        cwd=directory,
        env={**os.environ, "PYTHONPATH": f"{directory}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def generate(tmp_path: Path, schemas: dict[str, str], *compiled: str) -> Path:
    """Write ``schemas`` into ``tmp_path``, generate the first with ``capsvc gen`` into
    ``out``, and check that ``capnp compile`` with the plugin (``compiled`` files) gives
    the same modules."""
    for name, text in schemas.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "out"
    first = str(tmp_path / next(iter(schemas)))
    done = capsvc("gen", first, "-o", str(out))
    assert done.returncode == 0, done.stderr
    capnp_tool = shutil.which("capnp")
    assert capnp_tool is not None, "the capnp tool is missing (./dev installs capnproto)"
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    done = subprocess.run(
        [capnp_tool, "compile", f"-I{tmp_path}", f"-o{VENV_BIN / 'capnpc-capsvc'}:{plugin}"]
        + [str(tmp_path / name) for name in compiled],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in compiled:
        module = name.replace(".", "_") + ".py"
        assert (plugin / module).read_text() == (out / module).read_text(), module
    return out


def test_nested_interfaces_extending_siblings_and_their_parent(tmp_path: Path) -> None:
    out = generate(tmp_path, {"nest.capnp": NESTED}, "nest.capnp")
    text = (out / "nest_capnp.py").read_text()
    assert 'Derived: TypeAlias = "_Nested_Outer_Derived"' in text
    assert '_t.nest(Outer.Derived, "Inner", _Nested_Outer_Derived_Inner)' in text
    (out / "use_nest.py").write_text(NESTED_USE)
    lines = run(out, "use_nest.py").splitlines()
    assert lines[0] == "[42, 2, 'derived', 7, 'child']"
    assert lines[1] == "Outer.Derived.Client.derived Outer.Derived.Inner.Server"
    assert lines[2] == "Outer.Derived.DerivedParams.Reader Derived"
    done = mypy(out, "nest_capnp.py", "use_nest.py")
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("first", ["a", "b"])
def test_schemas_that_import_each_other(tmp_path: Path, first: str) -> None:
    out = generate(tmp_path, {"a.capnp": A_CAPNP, "b.capnp": B_CAPNP}, "a.capnp", "b.capnp")
    for name in ("a_capnp.py", "b_capnp.py"):
        assert "_k.ready(globals()" in (out / name).read_text()
    (out / "use_cycle.py").write_text(CYCLE_USE)
    lines = run(out, "use_cycle.py", first).splitlines()
    assert lines[0] == (
        "{'b': {'n': 2, 'a': {'color': 'green', 'n': 5, 'x': None}, 'shade': 'light'},"
        " 'color': 'green', 'colors': ['blue'], 'n': 0, 'y': {'n': 4, 'shade': 'dark'}}"
    )
    assert lines[1].startswith("((2, (None, <Color.green: 1>, [<Color.red: 0>, <Color.green: 1>]")
    assert lines[2] == "5 light 7 blue 3"
    assert lines[3].startswith("{'n': 0, 'a': {'b': {'n': 1, 'shade': 'dark'}, 'color': 'red'")
    assert lines[3].endswith(
        "[(None, <Color.green: 1>, [<Color.red: 0>, <Color.green: 1>], [],"
        " (7, None, <Shade.dark: 0>), 8, True, None)]"
    )
    assert lines[4] == "[41, 3]"
    if first == "a":
        done = mypy(out, "a_capnp.py", "b_capnp.py", "use_cycle.py")
        assert done.returncode == 0, done.stdout


def test_a_longer_cycle_with_bases_across_files(tmp_path: Path) -> None:
    """x extends y's, m extends f's, f extends x's; y uses m, m uses f, f uses x: every
    order of import works (capsvc.linking waits while a module imports its bases)."""
    schemas = {
        "x.capnp": '@0xe1f2a3b4c5d6e731;\nusing Y = import "y.capnp";\n'
        "interface XI extends(Y.YJ) { x @0 () -> (); }\nstruct XS { n @0 :Int32; }\n",
        "y.capnp": '@0xe1f2a3b4c5d6e732;\nusing M = import "m.capnp";\n'
        "interface YJ { y @0 () -> (); }\nstruct YS { m @0 :M.MS; }\n",
        "m.capnp": '@0xe1f2a3b4c5d6e733;\nusing F = import "f.capnp";\n'
        "interface MI extends(F.FJ) { m @0 () -> (); }\nstruct MS { f @0 :F.FS; n @1 :Int32; }\n",
        "f.capnp": '@0xe1f2a3b4c5d6e734;\nusing X = import "x.capnp";\n'
        "interface FJ extends(X.XI) { f @0 () -> (); }\nstruct FS { x @0 :X.XS; }\n",
    }
    out = generate(tmp_path, schemas, *schemas)
    (out / "use.py").write_text(
        "import sys, importlib\n"
        "importlib.import_module(sys.argv[1])\n"
        "import m_capnp, y_capnp\n"
        "s = y_capnp.YS.new_message(m={'f': {'x': {'n': 4}}, 'n': 2})\n"
        "print(y_capnp.YS.from_bytes(s.to_bytes()).to_dict())\n"
        "print(sorted(v[0] for v in m_capnp.MI.Server._METHODS.values()))\n"
    )
    for first in ("x_capnp", "y_capnp", "m_capnp", "f_capnp"):
        assert run(out, "use.py", first).splitlines() == [
            "{'m': {'f': {'x': {'n': 4}}, 'n': 2}}",
            "['f', 'm', 'x', 'y']",
        ], first
    done = mypy(out, "x_capnp.py", "y_capnp.py", "m_capnp.py", "f_capnp.py")
    assert done.returncode == 0, done.stdout


def test_interfaces_extending_each_others_across_files_are_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a.capnp").write_text(
        '@0xe1f2a3b4c5d6e741;\nusing B = import "b.capnp";\n'
        "interface AI extends(B.BJ) {}\ninterface AL {}\n"
    )
    (tmp_path / "b.capnp").write_text(
        '@0xe1f2a3b4c5d6e742;\nusing A = import "a.capnp";\n'
        "interface BJ {}\ninterface BK extends(A.AL) {}\n"
    )
    done = capsvc("gen", str(tmp_path / "a.capnp"), "-o", str(tmp_path / "out"))
    assert done.returncode == 1
    assert "extend each other's in a cycle (a_capnp -> b_capnp -> a_capnp)" in done.stderr
    assert not (tmp_path / "out").exists()
