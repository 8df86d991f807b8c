"""rpc.capnp as pycapnp gives it, and small helpers for reading and writing its messages.

Theory of operation: the engine builds every outgoing message with pycapnp and reads every
incoming one with pycapnp, except for the two things pycapnp cannot do outside its own RPC
system: capability pointers inside payload content (capsvc.rpc.pointers) and messages with an
unknown union tag (we read the tag from the raw words instead of calling ``which()``, which
raises on an unknown ordinal). We use the rpc.capnp that pycapnp ships (it is the current one:
rpc-protocol.md §2), loaded with the import path its ``c++.capnp`` import needs
(pycapnp-notes.md §1.1: without it the interpreter aborts).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any

import capnp

from capsvc.errors import ExceptionType, RpcError

_PKG = os.path.dirname(capnp.__file__)
rpc: Any = capnp.load(os.path.join(_PKG, "rpc.capnp"), imports=[os.path.dirname(_PKG)])

Message: Any = rpc.Message

# Pointer-slot paths (capsvc.rpc.pointers.follow) from the message root to a payload's
# content: Message.<union member> is pointer 0, Call.params is pointer 1, Return.results
# is pointer 0, Payload.content is pointer 0.
CALL_CONTENT_PATH = (0, 1, 0)
RETURN_CONTENT_PATH = (0, 0, 0)

# Message union ordinals (rpc.capnp struct Message).
UNIMPLEMENTED, ABORT, CALL, RETURN, FINISH, RESOLVE, RELEASE = 0, 1, 2, 3, 4, 5, 6
OBSOLETE_SAVE, BOOTSTRAP, OBSOLETE_DELETE, PROVIDE, ACCEPT, JOIN, DISEMBARGO = (
    7,
    8,
    9,
    10,
    11,
    12,
    13,
)
THIRD_PARTY_ANSWER = 14

_WORD = struct.Struct("<Q")


def message_tag(segments: Sequence[bytes | bytearray | memoryview]) -> int | None:
    """The Message union tag read from the raw words, or None if the root is not a struct.

    Reading it ourselves is both faster than pycapnp and safe for unknown ordinals.
    """
    if not segments or len(segments[0]) < 8:
        return None
    (root,) = _WORD.unpack_from(segments[0], 0)
    if root & 3 != 0 or (root >> 32) & 0xFFFF == 0:
        return None  # far or non-struct root, or no data section: let pycapnp judge it
    offset = (root & 0xFFFFFFFF) >> 2
    if offset >= 1 << 29:
        offset -= 1 << 30
    data_word = 1 + offset
    if data_word < 0 or (data_word + 1) * 8 > len(segments[0]):
        return None
    return int.from_bytes(segments[0][data_word * 8 : data_word * 8 + 2], "little")


def read_message(
    segments: Sequence[bytes | bytearray | memoryview],
    *,
    traversal_limit_words: int,
    nesting_limit: int,
) -> Any:
    """A pycapnp reader over ``segments`` (zero-copy when they are 8-byte aligned)."""
    return Message.from_segments(
        list(segments), traversal_limit_in_words=traversal_limit_words, nesting_limit=nesting_limit
    )


def write_exception(builder: Any, error: BaseException) -> None:
    """Fill an rpc.capnp Exception builder from a Python exception."""
    if isinstance(error, RpcError):
        builder.reason = error.reason
        builder.type = int(error.type)
        if error.trace:
            builder.trace = error.trace
    else:
        builder.reason = f"{type(error).__name__}: {error}"
        builder.type = int(ExceptionType.FAILED)


def read_exception(reader: Any) -> RpcError:
    """The typed RpcError for an rpc.capnp Exception reader (unknown types read as FAILED)."""
    trace = reader.trace if reader._has("trace") else ""
    return RpcError.from_type(reader.type.raw, reader.reason, trace)
