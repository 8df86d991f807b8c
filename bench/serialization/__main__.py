"""Entry point: ``python -m bench.serialization run|report|sizes`` (see cli.py)."""

from __future__ import annotations

import sys

from bench.serialization.cli import main

if __name__ == "__main__":
    sys.exit(main())
