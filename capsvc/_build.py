"""Which modules capsvc compiles with mypyc, and which build a process imports.

Theory of operation
-------------------
``setup.py`` compiles ``MODULES`` with mypyc when a C compiler and mypyc are at hand
(``CAPSVC_COMPILE=0`` skips it): each becomes an extension module beside its ``.py``,
and all of them share one library, ``capsvc/native__mypyc*.so``. Python imports an
extension in preference to a ``.py`` of the same name, so ``select()`` (the first thing
``capsvc/__init__`` does) decides which build this process gets and, for the pure one,
puts a finder in front of the import system that serves the ``.py`` files instead:

- ``CAPSVC_PURE=1`` asks for the pure-Python build (CI runs the suite both ways);
- a build that is incomplete, or older than any of its sources, is stale: compiled
  modules call each other directly inside the shared library, so a mix of fresh ``.py``
  and stale compiled code is never safe. A stale build falls back to pure Python, all of
  it, with a warning that says how to rebuild.

This module imports nothing of capsvc's (setup.py reads ``MODULES`` from it before
capsvc's dependencies are installed).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: The modules compiled by mypyc: the codec runtime every generated reader and builder
#: runs on (codegen.md §2), and the protocol engine and its trio driver, which every call
#: crosses. Packages' ``__init__`` modules stay Python, and so do modules mypyc cannot
#: compile or that must stay interpreted: api.py (async generators), rpc/rpc_capnp.py
#: (generated; nested classes), client.py (``__getattr__``) and codec/pipeline.py
#: (generated ``Promise`` classes take it and a generated base as bases), errors.py
#: (exception classes users subclass), typed.py (generated code subclasses it).
MODULES: tuple[str, ...] = (
    "capsvc.codec.reading",
    "capsvc.codec.building",
    "capsvc.codec.packing",
    "capsvc.codec.accessors",
    "capsvc.codec.plans",
    "capsvc.codec.scalars",
    "capsvc.codec.values",
    "capsvc.codec.rows",
    "capsvc.codec.streams",
    "capsvc.rpc.answers",
    "capsvc.rpc.copying",
    "capsvc.rpc.embargoes",
    "capsvc.rpc.exports",
    "capsvc.rpc.hooks",
    "capsvc.rpc.ids",
    "capsvc.rpc.imports",
    "capsvc.rpc.lifecycle",
    "capsvc.rpc.outbox",
    "capsvc.rpc.payload",
    "capsvc.rpc.pointers",
    "capsvc.rpc.questions",
    "capsvc.rpc.remote",
    "capsvc.rpc.session",
    "capsvc.rpc.wire",
    "capsvc.framing",
    "capsvc.flusher",
    "capsvc.connection",
    "capsvc.runtime",
    "capsvc.typed_calls",
    "capsvc.server",
)

#: Extension modules written in C (each a ``.c`` beside where its module would be),
#: built with the mypyc ones and part of the compiled build: the row reader
#: (capsvc.codec.rows reads through it when compiled).
C_EXTENSIONS: tuple[str, ...] = ("capsvc.codec._native",)

#: The shared library's module (mypyc's ``group_name``; the file adds ``__mypyc``).
GROUP = "capsvc.native"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def source_path(module: str) -> str:
    """The ``.py`` file of one of ``MODULES`` (the ``.c`` of one of ``C_EXTENSIONS``)."""
    parts = module.split(".")[1:]
    return os.path.join(_PACKAGE_DIR, *parts) + (".c" if module in C_EXTENSIONS else ".py")


def _compiled_path(module: str) -> str | None:
    stem = os.path.splitext(source_path(module))[0]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.exists(stem + suffix):
            return stem + suffix
    return None


def build_state() -> str:
    """``"compiled"``, ``"none"`` (no compiled module at all) or ``"stale: <why>"``."""
    found = {module: _compiled_path(module) for module in MODULES + C_EXTENSIONS}
    if not any(found.values()):
        return "none"
    missing = [module for module, path in found.items() if path is None]
    if missing:
        return f"stale: {', '.join(missing)} not compiled"
    for module, path in found.items():
        assert path is not None
        if os.path.getmtime(path) < os.path.getmtime(source_path(module)):
            return f"stale: {module} changed after it was compiled"
    return "compiled"


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Serves the ``.py`` of each compiled module (the pure-Python build)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def select() -> bool:
    """Choose this process's build before any compiled module is imported; True if the
    compiled one."""
    state = build_state()
    pure = os.environ.get("CAPSVC_PURE", "") not in ("", "0")
    if state == "compiled" and not pure:
        return True
    if state.startswith("stale") and not pure:
        warnings.warn(
            f"capsvc's compiled modules are {state}; running pure Python. Rebuild with"
            " `./dev compile` (or reinstall capsvc), or set CAPSVC_PURE=1 to silence this.",
            RuntimeWarning,
            stacklevel=3,
        )
    if not any(isinstance(finder, _SourceFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
    return False


#: Whether this process runs capsvc's compiled modules (False: pure Python).
COMPILED: bool = select()


if __name__ == "__main__":  # ``python capsvc/_build.py``: the state, for ./dev
    print(build_state())
