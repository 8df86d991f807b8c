"""Shared vocabulary of the serialization suite: the case contract, codecs, errors.

Theory of operation
-------------------
Upstream splits every benchmark into three functions (specs/benchmarks.md §1.4): the
client's ``setup`` fills a request and returns what it expects back, the server's
``handle`` turns a request into a response, and the client's ``check`` compares. One
iteration is one setup, one handle and one check. :class:`Case` is that contract for one
benchmark in one format: ``capnp`` (pycapnp's API), ``capsvc`` (the codecs ``capsvc gen``
generates, used as a user would), ``capnp-direct`` (the same Cap'n Proto messages through
the suite's own hand-tuned precomputed-offset accessors: an upper bound, not a product),
``capnpy`` (the capnpy package, if installed) or ``msgpack``.

The random draws are taken out of the timed region (the issue asks for the harness's own
costs to be measured apart): each benchmark module has a ``generate`` function that turns
the RNG stream into *inputs*, flat tuples of the drawn values in draw order, plus the
expectation where upstream computes it from the draws. ``setup`` then builds the
format's own structure from those flat values (a pycapnp builder, or nested tuples for
msgpack), so both formats pay for building their message; neither gets a ready-made one.
Where upstream computes the expectation by reading the message back (carsales), ``setup``
does so too.

A :class:`Codec` is the serialized form of one format with one compression: how a whole
message becomes bytes and back in ``bytes`` mode, and how messages are framed and
un-framed on a pipe (§6). The mode loops (modes.py, pipe.py) combine a case and a codec;
they know nothing about either format.

A wrong response raises :class:`CheckFailed`. It is never counted: the run stops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = [
    "BENCHMARKS",
    "CAPNP_FORMATS",
    "COMPRESSIONS",
    "FORMATS",
    "MODES",
    "Case",
    "CheckFailed",
    "Codec",
    "StreamDecoder",
]

BENCHMARKS = ("carsales", "catrank", "eval")
MODES = ("object", "bytes", "pipe", "pipe-async")  # §6, without object-size / client / server
# capnp: pycapnp; capsvc: capsvc gen's generated codecs (typed/), whole structs as rows;
# capsvc-fields: the same codecs a field at a time; capnp-direct: the hand-tuned accessors
# (direct/, an upper bound, not a goal's subject); capnpy: the capnpy package (optional,
# peer); msgpack.
FORMATS = ("capnp", "capsvc", "capsvc-fields", "capnp-direct", "capnpy", "msgpack")
CAPNP_FORMATS = FORMATS[:5]  # the Cap'n Proto formats: each has a packed form
COMPRESSIONS = ("none", "packed")  # §6; snappy is optional upstream and skipped here


class CheckFailed(AssertionError):
    """The client received a response other than the one it expected (§1.4: abort)."""


class Case(Protocol):
    """One benchmark in one format (§1.4). Messages are opaque to the mode loops."""

    format: str

    def setup(self, inputs: Any) -> tuple[Any, Any]:
        """Build a request from one iteration's inputs; return (request, expectation)."""
        ...

    def handle(self, request: Any) -> Any:
        """The server: read a request (a reader, or plain data) and build the response."""
        ...

    def check(self, response: Any, expectation: Any) -> None:
        """Raise :class:`CheckFailed` unless ``response`` is the expected one."""
        ...


class StreamDecoder(Protocol):
    """Turns a byte stream back into messages (readers or plain data)."""

    def feed(self, data: bytes) -> None: ...

    def next(self) -> Any | None:
        """The next complete message, or ``None`` until more bytes are fed."""
        ...


class Codec(Protocol):
    """A format with a compression: bytes-mode round trips and pipe framing (§6)."""

    format: str
    compression: str

    def view(self, message: Any) -> Any:
        """object mode: the request as the server sees it, without serializing."""
        ...

    def view_response(self, message: Any) -> Any:
        """object mode: the response as the client sees it (``view`` for most formats;
        a capsvc row does not name its type)."""
        ...

    def encode(self, message: Any) -> bytes:
        """bytes mode: the message as one flat byte string."""
        ...

    def serve_bytes(self, handle: Callable[[Any], Any], data: bytes) -> bytes:
        """bytes mode, server side: parse a request, handle it, serialize the response."""
        ...

    def check_bytes(self, check: Callable[[Any, Any], None], data: bytes, expected: Any) -> None:
        """bytes mode, client side: parse a response and check it."""
        ...

    def frame(self, message: Any) -> bytes:
        """pipe modes: the request as it travels on the pipe."""
        ...

    def frame_response(self, message: Any) -> bytes:
        """pipe modes: the response as it travels on the pipe (``frame`` for most formats)."""
        ...

    def frame_all(self, messages: Sequence[Any]) -> bytes:
        """Several messages back to back, ready for one write."""
        ...

    def request_decoder(self) -> StreamDecoder: ...

    def response_decoder(self) -> StreamDecoder: ...
