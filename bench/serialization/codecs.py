"""Codecs: a message as bytes in ``bytes`` mode and on the pipe (specs/benchmarks.md §6, §8).

Theory of operation
-------------------
**Cap'n Proto, compression none.** ``bytes`` mode uses pycapnp's ``to_bytes()`` (the
standard stream framing: segment table, then segments) and ``from_bytes()`` (zero-copy,
a context manager in pycapnp 2.x, so the reader is used inside the ``with``). On the pipe
the same framed bytes travel back to back, exactly as upstream (§6 "Framing on the pipe");
the receiver splits the stream with capsvc's :class:`~capsvc.framing.FrameDecoder`, which
returns 8-byte-aligned segment views that ``from_segments()`` reads in place.

**Cap'n Proto, compression packed.** ``to_bytes_packed()`` packs the whole framed message,
segment table included (§6), and ``from_bytes_packed()`` unpacks it. A packed stream has
no cheap way to find where a message ends (one would have to unpack it in Python), so on
the pipe each packed message is preceded by a 4-byte little-endian length. This is the
deviation §6 allows: the prefix is not part of Cap'n Proto's format and is not counted in
any byte figure this suite reports.

**msgpack** (§8). Messages are positional arrays; a reused ``Packer`` (autoreset, so
``pack`` returns the bytes) serializes them and ``unpackb(use_list=False)`` parses them into
tuples, the cheapest Python form. Strings are decoded or not, whichever is faster for the
benchmark (its ``MSGPACK_RAW``), as the direct Cap'n Proto readers choose their own text
representation: carsales never reads make and model, so they stay undecoded ``bytes``
(``raw=True``); catrank's server searches every snippet, and CPython's substring test is
faster on ``str`` (on ``bytes``, ``in`` first tries its operand as an int, ~280 ns against
~75 ns), which more than pays for the decoding. msgpack is self-delimiting, so on the pipe a reused
streaming ``Unpacker`` splits the stream without any prefix. msgpack has no packed form:
like protobuf upstream, ``packed`` maps to the same code path (§6).

**capnp-direct** (direct/): the same wire formats, but messages are lists of segment
``bytes`` that the direct accessors read and write themselves; see :class:`DirectCodec`.

Every pycapnp reader gets capsvc's receiver limits (traversal and nesting,
capsvc.framing), as a real service would pass them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from capsvc.framing import FrameDecoder, read_limits_kwargs

__all__ = [
    "CapnpCodec",
    "DirectCodec",
    "LengthPrefixDecoder",
    "MsgpackCodec",
    "make_codec",
]

_LENGTH = struct.Struct("<I")  # the packed-stream length prefix (documented deviation, §6)
_LIMITS = read_limits_kwargs()


class LengthPrefixDecoder:
    """Splits a stream of ``u32 length | body`` records; returns each body as ``bytes``."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_body(self) -> bytes | None:
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            return None
        (size,) = _LENGTH.unpack_from(buf, pos)
        end = pos + 4 + size
        if len(buf) < end:
            return None
        body = bytes(buf[pos + 4 : end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end >= len(buf) - end:  # compact once the dead prefix outweighs the rest
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        return body


class _CapnpFramedDecoder:
    """Unpacked capnp stream: capsvc's FrameDecoder, then ``from_segments`` (zero-copy)."""

    __slots__ = ("_frames", "_type")

    def __init__(self, message_type: Any) -> None:
        self._frames = FrameDecoder()
        self._type = message_type

    def feed(self, data: bytes) -> None:
        self._frames.feed(data)

    def next(self) -> Any | None:
        segments = self._frames.next_message()
        if segments is None:
            return None
        return self._type.from_segments(segments, **_LIMITS)


class _CapnpPackedDecoder:
    """Packed capnp stream: length-prefixed records, each one ``from_bytes_packed``."""

    __slots__ = ("_records", "_type")

    def __init__(self, message_type: Any) -> None:
        self._records = LengthPrefixDecoder()
        self._type = message_type

    def feed(self, data: bytes) -> None:
        self._records.feed(data)

    def next(self) -> Any | None:
        body = self._records.next_body()
        if body is None:
            return None
        return self._type.from_bytes_packed(body, **_LIMITS)


class CapnpCodec:
    """pycapnp messages (root builders out, root readers in), unpacked or packed."""

    format = "capnp"

    def __init__(self, request_type: Any, response_type: Any, compression: str) -> None:
        if compression not in ("none", "packed"):
            raise ValueError(f"unknown compression {compression!r}")
        self.compression = compression
        self._request_type = request_type
        self._response_type = response_type
        self.packed = compression == "packed"

    def view(self, message: Any) -> Any:
        # object mode (§6): the receiver reads the builder in place, as a reader.
        return message.as_reader()

    view_response = view  # (a request and a response are made the same way)

    def encode(self, message: Any) -> bytes:
        return message.to_bytes_packed() if self.packed else message.to_bytes()

    def serve_bytes(self, handle: Callable[[Any], Any], data: bytes) -> bytes:
        if self.packed:
            response = handle(self._request_type.from_bytes_packed(data, **_LIMITS))
            return response.to_bytes_packed()
        with self._request_type.from_bytes(data, **_LIMITS) as request:
            response = handle(request)
        return response.to_bytes()

    def check_bytes(self, check: Callable[[Any, Any], None], data: bytes, expected: Any) -> None:
        if self.packed:
            check(self._response_type.from_bytes_packed(data, **_LIMITS), expected)
            return
        with self._response_type.from_bytes(data, **_LIMITS) as response:
            check(response, expected)

    def frame(self, message: Any) -> bytes:
        if self.packed:
            body = message.to_bytes_packed()
            return _LENGTH.pack(len(body)) + body
        return message.to_bytes()  # already in stream framing (§6)

    frame_response = frame  # (a request and a response are made the same way)

    def frame_all(self, messages: Sequence[Any]) -> bytes:
        return b"".join([self.frame(message) for message in messages])

    def request_decoder(self) -> Any:
        if self.packed:
            return _CapnpPackedDecoder(self._request_type)
        return _CapnpFramedDecoder(self._request_type)

    def response_decoder(self) -> Any:
        if self.packed:
            return _CapnpPackedDecoder(self._response_type)
        return _CapnpFramedDecoder(self._response_type)


class _MsgpackDecoder:
    """A reused streaming Unpacker: msgpack needs no framing (§8 "pipe")."""

    __slots__ = ("_unpacker",)

    def __init__(self, raw: bool) -> None:
        self._unpacker = msgpack.Unpacker(use_list=False, raw=raw)

    def feed(self, data: bytes) -> None:
        self._unpacker.feed(data)

    def next(self) -> Any | None:
        try:
            return self._unpacker.unpack()
        except msgpack.OutOfData:
            return None


class MsgpackCodec:
    """Positional arrays (§8). ``compression`` is accepted and ignored, as upstream's protobuf."""

    format = "msgpack"

    def __init__(self, single_float: bool, compression: str = "none", raw: bool = False) -> None:
        if compression not in ("none", "packed"):
            raise ValueError(f"unknown compression {compression!r}")
        self.compression = compression
        self._raw = raw  # strings stay bytes (see the module docstring)
        # §8: Float32 fields stay 4 bytes in carsales; catrank's Float64 must not shrink.
        self._packer = msgpack.Packer(use_single_float=single_float, autoreset=True)
        self.encode = self._packer.pack
        self.frame = self._packer.pack
        self.frame_response = self._packer.pack

    def view(self, message: Any) -> Any:
        return message  # §8: object mode works on the Python structures directly

    view_response = view  # (a request and a response are made the same way)

    def serve_bytes(self, handle: Callable[[Any], Any], data: bytes) -> bytes:
        return self._packer.pack(handle(msgpack.unpackb(data, use_list=False, raw=self._raw)))

    def check_bytes(self, check: Callable[[Any, Any], None], data: bytes, expected: Any) -> None:
        check(msgpack.unpackb(data, use_list=False, raw=self._raw), expected)

    def frame_all(self, messages: Sequence[Any]) -> bytes:
        pack = self._packer.pack
        return b"".join([pack(message) for message in messages])

    def request_decoder(self) -> Any:
        return _MsgpackDecoder(self._raw)

    def response_decoder(self) -> Any:
        return _MsgpackDecoder(self._raw)


class _DirectPackedDecoder:
    """Packed stream for the direct accessors: length-prefixed, unpacked by libcapnp."""

    __slots__ = ("_records", "_type")

    def __init__(self, message_type: Any) -> None:
        self._records = LengthPrefixDecoder()
        self._type = message_type

    def feed(self, data: bytes) -> None:
        self._records.feed(data)

    def next(self) -> Any | None:
        from bench.serialization.direct.wire import unpack_segments

        body = self._records.next_body()
        if body is None:
            return None
        return unpack_segments(self._type, body)


class DirectCodec:
    """Segment lists read and written by the direct accessors (bench/serialization/direct).

    Unpacked: the same stream framing as pycapnp, built and split here (capsvc.framing).
    Packed: libcapnp packs and unpacks through a pycapnp copy of the message, so packing
    costs the same C++ work as in the pycapnp codec plus one C++ copy.
    """

    format = "capnp-direct"

    def __init__(self, request_type: Any, response_type: Any, compression: str) -> None:
        if compression not in ("none", "packed"):
            raise ValueError(f"unknown compression {compression!r}")
        from bench.serialization.direct import wire

        self._wire = wire
        self.compression = compression
        self.packed = compression == "packed"
        self._request_type = request_type
        self._response_type = response_type

    def view(self, message: Any) -> Any:
        return message  # object mode: the built segments are read in place

    view_response = view  # (a request and a response are made the same way)

    def encode(self, message: Any) -> bytes:
        if self.packed:
            return self._wire.pack_segments(message.root_type, message)
        return self._wire.frame_message(message)

    def serve_bytes(self, handle: Callable[[Any], Any], data: bytes) -> bytes:
        if self.packed:
            return self.encode(handle(self._wire.unpack_segments(self._request_type, data)))
        return self._wire.frame_message(handle(self._wire.flat_segments(data)))

    def check_bytes(self, check: Callable[[Any, Any], None], data: bytes, expected: Any) -> None:
        if self.packed:
            check(self._wire.unpack_segments(self._response_type, data), expected)
        else:
            check(self._wire.flat_segments(data), expected)

    def frame(self, message: Any) -> bytes:
        if self.packed:
            body = self._wire.pack_segments(message.root_type, message)
            return _LENGTH.pack(len(body)) + body
        return self._wire.frame_message(message)

    frame_response = frame  # (a request and a response are made the same way)

    def frame_all(self, messages: Sequence[Any]) -> bytes:
        return b"".join([self.frame(message) for message in messages])

    def request_decoder(self) -> Any:
        if self.packed:
            return _DirectPackedDecoder(self._request_type)
        return self._wire.StreamSegments()

    def response_decoder(self) -> Any:
        if self.packed:
            return _DirectPackedDecoder(self._response_type)
        return self._wire.StreamSegments()


def make_codec(benchmark_module: Any, fmt: str, compression: str) -> Any:
    """The codec for one benchmark (its schema types, its float width) in one format."""
    if fmt in ("capsvc", "capsvc-fields"):
        import importlib

        from bench.serialization.typed.codec import CapsvcCodec

        name = benchmark_module.__name__.rsplit(".", 1)[1]
        generated = importlib.import_module(f"bench.serialization.generated.{name}_capnp")
        return CapsvcCodec(
            getattr(generated, benchmark_module.REQUEST_TYPE),
            getattr(generated, benchmark_module.RESPONSE_TYPE),
            compression,
            fmt,
            rows=fmt == "capsvc" and getattr(benchmark_module, "CAPSVC_ROW_MESSAGES", False),
        )
    if fmt == "capnpy":
        from bench.serialization.peer_capnpy import make_capnpy_codec

        return make_capnpy_codec(benchmark_module, compression)
    if fmt == "capnp-direct":
        schema = benchmark_module.load_schema()
        return DirectCodec(
            getattr(schema, benchmark_module.REQUEST_TYPE),
            getattr(schema, benchmark_module.RESPONSE_TYPE),
            compression,
        )
    if fmt == "capnp":
        schema = benchmark_module.load_schema()
        return CapnpCodec(
            getattr(schema, benchmark_module.REQUEST_TYPE),
            getattr(schema, benchmark_module.RESPONSE_TYPE),
            compression,
        )
    if fmt == "msgpack":
        return MsgpackCodec(
            benchmark_module.MSGPACK_SINGLE_FLOAT, compression, benchmark_module.MSGPACK_RAW
        )
    raise ValueError(f"unknown format {fmt!r}")
