"""Building bench/serving/cxx_load/load.c++, the C++ load generator of
``python -m bench.serving.workers --load cxx``.

    python -m bench.serving.cxx_build        # build (if needed) and print the binary's path

The build goes to ``build/cxx_load/<hash>/`` under the repository (``build/`` is ignored by
git), the hash covering load.c++, schemas/echo.capnp and the compiler command: a changed
source gets a fresh directory, an unchanged one is reused as it is. Two steps: ``capnp
compile -oc++:DIR --src-prefix=schemas schemas/echo.capnp`` (echo.capnp.h and .c++), then
``g++ -O2 -std=c++17 load.c++ echo.capnp.c++ -I DIR`` with the flags of ``pkg-config
--cflags --libs capnp-rpc`` (or ``-lcapnp-rpc -lcapnp -lkj-async -lkj -lpthread`` without
pkg-config). The directory is built under a temporary name and renamed when complete, so
that a half-built one is never taken for a build, and concurrent builds do not collide.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "bench" / "serving" / "cxx_load" / "load.c++"
SCHEMA_DIR = ROOT / "schemas"
SCHEMA = SCHEMA_DIR / "echo.capnp"
BUILD_DIR = ROOT / "build" / "cxx_load"
BINARY = "load"
#: A header the C++ client needs: it tells whether the C++ development files are there.
HEADER = Path("/usr/include/capnp/ez-rpc.h")
INSTALL_HINT = "apt-get install libcapnp-dev capnproto"
FALLBACK_LIBS = ["-lcapnp-rpc", "-lcapnp", "-lkj-async", "-lkj", "-lpthread"]
CXXFLAGS = ["-O2", "-std=c++17"]
#: Seconds each build step may take.
STEP_TIMEOUT = 300.0


class BuildError(RuntimeError):
    """The C++ load generator cannot be built (a tool or header missing, or a failed step)."""


def _library_flags() -> list[str]:
    """Compile and link flags for capnp-rpc: pkg-config's when it knows the package."""
    if shutil.which("pkg-config") is None:
        return FALLBACK_LIBS
    found = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "capnp-rpc"],
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )
    if found.returncode != 0:
        return FALLBACK_LIBS
    return found.stdout.split()


def missing() -> str | None:
    """Why the C++ client cannot be built here (what is missing), or None."""
    absent = [tool for tool in ("capnp", "capnpc-c++", "g++") if shutil.which(tool) is None]
    if not HEADER.exists() and not _header_via_pkg_config():
        absent.append(f"the Cap'n Proto C++ headers ({HEADER})")
    if not absent:
        return None
    return f"{', '.join(absent)} not found: {INSTALL_HINT}"


def _header_via_pkg_config() -> bool:
    """Whether capnp/ez-rpc.h is under one of pkg-config's include directories."""
    if shutil.which("pkg-config") is None:
        return False
    for flag in _library_flags():
        if flag.startswith("-I") and (Path(flag[2:]) / "capnp" / "ez-rpc.h").exists():
            return True
    return False


def _compiler_command(out: Path, flags: list[str]) -> list[str]:
    return [
        "g++", *CXXFLAGS, str(SOURCE), str(out / "echo.capnp.c++"), "-I", str(out),
        *flags, "-o", str(out / BINARY),
    ]  # fmt: skip


def build_dir(flags: list[str] | None = None) -> Path:
    """The build directory for the current sources: build/cxx_load/<hash>."""
    flags = _library_flags() if flags is None else flags
    digest = hashlib.sha256()
    for path in (SOURCE, SCHEMA):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(_compiler_command(Path("DIR"), flags)).encode())
    return BUILD_DIR / digest.hexdigest()[:16]


def _step(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=STEP_TIMEOUT, check=False
        )
    except FileNotFoundError as error:
        raise BuildError(f"{what}: {error}; {INSTALL_HINT}") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what}: not done within {STEP_TIMEOUT:g} s") from None
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        hint = ""
        if "No such file or directory" in output or "cannot find -l" in output:
            hint = f"\n(a header or library missing? {INSTALL_HINT})"
        raise BuildError(
            f"{what} failed (status {done.returncode}):\n{output[-4000:]}\n"
            f"command: {' '.join(command)}{hint}"
        )


def build(*, quiet: bool = True) -> Path:
    """The C++ load generator's binary, built if the sources changed since the last build.
    Raises BuildError, saying what to install, if capnp, g++ or the headers are missing."""
    flags = _library_flags()
    final = build_dir(flags)
    binary = final / BINARY
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    if why := missing():
        raise BuildError(f"cannot build the C++ load generator: {why}")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-", dir=BUILD_DIR))
    try:
        if not quiet:
            print(f"building the C++ load generator in {final} ...", flush=True)
        _step(
            ["capnp", "compile", f"-oc++:{scratch}", f"--src-prefix={SCHEMA_DIR}", str(SCHEMA)],
            "capnp compile (echo.capnp to C++)",
        )
        _step(_compiler_command(scratch, flags), "g++ (load.c++)")
        try:
            scratch.rename(final)
        except OSError:
            if not (binary.is_file() and os.access(binary, os.X_OK)):
                raise  # not a concurrent build that finished first
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return binary


if __name__ == "__main__":
    try:
        print(build(quiet=False))
    except BuildError as error:
        sys.exit(str(error))
