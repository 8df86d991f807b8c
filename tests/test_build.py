"""The compiled and the pure-Python builds: which one a process gets (capsvc/_build.py)."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import capsvc
from capsvc import _build

PACKAGE = Path(capsvc.__file__).parent

PROBE = """
import capsvc, importlib
from capsvc._build import MODULES
print(capsvc.COMPILED)
for name in MODULES:
    print(importlib.import_module(name).__file__)
"""


def _probe(root: Path, **env: str) -> tuple[list[str], str]:
    """Import capsvc from ``root`` in a fresh interpreter: (printed lines, stderr)."""
    environment = {k: v for k, v in os.environ.items() if k != "CAPSVC_PURE"}
    environment.update(env, PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", PROBE],
        capture_output=True,
        text=True,
        env=environment,
        cwd=root,
        timeout=120,
        check=True,
    )
    return done.stdout.split(), done.stderr


def _copy_package(tmp_path: Path) -> Path:
    """A copy of the capsvc package with no compiled module in it."""
    target = tmp_path / "capsvc"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return tmp_path


def test_this_process_runs_the_build_it_reports() -> None:
    files = [sys.modules[name].__file__ or "" for name in _build.MODULES if name in sys.modules]
    assert files, "the suite imports the compiled modules"
    extension = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if os.environ.get("CAPSVC_PURE") == "1" or _build.build_state() != "compiled":
        assert capsvc.COMPILED is False
        assert all(path.endswith(".py") for path in files), files
    else:
        assert capsvc.COMPILED is True
        assert all(path.endswith(extension) for path in files), files


def test_capsvc_pure_serves_every_module_from_its_source() -> None:
    lines, _ = _probe(PACKAGE.parent, CAPSVC_PURE="1")
    assert lines[0] == "False"
    assert lines[1:] == [_build.source_path(name) for name in _build.MODULES]


@pytest.mark.parametrize("how", ["incomplete", "older than a source"])
def test_a_stale_build_falls_back_to_pure_python_with_a_warning(tmp_path: Path, how: str) -> None:
    root = _copy_package(tmp_path)
    # Empty files named as the extensions would be: a stale build must never be loaded,
    # so these are never opened (an import of one would fail loudly).
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    names = _build.MODULES[:1] if how == "incomplete" else _build.MODULES + _build.C_EXTENSIONS
    for name in names:
        fake = root / (str(Path(*name.split("."))) + suffix)
        fake.write_bytes(b"")
    if how != "incomplete":
        first = root / (str(Path(*_build.MODULES[0].split("."))) + suffix)
        os.utime(first, (1_000_000_000, 1_000_000_000))
    lines, stderr = _probe(root)
    assert lines[0] == "False"
    assert lines[1:] == [str(root / Path(*name.split("."))) + ".py" for name in _build.MODULES]
    reason = "not compiled" if how == "incomplete" else "changed after it was compiled"
    assert "capsvc's compiled modules are stale" in stderr
    assert reason in stderr
    assert "./dev compile" in stderr


def test_without_compiled_modules_the_pure_build_needs_no_warning(tmp_path: Path) -> None:
    root = _copy_package(tmp_path)
    lines, stderr = _probe(root)
    assert lines[0] == "False"
    assert "stale" not in stderr
