"""``-> stream`` methods on the calling side: flow control, as C++'s RPC system does it.

Theory of operation (C++: rpc.c++, ``WindowFlowController``; capability.c++, ``LocalClient``):
- A streaming method's call goes out at once, in order with every other call on the
  capability, like any call: on the wire it is an ordinary Call whose results are
  stream.capnp's empty ``StreamResult``. What differs is what the caller gets back: not a
  promise of the results but a ``StreamCall``, whose ``await`` returns as soon as the
  caller may send the next one, not when this one returns. That is what lets a stream
  keep the connection busy instead of paying a round trip per write.
- "May send the next one" is a window: each capability (its hook) keeps the bytes of its
  stream calls not yet returned (``StreamWindow.in_flight``). While they are within the
  window (plus the largest message sent, so that one large message never stalls the
  stream), an ``await`` returns at once; over it, it waits for Returns. The window is the
  connection's (``Limits.stream_window_bytes``; by default the socket's send buffer, as
  C++'s TwoPartyVatNetwork uses, or 64 KiB where there is none).
- A stream call that fails breaks the window: every ``await`` waiting, and every later
  one on that capability, raises that call's error. The server side does its part
  (capsvc.rpc.hooks.LocalServerHook): it runs one stream call at a time per object and
  fails every call after a failed one, so a final ordinary call (``end()``, ``total()``)
  reports a lost write too.
- A call on an object in this process has no connection to fill: its ``await`` waits for
  the call to finish, as C++'s local requests do.
- A call that could not be sent at all (too large for ``Limits.max_message_words``, a
  broken capability) fails its own ``await`` only, as C++'s ``send`` throwing does.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from capsvc.codec.building import StructBuilder
from capsvc.codegen.model import STREAM_RESULT_ID
from capsvc.errors import RpcError
from capsvc.rpc.hooks import CallResult, Hook, LocalServerHook, OutgoingCall
from capsvc.rpc.payload import new_codec_call
from capsvc.runtime import wait_result

if TYPE_CHECKING:
    from collections.abc import Generator

__all__ = [
    "DEFAULT_WINDOW",
    "STREAM_RESULT_ID",
    "StreamCall",
    "StreamRequest",
    "StreamWindow",
    "send_stream_call",
]

PB = TypeVar("PB", bound=StructBuilder)

#: The window where the connection has no socket to ask (C++: DEFAULT_WINDOW_SIZE).
DEFAULT_WINDOW = 65536
#: A stream's writes that find room at once take a full checkpoint one time in this many.
YIELD_EVERY = 32
#: Bytes of framing a message adds to its segments (the segment table, one segment).
_FRAMING = 8


class StreamWindow:
    """One capability's stream calls in flight (see the module docstring)."""

    __slots__ = ("error", "in_flight", "largest", "ready_streak", "sock", "waiters", "window")

    def __init__(self, window: int, sock: Any = None) -> None:
        #: The window; with ``sock``, its send buffer's size, asked again only when the
        #: last answer would make a write wait (the kernel grows it with the connection's
        #: congestion window): no system call per write.
        self.window = window
        self.sock = sock
        if sock is not None:
            self._ask_socket()
        self.in_flight = 0
        self.ready_streak = 0  # writes in a row that found room at once
        self.largest = 0
        self.error: RpcError | None = None
        self.waiters: list[trio.Event] = []

    @property
    def ready(self) -> bool:
        """Whether the caller may send another stream call now."""
        if self.in_flight <= self.largest or self.in_flight < self.window + self.largest:
            return True
        if self.sock is None:
            return False
        self._ask_socket()  # it may have grown since
        return self.in_flight < self.window + self.largest

    def _ask_socket(self) -> None:
        try:
            self.window = int(self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
        except OSError:
            self.sock = None  # (keep the last answer)

    def sent(self, size: int, result: CallResult) -> None:
        """A stream call of ``size`` bytes went out; ``result`` settles when it returns.
        Holds a reference to ``result`` until then: dropping the ``StreamCall`` must not
        cancel the call (its Finish would cancel the write on the server)."""
        self.largest = max(self.largest, size)
        self.in_flight += size
        result.add_ref()
        result.add_done_callback(_Returned(self, size))

    def returned(self, size: int, error: RpcError | None) -> None:
        self.in_flight -= size
        if error is not None and self.error is None:
            self.error = error
        if self.error is not None or self.ready:
            waiters, self.waiters = self.waiters, []
            for waiter in waiters:
                waiter.set()

    async def wait_ready(self) -> None:
        waited = False
        while self.error is None and not self.ready:
            event = trio.Event()
            self.waiters.append(event)
            try:
                await event.wait()
            finally:
                if event in self.waiters:
                    self.waiters.remove(event)
            waited = True
        if self.error is not None:
            raise self.error
        # Room at once: a full checkpoint (a scheduler pass) per write would cost the
        # stream more than the write itself, so it is one per YIELD_EVERY writes, which
        # still lets other tasks run and the flusher write the batch; in between,
        # cancellation is still seen.
        self.ready_streak = 0 if waited else self.ready_streak + 1
        if self.ready_streak % YIELD_EVERY == 0 and not waited:
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()


class _Returned:
    """The done callback of one stream call (a class: see runtime._Waiter on closures)."""

    __slots__ = ("size", "window")

    def __init__(self, window: StreamWindow, size: int) -> None:
        self.window = window
        self.size = size

    def __call__(self, result: CallResult) -> None:
        self.window.returned(self.size, result.error)
        result.release()


def _release(result: CallResult) -> None:
    result.release()


class StreamCall:
    """What calling a ``-> stream`` method gives: ``await`` it before the next write.

    The call has already gone out. ``await`` returns once the capability's window has
    room for another (at once, mostly), and raises the error of any failed stream call
    on the capability; ``returned`` waits for this call's own Return instead.
    """

    __slots__ = ("_result", "_window")

    def __init__(self, result: CallResult, window: StreamWindow | None) -> None:
        self._result = result  # our reference (the caller's), released with us
        self._window = window  # None: a local object, or a call that was never sent

    def __del__(self) -> None:
        # Dropping it does not cancel the call: another reference is held until the call
        # returns (StreamWindow.sent; StreamRequest.send for a local object's).
        self._result.release()

    def __await__(self) -> Generator[Any, None, None]:
        return self._ready().__await__()

    async def _ready(self) -> None:
        window = self._window
        if window is None:
            await self.returned()
            return
        backpressure = self._result.backpressure
        if backpressure is not None and backpressure.over_limit:
            await backpressure.wait_writable()
        await window.wait_ready()

    async def returned(self) -> None:
        """Wait for this call's own Return; raises its error if it failed."""
        await wait_result(self._result)
        error = self._result.error
        if error is not None:
            raise error


class StreamRequest(Generic[PB]):
    """A ``-> stream`` call being prepared: fill ``params``, then ``send()``, which gives
    a ``StreamCall`` (what calling the generated method gives)."""

    __slots__ = ("_hook", "_interface", "_method", "_payload", "params")

    def __init__(self, client: Any, interface_id: int, method_id: int, params: type[PB]) -> None:
        self._hook: Hook = client._hook
        self._interface = interface_id
        self._method = method_id
        self._payload, self.params = new_codec_call(params)

    def send(self) -> StreamCall:
        size = len(self._payload.builder.buf) + _FRAMING
        return send_stream_call(self._hook, self._interface, self._method, self._payload, size)


def send_stream_call(
    hook: Hook, interface_id: int, method_id: int, payload: Any, size: int
) -> StreamCall:
    """Send one stream call of ``size`` bytes (its whole Call message, framed) on
    ``hook``: what a generated ``StreamRequest`` and a ``load_schema`` client's request
    of a ``-> stream`` method both do."""
    result = CallResult()
    hook.call(OutgoingCall(interface_id, method_id, payload, result.add_ref()))
    if result.done:  # never sent: its error is its own (or it ran already, locally)
        return StreamCall(result, None)
    if isinstance(hook.shortest(), LocalServerHook):
        result.add_ref()
        result.add_done_callback(_release)
        return StreamCall(result, None)
    window = hook.stream_window
    if window is None:
        window = hook.stream_window = _window_of(result)
    window.sent(size, result)
    return StreamCall(result, window)


def _window_of(result: CallResult) -> StreamWindow:
    """A window for the connection a stream call went out on (module docstring)."""
    connection = result.backpressure
    if connection is None:  # queued behind a local promise: no connection yet
        return StreamWindow(DEFAULT_WINDOW)
    configured = getattr(getattr(connection, "limits", None), "stream_window_bytes", None)
    if isinstance(configured, int):
        return StreamWindow(configured)
    sock = getattr(getattr(connection, "stream", None), "socket", None)
    return StreamWindow(DEFAULT_WINDOW, sock if hasattr(sock, "getsockopt") else None)
