"""``capsvc.load_schema`` on schemas that bring their own copy of a standard file.

pycapnp keeps one schema loader per process, and importing capsvc has already loaded
rpc.capnp and ``/capnp/c++.capnp`` from pycapnp's directory into it. A second copy of
c++.capnp at another path has the same ID: libcapnp then aborts the whole process (no
Python exception). So each case runs in a real subprocess, whose exit status and output
are the evidence: found under an import directory (``-I /usr/include`` with Debian's
libcapnp-dev), the copy is not used, pycapnp's is; beside the schema, imported
relatively, it is a ``SchemaError`` that names it, and the process lives on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import capnp

from tests.support.peers import PYTHON, ROOT, peer_env

PYCAPNP_CXX = os.path.join(os.path.dirname(capnp.__file__), "c++.capnp")

SCHEMA = """@0xd6b8e0a0a1a2a3a4;
using Cxx = import "{path}";
$Cxx.namespace("parcel");
struct Parcel {{ weight @0 :UInt16; }}
"""

LOAD = """
import sys, capsvc
try:
    schema = capsvc.load_schema(sys.argv[1], imports=sys.argv[2:])
except capsvc.SchemaError as error:
    print("SchemaError:", error)
else:
    print("weight", schema.Parcel.new_message(weight=7).weight)
print("alive")
"""


def load_in_subprocess(schema: Path, *imports: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-c", LOAD, str(schema), *map(str, imports)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=peer_env(),
        cwd=ROOT,
    )


def test_a_copy_under_an_import_directory_gives_way_to_pycapnps(tmp_path: Path) -> None:
    include = tmp_path / "include" / "capnp"
    include.mkdir(parents=True)
    shutil.copy(PYCAPNP_CXX, include / "c++.capnp")  # what -I /usr/include brings
    schema = tmp_path / "parcel.capnp"
    schema.write_text(SCHEMA.format(path="/capnp/c++.capnp"))
    done = load_in_subprocess(schema, tmp_path / "include")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:2] == ["weight 7", "alive"]


def test_a_copy_beside_the_schema_is_a_schema_error_naming_it(tmp_path: Path) -> None:
    shutil.copy(PYCAPNP_CXX, tmp_path / "c++.capnp")
    schema = tmp_path / "parcel.capnp"
    schema.write_text(SCHEMA.format(path="c++.capnp"))
    done = load_in_subprocess(schema)
    assert done.returncode == 0, done.stdout + done.stderr  # no abort
    first, alive = done.stdout.splitlines()[:2]
    assert first.startswith(f"SchemaError: invalid schema {schema}: ")
    assert "c++.capnp has the ID of a file already loaded from pycapnp's directory" in first
    assert 'import that one as "/capnp/c++.capnp"' in first
    assert "what():" not in first
    assert alive == "alive"


def test_a_syntax_error_is_a_schema_error_with_the_compilers_reason(tmp_path: Path) -> None:
    schema = tmp_path / "broken.capnp"
    schema.write_text("@0xd6b8e0a0a1a2a3a5;\nstruct Broken { weight @0 :UInt16 }\n")
    done = load_in_subprocess(schema)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"SchemaError: invalid schema {schema}: ")
    assert first.endswith("broken.capnp:1: failed: Parse error.")
