"""``python -m capsvc``: the same as the ``capsvc`` command.

Theory of operation: a thin shim; everything lives in :func:`capsvc.cli.main`.
"""

import sys

from capsvc.cli import main

sys.exit(main())
