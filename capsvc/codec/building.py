"""Building Cap'n Proto messages word by word: the runtime of generated builders.

Theory of operation (the encoding: capnproto.org/encoding.html; specs/codegen.md §2):
- A ``MessageBuilder`` is one growing segment (a ``bytearray``): word 0 is the root pointer,
  and every object is allocated, zeroed, at the end. Objects never move, so a builder keeps
  offsets, never views; pointers always point forward (to what was allocated after them).
- A ``StructBuilder`` is a view of one struct: the byte offset of its data section and the
  word offset of its pointer section. Generated subclasses write each field at an offset
  computed at generation time, values XOR their defaults, so an untouched field reads as
  its default. Bool fields set one bit; a union member also writes its discriminant.
- Text, Data, structs and lists set into a pointer slot are allocated then and the slot
  is pointed at them; setting a slot again leaves the old object unreachable (as
  libcapnp's builders do; the message just carries the dead bytes).
- Lists are views: ``PrimitiveListBuilder``, ``BoolListBuilder``, ``TextListBuilder``,
  ``DataListBuilder``, ``StructListBuilder`` (composite: a tag word, then the elements),
  ``ListListBuilder``. Values of the wrong type raise ``TypeError`` and values out of range
  ``ValueError``, each naming the field and the schema type it expects.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Protocol, TypeVar

from capsvc._build import COMPILED
from capsvc._mypyc import mypyc_attr
from capsvc.codec.plans import ANY, DATA, GROUP, STRUCT, TEXT
from capsvc.codec.reading import SHORT_LIST, enum_name, shown_fields
from capsvc.errors import DecodeError

if TYPE_CHECKING:
    from capsvc.codec.plans import StructPlan
    from capsvc.codec.reading import MessageReader

B = TypeVar("B", bound="StructBuilder")

_set_u64: Final = struct.Struct("<Q").pack_into
#: A pointer word as its two 32-bit halves: the values stay small ints (a whole word with
#: bits 62 and up set would be a Python long, made and freed per pointer written).
_set_halves: Final = struct.Struct("<II").pack_into
#: A one-segment message's table (rpc-protocol.md §1): segment count - 1 (0), its words.
_ONE_SEGMENT_TABLE: Final[Callable[[int, int], bytes]] = struct.Struct("<II").pack


def _native_frame_one() -> Callable[[bytearray], bytes] | None:
    """The C framing of a one-segment message (capsvc/codec/_native.c), in the compiled
    build only: one ``bytes`` object made, where the table and a concatenation make
    two."""
    if not COMPILED:
        return None
    from capsvc.codec import _native

    frame_one: Callable[[bytearray], bytes] = _native.frame_one
    return frame_one


_FRAME_ONE: Final = _native_frame_one()


def framed(buf: bytearray) -> bytes:
    """A one-segment message (``buf``, whole words) in the standard stream framing
    (rpc-protocol.md §1): its table is one count and one size."""
    frame_one = _FRAME_ONE
    if frame_one is not None:
        return frame_one(buf)
    return _ONE_SEGMENT_TABLE(0, len(buf) >> 3) + buf


_ZERO_WORD: Final = bytes(8)
_get_u64: Final[Callable[[Any, int], tuple[int]]] = struct.Struct("<Q").unpack_from
_U16_INTO: Final = struct.Struct("<H").pack_into
_get_u16: Final[Callable[[Any, int], tuple[int]]] = struct.Struct("<H").unpack_from
_U16_FROM: Final = struct.Struct("<H").unpack_from

#: (struct format letter, Cap'n Proto name) of each number type, for the messages of errors.
_RANGES: Final = {
    "b": (-(1 << 7), (1 << 7) - 1),
    "B": (0, (1 << 8) - 1),
    "h": (-(1 << 15), (1 << 15) - 1),
    "H": (0, (1 << 16) - 1),
    "i": (-(1 << 31), (1 << 31) - 1),
    "I": (0, (1 << 32) - 1),
    "q": (-(1 << 63), (1 << 63) - 1),
    "Q": (0, (1 << 64) - 1),
}


def bad_value(value: object, field: str, schema_type: str, fmt: str) -> Exception:
    """The error for a value ``struct`` refused: TypeError, or ValueError when out of range."""
    if fmt in "fd":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return ValueError(f"{field}: {value!r} does not fit a {schema_type}")
        return TypeError(f"{field}: expected a number ({schema_type}), got {type(value).__name__}")
    if isinstance(value, int):
        low, high = _RANGES[fmt]
        return ValueError(f"{field}: {value} is out of range for {schema_type} ({low}..{high})")
    return TypeError(f"{field}: expected an int ({schema_type}), got {type(value).__name__}")


def bad_type(value: object, field: str, expected: str) -> TypeError:
    return TypeError(f"{field}: expected {expected}, got {type(value).__name__}")


class MessageBuilder:
    """One message being built: a single segment that grows at the end."""

    __slots__ = ("buf", "caps", "owns_caps")

    def __init__(self, buf: bytearray | None = None) -> None:
        #: The segment: a root pointer to begin with, or a whole message made elsewhere
        #: (the C encoder's).
        self.buf = bytearray(8) if buf is None else buf
        #: The capabilities the message's capability pointers index, as engine hooks in
        #: cap-table order (an RPC payload's cap table is written from it).
        self.caps: list[Any] = []
        #: Whether this builder owns one reference to each hook in ``caps``: a message of
        #: its own (``new_message``, ``from_row``, a copy) does, and releases them when it
        #: is gone, as libcapnp's message builder does its cap table (an import's Release
        #: then reaches its peer: rpc-protocol.md §7). An RPC payload's builder does not:
        #: the payload owns them (capsvc.rpc.payload).
        self.owns_caps = True

    def __del__(self) -> None:
        if self.owns_caps and self.caps:
            release_hooks(self.caps)

    def alloc(self, words: int) -> int:
        """Allocate ``words`` zeroed words; returns the first one's index."""
        buf = self.buf
        start = len(buf) >> 3
        buf += _ZERO_WORD * words  # (a bytes repeat is native; bytes(n) is a type call)
        return start

    def segments(self) -> list[bytearray]:
        return [self.buf]


def write_struct_pointer(
    buf: bytearray, at: int, target: int, data_words: int, pointers: int
) -> None:
    offset = target - at - 1 if data_words or pointers else EMPTY_STRUCT_OFFSET
    _set_halves(buf, at << 3, (offset << 2) & 0xFFFFFFFF, data_words | pointers << 16)


#: The offset of a pointer to a struct of no words: -1, as C++ writes it
#: (layout.c++, setKindAndTargetForEmptyStruct). Its target would be the word just after
#: the pointer, offset 0, and a struct pointer of offset 0 and no sizes is the null word.
EMPTY_STRUCT_OFFSET: Final = -1


def write_list_pointer(buf: bytearray, at: int, target: int, code: int, count: int) -> None:
    offset = target - at - 1
    _set_halves(buf, at << 3, (offset << 2) & 0xFFFFFFFF | 1, count << 3 | code)


def new_builder(cls: type[B], builder: MessageBuilder, start: int) -> B:
    """A ``cls`` builder of the struct at word ``start`` (``cls()``: see
    ``reading.new_reader``)."""
    return sized_builder(cls, builder, start, cls._DATA_WORDS, cls._POINTERS)


def sized_builder(
    cls: type[B], builder: MessageBuilder, start: int, data_words: int, pointers: int
) -> B:
    """``new_builder`` of a struct whose sections are the schema's, given (its plan's): a
    root just encoded, with no lookup of the class's sizes (two type attribute lookups
    per message in the compiled build)."""
    view = cls()
    view._b = builder
    view._data = start << 3
    view._ptr = ptr = start + data_words
    view._pend = ptr + pointers
    return view


def group_view(cls: type[B], parent: StructBuilder) -> B:
    """A group of ``parent``: a ``cls`` builder of the same sections."""
    view = cls()
    view._b = parent._b
    view._data = parent._data
    view._ptr = parent._ptr
    view._pend = parent._pend
    return view


