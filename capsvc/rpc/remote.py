"""Hooks that stand for capabilities on the other side of one session.

Theory of operation:
- ``ImportHook``: a capability the peer exported to us (rpc-protocol.md §7, import side).
  Calls go out as ``target.importedCap``. When the last local owner releases it, the session
  sends one Release with the full remote count.
- ``ImportPromiseHook``: an import the peer described as ``senderPromise``; a Resolve will
  redirect it (§8).
- ``PipelineHook``: a capability inside the results of one of our unanswered questions.
  Calls go out at once as ``target.promisedAnswer`` (§6); the Return redirects it.

The two promise kinds share ``RemotePromise``: once settled they forward to the new target,
and if calls already went the long way round and the target is local, an embargo holds new
calls until the Disembargo comes back (§9), so calls on one reference keep their order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capsvc.rpc.hooks import Hook, OutgoingCall, Path

if TYPE_CHECKING:
    from capsvc.rpc.session import RpcSession
    from capsvc.rpc.tables import Question


class RemoteHook(Hook):
    """A hook whose calls travel through ``session``."""

    __slots__ = ("session",)

    def __init__(self, session: RpcSession) -> None:
        super().__init__()
        self.session = session

    def write_target(self, target: object) -> None:
        """Fill an rpc.capnp MessageTarget builder naming this capability to the peer."""
        raise NotImplementedError


class ImportHook(RemoteHook):
    """A settled capability hosted by the peer under ``import_id``."""

    __slots__ = ("import_id",)

    def __init__(self, session: RpcSession, import_id: int) -> None:
        super().__init__(session)
        self.import_id = import_id

    def call(self, call: OutgoingCall) -> None:
        self.session.send_call(call, self)

    def write_target(self, target: object) -> None:
        target.importedCap = self.import_id  # type: ignore[attr-defined]

    def _dispose(self) -> None:
        self.session.drop_import(self)


class RemotePromise(RemoteHook):
    """Shared settle/embargo logic for the two remote promise kinds."""

    __slots__ = ("_embargo_queue", "_target", "calls_sent")
    is_promise = True

    def __init__(self, session: RpcSession) -> None:
        super().__init__(session)
        self._target: Hook | None = None
        self._embargo_queue: list[OutgoingCall] | None = None
        self.calls_sent = 0

    def call(self, call: OutgoingCall) -> None:
        if self._target is None:
            self.calls_sent += 1
            self.session.send_call(call, self)
        elif self._embargo_queue is not None:
            self._embargo_queue.append(call)
        else:
            self._target.call(call)

    def resolved_target(self) -> Hook | None:
        return self._target

    @property
    def settled(self) -> bool:
        return self._target is not None

    def settle(self, target: Hook) -> bool:
        """Point this promise at ``target`` (owned). Returns True if an embargo began.

        rpc-protocol.md §9, step 1: embargo only if calls went out through the promise and the
        new target is not a plain remote capability of this same session.
        """
        self._target = target
        if self.calls_sent and not self._stays_remote(target):
            self._embargo_queue = []
            return True
        return False

    def lift_embargo(self) -> None:
        """The Disembargo came back: deliver the held calls in order (§9, step 4)."""
        queue, self._embargo_queue = self._embargo_queue or [], None
        assert self._target is not None
        for call in queue:
            self._target.call(call)

    def _stays_remote(self, target: Hook) -> bool:
        from capsvc.rpc.hooks import BrokenHook

        shortest = target.shortest()
        if isinstance(shortest, BrokenHook):
            return True
        return isinstance(shortest, RemoteHook) and shortest.session is self.session

    def _dispose(self) -> None:
        if self._target is not None:
            self._target.release()
            self._target = None


class ImportPromiseHook(RemotePromise):
    """An import the peer sent as ``senderPromise``; a Resolve settles it."""

    __slots__ = ("import_id",)

    def __init__(self, session: RpcSession, import_id: int) -> None:
        super().__init__(session)
        self.import_id = import_id

    def write_target(self, target: object) -> None:
        target.importedCap = self.import_id  # type: ignore[attr-defined]

    def _dispose(self) -> None:
        super()._dispose()
        self.session.drop_import(self)


class PipelineHook(RemotePromise):
    """The capability at ``path`` in the results of ``question``, not returned yet."""

    __slots__ = ("path", "question")

    def __init__(self, question: Question, path: Path) -> None:
        super().__init__(question.session)
        self.question = question
        self.path = path

    def write_target(self, target: object) -> None:
        answer = target.init("promisedAnswer")  # type: ignore[attr-defined]
        self.question.write_promised_answer(answer, self.path)

    def _dispose(self) -> None:
        super()._dispose()
        self.question.drop_pipeline(self)
