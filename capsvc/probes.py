"""The side HTTP listener of ``capsvc serve --http-port``: liveness, readiness, metrics.

Theory of operation: Kubernetes ``httpGet`` probes, Consul HTTP checks and Prometheus
speak HTTP, not Cap'n Proto, so a server that wants them unchanged answers them on a port
of its own. :func:`start_http` binds that port (only the host it is given: the CLI's
default is loopback) and serves it from a daemon thread with the standard library's
threading HTTP server, so it works beside a trio loop in the same process (it never
touches the loop) and in a supervisor process that runs no loop at all.

- ``GET /healthz``: 200 ``ok`` while the process can answer at all (liveness);
- ``GET /readyz``: 200 ``ready`` while the ServingState is SERVING, else 503 with the
  state's name (``starting``, ``draining``, ``stopped``), so a load balancer stops
  sending new connections as soon as a drain begins (capsvc.health);
- ``GET /metrics``: the registry in the Prometheus text format (or OpenMetrics, when
  the scraper's Accept header asks for it; gzip when it accepts that), through
  prometheus-client's encoders; 404 when no registry was given (probes without the
  ``metrics`` extra);
- HEAD of each: the same status and headers, no body; any other path: 404.

Requests are logged on the ``capsvc`` logger at DEBUG (a probe every few seconds must not
flood a log), errors while answering at WARNING; nothing goes to stderr directly.
"""

from __future__ import annotations

import gzip
import logging
import socket
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from capsvc.health import Serving, ServingState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["HttpProbes", "start_http"]

log = logging.getLogger("capsvc")

_TEXT = "text/plain; charset=utf-8"
#: How long one request may take to arrive: a client that opens a connection and sends
#: nothing must not hold a thread for ever.
REQUEST_TIMEOUT = 10.0
#: How often the serving thread looks for ``close()`` (socketserver polls): ``close``
#: returns within about this long.
_POLL_INTERVAL = 0.05


class HttpProbes:
    """A running probe listener (module docstring). ``port`` is the port bound (the
    kernel's choice when 0 was asked); ``close()`` stops it and waits for its thread."""

    def __init__(self, server: _ProbeServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        # The address bound: (host, port) for IPv4, (host, port, flow, scope) for IPv6.
        self.host: str = str(server.server_address[0])
        self.port: int = int(server.server_address[1])
        self._closed = False

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop answering and release the port. Blocks up to about 50 ms (the serving
        thread's poll); from trio, ``await trio.to_thread.run_sync(probes.close)`` if that
        matters. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        log.info("http probes on %s closed", self.url)

    def __enter__(self) -> HttpProbes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_http(
    host: str, port: int, state: ServingState, registry: CollectorRegistry | None = None
) -> HttpProbes:
    """Listen on ``host:port`` (port 0: any free port) and answer the probes from a
    daemon thread; returns at once, bound (an OSError if the address cannot be bound)."""
    family, address = _bind_address(host, port)
    server = _ProbeServer(address, family, state, registry)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": _POLL_INTERVAL},
        name="capsvc http probes",
        daemon=True,  # never keeps the process alive: the RPC server decides when it ends
    )
    thread.start()
    probes = HttpProbes(server, thread)
    log.info(
        "http probes on %s (/healthz, /readyz%s)",
        probes.url,
        ", /metrics" if registry is not None else "",
    )
    return probes


def _bind_address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """The family and socket address for ``host`` (a name, an IPv4 or IPv6 literal):
    the resolver's first answer, so "::1" binds IPv6 and "127.0.0.1" IPv4, and nothing
    else is bound."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int from 0 to 65535, got {port!r}")
    infos = socket.getaddrinfo(host or None, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    return family, address


class _ProbeServer(ThreadingHTTPServer):
    """The HTTP server, holding what the handlers answer from."""

    daemon_threads = True  # a request thread never delays the process's exit

    def __init__(
        self,
        address: tuple[Any, ...],
        family: socket.AddressFamily,
        state: ServingState,
        registry: CollectorRegistry | None,
    ) -> None:
        self.address_family = family
        self.state = state
        self.registry = registry
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind also asks socket.getfqdn(host): a reverse DNS lookup that
        # can stall for seconds, for a name nothing here uses.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints the traceback to stderr; ours go to the log. A client that
        # hung up mid-answer is its own business (DEBUG).
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            log.debug("http probes: %s went away: %s", client_address, error)
            return
        log.warning("http probes: error answering %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _ProbeServer
    server_version = "capsvc-probes"
    timeout = REQUEST_TIMEOUT

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        path = urlsplit(self.path).path
        headers: list[tuple[str, str]] = []
        if path == "/healthz":
            status, content_type, body = 200, _TEXT, b"ok\n"
        elif path == "/readyz":
            # One read of the state: the name and the verdict agree even if it moves now.
            current = self.server.state.state
            if current is Serving.SERVING:
                status, content_type, body = 200, _TEXT, b"ready\n"
            else:
                status, content_type, body = 503, _TEXT, f"{current.value}\n".encode()
        elif path == "/metrics" and self.server.registry is not None:
            status = 200
            content_type, body, headers = _metrics(
                self.server.registry,
                self.headers.get("Accept", ""),
                self.headers.get("Accept-Encoding", ""),
            )
        else:
            status, content_type, body = 404, _TEXT, b"not found\n"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")  # a probe's answer is of its moment
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http probes: %s %s", self.address_string(), format % args)


def _metrics(
    registry: CollectorRegistry, accept: str, accept_encoding: str
) -> tuple[str, bytes, list[tuple[str, str]]]:
    """The exposition the scraper asked for (prometheus-client's own choice of format)."""
    from prometheus_client.exposition import choose_encoder, gzip_accepted

    encoder, content_type = choose_encoder(accept)
    body = encoder(registry)
    if gzip_accepted(accept_encoding):
        return content_type, gzip.compress(body), [("Content-Encoding", "gzip")]
    return content_type, body, []
