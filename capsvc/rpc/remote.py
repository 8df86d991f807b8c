"""Hooks that stand for capabilities on the other side of one session.

Theory of operation:
- ``ImportHook``: a capability the peer exported to us (rpc-protocol.md §7, import side).
  Calls go out as ``target.importedCap``. When the last local owner releases it, the session
  sends one Release with the full remote count.
- ``ImportPromiseHook``: an import the peer described as ``senderPromise``; a Resolve will
  redirect it (§8).
- ``PipelineHook``: a capability inside the results of one of our unanswered questions.
  Calls go out at once as ``target.promisedAnswer`` (§6); the Return redirects it.
- ``PinnedHook``: one of the two promise kinds above *as we described it* in a Return or a
  Resolve we sent. The peer's later calls (and Disembargos) addressed to what we described
  must reach exactly that promise of the peer's, even after it settles somewhere else: this is
  the rule that defuses the Tribble 4-way race (rpc-protocol.md §8; C++ freezes its export and
  answer tables the same way). So a pinned hook always sends along the wire, never follows
  the promise's own resolution, and keeps the promise's import or question alive. What it
  sends counts as sent through the promise: calls that reach the promise's nearer target
  afterwards wait behind it (``RemotePromise.sent_by_pin``; C++ marks a promise frozen
  into a table as called, ``receivedCall``, for the same reason).

The two promise kinds share ``RemotePromise``: once settled they forward to the new target.
When calls already went the long way round, an embargo (a local promise in the target's
place) holds new calls until the Disembargo comes back (§9), so that calls on one reference
keep their order. Whether one is needed is decided in ``settle`` from *how* the target was
described (see there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capsvc.rpc.hooks import BrokenHook, Hook, OutgoingCall, Path, PromiseHook

if TYPE_CHECKING:
    from capsvc.rpc.questions import Question
    from capsvc.rpc.session import RpcSession


class RemoteHook(Hook):
    """A hook whose calls travel through ``session``."""

    __slots__ = ("session",)

    def __init__(self, session: RpcSession) -> None:
        super().__init__()
        self.session = session

    def write_target(self, target: Any) -> None:
        """Fill an rpc.capnp MessageTarget builder naming this capability to the peer."""
        raise NotImplementedError

    def write_descriptor(self, desc: Any) -> None:
        """Fill a CapDescriptor naming this capability back to its host (rpc-protocol.md §5:
        an import goes back as ``receiverHosted``, a pipelined one as ``receiverAnswer``)."""
        raise NotImplementedError

    def imported_target(self) -> int:
        """The import ID a Call to this capability names as its importedCap target, or -1
        when the target is something else (a promisedAnswer)."""
        return -1

    def pinned(self) -> RemoteHook:
        """A new reference to what a descriptor written now stands for, forever after."""
        return self.add_ref()  # type: ignore[return-value]


class ImportHook(RemoteHook):
    """A settled capability hosted by the peer under ``import_id``."""

    __slots__ = ("import_id",)

    def __init__(self, session: RpcSession, import_id: int) -> None:
        super().__init__(session)
        self.import_id = import_id

    def call(self, call: OutgoingCall) -> None:
        self.session.send_call(call, self)

    def write_target(self, target: Any) -> None:
        target.importedCap = self.import_id

    def imported_target(self) -> int:
        return self.import_id

    def write_descriptor(self, desc: Any) -> None:
        desc.receiverHosted = self.import_id

    def _dispose(self) -> None:
        self.session.imports.drop(self)


class RemotePromise(RemoteHook):
    """Shared settle/embargo logic for the two remote promise kinds."""

    __slots__ = ("_target", "calls_sent")
    is_promise = True

    def __init__(self, session: RpcSession) -> None:
        super().__init__(session)
        self._target: Hook | None = None
        #: Calls sent to the peer through this promise while it was unresolved (or, for a
        #: promise another settled to, through that one: see ``settle``).
        self.calls_sent = 0

    def call(self, call: OutgoingCall) -> None:
        if self._target is None:
            self.calls_sent += 1
            self.session.send_call(call, self)
        else:
            self._target.call(call)

    def resolved_target(self) -> Hook | None:
        return self._target

    @property
    def settled(self) -> bool:
        return self._target is not None

    def pinned(self) -> RemoteHook:
        return PinnedHook(self)

    def settle(self, target: Hook, *, reflected: bool) -> None:
        """Point this promise at ``target`` (owned), behind an embargo if need be.

        ``reflected`` says the peer described the target as one of *our* capabilities or
        answers (``receiverHosted``, ``receiverAnswer``). rpc-protocol.md §9, step 1, as
        C++ decides it (rpc.c++ ``PromiseClient::resolve``):
        - a capability of the peer on this connection, described as the peer's: no embargo,
          calls already follow the same path; if it is itself an unresolved promise, the
          calls we sent count as its own, so that it embargoes if it later comes back to us;
        - null or broken: no embargo, order does not matter for calls that fail;
        - anything else (local, on another connection, or reflected by the peer even if it
          leads back to the peer, the Tribble case C++ marks with RequireEmbargoWrapper):
          an embargo, if we sent calls through the promise.

        An embargo is, as in C++, a local promise standing in for the target until the
        Disembargo comes back (capsvc.rpc.embargoes): new calls queue in it, and to anything
        that looks through this promise (a descriptor we write, an export we repoint) it is
        an unresolved local promise, so that every later call waits in the same queue.
        """
        if not reflected and isinstance(target, RemoteHook) and target.session is self.session:
            if isinstance(target, RemotePromise) and not target.settled:
                target.calls_sent += self.calls_sent
            self._target = target
        elif not self.calls_sent or isinstance(target.shortest(), BrokenHook):
            self._target = target
        else:
            embargo = PromiseHook()
            self._target = embargo
            self.session.embargoes.start(self, embargo, target)

    def sent_by_pin(self) -> None:
        """A call to this promise's address just left by a pinned path (an export or
        answer frozen to it, PinnedHook): the long way round, even if the promise has
        settled nearer. Calls that reach the target through the promise from now on
        (the export's own promise, once an embargo before this call lifts, say) must not
        overtake it (§9, E-order): before the promise settles, the call counts as one
        sent through it, so that ``settle`` embargoes; after, when the target is not the
        peer's (a local one, reached without the peer: the address leads back to us, so
        a Disembargo is allowed), a new embargo behind this call holds them."""
        target = self._target
        if target is None:
            self.calls_sent += 1
            return
        if isinstance(target, RemoteHook) and target.session is self.session:
            return  # calls through the promise take the same wire to the peer
        if isinstance(target.shortest(), BrokenHook):
            return  # order does not matter for calls that fail
        stand_in = PromiseHook()
        self._target = stand_in
        self.session.embargoes.start(self, stand_in, target)  # (the target's ownership too)

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

    def write_target(self, target: Any) -> None:
        target.importedCap = self.import_id

    def imported_target(self) -> int:
        return self.import_id

    def write_descriptor(self, desc: Any) -> None:
        desc.receiverHosted = self.import_id

    def _dispose(self) -> None:
        super()._dispose()
        self.session.imports.drop(self)


class PipelineHook(RemotePromise):
    """The capability at ``path`` in the results of ``question``, not returned yet."""

    __slots__ = ("path", "question")

    def __init__(self, question: Question, path: Path) -> None:
        super().__init__(question.session)
        self.question = question
        self.path = path

    def write_target(self, target: Any) -> None:
        self.question.write_promised_answer(target.init("promisedAnswer"), self.path)

    def write_descriptor(self, desc: Any) -> None:
        self.question.write_promised_answer(desc.init("receiverAnswer"), self.path)

    def settle(self, target: Hook, *, reflected: bool) -> None:
        super().settle(target, reflected=reflected)
        self.question.pipeline_settled(self)

    def _dispose(self) -> None:
        super()._dispose()
        self.question.drop_pipeline(self)


class PinnedHook(RemoteHook):
    """A remote promise frozen as it was described (see the module docstring)."""

    __slots__ = ("inner",)

    def __init__(self, inner: RemotePromise) -> None:
        super().__init__(inner.session)
        self.inner: RemotePromise = inner.add_ref()  # type: ignore[assignment]
        if isinstance(inner, PipelineHook):
            inner.question.add_holder()  # the question must not be finished under us

    def call(self, call: OutgoingCall) -> None:
        self.session.send_call(call, self)
        self.inner.sent_by_pin()

    def write_target(self, target: Any) -> None:
        self.inner.write_target(target)

    def imported_target(self) -> int:
        return self.inner.imported_target()

    def write_descriptor(self, desc: Any) -> None:
        self.inner.write_descriptor(desc)

    def pinned(self) -> RemoteHook:
        return self.add_ref()  # type: ignore[return-value]

    def _dispose(self) -> None:
        inner = self.inner
        if isinstance(inner, PipelineHook):
            inner.question.drop_holder()
        inner.release()
