"""Health over Cap'n Proto: the serving state, the Health server, and the routing that
puts Health beside an application's bootstrap on the same address.

Theory of operation:
- :class:`ServingState` is the one fact every probe reports: a server is STARTING, then
  SERVING, then DRAINING (a graceful shutdown began: readiness false, calls in flight
  finish), then STOPPED. It is an explicit state machine (every state and transition in
  ``TRANSITIONS``, as capsvc.rpc.lifecycle does for questions and answers); an illegal
  move is a bug of the caller, a ``LocalProtocolError``. The trio thread moves it; the
  HTTP probes' thread (capsvc.probes) reads it.
- :class:`HealthServer` answers ``Health.check`` (schemas/health.capnp, modeled on
  grpc.health.v1): for the empty service name, ``serving`` while the state is SERVING and
  ``notServing`` otherwise; for a service it was told of, the same; for any other name,
  ``serviceUnknown``.
- :func:`with_health` is how a client reaches it. Cap'n Proto has one bootstrap per
  connection, so the server's bootstrap capability routes by interface ID: a call whose
  interface is Health's goes to the health server, every other call to the application's
  bootstrap (or fails ``unimplemented`` when there is none). A client bootstraps as usual,
  treats the capability as a Health (pycapnp: ``bootstrap().cast_as(health.Health)``; C++:
  ``bootstrap().castAs<Health>()``) and calls ``check``: any Cap'n Proto client, on the
  address it already uses.
- :func:`check` and :func:`main_health` are that client (``capsvc health ADDR``), with
  errors that say what went wrong in our words rather than a traceback.

The routing hook is a ``LocalServerHook`` with an executor of its own, not a ``Hook``
subclass: the engine is compiled by mypyc, whose native classes cannot be subclassed by
interpreted code (capsvc/_build.py), and an executor is the engine's documented seam for
"what running a call on this object means" (capsvc.rpc.hooks.Executor).
"""

from __future__ import annotations

import enum
import sys
import threading
from collections.abc import Iterable
from functools import partial
from typing import Any

import trio

from capsvc import names
from capsvc.errors import (
    CapsvcError,
    Failed,
    LocalProtocolError,
    ProtocolError,
    RpcError,
    Unimplemented,
)
from capsvc.generated.health_capnp import Health, ServingStatus
from capsvc.rpc.hooks import Hook, LocalServerHook, OutgoingCall

__all__ = [
    "TRANSITIONS",
    "Health",
    "HealthCheckError",
    "HealthRouted",
    "HealthServer",
    "Serving",
    "ServingInput",
    "ServingState",
    "ServingStatus",
    "check",
    "main_health",
    "with_health",
]

#: How long closing the connection may take once ``check`` has its answer.
_CLOSE_SECONDS = 0.5

#: Health's interface ID (schemas/health.capnp): the calls the router sends to Health.
HEALTH_INTERFACE_ID: int = Health._ID


# ---------------------------------------------------------------------- the serving state


class Serving(enum.Enum):
    """Where a server is in its life (the value is what probes print)."""

    #: Not accepting yet (binding, loading): alive, not ready.
    STARTING = "starting"
    #: Accepting connections and calls: ready.
    SERVING = "serving"
    #: A graceful shutdown began: calls in flight finish, new work should go elsewhere.
    DRAINING = "draining"
    #: Serving ended.
    STOPPED = "stopped"


class ServingInput(enum.Enum):
    """What moves a ServingState."""

    SERVE = "the listeners are bound and the bootstrap is ready"
    DRAIN = "a graceful shutdown began"
    STOP = "serving ended"


S, SI = Serving, ServingInput

#: Every legal move. DRAIN and STOP repeat harmlessly (a second SIGTERM, a ``finally``
#: after a drain); nothing goes back to SERVING once a drain began (a load balancer that
#: saw "not ready" must not be told "ready" by the same process again).
TRANSITIONS: dict[Serving, dict[ServingInput, Serving]] = {
    S.STARTING: {SI.SERVE: S.SERVING, SI.DRAIN: S.DRAINING, SI.STOP: S.STOPPED},
    S.SERVING: {SI.DRAIN: S.DRAINING, SI.STOP: S.STOPPED},
    S.DRAINING: {SI.DRAIN: S.DRAINING, SI.STOP: S.STOPPED},
    S.STOPPED: {SI.STOP: S.STOPPED},
}


