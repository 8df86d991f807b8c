"""Wire format of the reliable stream's segments (EtherType 0x88B5).

Theory of operation
-------------------
Every frame of :mod:`capsvc.nicdriver.stream` is an Ethernet II frame (no VLAN tag) with
EtherType 0x88B5, IEEE 802's "local experimental" type (spec nicdriver.md 2.7), whose
payload is a 32-byte header followed by up to :data:`MSS` bytes of stream data::

    offset size field
    0      1    version (1)
    1      1    flags: SYN 0x01, ACK 0x02, FIN 0x04, RST 0x08, CLOSED 0x10, PROBE 0x20
    2      2    reserved (0)
    4      4    connection id (chosen by the connecting side)
    8      4    sequence number of this segment (segments, not bytes; DATA and FIN use one)
    12     4    cumulative acknowledgement: the next sequence number expected
    16     8    selective acknowledgement bitmap: bit i = segment ack+1+i is held
    24     2    receive window, in segments beyond the acknowledgement
    26     2    payload length
    28     4    CRC-32 of bytes 0..27 and the payload

All fields are little-endian. Frames shorter than 60 bytes are padded by the NIC
(HLREG0.TXPADEN), so the payload length field, not the frame length, delimits the data.
The CRC is end to end: veth and the model carry no FCS (spec 2.7), and it also catches a
buffer reused too early. :func:`decode` returns None for anything that is not a well-formed
segment of ours (wrong EtherType, version, length or CRC), so such frames are ignored.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

__all__ = [
    "ACK",
    "CLOSED",
    "ETHERTYPE",
    "FIN",
    "HEADER_SIZE",
    "MSS",
    "PROBE",
    "RST",
    "SYN",
    "Segment",
    "decode",
    "encode",
    "encode_after",
    "ethernet_header",
]

ETHERTYPE = 0x88B5
ETHERTYPE_BYTES = ETHERTYPE.to_bytes(2, "big")
VERSION = 1
SYN = 0x01
ACK = 0x02
FIN = 0x04
RST = 0x08
CLOSED = 0x10  # the sender will not read any more: stop sending to it
PROBE = 0x20  # please acknowledge at once (zero-window probe, keep-alive)
ETH_HEADER = 14
_FIELDS = struct.Struct("<BBHIIIQHH")
_CRC = struct.Struct("<I")
HEADER_SIZE = _FIELDS.size + _CRC.size
_CRC_AT = ETH_HEADER + _FIELDS.size  # offset of the CRC in a frame
_PAYLOAD = ETH_HEADER + HEADER_SIZE  # offset of the payload in a frame
MTU = 1500
MSS = MTU - HEADER_SIZE  # 1468 data bytes per frame
FLAG_NAMES = {SYN: "SYN", ACK: "ACK", FIN: "FIN", RST: "RST", CLOSED: "CLOSED", PROBE: "PROBE"}


class Segment(NamedTuple):
    """A decoded segment (``src``/``dst``: MAC addresses)."""

    dst: bytes
    src: bytes
    flags: int
    conn: int
    seq: int
    ack: int
    sack: int
    window: int
    payload: bytes

    def describe(self) -> str:
        names = "|".join(n for bit, n in FLAG_NAMES.items() if self.flags & bit) or "-"
        return (
            f"{self.src.hex(':')} > {self.dst.hex(':')} conn={self.conn:08x} {names} "
            f"seq={self.seq} ack={self.ack} win={self.window} sack={self.sack:#x} "
            f"len={len(self.payload)}"
        )


def ethernet_header(dst: bytes, src: bytes) -> bytes:
    """The 14-byte Ethernet II header of our frames from ``src`` to ``dst``."""
    return bytes(dst) + bytes(src) + ETHERTYPE_BYTES


def encode(
    dst: bytes,
    src: bytes,
    flags: int,
    conn: int,
    seq: int,
    ack: int,
    sack: int,
    window: int,
    payload: bytes | bytearray | memoryview = b"",
) -> bytes:
    """A complete Ethernet frame carrying one segment."""
    return encode_after(ethernet_header(dst, src), flags, conn, seq, ack, sack, window, payload)


def encode_after(
    eth: bytes,
    flags: int,
    conn: int,
    seq: int,
    ack: int,
    sack: int,
    window: int,
    payload: bytes | bytearray | memoryview = b"",
) -> bytes:
    """:func:`encode` with a prebuilt Ethernet header (a channel keeps its own)."""
    fields = _FIELDS.pack(
        VERSION,
        flags,
        0,
        conn & 0xFFFFFFFF,
        seq & 0xFFFFFFFF,
        ack & 0xFFFFFFFF,
        sack & 0xFFFFFFFFFFFFFFFF,
        min(window, 0xFFFF),
        len(payload),
    )
    crc = zlib.crc32(payload, zlib.crc32(fields))
    return b"".join((eth, fields, _CRC.pack(crc), payload))


def decode(frame: bytes | memoryview) -> Segment | None:
    """The segment in ``frame``, or None if it is not a valid one."""
    if type(frame) is not bytes:
        frame = bytes(frame)  # one copy; slicing bytes below is cheaper than views
    if len(frame) < _PAYLOAD or frame[12:14] != ETHERTYPE_BYTES:
        return None
    version, flags, _, conn, seq, ack, sack, window, length = _FIELDS.unpack_from(frame, ETH_HEADER)
    end = _PAYLOAD + length
    if version != VERSION or end > len(frame):
        return None
    payload = frame[_PAYLOAD:end]
    (crc,) = _CRC.unpack_from(frame, _CRC_AT)
    if zlib.crc32(payload, zlib.crc32(frame[ETH_HEADER:_CRC_AT])) != crc:
        return None
    return Segment(frame[0:6], frame[6:12], flags, conn, seq, ack, sack, window, payload)
