"""Echo clients with a blocking API: connect once, then ``run(calls)`` as often as asked.

Theory of operation
-------------------
pyperf's worker calls a plain function ``time_func(loops)`` several times per process and
wants the seconds that ``loops`` calls took. An RPC client, though, lives inside an event
loop (trio for capsvc and the raw ping-pong, asyncio + KJ for pycapnp) and should keep its
one connection for the whole process, like a real client. So each client runs its event
loop in a thread of its own, connected once; ``run(calls)`` hands the work to that loop
(``trio.from_thread.run`` / ``asyncio.run_coroutine_threadsafe``) and blocks until it is
done. The timing is taken *inside* the loop, around the calls only; the hand-over costs
nothing that is measured, and the calling thread sleeps in a lock meanwhile (no GIL
contention).

``run(calls, latencies)`` makes exactly ``calls`` calls from ``concurrency`` tasks on the
one connection (each task loops ``await ping(...)``; a shared counter says when to stop,
so at most ``concurrency`` calls are outstanding) and, when ``latencies`` is a list,
appends each call's latency in nanoseconds (from just before the call to the decoded,
checked reply). At concurrency 1 the loop runs in the calling task (no nursery).

The raw trio client is the ceiling: a request frame of the same size as capsvc's Call,
a reply of the same size as its Return (``frame_sizes`` measures them with capsvc over a
memory stream), plain ``trio.SocketStream`` I/O. At concurrency 1 the task sends then reads
its reply itself; at higher concurrency, sends are serialised by a lock and one reader
task hands replies to the waiting callers in FIFO order. Its ``raw-poll`` variant receives
through ``servers.raw_receiver`` with busy polling, as its server does: the ceiling for
capsvc with busy polling on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Self

from bench.rpc.scenarios import BENCH_ECHO_SCHEMA, ECHO_SCHEMA
from bench.rpc.servers import FRAME_HEADER, PassCounter, raw_receiver

OneCall = Callable[[], Awaitable[None]]


class EchoClient:
    """Base: an event loop in a thread, connected to one server."""

    def __init__(self, address: str, concurrency: int, payload: int) -> None:
        self.address = address
        self.concurrency = concurrency
        self.payload = payload
        self.message = "x" * payload
        self.calls = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="echo-client", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise RuntimeError(f"client could not connect to {self.address}") from self._error
        return self

    def run(self, calls: int, latencies: list[int] | None = None) -> float:
        """Make ``calls`` calls; return the seconds they took (see the module docstring)."""
        raise NotImplementedError

    def stats(self) -> dict[str, float]:
        """Cumulative counters of the client side (``passes``, ``writes`` where known)."""
        return {}

    def close(self) -> None:
        raise NotImplementedError

    def _thread_main(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _load(
    one_call: OneCall,
    calls: int,
    concurrency: int,
    latencies: list[int] | None,
    nursery: Any,
    deadline_ns: int | None = None,
) -> float:
    """The load loop shared by the trio clients (``nursery``: trio.open_nursery).

    With ``deadline_ns`` (a ``perf_counter_ns`` instant), no call starts after it.
    """
    remaining = calls
    perf = time.perf_counter_ns

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            if deadline_ns is not None and perf() >= deadline_ns:
                remaining = 0
                break
            remaining -= 1
            start = perf()
            await one_call()
            if latencies is not None:
                latencies.append(perf() - start)

    began = time.perf_counter()
    if concurrency == 1:
        await worker()
    else:
        async with nursery() as tasks:
            for _ in range(min(concurrency, calls)):
                tasks.start_soon(worker)
    return time.perf_counter() - began


class _TrioClient(EchoClient):
    """A client whose loop is trio (capsvc, raw)."""

    def __init__(self, address: str, concurrency: int, payload: int) -> None:
        super().__init__(address, concurrency, payload)
        self.counter = PassCounter()
        self._token: Any = None
        self._stop: Any = None

    def _thread_main(self) -> None:
        import trio

        async def main() -> None:
            trio.lowlevel.add_instrument(self.counter)  # type: ignore[arg-type]
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            try:
                async with self.session() as one_call:
                    self._one_call = one_call
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as error:
                if self._ready.is_set():
                    raise
                self._error = error
                self._ready.set()

        try:
            trio.run(main)
        except BaseException as error:  # after start(): reported by run()/close()
            self._error = self._error or error

    def session(self) -> Any:
        """An async context manager that connects and yields the one-call coroutine fn."""
        raise NotImplementedError

    def run(
        self, calls: int, latencies: list[int] | None = None, max_seconds: float | None = None
    ) -> float:
        """Also: with ``max_seconds``, stop starting calls after that long (Nagle runs)."""
        import trio

        deadline = None
        if max_seconds is not None:
            deadline = time.perf_counter_ns() + int(max_seconds * 1e9)
        seconds: float = trio.from_thread.run(
            _load, self._one_call, calls, self.concurrency, latencies, trio.open_nursery,
            deadline, trio_token=self._token,
        )  # fmt: skip
        self.calls += calls
        return seconds

    def stats(self) -> dict[str, float]:
        return {"passes": self.counter.passes}

    def profile(self, profiler: Any, on: bool) -> None:
        """Enable/disable a ``cProfile.Profile`` in the loop's thread (profiling command)."""
        import trio

        action = profiler.enable if on else profiler.disable
        trio.from_thread.run_sync(action, trio_token=self._token)

    def close(self) -> None:
        import trio

        if self._token is not None and self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout=30)
        if self._error is not None and self._ready.is_set():
            raise RuntimeError("the client's event loop failed") from self._error


