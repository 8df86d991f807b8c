"""Parse schema files with pycapnp, in a subprocess, and hand back their ``Node``s.

Theory of operation: pycapnp aborts the whole interpreter on a schema error
(pycapnp-notes.md §1.1), so ``collect`` runs the parse in a child process
(``python -m capsvc.codegen.collect``) that prints one JSON document: every node it
reached, as schema.capnp ``Node`` messages in hex, and the requested files. A schema that
imports another file is followed there too, so that the generated modules import each
other as the schema files do. The parent reads the nodes back with its own schema.capnp
(capsvc.codegen.nodes), exactly as it reads a compiler plugin's CodeGeneratorRequest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from capsvc.errors import SchemaError


def collect(paths: list[str], import_dirs: list[str]) -> tuple[list[bytes], list[tuple[int, str]]]:
    """The nodes (as messages) of ``paths`` and of the files they import, and the requested
    files as (file ID, file name). Raises SchemaError with pycapnp's own message on a bad
    schema."""
    request = json.dumps({"paths": paths, "imports": import_dirs})
    done = subprocess.run(
        [sys.executable, "-m", "capsvc.codegen.collect"],
        input=request.encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        detail = _schema_error(done.stderr.decode(errors="replace"))
        raise SchemaError(f"cannot parse {', '.join(paths)}: {detail}")
    answer = json.loads(done.stdout)
    nodes = [bytes.fromhex(node) for node in answer["nodes"]]
    return nodes, [(int(file_id), name) for file_id, name in answer["requested"]]


def _schema_error(stderr: str) -> str:
    """pycapnp's reason, without its C++ stack addresses."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if "failed:" in line or "error:" in line:
            return line.split("stack:")[0].strip()
    return lines[-1] if lines else "the schema parser crashed"


# ---------------------------------------------------------------------- the child
def _walk(schema: Any, out: dict[int, bytes], files: dict[str, int]) -> None:
    node = schema.node
    if node.id in out:
        return
    out[node.id] = node.as_builder().to_bytes()
    which = node.which()
    if which == "file":
        files[node.displayName] = node.id
    if which == "struct":
        struct = schema.as_struct() if hasattr(schema, "as_struct") else schema
        for field in node.struct.fields:
            _walk_field_type(struct.fields[field.name], out, files)
    elif which == "interface":
        interface = schema.as_interface() if hasattr(schema, "as_interface") else schema
        for name in interface.method_names:
            method = interface.methods[name]
            _walk(method.param_type, out, files)
            _walk(method.result_type, out, files)
        for parent in interface.superclasses:
            _walk(parent, out, files)
    for nested in node.nestedNodes:
        if hasattr(schema, "get_nested"):
            _walk(schema.get_nested(nested.name), out, files)


def _walk_field_type(field: Any, out: dict[int, bytes], files: dict[str, int]) -> None:
    try:
        target = field.schema
    except Exception:  # a primitive type has no schema of its own
        return
    while type(target).__name__ == "_ListSchema":  # lists of lists of ...
        try:
            target = target.elementType
        except Exception:  # a list of a primitive type
            return
    if target is not None and hasattr(target, "node"):
        _walk(target, out, files)


def _child() -> None:
    import capnp

    request = json.loads(sys.stdin.read())
    import_dirs = [os.path.abspath(d) for d in request["imports"]]
    parser = capnp.SchemaParser()
    nodes: dict[int, bytes] = {}
    requested: list[tuple[int, str]] = []
    todo = [os.path.abspath(path) for path in request["paths"]]
    loaded: set[str] = set()
    while todo:
        path = todo.pop(0)
        if path in loaded:
            continue
        loaded.add(path)
        here = os.path.dirname(path)
        module = parser.load(path, imports=[here, *import_dirs])
        files: dict[str, int] = {}
        _walk(module.schema, nodes, files)
        requested.append((module.schema.node.id, os.path.basename(path)))
        # Types from other files: generate those files too (their node's file name is
        # the import path as the schema wrote it, relative to the importing file).
        for name in _foreign_files(nodes, {os.path.basename(p) for p in loaded}):
            for base in (here, *import_dirs):
                candidate = os.path.normpath(os.path.join(base, name.lstrip("/")))
                if os.path.exists(candidate):
                    todo.append(candidate)
                    break
    print(json.dumps({"nodes": [n.hex() for n in nodes.values()], "requested": requested}))


def _foreign_files(nodes: dict[int, bytes], known: set[str]) -> set[str]:
    import capnp

    pkg = os.path.dirname(capnp.__file__)
    schema = capnp.load(os.path.join(pkg, "schema.capnp"), imports=[os.path.dirname(pkg)])
    names = set()
    for data in nodes.values():
        with schema.Node.from_bytes(data) as node:
            file_name = node.displayName.partition(":")[0]
            if file_name and file_name not in known and node.which() != "file":
                names.add(file_name)
    return names


if __name__ == "__main__":
    _child()
