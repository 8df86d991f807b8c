"""What the RPC suite measures: pairings (who talks to whom, over what) and loads.

Theory of operation
-------------------
A *scenario* is a pairing times a load. A pairing names the client implementation and the
server (a separate process of a given kind, ``SERVER_KINDS``); a load is a concurrency and
a payload size. Every name here is stable, because it ends up in file names and pyperf
benchmark names: one pyperf JSON file per pairing (``<pairing>.json.gz``) holding, per
load, the benchmark ``echo-<load>`` (time per call, pyperf's timing) and
``echo-<load>-latency`` (one value per call). Identical benchmark names across the files
are what make ``python -m pyperf compare_to pycapnp.json.gz capsvc-tcp.json.gz`` work.

Scenario selectors on the command line are ``fnmatch`` patterns over ``pairing/load``
(``capsvc-tcp/*``, ``*/c12-*``, ``raw-trio/c1-16B``).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMAS = os.path.join(ROOT, "schemas")
ECHO_SCHEMA = os.path.join(SCHEMAS, "echo.capnp")
BENCH_ECHO_SCHEMA = os.path.join(SCHEMAS, "bench_echo.capnp")
PEERS = os.path.join(ROOT, "tests", "peers")
RESULTS_ROOT = os.path.join(ROOT, "bench", "results")


@dataclass(frozen=True)
class ServerKind:
    """A server program: implementation, transport, socket options."""

    name: str
    impl: str  # "capsvc" | "pycapnp" | "raw"
    transport: str  # "tcp" | "unix"
    nodelay: bool = True
    coalesce: bool = True
    # Busy polling of receives: capsvc's adaptive policy (capsvc.transport.busypoll); for
    # the raw ping-pong a fixed-budget poll (servers.raw_receiver). pycapnp never polls.
    busy_poll: bool = True
    dynamic: bool = False  # capsvc: the dynamic path (load_schema), not the generated base
    async_methods: bool = False  # capsvc: ``async def`` methods (as pycapnp's must be)

    @property
    def polls(self) -> bool:
        """Whether this server busy-polls its sockets."""
        return self.busy_poll and self.impl != "pycapnp"


SERVER_KINDS: dict[str, ServerKind] = {
    kind.name: kind
    for kind in (
        ServerKind("capsvc-tcp", "capsvc", "tcp"),
        ServerKind("capsvc-unix", "capsvc", "unix"),
        ServerKind("capsvc-tcp-nopoll", "capsvc", "tcp", busy_poll=False),
        ServerKind("capsvc-tcp-dynamic", "capsvc", "tcp", dynamic=True),
        ServerKind("capsvc-tcp-nopoll-dynamic", "capsvc", "tcp", busy_poll=False, dynamic=True),
        ServerKind("capsvc-tcp-nopoll-async", "capsvc", "tcp", busy_poll=False, async_methods=True),
        ServerKind("pycapnp-tcp", "pycapnp", "tcp"),
        ServerKind("raw-tcp", "raw", "tcp", busy_poll=False),
        ServerKind("raw-unix", "raw", "unix", busy_poll=False),
        ServerKind("raw-tcp-poll", "raw", "tcp"),
        # The Nagle experiment (TCP_NODELAY off on both ends).
        ServerKind("capsvc-tcp-nagle", "capsvc", "tcp", nodelay=False),
        ServerKind("capsvc-tcp-nagle-nocoalesce", "capsvc", "tcp", nodelay=False, coalesce=False),
        ServerKind("capsvc-tcp-nocoalesce", "capsvc", "tcp", coalesce=False),
    )
}


@dataclass(frozen=True)
class Pairing:
    """A client implementation talking to one kind of server."""

    name: str
    client: str  # "capsvc" | "pycapnp" | "raw" and their variants (clients.make_client)
    server: str  # a SERVER_KINDS key
    title: str
    role: str  # "capsvc" | "reference" | "interop" | "ceiling"

    @property
    def busy_poll(self) -> bool:
        """Whether either end busy-polls (the report labels such rows: polling buys
        latency with CPU, so the headline figures are those without it)."""
        return self.client in POLLING_CLIENTS or SERVER_KINDS[self.server].polls


# The client kinds of clients.make_client that busy-poll their socket.
POLLING_CLIENTS = frozenset({"capsvc", "capsvc-dynamic", "raw-poll"})


PAIRINGS: dict[str, Pairing] = {
    p.name: p
    for p in (
        Pairing("capsvc-tcp", "capsvc", "capsvc-tcp", "capsvc → capsvc, TCP", "capsvc"),
        Pairing("pycapnp", "pycapnp", "pycapnp-tcp", "pycapnp → pycapnp, TCP", "reference"),
        Pairing("raw-trio", "raw", "raw-tcp", "raw trio ping-pong, TCP", "ceiling"),
        Pairing("capsvc-unix", "capsvc", "capsvc-unix", "capsvc → capsvc, Unix", "capsvc"),
        Pairing(
            "capsvc-tcp-nopoll",
            "capsvc-nopoll",
            "capsvc-tcp-nopoll",
            "capsvc → capsvc, TCP, busy polling off",
            "capsvc",
        ),
        Pairing("raw-trio-unix", "raw", "raw-unix", "raw trio ping-pong, Unix", "ceiling"),
        # The ceiling of a trio RPC that busy-polls as capsvc does (fixed 400 µs budget on
        # both ends): capsvc with polling on is compared with this, like with like.
        Pairing(
            "raw-trio-poll",
            "raw-poll",
            "raw-tcp-poll",
            "raw trio ping-pong, TCP, busy polling",
            "ceiling",
        ),
        # capsvc on the dynamic path (load_schema) on both ends, beside the generated stubs
        # of the pairings above: the cost of not generating, in the same run.
        Pairing(
            "capsvc-tcp-dynamic",
            "capsvc-dynamic",
            "capsvc-tcp-dynamic",
            "capsvc → capsvc, TCP, dynamic path",
            "capsvc",
        ),
        Pairing(
            "capsvc-tcp-nopoll-dynamic",
            "capsvc-nopoll-dynamic",
            "capsvc-tcp-nopoll-dynamic",
            "capsvc → capsvc, TCP, busy polling off, dynamic path",
            "capsvc",
        ),
        # pycapnp's server methods are coroutines; capsvc's echo runs a plain ``def``
        # inline. This one has ``async def`` methods, the like-with-like server.
        Pairing(
            "capsvc-tcp-nopoll-async",
            "capsvc-nopoll",
            "capsvc-tcp-nopoll-async",
            "capsvc → capsvc, TCP, busy polling off, async def server",
            "capsvc",
        ),
        Pairing("capsvc-to-pycapnp", "capsvc", "pycapnp-tcp", "capsvc → pycapnp, TCP", "interop"),
        Pairing("pycapnp-to-capsvc", "pycapnp", "capsvc-tcp", "pycapnp → capsvc, TCP", "interop"),
    )
}


@dataclass(frozen=True)
class Load:
    """Concurrency (calls outstanding on the one connection) and payload (Text chars)."""

    name: str
    concurrency: int
    payload: int


LOADS: dict[str, Load] = {
    load.name: load
    for load in (
        Load("c1-16B", 1, 16),
        Load("c12-16B", 12, 16),
        Load("c1-4KiB", 1, 4096),
        Load("c12-4KiB", 12, 4096),
    )
}

# The full run: every pairing at these loads (c12-4KiB is available with --loads).
DEFAULT_LOADS = ("c1-16B", "c12-16B", "c1-4KiB")

# The smoke run: every pairing once, the loads rotated so that each client implementation
# runs at concurrency 1 and 12 and the 4 KiB payload goes through capsvc and raw clients.
SMOKE = (
    "capsvc-tcp/c1-16B",
    "pycapnp/c12-16B",
    "raw-trio/c1-4KiB",
    "capsvc-unix/c12-16B",
    "capsvc-tcp-nopoll/c1-16B",
    "raw-trio-unix/c12-16B",
    "raw-trio-poll/c1-16B",
    "capsvc-tcp-dynamic/c12-16B",
    "capsvc-tcp-nopoll-dynamic/c1-16B",
    "capsvc-tcp-nopoll-async/c12-16B",
    "capsvc-to-pycapnp/c1-4KiB",
    "pycapnp-to-capsvc/c1-16B",
)


@dataclass(frozen=True)
class Scenario:
    pairing: Pairing
    load: Load

    @property
    def id(self) -> str:
        return f"{self.pairing.name}/{self.load.name}"


def bench_name(load: Load | str) -> str:
    """The pyperf benchmark holding time per call (calls/s = 1 / mean)."""
    return f"echo-{load if isinstance(load, str) else load.name}"


def latency_bench_name(load: Load | str) -> str:
    """The pyperf benchmark holding one value per call (the latency histogram)."""
    return bench_name(load) + "-latency"


def select(patterns: list[str] | None, loads: list[str] | None = None) -> list[Scenario]:
    """Scenarios matching any of ``patterns`` (all when None), in suite order.

    ``loads`` restricts the loads considered (default: DEFAULT_LOADS, unless a pattern
    names a load outside it explicitly).
    """
    load_names = list(loads) if loads else list(LOADS)
    chosen: list[Scenario] = []
    for pairing in PAIRINGS.values():
        for load_name in load_names:
            scenario = Scenario(pairing, LOADS[load_name])
            if patterns is None:
                if loads is None and load_name not in DEFAULT_LOADS:
                    continue
            elif not any(fnmatch.fnmatchcase(scenario.id, p) for p in patterns):
                continue
            elif (
                loads is None
                and load_name not in DEFAULT_LOADS
                and not _names_load(patterns, load_name)
            ):
                continue
            chosen.append(scenario)
    return chosen


def _names_load(patterns: list[str], load_name: str) -> bool:
    return any(p.endswith("/" + load_name) for p in patterns)


def unknown_patterns(patterns: list[str]) -> list[str]:
    """Patterns that match no scenario at any load (typos)."""
    ids = [Scenario(p, load).id for p in PAIRINGS.values() for load in LOADS.values()]
    return [p for p in patterns if not any(fnmatch.fnmatchcase(i, p) for i in ids)]