class CapsvcClient(_TrioClient):
    """capsvc's client: ``Echo.ping`` (or ``BenchEcho.pingCap``) over ``capsvc.connect``,
    through the generated stubs (capsvc.generated), or with ``dynamic`` through the
    dynamic path (``capsvc.load_schema``)."""

    def __init__(
        self,
        address: str,
        concurrency: int,
        payload: int,
        *,
        method: str = "ping",
        nodelay: bool = True,
        coalesce: bool = True,
        pause: float = 0.0,
        busy_poll: bool = True,
        dynamic: bool = False,
    ) -> None:
        super().__init__(address, concurrency, payload)
        self.method = method
        self.pause = pause  # seconds each caller sleeps after each call (Nagle experiment)
        self.nodelay = nodelay
        self.coalesce = coalesce
        self.busy_poll = busy_poll
        self.dynamic = dynamic
        self.connection: Any = None

    def session(self) -> Any:
        from contextlib import asynccontextmanager

        import capsvc

        @asynccontextmanager
        async def connected() -> Any:
            async with capsvc.connect(
                self.address,
                nodelay=self.nodelay,
                coalesce=self.coalesce,
                busy_poll=capsvc.DEFAULT_BUSY_POLL if self.busy_poll else None,
            ) as conn:
                self.connection = conn
                if self.dynamic:
                    yield self._dynamic_call(conn)
                else:
                    yield self._typed_call(conn)

        return connected()

    def _typed_call(self, conn: Any) -> OneCall:
        import trio

        from capsvc.generated.bench_echo_capnp import BenchEcho
        from capsvc.generated.echo_capnp import Echo

        message, pause = self.message, self.pause
        if self.method == "pingCap":
            bench = conn.bootstrap(BenchEcho)

            async def ping_cap() -> None:
                results = await bench.pingCap(msg=message)
                if results.reply != message:
                    raise AssertionError("echo reply differs from the request")
                # Dropping the results (and the capability in them) queues the
                # question's Finish; it leaves with the next Call.
                del results
                if pause:
                    await trio.sleep(pause)

            return ping_cap
        echo = conn.bootstrap(Echo)

        async def ping() -> None:
            if (await echo.ping(msg=message)).reply != message:
                raise AssertionError("echo reply differs from the request")

        return ping

    def _dynamic_call(self, conn: Any) -> OneCall:
        import trio

        import capsvc

        message, pause = self.message, self.pause
        if self.method == "pingCap":
            schema = capsvc.load_schema(BENCH_ECHO_SCHEMA, check=False)
            bench = conn.bootstrap(schema.BenchEcho)

            async def ping_cap() -> None:
                results = await bench.pingCap(msg=message)
                if results.reply != message:
                    raise AssertionError("echo reply differs from the request")
                del results  # queues the Finish (see _typed_call)
                if pause:
                    await trio.sleep(pause)

            return ping_cap
        echo = capsvc.load_schema(ECHO_SCHEMA, check=False)
        client = conn.bootstrap(echo.Echo)

        async def ping() -> None:
            if (await client.ping(msg=message)).reply != message:
                raise AssertionError("echo reply differs from the request")

        return ping

    def stats(self) -> dict[str, float]:
        stats = super().stats()
        if self.connection is not None:
            stats["writes"] = self.connection.writes
        return stats