class ServingState:
    """The serving state of one server process (module docstring).

    Thread-safe: moves take a lock (two threads may race to drain and stop); reads are
    one attribute load, atomic in Python, so the HTTP probes' thread reads without one.
    Move it from trio code or a thread, not from a raw signal handler (the lock is not
    reentrant; ``trio.open_signal_receiver`` delivers signals as ordinary code).
    """

    __slots__ = ("_lock", "_state")

    def __init__(self, state: Serving = Serving.STARTING) -> None:
        self._state = state
        self._lock = threading.Lock()

    @property
    def state(self) -> Serving:
        return self._state

    @property
    def name(self) -> str:
        """The state as probes print it: ``starting``, ``serving``, ``draining``, ``stopped``."""
        return self._state.value

    @property
    def ready(self) -> bool:
        """True only while SERVING: what /readyz and Health.check report."""
        return self._state is Serving.SERVING

    def step(self, event: ServingInput) -> Serving:
        """Apply ``event``; returns the new state. An illegal move raises
        ``LocalProtocolError`` and leaves the state as it was."""
        with self._lock:
            current = self._state
            following = TRANSITIONS[current].get(event)
            if following is None:
                raise LocalProtocolError(f"serving state {current.value}: {event.value} is illegal")
            self._state = following
            return following

    def serve(self) -> None:
        """STARTING -> SERVING (call once the listeners are bound)."""
        self.step(ServingInput.SERVE)

    def drain(self) -> None:
        """-> DRAINING: readiness turns false at once, before listeners close (serving-notes
        F2: endpoint removal races the signal, so readiness must drop first)."""
        self.step(ServingInput.DRAIN)

    def stop(self) -> None:
        """-> STOPPED (serve returned)."""
        self.step(ServingInput.STOP)

    def __repr__(self) -> str:
        return f"<ServingState {self.name}>"


# ---------------------------------------------------------------------- the Health server


class HealthServer(Health.Server):
    """Answers Health.check from a ServingState (module docstring).

    ``services``: names besides "" that ``check`` knows (e.g. the application's interface,
    ``"Calculator"``), reported with the server's own status; any other name is
    ``serviceUnknown``, so a client that asks for the wrong service finds out instead of
    being told ``serving``.
    """

    def __init__(self, state: ServingState, services: Iterable[str] = ()) -> None:
        self.state = state
        self.services = frozenset(services) | {""}

    def status(self, service: str) -> ServingStatus:
        if service not in self.services:
            return ServingStatus.serviceUnknown
        return ServingStatus.serving if self.state.ready else ServingStatus.notServing

    def check(
        self, params: Health.CheckParams.Reader, results: Health.CheckResults.Builder
    ) -> None:
        results.status = self.status(params.service)


# ---------------------------------------------------------------------- routing


def with_health(app_hook: Hook | None, health_hook: Hook) -> Hook:
    """A bootstrap hook that sends Health calls to ``health_hook`` and every other call to
    ``app_hook`` (module docstring); with no ``app_hook``, other calls fail
    ``unimplemented``.

    Ownership: takes over the caller's references to both hooks (they are released when
    the returned hook's last owner lets go) and returns a new hook with one reference,
    owned by the caller, as every hook starts (capsvc.rpc.hooks). ``serve`` may then
    ``add_ref()`` it per connection as it does any bootstrap.

    Identity: the returned hook is a capability of its own, not the application's. The
    peer sees one export for it per connection, and a promise never settles to it.
    Where the application hands out its own object (``getSelf()``), the peer gets the
    application's capability, a different one, on which Health is not routed: only the
    bootstrap carries Health. The hook is never a promise (``is_promise`` false), so it is
    exported as senderHosted even when ``app_hook`` is a promise: calls reach us and wait
    in that promise, in order, as they would without routing.
    """
    return LocalServerHook(_Routes(app_hook, health_hook), _ROUTER)


class _Routes:
    """The routing hook's "server": the two hooks it owns, and which gets a call."""

    __slots__ = ("app", "health")

    def __init__(self, app: Hook | None, health: Hook) -> None:
        self.app = app
        self.health: Hook | None = health

    def route(self, call: OutgoingCall) -> None:
        # Health's interface ID picks the health server; everything else is the app's.
        # The call goes on synchronously, so call.from_peer still holds for the target
        # (a plain app method still runs inline, in the pass that read the Call).
        target = self.health if call.interface_id == HEALTH_INTERFACE_ID else self.app
        if target is not None:
            target.call(call)
            return
        if self.health is None:  # disposed: no owner is left, yet a call came
            error: RpcError = Failed("this bootstrap capability was released")
        else:
            error = Unimplemented(
                f"{names.method_label(call.interface_id, call.method_id)}: this server has no "
                "application bootstrap; it serves only Health (schemas/health.capnp)"
            )
        # What a BrokenHook does with a call: the params and our reference to the result
        # are ours to release (capsvc.rpc.hooks.OutgoingCall).
        call.params.release()
        call.result.set_error(error)
        call.result.release()

    def _capsvc_forget_hook(self, hook: LocalServerHook) -> None:
        """The routing hook's last owner let go (LocalServerHook._dispose): release what
        it owned, so the app's and the health server's hooks are disposed in turn."""
        app, self.app = self.app, None
        health, self.health = self.health, None
        if app is not None:
            app.release()
        if health is not None:
            health.release()


class _RoutingExecutor:
    """Runs a call on the routing hook by handing it on at once (capsvc.rpc.hooks.Executor).

    LocalServerHook.call appends the call to ``pending`` and then starts it; this takes it
    straight off again, so ``pending`` never holds more than the call being routed and
    calls keep their arrival order (rpc-protocol.md §13.1): each is handed on before the
    next can arrive, even one made re-entrantly by an inline app method.
    """

    def start(self, hook: LocalServerHook, call: OutgoingCall) -> None:
        taken = hook.pending.popleft()
        assert taken is call
        routes = hook.server
        assert isinstance(routes, _Routes)
        routes.route(call)