@mypyc_attr(allow_interpreted_subclasses=True)
class StructBuilder:
    """A struct being built. Generated subclasses add one property per field."""

    __slots__ = ("_b", "_data", "_pend", "_ptr")

    _DATA_WORDS: ClassVar[int] = 0
    _POINTERS: ClassVar[int] = 0
    #: The schema ID of the struct (generated classes set it; 0: not known): a reader or
    #: builder is copied only into a field of its own struct type.
    _STRUCT_ID: ClassVar[int] = 0

    _b: MessageBuilder
    _data: int
    _ptr: int
    #: The end of the pointer section (a word index): the schema's pointers, or a newer
    #: writer's more (a struct copied in keeps them, and a copy of this one keeps them).
    _pend: int

    @classmethod
    def _at(cls: type[B], builder: MessageBuilder, start: int) -> B:
        return new_builder(cls, builder, start)

    @classmethod
    def _view(cls: type[B], parent: StructBuilder) -> B:
        return group_view(cls, parent)

    #: What ``new_message(**fields)`` and ``assign(**fields)`` encode values with
    #: (capsvc.codec.plans); every generated builder has one.
    _PLAN: ClassVar[StructPlan | None] = None

    @classmethod
    def new_message(cls: type[B], **fields: object) -> B:
        """A new message whose root is this struct: the given fields set from plain values
        (capsvc.codec.values), every other field at its default."""
        plan = cls._PLAN
        if fields and plan is not None:
            builder = _values.new_message_from(plan, fields)
            return new_builder(cls, builder, 1)
        if fields:
            raise TypeError(f"{cls.__qualname__} has no fields to set")
        builder = MessageBuilder()
        start = builder.alloc(cls._DATA_WORDS + cls._POINTERS)
        write_struct_pointer(builder.buf, 0, start, cls._DATA_WORDS, cls._POINTERS)
        return new_builder(cls, builder, start)

    def assign(self, **fields: object) -> None:
        """Set the whole struct, as a constructor would: each field named takes its value
        (plain values, as ``new_message`` takes them), every other field its default (a
        pointer field: null). A value that is refused changes nothing."""
        plan = type(self)._PLAN
        if plan is None:
            raise TypeError(f"{type(self).__qualname__} has no fields to set")
        _values.assign_fields(self, plan, fields)

    def to_segments(self) -> list[bytearray]:
        """The message's segments (one), as a reader or the framing takes them."""
        return self._b.segments()

    def to_bytes(self) -> bytes:
        """The whole message in the standard stream framing (rpc-protocol.md §1)."""
        return framed(self._b.buf)

    def to_bytes_packed(self) -> bytes:
        """The whole message in the packed encoding of the stream framing (the segment
        table included, as libcapnp's ``writePackedMessage``; capsvc.codec.packing)."""
        from capsvc.codec.packing import pack_message

        return pack_message(self._b.buf)

    def _set_text(self, slot: int, value: object, field: str) -> None:
        """Text into pointer ``slot``, for generated setters (a method: in the compiled
        build the attribute loads run natively too)."""
        set_text(self._b, self._ptr + slot, value, field)

    def _pointer_is_null(self, slot: int) -> bool:
        return _get_u64(self._b.buf, (self._ptr + slot) << 3)[0] == 0

    def as_reader(self) -> Any:
        """A reader of this struct as built so far (each generated builder has its own,
        typed as its struct's reader)."""
        raise NotImplementedError(f"{type(self).__qualname__} has no reader")

    def to_dict(self) -> dict[str, Any]:
        """The struct as built so far, as its reader's ``to_dict`` gives it (pycapnp's
        builders have one too)."""
        return self.as_reader().to_dict()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} {shown_fields(self)}>"


def init_struct(parent: StructBuilder | ListBuilder, at: int, cls: type[B]) -> B:
    """Allocate a ``cls`` struct and point the pointer word ``at`` at it."""
    builder = parent._b
    buf = builder.buf
    data_words = cls._DATA_WORDS
    pointers = cls._POINTERS
    start = len(buf) >> 3
    buf += _ZERO_WORD * (data_words + pointers)
    offset = start - at - 1 if data_words or pointers else EMPTY_STRUCT_OFFSET
    _set_halves(buf, at << 3, (offset << 2) & 0xFFFFFFFF, data_words | pointers << 16)
    view = cls()
    view._b = builder
    view._data = start << 3
    view._ptr = start + data_words
    view._pend = start + data_words + pointers
    return view


def struct_field(
    parent: StructBuilder, slot: int, cls: type[B], default: Sequence[bytes] | None = None
) -> B:
    """The struct in pointer ``slot``; a null slot gets a new one (a copy of the field's
    default value, if the schema gives one: as libcapnp's builders do)."""
    at = parent._ptr + slot
    buf = parent._b.buf
    (word,) = _get_u64(buf, at << 3)
    if word == 0:
        if default is None:
            return init_struct(parent, at, cls)
        copy_default(default, parent._b, at)
        (word,) = _get_u64(buf, at << 3)
    return struct_at(parent._b, at, word, cls)


def copy_as_root(cls: type[B], value: object) -> B:
    """A new message whose root is a copy of ``value`` (a struct reader, or builder),
    capabilities too, as a ``cls`` builder: what a generated reader's ``as_builder()``
    gives, as pycapnp's does."""
    builder = MessageBuilder()
    _values.copy_value(builder, 0, value)
    (word,) = _get_u64(builder.buf, 0)
    return struct_at(builder, 0, word, cls)


