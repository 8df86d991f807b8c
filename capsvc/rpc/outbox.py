"""The outbox: every framed message one session produced, in protocol order.

Theory of operation:
- There is one writer per connection and one ordered queue (rpc-protocol.md §13.2): the
  order messages enter the outbox is the order they reach the peer. A driver takes the whole
  outbox at once (``take``) and writes it in one ``send_all``, so everything produced in one
  scheduler pass shares a write (DESIGN.md, "Buffered framing").
- A message that transfers a reference must be on the wire before whatever its building
  causes (rpc-protocol.md §13.10): when the params of a Call hold the last local reference to
  an import, releasing the params while the Call is being built sends a Release; that Release
  must follow the Call, or the peer frees the export the Call names. So a builder *reserves*
  its place first (``reserve``), builds, and then ``fill``s it: a Release, Finish or Resolve
  produced while building lands behind the reserved place, whatever the building does.
  C++ gets the same order by keeping the request's cap table alive until after ``send()``.
- ``urgent`` separates messages the peer acts on from housekeeping it never answers (Finish,
  Release): a driver may hold housekeeping back to travel with the next message (Nagle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from capsvc.errors import LocalProtocolError
from capsvc.framing import encode_message

Segments = Sequence[bytes | bytearray | memoryview]

#: Marks a reserved place that is not filled yet (or was given up).
_HOLE = b""


class Outbox:
    """Framed messages waiting for the driver; see the module docstring.

    ``pending_bytes`` (bytes framed and not yet taken: the driver's backpressure measure)
    and ``urgent`` (anything but housekeeping is queued) are plain attributes, read by the
    driver on every pass.
    """

    __slots__ = ("_frames", "_holes", "_open", "on_output", "pending_bytes", "urgent")

    def __init__(self, on_output: Callable[[], None] | None = None) -> None:
        #: Called when the outbox gets its first message, or its first urgent one: the
        #: driver's cue to schedule a write. Never called for a reservation alone.
        self.on_output = on_output
        self._frames: list[bytes] = []
        self.pending_bytes = 0
        self.urgent = False
        self._open = 0  # reserved places not yet filled
        self._holes = 0  # given-up places (skipped by ``take``)

    # -------------------------------------------------------------- producing
    def send(self, segments: Segments, *, urgent: bool = True) -> None:
        """Queue one message at the end."""
        frame = encode_message(segments)
        self._frames.append(frame)
        self._count(len(frame), urgent)

    def reserve(self) -> int:
        """Keep the next place for a message about to be built; returns the place."""
        self._frames.append(_HOLE)
        self._open += 1
        return len(self._frames) - 1

    def fill(self, place: int, segments: Segments, *, urgent: bool = True) -> None:
        """Put the built message into the place ``reserve`` returned."""
        frame = encode_message(segments)
        self._frames[place] = frame
        self._open -= 1
        self._count(len(frame), urgent)

    def give_up(self, place: int) -> None:
        """The message for ``place`` will not be sent after all (its building failed)."""
        self._open -= 1
        self._holes += 1

    def _count(self, size: int, urgent: bool) -> None:
        first = self.pending_bytes == 0
        self.pending_bytes += size
        if urgent and not self.urgent:
            self.urgent = True
            first = True
        if first and self.on_output is not None:
            self.on_output()

    # -------------------------------------------------------------- consuming
    def take(self) -> list[bytes]:
        """Every message queued since the last call, in protocol order."""
        if self._open:
            raise LocalProtocolError("the outbox was taken while a message was being built")
        frames, self._frames = self._frames, []
        if self._holes:
            frames = [frame for frame in frames if frame]
            self._holes = 0
        self.pending_bytes = 0
        self.urgent = False
        return frames

    @property
    def has_output(self) -> bool:
        return self.pending_bytes > 0
