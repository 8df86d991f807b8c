"""Prometheus metrics of a capsvc server (``pip install capsvc[metrics]``).

Theory of operation: the metrics are prometheus-client collectors in its default
registry, created once per process on first use (importing this module registers
nothing). What they count:

==================================  =========  ================================================
``capsvc_connections_total``        counter    connections a server accepted
``capsvc_connections_open``         gauge      connections open now
``capsvc_calls_total``              counter    calls peers made to us, as they arrive; by
                                               ``method`` (``Interface.method``)
``capsvc_call_errors_total``        counter    those that ended in an error, by ``method`` and
                                               ``type`` (failed, overloaded, disconnected,
                                               unimplemented; canceled: the caller gave up)
``capsvc_call_duration_seconds``    histogram  from the call's arrival until its results or
                                               error were ready (or it was canceled), by
                                               ``method``; its ``_count`` is calls completed
``capsvc_calls_in_flight``          gauge      calls arrived and not yet settled
``capsvc_received_bytes_total``     counter    bytes read from served connections
``capsvc_sent_bytes_total``         counter    bytes written to them
==================================  =========  ================================================

Calls are counted by a call observer (capsvc.observe): :func:`enable` registers
:func:`metrics_observer` as an instrumentation, so every connection a server accepts from
then on is watched (a connection we opened is not: its calls are the peer's to count).
The observer keeps, per (interface ID, method ordinal), the labelled children of each
metric, so a call costs a dict lookup, a counter and a gauge update and a clock read when
it arrives, and a gauge update, a histogram observation and a clock read when it settles.
Connections and bytes are the server's to report (it knows when a connection opens and closes):
:func:`connection_opened` gives a :class:`ConnectionMetrics` that takes the connection's
running byte totals (``report``, ``close``) and adds what grew since the last report.

Multiprocess mode: with ``PROMETHEUS_MULTIPROC_DIR`` set in a worker's environment
*before prometheus_client is first imported there* (it picks its value class then), each
worker writes its metrics to files in that directory, and a supervisor serves the sum:
:func:`registry_for_scrape` (a registry with a ``MultiProcessCollector``). The gauges are
``livesum``: only live workers count, once the supervisor calls :func:`mark_worker_dead`
for a worker that exited. Counters and histograms of dead workers stay in the sum, so the
totals never go down when a worker is replaced (Prometheus counter semantics).
:func:`reset_multiproc_dir` empties the directory before the workers start
(prometheus-client: files of an earlier run would be summed in).
"""

from __future__ import annotations

import glob
import logging
import os
import threading
import time
from collections.abc import Callable

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client import multiprocess as _multiprocess
    from prometheus_client import values as _values
except ImportError as error:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "capsvc.metrics needs prometheus-client: pip install 'capsvc[metrics]'"
    ) from error

from capsvc import names
from capsvc.errors import RpcError
from capsvc.observe import (
    ConnectionInfo,
    add_instrumentation,
    exception_type,
    remove_instrumentation,
)
from capsvc.rpc.hooks import CallObserver, CallResult, Canceled, ObservedCall
from capsvc.rpc.payload import Payload

__all__ = [
    "DURATION_BUCKETS",
    "ConnectionMetrics",
    "add_bytes",
    "connection_opened",
    "disable",
    "enable",
    "is_enabled",
    "mark_worker_dead",
    "metrics_observer",
    "multiprocess_enabled",
    "registry_for_scrape",
    "reset_multiproc_dir",
]

log = logging.getLogger("capsvc")

#: Call durations, in seconds: 100 µs (a loopback call of a plain method) to 10 s, about
#: 2.5x apart. A call longer than 10 s falls in +Inf only.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

#: The ``method`` label of a call to a method no schema here defines. Label values must
#: stay few (Prometheus: every label value is a time series): the IDs come from the
#: peer, and a peer that sends random ones must not make a series per call.
UNKNOWN_METHOD = "unknown"


