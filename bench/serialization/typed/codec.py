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
    """Packed stream: length-prefixed records, each one ``from_bytes_packed``."""

    __slots__ = ("_read", "_records")

    def __init__(self, root: Any) -> None:
        self._records = LengthPrefixDecoder()
        self._read = root.from_bytes_packed

    def feed(self, data: bytes) -> None:
        self._records.feed(data)

    def next(self) -> Any | None:
        body = self._records.next_body()
        return None if body is None else self._read(body)


class CapsvcCodec:
    """Generated codecs of one benchmark's request and response roots."""

    def __init__(
        self, request_root: Any, response_root: Any, compression: str, fmt: str = "capsvc"
    ) -> None:
        if compression not in ("none", "packed"):
            raise ValueError(f"unknown compression {compression!r}")
        self.format = fmt  # capsvc (rows) or capsvc-fields: the same codec
        self.compression = compression
        self.packed = compression == "packed"
        self._request = request_root
        self._response = response_root
        # Bound once, as msgpack's codec binds its packer's ``pack``: a message is framed in
        # one call of the codec's own, not a method chain per message.
        self.frame = self._framer(request_root)
        self.frame_response = self._framer(response_root)

    def view(self, message: Any) -> Any:
        if type(message) is tuple:
            return self._request.from_row(message).as_reader()
        return message.as_reader()

    def view_response(self, message: Any) -> Any:
        if type(message) is tuple:
            return self._response.from_row(message).as_reader()
        return message.as_reader()

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
        if self.packed:
            return self._bytes(self._response, handle(self._request.from_bytes_packed(data)))
        return self._bytes(self._response, handle(self._request.from_bytes(data)))

    def check_bytes(self, check: Callable[[Any, Any], None], data: bytes, expected: Any) -> None:
        if self.packed:
            check(self._response.from_bytes_packed(data), expected)
        else:
            check(self._response.from_bytes(data), expected)

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
        return _Packed(self._request) if self.packed else self._request.decoder()

    def response_decoder(self) -> Any:
        return _Packed(self._response) if self.packed else self._response.decoder()
