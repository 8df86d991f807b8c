"""The export table: our capabilities as the peer holds them (rpc-protocol.md §5, §7, §8).

Theory of operation:
- Writing a CapDescriptor for a hook (``describe``) exports it (``senderHosted``, or
  ``senderPromise`` for an unresolved promise), counting one reference per descriptor, or
  names the peer's own capability back to it. The same object always gets the same export
  ID (an identity map), until the peer releases every reference.
- An exported promise that settles sends exactly one Resolve (§8). From then on the entry
  stands for exactly what the Resolve named: calls the peer addresses to the promise's ID
  go there, even if that is one of the peer's promises that later settles elsewhere (the
  Tribble rule; capsvc.rpc.remote.PinnedHook). C++ replaces its export entry the same way.
- ``Release`` subtracts; at zero the entry and its identity key go. Releasing an unknown
  export or more references than it has is a violation (§7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capsvc.errors import Failed, LimitExceeded, RemoteProtocolError
from capsvc.rpc import wire
from capsvc.rpc.hooks import BrokenHook, Hook, NullHook, PromiseHook
from capsvc.rpc.ids import IdAllocator
from capsvc.rpc.remote import RemoteHook

if TYPE_CHECKING:
    from capsvc.rpc.session import RpcSession


class Export:
    """One of our capabilities as the peer knows it, with the peer's reference count."""

    __slots__ = ("hook", "key", "refcount")

    def __init__(self, hook: Hook) -> None:
        self.hook = hook
        #: This entry's key in the identity map; None once a Resolve re-pointed the entry
        #: (it then stands for the resolved promise, not for what it resolved to).
        self.key: Hook | None = hook
        self.refcount = 0