class _Collectors:
    """Every capsvc metric (module docstring), registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Counter(
            "capsvc_connections", "Connections accepted by capsvc servers.", registry=registry
        )
        self.connections_open = Gauge(
            "capsvc_connections_open",
            "Connections open now on capsvc servers.",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.calls = Counter(
            "capsvc_calls",
            "Calls peers made to capsvc servers, counted as they arrive.",
            ["method"],
            registry=registry,
        )
        self.errors = Counter(
            "capsvc_call_errors",
            "Calls to capsvc servers that ended in an error, by exception type.",
            ["method", "type"],
            registry=registry,
        )
        self.duration = Histogram(
            "capsvc_call_duration_seconds",
            "Time from a call's arrival until its results or error were ready.",
            ["method"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "capsvc_calls_in_flight",
            "Calls to capsvc servers that arrived and have not settled yet.",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.received_bytes = Counter(
            "capsvc_received_bytes", "Bytes read from served connections.", registry=registry
        )
        self.sent_bytes = Counter(
            "capsvc_sent_bytes", "Bytes written to served connections.", registry=registry
        )


_LOCK = threading.Lock()
_COLLECTORS: list[_Collectors] = []  # at most one: defined once per process
_ENABLED = False


def _collectors() -> _Collectors:
    """The process's collectors, created in the default registry on first use (a metric
    name registers once per registry: a second creation would raise)."""
    if _COLLECTORS:
        return _COLLECTORS[0]
    with _LOCK:
        if not _COLLECTORS:
            _COLLECTORS.append(_Collectors(REGISTRY))
        return _COLLECTORS[0]


# ---------------------------------------------------------------------- turning it on


def enable() -> None:
    """Count the calls of every connection a server accepts from now on (creating the
    metrics if this is the first use). Idempotent."""
    global _ENABLED
    _check_multiprocess_setup()
    _collectors()
    add_instrumentation(metrics_observer)
    _ENABLED = True


def disable() -> None:
    """Stop watching connections accepted from now on (the metrics stay registered, with
    what they counted: a counter never goes back)."""
    global _ENABLED
    remove_instrumentation(metrics_observer)
    _ENABLED = False


def is_enabled() -> bool:
    """True between :func:`enable` and :func:`disable`: the server should then report
    its connections (:func:`connection_opened`)."""
    return _ENABLED


def multiprocess_enabled() -> bool:
    """True if this process writes its metrics to ``PROMETHEUS_MULTIPROC_DIR`` files
    (decided when prometheus_client was first imported in the process)."""
    return _values.ValueClass is not _values.MutexValue


def _check_multiprocess_setup() -> None:
    configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if configured and not multiprocess_enabled():
        # prometheus_client read the environment at its import, before the variable was
        # set: this worker's metrics stay in its memory, and the supervisor never sees them.
        log.warning(
            "PROMETHEUS_MULTIPROC_DIR is set but prometheus_client was imported before it "
            "was: this process's metrics are not written to %s; set it before the process "
            "starts",
            configured,
        )
    elif multiprocess_enabled():
        path = configured or os.environ.get("prometheus_multiproc_dir", "")
        if not os.path.isdir(path):
            raise ValueError(
                f"PROMETHEUS_MULTIPROC_DIR={path!r} is not a directory: create it (and empty "
                "it) before the workers start (capsvc.metrics.reset_multiproc_dir)"
            )


# ---------------------------------------------------------------------- calls


def metrics_observer(connection: ConnectionInfo) -> CallObserver | None:
    """The call observer of one connection (a capsvc.observe Instrumentation): counts the
    calls a peer makes to a server; None for a connection we opened (not counted)."""
    if not connection.served:
        return None
    _collectors()
    return _ServedCalls(connection)


class _Method:
    """The labelled children of one method's metrics (made once per method, not per call)."""

    __slots__ = ("_errors", "_family", "calls", "duration", "in_flight", "label")

    def __init__(self, collectors: _Collectors, label: str) -> None:
        self.label = label
        self.calls = collectors.calls.labels(label)
        self.duration = collectors.duration.labels(label)
        self.in_flight = collectors.in_flight
        self._family = collectors.errors
        self._errors: dict[str, Counter] = {}

    def errors(self, kind: str) -> Counter:
        child = self._errors.get(kind)
        if child is None:  # kinds are the five exception types: few children
            child = self._errors[kind] = self._family.labels(self.label, kind)
        return child


#: (interface ID, method ordinal) -> its children, for methods a schema here defines.
_BY_KEY: dict[tuple[int, int], _Method] = {}
_UNKNOWN: list[_Method] = []


def _method(interface_id: int, method_id: int) -> _Method:
    key = (interface_id, method_id)
    found = _BY_KEY.get(key)
    if found is not None:
        return found
    label = names.schema_method_name(interface_id, method_id)
    if label is None:
        # Not remembered under its key: a schema defining it may be loaded later (as
        # capsvc.names does), and the peer picks the keys (UNKNOWN_METHOD).
        if not _UNKNOWN:
            _UNKNOWN.append(_Method(_collectors(), UNKNOWN_METHOD))
        return _UNKNOWN[0]
    method = _BY_KEY[key] = _Method(_collectors(), label)
    return method


class _ServedCalls:
    """The call observer of one served connection (capsvc.rpc.hooks.CallObserver)."""

    __slots__ = ("connection",)

    def __init__(self, connection: ConnectionInfo) -> None:
        self.connection = connection

    def received(self, interface_id: int, method_id: int, params: Payload) -> ObservedCall:
        method = _BY_KEY.get((interface_id, method_id)) or _method(interface_id, method_id)
        method.calls.inc()
        method.in_flight.inc()
        return _Timed(method, self.connection, time.perf_counter())

    def sent(self, interface_id: int, method_id: int) -> Callable[[CallResult], None]:
        return _ignore


