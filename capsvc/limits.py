"""``Limits``: every resource a peer can make one connection hold, bounded (capsvc.Limits).

Theory of operation
-------------------
One frozen value, taken by ``serve``, ``connect`` and ``open_connection`` (and built from
``capsvc serve --limit NAME=VALUE``), read by the framing decoder, the engine and the trio
driver. Each limit is one of three kinds, and what a peer sees differs (README "Limits and
timeouts" lists them all):

- *hard*: the peer broke it (a frame too big, too many answers held, imports, exports):
  the connection is aborted with an Abort of type ``overloaded`` (``failed`` for framing
  limits, as libcapnp) whose reason names the limit and its value, and the server goes
  on serving everyone else;
- *soft*: a budget (bytes queued for sending, calls in flight): over it, capsvc stops
  reading from that connection until it drains, as C++'s ``setFlowLimit`` does, instead of
  buffering without bound;
- *local*: our own calls (questions): over it, the call fails at once with
  ``capsvc.Overloaded`` and the connection goes on.

Timeouts are in seconds, ``None`` for none. ``first_message_timeout`` applies to
connections a server accepted only (a client may open a connection long before it first
asks for anything; a server need not keep a socket that never speaks).

Its own module, and pure Python, because capsvc.framing is compiled by mypyc: a compiled
dataclass checks its fields' declared types on entry, with mypyc's own TypeError that names
no field, before ``__post_init__`` can say which limit is wrong (and with a ValueError, as
the pure-Python build does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["DEFAULT_GRACE", "DEFAULT_MAX_CONNECTIONS", "FramingLimits", "Limits", "parse_limit"]

_MIB = 1024 * 1024

#: ``serve``'s default bound on the connections it holds at once (a server-wide limit,
#: so not a field of the per-connection Limits).
DEFAULT_MAX_CONNECTIONS = 1024
#: How long calls in flight get to finish in a graceful shutdown (``serve(shutdown=...)``,
#: ``capsvc serve --grace``).
DEFAULT_GRACE = 30.0


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection limits and timeouts; see the module docstring for the three kinds.

    Framing (hard; rpc-protocol.md §1, C++ ``capnp::ReaderOptions`` defaults):
    ``max_segments`` is inclusive (C++ ``readMessage`` requires *fewer than 512*);
    ``max_message_words`` bounds the sum of a message's segment sizes (8 Mi words =
    64 MiB, the C++ traversal limit); ``traversal_limit_words`` and ``nesting_limit`` bound
    the reading of one message.
    """

    # -- framing and reading (hard)
    max_segments: int = 511
    max_message_words: int = 8 * _MIB
    traversal_limit_words: int = 8 * _MIB
    nesting_limit: int = 64
    # -- tables (hard, except max_questions: local)
    #: The peer's calls and bootstraps we hold: running, or returned and awaiting Finish.
    max_answers: int = 16384
    #: Our calls to the peer not yet finished (a call over it fails with Overloaded).
    max_questions: int = 16384
    #: Capabilities of ours the peer holds (exports it has not Released).
    max_exports: int = 16384
    #: Capabilities of the peer's we hold (imports).
    max_imports: int = 16384
    # -- budgets (soft: reading pauses)
    #: Bytes framed for sending and not yet written.
    max_queued_bytes: int = 4 * _MIB
    #: The peer's calls we have not returned yet.
    max_calls_in_flight: int = 1024
    #: The size of those calls' messages, together (one call is always admitted).
    max_call_bytes_in_flight: int = 64 * _MIB
    #: Bytes of ``-> stream`` calls we keep in flight per capability before awaiting a
    #: write waits (capsvc.streaming); None: the socket's send buffer (SO_SNDBUF), as C++,
    #: or 64 KiB on a transport with no socket.
    stream_window_bytes: int | None = None
    # -- timeouts (seconds, or None)
    #: A connection a server accepted must send a whole first message within this.
    first_message_timeout: float | None = 60.0
    #: A message whose first byte has arrived must be complete within this (slowloris).
    frame_timeout: float | None = 120.0
    #: Output waiting for the peer to read it, with no write completed for this long
    #: (a peer that does not read: the slow-read side of slowloris).
    send_timeout: float | None = 120.0
    #: Closed when nothing arrives for this long while no call is outstanding either way.
    idle_timeout: float | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_timeout"):
                ok = value is None or (
                    isinstance(value, int | float) and not isinstance(value, bool) and value > 0
                )
                if not ok:
                    raise ValueError(
                        f"Limits.{field.name} must be a positive number of seconds or None, "
                        f"got {value!r}"
                    )
                continue
            if field.name == "stream_window_bytes" and value is None:
                continue  # the socket's (see the field)
            low = 0 if field.name == "max_message_words" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                kind = "non-negative" if low == 0 else "positive"
                raise ValueError(f"Limits.{field.name} must be a {kind} int, got {value!r}")

    def replace(self, **changes: object) -> Limits:
        """A copy with ``changes`` (checked as the constructor checks)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


#: The name this value had when it held the framing limits alone (kept for old code).
FramingLimits = Limits


def parse_limit(text: str) -> tuple[str, int | float | None]:
    """``NAME=VALUE`` (``capsvc serve --limit``): a field of Limits and its value, or a
    ValueError that lists the names."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    names = [f.name for f in dataclasses.fields(Limits)]
    if not sep or name not in names:
        raise ValueError(f"--limit {text!r}: expected NAME=VALUE, NAME one of {', '.join(names)}")
    raw = raw.strip()
    if name == "stream_window_bytes" and raw.lower() in ("none", "socket", ""):
        return name, None
    if name.endswith("_timeout"):
        if raw.lower() in ("none", "off", ""):
            return name, None
        try:
            return name, float(raw)
        except ValueError:
            raise ValueError(f"--limit {name}: {raw!r} is not a number of seconds") from None
    try:
        return name, int(raw.replace("_", ""), 0)
    except ValueError:
        raise ValueError(f"--limit {name}: {raw!r} is not an integer") from None
