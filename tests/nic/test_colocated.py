"""The co-located mode's cable (DgramWire) and its model servicing."""

from __future__ import annotations

import time
from pathlib import Path

from capsvc.nicdriver.colocated import DgramWire


def receive_within(wire: DgramWire, seconds: float = 5.0) -> list[bytes]:
    """Poll ``wire`` until frames arrive. Real time: they come through a real datagram
    socket; it returns at once when they are there, so the limit only bounds a loss."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        frames = wire.receive()
        if frames:
            return frames
        time.sleep(0.001)
    return []


def test_dgram_wire_survives_the_peer_process_coming_and_going(rundir: Path) -> None:
    # Frames leave through a socket connected to the peer's path. A peer port re-opened by
    # a new process has a new socket at that path: the wire must reconnect to it, and
    # frames sent while nobody drives the peer are lost (counted), like on a real cable.
    a_dir, b_dir = rundir / "a", rundir / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = DgramWire(a_dir, b_dir)
    b = DgramWire(b_dir, a_dir)
    try:
        a.send(b"one")
        assert receive_within(b) == [b"one"]
        b.close()
        a.send(b"lost")
        assert a.dropped == 1
        b = DgramWire(b_dir, a_dir)  # the peer port's new driver process
        a.send(b"two")
        a.send(b"three")
        assert receive_within(b) == [b"two", b"three"]
        b.send(b"back")  # a's bound socket accepts frames from the new peer socket
        assert receive_within(a) == [b"back"]
    finally:
        a.close()
        b.close()