def struct_at(builder: MessageBuilder, at: int, word: int, cls: type[B]) -> B:
    """A ``cls`` builder of the struct that pointer ``word`` (at word ``at``) leads to.

    A struct copied in from a reader keeps the sizes its writer gave it (libcapnp's copy
    does too). A larger one (a newer writer's) is built in place, its pointer section
    where the pointer says; a smaller one (an older writer's) is first moved to a new
    struct of the schema's size, as libcapnp's builders upgrade it
    (``WireHelpers::getWritableStructPointer``), so that no field is set past its end."""
    if word & 3 != 0:
        # Not a struct pointer (a list or a capability: another union member's value, or
        # a peer's message of another schema): its words must not be taken as a struct's.
        kinds = ("a struct", "a list", "a far pointer", "a capability")
        raise ValueError(
            f"{cls.__qualname__.rsplit('.', 1)[0]}: the field's pointer holds {kinds[word & 3]},"
            " not a struct: set the field anew"
        )
    offset = (((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2
    start = at + 1 + offset
    data_words = (word >> 32) & 0xFFFF
    pointers = word >> 48
    if data_words == cls._DATA_WORDS and pointers == cls._POINTERS:  # the common case
        return new_builder(cls, builder, start)
    if data_words < cls._DATA_WORDS or pointers < cls._POINTERS:
        start = _upgrade_struct(builder, at, start, data_words, pointers, cls)
        data_words = max(data_words, cls._DATA_WORDS)
    view = new_builder(cls, builder, start)
    view._ptr = start + data_words
    view._pend = start + data_words + max(pointers, cls._POINTERS)
    return view


def _upgrade_struct(
    builder: MessageBuilder, at: int, start: int, data_words: int, pointers: int, cls: type[Any]
) -> int:
    """Move the struct at word ``start`` (``data_words``, ``pointers``) that the pointer at
    ``at`` leads to into a new one at least the schema's size: its data copied, its
    pointers moved (their offsets rewritten for their new place), its old words zeroed.
    Returns the new struct's first word."""
    new_data = max(data_words, cls._DATA_WORDS)
    new_pointers = max(pointers, cls._POINTERS)
    target = builder.alloc(new_data + new_pointers)
    buf = builder.buf
    _move_struct(buf, start, data_words, pointers, target, new_data)
    buf[start << 3 : (start + data_words + pointers) << 3] = bytes((data_words + pointers) << 3)
    write_struct_pointer(buf, at, target, new_data, new_pointers)
    return target


def _move_struct(
    buf: bytearray, source: int, data_words: int, pointers: int, dest: int, dest_data: int
) -> None:
    """Copy the struct at word ``source`` (``data_words``, ``pointers``) to word ``dest``
    of a struct whose data section is ``dest_data`` words (at least as many): its data,
    then its pointers re-aimed from their new place (``_move_pointer``)."""
    buf[dest << 3 : (dest + data_words) << 3] = buf[source << 3 : (source + data_words) << 3]
    for slot in range(pointers):
        _move_pointer(buf, source + data_words + slot, dest + dest_data + slot)


def _move_pointer(buf: bytearray, source: int, dest: int) -> None:
    """Copy the pointer word at ``source`` to ``dest``, re-aiming a struct or list pointer
    at the same object from its new place (a capability pointer, or a far one, names its
    target absolutely: copied as it is; a struct of no words keeps offset -1)."""
    (word,) = _get_u64(buf, source << 3)
    kind = word & 3
    if word != 0 and kind < 2 and not (kind == 0 and word >> 32 == 0):
        offset = (((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2
        new_offset = source + 1 + offset - dest - 1
        word = (word & ~0xFFFFFFFF) | ((new_offset << 2) & 0xFFFFFFFF) | kind
    _set_u64(buf, dest << 3, word)


#: The NUL and zero padding that end a Text of ``n`` bytes, by ``n & 7``.
_TEXT_ENDS: Final = tuple(bytes(8 - n) for n in range(8))


def set_text(builder: MessageBuilder, at: int, value: object, field: str) -> None:
    if not isinstance(value, str):
        raise bad_type(value, field, "str (Text)")
    encoded = value.encode("utf-8")
    size = len(encoded) + 1  # the NUL
    buf = builder.buf
    start = len(buf) >> 3  # allocated at the end, as ``alloc`` does, text and padding at once
    buf += encoded
    buf += _TEXT_ENDS[size - 1 & 7]
    offset = start - at - 1
    _set_halves(buf, at << 3, (offset << 2) & 0xFFFFFFFF | 1, size << 3 | 2)


def set_data(builder: MessageBuilder, at: int, value: object, field: str) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise bad_type(value, field, "bytes (Data)")
    size = len(value)
    start = builder.alloc((size + 7) >> 3)
    buf = builder.buf
    buf[start << 3 : (start << 3) + size] = value
    write_list_pointer(buf, at, start, 2, size)


def _byte_list_at(builder: MessageBuilder, at: int, what: str) -> tuple[int, int] | None:
    """(first byte, length) of the byte list pointer word ``at`` of the message being built
    leads to; None for a null pointer. Read in place: a builder's one segment holds only
    near pointers this module wrote (copies are re-encoded, see ``copy_pointer``)."""
    (word,) = _get_u64(builder.buf, at << 3)
    if word == 0:
        return None
    if word & 0x7_0000_0003 != 0x2_0000_0001:
        raise DecodeError(f"expected {what} (a byte list pointer) at word {at}")
    start = (at + 1 + ((((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2)) << 3
    return start, word >> 35


def get_text(builder: MessageBuilder, at: int, default: str) -> str:
    """Read back the Text at pointer word ``at`` of the message being built."""
    found = _byte_list_at(builder, at, "Text")
    if found is None:
        return default
    start, count = found
    return builder.buf[start : start + count - 1].decode()


def get_data(builder: MessageBuilder, at: int, default: bytes) -> bytes:
    """Read back the Data at pointer word ``at`` of the message being built."""
    found = _byte_list_at(builder, at, "Data")
    if found is None:
        return default
    start, count = found
    return bytes(builder.buf[start : start + count])


class Capability(Protocol):
    """What can go into an interface field: a client, or a server object. Each gives a
    new reference to its engine hook."""

    def _capsvc_hook(self) -> Any: ...


def set_client(builder: MessageBuilder, at: int, value: object, field: str) -> None:
    """Put a capability in the message: its hook is appended to the message's cap table and
    the pointer word ``at`` names that entry."""
    if value is None:
        _set_u64(builder.buf, at << 3, 0)
        return
    make_hook = getattr(value, "_capsvc_hook", None)
    if make_hook is None:
        raise bad_type(value, field, "a capability (a client or a server object)")
    hook = make_hook()
    if hook.is_null:  # a null capability is a null pointer (C++ setCapabilityPointer)
        hook.release()
        _set_u64(builder.buf, at << 3, 0)
        return
    builder.caps.append(hook)
    set_capability(builder, at, len(builder.caps) - 1)


def client_at(builder: MessageBuilder, at: int, cls: ClientClass[C], field: str) -> C:
    """A client (``cls``, a generated client class) of the capability that the pointer at
    word ``at`` of a message being built names in its cap table: what a capability
    field's or list element's getter reads (a new reference; null: a client whose calls
    fail, as a reader gives)."""
    word = _get_u64(builder.buf, at << 3)[0]
    if word != 0 and word & 0xFFFFFFFF != 3:  # (another union member's, or a copied list)
        raise ValueError(f"{field}: what this pointer holds is not a capability")
    return cls._from_table(builder.caps, None if word == 0 else word >> 32)


def set_any(parent: StructBuilder, at: int, value: object, field: str, structs_only: bool) -> None:
    """An AnyPointer (``structs_only``: an AnyStruct) field of ``parent``, pointer word
    ``at``: None is null; a struct reader or builder is deep-copied in (capabilities in it
    join this message's cap table); an AnyPointer also takes a ``str`` (Text), ``bytes``
    (Data) or a capability (a client or a server object), as pycapnp's ``set_as`` does,
    and an AnyPointer read elsewhere (whatever it holds is copied, capabilities too)."""
    from capsvc.codec.reading import AnyPointer, StructReader

    builder = parent._b
    if value is None:
        set_null(builder, at)
    elif isinstance(value, StructReader) or isinstance(value, StructBuilder):
        _values.copy_value(builder, at, value)
    elif isinstance(value, AnyPointer) and not structs_only:
        if value._w < 0:  # an absent slot (an older writer's struct): null
            set_null(builder, at)
        else:
            copy_pointer(value._msg, value._si, value._w, builder, at, value._depth)
    elif structs_only:
        raise bad_type(value, field, "a struct reader or builder (AnyStruct), or None")
    elif isinstance(value, str):
        set_text(builder, at, value, field)
    elif isinstance(value, bytes | bytearray | memoryview):
        set_data(builder, at, value, field)
    elif getattr(value, "_capsvc_hook", None) is not None:
        set_client(builder, at, value, field)
    else:
        raise bad_type(
            value,
            field,
            "str (Text), bytes (Data), a struct reader or builder, an AnyPointer, a"
            " capability (a client or a server object), or None (AnyPointer)",
        )


def set_null(builder: MessageBuilder, at: int) -> None:
    _set_u64(builder.buf, at << 3, 0)


def set_capability(builder: MessageBuilder, at: int, index: int) -> None:
    """A capability pointer: cap-table ``index`` (rpc-protocol.md §5)."""
    _set_u64(builder.buf, at << 3, 3 | (index << 32))


# ---------------------------------------------------------------------- lists
@mypyc_attr(allow_interpreted_subclasses=True)
class ListBuilder:
    """A list being built: ``len()``, and element access by index.

    ``_step`` is 0 for a list laid out as its type says. A list of structs that a newer
    writer made of a list of numbers or pointers (the encoding lets a List(T) become a
    List(S) whose first field is T) is used in place, as libcapnp's builders use it: each
    element is the first data bits, or the first pointer (``_start`` is then the first
    element's pointer section), of a struct ``_step`` words long (``list_view``)."""

    __slots__ = ("_b", "_count", "_start", "_step", "field")

    def __init__(self, builder: MessageBuilder, start: int, count: int, field: str) -> None:
        self._b = builder
        self._start = start  # first element, in words
        self._count = count
        self._step = 0
        self.field = field

    def _word(self, index: int) -> int:
        """The word of element ``index`` (checked) of a list of pointers."""
        at = self._index(index)
        step = self._step
        return self._start + (at * step if step else at)

    def _byte(self, index: int, size: int) -> int:
        """The first byte of element ``index`` (checked) of a list of ``size``-byte numbers."""
        at = self._index(index)
        step = self._step
        return (self._start + at * step) << 3 if step else (self._start << 3) + at * size

    def __len__(self) -> int:
        return self._count

    def _index(self, index: int) -> int:
        count = self._count
        at = index + count if index < 0 else index
        if not 0 <= at < count:
            raise IndexError(f"{self.field}: index {index} out of range for a list of {count}")
        return at


T = TypeVar("T")
C = TypeVar("C")
C_co = TypeVar("C_co", covariant=True)


@mypyc_attr(allow_interpreted_subclasses=True)
class PrimitiveListBuilder(ListBuilder, Generic[T]):
    """A list of numbers (``fmt``: a struct format letter) being built."""

    __slots__ = ("_fmt", "_packer", "_type")

    def __init__(
        self,
        builder: MessageBuilder,
        start: int,
        count: int,
        field: str,
        fmt: str,
        schema_type: str,
    ) -> None:
        super().__init__(builder, start, count, field)
        self._fmt = fmt
        self._packer = struct.Struct("<" + fmt)
        self._type = schema_type

    def __setitem__(self, index: int, value: T) -> None:
        offset = self._byte(index, self._packer.size)
        try:
            self._packer.pack_into(self._b.buf, offset, value)
        except struct.error:
            raise bad_value(value, f"{self.field}[{index}]", self._type, self._fmt) from None

    def __getitem__(self, index: int) -> T:
        offset = self._byte(index, self._packer.size)
        return self._packer.unpack_from(self._b.buf, offset)[0]  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[T]:  # (a compiled class is not iterable by __getitem__)
        return iter([self[index] for index in range(self._count)])

    def set_all(self, values: Sequence[T]) -> None:
        """Every element at once (one ``pack``): ``len(values)`` must be ``len(self)``.
        All or nothing: a refused element (the first one's error) changes no element."""
        if len(values) != self._count:
            raise ValueError(f"{self.field}: {len(values)} values for a list of {self._count}")
        try:
            packed = struct.pack(f"<{self._count}{self._fmt}", *values)
        except struct.error:
            pack = self._packer.pack
            for index, value in enumerate(values):
                try:
                    pack(value)
                except struct.error:
                    raise bad_value(
                        value, f"{self.field}[{index}]", self._type, self._fmt
                    ) from None
            raise
        if self._step:  # (elements apart: one at a time, every one known good)
            for index, value in enumerate(values):
                self[index] = value
            return
        start = self._start << 3
        self._b.buf[start : start + len(packed)] = packed


@mypyc_attr(allow_interpreted_subclasses=True)
class EnumListBuilder(PrimitiveListBuilder[T]):
    """A list of an enum (``enum``: its class; UInt16 codes) being built: an element
    reads as a member (as a reader's do; a code the schema does not know, as the enum's
    pseudo-member) and takes a member, a code or a name, as an enum field does."""

    __slots__ = ("_enum",)

    def __init__(
        self, builder: MessageBuilder, start: int, count: int, field: str, enum: Any
    ) -> None:
        super().__init__(builder, start, count, field, "H", enum.__qualname__)
        self._enum = enum

    def _code(self, index: int, value: object) -> int:
        """The code element ``index`` takes for ``value`` (a member, a code or a name)."""
        if type(value) is int and 0 <= value < len(self._enum):
            return value  # (a code, as it is)
        return enum_code(value, self._enum, f"{self.field}[{index}]")

    def __setitem__(self, index: int, value: T | int | str) -> None:
        super().__setitem__(index, self._code(index, value))  # type: ignore[assignment]

    def __getitem__(self, index: int) -> T:
        return self._enum(super().__getitem__(index))  # type: ignore[no-any-return]

    def set_all(self, values: Sequence[T | int | str]) -> None:
        """Every element at once, all or nothing (a member, a code or a name each)."""
        if len(values) != self._count:
            raise ValueError(f"{self.field}: {len(values)} values for a list of {self._count}")
        codes = [self._code(index, value) for index, value in enumerate(values)]
        super().set_all(codes)  # type: ignore[arg-type]


@mypyc_attr(allow_interpreted_subclasses=True)
class BoolListBuilder(ListBuilder):
    __slots__ = ()

    def __setitem__(self, index: int, value: object) -> None:
        if value is not True and value is not False:
            raise bad_type(value, f"{self.field}[{index}]", "bool (Bool)")
        bit = self._index(index)
        offset = (self._start << 3) + (bit >> 3)
        mask = 1 << (bit & 7)
        buf = self._b.buf
        buf[offset] = buf[offset] | mask if value else buf[offset] & ~mask

    def __getitem__(self, index: int) -> bool:
        bit = self._index(index)
        return bool(self._b.buf[(self._start << 3) + (bit >> 3)] >> (bit & 7) & 1)

    def __iter__(self) -> Iterator[bool]:
        return iter([self[index] for index in range(self._count)])


@mypyc_attr(allow_interpreted_subclasses=True)
class TextListBuilder(ListBuilder):
    __slots__ = ()

    def __setitem__(self, index: int, value: object) -> None:
        at = self._word(index)
        set_text(self._b, at, value, f"{self.field}[{index}]")

    def __getitem__(self, index: int) -> str:
        return get_text(self._b, self._word(index), "")

    def __iter__(self) -> Iterator[str]:
        return iter([self[index] for index in range(self._count)])


@mypyc_attr(allow_interpreted_subclasses=True)
class DataListBuilder(ListBuilder):
    __slots__ = ()

    def __setitem__(self, index: int, value: object) -> None:
        at = self._word(index)
        set_data(self._b, at, value, f"{self.field}[{index}]")

    def __getitem__(self, index: int) -> bytes:
        return get_data(self._b, self._word(index), b"")

    def __iter__(self) -> Iterator[bytes]:
        return iter([self[index] for index in range(self._count)])


@mypyc_attr(allow_interpreted_subclasses=True)
class VoidListBuilder(ListBuilder):
    """A List(Void): only a length; every element is None."""

    __slots__ = ()

    def __getitem__(self, index: int) -> None:
        self._index(index)

    def __setitem__(self, index: int, value: object) -> None:
        """Only None: there is nothing to store (as pycapnp takes ``voids[0] = None``)."""
        self._index(index)
        if value is not None:
            raise bad_type(value, f"{self.field}[{index}]", "None (Void)")

    def __iter__(self) -> Iterator[None]:
        return iter([None] * self._count)


class ClientClass(Protocol[C_co]):
    """A generated interface's client class, as a capability list builder reads one."""

    def _from_table(self, caps: Sequence[Any], index: int | None) -> C_co: ...


@mypyc_attr(allow_interpreted_subclasses=True)
class CapabilityListBuilder(ListBuilder, Generic[C]):
    """A List of an interface type: assign a client or server object per element; read
    one back as a client of the interface (a new reference, as a reader gives)."""

    __slots__ = ("_cls",)

    def __init__(
        self, builder: MessageBuilder, start: int, count: int, field: str, cls: Any = None
    ) -> None:
        super().__init__(builder, start, count, field)
        self._cls = cls  # ClientClass[C]: the interface's client class (generated)

    def __setitem__(self, index: int, value: object) -> None:
        at = self._word(index)
        set_client(self._b, at, value, f"{self.field}[{index}]")

    def __getitem__(self, index: int) -> C:
        at = self._word(index)
        if self._cls is None:  # (a module generated before capability lists read back)
            raise TypeError(f"{self.field}: regenerate this module to read its elements")
        cls: ClientClass[C] = self._cls
        return client_at(self._b, at, cls, f"{self.field}[{index}]")

    def __iter__(self) -> Iterator[C]:
        return iter([self[index] for index in range(self._count)])


@mypyc_attr(allow_interpreted_subclasses=True)
class StructListBuilder(ListBuilder, Generic[B]):
    """A composite list: ``lst[i]`` is the builder of element i (already allocated)."""

    __slots__ = ("_cls", "_data_words", "_step")

    def __init__(
        self,
        builder: MessageBuilder,
        start: int,
        count: int,
        field: str,
        cls: type[B],
        data_words: int = -1,
        pointers: int = -1,
    ) -> None:
        super().__init__(builder, start, count, field)
        self._cls = cls
        # The elements' sizes: the schema's, or larger (a newer writer's list copied in
        # from its reader: struct_list_at).
        self._data_words = cls._DATA_WORDS if data_words < 0 else data_words
        self._step = self._data_words + (cls._POINTERS if pointers < 0 else pointers)

    def __getitem__(self, index: int) -> B:
        cls = self._cls
        if not 0 <= index < self._count:
            index = self._index(index)
        at = self._start + index * self._step
        view = new_builder(cls, self._b, at)
        if self._step != cls._DATA_WORDS + cls._POINTERS or self._data_words != cls._DATA_WORDS:
            view._ptr = at + self._data_words
            view._pend = at + self._step
        return view

    def __iter__(self) -> Iterator[B]:
        cls, builder = self._cls, self._b
        step = self._step
        if step == 0:  # structs of no words: every element is the same (empty) place
            return iter([new_builder(cls, builder, self._start) for _ in range(self._count)])
        if self._data_words != cls._DATA_WORDS or step != cls._DATA_WORDS + cls._POINTERS:
            return iter([self[index] for index in range(self._count)])
        if self._count <= SHORT_LIST:  # all at once: see reading.StructList.__iter__
            start = self._start
            stop = start + self._count * step
            return iter([new_builder(cls, builder, at) for at in range(start, stop, step)])
        return StructBuilders(self)


class StructBuilders(Generic[B]):
    """Iteration over a struct list being built: one builder per element, made by a
    compiled ``__next__`` (no Python call per element)."""

    __slots__ = ("_at", "_b", "_cls", "_step", "_stop")

    def __init__(self, elements: StructListBuilder[B]) -> None:
        cls = elements._cls
        self._cls = cls
        self._b = elements._b
        self._step = elements._step
        self._at = elements._start
        self._stop = elements._start + elements._count * self._step

    def __iter__(self) -> StructBuilders[B]:
        return self

    def __next__(self) -> B:
        at = self._at
        if at >= self._stop:
            raise StopIteration
        self._at = at + self._step
        return new_builder(self._cls, self._b, at)


L = TypeVar("L")


@mypyc_attr(allow_interpreted_subclasses=True)
class ListListBuilder(ListBuilder, Generic[L]):
    """A list of lists: ``init(i, n)`` puts a new list of n elements at element i, and
    ``lst[i]`` is the list element i holds as built so far (a null one: empty), each
    with the function the generator chose for the inner type."""

    __slots__ = ("_inner", "_inner_at")

    def __init__(
        self,
        builder: MessageBuilder,
        start: int,
        count: int,
        field: str,
        inner: Any,
        inner_at: Any = None,
    ) -> None:
        super().__init__(builder, start, count, field)
        self._inner = inner  # (builder, at, count, label) -> L: a new list at word ``at``
        self._inner_at = inner_at  # (builder, at, label) -> L: the list already there

    def init(self, index: int, count: object) -> L:
        at = self._word(index)
        return self._inner(self._b, at, count, f"{self.field}[{index}]")  # type: ignore[no-any-return]

    def __getitem__(self, index: int) -> L:
        at = self._word(index)
        if self._inner_at is None:  # (a module generated before lists of lists read back)
            raise TypeError(f"{self.field}: regenerate this module to read its elements")
        return self._inner_at(self._b, at, f"{self.field}[{index}]")  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[L]:
        return iter([self[index] for index in range(self._count)])


def init_primitive_list(
    builder: MessageBuilder,
    at: int,
    count: object,
    field: str,
    fmt: str,
    code: int,
    schema_type: str,
) -> PrimitiveListBuilder[Any]:
    n = _check_count(count, field)
    size = struct.calcsize("<" + fmt)
    start = builder.alloc((n * size + 7) >> 3)
    write_list_pointer(builder.buf, at, start, code, n)
    return PrimitiveListBuilder(builder, start, n, field, fmt, schema_type)


def init_enum_list(
    builder: MessageBuilder, at: int, count: object, field: str, enum: Any
) -> EnumListBuilder[Any]:
    """A new list of ``count`` elements of ``enum`` (UInt16 codes) at pointer ``at``."""
    n = _check_count(count, field)
    start = builder.alloc((n * 2 + 7) >> 3)
    write_list_pointer(builder.buf, at, start, 3, n)
    return EnumListBuilder(builder, start, n, field, enum)


def set_primitive_list(
    builder: MessageBuilder,
    at: int,
    values: Iterable[Any],
    field: str,
    fmt: str,
    code: int,
    schema_type: str,
) -> None:
    items = values if isinstance(values, list | tuple) else list(values)
    target = init_primitive_list(builder, at, len(items), field, fmt, code, schema_type)
    target.set_all(items)


def init_bool_list(builder: MessageBuilder, at: int, count: object, field: str) -> BoolListBuilder:
    n = _check_count(count, field)
    start = builder.alloc((n + 63) >> 6)
    write_list_pointer(builder.buf, at, start, 1, n)
    return BoolListBuilder(builder, start, n, field)


def init_void_list(builder: MessageBuilder, at: int, count: object, field: str) -> VoidListBuilder:
    n = _check_count(count, field)
    write_list_pointer(builder.buf, at, builder.alloc(0), 0, n)
    return VoidListBuilder(builder, 0, n, field)


def _init_pointer_list(builder: MessageBuilder, at: int, count: int) -> int:
    start = builder.alloc(count)
    write_list_pointer(builder.buf, at, start, 6, count)
    return start


def init_pointer_list(builder: MessageBuilder, at: int, count: object, field: str) -> ListBuilder:
    """A list of pointers left null (a List(AnyPointer))."""
    n = _check_count(count, field)
    return ListBuilder(builder, _init_pointer_list(builder, at, n), n, field)


def init_text_list(builder: MessageBuilder, at: int, count: object, field: str) -> TextListBuilder:
    n = _check_count(count, field)
    return TextListBuilder(builder, _init_pointer_list(builder, at, n), n, field)


def init_data_list(builder: MessageBuilder, at: int, count: object, field: str) -> DataListBuilder:
    n = _check_count(count, field)
    return DataListBuilder(builder, _init_pointer_list(builder, at, n), n, field)


def init_capability_list(
    builder: MessageBuilder, at: int, count: object, field: str, cls: Any = None
) -> CapabilityListBuilder[Any]:
    n = _check_count(count, field)
    return CapabilityListBuilder(builder, _init_pointer_list(builder, at, n), n, field, cls)


def init_list_list(
    builder: MessageBuilder, at: int, count: object, field: str, inner: Any, inner_at: Any = None
) -> ListListBuilder[Any]:
    n = _check_count(count, field)
    return ListListBuilder(builder, _init_pointer_list(builder, at, n), n, field, inner, inner_at)


def init_struct_list(
    builder: MessageBuilder, at: int, count: object, field: str, cls: type[B]
) -> StructListBuilder[B]:
    n = _check_count(count, field)
    data_words = cls._DATA_WORDS
    pointers = cls._POINTERS
    size = data_words + pointers
    start = builder.alloc(1 + n * size)
    buf = builder.buf
    _set_halves(buf, start << 3, n << 2, data_words | pointers << 16)
    write_list_pointer(buf, at, start, 7, n * size)
    return StructListBuilder(builder, start + 1, n, field, cls)


#: Each generated enum's codes by schema name (and so by Python name: check_enum).
_ENUM_CODES: Final[dict[Any, dict[str, int]]] = {}


def enum_code(value: object, enum: Any, field: str) -> int:
    """The code a generated enum setter writes for ``value`` when it is not a plain int
    in range: an ``enum`` member, or an enumerant's name (schema or Python name). An
    unknown name or a code out of range is a ValueError naming the field and the
    enumerants, another type a TypeError."""
    from capsvc.codec.scalars import check_enum  # (scalars imports this module)

    codes = _ENUM_CODES.get(enum)
    if codes is None:
        codes = {str(enum_name(member)): int(member) for member in enum}
        _ENUM_CODES[enum] = codes
    return check_enum(value, codes, field, enum.__name__)


def switch_member(parent: StructBuilder, disc_at: int, disc: int, slot: int) -> None:
    """Select the union member ``disc`` (discriminant at byte ``disc_at``) whose value is
    the pointer in ``slot``; if another member was set, the slot is nulled first (it may
    hold that member's pointer): what a generated getter of a struct union member runs."""
    buf = parent._b.buf
    at = parent._data + disc_at
    if _U16_FROM(buf, at)[0] != disc:
        _U16_INTO(buf, at, disc)
        _set_u64(buf, (parent._ptr + slot) << 3, 0)


def member_not_set(builder: StructBuilder, field: str) -> ValueError:
    """The error of reading union member ``field`` of ``builder`` while another is set
    (pycapnp's builders refuse it too): what a generated list getter raises."""
    which: Any = getattr(builder, "which", None)
    current = f" (which() is {which()!r})" if callable(which) else ""
    return ValueError(f"{field}: not the union member set{current}; set it first")


def list_at(
    builder: MessageBuilder,
    at: int,
    field: str,
    code: int,
    cls: Any = None,
    default: Sequence[bytes] | None = None,
) -> tuple[int, int]:
    """(first element word, element count) of the list that the pointer at word ``at`` of
    a message being built leads to: what a list field's getter reads. A null pointer is
    an empty list, or given the field's schema ``default``, a copy of it put there (as
    libcapnp's builders do). ``code`` is the field's element size (7: a composite list of
    ``cls``; one of smaller structs, an older writer's, is upgraded to the schema's size);
    a list of any other layout there (another union member's pointer, or a list copied in
    from a reader of another version of the schema) is a ValueError naming the field."""
    return _list_of_word(builder, at, _list_word(builder, at, default), field, code, cls)


def _list_of_word(
    builder: MessageBuilder, at: int, word: int, field: str, code: int, cls: Any
) -> tuple[int, int]:
    """``list_at`` of the pointer ``word`` at word ``at``."""
    if word == 0:
        return 0, 0
    if word & 3 == 1 and (word >> 32) & 7 == code:
        start = at + 1 + ((((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2)
        if code != 7:
            return start, word >> 35
        first, count, data_words, pointers = _composite_at(builder, at, start, cls)
        if data_words == cls._DATA_WORDS and pointers == cls._POINTERS:
            return first, count
    raise ValueError(
        f"{field}: what this field's pointer holds is not a list of its type as this schema"
        " lays it out (another union member's value, or a list of larger structs copied from"
        " a newer version of the schema): set the field anew"
    )


L_ = TypeVar("L_", bound="ListBuilder")


def list_view(
    cls: Callable[..., L_],
    builder: MessageBuilder,
    at: int,
    field: str,
    code: int,
    default: Sequence[bytes] | None,
    *args: Any,
) -> L_:
    """A ``cls`` builder (its constructor's ``args`` after the field's name) of the list of
    element size ``code`` (not 7) at pointer word ``at``, as ``list_at`` finds it, or in
    place over a list of structs a newer writer made of it (``ListBuilder``'s ``_step``):
    each element its struct's first data bits, or first pointer, as libcapnp's
    ``getWritableListPointer`` takes a larger list. What a generated list getter returns."""
    word = _list_word(builder, at, default)
    if word & 3 == 1 and (word >> 32) & 7 == 7 and code != 7:
        start = at + 1 + ((((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2)
        total = word >> 35
        buf = builder.buf
        if start >= 0 and start + 1 + total <= len(buf) >> 3:
            (tag,) = _get_u64(buf, start << 3)
            count = (tag & 0xFFFFFFFF) >> 2
            data_words = (tag >> 32) & 0xFFFF
            pointers = tag >> 48
            step = data_words + pointers
            if tag & 3 == 0 and count * step <= total and (step or code == 0):
                # A pointer list's element is each struct's first pointer; a number's,
                # the start of its data section; a Void has nothing; a Bool is refused
                # (as libcapnp refuses it: a bit is not the first bit of a struct).
                if code == 6 and pointers:
                    view = cls(builder, start + 1 + data_words, count, field, *args)
                elif (code in (2, 3, 4, 5) and data_words) or code == 0:
                    view = cls(builder, start + 1, count, field, *args)
                else:
                    view = None
                if view is not None:
                    view._step = step
                    return view
    return cls(builder, *_list_of_word(builder, at, word, field, code, None), field, *args)


def _list_word(builder: MessageBuilder, at: int, default: Sequence[bytes] | None) -> int:
    """The pointer word at ``at`` of a list field; a null one with a schema ``default``
    first gets a copy of it (as libcapnp's builders do)."""
    (word,) = _get_u64(builder.buf, at << 3)
    if word == 0 and default is not None:
        copy_default(default, builder, at)
        (word,) = _get_u64(builder.buf, at << 3)
    return word


def struct_list_at(
    builder: MessageBuilder,
    at: int,
    field: str,
    cls: type[B],
    default: Sequence[bytes] | None = None,
) -> StructListBuilder[B]:
    """The list of ``cls`` structs that the pointer at word ``at`` leads to, as built so
    far: what a generated struct-list getter gives. A null pointer is an empty list, or
    a copy of the field's schema ``default``. Elements of another version's size, copied
    in from its reader: smaller ones are first moved to the schema's size (libcapnp's
    ``getWritableStructListPointer``), larger ones built in place; a list of numbers,
    pointers or Voids (the schema's older element type) becomes one of structs. A bit
    list is ``list_at``'s ValueError."""
    word = _list_word(builder, at, default)
    if word == 0:
        return StructListBuilder(builder, 0, 0, field, cls)
    code = (word >> 32) & 7
    if word & 3 == 1 and code != 1:  # (a bit list is not upgraded: libcapnp refuses it too)
        start = at + 1 + ((((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2)
        if code != 7:  # a primitive list where the schema now has structs
            start = _structs_of_primitives(builder, at, start, word >> 35, code, cls)
        first, count, data_words, pointers = _composite_at(builder, at, start, cls)
        return StructListBuilder(builder, first, count, field, cls, data_words, pointers)
    list_at(builder, at, field, 7, cls)  # (raises the ValueError naming the field)
    raise AssertionError("unreachable")


#: Bytes per element of a primitive list, by element size code (Void: 0; 6: pointers).
_ELEMENT_BYTES: Final = (0, 0, 1, 2, 4, 8, 8)


def _structs_of_primitives(
    builder: MessageBuilder, at: int, start: int, count: int, code: int, cls: type[Any]
) -> int:
    """Move a list of ``count`` primitives (element size ``code``: Void, a number or a
    pointer) at word ``start`` to a composite list of the schema's ``cls`` structs, each
    holding its element where the encoding spec puts it (a number at the start of the
    data section, a pointer in the first pointer slot), as libcapnp's builders upgrade
    it; zero the old list and point word ``at`` at the new one. Returns the new list's
    tag word."""
    new_data = max(cls._DATA_WORDS, 1 if 2 <= code <= 5 else 0)
    new_pointers = max(cls._POINTERS, 1 if code == 6 else 0)
    size = new_data + new_pointers
    target = builder.alloc(1 + count * size)
    buf = builder.buf
    _set_u64(buf, target << 3, count << 2 | new_data << 32 | new_pointers << 48)
    width = _ELEMENT_BYTES[code]
    for index in range(count):
        dest = target + 1 + index * size
        if code == 6:
            _move_pointer(buf, start + index, dest + new_data)
        elif width:
            source = (start << 3) + index * width
            buf[dest << 3 : (dest << 3) + width] = buf[source : source + width]
    old_words = (count * width + 7) >> 3
    buf[start << 3 : (start + old_words) << 3] = bytes(old_words << 3)
    write_list_pointer(buf, at, target, 7, count * size)
    return target


def _composite_at(
    builder: MessageBuilder, at: int, start: int, cls: type[Any]
) -> tuple[int, int, int, int]:
    """(first element word, count, data words, pointers) of the composite list whose tag
    is at word ``start`` (the pointer to it at ``at``): one whose elements are smaller
    than the schema's in either section is first upgraded (``_upgrade_struct_list``)."""
    (tag,) = _get_u64(builder.buf, start << 3)
    data_words = (tag >> 32) & 0xFFFF
    pointers = tag >> 48
    count = (tag & 0xFFFFFFFF) >> 2
    if data_words < cls._DATA_WORDS or pointers < cls._POINTERS:
        new_data = max(data_words, cls._DATA_WORDS)
        new_pointers = max(pointers, cls._POINTERS)
        start = _upgrade_struct_list(
            builder, at, start, count, (data_words, pointers), (new_data, new_pointers)
        )
        data_words, pointers = new_data, new_pointers
    return start + 1, count, data_words, pointers


def _upgrade_struct_list(
    builder: MessageBuilder,
    at: int,
    start: int,
    count: int,
    sizes: tuple[int, int],
    new_sizes: tuple[int, int],
) -> int:
    """Move the composite list whose tag is at word ``start``, ``count`` elements of
    ``sizes`` (data words, pointers), to a new one of elements of ``new_sizes`` (each
    moved by ``_move_struct``), zero the old one and point word ``at`` at the new one.
    Returns the new list's tag word."""
    data_words, pointers = sizes
    new_data, new_pointers = new_sizes
    size = new_data + new_pointers
    target = builder.alloc(1 + count * size)
    buf = builder.buf
    _set_u64(buf, target << 3, count << 2 | new_data << 32 | new_pointers << 48)
    old_size = data_words + pointers
    for index in range(count):
        source = start + 1 + index * old_size
        _move_struct(buf, source, data_words, pointers, target + 1 + index * size, new_data)
    buf[start << 3 : (start + 1 + count * old_size) << 3] = bytes((1 + count * old_size) << 3)
    write_list_pointer(buf, at, target, 7, count * size)
    return target


def _check_count(count: object, field: str) -> int:
    """``count`` as a list length, or the error naming the field.

    Counts (and the values of the setters here) come straight from user code, so they
    are typed ``object``: a compiled build checks a parameter's declared type on entry,
    with an error that names no field."""
    if not isinstance(count, int):
        raise bad_type(count, field, "an int (the list's length)")
    if not 0 <= count < (1 << 29):
        raise ValueError(f"{field}: a list of {count} elements cannot be encoded (0..2**29-1)")
    return count


# ---------------------------------------------------------------------- copying
def copy_default(default: Sequence[bytes], builder: MessageBuilder, at: int) -> None:
    """Copy a generated default value (see capsvc.codec.reading.default_location) to ``at``."""
    from capsvc.codec.reading import default_location

    msg, si, w = default_location(default)
    copy_pointer(msg, si, w, builder, at, 64)


def copy_pointer(
    src: MessageReader, si: int, w: int, builder: MessageBuilder, at: int, depth: int
) -> None:
    """Deep-copy the object the pointer at (``si``, ``w``) of ``src`` leads to into
    ``builder``, pointed at by word ``at`` (a capability pointer is copied as it is).
    Work is bounded by ``src``'s traversal budget and by ``depth``. All or nothing: a
    copy that fails (a fault or a limit in ``src``) leaves ``builder`` as it was."""
    undo = Undo(builder, at, 1)
    try:
        _copy_pointer(src, si, w, builder, at, depth)
    except BaseException:
        undo.restore()
        raise


class Undo:
    """What a change to a message may touch, kept to put back if the change fails: the
    words ``at`` to ``at + words`` (changed in place) and any more ranges ``keep`` adds,
    the message's size (what it appends) and its cap table's (the capabilities it adds,
    each released)."""

    __slots__ = ("_builder", "_caps", "_ranges", "_size")

    def __init__(self, builder: MessageBuilder, at: int, words: int) -> None:
        self._builder = builder
        self._ranges: list[tuple[int, bytes]] = []
        self._size = len(builder.buf)
        self._caps = len(builder.caps)
        self.keep(at, words)

    def keep(self, at: int, words: int) -> None:
        """Keep words ``at`` to ``at + words`` too (those the message has)."""
        buf = self._builder.buf
        self._ranges.append((at, bytes(buf[at << 3 : min(at + words, self._size >> 3) << 3])))

    def restore(self) -> None:
        builder = self._builder
        buf = builder.buf
        del buf[self._size :]
        for at, words in reversed(self._ranges):
            buf[at << 3 : (at << 3) + len(words)] = words
        caps = builder.caps
        added = caps[self._caps :]
        del caps[self._caps :]
        release_hooks(added)


def release_hooks(hooks: list[Any]) -> None:
    """Release each capability reference of a cap table (None: a null entry), and empty
    it: a message builder's own table is then released once, not again when it is gone."""
    taken = list(hooks)
    hooks.clear()
    for hook in taken:
        if hook is not None:
            hook.release()


def init_by_name(builder: StructBuilder, name: str, args: tuple[int, ...]) -> Any:
    """``builder.init(name, *args)``: its ``init_<name>``, by the field's schema name or its
    Python one (``import_``: a schema name has no underscore, so a trailing one is always
    the generator's rename), as pycapnp's ``init`` takes the schema's."""
    method = getattr(builder, "init_" + name, None)
    if method is None and name.endswith("_"):
        method = getattr(builder, "init_" + name[:-1], None)
    if method is None:
        struct_name = type(builder).__qualname__.rsplit(".", 1)[0]
        raise AttributeError(f"{struct_name} has no field {name!r} that init() takes")
    return method(*args)


def struct_undo(target: StructBuilder) -> Undo:
    """An ``Undo`` of the sections of the struct ``target`` is (or is a group of)."""
    start = target._data >> 3
    return Undo(target._b, start, target._pend - start)


def _copy_pointer(
    src: MessageReader, si: int, w: int, builder: MessageBuilder, at: int, depth: int
) -> None:
    """``copy_pointer``'s work, with no undo (its callers' undo covers all of it)."""
    from capsvc.codec.reading import _resolve

    found = _resolve(src, si, w)
    if found is None:
        _set_u64(builder.buf, at << 3, 0)
        return
    si, position, word = found
    if depth <= 0:
        raise DecodeError("message exceeds the nesting limit")
    kind = word & 3
    if kind == 3:
        caps = src.caps
        index = word >> 32
        if word & 0xFFFFFFFF == 3 and caps and index < len(caps) and caps[index] is not None:
            if caps[index].is_null:
                _set_u64(builder.buf, at << 3, 0)
                return
            # A capability of the source message: one more reference, in our cap table.
            builder.caps.append(caps[index].add_ref())
            set_capability(builder, at, len(builder.caps) - 1)
        else:
            _set_u64(builder.buf, at << 3, word)
        return
    start = position + 1 + ((((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2)
    segment = src.segments[si]
    if kind == 0:
        data_words = (word >> 32) & 0xFFFF
        pointers = word >> 48
        if start < 0 or start + data_words + pointers > src.sizes[si]:
            raise DecodeError("struct pointer out of bounds")
        src.charge(data_words + pointers)
        target = _copy_words(builder, segment, start, data_words + pointers)
        write_struct_pointer(builder.buf, at, target, data_words, pointers)
        for index in range(pointers):
            first = start + data_words + index
            _copy_pointer(src, si, first, builder, target + data_words + index, depth - 1)
        return
    code = (word >> 32) & 7
    count = word >> 35
    if code != 7:
        bits = (0, 1, 8, 16, 32, 64, 64)[code]
        words = (count * bits + 63) >> 6
        if start < 0 or start + words > src.sizes[si]:
            raise DecodeError("list out of bounds")
        src.charge(words if bits else count)
        target = _copy_words(builder, segment, start, words)
        write_list_pointer(builder.buf, at, target, code, count)
        if code == 6:
            for index in range(count):
                _copy_pointer(src, si, start + index, builder, target + index, depth - 1)
        return
    if start < 0 or start + 1 + count > src.sizes[si]:
        raise DecodeError("composite list out of bounds")
    (tag,) = _get_u64(segment, start << 3)
    elements = (tag & 0xFFFFFFFF) >> 2
    data_words = (tag >> 32) & 0xFFFF
    pointers = tag >> 48
    size = data_words + pointers
    if tag & 3 or elements * size > count:
        raise DecodeError("composite list's tag does not fit it")
    src.charge(elements * size if size else elements)
    target = _copy_words(builder, segment, start, 1 + elements * size)
    write_list_pointer(builder.buf, at, target, 7, elements * size)
    for element in range(elements):
        base = start + 1 + element * size + data_words
        copy_base = target + 1 + element * size + data_words
        for index in range(pointers):
            _copy_pointer(src, si, base + index, builder, copy_base + index, depth - 1)


def _copy_words(
    builder: MessageBuilder, segment: bytes | bytearray | memoryview, start: int, words: int
) -> int:
    """Allocate ``words`` and copy them from ``segment``; their pointers are redone after."""
    target = builder.alloc(words)
    builder.buf[target << 3 : (target + words) << 3] = segment[start << 3 : (start + words) << 3]
    return target


def copy_struct(
    parent: StructBuilder,
    slot: int,
    value: Any,
    cls: Any = None,
    label: str = "",
    default: Sequence[bytes] | None = None,
    disc_at: int = -1,
    disc: int = 0,
) -> None:
    """Set pointer ``slot`` of ``parent`` to a deep copy of ``value``, a generated reader
    or builder of the field's struct type (capabilities in it join this message's cap
    table); or, given the field's builder class ``cls``, to a struct of it holding
    ``value``, its row, or a dict of some of its fields: as pycapnp's
    ``builder.field = {...}``, those fields change and the others keep what the struct
    holds (its schema ``default``, encoded, when the slot is null). Checked whole before
    anything changes; then the union member ``disc`` is selected (discriminant at byte
    ``disc_at``, if any). ``label`` names the field in errors."""
    from capsvc.codec.reading import StructReader

    if isinstance(value, StructBuilder):
        value = value.as_reader()
    elif cls is not None and isinstance(value, Mapping):
        _set_over(parent, slot, dict(value), cls, default, disc_at, disc)
        return
    elif cls is not None and isinstance(value, tuple):
        value = _values.new_message_row(cls, cls._PLAN, value).as_reader()
    if not isinstance(value, StructReader):
        what = "a struct reader or builder" + (", a dict of its fields, or its row" if cls else "")
        raise bad_type(value, label or f"{type(parent).__qualname__}[{slot}]", what)
    if cls is not None:
        _values.check_struct_type(value, cls._PLAN, label or cls._PLAN.name)
    _values.copy_value(parent._b, parent._ptr + slot, value)
    if disc_at >= 0:
        _U16_INTO(parent._b.buf, parent._data + disc_at, disc)


def _set_over(
    parent: StructBuilder,
    slot: int,
    given: dict[str, Any],
    cls: Any,
    default: Sequence[bytes] | None,
    disc_at: int,
    disc: int,
) -> None:
    """``given`` set on the struct in pointer ``slot`` of ``parent`` in place, as pycapnp's
    ``from_dict`` sets it (the struct there; a copy of the field's ``default``, or a new
    one, if the slot is null or another union member was set), checked whole first."""
    plan = cls._PLAN
    # Checked by encoding it alone (a name the struct has not, a value of the wrong type,
    # two members of a union): the same errors as new_message, before anything changes.
    check_alone(plan, given)
    # What that check cannot see, the message's own words can still refuse: a foreign
    # writer's pointer of another kind where a struct is set in place, found after the
    # keys before it were set. Kept, to put back: the parent's sections (discriminant,
    # slot) and the struct the slot holds (set in place, or moved by an upgrade).
    undo = struct_undo(parent)
    undo.keep(*_struct_words(parent._b.buf, parent._ptr + slot))
    try:
        if disc_at >= 0:
            switch_member(parent, disc_at, disc, slot)
        set_fields(struct_field(parent, slot, cls, default), plan, given)
    except BaseException:
        undo.restore()
        raise


def check_alone(plan: StructPlan, given: dict[str, Any]) -> None:
    """Refuse ``given`` (a dict of ``plan``'s fields) as ``new_message`` would, by encoding
    it alone, before anything changes; the references that copy took to the capabilities
    in it are released (the encoding is thrown away: kept, they would keep their servers
    alive)."""
    release_hooks(_values.new_message_from(plan, given).caps)


def _struct_words(buf: bytearray, at: int) -> tuple[int, int]:
    """The words (first, count) of the struct the pointer at word ``at`` leads to, if it
    is a struct pointer (clipped to the message by ``Undo.keep``); else none."""
    (word,) = _get_u64(buf, at << 3)
    if word & 3 != 0 or word == 0:
        return 0, 0
    offset = (((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2
    start = at + 1 + offset
    if start < 0:
        return 0, 0
    return start, ((word >> 32) & 0xFFFF) + (word >> 48)


def set_fields(target: StructBuilder, plan: StructPlan, given: Mapping[str, Any]) -> None:
    """Each field of ``given`` (by either name) set on ``target`` as its setter sets it,
    every other field left as it is (pycapnp's ``from_dict``): a dict for a group is set
    on the group the same way, and one for a struct field on the struct it holds."""
    for key, value in given.items():
        field = plan.fields.get(key)
        if field is None:
            raise plan.unknown(key, plan.name)
        if isinstance(value, Mapping) and type(value) is not dict:
            value = dict(value)  # (any mapping, as new_message takes one)
        if field.kind == GROUP and field.target is not None:
            if isinstance(value, dict):
                set_fields(getattr(target, field.key), field.target, value)
            else:  # a row: the whole group, as new_message takes it (checked: a tuple)
                _values.assign_fields(getattr(target, field.key), field.target, value)
        elif value is None and field.kind in (TEXT, DATA, STRUCT):
            # None is a null pointer in a dict (as new_message takes it); these fields'
            # setters take values only.
            if field.disc >= 0:
                _U16_INTO(target._b.buf, target._data + plan.disc_at, field.disc)
            _set_u64(target._b.buf, (target._ptr + field.offset) << 3, 0)
        elif field.kind == ANY:
            getattr(target, "set_" + field.name)(value)
        else:
            setattr(target, field.key, value)


def set_group(parent: StructBuilder, cls: Any, disc_at: int, disc: int, value: object) -> None:
    """``builder.group = value``, as pycapnp sets a group: a dict's fields set on the group
    in place, every other field left as it is (``set_fields``); a row sets the whole group
    (``assign``). A group that is a union member (its discriminant at byte ``disc_at``,
    ``disc`` its own) is selected, cleared first if another member was set. Checked
    whole first: a refused value changes nothing."""
    plan = cls._PLAN
    selected = disc_at < 0 or _get_u16(parent._b.buf, parent._data + disc_at)[0] == disc
    view = group_view(cls, parent)
    if isinstance(value, Mapping):
        given = dict(value)
        check_alone(plan, given)  # the same errors as new_message, first
        undo = struct_undo(parent)  # as in _set_over: the message's own words can still
        try:  # refuse (the group's are the parent's)
            if not selected:
                view.assign()  # another member's bits and pointers are not this group's
                _U16_INTO(parent._b.buf, parent._data + disc_at, disc)
            set_fields(view, plan, given)
        except BaseException:
            undo.restore()
            raise
    elif isinstance(value, tuple):
        _values.assign_fields(view, plan, value)  # all or nothing
        if not selected:
            _U16_INTO(parent._b.buf, parent._data + disc_at, disc)
    else:
        raise bad_type(value, plan.name, f"a dict of {plan.name}'s fields, or its row")


# The value encoder builds on this module (MessageBuilder, the copies): imported last, so
# that either module can be imported first.
from capsvc.codec import values as _values  # noqa: E402
