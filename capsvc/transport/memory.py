"""In-memory streams for unit tests.

Theory of operation
-------------------
:func:`memory_stream_pair` returns two connected :class:`trio.abc.Stream` objects (a thin
wrapper over :func:`trio.testing.memory_stream_pair`): bytes sent on one side become
receivable on the other within the same task scheduling, with no sockets involved. The
buffers are unbounded (``send_all`` never blocks), so backpressure tests need a real
socket or a ``trio.testing`` lockstep pair. Each end is half-closeable: ``send_eof``
closes its sending half (the other end reads EOF) and it can still receive, which the
driver's lingering close after an Abort relies on. ``memory:`` is deliberately not an
address (see :mod:`capsvc.transport.address`): a pair cannot be dialled.
"""

from __future__ import annotations

import trio
import trio.testing

__all__ = ["memory_stream_pair"]


def memory_stream_pair() -> tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]:
    """Two connected in-memory streams (for tests only)."""
    left, right = trio.testing.memory_stream_pair()
    return left, right
