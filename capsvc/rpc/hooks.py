"""Capability references inside the engine ("hooks"), and the result of a call.

Theory of operation:
- A ``Hook`` is one capability as this vat sees it: a local server object, a promise that
  queues calls until it resolves, a broken capability, or (in capsvc.rpc.session) an import
  from a peer or a pipelined capability on a question sent to a peer. ``hook.call(call)``
  takes an ``OutgoingCall`` and either runs it, sends it, queues it or fails it.
- Hooks are reference counted by their *owners* (payloads, table entries, user-level client
  objects): ``add_ref()`` / ``release()``. A new hook starts with one reference, owned by its
  creator. When the count reaches zero the hook disposes of what it holds (an import sends its
  Release: rpc-protocol.md §7).
- A ``CallResult`` is a sans-I/O future for one call's results. It supports pipelining:
  ``pipeline(path)`` gives a hook for the capability that will sit at that pointer path of
  the results. Until the call is linked to a remote question those hooks queue locally; a
  session links remote calls so that pipelined calls go out at once (rpc-protocol.md §6).
- Nothing here imports trio or socket. Local server calls are started through an
  ``Executor`` supplied by the runtime.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from capsvc.errors import Failed, RpcError

if TYPE_CHECKING:
    from capsvc.rpc.payload import Payload

Path = tuple[int, ...]


class Hook:
    """One capability reference. Subclasses define ``call`` and what disposal means."""

    __slots__ = ("refs", "stream_window")

    #: True for a hook whose target may still change (rpc-protocol.md §5: senderPromise).
    is_promise = False
    #: True for a null capability (NullHook): a message it is put in gets a null pointer.
    is_null = False

    def __init__(self) -> None:
        self.refs = 1
        #: The flow control of ``-> stream`` calls made through this reference, made by
        #: the first one (capsvc.streaming.StreamWindow; None until then).
        self.stream_window: Any = None

    def add_ref(self) -> Hook:
        self.refs += 1
        return self

    def release(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            self._dispose()

    def _dispose(self) -> None:
        """Called once when the last owner releases the hook."""

    def call(self, call: OutgoingCall) -> None:
        raise NotImplementedError

    def resolved_target(self) -> Hook | None:
        """For a promise that has settled, the hook it settled to; otherwise None."""
        return None

    def when_resolved(self, callback: Callable[[], None]) -> None:
        """Run callback once this promise settles (at once for a settled hook)."""
        callback()

    def shortest(self) -> Hook:
        """Follow settled promises to the hook that now stands for this capability."""
        hook: Hook = self
        while (target := hook.resolved_target()) is not None:
            hook = target
        return hook


class BrokenHook(Hook):
    """A capability that fails every call with the same error."""

    __slots__ = ("error",)

    def __init__(self, error: RpcError) -> None:
        super().__init__()
        self.error = error

    def call(self, call: OutgoingCall) -> None:
        call.params.release()
        call.result.set_error(self.error)
        call.result.release()


class NullHook(BrokenHook):
    """A null capability: calls fail (C++: 'Called null capability.'), and written into a
    message it is a null pointer again, not a broken capability (rpc-protocol.md §5)."""

    __slots__ = ()
    is_null = True


def null_hook() -> NullHook:
    """What a null capability pointer reads as."""
    return NullHook(Failed("called a null capability"))


class Executor(Protocol):
    """Runs calls on local server objects (supplied by the runtime, e.g. a trio nursery).

    ``start`` must begin the calls on one hook in the order it receives them
    (rpc-protocol.md §13.1 and §13.3); ``LocalServerHook.pending`` is the queue for that.
    ``call.from_peer`` says the session is delivering the call straight from a received
    message, so that a method that never blocks may run at once, inside that delivery;
    ``call.received`` says a peer made the call (it may have waited behind a promise).
    """

    def start(self, hook: LocalServerHook, call: OutgoingCall) -> None: ...


class LocalServerHook(Hook):
    """A capability to an object served by this vat.

    ``pending`` holds calls not yet begun, in arrival order: whoever begins a call takes the
    one at the head, so calls begin in order however the executor schedules its work.

    ``streaming`` names the object's ``-> stream`` methods (interface ID, ordinal). As in
    C++ (capability.c++, LocalClient), while one of them runs no other call on the object
    begins (``blocked``): a stream's calls run one at a time, in order, even when the
    method is ``async``. One that fails breaks the object: every later call on it fails
    with that error (``broken``), so a caller learns of a lost write at its next call.
    """

    __slots__ = ("blocked", "broken", "executor", "pending", "server", "streaming")

    def __init__(
        self,
        server: Any,
        executor: Executor,
        streaming: frozenset[tuple[int, int]] = frozenset(),
    ) -> None:
        super().__init__()
        self.server = server
        self.executor = executor
        self.pending: deque[OutgoingCall] = deque()
        self.streaming = streaming
        self.blocked = False
        self.broken: RpcError | None = None

    def call(self, call: OutgoingCall) -> None:
        self.pending.append(call)
        self.executor.start(self, call)

    def _dispose(self) -> None:
        # A server object keeps its live hook (capsvc.Server, capsvc.typed.Server: one hook
        # per live object) and lets go of it here, so the two form no cycle once nobody
        # wants the capability. Not a weak reference: mypyc's native classes have none.
        forget = getattr(self.server, "_capsvc_forget_hook", None)
        if forget is not None:
            forget(self)


class PromiseHook(Hook):
    """A local promise: calls queue, in order, until ``resolve`` names the target."""

    __slots__ = ("_callbacks", "_queue", "_target")
    is_promise = True

    def __init__(self) -> None:
        super().__init__()
        self._target: Hook | None = None
        self._queue: list[OutgoingCall] = []
        self._callbacks: list[Callable[[], None]] = []

    def call(self, call: OutgoingCall) -> None:
        if self._target is None:
            self._queue.append(call)
        else:
            self._target.call(call)

    def resolve(self, target: Hook) -> None:
        """Settle on ``target`` (ownership passes to us) and deliver the queued calls in order."""
        if self._target is not None:
            target.release()
            return
        self._target = target
        queue, self._queue = self._queue, []
        for call in queue:
            target.call(call)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
        if self.refs <= 0:  # every owner left while we waited: nothing keeps the target
            self._target = None
            target.release()

    def resolved_target(self) -> Hook | None:
        return self._target

    def when_resolved(self, callback: Callable[[], None]) -> None:
        if self._target is None:
            self._callbacks.append(callback)
        else:
            callback()

    def _dispose(self) -> None:
        # Queued calls are still wanted by their callers: they stay until resolve().
        if self._target is not None:
            self._target.release()


class OutgoingCall:
    """A call on its way to a target: method, params (owned) and where the results go.

    The call owns one reference to ``result``; whoever finally handles the call releases it
    (a remote question or a running local call then keeps only an uncounted link, so that
    the caller dropping its own references still cancels the call).
    """

    __slots__ = (
        "from_peer",
        "interface_id",
        "method_id",
        "observed",
        "params",
        "received",
        "result",
    )

    def __init__(
        self, interface_id: int, method_id: int, params: Payload, result: CallResult
    ) -> None:
        self.interface_id = interface_id
        self.method_id = method_id
        self.params = params
        self.result = result
        #: True only while a session hands the call, just received, to its target: a call
        #: queued on the way (behind a promise, an embargo) is delivered later without it.
        self.from_peer = False
        #: True for a call a peer made (set once by the session, never cleared): when a
        #: promise it waited behind resolves while the runtime settles another call's
        #: results, it may run inline there too (capsvc.runtime.TrioExecutor).
        self.received = False
        #: A received call's observer (CallObserver.received), if one watches: the runtime
        #: enters it around the method, so that e.g. a tracing span is current there.
        self.observed: ObservedCall | None = None


class RemoteQuestion(Protocol):
    """What a CallResult needs from a question a session sent for it."""

    def pipeline(self, path: Path) -> Hook: ...

    def drop_interest(self) -> None: ...


class Backpressure(Protocol):
    """The driver of the connection a call went out on, as the caller's runtime sees it:
    whether its output is over its bound, and a way to wait until it is not (DESIGN.md,
    "Buffered framing"); and whether the caller may read the connection for its result
    itself (capsvc.connection, "Callers read"). The engine only passes it along; it never
    waits itself."""

    #: How many callers wait (parked) for results of calls that went out on it.
    waiting: int

    @property
    def over_limit(self) -> bool: ...

    async def wait_writable(self) -> None: ...

    def claim_reading(self) -> bool:
        """Whether a caller about to wait for a result is to read the connection itself."""
        ...

    async def read_for(self, result: CallResult, on_cancel: Callable[[], None] | None) -> None:
        """Read and deliver the peer's messages in the calling task until ``result``
        settles, or until the connection's reader must take over again."""
        ...


