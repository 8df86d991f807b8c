"""rpc.capnp as pycapnp gives it, and small helpers for reading and writing its messages.

Theory of operation: the messages of every call are read and written from raw words here,
with no pycapnp object: the headers of Calls and Returns (their payloads are the generated
codecs' business, capsvc.rpc.payload), and whole Finish and Release messages. Received
Calls and Returns whose cap tables are not empty, and the rarer messages (Bootstrap,
Resolve, Disembargo, Abort, Returns without results), go through pycapnp, except for the two
things pycapnp cannot do outside its own RPC system: capability pointers inside payload
content (capsvc.rpc.pointers) and messages with an unknown union tag (we read the tag from
the raw words instead of calling ``which()``, which raises on an unknown ordinal). We use
the rpc.capnp that pycapnp ships (it is the current one: rpc-protocol.md §2), loaded with
the import path its ``c++.capnp`` import needs (pycapnp-notes.md §1.1: without it the
interpreter aborts).
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
#: pycapnp's copy of rpc.capnp, loaded into pycapnp's one loader when capsvc is imported
#: (capsvc.schema checks user schemas against what that load brings in).
RPC_SCHEMA: Final = os.path.join(_PKG, "rpc.capnp")
rpc: Any = capnp.load(RPC_SCHEMA, imports=[os.path.dirname(_PKG)])

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


def check_sendable(segments: Sequence[bytes | bytearray], limit: int, what: str) -> None:
    """Refuse to send a message over ``limit`` words (our ``Limits.max_message_words``).

    A peer with the same limit (C++'s default traversal limit is the same 8 Mi words)
    would abort the whole connection on receiving it ("incoming RPC message exceeds size
    limit"). C++'s TwoPartyVatNetwork checks outgoing messages against its own limit for
    that reason and fails just the call instead; so does capsvc (the caller of this turns
    the ValueError into a Failed call or a Failed Return).
    """
    words = 0
    for segment in segments:
        words += len(segment)
    words >>= 3
    if words > limit:
        raise ValueError(
            f"{what} would be {words} words ({words * 8} bytes), over the limit of {limit}"
            " words (Limits.max_message_words) that a peer with the same limits refuses"
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
        "promised",
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
        #: A promisedAnswer target read from the raw words: (question ID, pointer path).
        self.promised: tuple[int, tuple[int, ...]] | None = None
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
    target_tag = _u16(segment, target_base + _TARGET_TAG)
    header.target_is_import = target_tag == 0
    header.imported_cap = _u32(segment, target_base + _TARGET_IMPORTED)
    if target_tag == 1 and target[2] >= 1:  # promisedAnswer, the target's pointer 0
        header.promised = _promised_answer(segment, target[0] + target[1])
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


# ---------------------------------------------------------------------- header writes
# The header fields of the Calls and Returns the generated codecs build (CodecPayload),
# written straight into the message at their offsets instead of through one builder
# property each; the rarer ones (a promisedAnswer target, flags) still go through builders.
_U16_AT: Final = struct.Struct("<H")
_U32_AT: Final = struct.Struct("<I")
_U64_AT: Final = struct.Struct("<Q")


def write_call_header(
    buf: bytearray, data_at: int, question_id: int, interface_id: int, method_id: int
) -> None:
    """questionId, interfaceId and methodId of the Call whose data section is at byte
    ``data_at`` of ``buf``."""
    _U32_AT.pack_into(buf, data_at + _CALL_QUESTION, question_id)
    _U64_AT.pack_into(buf, data_at + _CALL_INTERFACE, interface_id)
    _U16_AT.pack_into(buf, data_at + _CALL_METHOD, method_id)


def write_imported_target(buf: bytearray, data_at: int, import_id: int) -> None:
    """A MessageTarget (data section at byte ``data_at``) naming import ``import_id``."""
    _U16_AT.pack_into(buf, data_at + _TARGET_TAG, 0)  # importedCap
    _U32_AT.pack_into(buf, data_at + _TARGET_IMPORTED, import_id)


def write_return_header(buf: bytearray, data_at: int, answer_id: int, no_finish: bool) -> None:
    """answerId of a Return with results (data section at byte ``data_at``),
    releaseParamCaps false (C++ sends false: rpc-protocol.md §4) and noFinishNeeded."""
    _U32_AT.pack_into(buf, data_at + _RETURN_ANSWER, answer_id)
    # Bools are stored XOR their defaults: releaseParamCaps defaults to true.
    flags = buf[data_at + _RETURN_FLAGS_BYTE] & ~3
    buf[data_at + _RETURN_FLAGS_BYTE] = flags | 1 | (2 if no_finish else 0)


# ---------------------------------------------------------------------- cap tables
# CapDescriptor union ordinals (rpc.capnp), and where its fields sit.
CAP_NONE, SENDER_HOSTED, SENDER_PROMISE, RECEIVER_HOSTED, RECEIVER_ANSWER = 0, 1, 2, 3, 4
_CAP_TAG: Final = 2 * int(rpc.CapDescriptor.schema.node.struct.discriminantOffset)
_CAP_ID: Final = _slot_byte_offset(rpc.CapDescriptor.schema, "senderHosted")
_PROMISED_QUESTION: Final = _slot_byte_offset(rpc.PromisedAnswer.schema, "questionId")
_OP_TAG: Final = 2 * int(rpc.PromisedAnswer.Op.schema.node.struct.discriminantOffset)
_OP_FIELD: Final = _slot_byte_offset(rpc.PromisedAnswer.Op.schema, "getPointerField")
for _name in ("senderPromise", "receiverHosted"):  # one slot shared by the union members
    assert _slot_byte_offset(rpc.CapDescriptor.schema, _name) == _CAP_ID

#: One received CapDescriptor: (kind, id, transform path). ``id`` is the export or import
#: ID, or for receiverAnswer the question ID with ``path`` its pointer path.
CapEntry = tuple[int, int, tuple[int, ...]]


def _composite_list(segment: Segment, word: int) -> tuple[int, int, int, int] | None:
    """(first element word, count, data words, pointers) of the near composite list
    pointer at ``word``; None for anything else (pycapnp reads and judges it)."""
    if word < 0 or (word + 1) * 8 > len(segment):
        return None
    tagged = _i32(segment, word * 8)
    described = _u32(segment, word * 8 + 4)
    if tagged & 3 != 1 or described & 7 != 7:
        return None
    tag_word = word + 1 + (tagged >> 2)
    words = described >> 3
    if tag_word < 0 or (tag_word + 1 + words) * 8 > len(segment):
        return None
    tag = _i32(segment, tag_word * 8)
    data_words = _u16(segment, tag_word * 8 + 4)
    pointers = _u16(segment, tag_word * 8 + 6)
    count = tag >> 2
    if tag & 3 or count < 0 or count * (data_words + pointers) > words:
        return None
    return tag_word + 1, count, data_words, pointers


def read_cap_table(segments: Sequence[Segment], content_word: int) -> list[CapEntry] | None:
    """The capTable of the Payload whose content pointer is ``content_word`` (its capTable
    pointer is the next word), read from the raw words; None to say "read it with pycapnp"
    (far pointers, descriptors of Level 3 or unknown kinds, unusual encodings)."""
    segment = segments[0]
    table = _composite_list(segment, content_word + 1)
    if table is None:
        return None
    first, count, data_words, pointers = table
    if data_words < 1:
        return None  # every element is "none": rare enough for pycapnp (and bounded there)
    size = data_words + pointers
    entries: list[CapEntry] = []
    for index in range(count):
        at = first + index * size
        kind = _u16(segment, at * 8 + _CAP_TAG)
        if kind == RECEIVER_ANSWER:
            if pointers < 1:
                return None
            promised = _promised_answer(segment, at + data_words)
            if promised is None:
                return None
            entries.append((kind, promised[0], promised[1]))
        elif kind <= RECEIVER_HOSTED:
            entries.append((kind, _u32(segment, at * 8 + _CAP_ID), ()))
        else:
            return None
    return entries


def _promised_answer(segment: Segment, word: int) -> tuple[int, tuple[int, ...]] | None:
    """A PromisedAnswer's (questionId, pointer path), or None to leave it to pycapnp."""
    answer = _near_struct(segment, word)
    if answer is None or answer[1] < 1:
        return None
    data, data_words, pointers = answer
    question = _u32(segment, data * 8 + _PROMISED_QUESTION)
    if pointers < 1 or _u64(segment, (data + data_words) * 8) == 0:
        return question, ()  # no transform: the answer's root capability
    ops = _composite_list(segment, data + data_words)
    if ops is None or ops[2] < 1:
        return None
    first, count, op_data, op_pointers = ops
    path: list[int] = []
    for index in range(count):
        at = (first + index * (op_data + op_pointers)) * 8
        op = _u16(segment, at + _OP_TAG)
        if op == 1:  # getPointerField
            path.append(_u16(segment, at + _OP_FIELD))
        elif op != 0:  # not noop: unknown, pycapnp's path says so
            return None
    return question, tuple(path)


# ---------------------------------------------------------------------- Finish and Release
# Both are one data word each, no pointers, and per call wherever capabilities travel:
# read and written here from raw words, never through a pycapnp message.
_FINISH_QUESTION: Final = _slot_byte_offset(rpc.Finish.schema, "questionId")
_RELEASE_ID: Final = _slot_byte_offset(rpc.Release.schema, "id")
_RELEASE_COUNT: Final = _slot_byte_offset(rpc.Release.schema, "referenceCount")
_FINISH_FLAGS_BYTE: Final = 4  # releaseResultCaps is bit 32, the workaround flag bit 33
# The root pointer (Message: one data word, one pointer), then Message's data word (the
# union tag) and its pointer to the body (one data word, no pointers), then the body.
_SMALL_MESSAGE: Final = struct.Struct("<IHHHxxxxxxIHHII")


def _one_word_body(segments: Sequence[Segment]) -> tuple[Segment, int] | None:
    """Segment 0 and the byte offset of the message body's first data word, if the body is
    near and has one; None leaves the message to pycapnp."""
    segment = segments[0]
    body = _message_body(segment)
    if body is None or body[1] < 1:
        return None
    return segment, body[0] * 8


def read_finish(segments: Sequence[Segment]) -> tuple[int, bool] | None:
    """A Finish's (questionId, releaseResultCaps), or None to say "read it with pycapnp"."""
    found = _one_word_body(segments)
    if found is None:
        return None
    segment, base = found
    # Bools are stored XOR their default: releaseResultCaps defaults to true.
    return _u32(segment, base + _FINISH_QUESTION), not segment[base + _FINISH_FLAGS_BYTE] & 1


def read_release(segments: Sequence[Segment]) -> tuple[int, int] | None:
    """A Release's (id, referenceCount), or None to say "read it with pycapnp"."""
    found = _one_word_body(segments)
    if found is None:
        return None
    segment, base = found
    return _u32(segment, base + _RELEASE_ID), _u32(segment, base + _RELEASE_COUNT)


def finish_message(question_id: int, release_result_caps: bool) -> list[bytes]:
    """The segments of a Finish, the words pycapnp would build; it never asks for the
    early-cancellation workaround (rpc-protocol.md §13.5)."""
    # Stored XOR their defaults (both true): releaseResultCaps, and the workaround flag.
    flags = (0 if release_result_caps else 1) | 2
    return [_SMALL_MESSAGE.pack(0, 1, 1, FINISH, 0, 1, 0, question_id, flags)]


def release_message(import_id: int, count: int) -> list[bytes]:
    """The segments of a Release of ``count`` references to ``import_id``."""
    return [_SMALL_MESSAGE.pack(0, 1, 1, RELEASE, 0, 1, 0, import_id, count)]


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
