"""``capnpc-capsvc``: the Cap'n Proto compiler plugin (``capnp compile -ocapsvc:DIR``).

``capnp compile`` runs this with a ``CodeGeneratorRequest`` (schema.capnp) on stdin and the
output directory as the working directory (specs/codegen.md §1); it writes one module per
requested file there, through the same core as ``capsvc gen``.
"""

from __future__ import annotations

import sys


def main() -> int:
    from capsvc.codegen import is_package, schema_of_request, sources, write
    from capsvc.codegen.nodes import schema_capnp

    data = sys.stdin.buffer.read()
    request = schema_capnp.CodeGeneratorRequest.from_bytes(
        data, traversal_limit_in_words=1 << 30, nesting_limit=1 << 10
    )
    with request as reader:
        files = sources(schema_of_request(reader), relative_imports=is_package("."))
    write(files, ".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
