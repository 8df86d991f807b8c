"""Generated modules that import each other (``capsvc gen`` on schema files that do).

Theory of operation: Cap'n Proto lets ``a.capnp`` use ``b.capnp``'s types while ``b.capnp``
uses ``a.capnp``'s; their modules then import each other. A generated module's classes
only name the other module in annotations and method bodies, but its tail binds field
descriptors to the other module's classes and fills its value plans with the other's
(``A.Reader.b.bind(b_capnp.B.Reader)``): run at import time, whichever module is imported
first would find the other without classes yet. So a module in such a cycle makes its own
classes and plans, then hands ``ready`` a function doing what takes the others (in three
stages: bindings, plans, method tables) and the names of the cycle's modules it uses
(which ``ready`` imports and binds in it). Once every module of the cycle is ready, each
one's stages run, stage by stage, in the order the modules became ready (a module whose
interfaces extend another's imports it at its top, as Python needs its classes: it is
ready after it, so its method tables are filled after those they extend).

A module is imported here only while no module of the cycle is still importing its bases
(in sys.modules, not ready yet): that one goes on once they are made, and its own
``ready`` imports what is left.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ready"]

#: The number of stages a module's link function is called for (0, 1, 2).
STAGES = 3


class _Cycle:
    def __init__(self, members: tuple[str, ...]) -> None:
        self.members = members
        #: Module name -> its link function, in the order they became ready.
        self.links: dict[str, Callable[[int], None]] = {}
        #: (namespace, module name, its short name): imports left to do.
        self.pending: list[tuple[dict[str, Any], str, str]] = []
        #: Every import asked for, bound again before the links run.
        self.binds: list[tuple[dict[str, Any], str, str]] = []
        self.linked = False


_CYCLES: dict[tuple[str, ...], _Cycle] = {}


def ready(
    namespace: dict[str, Any],
    members: tuple[str, ...],
    link: Callable[[int], None],
    imports: tuple[str, ...],
) -> None:
    """The module whose globals are ``namespace``, one of the cycle ``members`` (module
    names as generated: ``a_capnp``), has made its classes: ``link(stage)`` binds what it
    takes from the others, and ``imports`` are the members it uses but did not import
    at its top, to import and bind in ``namespace``."""
    package = namespace.get("__package__") or ""

    def qualified(name: str) -> str:
        return f"{package}.{name}" if package else name

    key = tuple(qualified(name) for name in members)
    cycle = _CYCLES.get(key)
    if cycle is None:
        cycle = _CYCLES[key] = _Cycle(key)
    cycle.links[namespace["__name__"]] = link
    wanted = [(namespace, qualified(name), name) for name in imports]
    cycle.pending.extend(wanted)
    cycle.binds.extend(wanted)
    _advance(cycle)


def _advance(cycle: _Cycle) -> None:
    while cycle.pending:
        if any(name in sys.modules and name not in cycle.links for name in cycle.members):
            return  # one is importing its bases: it carries on when they are made
        namespace, name, short = cycle.pending.pop(0)
        namespace[short] = importlib.import_module(name)
    if cycle.linked or len(cycle.links) < len(cycle.members):
        return
    cycle.linked = True
    for namespace, name, short in cycle.binds:  # (some still being imported, above)
        namespace[short] = sys.modules[name]
    cycle.pending.clear()
    links = list(cycle.links.values())
    for stage in range(STAGES):
        for link in links:
            link(stage)
