"""Every code block of the README runs, or is checked against what it shows, so none can
rot (issue 12, point 5). What a new user copies must work as written.

Theory of operation: the README is split into fenced blocks (indented ones inside lists
too). By the block's language and first line:

- ``python``: a whole program, run with this interpreter in a scratch directory (where
  ``schemas/`` and ``examples/`` of the repository are visible and capsvc imports), which
  must exit 0; a ``text`` block right after it is its exact stdout. A first line
  ``# NAME.py`` writes the block to that file first (later blocks may import it); a
  ``test_*.py`` is run with pytest instead. A first line ``# PATH (abridged)`` shows part
  of a repository file: each of its code lines (comments dropped) must appear in PATH, in
  order (the file itself is run by its own tests).
- ``capnp``: a schema, loaded by capsvc (so it has its file ID and compiles); a first
  line ``# PATH`` also requires its declarations to appear in PATH, in order.
- ``sh``: every ``capsvc`` command line must parse (``capsvc`` subcommand and options),
  every ``./dev`` line name a ``./dev`` command, every ``python -m MODULE`` name a module
  that imports. (Commands that serve or need a server are run by tests/test_cli.py,
  tests/test_caller.py and tests/test_example_kv.py.)

The first tour example is also type-checked (mypy --strict), and must keep using the
generated stubs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from capsvc.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```\n", re.DOTALL | re.MULTILINE)
#: Real time: each program is another interpreter serving and calling itself on
#: loopback; this only bounds a hang.
TIMEOUT = 120


@dataclass
class Block:
    line: int
    language: str
    text: str
    #: The ``text`` block right after this one, if any (a program's expected stdout).
    output: str | None = None

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""

    @property
    def file_name(self) -> str | None:
        found = re.fullmatch(r"# (\S+\.py)", self.first_line)
        return found.group(1) if found else None

    @property
    def abridged(self) -> str | None:
        found = re.fullmatch(r"# (\S+) \(abridged\)", self.first_line)
        return found.group(1) if found else None

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.language})"


def blocks() -> list[Block]:
    text = README.read_text()
    found: list[Block] = []
    previous_end = -1
    for match in FENCE.finditer(text):
        indent = len(match.group(1))
        body = "".join(line[indent:] + "\n" for line in match.group(3).splitlines())
        block = Block(text.count("\n", 0, match.start()) + 1, match.group(2), body)
        if (
            block.language == "text"
            and found
            and found[-1].language == "python"
            and not text[previous_end : match.start()].strip()
        ):
            found[-1].output = body
        else:
            found.append(block)
        previous_end = match.end()
    return found


BLOCKS = blocks()


def of(language: str) -> list[pytest.param]:  # type: ignore[valid-type]
    return [pytest.param(b, id=f"line{b.line}") for b in BLOCKS if b.language == language]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding every named block, with the repository's schemas and examples."""
    directory = tmp_path_factory.mktemp("readme")
    for name in ("schemas", "examples"):
        (directory / name).symlink_to(ROOT / name)
    for block in BLOCKS:
        if block.language == "python" and block.file_name:
            (directory / block.file_name).write_text(block.text)
    return directory


def environment() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path)


def code_lines(text: str, comment: str) -> list[str]:
    """The block's lines without comments, blank lines and indentation."""
    lines = []
    for line in text.splitlines():
        code = line.split(f"  {comment} ")[0].split(f" {comment} ")[0].strip()
        if code and not code.startswith(comment):
            lines.append(code)
    return lines


def assert_in_order(shown: list[str], path: Path, comment: str) -> None:
    actual = code_lines(path.read_text(), comment)
    position = 0
    for line in shown:
        try:
            position = actual.index(line, position) + 1
        except ValueError:
            raise AssertionError(f"{line!r} is not in {path} (in this order)") from None


def test_the_readme_has_blocks_of_each_kind() -> None:
    kinds = {block.language for block in BLOCKS}
    assert {"python", "capnp", "sh", "text"} <= kinds
    assert len(of("python")) >= 8


