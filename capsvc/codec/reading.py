"""Reading Cap'n Proto messages word by word: the runtime of generated readers.

Theory of operation (the encoding: capnproto.org/encoding.html; specs/codegen.md §2):
- A ``MessageReader`` holds the segments and what the reader may still spend: a traversal
  budget in words and a nesting limit, as libcapnp has (8 Mi words, 64 levels). Every
  struct or list a pointer leads to is charged its size (at least one word, and one word
  per element of a list of zero-sized elements) before anything in it is read, so a
  hostile message (pointer loops, one object pointed at many times, huge counts) costs
  work bounded by the budget, and running out raises ``DecodeError``, never an
  ``IndexError``, a hang or unbounded work.
- A ``StructReader`` is a view of one struct: its segment, the byte range of its data
  section and the word range of its pointer section. Generated subclasses read each field
  at an offset computed at generation time; a field beyond the sections the writer
  produced (an older writer) reads as its default, and a larger struct (a newer writer)
  is read the same way: schema evolution in both directions.
- Pointers are resolved in one place (``_resolve``): near pointers, far pointers and
  double-far pointers, every segment index, landing pad and object bounds-checked first.
- Lists are views too (``ListReader`` and its kinds). A list may be encoded in any of the
  forms the spec lets a reader accept for its element type: a List(Int32) may arrive as a
  list of structs whose first field is the Int32, a list of structs as a list of words or
  of pointers, and so on (``_open_list``).
- Null pointers read as the field's default; the default of a struct or list field (a
  whole subtree) is a small message the generator embedded, read the same way.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Final, Generic, Protocol, TypeVar, cast

from librt.strings import read_i16_le, read_i64_le

from capsvc._mypyc import mypyc_attr
from capsvc.errors import DecodeError

Segments = Sequence[bytes | bytearray | memoryview]

#: libcapnp's defaults (ReaderOptions): words a reader may touch, levels it may descend.
DEFAULT_TRAVERSAL_LIMIT: Final = 8 * 1024 * 1024
DEFAULT_NESTING_LIMIT: Final = 64

_WORD: Final = 1 << 64


def _word(segment: bytes, at: int) -> int:
    """The 64-bit word at byte ``at``, unsigned (the slow paths' view of a pointer)."""
    word = read_i64_le(segment, at)
    return int(word) if word >= 0 else int(word) + _WORD


#: Bits per element for the list element size codes 0..6 (7, composite, stands apart).
_ELEMENT_BITS: Final = (0, 1, 8, 16, 32, 64, 64)
_POINTER_SIZE: Final = 6
_COMPOSITE: Final = 7

R = TypeVar("R", bound="StructReader")
T = TypeVar("T")
C = TypeVar("C", covariant=True)
E = TypeVar("E")


class MessageReader:
    """The segments of one message and what reading them may still cost."""

    __slots__ = ("budget", "caps", "keep", "nesting_limit", "segments", "sizes")

    def __init__(
        self,
        segments: Segments,
        *,
        traversal_limit_words: int = DEFAULT_TRAVERSAL_LIMIT,
        nesting_limit: int = DEFAULT_NESTING_LIMIT,
        caps: Sequence[Any] = (),
        keep: object = None,
        owned: bool = False,
    ) -> None:
        #: The segments as ``bytes``, whatever kind of buffer they came in: the compiled
        #: readers read words and bytes of a ``bytes`` object natively (librt.strings),
        #: with no Python call and no tuple per read. A ``bytes`` segment is kept as it
        #: is; a bytearray or memoryview one is copied once here. ``owned``: the caller
        #: made the list for this message alone (a decoder's), so a list of one ``bytes``
        #: is kept as it is rather than copied.
        only = segments[0] if len(segments) == 1 else None
        if type(only) is bytes:  # the common case, without the comprehensions
            if owned and type(segments) is list:
                self.segments: list[bytes] = cast("list[bytes]", segments)
            else:
                self.segments = [only]
            self.sizes = [len(only) >> 3]
        else:
            self.segments = [
                segment if type(segment) is bytes else bytes(segment) for segment in segments
            ]
            #: Whole words in each segment (a trailing partial word does not count).
            self.sizes = [len(segment) >> 3 for segment in self.segments]
        #: The capabilities capability pointers index (an RPC payload's cap table, as
        #: hooks): what an interface field reads as (``read_client``).
        self.caps = caps
        #: Whatever must stay alive while readers of this message do (the call result
        #: that owns the payload, for an RPC message).
        self.keep = keep
        self.budget = traversal_limit_words
        self.nesting_limit = nesting_limit

    def charge(self, words: int) -> None:
        budget = self.budget - (words if words > 0 else 1)
        if budget < 0:
            raise DecodeError(
                "message exceeds the traversal limit (a pointer loop, or an object read too"
                " many times)"
            )
        self.budget = budget


def _resolve(msg: MessageReader, si: int, w: int) -> tuple[int, int, int] | None:
    """Where the pointer word at word ``w`` of segment ``si`` leads.

    Returns None for a null pointer, else (segment, position, word): the object starts at
    word ``position + 1 + offset`` of ``segment``, offset and kind coming from ``word``, a
    near pointer (far pointers are followed here).
    """
    word = _word(msg.segments[si], w << 3)
    if word == 0:
        return None
    if word & 3 != 2:
        return si, w, word
    target = word >> 32
    pad = (word >> 3) & 0x1FFFFFFF
    if target >= len(msg.sizes):
        raise DecodeError(f"far pointer to segment {target}, which does not exist")
    double = word & 4
    if pad + (2 if double else 1) > msg.sizes[target]:
        raise DecodeError(f"far pointer's landing pad is outside segment {target}")
    segment = msg.segments[target]
    landing = _word(segment, pad << 3)
    if not double:
        if landing & 3 == 2:
            raise DecodeError("far pointer lands on another far pointer")
        return target, pad, landing
    if landing & 7 != 2:
        raise DecodeError("double-far pointer's landing pad is not a single far pointer")
    tag = _word(segment, (pad + 1) << 3)
    if tag & 3 == 2 or tag & 0xFFFFFFFC:
        raise DecodeError("double-far pointer's tag word is not an offset-0 pointer")
    content = landing >> 32
    if content >= len(msg.sizes):
        raise DecodeError(f"far pointer to segment {content}, which does not exist")
    # The content starts at the landing pad's target: position + 1 + 0 must be that word.
    return content, ((landing >> 3) & 0x1FFFFFFF) - 1, tag


def _offset(word: int) -> int:
    """The signed 30-bit word offset of a struct or list pointer."""
    return (((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2


def new_reader(
    cls: type[R],
    msg: MessageReader,
    si: int,
    start: int,
    data_words: int,
    pointers: int,
    depth: int,
) -> R:
    """A ``cls`` reader of the struct at word ``start`` of segment ``si`` with the given
    section sizes (a module function, so compiled callers reach it with no Python call).
    A data section shorter than the schema's (an older writer) is read from a zero-padded
    copy."""
    schema_words = cls._DATA_WORDS  # (a type attribute: looked up once)
    if data_words >= schema_words:
        return fitting_reader(cls, msg, msg.segments[si], si, start, data_words, pointers, depth)
    padded = padded_data(msg.segments[si], start, data_words, schema_words)
    reader = fitting_reader(cls, msg, padded, si, start, data_words, pointers, depth)
    reader._data = 0
    return reader


def padded_data(segment: bytes, start: int, data_words: int, schema_words: int) -> bytes:
    """The ``data_words`` data section at word ``start``, zero-padded to the schema's
    ``schema_words``: what a struct from an older writer is read from (its missing fields
    read as their defaults)."""
    return bytes(segment[start << 3 : (start + data_words) << 3]) + bytes(
        (schema_words - data_words) << 3
    )


def written_sections(reader: StructReader) -> tuple[int, int]:
    """(data words, pointers) of the struct ``reader`` reads, as its writer sized them: a
    copy keeps them all (a newer writer's unknown fields too). An older writer's shorter
    data section is read from a zero-padded copy: the schema's size then."""
    if reader._seg is reader._msg.segments[reader._si]:
        data_words = reader._ptr - (reader._data >> 3)
    else:
        data_words = type(reader)._DATA_WORDS
    return data_words, reader._pend - reader._ptr


def fitting_reader(
    cls: type[R],
    msg: MessageReader,
    segment: bytes,
    si: int,
    start: int,
    data_words: int,
    pointers: int,
    depth: int,
) -> R:
    """``new_reader`` for a data section known to be at least the schema's (``segment`` is
    segment ``si``; callers that make many readers of one list check once).

    ``cls()`` rather than ``cls.__new__(cls)``: the type call goes straight to the slot
    (``tp_new``), about 100 ns less per reader than looking ``__new__`` up and calling it.
    """
    reader = cls()
    reader._msg = msg
    reader._si = si
    reader._seg = segment
    reader._data = start << 3
    reader._ptr = start + data_words
    reader._pend = start + data_words + pointers
    reader._depth = depth
    return reader


def group_view(cls: type[R], parent: StructReader) -> R:
    """A group of ``parent``: a ``cls`` reader of the same sections."""
    reader = cls()
    reader._msg = parent._msg
    reader._si = parent._si
    reader._seg = parent._seg
    reader._data = parent._data
    reader._ptr = parent._ptr
    reader._pend = parent._pend
    reader._depth = parent._depth
    return reader


# ---------------------------------------------------------------------- structs
@mypyc_attr(allow_interpreted_subclasses=True)
class StructReader:
    """A struct in a received message. Generated subclasses add one property per field.

    ``_seg`` and ``_data`` locate the data section; it is always at least as long as this
    schema's (a struct from an older writer, with a shorter data section, is read from a
    zero-padded copy: its missing fields read as their defaults), so generated accessors
    read their field at a fixed offset with no bounds check. ``_ptr``/``_pend`` are the
    pointer section's words in segment ``_si``; a slot past ``_pend`` reads as null.
    """

    __slots__ = ("_data", "_depth", "_msg", "_pend", "_ptr", "_seg", "_si")

    #: The schema's section sizes (data words, pointers): what a builder allocates.
    _DATA_WORDS: ClassVar[int] = 0
    _POINTERS: ClassVar[int] = 0
    #: The schema ID of the struct (generated classes set it; 0: not known): a reader or
    #: builder is copied only into a field of its own struct type.
    _STRUCT_ID: ClassVar[int] = 0

    _msg: MessageReader
    _si: int
    _seg: bytes
    _data: int
    _ptr: int
    _pend: int
    _depth: int

    @classmethod
    def _at(
        cls: type[R],
        msg: MessageReader,
        si: int,
        start: int,
        data_words: int,
        pointers: int,
        depth: int,
    ) -> R:
        return new_reader(cls, msg, si, start, data_words, pointers, depth)

    @classmethod
    def _padded(cls: type[R], msg: MessageReader, si: int, data: bytes, depth: int) -> R:
        """A struct whose data section is ``data`` (a sub-word list element) and which
        has no pointers."""
        reader = cls()
        reader._msg = msg
        reader._si = si
        reader._seg = data + bytes(max(0, (cls._DATA_WORDS << 3) - len(data)))
        reader._data = 0
        reader._ptr = 0
        reader._pend = 0
        reader._depth = depth
        return reader

    def _text(self, slot: int, default: str) -> str:
        """The Text in pointer ``slot`` (the pure build's Text fields read through it)."""
        w = self._ptr + slot
        return read_text(self._msg, self._si, w if w < self._pend else -1, default)

    @classmethod
    def _empty(cls: type[R], msg: MessageReader, depth: int = 0) -> R:
        """The struct a null pointer stands for: every field at its default."""
        return new_reader(cls, msg, 0, 0, 0, 0, depth) if msg.segments else cls._nothing()

    @classmethod
    def _nothing(cls: type[R]) -> R:
        return new_reader(cls, _NO_MESSAGE, 0, 0, 0, 0, 0)

    @classmethod
    def read(
        cls: type[R],
        segments: Segments,
        *,
        traversal_limit_words: int = DEFAULT_TRAVERSAL_LIMIT,
        nesting_limit: int = DEFAULT_NESTING_LIMIT,
    ) -> R:
        """The message's root struct, read as this type."""
        return read_segments(cls, segments, traversal_limit_words, nesting_limit)

    @classmethod
    def _view(cls: type[R], parent: StructReader) -> R:
        return group_view(cls, parent)

    @classmethod
    def _of_builder(cls: type[R], builder: Any) -> R:
        """A reader of a struct being built (its message as it is now, capabilities
        included: its cap table is the builder's, so a capability read or copied from it
        is the one put in; the reader keeps the builder's message, which owns them)."""
        msg = MessageReader([bytes(builder._b.buf)], caps=builder._b.caps, keep=builder._b)
        start = builder._data >> 3
        # The builder's own data size: a struct copied in from a newer writer has more
        # data words than the schema (capsvc.codec.building.struct_at).
        data_words = builder._ptr - start
        pointers = builder._pend - builder._ptr  # (and its own pointers: a newer writer's)
        return new_reader(cls, msg, 0, start, data_words, pointers, DEFAULT_NESTING_LIMIT)

    #: Where the struct's union discriminant is (a byte offset in the data section; -1:
    #: no union) and its members' names by discriminant value (generated readers set it).
    _WHICH: ClassVar[tuple[int, tuple[str, ...]]] = (-1, ())

    def which(self) -> str | None:
        """The union member that is set (None: one this schema does not know). Compiled
        here for every generated reader (a Python method per struct would cost a frame);
        the generated classes type it with a ``Literal`` of their members' names."""
        at, names = type(self)._WHICH
        if at < 0:
            raise TypeError(f"{type(self).__qualname__} has no union")
        code = int(read_i16_le(self._seg, self._data + at)) & 0xFFFF
        return names[code] if code < len(names) else None

    def _has(self, slot: int) -> bool:
        """True if pointer ``slot`` is present and not null."""
        w = self._ptr + slot
        # The segment itself: ``_seg`` may be a padded copy of the data section only.
        return w < self._pend and read_i64_le(self._msg.segments[self._si], w << 3) != 0

    def _pointer(self, slot: int) -> int:
        """The word index of pointer ``slot``, or -1 when the writer had no such slot."""
        w = self._ptr + slot
        return w if w < self._pend else -1

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} {shown_fields(self)}>"

    # ``with Car.from_bytes(data) as car:``, as pycapnp 2 has it (its from_bytes is a
    # context manager that closes the message); a reader here holds nothing to close.
    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


#: The longest a struct's fields are shown in its repr (a repr of a large message would
#: otherwise fill a terminal or a log line).
REPR_LIMIT: Final = 1000


def shown_fields(struct: Any) -> str:
    """A struct reader's or builder's fields, for its repr: its ``to_dict()``, cut short
    past REPR_LIMIT characters. Never raises (a repr that raised would hide the error
    being reported): a message that cannot be read shows why."""
    try:
        text = repr(struct.to_dict())
    except Exception as error:
        return f"(unreadable: {type(error).__name__}: {error})"
    return text if len(text) <= REPR_LIMIT else text[:REPR_LIMIT] + " ...}"


_NO_MESSAGE = MessageReader([bytes(8)])


def default_location(default: Segments) -> tuple[MessageReader, int, int]:
    """Where a generated default value is: pointer 0 of its message's root struct."""
    msg = MessageReader(default)
    found = _resolve(msg, 0, 0)
    assert found is not None, "a default is a struct with a pointer"
    si, position, word = found
    return msg, si, position + 1 + _offset(word) + ((word >> 32) & 0xFFFF)


def read_struct(
    msg: MessageReader, si: int, w: int, cls: type[R], depth: int, default: Segments | None
) -> R:
    """The struct the pointer at (``si``, ``w``) leads to (``w`` < 0: an absent slot)."""
    si, start, data_words, pointers = locate_struct(msg, si, w, depth)
    if si >= 0:
        return new_reader(cls, msg, si, start, data_words, pointers, depth - 1)
    if default is not None:
        dmsg, dsi, dw = default_location(default)
        return read_struct(dmsg, dsi, dw, cls, DEFAULT_NESTING_LIMIT, None)
    return cls._empty(msg, depth)


def locate_struct(msg: MessageReader, si: int, w: int, depth: int) -> tuple[int, int, int, int]:
    """(segment, first word, data words, pointers) of the struct the pointer at (``si``,
    ``w``) leads to, bounds-checked and charged to the traversal budget (a native tuple in
    the compiled build: nothing allocated); segment -1 for a null pointer or ``w`` < 0
    (an absent slot). ``depth`` is the nesting left: the struct is one level below."""
    if w >= 0:
        near = read_i64_le(msg.segments[si], w << 3)  # i64, signed: mask what a shift brings
        if near & 3 == 0 and near != 0 and depth > 0:
            # The common case, inline: a near struct pointer within bounds and budget.
            data_words = (near >> 32) & 0xFFFF
            pointers = (near >> 48) & 0xFFFF
            start = w + 1 + ((((near & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2)
            size = data_words + pointers
            budget = msg.budget - (size or 1)
            if start >= 0 and start + size <= msg.sizes[si] and budget >= 0:
                msg.budget = budget
                return si, start, data_words, pointers
    found = _resolve(msg, si, w) if w >= 0 else None
    if found is None:
        return -1, 0, 0, 0
    si, position, word = found
    if word & 3 != 0:
        raise DecodeError(f"expected a struct pointer, found {_kind_name(word)}")
    if depth <= 0:
        raise DecodeError("message exceeds the nesting limit")
    data_words = (word >> 32) & 0xFFFF
    pointers = word >> 48
    start = position + 1 + _offset(word)
    if start < 0 or start + data_words + pointers > msg.sizes[si]:
        raise DecodeError("struct pointer out of bounds")
    msg.charge(data_words + pointers)
    return si, start, data_words, pointers


def _kind_name(word: int) -> str:
    return ("a struct pointer", "a list pointer", "a far pointer", "a capability")[word & 3]


# ---------------------------------------------------------------------- text and data
def _byte_list(msg: MessageReader, si: int, w: int, what: str) -> tuple[bytes, int, int] | None:
    """(segment, first byte, length) of the byte list the pointer at (si, w) leads to."""
    found = _resolve(msg, si, w) if w >= 0 else None
    if found is None:
        return None
    si, position, word = found
    if word & 3 != 1:
        raise DecodeError(f"expected {what} (a list pointer), found {_kind_name(word)}")
    if (word >> 32) & 7 != 2:
        raise DecodeError(
            f"expected {what}: a list of bytes, found element size {(word >> 32) & 7}"
        )
    count = word >> 35
    start = position + 1 + _offset(word)
    words = (count + 7) >> 3
    if start < 0 or start + words > msg.sizes[si]:
        raise DecodeError(f"{what} out of bounds")
    msg.charge(words)
    return msg.segments[si], start << 3, count


def read_text(msg: MessageReader, si: int, w: int, default: str) -> str:
    if w >= 0:
        segment = msg.segments[si]
        word = read_i64_le(segment, w << 3)  # signed: mask what a shift brings
        if word & 0x7_0000_0003 == 0x2_0000_0001:  # the common case, inline: a near byte list
            count = (word >> 35) & 0x1FFFFFFF
            start = (w + 1 + ((((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2)) << 3
            words = (count + 7) >> 3
            budget = msg.budget - (words or 1)
            end = start + count - 1
            if (
                count
                and start >= 0
                and start + (words << 3) <= msg.sizes[si] << 3
                and budget >= 0
                and segment[end] == 0
            ):
                msg.budget = budget
                try:
                    return segment[start:end].decode()
                except UnicodeDecodeError as error:
                    raise DecodeError(f"Text is not valid UTF-8: {error.reason}") from None
    found = _byte_list(msg, si, w, "Text")
    if found is None:
        return default
    segment, start, count = found
    if count == 0 or segment[start + count - 1] != 0:
        raise DecodeError("Text is not NUL-terminated")
    try:
        return str(segment[start : start + count - 1], "utf-8")
    except UnicodeDecodeError as error:
        raise DecodeError(f"Text is not valid UTF-8: {error.reason}") from None


def read_data(msg: MessageReader, si: int, w: int, default: bytes) -> bytes:
    found = _byte_list(msg, si, w, "Data")
    if found is None:
        return default
    segment, start, count = found
    return bytes(segment[start : start + count])


# ---------------------------------------------------------------------- lists
class _ListShape:
    """Where a list's elements are: what ``_open_list`` found behind a list pointer.

    ``code`` is the element size code (0 void .. 6 pointer, 7 composite); every element is
    ``step_bits`` apart, and (struct-shaped) holds ``data_words`` data words (0 or 1 for a
    primitive list: a sub-word element is its whole data section) then ``pointers``.
    """

    __slots__ = ("code", "count", "data_words", "pointers", "si", "start", "step_bits")

    def __init__(
        self,
        si: int,
        start: int,
        count: int,
        code: int,
        step_bits: int,
        data_words: int,
        pointers: int,
    ) -> None:
        self.si = si
        self.start = start  # first element, in words
        self.count = count
        self.code = code
        self.step_bits = step_bits
        self.data_words = data_words
        self.pointers = pointers


def _open_list(msg: MessageReader, si: int, w: int, depth: int) -> _ListShape | None:
    if w < 0:
        return None
    word = _word(msg.segments[si], w << 3)
    if word & 3 == 2:
        found = _resolve(msg, si, w)
        assert found is not None
        si, position, word = found
    elif word == 0:
        return None
    else:
        position = w
    if word & 3 != 1:
        raise DecodeError(f"expected a list pointer, found {_kind_name(word)}")
    if depth <= 0:
        raise DecodeError("message exceeds the nesting limit")
    code = (word >> 32) & 7
    count = word >> 35
    start = position + 1 + _offset(word)
    if code != _COMPOSITE:
        bits = _ELEMENT_BITS[code]
        words = (count * bits + 63) >> 6
        if start < 0 or start + words > msg.sizes[si]:
            raise DecodeError("list out of bounds")
        msg.charge(words if bits else count)
        pointer = code == _POINTER_SIZE
        return _ListShape(
            si, start, count, code, bits, int(not pointer and bits >= 64), int(pointer)
        )
    # Composite: ``count`` is the words of the elements; a tag word comes first.
    if start < 0 or start + 1 + count > msg.sizes[si]:
        raise DecodeError("composite list out of bounds")
    tag = _word(msg.segments[si], start << 3)
    if tag & 3 != 0:
        raise DecodeError("composite list's tag is not struct-shaped")
    elements = (tag & 0xFFFFFFFF) >> 2
    data_words = (tag >> 32) & 0xFFFF
    pointers = tag >> 48
    size = data_words + pointers
    if elements * size > count:
        raise DecodeError("composite list's elements overrun it")
    msg.charge(elements * size if size else elements)
    return _ListShape(si, start + 1, elements, code, size << 6, data_words, pointers)


@mypyc_attr(allow_interpreted_subclasses=True)
class ListReader(Generic[T]):
    """A list in a received message: ``len()``, indexing, iteration. Kinds subclass it."""

    __slots__ = ("_count", "_depth", "_msg", "_seg", "_shape")

    def __init__(self, msg: MessageReader, shape: _ListShape | None, depth: int) -> None:
        self._msg = msg
        self._shape = shape
        self._count = shape.count if shape is not None else 0
        self._seg = msg.segments[shape.si] if shape is not None else b""
        self._depth = depth
        if shape is not None:
            self._check(shape)

    def _check(self, shape: _ListShape) -> None:
        """Refuse encodings that cannot stand for this element type."""

    def __len__(self) -> int:
        return self._count

    def _index(self, index: int) -> int:
        count = self._count
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("list index out of range")
        return index

    def __getitem__(self, index: int) -> T:
        return self._get(self._index(index))

    def _get(self, index: int) -> T:
        raise NotImplementedError

    def __iter__(self) -> Iterator[T]:
        get = self._get
        for index in range(self._count):
            yield get(index)

    def __repr__(self) -> str:
        return f"[{', '.join(repr(item) for item in self)}]"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ListReader | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@mypyc_attr(allow_interpreted_subclasses=True)
class PrimitiveList(ListReader[T]):
    """A list of numbers (``fmt``: a struct format letter) or of enums (``wrap``)."""

    __slots__ = ("_bits", "_unpack", "_wrap")

    def __init__(
        self,
        msg: MessageReader,
        shape: _ListShape | None,
        depth: int,
        fmt: str,
        wrap: Callable[[Any], T] | None = None,
    ) -> None:
        packer = struct.Struct("<" + fmt)
        self._unpack = packer.unpack_from
        self._bits = packer.size * 8
        self._wrap = wrap
        super().__init__(msg, shape, depth)

    def _check(self, shape: _ListShape) -> None:
        # Exactly this width, or structs (a list upgraded to structs: the first data word
        # holds the element, rpc encoding spec "Lists of structs"), as libcapnp accepts.
        if shape.code == _POINTER_SIZE or (
            shape.code != _COMPOSITE and shape.step_bits != self._bits and shape.count
        ):
            raise DecodeError(
                f"expected a list of {self._bits}-bit numbers, found element size code {shape.code}"
            )

    def _get(self, index: int) -> T:
        shape = self._shape
        assert shape is not None
        if shape.code == _COMPOSITE and shape.data_words == 0:
            value: Any = 0  # structs without data (schema evolution): the default
        else:
            offset = (shape.start << 3) + ((index * shape.step_bits) >> 3)
            (value,) = self._unpack(self._seg, offset)
        return self._wrap(value) if self._wrap is not None else value


@mypyc_attr(allow_interpreted_subclasses=True)
class BoolList(ListReader[bool]):
    __slots__ = ()

    def _check(self, shape: _ListShape) -> None:
        if shape.code != 1 and shape.count:  # a List(Bool) cannot be upgraded (spec)
            raise DecodeError(f"expected a list of Bool, found element size code {shape.code}")

    def _get(self, index: int) -> bool:
        shape = self._shape
        assert shape is not None
        bit = index * shape.step_bits
        return bool(self._seg[(shape.start << 3) + (bit >> 3)] >> (bit & 7) & 1)


@mypyc_attr(allow_interpreted_subclasses=True)
class VoidList(ListReader[None]):
    __slots__ = ()

    def _get(self, index: int) -> None:
        return None


@mypyc_attr(allow_interpreted_subclasses=True)
class _PointerElements(ListReader[T]):
    """Lists whose elements are pointers (Text, Data, lists, structs as pointer lists)."""

    __slots__ = ()

    def _check(self, shape: _ListShape) -> None:
        # Pointers, or structs whose first pointer is the element (an upgraded list).
        if shape.pointers == 0 and shape.count:
            raise DecodeError(f"expected a list of pointers, found element size code {shape.code}")

    def _element_pointer(self, index: int) -> int:
        shape = self._shape
        assert shape is not None
        return shape.start + ((index * shape.step_bits) >> 6) + shape.data_words


@mypyc_attr(allow_interpreted_subclasses=True)
class TextList(_PointerElements[str]):
    __slots__ = ()

    def _get(self, index: int) -> str:
        shape = self._shape
        assert shape is not None
        return read_text(self._msg, shape.si, self._element_pointer(index), "")


@mypyc_attr(allow_interpreted_subclasses=True)
class DataList(_PointerElements[bytes]):
    __slots__ = ()

    def _get(self, index: int) -> bytes:
        shape = self._shape
        assert shape is not None
        return read_data(self._msg, shape.si, self._element_pointer(index), b"")


@mypyc_attr(allow_interpreted_subclasses=True)
class ListList(_PointerElements["ListReader[Any]"]):
    """A list of lists; ``inner`` makes the reader of each element."""

    __slots__ = ("_inner",)

    def __init__(
        self,
        msg: MessageReader,
        shape: _ListShape | None,
        depth: int,
        inner: Callable[[MessageReader, int, int, int], ListReader[Any]],
    ) -> None:
        self._inner = inner
        super().__init__(msg, shape, depth)

    def _get(self, index: int) -> ListReader[Any]:
        shape = self._shape
        assert shape is not None
        return self._inner(self._msg, shape.si, self._element_pointer(index), self._depth)


@mypyc_attr(allow_interpreted_subclasses=True)
class StructList(ListReader[R]):
    """A list of structs (composite; or, from an older writer, words or pointers).

    Element ``i`` starts at word ``_start + i * _words`` of segment ``_si`` and has ``_dw``
    data words and ``_pc`` pointers; ``_words`` 0 means sub-word elements (an upgraded
    primitive list), read through ``_shape``.
    """

    __slots__ = ("_cls", "_dw", "_pc", "_si", "_start", "_words")

    def __init__(
        self, msg: MessageReader, shape: _ListShape | None, depth: int, cls: type[R]
    ) -> None:
        self._cls = cls
        self._msg = msg
        self._shape = shape
        self._depth = depth
        if shape is None:
            self._count = self._si = self._start = self._words = self._dw = self._pc = 0
            self._seg = b""
            return
        if shape.code == 1 and shape.count:
            raise DecodeError("expected a list of structs, found a list of Bool")
        self._count = shape.count
        self._si = shape.si
        self._seg = msg.segments[shape.si]
        self._start = shape.start
        self._words = shape.step_bits >> 6
        self._dw = shape.data_words
        self._pc = shape.pointers

    def _get(self, index: int) -> R:
        words = self._words
        if not words:  # sub-word data elements (an upgraded primitive list)
            shape = self._shape
            assert shape is not None
            first = (shape.start << 3) + ((index * shape.step_bits) >> 3)
            data = bytes(self._seg[first : first + (shape.step_bits >> 3)])
            return self._cls._padded(self._msg, shape.si, data, self._depth)
        return new_reader(
            self._cls,
            self._msg,
            self._si,
            self._start + index * words,
            self._dw,
            self._pc,
            self._depth,
        )

    def __iter__(self) -> Iterator[R]:
        words = self._words
        if not words:
            return super().__iter__()
        if self._count <= SHORT_LIST:
            # Every reader at once: a list iterator ends without an exception, while a
            # compiled __next__'s StopIteration gets a traceback entry (a code object and
            # a frame, about 2,000 instructions: more than four readers cost).
            cls, msg, si, dw, pc, depth = (
                self._cls,
                self._msg,
                self._si,
                self._dw,
                self._pc,
                self._depth,
            )
            start = self._start
            stop = start + self._count * words
            if dw < cls._DATA_WORDS:  # an older writer's elements: each one padded
                return iter(
                    [
                        new_reader(cls, msg, si, at, dw, pc, depth)
                        for at in range(start, stop, words)
                    ]
                )
            seg = self._seg
            return iter(
                [
                    fitting_reader(cls, msg, seg, si, at, dw, pc, depth)
                    for at in range(start, stop, words)
                ]
            )
        return StructElements(self, words)


#: Struct lists up to this long are iterated over a list of all their readers, made at
#: once (see ``StructList.__iter__``); longer ones one reader at a time.
SHORT_LIST: Final = 64


class StructElements(Generic[R]):
    """Iteration over a struct list of whole-word elements: one reader per element,
    made by a compiled ``__next__`` (no Python call, no argument parsing per element)."""

    __slots__ = (
        "_at",
        "_cls",
        "_depth",
        "_dw",
        "_fits",
        "_msg",
        "_pc",
        "_seg",
        "_si",
        "_step",
        "_stop",
    )

    def __init__(self, elements: StructList[R], words: int) -> None:
        self._cls = elements._cls
        self._msg = elements._msg
        self._si = elements._si
        self._seg = elements._seg
        #: Whether the elements' data sections are at least the schema's (else: padded).
        self._fits = elements._dw >= elements._cls._DATA_WORDS
        self._at = elements._start
        self._stop = elements._start + elements._count * words
        self._step = words
        self._dw = elements._dw
        self._pc = elements._pc
        self._depth = elements._depth

    def __iter__(self) -> StructElements[R]:
        return self

    def __next__(self) -> R:
        at = self._at
        if at >= self._stop:
            raise StopIteration
        self._at = at + self._step
        if self._fits:
            return fitting_reader(
                self._cls, self._msg, self._seg, self._si, at, self._dw, self._pc, self._depth
            )
        return new_reader(self._cls, self._msg, self._si, at, self._dw, self._pc, self._depth)


def _composite(
    msg: MessageReader, si: int, w: int, depth: int, cls: type[R]
) -> StructList[R] | None:
    """The fast path of ``struct_list``: a near pointer to a composite list of non-empty
    structs, within bounds and budget; None for anything else (the general path decides)."""
    start, elements, data_words, pointers = near_composite(msg, si, w, depth)
    if elements < 0:
        return None
    lst = StructList(msg, None, depth - 1, cls)  # an empty list, filled in below
    lst._count = elements
    lst._si = si
    lst._seg = msg.segments[si]
    lst._start = start
    lst._words = data_words + pointers
    lst._dw = data_words
    lst._pc = pointers
    return lst


def near_composite(msg: MessageReader, si: int, w: int, depth: int) -> tuple[int, int, int, int]:
    """(first element's word, elements, data words, pointers) of the composite list of
    non-empty structs a near pointer at (``si``, ``w``) leads to, bounds-checked and
    charged (a native tuple in the compiled build); elements -1 for anything else, which
    the general path (``_open_list``) then reads or names the fault of."""
    if w < 0 or depth <= 0:
        return 0, -1, 0, 0
    segment = msg.segments[si]
    word = read_i64_le(segment, w << 3)  # signed: mask what a shift brings
    if word & 3 != 1 or (word >> 32) & 7 != _COMPOSITE:
        return 0, -1, 0, 0
    total = (word >> 35) & 0x1FFFFFFF
    start = w + 1 + ((((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2)
    if start < 0 or start + 1 + total > msg.sizes[si]:
        return 0, -1, 0, 0
    tag = read_i64_le(segment, start << 3)
    elements = (tag & 0xFFFFFFFF) >> 2
    data_words = (tag >> 32) & 0xFFFF
    pointers = (tag >> 48) & 0xFFFF
    size = data_words + pointers
    budget = msg.budget - elements * size
    if tag & 3 or not size or elements * size > total or budget < 0:
        return 0, -1, 0, 0
    msg.budget = budget
    return start + 1, elements, data_words, pointers


@mypyc_attr(allow_interpreted_subclasses=True)
class AnyPointer:
    """An AnyPointer field: read it as the type you know it to be."""

    __slots__ = ("_depth", "_msg", "_si", "_w")

    def __init__(self, msg: MessageReader, si: int, w: int, depth: int) -> None:
        self._msg = msg
        self._si = si
        self._w = w
        self._depth = depth

    @property
    def is_null(self) -> bool:
        return self._w < 0 or _resolve(self._msg, self._si, self._w) is None

    def as_struct(self, cls: type[R]) -> R:
        return read_struct(self._msg, self._si, self._w, cls, self._depth, None)

    def as_text(self) -> str:
        return read_text(self._msg, self._si, self._w, "")

    def as_data(self) -> bytes:
        return read_data(self._msg, self._si, self._w, b"")

    def as_list(
        self, make: Callable[[MessageReader, int, int, int], ListReader[T]]
    ) -> ListReader[T]:
        return make(self._msg, self._si, self._w, self._depth)

    def capability_index(self) -> int | None:
        """The cap-table index if this pointer is a capability, None if it is null."""
        return read_capability(self._msg, self._si, self._w)

    def as_interface(self, cls: ClientFactory[C]) -> C:
        """The capability this pointer holds, as a client of class ``cls`` (a generated
        ``Iface.Client``, or capsvc.typed.Client); a null pointer gives a null client."""
        return read_client(self._msg, self._si, self._w, cls)

    def __repr__(self) -> str:
        return "<AnyPointer null>" if self.is_null else "<AnyPointer>"


def read_capability(msg: MessageReader, si: int, w: int) -> int | None:
    """The cap-table index of the capability pointer at (si, w); None for a null one."""
    if w < 0:
        return None
    word = _word(msg.segments[si], w << 3)
    if word == 0:
        return None
    if word & 0xFFFFFFFF != 3:
        raise DecodeError(f"expected a capability, found {_kind_name(word)}")
    return int(word >> 32)


# ---------------------------------------------------------------------- list makers
def primitive_list(
    fmt: str, wrap: Callable[[Any], Any] | None = None
) -> Callable[[MessageReader, int, int, int], PrimitiveList[Any]]:
    def make(msg: MessageReader, si: int, w: int, depth: int) -> PrimitiveList[Any]:
        return PrimitiveList(msg, _open_list(msg, si, w, depth), depth - 1, fmt, wrap)

    return make


def simple_list(
    kind: type[ListReader[Any]],
) -> Callable[[MessageReader, int, int, int], ListReader[Any]]:
    def make(msg: MessageReader, si: int, w: int, depth: int) -> ListReader[Any]:
        return kind(msg, _open_list(msg, si, w, depth), depth - 1)

    return make


def read_struct_list(
    msg: MessageReader, si: int, w: int, depth: int, cls: type[R]
) -> StructList[R]:
    """The list of ``cls`` structs the pointer at (``si``, ``w``) leads to."""
    found = _composite(msg, si, w, depth, cls)
    if found is not None:
        return found
    return StructList(msg, _open_list(msg, si, w, depth), depth - 1, cls)


def struct_list(cls: type[R]) -> Callable[[MessageReader, int, int, int], StructList[R]]:
    def make(msg: MessageReader, si: int, w: int, depth: int) -> StructList[R]:
        return read_struct_list(msg, si, w, depth, cls)

    return make


def list_list(
    inner: Callable[[MessageReader, int, int, int], ListReader[Any]],
) -> Callable[[MessageReader, int, int, int], ListList]:
    def make(msg: MessageReader, si: int, w: int, depth: int) -> ListList:
        return ListList(msg, _open_list(msg, si, w, depth), depth - 1, inner)

    return make


class ClientFactory(Protocol[C]):
    """A generated interface's Client class, as readers make clients of it."""

    @classmethod
    def _from_table(cls, caps: Sequence[Any], index: int | None) -> C: ...


def read_client(msg: MessageReader, si: int, w: int, cls: ClientFactory[C]) -> C:
    """An interface field: a client of the capability its pointer names in the message's
    cap table (a null pointer, or one the table has no entry for, gives a client whose
    calls fail, as libcapnp's null and broken capabilities do)."""
    return cls._from_table(msg.caps, read_capability(msg, si, w))


@mypyc_attr(allow_interpreted_subclasses=True)
class ClientList(_PointerElements[E]):
    """A List of an interface type: a client per element."""

    __slots__ = ("_cls",)

    def __init__(
        self, msg: MessageReader, shape: _ListShape | None, depth: int, cls: ClientFactory[E]
    ) -> None:
        self._cls = cls
        super().__init__(msg, shape, depth)

    def _get(self, index: int) -> E:
        shape = self._shape
        assert shape is not None
        return read_client(self._msg, shape.si, self._element_pointer(index), self._cls)


def client_list(cls: ClientFactory[E]) -> Callable[[MessageReader, int, int, int], ClientList[E]]:
    def make(msg: MessageReader, si: int, w: int, depth: int) -> ClientList[E]:
        return ClientList(msg, _open_list(msg, si, w, depth), depth - 1, cls)

    return make


@mypyc_attr(allow_interpreted_subclasses=True)
class AnyPointerList(_PointerElements[AnyPointer]):
    __slots__ = ()

    def _get(self, index: int) -> AnyPointer:
        shape = self._shape
        assert shape is not None
        return AnyPointer(self._msg, shape.si, self._element_pointer(index), self._depth)


def default_dict(reader: Any) -> dict[str, Any]:
    """``to_dict`` of a union member that is set with its struct pointer null: its
    default's fields, as pycapnp gives them; but ``{}`` for a struct type already being
    expanded so, further out (``struct Msg { union { wrapped @0 :Msg; ... } }``: a null
    member's default sets that member again, forever; pycapnp's recursion crashes)."""
    expanding = _DEFAULTS_EXPANDING.__dict__.setdefault("types", set())
    kind = type(reader)
    if kind in expanding:
        return {}
    expanding.add(kind)
    try:
        return reader.to_dict()  # type: ignore[no-any-return]
    finally:
        expanding.discard(kind)


#: The struct types ``default_dict`` is expanding, per thread.
_DEFAULTS_EXPANDING: Final = threading.local()


def enum_name(value: object) -> object:
    """An enum value as ``to_dict`` gives it, as pycapnp's: the enumerant's schema name
    (a keyword's Python name has a trailing underscore: ``from_`` is ``from``; schema names
    have no underscores), or the number of an enumerant this schema does not know."""
    name = getattr(value, "name", None)
    if not isinstance(name, str):
        return value
    return name[:-1] if name.endswith("_") else name


def is_null(msg: MessageReader, si: int, w: int) -> bool:
    return w < 0 or read_i64_le(msg.segments[si], w << 3) == 0


def list_or_default(
    make: Callable[[MessageReader, int, int, int], ListReader[T]],
    msg: MessageReader,
    si: int,
    w: int,
    depth: int,
    default: Segments,
) -> ListReader[T]:
    """The list at (si, w), or the field's default list when that pointer is null."""
    if not is_null(msg, si, w):
        return make(msg, si, w, depth)
    dmsg, dsi, dw = default_location(default)
    return make(dmsg, dsi, dw, DEFAULT_NESTING_LIMIT)


def default_struct(cls: type[R], default: Segments) -> R:
    """A struct constant."""
    msg, si, w = default_location(default)
    return read_struct(msg, si, w, cls, DEFAULT_NESTING_LIMIT, None)


def default_list(
    make: Callable[[MessageReader, int, int, int], ListReader[T]], default: Segments
) -> ListReader[T]:
    """A list constant."""
    msg, si, w = default_location(default)
    return make(msg, si, w, DEFAULT_NESTING_LIMIT)


def default_any(default: Segments) -> AnyPointer:
    msg, si, w = default_location(default)
    return AnyPointer(msg, si, w, DEFAULT_NESTING_LIMIT)


def read_segments(
    cls: type[R],
    segments: Segments,
    traversal_limit_words: int,
    nesting_limit: int,
    owned: bool = False,
) -> R:
    """The root ``cls`` struct of a message (its segments): what ``StructReader.read``
    and generated ``read`` call (positional, one compiled call). ``owned``: ``segments``
    is a list made for this message alone (a decoder's), kept as the message's own."""
    msg = MessageReader(
        segments,
        traversal_limit_words=traversal_limit_words,
        nesting_limit=nesting_limit,
        owned=owned,
    )
    return read_root(msg, cls, nesting_limit)


def read_root(msg: MessageReader, cls: type[R], nesting_limit: int) -> R:
    """The root ``cls`` struct of ``msg``: what its first word points to."""
    sizes = msg.sizes
    if not sizes or sizes[0] < 1:
        raise DecodeError("message has no root pointer")
    return read_struct(msg, 0, 0, cls, nesting_limit, None)


def read_framed(
    cls: type[R],
    data: bytes | bytearray | memoryview,
    traversal_limit_words: int = DEFAULT_TRAVERSAL_LIMIT,
    nesting_limit: int = DEFAULT_NESTING_LIMIT,
) -> R:
    """The root ``cls`` struct of one message in the standard stream framing: what
    generated ``from_bytes`` calls."""
    return read_segments(cls, unframe(data), traversal_limit_words, nesting_limit, True)


def read_packed(
    cls: type[R],
    data: bytes | bytearray | memoryview,
    traversal_limit_words: int = DEFAULT_TRAVERSAL_LIMIT,
    nesting_limit: int = DEFAULT_NESTING_LIMIT,
) -> R:
    """``read_framed`` of a packed message: what generated ``from_bytes_packed`` calls."""
    segments = unframe_packed(data)
    return read_segments(cls, segments, traversal_limit_words, nesting_limit, True)


def read_multiple(
    cls: type[R],
    data: bytes | bytearray | memoryview,
    packed: bool,
    traversal_limit_words: int,
    nesting_limit: int,
) -> list[R]:
    """The root ``cls`` struct of each message of ``data``, messages one after another in
    the standard stream framing (``packed``: its packed encoding, as a packed stream
    writes them): what generated ``read_multiple_bytes`` and ``read_multiple_bytes_packed``
    call, as pycapnp's do. Each message has its own traversal budget. A message cut
    short at the end is a DecodeError."""
    from capsvc.codec.packing import unpack
    from capsvc.errors import FramingError
    from capsvc.framing import FrameDecoder

    decoder = FrameDecoder()
    decoder.feed(unpack(data) if packed else bytes(data))
    decoder.feed_eof()
    roots: list[R] = []
    while True:
        try:
            segments = decoder.next_message()
        except FramingError as error:
            raise DecodeError(f"message {len(roots)}: {error}") from None
        if segments is None:
            return roots
        roots.append(read_segments(cls, segments, traversal_limit_words, nesting_limit))


def unframe(data: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
    """The segments of one message in the standard stream framing (rpc-protocol.md §1)."""
    if type(data) is bytes and len(data) >= 8:
        # The common case, inline: one segment, exactly as long as the table says, within
        # the framing's message limit (capsvc.limits.Limits.max_message_words, the same
        # 8 Mi words as the traversal limit). Anything else: the general decoder below,
        # which names what is wrong.
        head = read_i64_le(data, 0)
        words = (head >> 32) & 0xFFFFFFFF
        if (
            head & 0xFFFFFFFF == 0
            and len(data) == 8 + (words << 3)
            and words <= DEFAULT_TRAVERSAL_LIMIT
        ):
            return [data[8:]]
    from capsvc.framing import FrameDecoder

    decoder = FrameDecoder()
    decoder.feed(bytes(data))
    segments = decoder.next_message()
    if segments is None:
        raise DecodeError("incomplete message: the framing promises more bytes")
    if decoder.next_message() is not None:
        raise DecodeError("more than one message")
    if decoder.buffered:  # the start of another message, or junk
        raise DecodeError(f"junk after the message ({decoder.buffered} bytes)")
    return segments


def unframe_packed(data: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
    """The segments of one message in the packed encoding of the stream framing
    (capsvc.codec.packing)."""
    from capsvc.codec.packing import unpack, unpack_message

    segments = unpack_message(data)
    if segments is not None:
        return segments  # type: ignore[return-value]
    return unframe(unpack(data))
