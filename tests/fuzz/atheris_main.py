#!/usr/bin/env python3
"""Coverage-guided fuzzing of the input path with atheris (libFuzzer for Python).

    ./dev fuzz [SECONDS]          (default 600; pure Python, so coverage is visible)

which runs this file (``CAPSVC_PURE=1``, the venv's python first on PATH: libFuzzer's
merge step runs it again by its path) with ``-max_total_time=SECONDS tests/fuzz/corpus``,
then merges the corpus down to the inputs that add coverage. The target is
tests/fuzz/target.py; libFuzzer adds every input that reaches new code to the corpus
directory, and a crash (an exception out of the target, or a broken property) is written
to ``crash-*`` in the working directory, with the traceback on stderr. ``--seed-corpus``
writes the valid conversations of ``target.seeds()`` into the corpus first. Needs
``pip install atheris`` (the ``fuzz`` extra); CI does not run this, it replays the kept
corpus (tests/test_fuzz.py).
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.fuzz import target

# After the imports: capsvc's pure build is served by its own import finder
# (capsvc/_build.py), which atheris's import hook does not see; instrumenting every
# function already loaded covers capsvc, pycapnp's Python parts and the stdlib alike.
atheris.instrument_all()

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def main() -> None:
    if "--seed-corpus" in sys.argv:
        sys.argv.remove("--seed-corpus")
        os.makedirs(CORPUS, exist_ok=True)
        for name, data in target.seeds().items():
            with open(os.path.join(CORPUS, f"seed-{name}"), "wb") as f:
                f.write(data)
    atheris.Setup(sys.argv, target.one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
