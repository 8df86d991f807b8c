"""capsvc's build: pure Python, plus mypyc-compiled hot modules where a C compiler is.

Everything about the package is in pyproject.toml; this file only adds the extension
modules. The modules come from capsvc/_build.py (read by path: capsvc's dependencies
are not installed yet). ``CAPSVC_COMPILE=0`` builds pure Python only; so does a machine
without a C compiler, with a note. Developers rebuild in place with ``./dev compile``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig

from setuptools import setup


def _load_build_module():  # type: ignore[no-untyped-def]
    os.environ["CAPSVC_PURE"] = "1"  # importing the plan must not warn of a stale build
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "capsvc", "_build.py")
    spec = importlib.util.spec_from_file_location("capsvc_build_plan", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compiler_present() -> bool:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(compiler) is not None


def _extensions() -> list[object]:
    if os.environ.get("CAPSVC_COMPILE", "1") == "0":
        return []
    if not _compiler_present():
        print("capsvc: no C compiler found; installing the pure-Python build", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print(
            "capsvc: mypyc (mypy) is not installed; installing the pure-Python build",
            file=sys.stderr,
        )
        return []

    plan = _load_build_module()
    paths = [os.path.relpath(plan.source_path(module)) for module in plan.MODULES]
    from setuptools import Extension

    native = [
        Extension(module, [os.path.relpath(plan.source_path(module))], extra_compile_args=["-O2"])
        for module in plan.C_EXTENSIONS
    ]
    return [*mypycify(paths, opt_level="3", group_name=plan.GROUP), *native]


setup(ext_modules=_extensions())
