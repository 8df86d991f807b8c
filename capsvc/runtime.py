"""The trio side of the engine: waiting for call results, and running local server calls.

Theory of operation: the engine (capsvc.rpc) is sans-I/O; it settles ``CallResult`` objects
through callbacks and starts local calls through an ``Executor``. This module is the bridge:
``wait_result`` parks the current trio task until a result settles, and ``TrioExecutor`` runs
each server method as its own trio task, with a cancel scope that the engine can trigger when
the caller finishes the question early (rpc-protocol.md §4, callee step 4).
"""

from __future__ import annotations

import functools
import inspect
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from capsvc import names
from capsvc.errors import Failed, RpcError, Unimplemented
from capsvc.rpc.hooks import Backpressure, CallResult, LocalServerHook, OutgoingCall
from capsvc.rpc.payload import Payload, new_codec_return

log = logging.getLogger("capsvc")


async def wait_result(result: CallResult, on_cancel: Callable[[], None] | None = None) -> None:
    """Wait until ``result`` settles. If the wait is cancelled, ``on_cancel`` runs first.

    If the call went out on a connection whose output buffer is over its bound, first wait
    until the writer has drained it (backpressure: DESIGN.md, "Buffered framing").
    """
    backpressure = result.backpressure
    if backpressure is not None and backpressure.over_limit:
        await backpressure.wait_writable()
    if result.local_hook is not None:
        _begin_awaited(result)
    if result.done:
        await trio.lowlevel.checkpoint()
        return
    if backpressure is not None and backpressure.claim_reading():
        # One call at a time: this task reads its Return itself (capsvc.connection,
        # "Callers read"), a scheduler pass sooner than the reader task would wake it.
        await backpressure.read_for(result, on_cancel)
        if result.done:
            return
    waiter = _Waiter(trio.lowlevel.current_task(), result, on_cancel, backpressure)
    result.add_done_callback(waiter)
    if backpressure is not None:
        backpressure.waiting += 1  # (a caller waiting: none may read in the reader's place)
    await trio.lowlevel.wait_task_rescheduled(waiter.abort)


async def await_results(
    result: CallResult,
    reader: Any,
    on_cancel: Callable[[], None],
    keeper: Callable[[CallResult], object],
) -> Any:
    """What awaiting a generated results promise does (capsvc.codec.pipeline), compiled:
    wait for ``result``, then its content read by the generated ``reader`` class. A reader
    keeps the result alive (``keeper`` of a new reference) only when the results hold
    capabilities (its cap fields resolve to the payload's hooks); without any it needs
    only its words."""
    await wait_result(result, on_cancel)
    payload = result.payload  # raises the call's error, if it failed
    keep = keeper(result.add_ref()) if payload.caps else None
    return payload.read_as(reader, keep=keep)


class _Waiter:
    """The task ``wait_result`` parks: called when the result settles, it wakes the task;
    ``abort`` gives up the wait.

    A class, not two closures: compiled by mypyc, a closure keeps the whole environment
    of its function, and an ``abort`` naming a ``wake`` would put ``wake`` in that environment
    too: a reference cycle that keeps ``on_cancel`` (a promise's bound method) alive until
    the garbage collector runs, delaying the promise's release (and so its Finish).
    """

    __slots__ = ("connection", "on_cancel", "result", "task")

    def __init__(
        self,
        task: trio.lowlevel.Task,
        result: CallResult,
        on_cancel: Callable[[], None] | None,
        connection: Backpressure | None,
    ) -> None:
        self.task = task
        self.result = result
        self.on_cancel = on_cancel
        #: The connection the call went out on, whose count of waiting callers this is in.
        self.connection = connection

    def __call__(self, _: CallResult) -> None:
        if self.connection is not None:
            self.connection.waiting -= 1
        trio.lowlevel.reschedule(self.task)

    def abort(self, _: Any) -> trio.lowlevel.Abort:
        if self.connection is not None:
            self.connection.waiting -= 1
        self.result.remove_done_callback(self)
        if self.on_cancel is not None:
            self.on_cancel()
        return trio.lowlevel.Abort.SUCCEEDED