@functools.cache
def frame_sizes(payload: int) -> tuple[int, int]:
    """Bytes of capsvc's Call and Return frames for ``ping`` with ``payload`` chars
    (through the generated stubs, as the ``capsvc-*`` pairings call)."""
    import trio
    import trio.testing

    import capsvc
    from bench.rpc.servers import typed_bench_echo
    from capsvc.generated.echo_capnp import Echo

    sizes: dict[str, list[int]] = {"client": [], "server": []}

    class Recording(trio.abc.Stream):
        def __init__(self, inner: trio.abc.Stream, side: str) -> None:
            self.inner = inner
            self.side = side

        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            sizes[self.side].append(len(data))
            await self.inner.send_all(data)

        async def wait_send_all_might_not_block(self) -> None:
            await self.inner.wait_send_all_might_not_block()

        async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
            return await self.inner.receive_some(max_bytes)

        async def aclose(self) -> None:
            await self.inner.aclose()

    async def main() -> None:
        a, b = trio.testing.memory_stream_pair()
        async with (
            capsvc.open_connection(Recording(b, "server"), bootstrap=typed_bench_echo()),
            capsvc.open_connection(Recording(a, "client")) as conn,
        ):
            client = conn.bootstrap(Echo)
            for _ in range(3):  # the first call also carries the bootstrap
                await client.ping(msg="x" * payload)

    # In a daemon thread, waited for by result rather than by exit: the sizes are known
    # once main() returns, and a trio.run that lingers at exit must not hold us up.
    done = threading.Event()
    failure: list[BaseException] = []

    def thread_main() -> None:
        async def measure() -> None:
            try:
                await main()
            except BaseException as error:
                failure.append(error)
                raise
            finally:
                done.set()

        with contextlib.suppress(BaseException):
            trio.run(measure)

    threading.Thread(target=thread_main, name="frame-sizes", daemon=True).start()
    if not done.wait(60) or failure or not sizes["server"]:
        cause = failure[0] if failure else None
        raise RuntimeError("could not measure capsvc's frame sizes") from cause
    return sizes["client"][-1], sizes["server"][-1]


class RawClient(_TrioClient):
    """The raw trio ping-pong client (see the module docstring); ``busy_poll``: its
    receives poll before they sleep, as its ``raw-tcp-poll`` server's do."""

    def __init__(
        self, address: str, concurrency: int, payload: int, *, busy_poll: bool = False
    ) -> None:
        super().__init__(address, concurrency, payload)
        self.busy_poll = busy_poll
        self.sizes = frame_sizes(payload)  # runs trio itself: before our loop starts

    def session(self) -> Any:
        from contextlib import asynccontextmanager

        import trio

        request_size, reply_size = self.sizes
        request = FRAME_HEADER.pack(request_size - 8, reply_size) + bytes(request_size - 8)

        @asynccontextmanager
        async def connected() -> Any:
            if self.address.startswith("unix:"):
                stream = await trio.open_unix_socket(self.address[len("unix:") :])
            else:
                host, port = self.address[len("tcp:") :].rsplit(":", 1)
                stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                with raw_receiver(stream, self.busy_poll) as receive:
                    if self.concurrency == 1:
                        buffer = bytearray()

                        async def one_call() -> None:
                            await stream.send_all(request)
                            while len(buffer) < reply_size:
                                data = await receive(65536)
                                if not data:
                                    raise EOFError("raw server closed the connection")
                                buffer.extend(data)
                            del buffer[:reply_size]

                        yield one_call
                        return
                    lock = trio.StrictFIFOLock()
                    waiters: deque[Any] = deque()

                    async def reader() -> None:
                        buffer = bytearray()
                        while True:
                            data = await receive(65536)
                            if not data:
                                return
                            buffer += data
                            offset = 0
                            while len(buffer) - offset >= 8:
                                body = struct.unpack_from("<I", buffer, offset)[0]
                                if len(buffer) - offset < 8 + body:
                                    break
                                offset += 8 + body
                                waiters.popleft().set()
                            del buffer[:offset]

                    async def pipelined_call() -> None:
                        done = trio.Event()
                        async with lock:
                            waiters.append(done)
                            await stream.send_all(request)
                        await done.wait()

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(reader)
                        yield pipelined_call
                        nursery.cancel_scope.cancel()

        return connected()


