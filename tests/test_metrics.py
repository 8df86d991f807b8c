"""Prometheus metrics and the HTTP probes (capsvc.metrics, capsvc.probes; issue 13 point 3).

- a server on loopback TCP with the metrics observer on: calls, errors by type, durations
  and calls in flight, by ``Interface.method``, read from the /metrics text of real HTTP
  requests (urllib, in a thread); canceled and disconnected calls; unknown methods under
  one label; the connection and byte counters;
- /healthz and /readyz as the ServingState moves, HEAD, 404, the port closing;
- multiprocess mode: two worker subprocesses write their metrics to a directory, and an
  aggregating registry (what a supervisor serves) sums them; a dead worker's live gauges
  leave the sum, its counters stay.

The metrics live in prometheus-client's default registry, once per process, so every
check compares the figures before and after (other tests may count calls too).
"""

from __future__ import annotations

import gzip
import logging
import os
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import capsvc
import capsvc.metrics
from capsvc import typed
from capsvc.generated.echo_capnp import Echo
from capsvc.health import ServingState
from capsvc.observe import ConnectionInfo
from capsvc.probes import HttpProbes, start_http
from tests.support.checks import poll_until
from tests.support.peers import PYTHON, ROOT, peer_env

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

# Straight to 127.0.0.1: a proxy from the environment (http_proxy) must not see these.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(url: str, method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    """One request: (status, body, headers), whatever the status."""
    request = urllib.request.Request(url, method=method)
    try:
        with _OPENER.open(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read(), dict(error.headers)


async def get(url: str, method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    """``http`` in a thread, so the trio loop (and the server on it) keeps running."""
    return await trio.to_thread.run_sync(partial(http, url, method))


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(probes: HttpProbes) -> Samples:
    status, body, headers = await get(probes.url + "/metrics")
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
    return parse(body.decode())


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def metrics_on() -> Iterator[None]:
    capsvc.metrics.enable()
    yield
    capsvc.metrics.disable()


@pytest.fixture
def probes() -> Iterator[HttpProbes]:
    with start_http("127.0.0.1", 0, ServingState(), REGISTRY) as running:
        yield running


class App(Echo.Server):
    """``ping`` echoes, fails (``fail``) or waits to be let go (``block``); ``pingData``
    is not implemented."""

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.release = trio.Event()

    async def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        if params.msg == "fail":
            raise capsvc.Overloaded("busy")
        if params.msg == "block":
            self.entered.set()
            await self.release.wait()
        results.reply = params.msg


@asynccontextmanager
async def served(app: App) -> AsyncIterator[Echo.Client]:
    """``app`` served on loopback TCP, and a client of it, for the block."""
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", app)
        async with capsvc.connect(address) as conn:
            yield conn.bootstrap(Echo)
        nursery.cancel_scope.cancel()


def current(name: str, **labels: str) -> float:
    """A figure of the default registry now (for waits; the checks read /metrics)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ------------------------------------------------------------------ calls


async def test_calls_errors_durations_and_in_flight_by_method(
    metrics_on: None, probes: HttpProbes
) -> None:
    app = App()
    before = await scrape(probes)
    async with served(app) as echo, trio.open_nursery() as nursery:
        for _ in range(3):
            assert (await echo.ping(msg="ok")).reply == "ok"
        with pytest.raises(capsvc.Overloaded):
            await echo.ping(msg="fail")
        with pytest.raises(capsvc.Unimplemented):
            await echo.pingData(data=b"x")
        replies: list[str] = []

        async def blocked() -> None:
            replies.append((await echo.ping(msg="block")).reply)

        nursery.start_soon(blocked)
        await app.entered.wait()
        during = await scrape(probes)
        app.release.set()
    assert replies == ["block"]
    after = await scrape(probes)

    assert delta(before, during, "capsvc_calls_in_flight") == 1
    assert delta(before, after, "capsvc_calls_in_flight") == 0
    # Counted as they arrive: the blocked call was counted while it ran.
    assert delta(before, during, "capsvc_calls_total", method="Echo.ping") == 5
    assert delta(before, after, "capsvc_calls_total", method="Echo.ping") == 5
    assert delta(before, after, "capsvc_calls_total", method="Echo.pingData") == 1
    errors = "capsvc_call_errors_total"
    assert delta(before, after, errors, method="Echo.ping", type="overloaded") == 1
    assert delta(before, after, errors, method="Echo.ping", type="failed") == 0
    assert delta(before, after, errors, method="Echo.pingData", type="unimplemented") == 1
    # Durations: one observation per settled call, the blocked one only once it settled.
    duration = "capsvc_call_duration_seconds"
    assert delta(before, during, f"{duration}_count", method="Echo.ping") == 4
    assert delta(before, after, f"{duration}_count", method="Echo.ping") == 5
    assert delta(before, after, f"{duration}_bucket", method="Echo.ping", le="+Inf") == 5
    assert delta(before, after, f"{duration}_bucket", method="Echo.ping", le="10.0") == 5
    assert delta(before, after, f"{duration}_sum", method="Echo.ping") > 0
    buckets = sorted(
        float(dict(labels)["le"])
        for name, labels in after
        if name == f"{duration}_bucket" and dict(labels)["method"] == "Echo.ping"
    )
    assert buckets[0] == 0.0001
    assert buckets[-2:] == [10.0, float("inf")]


async def test_canceled_and_disconnected_calls(metrics_on: None, probes: HttpProbes) -> None:
    before = await scrape(probes)
    errors = "capsvc_call_errors_total"
    app = App()
    async with served(app) as echo, trio.open_nursery() as nursery:
        # The caller gives up: its Finish cancels the call on the server.
        async def give_up(scope: trio.CancelScope) -> None:
            await app.entered.wait()
            scope.cancel()

        with trio.CancelScope() as scope:
            nursery.start_soon(give_up, scope)
            await echo.ping(msg="block")
        assert scope.cancelled_caught
        # Real sockets: the server learns of the Finish when its reader gets to it.
        await poll_until(lambda: current(errors, method="Echo.ping", type="canceled") > 0)

    other = App()

    async def lose_the_connection(echo: Echo.Client) -> None:
        with pytest.raises(capsvc.Disconnected):
            await echo.ping(msg="block")

    async with trio.open_nursery() as nursery:
        async with served(other) as echo:
            nursery.start_soon(lose_the_connection, echo)
            await other.entered.wait()
        # Left `served`: the connection closed with the call still running.
    await poll_until(lambda: current(errors, method="Echo.ping", type="disconnected") > 0)
    after = await scrape(probes)
    assert delta(before, after, errors, method="Echo.ping", type="canceled") == 1
    assert delta(before, after, errors, method="Echo.ping", type="disconnected") == 1
    assert delta(before, after, "capsvc_calls_in_flight") == 0


def unknown_call(client: Echo.Client, interface_id: int) -> Echo.PingResults.Promise:
    """A call to an interface no schema here defines."""
    return typed.Request(
        client, interface_id, 0, Echo.PingParams.Builder, Echo.PingResults.Promise
    ).send()


async def test_unknown_methods_share_one_label(metrics_on: None, probes: HttpProbes) -> None:
    """The peer picks the IDs: each unknown one must not become a time series."""
    before = await scrape(probes)
    async with served(App()) as echo:
        for interface_id in (0x8000_0000_0000_0001, 0x8000_0000_0000_0002):
            with pytest.raises(capsvc.Unimplemented):
                await unknown_call(echo, interface_id)
    after = await scrape(probes)
    assert delta(before, after, "capsvc_calls_total", method="unknown") == 2
    errors = "capsvc_call_errors_total"
    assert delta(before, after, errors, method="unknown", type="unimplemented") == 2
    assert not [labels for _, labels in after if "0x" in dict(labels).get("method", "")]


def test_client_connections_are_not_observed() -> None:
    assert capsvc.metrics.metrics_observer(ConnectionInfo("x", False, lambda: False)) is None
    observer = capsvc.metrics.metrics_observer(ConnectionInfo("x", True, lambda: False))
    assert observer is not None


async def test_connections_and_bytes(probes: HttpProbes) -> None:
    before = await scrape(probes)
    tracked = capsvc.metrics.connection_opened()
    tracked.report(100, 40)
    during = await scrape(probes)
    tracked.report(150, 40)
    tracked.report(120, 40)  # below the last total: ignored (totals only grow)
    tracked.close(200, 50)
    tracked.close(200, 50)  # idempotent
    capsvc.metrics.add_bytes(5, 0)
    with pytest.raises(ValueError, match=">= 0"):
        capsvc.metrics.add_bytes(-1, 0)
    after = await scrape(probes)
    assert delta(before, during, "capsvc_connections_open") == 1
    assert delta(before, after, "capsvc_connections_open") == 0
    assert delta(before, after, "capsvc_connections_total") == 1
    assert delta(before, during, "capsvc_received_bytes_total") == 100
    assert delta(before, after, "capsvc_received_bytes_total") == 200 + 5
    assert delta(before, after, "capsvc_sent_bytes_total") == 50


async def test_serve_counts_its_connections_and_their_bytes(
    metrics_on: None, probes: HttpProbes
) -> None:
    """With metrics enabled, ``serve`` reports each connection it accepts: open while it
    lasts, its bytes once a second and at its close (capsvc.api._Served)."""
    before = await scrape(probes)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", App())
            async with capsvc.connect(address) as conn:
                echo = conn.bootstrap(Echo)
                assert (await echo.ping(msg="x" * 1000)).reply == "x" * 1000
                during = await scrape(probes)
                assert delta(before, during, "capsvc_connections_open") == 1
                # Real time: the periodic report (once a second) of a connection still open.
                while delta(before, await scrape(probes), "capsvc_received_bytes_total") == 0:  # noqa: ASYNC110
                    await trio.sleep(0.1)
            # The server sees the close in its own pass; nothing to wait on but the gauge.
            while current("capsvc_connections_open") != value(before, "capsvc_connections_open"):  # noqa: ASYNC110
                await trio.sleep(0.01)
            sent_by_client = conn.bytes_sent
            received_by_client = conn.bytes_received
            nursery.cancel_scope.cancel()
    after = await scrape(probes)
    assert delta(before, after, "capsvc_connections_total") == 1
    assert delta(before, after, "capsvc_received_bytes_total") == sent_by_client
    assert delta(before, after, "capsvc_sent_bytes_total") == received_by_client


# ------------------------------------------------------------------ the probes


async def test_readiness_moves_with_the_state_and_liveness_stays(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="capsvc")
    state = ServingState()
    with start_http("127.0.0.1", 0, state, None) as probes:
        url = probes.url
        assert probes.port != 0
        seen = []
        for move in (None, state.serve, state.drain, state.stop):
            if move is not None:
                move()
            ready = await get(url + "/readyz")
            alive = await get(url + "/healthz")
            seen.append((ready[0], ready[1], alive[0], alive[1]))
            assert ready[2]["Cache-Control"] == "no-store"
        assert seen == [
            (503, b"starting\n", 200, b"ok\n"),
            (200, b"ready\n", 200, b"ok\n"),
            (503, b"draining\n", 200, b"ok\n"),
            (503, b"stopped\n", 200, b"ok\n"),
        ]
        status, body, headers = await get(url + "/readyz", "HEAD")
        assert (status, body, headers["Content-Length"]) == (503, b"", str(len(b"stopped\n")))
        assert (await get(url + "/readyz?verbose=1"))[0] == 503  # the query is not the path
        assert (await get(url + "/nope"))[0] == 404
        assert (await get(url + "/metrics"))[0] == 404  # no registry given
        assert (await get(url + "/healthz", "POST"))[0] == 501
    # Closed: nothing listens there any more.
    with pytest.raises(urllib.error.URLError):
        await trio.to_thread.run_sync(http, url + "/healthz")
    # Requests are logged at DEBUG on the capsvc logger, not written to stderr.
    lines = [r.getMessage() for r in caplog.records if r.name == "capsvc"]
    assert any('"GET /readyz HTTP/1.1" 503' in line for line in lines), lines
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "GET /" in r.getMessage())
    assert "GET" not in capfd.readouterr().err


async def test_metrics_honour_the_scrapers_format_and_compression(probes: HttpProbes) -> None:
    def fetch(headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        request = urllib.request.Request(probes.url + "/metrics", headers=headers)
        with _OPENER.open(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)

    capsvc.metrics.connection_opened().close(0, 0)  # the metrics exist
    status, body, headers = await trio.to_thread.run_sync(
        fetch, {"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")

    status, body, headers = await trio.to_thread.run_sync(fetch, {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert b"capsvc_connections_total" in gzip.decompress(body)


# ------------------------------------------------------------------ multiprocess mode

WORKER = r"""
import os, sys, trio, capsvc, capsvc.metrics
from capsvc.generated.echo_capnp import Echo

class App(Echo.Server):
    def ping(self, params, results):
        results.reply = params.msg

async def main(calls):
    capsvc.metrics.enable()
    # A connection left open: this worker's share of the live gauge.
    capsvc.metrics.connection_opened().report(1000, 10)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", App())
        async with capsvc.connect(address) as conn:
            echo = conn.bootstrap(Echo)
            for _ in range(calls):
                assert (await echo.ping(msg="x")).reply == "x"
        nursery.cancel_scope.cancel()
    print(os.getpid(), capsvc.metrics.multiprocess_enabled(), flush=True)

trio.run(main, int(sys.argv[1]))
"""


async def test_multiprocess_workers_are_summed(tmp_path: Path) -> None:
    directory = str(tmp_path / "metrics")
    os.makedirs(directory)
    (Path(directory) / "counter_1.db").write_bytes(b"stale")  # an earlier run's file
    capsvc.metrics.reset_multiproc_dir(directory)
    assert os.listdir(directory) == []
    env = dict(peer_env(), PROMETHEUS_MULTIPROC_DIR=directory)
    done: dict[int, bytes] = {}

    async def worker(calls: int) -> None:
        # Real time: another process; the limit only bounds a hung one.
        with trio.fail_after(60):
            result = await trio.run_process(
                [PYTHON, "-c", WORKER, str(calls)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=ROOT,
                env=env,
            )
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        done[calls] = result.stdout

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker, 3)
        nursery.start_soon(worker, 4)
    pids = []
    for calls in (3, 4):
        pid, multiprocess = done[calls].decode().split()
        assert multiprocess == "True"
        pids.append(int(pid))

    registry = capsvc.metrics.registry_for_scrape(directory)
    assert registry is not REGISTRY
    with start_http("127.0.0.1", 0, ServingState(), registry) as probes:
        summed = await scrape(probes)
        assert value(summed, "capsvc_calls_total", method="Echo.ping") == 7
        assert value(summed, "capsvc_call_duration_seconds_count", method="Echo.ping") == 7
        assert value(summed, "capsvc_calls_in_flight") == 0
        # Per worker: the connection its server accepted (counted by serve, closed) and
        # the one reported by hand and left open in its file.
        assert value(summed, "capsvc_connections_total") == 4
        assert value(summed, "capsvc_connections_open") == 2
        assert value(summed, "capsvc_received_bytes_total") > 2000  # + the served bytes
        capsvc.metrics.mark_worker_dead(pids[0], directory)
        one_dead = await scrape(probes)
        capsvc.metrics.mark_worker_dead(pids[1], directory)
        both_dead = await scrape(probes)
    # Live gauges leave with their worker; counters and histograms stay in the sum.
    assert value(one_dead, "capsvc_connections_open") == 1
    assert value(both_dead, "capsvc_connections_open") == 0
    assert value(both_dead, "capsvc_calls_total", method="Echo.ping") == 7
    assert value(both_dead, "capsvc_connections_total") == 4
    assert capsvc.metrics.registry_for_scrape(None) is REGISTRY
    with pytest.raises(ValueError, match="does not exist"):
        capsvc.metrics.registry_for_scrape(str(tmp_path / "missing"))


def test_a_multiproc_dir_set_too_late_is_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """This process imported prometheus_client without the variable: its metrics stay in
    memory, which ``enable`` says rather than letting the supervisor see nothing."""
    assert not capsvc.metrics.multiprocess_enabled()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    caplog.set_level(logging.WARNING, logger="capsvc")
    capsvc.metrics.enable()
    capsvc.metrics.disable()
    assert any("imported before" in r.getMessage() for r in caplog.records), caplog.records
