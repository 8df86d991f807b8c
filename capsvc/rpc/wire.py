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
from typing import Any, Final

import capnp
from librt.strings import read_i16_le, read_i32_le, read_i64_le

from capsvc.errors import ExceptionType, RemoteProtocolError, RpcError

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

Segment = bytes | bytearray | memoryview


def message_tag(segments: Sequence[Segment]) -> int | None:
    """The Message union tag read from the raw words, or None if the root is not a struct.

    Reading it ourselves is both faster than pycapnp and safe for unknown ordinals.
    """
    if not segments or len(segments[0]) < 8:
        return None
    segment = segments[0]
    root = _u64(segment, 0)
    if root & 3 != 0 or (root >> 32) & 0xFFFF == 0:
        return None  # far or non-struct root, or no data section: let pycapnp judge it
    offset = (root & 0xFFFFFFFF) >> 2
    if offset >= 1 << 29:
        offset -= 1 << 30
    data_word = 1 + offset
    if data_word < 0 or (data_word + 1) * 8 > len(segment):
        return None
    return _u16(segment, data_word * 8)


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
    """The typed RpcError for an rpc.capnp Exception reader (unknown types read as FAILED).

    A reason or trace that is not UTF-8 (found by fuzzing: pycapnp raises
    UnicodeDecodeError) is the peer's mistake about its own error, not a reason to lose
    the error: it is replaced by a note saying so."""
    trace = _text(reader, "trace") if reader._has("trace") else ""
    return RpcError.from_type(reader.type.raw, _text(reader, "reason"), trace)


def _text(reader: Any, field: str) -> str:
    try:
        return str(getattr(reader, field))
    except UnicodeDecodeError:
        return f"(the peer's {field} is not valid UTF-8)"


# ---------------------------------------------------------------------- fast Call header
# The fields the engine needs from every Call, read straight from the words (pycapnp
# attribute reads cost ~1 us each and a Call needs a dozen). Offsets come from the schema;
# anything unusual (far pointers, short structs) returns None and the caller falls back to
# pycapnp, which then also does all the validation.
# Little-endian reads of a segment at a byte offset the caller has checked. A ``bytes``
# segment (what capsvc.framing gives for a one-segment message, nearly every RPC message) is
# read natively by librt.strings when compiled: no Python call, tuple or buffer per read.
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")


def _u16(segment: Segment, at: int) -> int:
    if isinstance(segment, bytes):
        return int(read_i16_le(segment, at)) & 0xFFFF
    return int(_U16.unpack_from(segment, at)[0])


def _u32(segment: Segment, at: int) -> int:
    if isinstance(segment, bytes):
        return int(read_i32_le(segment, at)) & 0xFFFFFFFF
    return int(_U32.unpack_from(segment, at)[0])


def _i32(segment: Segment, at: int) -> int:
    if isinstance(segment, bytes):
        return int(read_i32_le(segment, at))
    return int(_I32.unpack_from(segment, at)[0])


def _u64(segment: Segment, at: int) -> int:
    if isinstance(segment, bytes):
        word = read_i64_le(segment, at)
        return int(word) if word >= 0 else int(word) + (1 << 64)
    return int(_U64.unpack_from(segment, at)[0])


def _slot_byte_offset(schema: Any, name: str) -> int:
    field = next(f for f in schema.node.struct.fields if f.name == name)
    size = {"uint16": 2, "uint32": 4, "uint64": 8}[field.slot.type.which()]
    return int(field.slot.offset) * size


_CALL_QUESTION: Final = _slot_byte_offset(rpc.Call.schema, "questionId")
_CALL_INTERFACE: Final = _slot_byte_offset(rpc.Call.schema, "interfaceId")
_CALL_METHOD: Final = _slot_byte_offset(rpc.Call.schema, "methodId")
_SEND_TO_TAG: Final = 2 * int(
    rpc.Call.schema.fields["sendResultsTo"].schema.node.struct.discriminantOffset
)
_TARGET_TAG: Final = 2 * int(rpc.MessageTarget.schema.node.struct.discriminantOffset)
_TARGET_IMPORTED: Final = _slot_byte_offset(rpc.MessageTarget.schema, "importedCap")


def _near_struct(segment: Segment, word: int) -> tuple[int, int, int] | None:
    """(first data word, data words, pointers) of the near struct pointer at ``word``."""
    if word < 0 or (word + 1) * 8 > len(segment):
        return None
    at = word * 8
    tagged = _i32(segment, at)  # offset << 2 | kind, signed
    data_words = _u16(segment, at + 4)
    pointers = _u16(segment, at + 6)
    if tagged & 3 or (tagged == 0 and data_words == 0 and pointers == 0):
        return None  # far, list, other, or null: let pycapnp handle (and judge) it
    start = word + 1 + (tagged >> 2)
    if start < 0 or (start + data_words + pointers) * 8 > len(segment):
        return None
    return start, data_words, pointers