class ObservedCall(Protocol):
    """What an observer keeps of one call it was told of. Called once the call's
    ``CallResult`` settles; for a call the peer made, ``enter`` and ``exit`` bracket the
    method where it runs (its task), so the observer may set context there (a span)."""

    def __call__(self, result: CallResult) -> None: ...

    def enter(self) -> object: ...

    def exit(self, token: object) -> None: ...


class CallObserver(Protocol):
    """Watches one connection's calls, for access logs and tracing (set by the driver as
    ``RpcSession.observer``). Each method is told about one call as it starts and returns
    what the call's ``CallResult`` calls once settled: with the results, an error, or
    Canceled (a Finish, or the connection's end). Observing costs nothing when unset."""

    def received(self, interface_id: int, method_id: int, params: Payload) -> ObservedCall:
        """The peer called us (``params``: the call's, not owned; read them only now)."""
        ...

    def sent(self, interface_id: int, method_id: int) -> Callable[[CallResult], None]:
        """We called the peer (the Call is in the outbox)."""
        ...


class Canceled(RpcError):
    """The call was canceled before it ended: its caller finished the question, or every
    owner of its result let go (never seen by users: nobody is left to see it)."""


class CallResult:
    """The future results of one call, with pipelining and cancellation.

    Owners hold references like hooks do. When the last owner goes before the results
    arrive, the call is cancelled (a remote question sends its Finish: rpc-protocol.md §4).
    """

    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_canceller",
        "_error",
        "_payload",
        "_pending_pipelines",
        "_question",
        "_when_unwanted",
        "backpressure",
        "done",
        "local_hook",
        "refs",
    )

    def __init__(self) -> None:
        self.refs = 1
        self.done = False
        self._payload: Payload | None = None
        self._error: RpcError | None = None
        self._callbacks: list[Callable[[CallResult], None]] = []
        self._pending_pipelines: dict[Path, PromiseHook] = {}
        self._question: RemoteQuestion | None = None
        self._canceller: Callable[[], None] | None = None
        self._when_unwanted: Callable[[], None] | None = None
        #: The driver of the connection the call went out on, if it went to a peer.
        self.backpressure: Backpressure | None = None
        #: The local object a call of ours waits to begin on, until it settles: a caller
        #: that awaits the result may begin it there and then (capsvc.runtime.wait_result).
        self.local_hook: LocalServerHook | None = None

    # -- ownership --------------------------------------------------------------------
    def add_ref(self) -> CallResult:
        self.refs += 1
        return self

    def release(self) -> None:
        self.refs -= 1
        if self.refs > 0:
            return
        if self.done:
            if self._payload is not None:
                self._payload.release()
                self._payload = None
            when_unwanted, self._when_unwanted = self._when_unwanted, None
            if when_unwanted is not None:
                when_unwanted()  # e.g. the question may now send its Finish
        else:
            self.cancel()

    # -- producer side ----------------------------------------------------------------
    def set_result(self, payload: Payload) -> None:
        """The call returned; ownership of ``payload`` passes to this result."""
        if self.done:
            payload.release()
            return
        self._settle(payload, None)
        if self.refs <= 0:
            payload.release()
            self._payload = None

    def keep_caps_only(self) -> None:
        """The results were sent to the peer: keep only what pipelining on them needs
        (capsvc.rpc.payload.keep_caps_only)."""
        if self._payload is not None:
            from capsvc.rpc.payload import keep_caps_only

            self._payload = keep_caps_only(self._payload)

    def set_error(self, error: RpcError) -> None:
        if not self.done:
            self._settle(None, error)

    def link_question(self, question: RemoteQuestion) -> None:
        """The call went to a peer: pipelined calls may go out at once from now on."""
        self._question = question
        self._when_unwanted = question.drop_interest
        pending, self._pending_pipelines = self._pending_pipelines, {}
        for path, promise in pending.items():
            promise.resolve(question.pipeline(path))
            self.release()

    def set_canceller(self, canceller: Callable[[], None] | None) -> None:
        """How to stop the work if every owner loses interest before it finishes."""
        self._canceller = canceller

    @property
    def pipelined(self) -> bool:
        """True while calls or capabilities are pipelined on these results (rpc.capnp,
        Finish: the callee keeps running a call whose results something pipelined on)."""
        return bool(self._pending_pipelines)

    def cancel(self) -> None:
        """Nobody wants the results: stop the work and settle as Canceled.

        A remote question sends its Finish; a running local call is cancelled; a call that
        has not started yet (queued on its object, behind a promise or an embargo) is
        settled now, so that it never starts (rpc-protocol.md §4, callee step 4).
        """
        if self.done:
            return
        question, self._question = self._question, None
        self._when_unwanted = None
        if question is not None:
            question.drop_interest()
        canceller, self._canceller = self._canceller, None
        if canceller is not None:
            canceller()
        self.set_error(Canceled("canceled"))

    # -- consumer side ----------------------------------------------------------------
    def add_done_callback(self, callback: Callable[[CallResult], None]) -> None:
        if self.done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def remove_done_callback(self, callback: Callable[[CallResult], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    @property
    def payload(self) -> Payload:
        """The results; raises the call's RpcError if it failed."""
        if self._error is not None:
            raise self._error
        if self._payload is None:
            raise RuntimeError("the call has not returned yet")
        return self._payload

    @property
    def error(self) -> RpcError | None:
        return self._error

    def pipeline(self, path: Path) -> Hook:
        """A hook for the capability at ``path`` in the results (a new reference)."""
        if self.done:
            if self._error is not None:
                return BrokenHook(self._error)
            assert self._payload is not None
            return self._payload.cap_at(path) or null_hook()
        if self._question is not None:
            return self._question.pipeline(path)
        promise = self._pending_pipelines.get(path)
        if promise is not None:
            # Reuse it even if its owners all left (an unresolved PromiseHook holds nothing
            # yet, so coming back from zero is safe): one queue per path keeps call order.
            return promise.add_ref()
        promise = PromiseHook()
        self.add_ref()  # a pending pipeline keeps the call wanted
        self._pending_pipelines[path] = promise
        return promise

    def _settle(self, payload: Payload | None, error: RpcError | None) -> None:
        self.done = True
        self.local_hook = None
        self._payload = payload
        self._error = error
        self._question = None
        self._canceller = None
        pending, self._pending_pipelines = self._pending_pipelines, {}
        for path, promise in pending.items():
            if error is not None:
                promise.resolve(BrokenHook(error))
            else:
                assert payload is not None
                promise.resolve(payload.cap_at(path) or null_hook())
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)
        for _ in pending:
            self.release()
