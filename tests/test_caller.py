"""``capsvc call --schema`` and ``capsvc describe`` (capsvc/caller.py).

Against real components: servers are ``capsvc serve`` subprocesses (the calculator demo,
the kv example, and a dynamic-path server of a schema with every type kind, written to a
temporary directory), started and stopped by PID through tests.test_cli's ``running``;
``capsvc call`` runs as a subprocess too and its stdout is parsed as JSON. Every
subprocess wait is bounded by test_cli.TIMEOUT (other interpreters on a possibly loaded
machine: each wait ends when they do, the bound only stops a hang). The value parser and
the JSON renderer are also tested in-process, kind by kind.
"""

from __future__ import annotations

import base64
import json
import math
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capsvc import caller
from tests.test_cli import Server, run, running

KV = "examples/kv/kv.capnp"
CALC = "schemas/calculator.capnp"

KINDS_SCHEMA = """\
@0xc0ffee1234567891;
# Every type kind capsvc call parses and prints (tests/test_caller.py).

enum Color {
  red @0;
  green @1;
  blueish @2;
}

struct Point {
  x @0 :Int32;
  y @1 :Int32;
}

struct Shape {
  name @0 :Text;
  union {
    circle @1 :Float64;
    square :group {
      side @2 :Float32;
    }
    nothing @3 :Void;
  }
}

struct Everything {
  v @0 :Void;
  b @1 :Bool;
  i8 @2 :Int8;
  i16 @3 :Int16;
  i32 @4 :Int32;
  i64 @5 :Int64;
  u8 @6 :UInt8;
  u16 @7 :UInt16;
  u32 @8 :UInt32;
  u64 @9 :UInt64;
  f32 @10 :Float32;
  f64 @11 :Float64;
  text @12 :Text;
  data @13 :Data;
  color @14 :Color;
  point @15 :Point;
  points @16 :List(Point);
  grid @17 :List(List(Int32));
  colors @18 :List(Color);
  shape @19 :Shape;
  texts @20 :List(Text);
  datas @21 :List(Data);
}

struct Holder {
  thing @0 :Thing;
  things @1 :List(Thing);
  any @2 :AnyPointer;
}

interface Thing {
  name @0 () -> (name :Text);
}

interface Kinds extends(Thing) {
  echo @0 (all :Everything) -> (all :Everything);
  scalars @1 (b :Bool, i8 :Int8, u64 :UInt64, f32 :Float32, f64 :Float64, text :Text,
              data :Data, color :Color, v :Void) -> (b :Bool, i8 :Int8, u64 :UInt64,
              f32 :Float32, f64 :Float64, text :Text, data :Data, color :Color, v :Void);
  fail @2 (reason :Text) -> ();
  things @3 () -> (holder :Holder, one :Thing);
  take @4 (holder :Holder) -> ();
}
"""

# A dynamic-path server of KINDS_SCHEMA: echoes what it gets, fails on request, and hands
# out capabilities (inherited Thing.name included).
KINDS_APP = """\
import os

import capsvc

schema = capsvc.load_schema(os.path.join(os.path.dirname(__file__), "kinds.capnp"))
SCALARS = ("b", "i8", "u64", "f32", "f64", "text", "data", "color", "v")


class ThingImpl(capsvc.Server, interface=schema.Thing):
    def name(self, params, results):
        results.name = "a thing"


class KindsImpl(capsvc.Server, interface=schema.Kinds):
    def name(self, params, results):
        results.name = "kinds"

    def echo(self, params, results):
        results.all = params.all

    def scalars(self, params, results):
        for name in SCALARS:
            setattr(results, name, getattr(params, name))

    def fail(self, params, results):
        raise capsvc.Failed(params.reason)

    def things(self, params, results):
        results.one = ThingImpl()
        holder = results.init("holder")
        holder.thing = ThingImpl()
        holder.things = [ThingImpl(), ThingImpl()]
"""

# A schema that needs -I: it imports the kinds schema by an absolute path.
USES_SCHEMA = """\
@0xc0ffee1234567892;
using K = import "/kinds.capnp";

interface Uses {
  where @0 () -> (point :K.Point);
}
"""


# ------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def kinds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("kinds")
    (directory / "kinds.capnp").write_text(KINDS_SCHEMA)
    (directory / "kinds_app.py").write_text(KINDS_APP)
    (directory / "uses").mkdir()
    (directory / "uses" / "uses.capnp").write_text(USES_SCHEMA)
    return directory


