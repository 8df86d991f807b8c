"""The README's first example (the echo server and client on generated stubs) runs, and
mypy --strict accepts it and catches a type error put into it: what a new user copies must
work and be typed.

Theory of operation: the example is the first ``python`` block under "A tour of the API";
it is written to a file and run in a subprocess (its server listens on 127.0.0.1:0 and it
stops itself), then mypy checks the same file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tour_example() -> str:
    text = (ROOT / "README.md").read_text()
    tour = text[text.index("## A tour of the API") :]
    found = re.search(r"```python\n(.*?)```", tour, re.DOTALL)
    assert found is not None
    return found.group(1)


def test_the_tour_example_uses_generated_stubs_runs_and_is_typed(tmp_path: Path) -> None:
    source = tour_example()
    assert "from capsvc.generated.echo_capnp import Echo" in source
    assert "load_schema" not in source
    script = tmp_path / "tour.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # Real time: a subprocess serving and calling itself on loopback; bounds a hang.
    ran = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "hello\n"
    # The same with a wrong type in it: mypy must see the generated types (not Any).
    wrong = tmp_path / "wrong.py"
    wrong.write_text(source.replace("results.reply = params.msg", "results.reply = 5"))
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script), str(wrong)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, checked.stdout + checked.stderr
    assert errors[0].startswith("wrong.py:")
    assert 'expression has type "int", variable has type "str"' in errors[0]
