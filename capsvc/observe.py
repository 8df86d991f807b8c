"""Watching calls: the access log, and the instrumentations (tracing) a process turns on.

Theory of operation: the engine tells a connection's ``CallObserver`` (capsvc.rpc.hooks)
of each call as it starts, both ways, and the observer returns the callback the call's
``CallResult`` runs once settled (results, an error, or Canceled). This module provides:

- :class:`AccessLog`: one INFO line per call a peer made to us, on the logger
  ``capsvc.access`` (``capsvc serve --access-log``, ``serve(access_log=True)``): the peer,
  ``Interface.method`` by schema names (capsvc.names), the time until the method's
  results or error were ready, and the outcome (``ok``, the exception type and reason,
  ``canceled`` when the caller finished the question first, ``disconnected``);
- a process-wide list of instrumentations, factories that give an observer per
  connection (capsvc.otel registers one): ``observer_for`` combines them with the access
  log for a new connection, and gives None when nothing watches, so the per-call cost of
  observing stays one ``is None`` test per call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from capsvc.errors import RpcError
from capsvc.names import method_label
from capsvc.rpc.hooks import CallObserver, CallResult, Canceled, ObservedCall
from capsvc.rpc.payload import Payload

access_log = logging.getLogger("capsvc.access")

Settled = Callable[[CallResult], None]


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What an observer may want to know of the connection it watches."""

    #: The peer's address, as logs write it (``127.0.0.1:40122``, ``unix``).
    peer: str
    #: True when a server accepted the connection (we are the callee of its calls).
    served: bool
    #: True once the connection has ended (a call settled Canceled then: disconnected).
    closed: Callable[[], bool]


class Instrumentation(Protocol):
    """Gives the observer of one new connection, or None to leave it alone."""

    def __call__(self, connection: ConnectionInfo) -> CallObserver | None: ...


_INSTRUMENTATIONS: list[Instrumentation] = []


def add_instrumentation(instrumentation: Instrumentation) -> None:
    """Watch every connection opened from now on (capsvc.otel.instrument uses this)."""
    if instrumentation not in _INSTRUMENTATIONS:
        _INSTRUMENTATIONS.append(instrumentation)


def remove_instrumentation(instrumentation: Instrumentation) -> None:
    """Stop watching new connections with ``instrumentation``."""
    if instrumentation in _INSTRUMENTATIONS:
        _INSTRUMENTATIONS.remove(instrumentation)


def observer_for(connection: ConnectionInfo, *, access: bool = False) -> CallObserver | None:
    """The observer for a new connection: the access log if asked, and every
    instrumentation's; None if there are none."""
    observers: list[CallObserver] = [AccessLog(connection)] if access else []
    for instrumentation in list(_INSTRUMENTATIONS):
        observer = instrumentation(connection)
        if observer is not None:
            observers.append(observer)
    if not observers:
        return None
    return observers[0] if len(observers) == 1 else Observers(observers)


def outcome(result: CallResult, connection: ConnectionInfo) -> str:
    """How a settled call ended, in a few words: ``ok``, ``canceled``, ``disconnected``,
    or the exception type and reason (``failed: Calc.div raised ZeroDivisionError: ...``)."""
    error = result.error
    if error is None:
        return "ok"
    if isinstance(error, Canceled):
        return "disconnected" if connection.closed() else "canceled"
    return f"{exception_type(error)}: {error.reason}"


def exception_type(error: RpcError) -> str:
    """rpc.capnp's name of the exception's type (``failed``, ``overloaded``, ...)."""
    return error.type.name.lower()


class Observers:
    """Several observers as one (each call's callbacks run in the order given)."""

    __slots__ = ("observers",)

    def __init__(self, observers: list[CallObserver]) -> None:
        self.observers = observers

    def received(self, interface_id: int, method_id: int, params: Payload) -> ObservedCall:
        return _Each([o.received(interface_id, method_id, params) for o in self.observers])

    def sent(self, interface_id: int, method_id: int) -> Settled:
        return _Sent([o.sent(interface_id, method_id) for o in self.observers])


class _Each:
    __slots__ = ("callbacks",)

    def __init__(self, callbacks: list[ObservedCall]) -> None:
        self.callbacks = callbacks

    def __call__(self, result: CallResult) -> None:
        for callback in self.callbacks:
            callback(result)

    def enter(self) -> object:
        return [callback.enter() for callback in self.callbacks]

    def exit(self, token: object) -> None:
        assert isinstance(token, list)
        for callback, entered in zip(reversed(self.callbacks), reversed(token), strict=True):
            callback.exit(entered)


class _Sent:
    __slots__ = ("callbacks",)

    def __init__(self, callbacks: list[Settled]) -> None:
        self.callbacks = callbacks

    def __call__(self, result: CallResult) -> None:
        for callback in self.callbacks:
            callback(result)


class AccessLog:
    """The access log of one connection: a line per call the peer made (module doc)."""

    __slots__ = ("connection",)

    def __init__(self, connection: ConnectionInfo) -> None:
        self.connection = connection

    def received(self, interface_id: int, method_id: int, params: Payload) -> ObservedCall:
        return _AccessLine(self.connection, interface_id, method_id, trio.current_time())

    def sent(self, interface_id: int, method_id: int) -> Settled:
        return _ignore


def _ignore(result: CallResult) -> None:
    """Calls we make are not in our access log (the peer's server logs them)."""


class _AccessLine:
    __slots__ = ("connection", "interface_id", "method_id", "started")

    def __init__(
        self, connection: ConnectionInfo, interface_id: int, method_id: int, started: float
    ) -> None:
        self.connection = connection
        self.interface_id = interface_id
        self.method_id = method_id
        self.started = started

    def enter(self) -> object:
        return None

    def exit(self, token: object) -> None:
        pass

    def __call__(self, result: CallResult) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        elapsed = trio.current_time() - self.started
        access_log.info(
            "%s %s %.3f ms %s",
            self.connection.peer,
            method_label(self.interface_id, self.method_id),
            elapsed * 1000,
            outcome(result, self.connection),
        )
