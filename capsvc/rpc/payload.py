"""Payloads: a call's params or results, i.e. content plus the capabilities it points to.

Theory of operation (DESIGN.md, "Capabilities inside messages"): pycapnp builds and reads
the content, but it cannot read or write capability pointers outside its own RPC system. So a
payload keeps its capabilities beside the content, as hooks keyed by *pointer path*
(capsvc.rpc.pointers: struct pointer slots, ``~i`` for list element i):

- ``BuiltPayload``: content being built in place inside an rpc.capnp Call or Return message
  builder. Interface fields stay null in pycapnp; ``set_cap(path, hook)`` records the hook.
  When the message is written, the session fills the capTable and ``finish`` patches one
  capability word per recorded path into the serialised segments.
- ``ReceivedPayload``: content inside a received message. The capTable was turned into hooks
  on arrival (each owned by the payload); ``cap_at(path)`` reads the pointer word at that path
  and returns the hook its index names.

A payload owns one reference to each of its hooks; ``release()`` drops them (rpc-protocol.md
§7: imports are released when their last local reference dies).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import capnp.lib.capnp as capnp_lib

from capsvc.codec.building import MessageBuilder, StructBuilder, init_struct, new_builder
from capsvc.codec.reading import (
    DEFAULT_NESTING_LIMIT,
    MessageReader,
    StructReader,
    read_struct,
)
from capsvc.errors import Failed, LocalProtocolError, RemoteProtocolError
from capsvc.framing import DEFAULT_LIMITS
from capsvc.rpc import pointers, rpc_capnp, wire
from capsvc.rpc.hooks import BrokenHook, Hook, Path

Segments = Sequence[bytes | bytearray | memoryview]
R = TypeVar("R", bound=StructReader)
B = TypeVar("B", bound=StructBuilder)

_WORD = struct.Struct("<Q")
_DEFAULT_LIMITS = (DEFAULT_LIMITS.traversal_limit_words, DEFAULT_LIMITS.nesting_limit)


class Payload:
    """Content plus capabilities. Subclasses say where the content lives."""

    __slots__ = ("caps", "released")

    def __init__(self) -> None:
        self.caps: list[Hook | None] = []
        self.released = False

    def cap_at(self, path: Path) -> Hook | None:
        """A new reference to the capability at ``path``, or None for a null pointer."""
        found = self.locate_cap(path)
        if found is None or isinstance(found, Hook):
            return found
        if found >= len(self.caps):
            return BrokenHook(Failed(f"capability index {found} is outside the capTable"))
        hook = self.caps[found]
        return hook.add_ref() if hook is not None else None

    def locate_cap(self, path: Path) -> int | Hook | None:
        """The index in ``caps`` of the capability at ``path``: None for a null pointer, or
        a (new) broken hook if the pointer there is not a valid capability."""
        raise NotImplementedError

    def content(self, schema: Any) -> Any:
        """A pycapnp struct reader of the content, read as ``schema``."""
        raise NotImplementedError

    def union_choice(self, struct_path: Path, offset: int) -> int | None:
        """A union member selected beside the content (see BuiltPayload), if any."""
        return None

    def codec_view(self) -> tuple[Segments, pointers.Location | None, Sequence[Hook | None]]:
        """For generated readers: the segments (capability pointers in place), where the
        content pointer is (None: no content), and the hooks its capability pointers index."""
        raise NotImplementedError

    def read_as(self, cls: type[R], keep: object = None) -> R:
        """The content, read by a generated reader class (``capsvc gen``); ``keep`` stays
        referenced while readers of it live (the call result that owns this payload)."""
        segments, location, caps = self.codec_view()
        msg = MessageReader(segments, caps=caps, keep=keep)
        if location is None:
            return cls._empty(msg, DEFAULT_NESTING_LIMIT)
        return read_struct(msg, location[0], location[1], cls, DEFAULT_NESTING_LIMIT, None)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        caps, self.caps = self.caps, []
        for hook in caps:
            if hook is not None:
                hook.release()


class WritablePayload(Payload):
    """Content being built inside an outgoing Call or Return message: what the engine
    writes out (``header`` gives the Call or Return builder; ``write`` the segments, with
    the cap table filled through ``describe(descriptor, cap index, hook)``)."""

    __slots__ = ()

    content_path: Path

    def header(self) -> Any:
        raise NotImplementedError

    def write(self, describe: Callable[[Any, int, Hook], None]) -> list[bytes | bytearray]:
        raise NotImplementedError


class BuiltPayload(WritablePayload):
    """Content built by pycapnp inside ``message`` (a Call or Return) at ``payload_builder``."""

    __slots__ = ("body", "cap_paths", "content_path", "message", "payload_builder", "unions")

    def __init__(
        self, message: Any, payload_builder: Any, content_path: Path, body: Any = None
    ) -> None:
        super().__init__()
        self.message = message
        #: The Call or Return builder, kept so the session need not look it up again.
        self.body = body
        self.payload_builder = payload_builder
        self.content_path = content_path
        self.cap_paths: dict[Path, int] = {}
        # (struct path, discriminant offset) -> discriminant value: one struct may hold its
        # own union and the unions of its groups, at different offsets.
        self.unions: dict[tuple[Path, int], int] = {}

    def set_cap(
        self, path: Path, hook: Hook | None, *, union: tuple[Path, int, int] | None = None
    ) -> None:
        """Place ``hook`` (ownership passes to the payload) at ``path`` of the content.

        ``union`` = (path of the enclosing struct, discriminant offset in 16-bit units, value)
        when the field is a union member: pycapnp cannot select it, so ``write`` does.
        """
        if union is not None:
            self.unions[(union[0], union[1])] = union[2]
        index = self.cap_paths.get(path)
        if index is None:
            self.cap_paths[path] = len(self.caps)
            self.caps.append(hook)
            return
        old = self.caps[index]
        self.caps[index] = hook
        if old is not None:
            old.release()

    def clear_union(self, struct_path: Path, offset: int) -> None:
        """pycapnp selected another member of that union: forget our selection."""
        self.unions.pop((struct_path, offset), None)

    def union_choice(self, struct_path: Path, offset: int) -> int | None:
        """The discriminant a capability field selected at that struct, if one did."""
        return self.unions.get((struct_path, offset))

    def locate_cap(self, path: Path) -> int | Hook | None:
        return self.cap_paths.get(path)

    def content(self, schema: Any) -> Any:
        return self.payload_builder.content.as_struct(schema).as_reader()

    def header(self) -> Any:
        if self.body is not None:
            return self.body
        message = self.message
        return (
            message.call if self.content_path == wire.CALL_CONTENT_PATH else message.init("return")
        )

    def codec_view(self) -> tuple[Segments, pointers.Location | None, Sequence[Hook | None]]:
        # A local call from pycapnp-built params to a generated reader: patch the capability
        # words in (as ``write`` does), number them as their cap table would.
        pairs = zip(self.cap_paths, self.caps, strict=True)
        hooks = [hook for _, hook in pairs if hook is not None]
        segments = self.write(_no_descriptor)
        return segments, pointers.follow(segments, pointers.ROOT, self.content_path), hooks

    def write(self, describe: Callable[[Any, int, Hook], None]) -> list[bytes | bytearray]:
        """Serialise the message: capTable through ``describe(descriptor, index, hook)``
        (``index``: the hook's place in ``caps``), then the capability words.

        Null capabilities get no capTable entry; their pointer simply stays null.
        """
        pairs = zip(self.cap_paths, self.caps, strict=True)
        order = [(path, hook) for path, hook in pairs if hook is not None]
        if not order and not self.unions:
            return list(self.message.to_segments())
        if order:
            table = self.payload_builder.init("capTable", len(order))
            for index, (path, hook) in enumerate(order):
                describe(table[index], self.cap_paths[path], hook)
        segments: list[bytes | bytearray] = [bytearray(s) for s in self.message.to_segments()]
        start = pointers.follow(segments, pointers.ROOT, self.content_path)
        if start is None:
            raise LocalProtocolError("payload content is missing")
        for (struct_path, offset), value in self.unions.items():
            pointers.write_struct_u16(segments, start, struct_path, offset, value)
        for index, (path, _) in enumerate(order):
            location = pointers.follow(segments, start, path) if path else start
            if location is None:
                raise LocalProtocolError(f"no pointer at capability path {path}")
            pointers.write_cap_index(segments, location, index)
        return segments


class ReceivedPayload(Payload):
    """Content inside a received message; ``caps`` came from its capTable.

    ``message``, the pycapnp reader of the whole message, may be None: it is then made
    when first needed (with ``limits``: traversal words, nesting). When the engine's raw
    header reader already found the content pointer (``content_word``, a word of segment
    0), ``content`` reads the content without it, from a copy of the message re-rooted at
    that pointer (see ``reroot``).
    """

    __slots__ = (
        "_content_location",
        "_content_word",
        "_limits",
        "_payload_reader",
        "content_path",
        "message",
        "reflected",
        "segments",
    )

    def __init__(
        self,
        segments: Segments,
        message: Any,
        content_path: Path,
        caps: list[Hook | None],
        payload_reader: Any = None,
        *,
        content_word: int = -1,
        limits: tuple[int, int] = _DEFAULT_LIMITS,
        reflected: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__()
        self.segments = segments
        #: Indices of ``caps`` the peer described as ours (receiverHosted/receiverAnswer).
        self.reflected = reflected
        self.message = message
        self.content_path = content_path
        self._payload_reader = payload_reader
        self._content_word = content_word
        self._limits = limits
        self.caps = caps
        self._content_location: pointers.Location | None = (
            pointers.follow(segments, pointers.ROOT, content_path) if caps else None
        )

    def locate_cap(self, path: Path) -> int | Hook | None:
        if self._content_location is None:
            return None  # an empty capTable: every capability pointer reads as null
        try:
            location = (
                pointers.follow(self.segments, self._content_location, path)
                if path
                else self._content_location
            )
            if location is None:
                return None
            index = pointers.read_cap_index(self.segments, location)
        except RemoteProtocolError as error:
            return BrokenHook(Failed(f"bad capability pointer: {error}"))
        return index

    @property
    def payload_reader(self) -> Any:
        """The pycapnp reader of the Payload struct (read lazily: most calls never need
        it before the method reads its params)."""
        reader = self._payload_reader
        if reader is None:
            message = self.message
            if message is None:
                message = self.message = wire.read_message(
                    self.segments,
                    traversal_limit_words=self._limits[0],
                    nesting_limit=self._limits[1],
                )
            body = message.call if self.content_path == wire.CALL_CONTENT_PATH else None
            reader = body.params if body is not None else getattr(message, "return").results
            self._payload_reader = reader
        return reader

    def codec_view(self) -> tuple[Segments, pointers.Location | None, Sequence[Hook | None]]:
        if self._content_word >= 0:
            return self.segments, (0, self._content_word), self.caps
        location = pointers.follow(self.segments, pointers.ROOT, self.content_path)
        return self.segments, location, self.caps

    def content(self, schema: Any) -> Any:
        if self._content_word >= 0:
            rerooted = reroot(self.segments, self._content_word)
            if rerooted is not None:
                return struct_module(schema).from_segments(
                    rerooted,
                    traversal_limit_in_words=self._limits[0],
                    nesting_limit=self._limits[1],
                )
        return self.payload_reader.content.as_struct(schema)


class ReturnedCaps(Payload):
    """What an answer keeps of results it has sent: their capabilities, by pointer path.

    After the Return, the peer can still pipeline on an answer (and name its capabilities
    in a Disembargo) until it sends Finish, so the answer must keep the results'
    capabilities; nothing reads their content any more. A peer that never sends Finish
    would otherwise hold a whole message per answer (a pycapnp builder's first segment
    alone is 8 KiB): this keeps one small tuple instead (issue 11, "memory per held
    object"). ``content`` is gone: asking for it is a local error.
    """

    __slots__ = ("paths",)

    def __init__(self, paths: tuple[Path, ...], caps: list[Hook | None]) -> None:
        super().__init__()
        self.paths = paths
        self.caps = caps

    def locate_cap(self, path: Path) -> int | Hook | None:
        try:
            index = self.paths.index(path)
        except ValueError:
            return None
        return index if self.caps[index] is not None else None

    def content(self, schema: Any) -> Any:
        raise LocalProtocolError("the results were sent; only their capabilities are kept")

    def codec_view(self) -> tuple[Segments, pointers.Location | None, Sequence[Hook | None]]:
        raise LocalProtocolError("the results were sent; only their capabilities are kept")


def keep_caps_only(payload: Payload) -> Payload:
    """``payload`` reduced to a ReturnedCaps (ownership of its hooks moves), where its
    capabilities are known by path without reading the content (a BuiltPayload: the
    dynamic path and the Bootstrap answer); any other payload is kept as it is."""
    if not isinstance(payload, BuiltPayload) or payload.released:
        return payload
    paths = tuple(payload.cap_paths)
    caps, payload.caps = payload.caps, []
    payload.release()
    return ReturnedCaps(paths, caps)


class SharedPayload(Payload):
    """A second owner's view of another payload (takeFromOtherQuestion shares results)."""

    __slots__ = ("shared_inner",)

    def __init__(self, inner: Payload) -> None:
        super().__init__()
        self.shared_inner = inner
        self.caps = [hook.add_ref() if hook is not None else None for hook in inner.caps]

    def locate_cap(self, path: Path) -> int | Hook | None:
        # Our caps mirror the inner payload's, index for index, with references of our own:
        # the inner payload may be released before we are.
        return self.shared_inner.locate_cap(path)

    def content(self, schema: Any) -> Any:
        return self.shared_inner.content(schema)

    def union_choice(self, struct_path: Path, offset: int) -> int | None:
        return self.shared_inner.union_choice(struct_path, offset)

    def codec_view(self) -> tuple[Segments, pointers.Location | None, Sequence[Hook | None]]:
        segments, location, _ = self.shared_inner.codec_view()
        return segments, location, self.caps


def reroot(segments: Segments, word: int) -> list[bytes | bytearray | memoryview] | None:
    """The message re-rooted at the struct pointer in ``word`` of segment 0, or None.

    A copy of segment 0 whose root pointer (word 0) points where that pointer does; the
    other segments are shared. Nothing points at a message's root pointer, so the subtree
    under the content reads exactly as before, through a reader that costs one pycapnp
    call instead of a walk down Message -> Call -> Payload -> content (~1.5 us less per
    received message). Only near struct pointers and far pointers qualify (a far pointer
    does not depend on where it is stored); anything else returns None.
    """
    segment = segments[0]
    if not 0 < word < len(segment) >> 3:
        return None
    (pointer,) = _WORD.unpack_from(segment, word * 8)
    kind = pointer & 3
    if kind == 0 and pointer != 0:
        offset = (pointer & 0xFFFFFFFF) >> 2
        if offset >= 1 << 29:
            offset -= 1 << 30
        offset += word  # now relative to word 0
        if offset >= 1 << 29:
            return None
        pointer = (pointer & ~0xFFFFFFFF) | ((offset & 0x3FFFFFFF) << 2)
    elif kind != 2:
        return None
    return [_WORD.pack(pointer) + segment[8:], *segments[1:]]


_MODULES: dict[int, tuple[Any, Any]] = {}


def struct_module(schema: Any) -> Any:
    """pycapnp's module object for a struct schema (it reads messages rooted at one).

    Cached per schema object (reading ``schema.node`` costs ~0.6 us); the entry holds the
    object, so its id stays unique while cached.
    """
    entry = _MODULES.get(id(schema))
    if entry is not None and entry[0] is schema:
        return entry[1]
    if len(_MODULES) > 4096:  # schema objects made on the fly must not pile up
        _MODULES.clear()
    module = capnp_lib._StructModule(schema, str(schema.node.displayName))
    _MODULES[id(schema)] = (schema, module)
    return module


def new_call_payload() -> BuiltPayload:
    """An empty params payload inside a fresh Call message."""
    message = wire.Message.new_message()
    body = message.init("call")
    return BuiltPayload(message, body.init("params"), wire.CALL_CONTENT_PATH, body)


def new_return_payload() -> BuiltPayload:
    """An empty results payload inside a fresh Return message."""
    message = wire.Message.new_message()
    body = message.init("return")
    return BuiltPayload(message, body.init("results"), wire.RETURN_CONTENT_PATH, body)


def _no_descriptor(desc: Any, index: int, hook: Hook) -> None:
    """A ``describe`` that leaves the cap table's descriptors unset."""


class CodecPayload(WritablePayload):
    """Content built by generated code (``capsvc gen``) inside a Call or Return message that
    generated rpc.capnp codecs build (capsvc.rpc.rpc_capnp): no pycapnp object per call.

    Capabilities are set into the content by generated builders, which append each hook to
    the message's cap list and write its index: ``caps`` *is* that list, so the cap table is
    written in the same order (``write``).
    """

    __slots__ = (
        "body",
        "builder",
        "content_path",
        "content_word",
        "header_at",
        "payload_builder",
        "target_at",
    )

    def __init__(
        self,
        builder: MessageBuilder,
        body: Any,
        payload_builder: Any,
        content_path: Path,
        content_word: int,
        target_at: int = -1,
    ) -> None:
        super().__init__()
        self.builder = builder
        self.body = body
        self.payload_builder = payload_builder
        self.content_path = content_path
        self.content_word = content_word  # the content pointer, a word of the one segment
        self.caps = builder.caps
        #: Byte offsets of the Call's or Return's data section, and of its MessageTarget's
        #: (a Call's, allocated with the template; -1 for a Return).
        self.header_at = body._data
        self.target_at = target_at

    def header(self) -> Any:
        return self.body

    def write_call_header(
        self, question_id: int, interface_id: int, method_id: int, import_id: int
    ) -> None:
        """The Call's header fields and its target, import ``import_id``, straight into
        the words (wire.write_call_header): no builder property per field."""
        buf = self.builder.buf
        wire.write_call_header(buf, self.header_at, question_id, interface_id, method_id)
        wire.write_imported_target(buf, self.target_at, import_id)

    def write_return_header(self, answer_id: int, no_finish: bool) -> None:
        """The Return's answerId and flags (wire.write_return_header)."""
        wire.write_return_header(self.builder.buf, self.header_at, answer_id, no_finish)

    def write(self, describe: Callable[[Any, int, Hook], None]) -> list[bytes | bytearray]:
        caps = self.caps
        if caps:
            table = self.payload_builder.init_capTable(len(caps))
            for index, hook in enumerate(caps):
                if hook is not None:
                    describe(table[index], index, hook)
        return list(self.builder.segments())

    def codec_view(self) -> tuple[Segments, pointers.Location | None, Sequence[Hook | None]]:
        return [self.builder.buf], (0, self.content_word), self.caps

    def locate_cap(self, path: Path) -> int | Hook | None:
        segments = [self.builder.buf]
        try:
            location = (
                pointers.follow(segments, (0, self.content_word), path)
                if path
                else (
                    0,
                    self.content_word,
                )
            )
            if location is None:
                return None
            return pointers.read_cap_index(segments, location)
        except RemoteProtocolError as error:
            return BrokenHook(Failed(f"bad capability pointer: {error}"))

    def content(self, schema: Any) -> Any:
        """A pycapnp reader of the content (a dynamic-API callee of a generated caller)."""
        rerooted = reroot([bytes(self.builder.buf)], self.content_word)
        assert rerooted is not None
        return struct_module(schema).from_segments(rerooted)


def new_codec_call(content: type[B]) -> tuple[CodecPayload, B]:
    """An empty Call built by generated codecs, and the builder of its params (``content``)."""
    return _from_template(content, _CALL)


def new_codec_return(content: type[B]) -> tuple[CodecPayload, B]:
    """An empty Return built by generated codecs, and the builder of its results."""
    return _from_template(content, _RETURN)


# An empty Call or Return holding an empty ``content`` struct is the same bytes every time:
# the generated codecs build it once per content type, and each new message starts as a
# copy of those bytes with builders at the same places (one copy instead of a dozen
# allocations and pointer writes per message).
class _Kind:
    __slots__ = ("body", "content_path", "templates")

    def __init__(self, body: Any, content_path: Path) -> None:
        self.body = body  # rpc_capnp.Call or rpc_capnp.Return
        self.content_path = content_path
        #: content type -> (message bytes, first word of the Call/Return, Payload, content,
        #: byte offset of a Call's MessageTarget data or -1)
        self.templates: dict[type[StructBuilder], tuple[bytes, int, int, int, int]] = {}


_CALL = _Kind(rpc_capnp.Call, wire.CALL_CONTENT_PATH)
_RETURN = _Kind(rpc_capnp.Return, wire.RETURN_CONTENT_PATH)


def _template(content: type[StructBuilder], kind: _Kind) -> tuple[bytes, int, int, int, int]:
    message = rpc_capnp.Message.new_message()
    body: rpc_capnp.Call.Builder | rpc_capnp.Return.Builder
    target_at = -1
    if kind is _CALL:
        body = message.init_call()
        target_at = body.init_target()._data  # so that a target is a few word writes
        holder = body.params
    else:
        body = message.init_return()
        holder = body.results
    inner = init_struct(holder, holder._ptr, content)
    return (
        bytes(message._b.buf),
        body._data >> 3,
        holder._data >> 3,
        inner._data >> 3,
        target_at,
    )


def _from_template(content: type[B], kind: _Kind) -> tuple[CodecPayload, B]:
    template = kind.templates.get(content)
    if template is None:
        template = kind.templates[content] = _template(content, kind)
    data, body_at, holder_at, content_at, target_at = template
    builder = MessageBuilder.__new__(MessageBuilder)
    builder.buf = bytearray(data)
    builder.caps = []
    builder.owns_caps = False  # (the payload owns them: Payload.release)
    body = new_builder(kind.body.Builder, builder, body_at)
    holder = new_builder(rpc_capnp.Payload.Builder, builder, holder_at)
    payload = CodecPayload(builder, body, holder, kind.content_path, holder._ptr, target_at)
    return payload, new_builder(content, builder, content_at)