def _message_body(segment: Segment) -> tuple[int, int, int] | None:
    """The struct the Message union points at (Call, Return...), if it is near and sane."""
    root = _near_struct(segment, 0)
    if root is None or root[2] < 1:
        return None
    return _near_struct(segment, root[0] + root[1])


class CallHeader:
    """What the engine reads from a Call before dispatching it."""

    __slots__ = (
        "content_word",
        "has_caps",
        "imported_cap",
        "interface_id",
        "method_id",
        "question_id",
        "send_to",
        "target_is_import",
    )

    def __init__(self) -> None:
        self.question_id = 0
        self.interface_id = 0
        self.method_id = 0
        self.send_to = 0  # 0 caller, 1 yourself, 2 thirdParty
        self.target_is_import = True
        self.imported_cap = 0
        self.has_caps = False
        self.content_word = -1  # the params' content pointer, a word of segment 0


def read_call_header(segments: Sequence[Segment]) -> CallHeader | None:
    """The Call's header fields, or None to say "read it with pycapnp instead"."""
    segment = segments[0]
    body = _message_body(segment)
    if body is None:
        return None
    data, data_words, pointers = body
    if data_words < 3 or pointers < 2:
        return None
    base = data * 8
    header = CallHeader()
    header.question_id = _u32(segment, base + _CALL_QUESTION)
    header.interface_id = _u64(segment, base + _CALL_INTERFACE)
    header.method_id = _u16(segment, base + _CALL_METHOD)
    header.send_to = _u16(segment, base + _SEND_TO_TAG)
    target = _near_struct(segment, data + data_words)
    if target is None or target[1] < 1:
        return None
    target_base = target[0] * 8
    header.target_is_import = _u16(segment, target_base + _TARGET_TAG) == 0
    header.imported_cap = _u32(segment, target_base + _TARGET_IMPORTED)
    params = _near_struct(segment, data + data_words + 1)
    if params is None:
        return None
    header.content_word, header.has_caps = _payload_pointers(segment, params)
    return header


# ---------------------------------------------------------------------- fast Return header
_RETURN_ANSWER: Final = _slot_byte_offset(rpc.Return.schema, "answerId")
_RETURN_TAG: Final = 2 * int(rpc.Return.schema.node.struct.discriminantOffset)
_RETURN_FLAGS_BYTE: Final = 4  # releaseParamCaps is bit 32, noFinishNeeded bit 33 of data word 0


class ReturnHeader:
    """What the engine reads from a Return with results before settling its question."""

    __slots__ = (
        "answer_id",
        "content_word",
        "has_caps",
        "no_finish_needed",
        "release_param_caps",
        "which",
    )

    def __init__(self) -> None:
        self.answer_id = 0
        self.which = 0  # 0 results, 1 exception, 2 canceled, ... (rpc.capnp Return union)
        self.release_param_caps = True
        self.no_finish_needed = False
        self.has_caps = False
        self.content_word = -1  # the results' content pointer, a word of segment 0


def read_return_header(segments: Sequence[Segment]) -> ReturnHeader | None:
    """The Return's header fields, or None to say "read it with pycapnp instead"."""
    segment = segments[0]
    body = _message_body(segment)
    if body is None:
        return None
    data, data_words, pointers = body
    if data_words < 1 or pointers < 1:
        return None
    base = data * 8
    header = ReturnHeader()
    header.answer_id = _u32(segment, base + _RETURN_ANSWER)
    header.which = _u16(segment, base + _RETURN_TAG)
    flags = segment[base + _RETURN_FLAGS_BYTE]
    # Bools are stored XOR their default: releaseParamCaps defaults to true.
    header.release_param_caps = not (flags & 1)
    header.no_finish_needed = bool(flags & 2)
    if header.which == 0:
        results = _near_struct(segment, data + data_words)
        if results is None:
            return None
        header.content_word, header.has_caps = _payload_pointers(segment, results)
    return header


def _payload_pointers(segment: Segment, payload: tuple[int, int, int]) -> tuple[int, bool]:
    """Of a Payload struct (first data word, data words, pointers): the word of its content
    pointer (-1 if it has none) and whether its capTable is non-empty."""
    data, data_words, pointers = payload
    content_word = data + data_words if pointers >= 1 else -1
    has_caps = pointers >= 2 and _u64(segment, (content_word + 1) * 8) != 0
    return content_word, has_caps


def transform_path(transform: Any) -> tuple[int, ...]:
    """The pointer path of a PromisedAnswer's transform (rpc-protocol.md §6: skip noop)."""
    path = []
    for op in transform:
        which = op.which()
        if which == "getPointerField":
            path.append(op.getPointerField)
        elif which != "noop":
            raise RemoteProtocolError(f"unknown PromisedAnswer op {which!r}")
    return tuple(path)
