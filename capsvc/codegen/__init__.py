"""``capsvc gen``: schema files in, typed Python modules out.

Theory of operation: ``collect`` (pycapnp, in a subprocess) or a compiler plugin's
``CodeGeneratorRequest`` gives schema.capnp ``Node``s; ``build_schema`` turns them into the
model (capsvc.codegen.model); ``render`` (pure) turns each file's model into source text.
``generate`` writes the modules (or, with ``check``, only says which are stale).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from capsvc.codegen.model import Schema
from capsvc.codegen.render import render


def sources(schema: Schema, *, relative_imports: bool = False) -> dict[str, str]:
    """Module file name -> source, for every file of ``schema`` (see ``render``)."""
    return {
        f"{file.module}.py": render(file, schema, relative_imports=relative_imports)
        for file in schema.files
    }


def is_package(out_dir: str) -> bool:
    """Generated modules in a package import each other relatively."""
    return os.path.isfile(os.path.join(out_dir, "__init__.py"))


def schema_of_paths(paths: list[str], import_dirs: Iterable[str] = ()) -> Schema:
    """The model of schema files parsed by pycapnp (and of the files they import)."""
    from capsvc.codegen.collect import collect
    from capsvc.codegen.nodes import build_schema, schema_capnp

    messages, requested = collect(paths, list(import_dirs))
    nodes = []
    for data in messages:
        with schema_capnp.Node.from_bytes(data) as node:
            nodes.append(node.as_builder().as_reader())
    return build_schema(nodes, requested)


def schema_of_request(request: Any) -> Schema:
    """The model of a compiler plugin's CodeGeneratorRequest (a pycapnp reader)."""
    from capsvc.codegen.nodes import build_schema

    requested = [(f.id, f.filename) for f in request.requestedFiles]
    return build_schema(list(request.nodes), requested)


def write(files: dict[str, str], out_dir: str, *, check: bool = False) -> list[str]:
    """Write ``files`` into ``out_dir``; returns the ones that changed (with ``check``,
    writes nothing and returns the ones that are stale or missing)."""
    changed = []
    for name, text in sorted(files.items()):
        path = os.path.join(out_dir, name)
        try:
            with open(path, encoding="utf-8") as existing:
                same = existing.read() == text
        except FileNotFoundError:
            same = False
        if same:
            continue
        changed.append(path)
        if not check:
            os.makedirs(out_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as target:
                target.write(text)
    return changed
