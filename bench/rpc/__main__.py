"""``python -m bench.rpc``: see bench.rpc.cli (and bench/rpc/README.md).

Theory of operation: only the entry point; the command line lives in bench.rpc.cli.
"""

import sys

from bench.rpc.cli import main

sys.exit(main())
