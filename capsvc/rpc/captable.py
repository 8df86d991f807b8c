"""Capabilities crossing the connection: descriptors, exports, imports, resolves, embargoes.

Theory of operation: this is the half of the session that deals with capability
*references* rather than calls (rpc-protocol.md §5, §7, §8, §9):
- writing a CapDescriptor for a hook (``_describe``: export it, or name the peer's own
  capability back to it) and turning a received one into a hook (``_import_descriptor``);
- reference counts both ways: ``Release`` received and sent;
- promises: ``Resolve`` sent when an exported promise settles, received for an imported one;
- embargoes: starting one when a promise we called through settles back on our side, and
  answering the peer's.
``RpcSession`` inherits these methods; they use the session's tables and output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from capsvc.errors import Failed, RemoteProtocolError, RpcError
from capsvc.rpc import wire
from capsvc.rpc.hooks import BrokenHook, Hook, PromiseHook, null_hook
from capsvc.rpc.ids import IdAllocator
from capsvc.rpc.remote import ImportHook, ImportPromiseHook, PipelineHook, RemoteHook, RemotePromise
from capsvc.rpc.tables import Answer, Export, Import, transform_path

if TYPE_CHECKING:
    from capsvc.rpc.session import RpcSession

Segments = Sequence[bytes | bytearray | memoryview]


class CapabilityTables:
    """Mixin for RpcSession: see the module docstring."""

    exports: dict[int, Export]
    imports: dict[int, Import]
    answers: dict[int, Answer]
    embargoes: dict[int, RemotePromise]
    closed: RpcError | None
    _export_ids: IdAllocator
    _embargo_ids: IdAllocator
    _export_by_hook: dict[Hook, int]

    def _send_message(self, message: Any, urgent: bool = True) -> None:
        raise NotImplementedError

    def _message_target(self, target: Any) -> Hook:
        raise NotImplementedError

    def _echo_unimplemented(self, message: Any) -> None:
        raise NotImplementedError

    # -------------------------------------------------------------- release
    def _on_release(self, message: Any, segments: Segments) -> None:
        body = message.release
        self._release_export(body.id, body.referenceCount)

    def _release_export(self, export_id: int, count: int) -> None:
        export = self.exports.get(export_id)
        if export is None:
            raise RemoteProtocolError(f"release of export ID {export_id}, which is not exported")
        if count > export.refcount:
            raise RemoteProtocolError(
                f"release of {count} references to export {export_id}, which has {export.refcount}"
            )
        export.refcount -= count
        if export.refcount == 0:
            del self.exports[export_id]
            del self._export_by_hook[export.hook]
            self._export_ids.free(export_id)
            export.hook.release()

    def drop_import(self, hook: ImportHook | ImportPromiseHook) -> None:
        """The last local reference to an import is gone: send Release with the full count."""
        entry = self.imports.get(hook.import_id)
        if entry is None or entry.hook is not hook:
            return
        del self.imports[hook.import_id]
        if self.closed is not None:
            return
        message = wire.Message.new_message()
        body = message.init("release")
        body.id = hook.import_id
        body.referenceCount = entry.remote_refcount
        self._send_message(message, urgent=False)

    # -------------------------------------------------------------- resolve
    def _on_resolve(self, message: Any, segments: Segments) -> None:
        body = message.resolve
        if body.which() == "cap":
            target = self._import_descriptor(body.cap)
            new_target: Hook = target if target is not None else null_hook()
        else:
            new_target = BrokenHook(wire.read_exception(body.exception))
        entry = self.imports.get(body.promiseId)
        if entry is None:
            new_target.release()  # we already released the promise: drop what it named (§8)
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
        if hook.settle(new_target):
            self._start_embargo(hook)

    # -------------------------------------------------------------- embargo
    def _start_embargo(self, hook: RemotePromise) -> None:
        """rpc-protocol.md §9, sending side, steps 2-3."""
        embargo_id = self._embargo_ids.allocate()
        self.embargoes[embargo_id] = hook
        hook.add_ref()  # the disembargo's target must stay valid until it comes back
        message = wire.Message.new_message()
        body = message.init("disembargo")
        hook.write_target(body.target)
        body.context.senderLoopback = embargo_id
        self._send_message(message)

    def _on_disembargo(self, message: Any, segments: Segments) -> None:
        body = message.disembargo
        context = body.context.which()
        if context == "senderLoopback":
            self._reflect_disembargo(body)
        elif context == "receiverLoopback":
            hook = self.embargoes.pop(body.context.receiverLoopback, None)
            if hook is None:
                raise RemoteProtocolError(
                    f"disembargo for embargo {body.context.receiverLoopback}, which is not ours"
                )
            self._embargo_ids.free(body.context.receiverLoopback)
            hook.lift_embargo()
            hook.release()
        else:
            self._echo_unimplemented(message)

    def _reflect_disembargo(self, body: Any) -> None:
        """rpc-protocol.md §9, receiving side: the path back must end at the peer's own cap."""
        target = self._message_target(body.target)
        try:
            # The target is what our Return or Resolve described: follow settled promises to
            # it. It must be one of the sender's own capabilities (rpc-protocol.md §9, step 3).
            final = target.shortest()
            if not isinstance(final, RemoteHook) or final.session is not self:
                raise RemoteProtocolError(
                    "disembargo target does not resolve to a capability of the sender"
                )
            reply = wire.Message.new_message()
            out = reply.init("disembargo")
            final.write_target(out.target)
            out.context.receiverLoopback = body.context.senderLoopback
            self._send_message(reply)
        finally:
            target.release()

    # ================================================================== capabilities
    def _import_descriptor(self, desc: Any) -> Hook | None:
        """A new reference for a received CapDescriptor (rpc-protocol.md §5, 'on receipt')."""
        which = desc.which()
        if which == "none":
            return None
        if which == "senderHosted":
            return self._import(desc.senderHosted, promise=False)
        if which == "senderPromise":
            return self._import(desc.senderPromise, promise=True)
        if which == "receiverHosted":
            export = self.exports.get(desc.receiverHosted)
            if export is None:
                return BrokenHook(
                    Failed(f"receiverHosted names unknown export {desc.receiverHosted}")
                )
            return export.hook.add_ref()
        if which == "receiverAnswer":
            promised = desc.receiverAnswer
            answer = self.answers.get(promised.questionId)
            if answer is None:
                return BrokenHook(
                    Failed(f"receiverAnswer names unknown question {promised.questionId}")
                )
            return answer.result.pipeline(transform_path(promised.transform))
        if which == "thirdPartyHosted":
            return self._import(desc.thirdPartyHosted.vineId, promise=False)
        raise RemoteProtocolError(f"unknown capability descriptor {which!r}")

    def _import(self, import_id: int, *, promise: bool) -> Hook:
        entry = self.imports.get(import_id)
        if entry is not None:
            entry.remote_refcount += 1
            return entry.hook.add_ref()
        session = cast("RpcSession", self)
        hook: ImportHook | ImportPromiseHook = (
            ImportPromiseHook(session, import_id) if promise else ImportHook(session, import_id)
        )
        self.imports[import_id] = Import(hook)
        return hook

    def _describe(self, desc: Any, hook: Hook | None, exports_out: list[int]) -> None:
        """Write a CapDescriptor for ``hook`` (rpc-protocol.md §5, 'Writing descriptors')."""
        if hook is None:
            desc.none = None
            return
        hook = hook.shortest()
        if isinstance(hook, RemoteHook) and hook.session is self:
            if isinstance(hook, PipelineHook):
                promised = desc.init("receiverAnswer")
                hook.question.write_promised_answer(promised, hook.path)
            else:
                assert isinstance(hook, ImportHook | ImportPromiseHook)
                desc.receiverHosted = hook.import_id
            return
        if isinstance(hook, BrokenHook):
            # A broken capability cannot be described: export a promise, resolve it at once.
            self._describe_broken(desc, hook, exports_out)
            return
        export_id = self._export(hook)
        exports_out.append(export_id)
        if hook.is_promise:
            desc.senderPromise = export_id
        else:
            desc.senderHosted = export_id

    def _export(self, hook: Hook) -> int:
        export_id = self._export_by_hook.get(hook)
        if export_id is None:
            export_id = self._export_ids.allocate()
            export = Export(hook.add_ref())
            self.exports[export_id] = export
            self._export_by_hook[hook] = export_id
            if hook.is_promise:
                hook.when_resolved(lambda: self._send_resolve(export_id, export))
        export = self.exports[export_id]
        export.refcount += 1
        return export_id

    def _describe_broken(self, desc: Any, hook: BrokenHook, exports_out: list[int]) -> None:
        promise = PromiseHook()
        export_id = self._export(promise)
        exports_out.append(export_id)
        desc.senderPromise = export_id
        promise.resolve(hook.add_ref())
        promise.release()

    def _send_resolve(self, export_id: int, export: Export) -> None:
        """An exported promise settled: tell the peer exactly once (rpc-protocol.md §8)."""
        if self.closed is not None or self.exports.get(export_id) is not export:
            return
        if export.resolve_sent:
            return
        export.resolve_sent = True
        target = export.hook.resolved_target()
        assert target is not None
        message = wire.Message.new_message()
        body = message.init("resolve")
        body.promiseId = export_id
        final = target.shortest()
        if isinstance(final, BrokenHook):
            wire.write_exception(body.init("exception"), final.error)
        else:
            ignored: list[int] = []
            self._describe(body.init("cap"), target, ignored)
        self._send_message(message)