class ExportTable:
    """Our exports by ID; see the module docstring."""

    __slots__ = ("_by_hook", "_ids", "entries", "session")

    def __init__(self, session: RpcSession) -> None:
        self.session = session
        self.entries: dict[int, Export] = {}
        self._ids = IdAllocator()
        self._by_hook: dict[Hook, int] = {}

    # -------------------------------------------------------------- describing
    def describe(self, desc: Any, hook: Hook | None, exports_out: list[int]) -> None:
        """Write a CapDescriptor for ``hook`` (rpc-protocol.md §5, 'Writing descriptors')."""
        described = self.describe_pinned(desc, hook, exports_out, pin=False)
        if described is not None:
            described.release()

    def describe_pinned(
        self, desc: Any, hook: Hook | None, exports_out: list[int], *, pin: bool = True
    ) -> Hook | None:
        """As ``describe``; returns a new reference to what the descriptor stands for from
        now on (for a Return or a Resolve: the answer's pipeline and the export entry must
        keep reaching exactly that). With ``pin=False`` it returns the plain hook."""
        if hook is None:
            desc.none = None
            return None
        hook = hook.shortest()
        if isinstance(hook, NullHook):
            desc.none = None
            return hook.add_ref()
        if isinstance(hook, RemoteHook) and hook.session is self.session:
            hook.write_descriptor(desc)
            return hook.pinned() if pin else hook.add_ref()
        if isinstance(hook, BrokenHook):
            return self._describe_broken(desc, hook, exports_out)
        export_id = self.export(hook)
        exports_out.append(export_id)
        if hook.is_promise:
            desc.senderPromise = export_id
        else:
            desc.senderHosted = export_id
        return hook.add_ref()

    def export(self, hook: Hook) -> int:
        """The export ID for ``hook``, counting one more reference the peer holds."""
        export_id = self._by_hook.get(hook)
        if export_id is None:
            limit = self.session.limits.max_exports
            if len(self.entries) >= limit:
                # The peer holds that many of ours without releasing them. Refusing here
                # would fail our own message half-built: the session aborts the connection
                # once this message is done (RpcSession.check_limits).
                self.session.note_breach(
                    LimitExceeded(
                        "max_exports",
                        limit,
                        f"the peer would hold {len(self.entries) + 1} capabilities",
                    )
                )
            export_id = self._ids.allocate()
            export = Export(hook.add_ref())
            self.entries[export_id] = export
            self._by_hook[hook] = export_id
            if hook.is_promise:
                hook.when_resolved(lambda: self._send_resolve(export_id, export))
        export = self.entries[export_id]
        export.refcount += 1
        return export_id

    def _describe_broken(self, desc: Any, hook: BrokenHook, exports_out: list[int]) -> Hook:
        """A broken capability cannot be described: export a promise and resolve it at once
        to the exception (rpc-protocol.md §5); the Resolve follows the message being built."""
        promise = PromiseHook()
        export_id = self.export(promise)
        exports_out.append(export_id)
        desc.senderPromise = export_id
        promise.resolve(hook.add_ref())
        promise.release()
        return hook.add_ref()

    def _send_resolve(self, export_id: int, export: Export) -> None:
        """An exported promise settled: tell the peer exactly once (rpc-protocol.md §8)."""
        session = self.session
        if session.closed is not None or self.entries.get(export_id) is not export:
            return  # the peer released it first: no Resolve needed
        target = export.hook.resolved_target()
        assert target is not None
        outbox = session.outbox
        place = outbox.reserve()
        message = wire.Message.new_message()
        body = message.init("resolve")
        body.promiseId = export_id
        final = target.shortest()
        if isinstance(final, BrokenHook) and not isinstance(final, NullHook):
            wire.write_exception(body.init("exception"), final.error)
            described: Hook = final.add_ref()
        else:
            ignored: list[int] = []  # a Resolve's descriptor counts, but is never returned
            pinned = self.describe_pinned(body.init("cap"), target, ignored)
            assert pinned is not None
            described = pinned
        outbox.fill(place, message.to_segments())
        self._repoint(export, described)

    def _repoint(self, export: Export, described: Hook) -> None:
        """The entry now stands for exactly what the Resolve named (the Tribble rule)."""
        if export.key is not None:
            self._by_hook.pop(export.key, None)
            export.key = None
        old, export.hook = export.hook, described
        old.release()

    # -------------------------------------------------------------- receiving
    def target(self, export_id: int) -> Hook:
        """A new reference to the export a message targets (``importedCap``)."""
        export = self.entries.get(export_id)
        if export is None:
            # rpc.c++ getMessageTarget: "Message target is not a current export ID."
            raise RemoteProtocolError(f"call to export ID {export_id}, which is not exported")
        return export.hook.add_ref()

    def receiver_hosted(self, export_id: int) -> Hook:
        """A new reference for a ``receiverHosted`` descriptor naming one of our exports."""
        export = self.entries.get(export_id)
        if export is None:
            return BrokenHook(Failed(f"receiverHosted names unknown export {export_id}"))
        return export.hook.add_ref()

    def release(self, export_id: int, count: int) -> None:
        """The peer dropped ``count`` references (Release, releaseParamCaps/ResultCaps)."""
        export = self.entries.get(export_id)
        if export is None:
            raise RemoteProtocolError(f"release of export ID {export_id}, which is not exported")
        if count > export.refcount:
            raise RemoteProtocolError(
                f"release of {count} references to export {export_id}, which has {export.refcount}"
            )
        export.refcount -= count
        if export.refcount == 0:
            del self.entries[export_id]
            if export.key is not None:
                del self._by_hook[export.key]
            self._ids.free(export_id)
            export.hook.release()

    def release_all(self, export_ids: list[int]) -> None:
        """Drop one reference to each (a payload's cap table: rpc-protocol.md §7)."""
        for export_id in export_ids:
            self.release(export_id, 1)

    def close(self) -> None:
        entries, self.entries = self.entries, {}
        self._by_hook.clear()
        for export in entries.values():
            export.hook.release()