class PycapnpClient(EchoClient):
    """pycapnp's own client (libcapnp's C++ RPC on asyncio), like tests/peers' clients."""

    def __init__(self, address: str, concurrency: int, payload: int) -> None:
        super().__init__(address, concurrency, payload)
        if not address.startswith("tcp:"):
            raise ValueError("the pycapnp client connects over TCP only")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._echo: Any = None

    def _thread_main(self) -> None:
        import capnp

        echo_capnp = capnp.load(ECHO_SCHEMA)
        host, port = self.address[len("tcp:") :].rsplit(":", 1)

        async def main() -> None:
            try:
                stream = await capnp.AsyncIoStream.create_connection(host, int(port))
                client = capnp.TwoPartyClient(stream)
                self._echo = client.bootstrap().cast_as(echo_capnp.Echo)
                self._loop = asyncio.get_running_loop()
                self._stop = asyncio.Event()
            except BaseException as error:
                self._error = error
                self._ready.set()
                return
            self._ready.set()
            await self._stop.wait()

        try:
            asyncio.run(capnp.run(main()))
        except BaseException as error:
            self._error = self._error or error
            self._ready.set()

    async def _load(self, calls: int, latencies: list[int] | None) -> float:
        echo = self._echo
        message = self.message
        remaining = calls
        perf = time.perf_counter_ns

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                start = perf()
                if (await echo.ping(msg=message)).reply != message:
                    raise AssertionError("echo reply differs from the request")
                if latencies is not None:
                    latencies.append(perf() - start)

        began = time.perf_counter()
        if self.concurrency == 1:
            await worker()
        else:
            await asyncio.gather(*(worker() for _ in range(min(self.concurrency, calls))))
        return time.perf_counter() - began

    def run(self, calls: int, latencies: list[int] | None = None) -> float:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._load(calls, latencies), self._loop)
        seconds = future.result()
        self.calls += calls
        return seconds

    def close(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


def make_client(
    impl: str, address: str, concurrency: int, payload: int, **options: Any
) -> EchoClient:
    """A not yet started client of implementation ``impl``: capsvc (generated stubs),
    capsvc-nopoll (busy polling off), capsvc-dynamic and capsvc-nopoll-dynamic (the dynamic
    path), pycapnp, raw or raw-poll (the raw ping-pong with busy polling)."""
    variants = {
        "capsvc": {},
        "capsvc-nopoll": {"busy_poll": False},
        "capsvc-dynamic": {"dynamic": True},
        "capsvc-nopoll-dynamic": {"busy_poll": False, "dynamic": True},
    }
    if impl in variants:
        return CapsvcClient(address, concurrency, payload, **variants[impl], **options)
    if options:
        raise ValueError(f"{impl} client takes no options {sorted(options)}")
    if impl == "pycapnp":
        return PycapnpClient(address, concurrency, payload)
    if impl in ("raw", "raw-poll"):
        return RawClient(address, concurrency, payload, busy_poll=impl == "raw-poll")
    raise ValueError(f"unknown client implementation {impl!r}")
