"""The entries of the four per-connection tables (rpc-protocol.md §3).

Theory of operation: ``Question`` (our calls), ``Answer`` (the peer's calls), ``Export``
(our capabilities the peer holds, with the peer's reference count) and ``Import`` (the
peer's capabilities we hold, with how many times we received each). The session
(capsvc.rpc.session) owns the dicts of them and every rule about when entries come and go;
these classes only hold state, plus the few operations hooks call back into.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capsvc.errors import RemoteProtocolError, RpcError
from capsvc.rpc.hooks import CallResult, Hook, Path
from capsvc.rpc.payload import Payload
from capsvc.rpc.remote import ImportHook, ImportPromiseHook, PipelineHook

if TYPE_CHECKING:
    from capsvc.rpc.session import RpcSession


class Canceled(RpcError):
    """The caller finished the question before the call returned (never seen by users)."""


class Question:
    """One of our calls (or bootstrap requests) awaiting or holding its Return."""

    __slots__ = (
        "finish_sent",
        "id",
        "no_finish_needed",
        "param_exports",
        "pipelines",
        "result",
        "returned",
        "session",
        "settled",
        "wanted",
        "yourself",
    )

    def __init__(self, session: RpcSession, question_id: int, result: CallResult | None) -> None:
        self.session = session
        self.id = question_id
        self.result = result
        self.pipelines: dict[Path, PipelineHook] = {}
        self.param_exports: list[int] = []
        self.returned = False
        self.finish_sent = False
        self.no_finish_needed = False
        self.settled = False
        self.yourself = False
        self.wanted = result is not None

    def pipeline(self, path: Path) -> Hook:
        hook = self.pipelines.get(path)
        if hook is not None:
            return hook.add_ref()
        hook = PipelineHook(self, path)
        self.pipelines[path] = hook
        return hook

    def drop_pipeline(self, hook: PipelineHook) -> None:
        if self.pipelines.get(hook.path) is hook:
            del self.pipelines[hook.path]
            self.session._question_unwanted(self)

    def drop_interest(self) -> None:
        # The result stays linked (uncounted): it must still settle, with the Return that
        # answers our Finish, so that whoever waits on it (e.g. an answer we are forwarding
        # for the peer) can complete too.
        self.wanted = False
        self.session._question_unwanted(self)

    def write_promised_answer(self, builder: Any, path: Path) -> None:
        builder.questionId = self.id
        transform = builder.init("transform", len(path))
        for index, step in enumerate(path):
            transform[index].getPointerField = step


class Answer:
    """One of the peer's calls: running, or returned and awaiting its Finish."""

    __slots__ = ("finish_received", "id", "redirected", "result", "result_exports", "return_sent")

    def __init__(self, answer_id: int, result: CallResult, redirected: bool) -> None:
        self.id = answer_id
        self.result = result
        self.redirected = redirected
        self.return_sent = False
        self.finish_received = False
        self.result_exports: list[int] = []


class Export:
    """One of our capabilities as the peer knows it, with the peer's reference count."""

    __slots__ = ("hook", "refcount", "resolve_sent")

    def __init__(self, hook: Hook) -> None:
        self.hook = hook
        self.refcount = 0
        self.resolve_sent = False


class Import:
    """One of the peer's capabilities: our hook for it and how many times we received it."""

    __slots__ = ("hook", "remote_refcount")

    def __init__(self, hook: ImportHook | ImportPromiseHook) -> None:
        self.hook = hook
        self.remote_refcount = 1


class SharedPayload(Payload):
    """A second owner's view of another payload (takeFromOtherQuestion shares results)."""

    __slots__ = ("shared_inner",)

    def __init__(self, inner: Payload) -> None:
        super().__init__()
        self.shared_inner = inner
        self.caps = [hook.add_ref() if hook is not None else None for hook in inner.caps]

    def locate_cap(self, path: Path) -> int | Hook | None:
        # Our caps mirror the inner payload's, index for index, with references of our own:
        # the inner payload may be released before we are.
        return self.shared_inner.locate_cap(path)

    def content(self, schema: Any) -> Any:
        return self.shared_inner.content(schema)

    def union_choice(self, struct_path: Path, offset: int) -> int | None:
        return self.shared_inner.union_choice(struct_path, offset)


def transform_path(transform: Any) -> Path:
    path = []
    for op in transform:
        which = op.which()
        if which == "getPointerField":
            path.append(op.getPointerField)
        elif which != "noop":
            raise RemoteProtocolError(f"unknown PromisedAnswer op {which!r}")
    return tuple(path)
