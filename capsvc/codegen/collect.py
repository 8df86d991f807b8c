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
import re
import subprocess
import sys
import tempfile
from typing import Any

from capsvc.codegen.model import PROVIDED_MODULES
from capsvc.errors import SchemaError


def collect(paths: list[str], import_dirs: list[str]) -> tuple[list[bytes], list[tuple[int, str]]]:
    """The nodes (as messages) of ``paths`` and of the files they import, and the requested
    files as (file ID, file name). Raises SchemaError with pycapnp's own message on a bad
    schema."""
    # The child may need a scratch directory (``_aliased``). It is made and removed here,
    # since pycapnp may abort the child before it could clean up after itself.
    with tempfile.TemporaryDirectory(prefix="capsvc-gen-") as scratch:
        request = json.dumps({"paths": paths, "imports": import_dirs, "scratch": scratch})
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
    """pycapnp's reason, without kj's ``what():`` prefix and its C++ stack addresses."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if "failed:" in line or "error:" in line:
            return line.split("stack:")[0].strip().removeprefix("what():").strip()
    return lines[-1] if lines else "the schema parser crashed"


# ---------------------------------------------------------------------- the child
def _walk(schema: Any, out: dict[int, bytes], files: dict[str, int], nested: set[int]) -> None:
    """Every node reachable from ``schema``: its nested nodes, and the types its fields and
    methods use. A node reached first through a field type comes as a schema that cannot
    list its nested nodes; those are walked when the node is reached again through its
    file's parsed tree (``nested`` holds the nodes whose nested nodes were walked), so a
    nested enum or const that no field uses is still generated."""
    node = schema.node
    if node.id not in out:
        out[node.id] = node.as_builder().to_bytes()
        _walk_uses(schema, node, out, files, nested)
    if node.id in nested or not hasattr(schema, "get_nested"):
        return
    nested.add(node.id)
    for child in node.nestedNodes:
        _walk(schema.get_nested(child.name), out, files, nested)


def _walk_uses(
    schema: Any, node: Any, out: dict[int, bytes], files: dict[str, int], nested: set[int]
) -> None:
    which = node.which()
    if which == "file":
        files[node.displayName] = node.id
    if which == "struct":
        struct = schema.as_struct() if hasattr(schema, "as_struct") else schema
        for field in node.struct.fields:
            _walk_field_type(struct.fields[field.name], out, files, nested)
    elif which == "interface":
        interface = schema.as_interface() if hasattr(schema, "as_interface") else schema
        for name in interface.method_names:
            method = interface.methods[name]
            _walk(method.param_type, out, files, nested)
            _walk(method.result_type, out, files, nested)
        for parent in interface.superclasses:
            _walk(parent, out, files, nested)
    elif which == "const":
        # A constant's type may be the only use of a type (from another file, too).
        type_id = _named_type_id(node.const.type)
        if type_id is not None and type_id not in out:
            target = _const_type_schema(schema, type_id)
            if target is not None:
                _walk(target, out, files, nested)


def _walk_field_type(
    field: Any, out: dict[int, bytes], files: dict[str, int], nested: set[int]
) -> None:
    try:
        target = field.schema
    except Exception:  # a primitive type has no schema of its own
        return
    _walk_type(target, out, files, nested)


def _walk_type(target: Any, out: dict[int, bytes], files: dict[str, int], nested: set[int]) -> None:
    """The node of a field's or a constant's type (a list's element type's), if it has one."""
    while type(target).__name__ == "_ListSchema":  # lists of lists of ...
        try:
            target = target.elementType
        except Exception:  # a list of a primitive type
            return
    if target is not None and hasattr(target, "node"):
        _walk(target, out, files, nested)


def _named_type_id(kind: Any) -> int | None:
    """The node ID of a type (of a list's innermost element type): a struct, enum or
    interface; None for a primitive or an AnyPointer."""
    while kind.which() == "list":
        kind = kind.list.elementType
    which = kind.which()
    if which in ("struct", "enum", "interface"):
        return int(getattr(kind, which).typeId)
    return None


#: The schemas a constant's type is looked for in: the file being walked, and the files
#: it imports under a name (``using A = import "a.capnp";``), which pycapnp's
#: ``get_nested`` resolves as the compiler does (so each is keyed as the compiler keys it).
_SCOPES: list[Any] = []
_USING_IMPORT = re.compile(r'^\s*using\s+(\w+)\s*=\s*import\s+"', re.MULTILINE)


def _file_scopes(module: Any, path: str) -> list[Any]:
    scopes = [module.schema]
    with open(path, encoding="utf-8", errors="replace") as source:
        text = source.read()
    for alias in _USING_IMPORT.findall(text):
        try:
            scopes.append(module.schema.get_nested(alias))
        except Exception:  # (a match in a comment or a string: no such name)
            continue
    return scopes


def _const_type_schema(const: Any, type_id: int) -> Any:
    """The schema of a constant's type, node ``type_id``; None if not found. pycapnp gives
    a constant's value, not its type: a struct value names its schema; anything else (an
    enum, a list) is looked for by ID in ``_SCOPES``."""
    try:
        target = getattr(const.as_const_value(), "schema", None)
    except Exception:  # (reached as a bare schema: walked again from its file)
        target = None
    if target is not None and getattr(target, "node", None) is not None:
        if target.node.id == type_id:
            return target
    todo = list(_SCOPES)
    while todo:
        schema = todo.pop()
        if schema.node.id == type_id:
            return schema
        todo.extend(schema.get_nested(child.name) for child in schema.node.nestedNodes)
    return None


def _child() -> None:
    import capnp

    request = json.loads(sys.stdin.read())
    # Absolute imports search the user's directories, then pycapnp's, which has the
    # standard files (``/capnp/stream.capnp``, which a ``-> stream`` method imports
    # implicitly), as ``capnp compile`` finds its own.
    pycapnp_dir = os.path.dirname(os.path.dirname(capnp.__file__))
    import_dirs = [os.path.abspath(d) for d in request["imports"]] + [pycapnp_dir]
    parser = capnp.SchemaParser()
    asked = [os.path.abspath(path) for path in request["paths"]]
    if any(_reaches_up(path) and _held(path, import_dirs) for path in asked):
        import_dirs, asked = _aliased(import_dirs, asked, request["scratch"])
    _load_all(parser, import_dirs, asked)


def _load_all(parser: Any, import_dirs: list[str], asked: list[str]) -> None:
    """Load the requested files and every file they import; print the nodes (JSON)."""
    nodes: dict[int, bytes] = {}
    nested: set[int] = set()
    requested: list[tuple[int, str]] = []
    # (file, the directory its name is relative to): for a requested file, the deepest
    # import directory holding it (else its own directory); for an imported file, the
    # one its import was found under.
    todo = [(path, _base(path, import_dirs)) for path in asked]
    loaded: set[str] = set()
    while todo:
        path, base = todo.pop(0)
        if path in loaded:
            continue
        loaded.add(path)
        # The compiler keys a file by the deepest listed directory holding it, and a file
        # keyed two ways is a duplicate ID: an imported file must be keyed under the
        # directory its import was found in (pycapnp's, for stream.capnp), never under
        # its own directory. Its display name is its path from there too (pycapnp's
        # default is the base name): the files it imports relatively are named from it,
        # and found again below by that name.
        display = os.path.relpath(path, base)
        searched = import_dirs
        if base not in import_dirs and _reaches_up(path):
            # A file that reaches up, reached through a relative import from a file
            # keyed as no import directory holds it: keyed so itself (see _reaches_up).
            searched = [d for d in import_dirs if not _under(path, d)]
        module = parser.load(path, display_name=display, imports=[*searched, base])
        files: dict[str, int] = {}
        _SCOPES[:] = _file_scopes(module, path)
        _walk(module.schema, nodes, files, nested)
        file_id = module.schema.node.id
        if file_id not in PROVIDED_MODULES or path in asked:  # capsvc has its module
            requested.append((file_id, os.path.basename(path)))
        # Types from other files: generate those files too (their node's file name is
        # the import path as the schema wrote it, relative to the importing file).
        for name in _foreign_files(nodes, {os.path.basename(p) for p in loaded}):
            for where in (*import_dirs, base):
                candidate = os.path.normpath(os.path.join(where, name.lstrip("/")))
                if os.path.exists(candidate):
                    todo.append((candidate, where))
                    break
    print(json.dumps({"nodes": [n.hex() for n in nodes.values()], "requested": requested}))


def _base(path: str, import_dirs: list[str]) -> str:
    """Where the compiler keys ``path``: as ``capnp compile`` does, the deepest import
    directory holding it, else the current directory if it holds it, else the root. A
    requested file under an import directory is keyed as an absolute import of it would
    be, so that a relative import of a file (``"c++.capnp"``) and an absolute one
    (``"/capnp/c++.capnp"``) are one file; and the directory is never the file's own
    unless it must be, so an ``embed "../data.bin"`` or an ``import "../x.capnp"`` stays
    inside it (kj refuses a ``..`` out of the directory a file was loaded from)."""
    holding = [d for d in import_dirs if _under(path, d)]
    if holding and not _reaches_up(path):
        return max(holding, key=len)
    here = os.getcwd()
    return here if _under(path, here) else os.path.abspath(os.sep)


def _reaches_up(path: str) -> bool:
    """Whether a requested file embeds or imports a path starting ``../``. pycapnp loads a
    file under the import directory holding it, whatever its display name, and kj
    refuses a ``..`` out of it; so such a file is keyed as if no import directory held
    it: ``capnp compile`` accepts it so, absolute imports and all. Its absolute imports
    are found through aliases of the import directories (``_aliased``)."""
    with open(path, encoding="utf-8", errors="replace") as source:
        return '"../' in source.read()


def _held(path: str, import_dirs: list[str]) -> bool:
    return any(_under(path, directory) for directory in import_dirs)


def _aliased(import_dirs: list[str], asked: list[str], scratch: str) -> tuple[list[str], list[str]]:
    """The import directories as symbolic links in ``scratch``, and the requested files
    as paths through them (a file that reaches up keeps its own path).

    pycapnp decides which import directory holds a file by its path's text, as kj's
    ``parseDiskFile`` does, without following links. (``scratch`` is the parent's: see
    ``collect``.) Through the aliases, a file that
    reaches up is held by none, so its ``..`` is allowed, while its absolute imports are
    still found in every import directory; every other file is held by the alias of the
    directory that held it, so each file is still keyed one way only (a file keyed two
    ways is a duplicate ID)."""
    aliases = []
    for index, directory in enumerate(import_dirs):
        alias = os.path.join(scratch, str(index))
        os.symlink(directory, alias, target_is_directory=True)
        aliases.append(alias)
    paths = []
    for path in asked:
        holding = [i for i, directory in enumerate(import_dirs) if _under(path, directory)]
        if holding and not _reaches_up(path):
            deepest = max(holding, key=lambda i: len(import_dirs[i]))
            path = os.path.join(aliases[deepest], os.path.relpath(path, import_dirs[deepest]))
        paths.append(path)
    return aliases, paths


def _under(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip(os.sep) + os.sep)


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
