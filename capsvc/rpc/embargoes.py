"""Embargoes: keeping E-order when a promise's path gets shorter (rpc-protocol.md §9).

Theory of operation:
- Sending side: a promise we called through settled to something the calls we already
  sent will reach by the long way round (capsvc.rpc.remote decides). The promise now
  forwards to a local stand-in promise, which holds new calls (C++ does the same:
  rpc.c++ PromiseClient::resolve); ``start`` gives the embargo an ID and sends
  Disembargo(senderLoopback) to the promise's original address. It is queued before any
  Finish that could drop that address (§13.4): the Finish can only follow the settling
  that started the embargo. To everything that looks through the promise, the stand-in is
  an unresolved local promise, so later calls that reach it by other paths (an export
  repointed at it) wait in the same queue.
- The peer reflects it (receiverLoopback) after every call it forwarded along that path;
  the stand-in then resolves to the target, delivering the held calls in order.
- Receiving side (``reflect``): the target must lead back to a capability of the sender on
  this connection. When it is one of our local promises still unresolved, wait for it to
  settle first (C++ does: rpc.c++ handleDisembargo, "wait for the resolution"); anything
  else is a violation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capsvc.errors import RemoteProtocolError
from capsvc.rpc import wire
from capsvc.rpc.hooks import Hook, PromiseHook
from capsvc.rpc.ids import IdAllocator
from capsvc.rpc.remote import RemoteHook, RemotePromise

if TYPE_CHECKING:
    from capsvc.rpc.session import RpcSession


class Embargo:
    """One embargo: the promise that settled, the local promise standing in for its target
    meanwhile, and the target itself."""

    __slots__ = ("hook", "stand_in", "target")

    def __init__(self, hook: RemotePromise, stand_in: PromiseHook, target: Hook) -> None:
        self.hook = hook
        self.stand_in = stand_in
        self.target = target

    def lift(self) -> None:
        """Deliver the held calls, in order, to the target (§9, step 4)."""
        self.stand_in.resolve(self.target)  # ownership of the target passes to it
        self.hook.release()


class EmbargoTable:
    """Our embargoes awaiting their loopback, by embargo ID (the fifth table, §3)."""

    __slots__ = ("_ids", "entries", "session")

    def __init__(self, session: RpcSession) -> None:
        self.session = session
        self.entries: dict[int, Embargo] = {}
        self._ids = IdAllocator()

    def start(self, hook: RemotePromise, stand_in: PromiseHook, target: Hook) -> None:
        """rpc-protocol.md §9, sending side, steps 2-3: ``hook`` now forwards to
        ``stand_in``, which holds new calls until the Disembargo comes back."""
        embargo_id = self._ids.allocate()
        hook.add_ref()  # the Disembargo's target must stay valid until it comes back
        self.entries[embargo_id] = Embargo(hook, stand_in, target)
        message = wire.Message.new_message()
        body = message.init("disembargo")
        hook.write_target(body.target)
        body.context.senderLoopback = embargo_id
        self.session.outbox.send(message.to_segments())

    def on_disembargo(self, message: Any) -> None:
        body = message.disembargo
        context = body.context.which()
        if context == "senderLoopback":
            target = self.session.message_target(body.target)
            self._reflect(target, body.context.senderLoopback)
        elif context == "receiverLoopback":
            self._lift(body.context.receiverLoopback)
        else:  # accept: Level 3
            self.session.echo_unimplemented(message)

    def _lift(self, embargo_id: int) -> None:
        embargo = self.entries.pop(embargo_id, None)
        if embargo is None:
            raise RemoteProtocolError(f"disembargo for embargo {embargo_id}, which is not ours")
        self._ids.free(embargo_id)
        embargo.lift()

    def _reflect(self, target: Hook, embargo_id: int) -> None:
        """rpc-protocol.md §9, receiving side. Owns ``target``."""
        final = target.shortest()
        if final.is_promise and not isinstance(final, RemoteHook):
            # One of our own promises, not settled yet: reflect once it is.
            final.when_resolved(lambda: self._reflect_later(target, embargo_id))
            return
        try:
            if not (isinstance(final, RemoteHook) and final.session is self.session):
                raise RemoteProtocolError(
                    "disembargo target does not resolve to a capability of the sender"
                )
            reply = wire.Message.new_message()
            out = reply.init("disembargo")
            final.write_target(out.target)
            out.context.receiverLoopback = embargo_id
            self.session.outbox.send(reply.to_segments())
        finally:
            target.release()

    def _reflect_later(self, target: Hook, embargo_id: int) -> None:
        """The awaited promise settled (from whatever code settled it: never raise there)."""
        session = self.session
        if session.closed is not None:
            target.release()
            return
        try:
            self._reflect(target, embargo_id)
        except RemoteProtocolError as error:
            session.abort(str(error))

    def close(self) -> None:
        entries, self.entries = self.entries, {}
        for embargo in entries.values():
            embargo.lift()
