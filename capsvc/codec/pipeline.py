"""Pipelined results of calls: the base of generated ``Pipeline`` and ``Promise`` classes.

Theory of operation: a ``StructPipeline`` stands for a struct inside a call's future results,
as a path of pointer slots from the results' root (rpc-protocol.md §6: a PromisedAnswer's
transform). Generated subclasses turn each interface field into a typed client of the
pipelined capability (usable at once: calls on it go out addressed to the pending answer),
and each struct or group field into a deeper pipeline. ``ResultPromise`` is the root: await
it for the results' generated reader. Nothing here imports trio until a promise is awaited.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from capsvc.codec.reading import StructReader
from capsvc.errors import Failed
from capsvc.rpc.hooks import CallResult, Hook, Path

P = TypeVar("P", bound="StructPipeline")
R = TypeVar("R", bound=StructReader)
C = TypeVar("C", covariant=True)


class _ClientClass(Protocol[C]):
    def __call__(self, hook: Hook) -> C: ...


class StructPipeline:
    """The pipelined fields of a struct inside a call's future results (generated
    subclasses add one property per interface, struct or group field)."""

    __slots__ = ("__weakref__", "_path", "_result")

    def __init__(self, result: CallResult, path: Path) -> None:
        self._result = result  # owned
        self._path = path

    def _client(self, slot: int, cls: _ClientClass[C]) -> C:
        return cls(self._result.pipeline(self._path + (slot,)))

    def _struct(self, slot: int, cls: type[P]) -> P:
        return cls(self._result.add_ref(), self._path + (slot,))

    def _group(self, cls: type[P]) -> P:
        return cls(self._result.add_ref(), self._path)

    def cancel(self) -> None:
        """Give up on the results (sends the Finish if nothing else needs the question)."""
        result, self._result = self._result, _DONE
        if result is not _DONE:
            result.release()

    def __del__(self) -> None:
        result = getattr(self, "_result", _DONE)
        if result is not _DONE:
            self._result = _DONE
            result.release()


_DONE = CallResult()
_DONE.refs = 1 << 60
_DONE.set_error(Failed("this promise was cancelled"))


class ResultPromise(StructPipeline, Generic[R]):
    """A call's future results: ``await`` gives the results' generated reader."""

    __slots__ = ()

    #: The results struct's generated Reader class (set by each generated Promise).
    _READER: ClassVar[type[StructReader]]

    def __await__(self) -> Generator[Any, None, R]:
        # The wait and the read are one compiled coroutine (capsvc.runtime.await_results):
        # no Python coroutine frame per await.
        waiting = _await_results()(self._result, self._READER, self.cancel, _Kept)
        return waiting.__await__()


_AWAIT_RESULTS: Callable[..., Awaitable[Any]] | None = None


def _await_results() -> Callable[..., Awaitable[Any]]:
    """capsvc.runtime.await_results, imported on the first await (not per await: an import
    statement costs a lookup and a call each time it runs; and nothing here imports trio
    until a promise is awaited)."""
    global _AWAIT_RESULTS
    if _AWAIT_RESULTS is None:
        from capsvc.runtime import await_results

        _AWAIT_RESULTS = await_results
    return _AWAIT_RESULTS


class _Kept:
    """Keeps a call's results (and their capabilities) alive while a reader of them lives."""

    __slots__ = ("_result",)

    def __init__(self, result: CallResult) -> None:
        self._result = result

    def __del__(self) -> None:
        self._result.release()