class TrioExecutor:
    """Runs local server calls as trio system tasks (one per call), in arrival order.

    trio runs the tasks of one scheduler pass in an arbitrary order, so a task does not run
    "its" call: it takes the call at the head of the hook's queue. Whatever order the tasks
    run in, method bodies begin in the order the calls arrived (rpc-protocol.md §13.1,
    §13.3), in the same scheduler pass, and then run concurrently, as in C++.

    A plain (non-async) method that a connection's reader delivers runs at once instead
    (capsvc.server), when no earlier call to the same object is waiting to begin: its
    Return then leaves at the end of the pass that read the Call. So does a plain method a
    peer called on a promise (a pipelined call) when the promise resolves while the runtime
    settles another call's results (``_WorkerPool.settling``): the method that resolved it
    has returned, so no caller of ours is on the stack, and the pipelined call's Return
    leaves with the Return that resolved it instead of a scheduler pass later.
    """

    def start(self, hook: LocalServerHook, call: OutgoingCall) -> None:
        # The running call keeps an uncounted link to its result (see OutgoingCall), so a
        # caller that drops every reference cancels it.
        call.result.release()
        # Only a call a peer made may run inline, never one a local caller made: that
        # caller must not find the callee running inside its own call.
        alone = len(hook.pending) == 1 and not hook.blocked
        if alone and call.from_peer and _runs_inline(hook.server, call):
            hook.pending.popleft()
            _run_inline(hook, call, None)
            return
        pool = _pool()
        if (
            alone
            and call.received
            and 0 < pool.settling < MAX_SETTLING
            and _runs_inline(hook.server, call)
        ):
            hook.pending.popleft()
            _run_inline(hook, call, pool)
            return
        if not call.received:
            call.result.local_hook = hook  # the caller may begin it when it awaits
        pool.run(hook)


def _begin_awaited(result: CallResult) -> None:
    """A local caller awaits the result of its call on a local object: a plain method
    whose call is next on that object begins now, in the caller's task, instead of a pass
    later in a worker task (and the caller then waits a pass less). The caller has given
    up control by awaiting, so nothing of it runs inside the callee, and calls on the
    object still begin in order (rpc-protocol.md §13.1). The worker task handed the call
    finds nothing left to begin."""
    hook = result.local_hook
    result.local_hook = None
    if hook is None or not hook.pending or hook.blocked:
        return
    call = hook.pending[0]
    if call.result is result and _runs_inline(hook.server, call):
        hook.pending.popleft()
        _run_inline(hook, call, None)


#: How deep released pipelined calls may run inline inside one another's settling (a
#: chain of calls each pipelined on the one before); deeper ones go to worker tasks, so
#: a peer's long chain costs passes, not stack.
MAX_SETTLING = 8


def _runs_inline(server: Any, call: OutgoingCall) -> bool:
    # A generated server's answer cached by its class, read here without a Python frame.
    if getattr(server, "_capsvc_typed", False):
        inline = server._capsvc_inline.get((call.interface_id, call.method_id))
        if inline is not None:
            return bool(inline)
    return bool(server._runs_inline(call.interface_id, call.method_id))


class HandoffCount(Protocol):
    #: How many calls the trio loop has handed to worker tasks so far: a connection's
    #: reader that handed some off yields, so that they run and its output bound sees
    #: what they produce.
    @property
    def handed_off(self) -> int: ...


def handoff_count() -> HandoffCount:
    """The running trio loop's count of calls handed to worker tasks (read it often;
    fetch it once: it lives in a RunVar)."""
    return _pool()


def _run_inline(hook: LocalServerHook, call: OutgoingCall, pool: _WorkerPool | None) -> None:
    """Run a plain method now; ``pool``: settle its results as the runtime settling them
    (pipelined calls they release may run inline too), if this is itself such a call."""
    result = call.result
    if result.done or result.refs <= 0:
        call.params.release()
        return
    if hook.broken is not None:
        _fail_broken(hook, call)
        return
    server = hook.server
    observed = call.observed
    entered = observed.enter() if observed is not None else None
    outcome: Payload | Awaitable[Payload]
    try:
        if getattr(server, "_capsvc_typed", False):
            outcome = typed_dispatch(server, call.interface_id, call.method_id, call.params)
        else:
            outcome = server._dispatch_inline(call.interface_id, call.method_id, call.params)
    except Exception as error:
        _fail(result, server, call, error)
        call.params.release()
        if _is_stream(hook, call):
            hook.broken = result.error  # (LocalServerHook: a failed stream call breaks it)
        return
    finally:
        if observed is not None:
            observed.exit(entered)
    if isinstance(outcome, Payload):
        if pool is None:
            result.set_result(outcome)
        else:
            _settle_as_runtime(pool, result, outcome)
        call.params.release()
    else:  # an awaitable after all: finish it in a task of its own
        stream = _blocks(hook, call)
        trio.lowlevel.spawn_system_task(
            _run_call, server, call, outcome, pool or _pool(), stream, name="capsvc call"
        )


def _is_stream(hook: LocalServerHook, call: OutgoingCall) -> bool:
    """Whether ``call`` is one of the object's ``-> stream`` calls (most objects have none:
    the empty set is the one test a call pays)."""
    return bool(hook.streaming) and (call.interface_id, call.method_id) in hook.streaming


