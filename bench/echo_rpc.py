"""The first echo comparison grew into the RPC suite: this is an alias of ``bench.rpc``.

    python -m bench.echo_rpc compare [OPTIONS]   is   python -m bench.rpc run [OPTIONS]
    python -m bench.echo_rpc COMMAND ...         is   python -m bench.rpc COMMAND ...

Theory of operation: kept only so that older notes and the README's command keep working;
everything lives in bench/rpc (see bench/rpc/README.md).
"""

from __future__ import annotations

import sys

from bench.rpc.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["compare"]:
        argv = ["run", *argv[1:]]
    sys.exit(main(argv))
