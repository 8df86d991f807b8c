"""The import table: the peer's capabilities we hold (rpc-protocol.md §5, §7, §8).

Theory of operation:
- A received CapDescriptor becomes a hook (``receive``): ``senderHosted`` and
  ``senderPromise`` are imports (a new entry, or one more receipt of an existing one);
  ``receiverHosted`` and ``receiverAnswer`` name our own export or answer coming back. The
  latter two are *reflected*: a promise that settles to one needs an embargo even if our
  object turns out to lead back to the peer (capsvc.rpc.remote, ``RemotePromise.settle``).
- Each entry counts how many times the peer sent it (``remote_refcount``). When the last
  local reference dies, one Release carries that count and the entry goes (§7); a later
  descriptor with the same ID starts a new entry.
- A Resolve redirects an imported promise (§8), starting an embargo when the calls we sent
  through it must come back first (§9).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capsvc.errors import LimitExceeded, RemoteProtocolError, RpcError
from capsvc.rpc import wire
from capsvc.rpc.hooks import BrokenHook, Hook, null_hook
from capsvc.rpc.remote import ImportHook, ImportPromiseHook

if TYPE_CHECKING:
    from capsvc.rpc.session import RpcSession

#: Descriptor kinds that name the receiver's own capability or answer (rpc-protocol.md §5).
REFLECTED = frozenset({"receiverHosted", "receiverAnswer"})


class Import:
    """One of the peer's capabilities: our hook for it and how many times we received it."""

    __slots__ = ("hook", "remote_refcount")

    def __init__(self, hook: ImportHook | ImportPromiseHook) -> None:
        self.hook = hook
        self.remote_refcount = 1


class ImportTable:
    """The peer's capabilities we hold, by the peer's export ID."""

    __slots__ = ("entries", "session")

    def __init__(self, session: RpcSession) -> None:
        self.session = session
        self.entries: dict[int, Import] = {}

    def receive(self, desc: Any) -> tuple[Hook | None, bool]:
        """A new reference for a received CapDescriptor (a pycapnp reader), and whether it
        was reflected."""
        which = desc.which()
        if which == "none":
            return None, False
        if which == "senderHosted":
            return self.receive_entry(wire.SENDER_HOSTED, desc.senderHosted, ())
        if which == "senderPromise":
            return self.receive_entry(wire.SENDER_PROMISE, desc.senderPromise, ())
        if which == "receiverHosted":
            return self.receive_entry(wire.RECEIVER_HOSTED, desc.receiverHosted, ())
        if which == "receiverAnswer":
            promised = desc.receiverAnswer
            path = wire.transform_path(promised.transform)
            return self.receive_entry(wire.RECEIVER_ANSWER, promised.questionId, path)
        if which == "thirdPartyHosted":  # Level 3: take its vine as senderHosted (§5)
            return self._import(desc.thirdPartyHosted.vineId, promise=False), False
        raise RemoteProtocolError(f"unknown capability descriptor {which!r}")

    def receive_entry(
        self, kind: int, number: int, path: tuple[int, ...]
    ) -> tuple[Hook | None, bool]:
        """The same for a descriptor read from the raw words (wire.read_cap_table)."""
        if kind == wire.SENDER_HOSTED:
            return self._import(number, promise=False), False
        if kind == wire.SENDER_PROMISE:
            return self._import(number, promise=True), False
        if kind == wire.RECEIVER_HOSTED:
            return self.session.exports.receiver_hosted(number), True
        if kind == wire.RECEIVER_ANSWER:
            return self.session.answers.pipelined(
                number, path, "receiverAnswer names unknown question"
            ), True
        return None, False  # none

    def _import(self, import_id: int, *, promise: bool) -> Hook:
        entry = self.entries.get(import_id)
        if entry is not None:
            entry.remote_refcount += 1
            return entry.hook.add_ref()
        session = self.session
        limit = session.limits.max_imports
        if len(self.entries) >= limit:
            raise LimitExceeded(
                "max_imports", limit, f"the peer sent {len(self.entries) + 1} capabilities"
            )
        hook: ImportHook | ImportPromiseHook = (
            ImportPromiseHook(session, import_id) if promise else ImportHook(session, import_id)
        )
        self.entries[import_id] = Import(hook)
        return hook

    def drop(self, hook: ImportHook | ImportPromiseHook) -> None:
        """The last local reference to an import is gone: send Release with the full count."""
        entry = self.entries.get(hook.import_id)
        if entry is None or entry.hook is not hook:
            return
        del self.entries[hook.import_id]
        session = self.session
        if session.closed is not None:
            return
        session.outbox.send(
            wire.release_message(hook.import_id, entry.remote_refcount), urgent=False
        )

    def unresolved_promises(self) -> bool:
        """True if we hold an imported promise the peer has not resolved yet (a call of
        ours may be waiting on its Resolve: see RpcSession.flow_blocked)."""
        return any(
            isinstance(entry.hook, ImportPromiseHook) and not entry.hook.settled
            for entry in self.entries.values()
        )

    def on_resolve(self, body: Any) -> None:
        """A Resolve for one of our imported promises (rpc-protocol.md §8, 'Receiving')."""
        if body.which() == "cap":
            target, reflected = self.receive(body.cap)
            new_target: Hook = target if target is not None else null_hook()
        else:
            new_target, reflected = BrokenHook(wire.read_exception(body.exception)), False
        entry = self.entries.get(body.promiseId)
        if entry is None:
            new_target.release()  # we already released the promise: drop what it named
            return
        hook = entry.hook
        if not isinstance(hook, ImportPromiseHook):
            new_target.release()
            raise RemoteProtocolError(
                f"resolve for import {body.promiseId}, which is not a promise"
            )
        if hook.settled:
            new_target.release()
            raise RemoteProtocolError(f"second resolve for promise {body.promiseId}")
        hook.settle(new_target, reflected=reflected)

    def close(self, error: RpcError) -> None:
        """The connection is gone: every imported promise is broken for good (§10)."""
        entries, self.entries = self.entries, {}
        for entry in entries.values():
            if isinstance(entry.hook, ImportPromiseHook) and not entry.hook.settled:
                entry.hook.settle(BrokenHook(error), reflected=False)
