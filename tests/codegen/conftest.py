"""Generated modules for the test schemas, made once per session into a temporary
directory (the checked-in ones for the project's own schemas are tested apart)."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

import capsvc
from capsvc.codegen import schema_of_paths, sources, write
from capsvc.codegen.model import Schema

SCHEMAS = os.path.join(os.path.dirname(__file__), "..", "schemas")


@dataclass
class Generated:
    schema: Schema
    directory: str
    kitchen: ModuleType  # the generated module
    other: ModuleType
    reference: Any  # pycapnp's module for the same schema


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    directory = str(tmp_path_factory.mktemp("generated"))
    schema = schema_of_paths([os.path.join(SCHEMAS, "kitchen.capnp")])
    write(sources(schema), directory)
    sys.path.insert(0, directory)
    try:
        kitchen = importlib.import_module("kitchen_capnp")
        other = importlib.import_module("kitchen_other_capnp")
    finally:
        sys.path.remove(directory)
    # load_schema: pycapnp's directory is searched too (Sink's `-> stream`).
    reference = capsvc.load_schema(os.path.join(SCHEMAS, "kitchen.capnp"), imports=[SCHEMAS])
    return Generated(schema, directory, kitchen, other, reference)


def native_module() -> ModuleType | None:
    """The C half of the codecs (capsvc/codec/_native.c) wherever it was built, in the pure
    build's runs too (it works on any MessageReader: there it is held to the pure Python
    codecs); None on a machine without a C compiler, or with a stale build."""
    from capsvc import _build
    from capsvc.codec import rows

    if rows._native is not None:
        return rows._native  # type: ignore[no-any-return]
    if _build.build_state() != "compiled":
        return None
    return importlib.import_module("capsvc.codec._native")