def _ignore(result: CallResult) -> None:
    """Calls a server makes to its peers are the peers' calls to count."""


class _Timed:
    """One call being counted: settles the in-flight gauge, duration and errors once."""

    __slots__ = ("connection", "method", "started")

    def __init__(self, method: _Method, connection: ConnectionInfo, started: float) -> None:
        self.method = method
        self.connection = connection
        self.started = started

    def enter(self) -> object:
        return None

    def exit(self, token: object) -> None:
        pass

    def __call__(self, result: CallResult) -> None:
        method = self.method
        method.in_flight.dec()
        method.duration.observe(time.perf_counter() - self.started)
        error = result.error
        if error is not None:
            method.errors(_error_type(error, self.connection)).inc()


def _error_type(error: RpcError, connection: ConnectionInfo) -> str:
    """The ``type`` label: rpc.capnp's exception type, or ``canceled`` for a call its
    caller gave up on (``disconnected`` when the connection ended under it, as the access
    log says: capsvc.observe.outcome)."""
    if isinstance(error, Canceled):
        return "disconnected" if connection.closed() else "canceled"
    return exception_type(error)


# ---------------------------------------------------------------------- connections, bytes


def connection_opened() -> ConnectionMetrics:
    """A server accepted a connection: count it, and get what reports its bytes."""
    collectors = _collectors()
    collectors.connections.inc()
    collectors.connections_open.inc()
    return ConnectionMetrics(collectors)


class ConnectionMetrics:
    """One open connection's part in the connection and byte metrics.

    ``report(received, sent)`` takes the connection's running totals (its
    ``bytes_received``/``bytes_sent``) and adds what they grew by since the last report,
    so a periodic task and the close may both report without counting a byte twice.
    ``close`` reports a last time and takes the connection out of ``connections_open``;
    it is idempotent.
    """

    __slots__ = ("_collectors", "_open", "_received", "_sent")

    def __init__(self, collectors: _Collectors) -> None:
        self._collectors = collectors
        self._received = 0
        self._sent = 0
        self._open = True

    def report(self, received: int, sent: int) -> None:
        # A counter only goes up (Prometheus counter semantics), and so do a connection's
        # totals: a total below the highest reported adds nothing and changes nothing.
        if received > self._received:
            self._collectors.received_bytes.inc(received - self._received)
            self._received = received
        if sent > self._sent:
            self._collectors.sent_bytes.inc(sent - self._sent)
            self._sent = sent

    def close(self, received: int, sent: int) -> None:
        self.report(received, sent)
        if self._open:
            self._open = False
            self._collectors.connections_open.dec()


def add_bytes(received: int, sent: int) -> None:
    """Add byte counts (deltas, not totals) to the byte counters directly; negative
    counts are refused (a counter never goes down)."""
    if received < 0 or sent < 0:
        raise ValueError(f"byte counts must be >= 0, got received={received}, sent={sent}")
    collectors = _collectors()
    if received:
        collectors.received_bytes.inc(received)
    if sent:
        collectors.sent_bytes.inc(sent)


# ---------------------------------------------------------------------- scraping


def registry_for_scrape(multiproc_dir: str | None) -> CollectorRegistry:
    """The registry /metrics serves: this process's default registry, or, given the
    workers' ``PROMETHEUS_MULTIPROC_DIR``, a fresh registry whose one collector sums
    every worker's files there (prometheus-client's multiprocess mode; the supervisor
    must not serve its own default registry, whose values would not be the workers')."""
    if multiproc_dir is None:
        return REGISTRY
    if not os.path.isdir(multiproc_dir):
        raise ValueError(f"the multiprocess metrics directory {multiproc_dir!r} does not exist")
    registry = CollectorRegistry()
    _multiprocess.MultiProcessCollector(registry, path=multiproc_dir)  # type: ignore[no-untyped-call]
    return registry


def mark_worker_dead(pid: int, multiproc_dir: str) -> None:
    """A worker exited: its live gauges (connections open, calls in flight) leave the sum;
    its counters and histograms stay (module docstring)."""
    _multiprocess.mark_process_dead(pid, multiproc_dir)  # type: ignore[no-untyped-call]


def reset_multiproc_dir(multiproc_dir: str) -> None:
    """Create ``multiproc_dir`` if needed and remove the metric files of an earlier run
    (call in the supervisor before starting workers: prometheus-client sums every file
    there, including those of processes long gone)."""
    os.makedirs(multiproc_dir, exist_ok=True)
    for path in glob.glob(os.path.join(multiproc_dir, "*.db")):
        os.remove(path)