@pytest.fixture(scope="module")
def kinds(kinds_dir: Path) -> Any:
    return caller.load(str(kinds_dir / "kinds.capnp"))


def _serve(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[Server]:
    with running(tmp_path_factory.mktemp("serve"), *args, "--listen", "tcp:127.0.0.1:0") as server:
        yield server
        status, _ = server.stop()
        assert status == 0, server.describe()


@pytest.fixture(scope="module")
def calculator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for server in _serve(tmp_path_factory):
        yield server.address


@pytest.fixture(scope="module")
def kv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for server in _serve(tmp_path_factory, "examples.kv.server:Directory"):
        yield server.address


@pytest.fixture(scope="module")
def kinds_server(tmp_path_factory: pytest.TempPathFactory, kinds_dir: Path) -> Iterator[str]:
    for server in _serve(tmp_path_factory, "kinds_app:KindsImpl", "--app-dir", str(kinds_dir)):
        yield server.address


def unused_address() -> str:
    """A loopback address nobody listens on (usage errors must come before connecting:
    with this address, a connection attempt would exit 1, not 2)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return f"tcp:127.0.0.1:{unused.getsockname()[1]}"


def call(*args: str) -> subprocess.CompletedProcess[str]:
    return run("call", *args)


def call_json(*args: str) -> Any:
    done = call(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The last stderr line (a stale compiled build may warn before it)."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert lines, done.stdout
    return lines[-1]


def usage_error(*args: str) -> str:
    done = call(unused_address(), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    line = error_line(done)
    assert line.startswith("capsvc: error: "), line
    assert ".c++" not in line  # never pycapnp's C++ text
    assert "stack:" not in line
    return line.removeprefix("capsvc: error: ")


# --------------------------------------------------------------- calls: the demo
def test_calculator_evaluate_and_a_chained_read(calculator: str) -> None:
    literal = ["--schema", CALC, "Calculator.evaluate", 'expression={"literal": 3}']
    assert call_json(calculator, *literal) == {"value": {"capability": "Calculator.Value"}}
    assert call_json(calculator, *literal, "value.read") == {"value": 3.0}
    # --connect works as well as the positional address, and options may come anywhere.
    assert call_json("--connect", calculator, *literal, "value.read", "--compact") == {"value": 3.0}


def test_calculator_functions_through_chains(calculator: str) -> None:
    multiply = ["Calculator.getOperator", "op=multiply", "func.call", "params=[6, 7]"]
    assert call_json(calculator, "--schema", CALC, *multiply) == {"value": 42.0}
    identity = ["Calculator.defFunction", "paramCount=1", 'body={"parameter": 0}']
    identity += ["func.call", "params=[2.5]"]
    assert call_json(calculator, "--schema", CALC, *identity) == {"value": 2.5}


def test_a_failing_call_fails_the_calls_chained_on_it(calculator: str) -> None:
    bad = ["--schema", CALC, "Calculator.evaluate", 'expression={"parameter": 0}']
    for args in (bad, [*bad, "value.read"]):
        done = call(calculator, *args)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout == ""
        line = error_line(done)
        assert line.startswith("capsvc: error: call failed (Failed): Parameter index"), line


def test_the_tour_still_runs_with_the_address_as_a_word(calculator: str) -> None:
    tour = call(calculator)
    assert tour.returncode == 0, tour.stdout + tour.stderr
    assert tour.stdout.splitlines()[0] == f"capsvc: calculator tour against {calculator}"
    assert "pow called 1 time" in tour.stdout
    assert call(calculator, "6 * 7").stdout == "6 * 7 = 42\n"
    assert run("demo-client", calculator, "1 + 1").stdout == "1 + 1 = 2\n"


# --------------------------------------------------------------- calls: kv example
def test_kv_open_put_and_get(kv: str) -> None:
    store = ["--schema", KV, "Directory.open", "name=kv-test"]
    assert call_json(kv, *store) == {"store": {"capability": "Store"}}
    assert call_json(kv, *store, "store.put", "key=a", "value=hello") == {"replaced": False}
    assert call_json(kv, *store, "store.put", "key=a", "value=hello") == {"replaced": True}
    got = call_json(kv, *store, "store.get", "key=a")
    assert got == {"value": base64.b64encode(b"hello").decode(), "found": True}
    binary = "base64:" + base64.b64encode(b"\x00\xff").decode()
    assert call_json(kv, *store, "store.put", "key=b", f"value={binary}") == {"replaced": False}
    assert call_json(kv, *store, "store.get", "key=b")["value"] == "AP8="
    assert call_json(kv, *store, "store.get", "key=none") == {"value": "", "found": False}
    # A `-> stream` method: the CLI waits for its own Return; its results have no fields.
    assert call_json(kv, *store, "store.load", "key=c", "value=streamed") == {}
    assert call_json(kv, *store, "store.get", "key=c")["value"] == "c3RyZWFtZWQ="
    keys = call(kv, *store, "store.keys", "--compact")
    assert keys.stdout == '{"keys":["a","b","c"]}\n', keys.stderr
    # Another store name: another store (the chain really went through open's result).
    assert call_json(kv, "--schema", KV, "Directory.open", "name=other", "store.keys") == {
        "keys": []
    }


def test_kv_on_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "kv.sock"
    with running(tmp_path, "examples.kv.server:Directory", "--listen", f"unix:{path}") as server:
        args = ["--schema", KV, "Directory.open", "name=u", "store.put", "key=k", "value=v"]
        assert call_json(server.address, *args) == {"replaced": False}
        status, _ = server.stop()
    assert status == 0


# --------------------------------------------------------------- calls: every kind
EVERYTHING_IN = {
    "v": None,
    "b": True,
    "i8": -128,
    "i16": 32767,
    "i32": -5,
    "i64": -(2**63),
    "u8": 255,
    "u16": 65535,
    "u32": 2**32 - 1,
    "u64": 2**64 - 1,
    "f32": 1.1,
    "f64": "Infinity",
    "text": "h\u00e9llo",
    "data": "base64:AAEC/w==",
    "color": "blueish",
    "point": {"x": 1, "y": -2},
    "points": [{"x": 1}, {"y": 2}],
    "grid": [[1, 2], [], [3]],
    "colors": ["red", "green"],
    "shape": {"name": "sq", "square": {"side": 0.5}},
    "texts": ["a", ""],
    "datas": ["xy", "base64:/w=="],
}
EVERYTHING_OUT = {
    **EVERYTHING_IN,
    "data": "AAEC/w==",
    "points": [{"x": 1, "y": 0}, {"x": 0, "y": 2}],
    "datas": ["eHk=", "/w=="],
}


def test_every_kind_round_trips_through_a_server(kinds_server: str, kinds_dir: Path) -> None:
    schema = str(kinds_dir / "kinds.capnp")
    everything = f"all={json.dumps(EVERYTHING_IN)}"
    assert call_json(kinds_server, "--schema", schema, "Kinds.echo", everything) == {
        "all": EVERYTHING_OUT
    }
    scalars = call_json(
        kinds_server,
        "--schema",
        schema,
        "Kinds.scalars",
        "b=false",
        "i8=-1",
        f"u64={2**64 - 1}",
        "f32=0.1",
        "f64=NaN",
        "text=a = b",
        "data=hi",
        "color=green",
        "v=",
    )
    assert scalars == {
        "b": False,
        "i8": -1,
        "u64": 2**64 - 1,
        "f32": 0.1,
        "f64": "NaN",
        "text": "a = b",
        "data": base64.b64encode(b"hi").decode(),
        "color": "green",
        "v": None,
    }
    # A union shows its set member only (here the Void one, as null).
    nothing = f"all={json.dumps({'shape': {'nothing': None}})}"
    shape = call_json(kinds_server, "--schema", schema, "Kinds.echo", nothing)["all"]["shape"]
    assert shape == {"name": "", "nothing": None}


def test_capabilities_in_results_and_chains_through_structs(
    kinds_server: str, kinds_dir: Path
) -> None:
    schema = ["--schema", str(kinds_dir / "kinds.capnp")]
    thing = {"capability": "Thing"}
    assert call_json(kinds_server, *schema, "Kinds.things") == {
        "holder": {"thing": thing, "things": [thing, thing], "any": None},
        "one": thing,
    }
    assert call_json(kinds_server, *schema, "Kinds.things", "one.name") == {"name": "a thing"}
    nested = call_json(kinds_server, *schema, "Kinds.things", "holder.thing.name")
    assert nested == {"name": "a thing"}
    # A method Kinds inherits from Thing.
    assert call_json(kinds_server, *schema, "Kinds.name") == {"name": "kinds"}


def test_a_server_error_is_exit_1(kinds_server: str, kinds_dir: Path) -> None:
    done = call(
        kinds_server, "--schema", str(kinds_dir / "kinds.capnp"), "Kinds.fail", "reason=boom"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    assert error_line(done) == "capsvc: error: call failed (Failed): boom"


def test_nobody_listening_is_exit_1() -> None:
    address = unused_address()
    done = call(address, "--schema", KV, "Directory.open", "name=x")
    assert done.returncode == 1, done.stdout + done.stderr
    assert error_line(done) == f"capsvc: error: cannot connect to {address}: Connection refused"


# --------------------------------------------------------------- usage errors (exit 2)
def test_an_unknown_field_names_the_method_and_its_parameters() -> None:
    message = usage_error("--schema", KV, "Directory.open", "name=x", "store.put", "kee=a")
    assert message == (
        "Store.put() has no parameter kee; its parameters are key :Text, value :Data"
    )
    message = usage_error("--schema", CALC, "Calculator.evaluate", "expresion=1")
    assert message == (
        "Calculator.evaluate() has no parameter expresion;"
        " its parameters are expression :Calculator.Expression"
    )


def test_a_wrong_type_names_the_field_and_its_type() -> None:
    message = usage_error("--schema", CALC, "Calculator.defFunction", "paramCount=two")
    assert message.startswith(
        'Calculator.defFunction() parameter paramCount: expected Int32 as a number, got "two"'
    )
    assert message.endswith("; its parameters are paramCount :Int32, body :Calculator.Expression")
    message = usage_error("--schema", CALC, "Calculator.evaluate", 'expression={"literal": "x"}')
    assert message.startswith(
        'Calculator.evaluate() parameter expression.literal: expected Float64, got "x"'
    )
    message = usage_error("--schema", CALC, "Calculator.getOperator", "op=modulo")
    assert message.startswith(
        'Calculator.getOperator() parameter op: expected Calculator.Operator, got "modulo"'
        " (one of add, subtract, multiply, divide)"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [CALC, "Calculater.evaluate"],
            f"{CALC} has no interface Calculater; its interfaces are Calculator,"
            " Calculator.Value, Calculator.Function",
        ),
        (
            [CALC, "Calculator.evalute"],
            "Calculator has no method evalute; its methods are evaluate, defFunction, getOperator",
        ),
        ([CALC, "Calculator.Expression.x"], "Calculator.Expression is a struct, not an interface"),
        ([CALC, "Calculator"], "expected Interface.method, got 'Calculator'"),
        (
            [KV, "Directory.open", "name=x", "stor.put"],
            "Directory.open results have no field stor; they are store :Store",
        ),
        (
            [KV, "Directory.open", "name=x", "store.putt"],
            "Store has no method putt; its methods are get, put, keys, watch, load",
        ),
        (
            [KV, "Directory.open", "name=x", "store.get", "key=a", "found.x"],
            "Store.get result found is Bool, not a capability: a chained call names a"
            " capability field of the results and a method ('found.x')",
        ),
        (
            [KV, "Directory.open", "name=x", "name=y"],
            "Directory.open() parameter name is given twice",
        ),
        (
            [KV, "Directory.open", "name"],
            "expected field=value or field.method after Directory.open, got 'name'",
        ),
        ([KV], "--schema FILE needs Interface.method (and its field=value arguments)"),
        (["no/such.capnp", "A.b"], "no such schema file: no/such.capnp"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    assert usage_error("--schema", *args) == message


def test_address_and_option_mistakes() -> None:
    first, second = unused_address(), unused_address()
    done = call(first, "--connect", second, "1 + 1")
    assert done.returncode == 2
    assert (
        error_line(done) == f"capsvc: error: two addresses given ({second} and {first}): give one"
    )
    assert usage_error("-I", "/tmp", "1 + 1") == (
        "-I/--import-path and --compact go with --schema FILE"
    )
    # Without --schema, a method call is a bad expression, with a hint.
    assert usage_error("Calculator.evaluate", "x=1").endswith(
        "(to call a method, give the schema: --schema FILE Interface.method)"
    )


# --------------------------------------------------------------- describe
CALCULATOR_DESCRIBED = """\
interface Calculator
  Calculator.evaluate(expression :Calculator.Expression) -> (value :Calculator.Value)
  Calculator.defFunction(paramCount :Int32, body :Calculator.Expression) -> (func :Calculator.Function)
  Calculator.getOperator(op :Calculator.Operator) -> (func :Calculator.Function)

interface Calculator.Value
  Calculator.Value.read() -> (value :Float64)

interface Calculator.Function
  Calculator.Function.call(params :List(Float64)) -> (value :Float64)

struct Calculator.Expression
  union (one of):
    literal :Float64
    previousResult :Calculator.Value
    parameter :UInt32
    call :group
      function :Calculator.Function
      params :List(Calculator.Expression)

enum Calculator.Operator: add, subtract, multiply, divide
"""  # noqa: E501


def test_describe_the_calculator() -> None:
    done = run("describe", CALC)
    assert done.returncode == 0, done.stderr
    assert done.stdout == CALCULATOR_DESCRIBED


def test_describe_kinds_shows_superclasses_and_inherited_methods(kinds_dir: Path) -> None:
    done = run("describe", str(kinds_dir / "kinds.capnp"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "interface Kinds extends Thing" in lines
    assert "  Kinds.name() -> (name :Text)  (from Thing)" in lines
    assert "  Kinds.fail(reason :Text) -> ()" in lines
    assert "  grid :List(List(Int32))" in lines
    assert "enum Color: red, green, blueish" in lines
    interfaces = [line for line in lines if line.startswith("interface ")]
    assert interfaces == ["interface Thing", "interface Kinds extends Thing"]


def test_describe_json() -> None:
    done = run("describe", KV, "--json")
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    assert [i["name"] for i in described["interfaces"]] == ["Directory", "Store", "Watcher"]
    get = described["interfaces"][1]["methods"][0]
    assert get == {
        "name": "get",
        "from": "Store",
        "params": [{"name": "key", "type": "Text"}],
        "results": [{"name": "value", "type": "Data"}, {"name": "found", "type": "Bool"}],
    }
    assert described["structs"] == []
    assert described["enums"] == []


def test_describe_with_an_import_path(kinds_dir: Path) -> None:
    uses = str(kinds_dir / "uses" / "uses.capnp")
    done = run("describe", uses, "-I", str(kinds_dir))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "interface Uses\n  Uses.where() -> (point :Point)\n"
    missing = run("describe", uses)  # /kinds.capnp is found only through -I
    assert missing.returncode == 1
    assert error_line(missing).startswith("capsvc: error: invalid schema")
    nothing = run("describe", "no/such.capnp")
    assert nothing.returncode == 2
    assert error_line(nothing) == "capsvc: error: no such schema file: no/such.capnp"


# --------------------------------------------------------------- the parser, in-process
def kind_of(kinds: Any, field: str, struct: str = "Everything") -> caller.SchemaType:
    return caller.field_type(getattr(kinds, struct).schema, field)


def parse(kinds: Any, field: str, text: str) -> Any:
    return caller.parse_text(kind_of(kinds, field), text, field)


def bad(kinds: Any, field: str, text: str) -> str:
    with pytest.raises(caller.BadValue) as raised:
        parse(kinds, field, text)
    return raised.value.text


@pytest.mark.parametrize(
    ("field", "low", "high"),
    [
        ("i8", -128, 127),
        ("i16", -(2**15), 2**15 - 1),
        ("i32", -(2**31), 2**31 - 1),
        ("i64", -(2**63), 2**63 - 1),
        ("u8", 0, 255),
        ("u16", 0, 2**16 - 1),
        ("u32", 0, 2**32 - 1),
        ("u64", 0, 2**64 - 1),
    ],
)
def test_integers_are_range_checked(kinds: Any, field: str, low: int, high: int) -> None:
    assert parse(kinds, field, str(low)) == low
    assert parse(kinds, field, str(high)) == high
    name = kind_of(kinds, field).name
    assert bad(kinds, field, str(high + 1)) == (
        f"expected {name}, got {high + 1} (out of range {low}..{high})"
    )
    assert bad(kinds, field, str(low - 1)).endswith(f"(out of range {low}..{high})")
    assert bad(kinds, field, "1.5") == f"expected {name}, got 1.5 (an integer)"
    assert bad(kinds, field, "true") == f"expected {name}, got true (an integer)"
    assert bad(kinds, field, "07").startswith(f'expected {name} as a number, got "07" (not JSON')


def test_floats(kinds: Any) -> None:
    assert parse(kinds, "f64", "1.5") == 1.5
    three = parse(kinds, "f64", "3")
    assert isinstance(three, float)
    assert three == 3.0
    assert parse(kinds, "f64", "-1e300") == -1e300
    assert parse(kinds, "f64", "Infinity") == math.inf
    assert parse(kinds, "f64", "-Infinity") == -math.inf
    assert math.isnan(parse(kinds, "f64", "NaN"))
    assert parse(kinds, "f32", "3.4028235e38") == 3.4028235e38  # Float32's largest
    assert bad(kinds, "f32", "1e39") == "expected Float32, got 1e+39 (out of range)"
    assert bad(kinds, "f64", "inf").startswith('expected Float64 as a number, got "inf"')
    # Inside JSON, the non-finite ones are strings (JSON has no such numbers).
    f32 = kind_of(kinds, "f32")
    assert math.isnan(caller.from_json(f32, "NaN", "f32"))
    assert caller.from_json(f32, 2, "f32") == 2.0
    with pytest.raises(caller.BadValue, match="a number, or NaN, Infinity, -Infinity"):
        caller.from_json(f32, "1", "f32")


def test_bool_text_data_enum_void(kinds: Any) -> None:
    assert parse(kinds, "b", "true") is True
    assert parse(kinds, "b", "false") is False
    assert bad(kinds, "b", "True") == 'expected Bool, got "True" (true or false)'
    assert bad(kinds, "b", "1") == 'expected Bool, got "1" (true or false)'
    assert parse(kinds, "text", ' {"as": "is"} ') == ' {"as": "is"} '
    assert parse(kinds, "data", "h\u00e9") == "h\u00e9".encode()
    assert parse(kinds, "data", "base64:AAEC/w==") == b"\x00\x01\x02\xff"
    assert bad(kinds, "data", "base64:AA=A").startswith(
        'expected Data, got "base64:AA=A" (not valid base64'
    )
    assert parse(kinds, "color", "blueish") == "blueish"
    assert bad(kinds, "color", "blue") == (
        'expected Color, got "blue" (one of red, green, blueish)'
    )
    assert parse(kinds, "v", "") is None
    assert parse(kinds, "v", "null") is None
    assert bad(kinds, "v", "0") == 'expected Void, got "0" (nothing, or null)'


def test_structs_unions_and_groups(kinds: Any) -> None:
    assert parse(kinds, "point", '{"x": 1, "y": -2}') == {"x": 1, "y": -2}
    shape = '{"name": "s", "square": {"side": 1.5}}'
    assert parse(kinds, "shape", shape) == {"name": "s", "square": {"side": 1.5}}
    assert parse(kinds, "shape", '{"nothing": null}') == {"nothing": None}
    assert bad(kinds, "point", '{"z": 1}') == "Point has no field z (its fields are x, y)"
    assert bad(kinds, "point", "[1, 2]") == "expected Point, got [1, 2] (a JSON object)"
    assert bad(kinds, "point", "{x: 1}").startswith(
        'expected Point as a JSON object, got "{x: 1}" (not JSON'
    )
    assert bad(kinds, "shape", '{"circle": 1, "nothing": null}') == (
        "Shape holds one of circle, square, nothing, not several; got circle and nothing"
    )
    with pytest.raises(caller.BadValue) as raised:
        parse(kinds, "shape", '{"square": {"side": "wide"}}')
    assert raised.value.where == "shape.square.side"
    assert (
        raised.value.text == 'expected Float32, got "wide" (a number, or NaN, Infinity, -Infinity)'
    )


def test_lists(kinds: Any) -> None:
    assert parse(kinds, "points", '[{"x": 1}, {"y": 2}]') == [{"x": 1}, {"y": 2}]
    assert parse(kinds, "grid", "[[1, 2], [], [3]]") == [[1, 2], [], [3]]
    assert parse(kinds, "colors", '["red", "green"]') == ["red", "green"]
    assert parse(kinds, "texts", '["a", ""]') == ["a", ""]
    assert parse(kinds, "datas", '["a", "base64:/w=="]') == [b"a", b"\xff"]
    for field, text, where, message in [
        ("points", '[{"x": 1}, {"y": 2.5}]', "points[1].y", "expected Int32, got 2.5"),
        ("grid", '[[1], [2, "3"]]', "grid[1][1]", 'expected Int32, got "3"'),
        ("grid", "[1]", "grid[0]", "expected List(Int32), got 1 (a JSON array)"),
        ("colors", "[0]", "colors[0]", "expected Color, got 0 (a JSON string)"),
        ("texts", '"a"', "texts", 'expected List(Text), got "a" (a JSON array)'),
    ]:
        with pytest.raises(caller.BadValue) as raised:
            parse(kinds, field, text)
        assert (raised.value.where, raised.value.text.split(" (an")[0]) == (
            where,
            message.split(" (an")[0],
        )


def test_capabilities_and_any_pointers_cannot_be_given(kinds: Any) -> None:
    with pytest.raises(caller.CallerUsageError) as raised:
        caller.plan_call(kinds, "Kinds.take", ['holder={"thing": null}'])
    assert str(raised.value) == (
        "Kinds.take() parameter holder.thing: Thing is a capability: capabilities cannot be"
        " given as text; its parameters are holder :Holder"
    )
    with pytest.raises(caller.CallerUsageError, match=r"holder\.any: an AnyPointer cannot"):
        caller.plan_call(kinds, "Kinds.take", ['holder={"any": 1}'])


def test_a_plan(kinds: Any) -> None:
    plan = caller.plan_call(kinds, "Kinds.scalars", ["i8=-3", "text=x=y", "data=z"])
    assert [step.label for step in plan.steps] == ["Kinds.scalars"]
    assert plan.steps[0].params == {"i8": -3, "text": "x=y", "data": b"z"}
    chained = caller.plan_call(kinds, "Kinds.things", ["holder.thing.name"])
    assert [(s.label, s.path, s.method) for s in chained.steps] == [
        ("Kinds.things", (), "things"),
        ("Thing.name", ("holder", "thing"), "name"),
    ]


# --------------------------------------------------------------- the renderer, in-process
def test_render_every_kind(kinds: Any) -> None:
    from capsvc.checked import Checked

    message = kinds.Everything.new_message()
    for name, value in (
        caller.plan_call(kinds, "Kinds.echo", [f"all={json.dumps(EVERYTHING_IN)}"])
        .steps[0]
        .params["all"]
        .items()
    ):
        setattr(message, name, value)
    schema = kinds.Everything.schema
    expected = {**EVERYTHING_OUT, "f64": "Infinity"}
    reader = message.as_reader()
    assert caller.render_struct(reader, schema) == expected
    # As a call's results arrive on the dynamic path: a checked view of the reader.
    assert caller.render_struct(Checked(reader, schema), schema) == expected


def test_render_unions_floats_enums_and_pointers(kinds: Any) -> None:
    shape = kinds.Shape.schema
    assert caller.render_struct(kinds.Shape.new_message(circle=2.0).as_reader(), shape) == {
        "name": "",
        "circle": 2.0,
    }
    f32 = kind_of(kinds, "f32")
    assert caller.render_value(1.100000023841858, f32) == 1.1  # the Float32 nearest 1.1
    assert caller.render_value(math.nan, kind_of(kinds, "f64")) == "NaN"
    assert caller.render_value(-math.inf, f32) == "-Infinity"
    assert caller.render_value(7, kind_of(kinds, "color")) == 7  # no such enumerant
    assert caller.render_value(b"\x00", kind_of(kinds, "data")) == "AA=="
    holder = kinds.Holder.new_message()
    assert caller.render_struct(holder.as_reader(), kinds.Holder.schema) == {
        "thing": None,  # a null capability
        "things": [],
        "any": None,
    }
    holder.any.set_as_text("x")
    assert caller.render_struct(holder.as_reader(), kinds.Holder.schema)["any"] == {
        "anyPointer": "not shown (its type is not known)"
    }
    assert caller.to_json({"a": [1, "\u00e9"]}, compact=True) == '{"a":[1,"\u00e9"]}'
    assert caller.to_json({"a": 1}) == '{\n  "a": 1\n}'
