"""``python -m bench SUITE [ARGS...]``: run one of the benchmark suites under bench/.

    python -m bench serialization run --smoke     carsales/catrank/eval (specs/benchmarks.md)
    python -m bench serialization report results.json
    python -m bench echo_rpc compare

Theory of operation
-------------------
Every suite is a module or package ``bench.<SUITE>`` runnable with ``python -m``; this
entry point (what ``./dev bench`` calls) only picks one by name and runs it as
``__main__`` with the remaining arguments, so a new suite needs no change here. With no
suite name it lists the suites it finds.
"""

from __future__ import annotations

import os
import pkgutil
import runpy
import sys


def _suites() -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    names = []
    for module in pkgutil.iter_modules([here]):
        if module.ispkg:
            if os.path.exists(os.path.join(here, module.name, "__main__.py")):
                names.append(module.name)
        elif not module.name.startswith("_"):
            names.append(module.name)
    return sorted(names)


def main() -> None:
    suites = _suites()
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help") or sys.argv[1] not in suites:
        print(__doc__.split("Theory of operation")[0].rstrip(), file=sys.stderr)
        print(f"\nsuites: {', '.join(suites)}", file=sys.stderr)
        sys.exit(0 if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help") else 2)
    suite = sys.argv[1]
    sys.argv = [f"{sys.argv[0]} {suite}", *sys.argv[2:]]
    runpy.run_module(f"bench.{suite}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