@pytest.mark.parametrize("block", of("python"))
def test_python_block_runs_as_written(block: Block, scratch: Path) -> None:
    if block.abridged:
        assert_in_order(code_lines(block.text, "#")[1:], ROOT / block.abridged, "#")
        return
    name = block.file_name
    if name and name.startswith("test_"):
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name]
    else:
        script = scratch / (name or f"block_{block.line}.py")
        script.write_text(block.text)
        command = [sys.executable, script.name]
    ran = subprocess.run(
        command,
        cwd=scratch,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert ran.returncode == 0, f"{block}:\n{ran.stdout}\n{ran.stderr}"
    if block.output is not None:
        assert ran.stdout == block.output, f"{block} printed something else"


@pytest.mark.parametrize("block", of("capnp"))
def test_schema_block_compiles_and_matches_its_file(block: Block, tmp_path: Path) -> None:
    schema = tmp_path / "block.capnp"
    schema.write_text(block.text)
    # In a fresh interpreter: pycapnp aborts the process that loads a second file with an
    # ID it already has (the block's is its file's, which this process may have loaded).
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, capsvc; capsvc.load_schema(sys.argv[1])", schema],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert loaded.returncode == 0, f"{block} does not load: {loaded.stderr}"
    named = re.fullmatch(r"# (\S+\.capnp)", block.first_line)
    if named:
        assert_in_order(code_lines(block.text, "#"), ROOT / named.group(1), "#")


DEV_COMMANDS = set(re.findall(r"^#   \./dev (\w+)", (ROOT / "dev").read_text(), re.MULTILINE))


@pytest.mark.parametrize("block", of("sh"))
def test_shell_block_commands_exist(block: Block) -> None:
    parser = build_parser()
    for line in code_lines(block.text, "#"):
        words = shlex.split(line.removesuffix("&"))  # (run in the background)
        if words[0] == "./dev":
            assert words[1] in DEV_COMMANDS, f"{block}: no ./dev {words[1]}"
            words = words[1:]
        if words[0] == "capsvc":
            try:
                parser.parse_args(words[1:])
            except SystemExit as exit:
                raise AssertionError(f"{block}: capsvc rejects {line!r}") from exit
        if words[0] == "python" and words[1:2] == ["-m"]:
            module = words[2]
            found = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    f"import importlib.util as u; assert u.find_spec({module!r})",
                ],
                cwd=ROOT,
                env=environment(),
                capture_output=True,
                timeout=TIMEOUT,
                check=False,
            )
            assert found.returncode == 0, f"{block}: no module {module}"


def tour_example() -> str:
    text = README.read_text()
    tour = text[text.index("## A tour of the API") :]
    found = re.search(r"```python\n(.*?)```", tour, re.DOTALL)
    assert found is not None
    return found.group(1)


def test_the_tour_example_uses_generated_stubs_and_is_typed(tmp_path: Path) -> None:
    source = tour_example()
    assert "from capsvc.generated.echo_capnp import Echo" in source
    assert "load_schema" not in source
    script = tmp_path / "tour.py"
    script.write_text(source)
    # The same with a wrong type in it: mypy must see the generated types (not Any).
    wrong = tmp_path / "wrong.py"
    wrong.write_text(source.replace("results.reply = params.msg", "results.reply = 5"))
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script), str(wrong)],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, checked.stdout + checked.stderr
    assert errors[0].startswith("wrong.py:")
    assert 'expression has type "int", variable has type "str"' in errors[0]


def test_the_first_dev_run_says_what_it_is_doing(tmp_path: Path) -> None:
    # A copy of ./dev where no .venv exists, with an interpreter that fails at once: the
    # progress line must come before the (normally minute-long) set-up starts.
    (tmp_path / "dev").write_text((ROOT / "dev").read_text())
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    ran = subprocess.run(
        ["bash", str(tmp_path / "dev"), "test"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHON="false"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert ran.returncode != 0
    assert ran.stderr.startswith("dev: first run: creating .venv and installing capsvc"), ran.stderr