_ROUTER = _RoutingExecutor()


class HealthRouted:
    """A bootstrap value for ``capsvc.serve``: ``app`` (a Server, a Client, or None) with
    the Health server beside it, for code that calls ``capsvc.serve`` itself::

        state = ServingState()
        bootstrap = HealthRouted(MyApp(), HealthServer(state))
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:4000", bootstrap)
        state.serve()

    Each hook asked of it (``serve`` asks once) is a new router over new references to
    ``app`` and ``health``.
    """

    __slots__ = ("app", "health")

    def __init__(self, app: Any, health: HealthServer) -> None:
        self.app = app
        self.health = health

    def _capsvc_hook(self) -> Hook:
        from capsvc.structs import _hook_of

        return with_health(_hook_of(self.app), self.health._capsvc_hook())


# ---------------------------------------------------------------------- the client


class HealthCheckError(CapsvcError):
    """A health check got no status: the address is unreachable, the server does not
    serve Health, or it did not answer in time. The message says which."""


# ASYNC109 prefers a caller's cancel scope to a timeout parameter; this is a probe's
# whole budget (``capsvc health --timeout``), and an expiry must be a HealthCheckError
# naming it, which a caller's scope could not give.
async def check(address: str, *, service: str = "", timeout: float = 5.0) -> str:  # noqa: ASYNC109
    """Ask the server at ``address`` (``tcp:HOST:PORT``, ``unix:PATH``) how ``service``
    ("" for the server as a whole) is: the ServingStatus name (``serving``, ``notServing``,
    ``serviceUnknown``, ``unknown``). Connecting and the call together get ``timeout``
    seconds. Raises HealthCheckError when no status comes back; ValueError for an
    address that is not one."""
    if not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    # Here, not at the top: capsvc.api is to import this module (serve's Health routing).
    from capsvc.api import connect
    from capsvc.connection import Connection

    status: str | None = None
    failure: Exception | None = None
    opened: list[Connection] = []
    with trio.move_on_after(timeout) as budget:
        try:
            async with connect(address) as conn:
                opened.append(conn)
                try:
                    with conn.bootstrap(Health) as health:
                        status = (await health.check(service=service)).status.name
                except Exception as error:  # each kind of failure, said plainly (below)
                    failure = error
                # The answer is in: closing may not hold it up for the rest of the budget
                # (a peer that went away can keep a graceful close waiting).
                budget.deadline = min(budget.deadline, trio.current_time() + _CLOSE_SECONDS)
        except ValueError:
            raise
        except Exception as error:  # connecting failed, or the close did after a failure
            failure = failure or error
    if status is not None:
        return status
    if failure is None:
        raise HealthCheckError(f"{address}: no answer within {timeout:g} s")
    aborted = opened[0].session.abort_reason if opened else None
    if aborted is not None:
        # We aborted the connection: what answered broke the protocol (an HTTP server, a
        # TLS port, ...). Say that, not the Disconnected the abort left the call with.
        what = f"what answers there does not speak Cap'n Proto RPC: {aborted}"
        raise HealthCheckError(f"{address}: {what}") from failure
    raise HealthCheckError(f"{address}: {_describe(failure)}") from failure


def _describe(error: BaseException) -> str:
    """What went wrong, for a person: the first leaf of a group, by kind."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, Unimplemented):
        return (
            "the server does not serve Health (schemas/health.capnp) on its bootstrap: "
            f"{error.reason}"
        )
    if isinstance(error, RpcError):
        return f"the health check failed ({type(error).__name__.lower()}): {error.reason}"
    if isinstance(error, ProtocolError):
        return f"the server does not speak Cap'n Proto RPC as expected: {error}"
    if isinstance(error, OSError):
        return f"cannot connect: {error.strerror or error}"
    if isinstance(error, (trio.BrokenResourceError, trio.ClosedResourceError, EOFError)):
        return "the connection broke before an answer came"
    return f"{type(error).__name__}: {error}"


def main_health(address: str, service: str = "", timeout: float = 5.0) -> int:
    """``capsvc health ADDR``: print ``ADDR: STATUS`` (with the service, if one was
    asked) and return the exit status: 0 iff the status is ``serving``, 1 otherwise
    (another status, or no status: the reason goes to stderr), 2 for an address that is
    not one (the CLI's usage-error status)."""
    try:
        status = trio.run(partial(check, address, service=service, timeout=timeout))
    except HealthCheckError as error:
        print(f"capsvc: error: {error}", file=sys.stderr, flush=True)
        return 1
    except ValueError as error:
        print(f"capsvc: error: {error}", file=sys.stderr, flush=True)
        return 2
    what = f"{address} {service}" if service else address
    print(f"{what}: {status}", flush=True)
    return 0 if status == ServingStatus.serving.name else 1
