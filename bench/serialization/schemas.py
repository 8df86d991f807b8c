"""Loading the suite's schemas (schemas/bench/*.capnp) once per process.

Theory of operation
-------------------
The three schema files follow the field tables of specs/benchmarks.md §2-§4 with the
upstream file ids. ``capnp.load`` aborts the whole interpreter on a schema error
(pycapnp-notes §1.1), so only these fixed, tested files are ever loaded, and only by
processes that use the capnp format (msgpack runs never import pycapnp). Loaded modules
are cached: every case, codec and server in a process shares one schema object.
"""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["SCHEMA_DIR", "field", "group_field", "load"]

SCHEMA_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "schemas",
    "bench",
)


@functools.cache
def load(name: str) -> Any:
    """The pycapnp module of ``schemas/bench/<name>.capnp``."""
    import capnp

    return capnp.load(os.path.join(SCHEMA_DIR, f"{name}.capnp"))


def field(struct_type: Any, name: str) -> Any:
    """A field's schema object, for pycapnp's ``_get_by_field``/``_set_by_field`` fast paths.

    Those skip the by-name lookup that ``_get(name)`` and attribute access perform.
    """
    return struct_type.schema.fields[name]


def group_field(struct_type: Any, group: str, name: str) -> Any:
    """A field inside a group (eval's ``left``/``right`` unions)."""
    return struct_type.schema.fields[group].schema.fields[name]