def _blocks(hook: LocalServerHook, call: OutgoingCall) -> LocalServerHook | None:
    """``hook``, now blocked, if ``call`` is one of its ``-> stream`` calls (no other call
    on the object begins until it ends: LocalServerHook); otherwise None."""
    if _is_stream(hook, call):
        hook.blocked = True
        return hook
    return None


def _fail_broken(hook: LocalServerHook, call: OutgoingCall) -> None:
    """A call on an object a failed ``-> stream`` call broke fails with that call's error
    (C++ LocalClient: brokenException)."""
    assert hook.broken is not None
    call.result.set_error(hook.broken)
    call.params.release()


def _unblock(hook: LocalServerHook, failed: RpcError | None, pool: _WorkerPool) -> None:
    """A ``-> stream`` call on ``hook`` ended: a failure breaks the object; the calls that
    waited behind it begin (each worker takes the head of the queue, and a worker that
    finds the object blocked again leaves its call there for the next unblocking)."""
    hook.blocked = False
    if failed is not None and hook.broken is None:
        hook.broken = failed
    for _ in range(len(hook.pending)):
        pool.run(hook)


def typed_dispatch(
    server: Any, interface_id: int, method_id: int, params: Payload
) -> Payload | Awaitable[Payload]:
    """A call of a generated server (capsvc.typed.Server), compiled: the method found once
    per class (``_capsvc_found``), the generated params reader, a results builder in a
    fresh Return, the method called; the results, or what to await first if the method
    gave an awaitable. A method the class does not implement raises Unimplemented."""
    key = (interface_id, method_id)
    found = server._capsvc_found
    entry = found.get(key, _UNSEEN)
    if entry is _UNSEEN:
        entry = found[key] = server._find(key)
    if entry is None:
        raise unimplemented(server, interface_id, method_id)
    name, params_type, results_type = entry
    reader = params.read_as(params_type.Reader)
    payload, results = new_codec_return(results_type.Builder)
    returned = getattr(server, name)(reader, results)
    # A method fills its results and returns None (checked first: isawaitable is an
    # isinstance against an ABC).
    if returned is not None and inspect.isawaitable(returned):
        return _await_then(returned, payload)
    return payload


#: A key not looked up yet (``None`` in ``_capsvc_found`` means "not implemented").
_UNSEEN: Any = object()


async def _await_then(awaitable: Awaitable[object], payload: Payload) -> Payload:
    await awaitable
    return payload


def _settle_as_runtime(pool: _WorkerPool, result: CallResult, payload: Payload) -> None:
    """Settle ``result``; pipelined calls a peer queued on it may run inline meanwhile
    (TrioExecutor.start): the method has returned, so only the runtime is on the stack."""
    pool.settling += 1
    try:
        result.set_result(payload)
    finally:
        pool.settling -= 1


def _fail(result: CallResult, server: Any, call: OutgoingCall, error: Exception) -> None:
    """A server method raised. An RpcError is the method's answer; anything else is a bug
    of the method: its traceback is logged once (WARNING) and the caller gets ``failed``
    naming the method and the exception type, with the traceback text only if the server
    class asks for it (``capsvc_send_tracebacks``: it can leak internals)."""
    if isinstance(error, RpcError):
        result.set_error(error)
        return
    label = method_label(server, call.interface_id, call.method_id)
    log.warning("%s raised %s", label, type(error).__name__, exc_info=error)
    trace = ""
    if getattr(server, "capsvc_send_tracebacks", False):
        trace = "".join(traceback.format_exception(error))
    # A pycapnp (kj) exception's text ends in a line of C++ stack addresses: they mean
    # nothing to the caller and say something about this process, so they stay here.
    reason = str(error).split("\nstack:", 1)[0]
    result.set_error(Failed(f"{label} raised {type(error).__name__}: {reason}", trace=trace))


def method_label(server: Any, interface_id: int, method_id: int) -> str:
    """``Interface.method`` by its schema names, for errors and logs: the server's own
    interfaces first, then any schema this process loaded or generated (capsvc.names)."""
    label = getattr(server, "_capsvc_method_label", None)
    found = label(interface_id, method_id) if label is not None else None
    if isinstance(found, str):
        return found
    return names.method_label(interface_id, method_id)


