"""The ``capsvc`` codec: generated builders out, generated readers in.

Theory of operation
-------------------
A message leaves as a generated builder: ``to_bytes()`` (standard stream framing, one
segment) or, packed, ``to_bytes_packed()`` (capsvc.codec.packing over the framed bytes,
segment table included, as specs/benchmarks.md §6 says); or as a row of the request or
response root, which that root's ``encode`` (``packed=`` as above) turns into the same
bytes with no builder made, as msgpack's packer takes its tuples. Requests and responses
are told apart by the side that sends them (``frame`` / ``frame_response``, ``view`` /
``view_response``), as a row does not name its type. It arrives as the root reader of
the generated request or response type: ``from_bytes`` / ``from_bytes_packed`` in bytes
mode; on the pipe, unpacked streams are read by the generated root type's ``decoder()``
(capsvc's framing decoder and the root read in one compiled call), and packed messages
carry the same 4-byte length prefix as the other formats (codecs.py: the documented
deviation of §6, never counted as data).
Object mode reads a builder in place through ``as_reader()`` (a row: ``from_row`` first).
A benchmark whose ``capsvc`` cases read whole messages as rows (``CAPSVC_ROW_MESSAGES``:
eval) is given rows instead of readers, as msgpack's codec gives its tuples: the root's
``row_decoder()`` on the pipe (the row read in C straight from the segment, no reader
made), ``row`` of the reader in the other modes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from bench.serialization.codecs import LengthPrefixDecoder
from capsvc.framing import encode_messages

__all__ = ["CapsvcCodec"]

_LENGTH_PACK = struct.Struct("<I").pack


class _Packed:
    """Packed stream: length-prefixed records, each one ``from_bytes_packed`` (and its
    row, for a codec of rows)."""

    __slots__ = ("_read", "_records", "_row")

    def __init__(self, root: Any, rows: bool) -> None:
        self._records = LengthPrefixDecoder()
        self._read = root.from_bytes_packed
        self._row = root.row if rows else None

    def feed(self, data: bytes) -> None:
        self._records.feed(data)

    def next(self) -> Any | None:
        body = self._records.next_body()
        if body is None:
            return None
        message = self._read(body)
        return message if self._row is None else self._row(message)


class CapsvcCodec:
    """Generated codecs of one benchmark's request and response roots."""

    def __init__(
        self,
        request_root: Any,
        response_root: Any,
        compression: str,
        fmt: str = "capsvc",
        rows: bool = False,
    ) -> None:
        if compression not in ("none", "packed"):
            raise ValueError(f"unknown compression {compression!r}")
        self.format = fmt  # capsvc (rows) or capsvc-fields: the same codec
        self.compression = compression
        self.packed = compression == "packed"
        self._request = request_root
        self._response = response_root
        # A case that reads whole messages as rows (the benchmark's CAPSVC_ROW_MESSAGES)
        # is given rows: the root's row decoder on the pipe, ``row`` of the reader else.
        self.rows = rows
        # Bound once, as msgpack's codec binds its packer's ``pack``: a message is framed in
        # one call of the codec's own, not a method chain per message.
        self.frame = self._framer(request_root)
        self.frame_response = self._framer(response_root)

    def view(self, message: Any) -> Any:
        return self._view(self._request, message)

    def view_response(self, message: Any) -> Any:
        return self._view(self._response, message)

    def _view(self, root: Any, message: Any) -> Any:
        """object mode: ``message`` (a row: built first) read in place, as a reader or
        (a codec of rows) a row."""
        reader = (root.from_row(message) if type(message) is tuple else message).as_reader()
        return root.row(reader) if self.rows else reader

    def _received(self, root: Any, reader: Any) -> Any:
        return root.row(reader) if self.rows else reader

    def encode(self, message: Any) -> bytes:
        return self._bytes(self._request, message)

    def _bytes(self, root: Any, message: Any) -> bytes:
        """A request or response (``root``'s: a row, or a builder) as a whole message."""
        packed = self.packed
        if type(message) is tuple:
            return root.encode(message, packed=packed)  # type: ignore[no-any-return]
        data: bytes = message.to_bytes_packed() if packed else message.to_bytes()
        return data

    def serve_bytes(self, handle: Callable[[Any], Any], data: bytes) -> bytes:
        request = self._request
        reader = request.from_bytes_packed(data) if self.packed else request.from_bytes(data)
        return self._bytes(self._response, handle(self._received(request, reader)))

    def check_bytes(self, check: Callable[[Any, Any], None], data: bytes, expected: Any) -> None:
        response = self._response
        reader = response.from_bytes_packed(data) if self.packed else response.from_bytes(data)
        check(self._received(response, reader), expected)

    def _framer(self, root: Any) -> Callable[[Any], bytes]:
        """``frame`` for messages of ``root`` (rows or builders): unpacked bytes are framed
        already, as a stream wants them; packed ones take a length prefix (see above)."""
        encode = root.encode
        if self.packed:

            def frame_packed(message: Any) -> bytes:
                if type(message) is tuple:
                    body: bytes = encode(message, packed=True)
                else:
                    body = message.to_bytes_packed()
                return _LENGTH_PACK(len(body)) + body

            return frame_packed

        def frame(message: Any) -> bytes:
            if type(message) is tuple:
                return encode(message)  # type: ignore[no-any-return]
            return message.to_bytes()  # type: ignore[no-any-return]

        return frame

    def frame_all(self, messages: Sequence[Any]) -> bytes:
        if self.packed or any(type(message) is tuple for message in messages):
            return b"".join([self.frame(message) for message in messages])
        return encode_messages([message.to_segments() for message in messages])

    def request_decoder(self) -> Any:
        return self._decoder(self._request)

    def response_decoder(self) -> Any:
        return self._decoder(self._response)

    def _decoder(self, root: Any) -> Any:
        if self.packed:
            return _Packed(root, self.rows)
        return root.row_decoder() if self.rows else root.decoder()