class _WorkerPool:
    """Long-lived system tasks that run calls, so a call costs a reschedule, not a spawn.

    A worker that finishes a call parks itself as idle; ``run`` hands the next hook to an
    idle worker or spawns a new one. At most ``MAX_IDLE`` workers stay parked.
    """

    MAX_IDLE = 64

    def __init__(self) -> None:
        self.handed_off = 0
        #: How many results the runtime is settling right now, one inside another
        #: (TrioExecutor.start: released pipelined calls of peers may run inline).
        self.settling = 0
        self.idle: list[trio.lowlevel.Task] = []
        self.assigned: dict[trio.lowlevel.Task, LocalServerHook] = {}

    def run(self, hook: LocalServerHook) -> None:
        self.handed_off += 1
        if self.idle:
            worker = self.idle.pop()
            self.assigned[worker] = hook
            trio.lowlevel.reschedule(worker)
        else:
            trio.lowlevel.spawn_system_task(self._work, hook, name="capsvc call worker")

    async def _work(self, hook: LocalServerHook | None) -> None:
        me = trio.lowlevel.current_task()
        while hook is not None:
            await _run_next_call(hook, self)
            # An idle worker must not keep the last object it served alive. Rebound, not
            # deleted: mypyc does not support `del` of a local in an async function.
            hook = None
            if len(self.idle) >= self.MAX_IDLE:
                return
            self.idle.append(me)
            # A partial, not a closure: compiled by mypyc, a closure defined here would keep
            # this coroutine's whole environment, and the environment the closure: a cycle.
            await trio.lowlevel.wait_task_rescheduled(functools.partial(self._forget, me))
            hook = self.assigned.pop(me)

    def _forget(self, worker: trio.lowlevel.Task, _: Any) -> trio.lowlevel.Abort:
        # Only the end of the trio run cancels an idle worker: let it go.
        if worker in self.idle:
            self.idle.remove(worker)
        return trio.lowlevel.Abort.SUCCEEDED


_POOL: trio.lowlevel.RunVar[_WorkerPool] = trio.lowlevel.RunVar("capsvc_worker_pool")


def _pool() -> _WorkerPool:
    try:
        return _POOL.get()
    except LookupError:
        pool = _WorkerPool()
        _POOL.set(pool)
        return pool


async def _run_next_call(hook: LocalServerHook, pool: _WorkerPool) -> None:
    if not hook.pending or hook.blocked:
        # Begun by its caller when it awaited the result (_begin_awaited); or a stream
        # call runs, and _unblock hands the queue to workers again when it ends.
        return
    call = hook.pending.popleft()
    if call.result.done or call.result.refs <= 0:
        call.params.release()
        return  # cancelled before it started
    if hook.broken is not None:
        _fail_broken(hook, call)
        return
    server = hook.server
    stream = _blocks(hook, call)
    work = server._dispatch(call.interface_id, call.method_id, call.params)
    await _run_call(server, call, work, pool, stream)


async def _run_call(
    server: Any,
    call: OutgoingCall,
    work: Awaitable[Payload],
    pool: _WorkerPool,
    stream: LocalServerHook | None = None,
) -> None:
    """Await ``work`` (the method's results) with a cancel scope the caller's Finish can
    trigger (rpc-protocol.md §4, callee step 4), and settle the call's result. ``stream``:
    the object this ``-> stream`` call blocks, unblocked when it ends (broken if it
    failed; not if it was cancelled, as in C++, where a cancelled call throws nothing)."""
    result = call.result
    observed = call.observed
    entered = observed.enter() if observed is not None else None
    failed: RpcError | None = None
    try:
        with trio.CancelScope() as scope:
            result.set_canceller(scope.cancel)
            try:
                payload = await work
            except Exception as error:
                _fail(result, server, call, error)
                failed = result.error
                return
            _settle_as_runtime(pool, result, payload)
        if scope.cancelled_caught:
            result.set_error(Failed("call was canceled"))
    finally:
        if observed is not None:
            observed.exit(entered)
        call.params.release()
        if stream is not None:
            _unblock(stream, failed, pool)


def unimplemented(server: Any, interface_id: int, method_id: int) -> Unimplemented:
    """The error for a call ``server`` has no method for, naming it by schema names (and
    what the server does serve, when the call is for an interface it does not have)."""
    label = method_label(server, interface_id, method_id)
    what = f"{type(server).__name__} does not implement {label}"
    own = getattr(server, "_capsvc_method_label", None)
    served = served_interface_name(server)
    if own is not None and own(interface_id, method_id) is None and served:
        what += f"; it serves {served}"
    return Unimplemented(what)


def served_interface_name(server: Any) -> str:
    """The schema name of the interface ``server``'s class implements ("" if none)."""
    info = getattr(server, "_capsvc_interface", None)  # dynamic: capsvc.Server
    if info is not None:
        return str(info.name)
    name = getattr(server, "_INTERFACE_NAME", "")  # generated: Iface.Server
    return name if isinstance(name, str) else ""
