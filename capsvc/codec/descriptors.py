"""The typed view of :mod:`capsvc.codec.accessors`, the field descriptors of generated
readers.

The implementation's ``__get__`` returns ``object`` (see accessors.py: a mypyc
limitation); this module gives the type checker what a read really returns, so that
``reader.seats`` is an ``int`` and ``reader.make`` a ``str`` to mypy. At run time it is
the compiled implementation in the compiled build; in pure Python, where a descriptor's
``__get__`` or a callable's ``__call__`` would be a Python frame *more* than a property's
getter, the same names make ``property`` objects over closures
(:mod:`capsvc.codec._pure_descriptors`), as fast as the properties generated code used to
spell out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, overload

from capsvc._build import COMPILED

T = TypeVar("T")
S = TypeVar("S")
R = TypeVar("R", bound="StructReader")

__all__ = [
    "Bool",
    "BuilderGroup",
    "Enum",
    "Float",
    "Group",
    "Int",
    "List",
    "Struct",
    "StructList",
    "Text",
    "UInt8",
    "bool_property",
    "float_property",
    "int_property",
    "text_property",
]

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from capsvc.codec.reading import ListReader, MessageReader, StructReader

    class _ReaderField(Generic[T]):
        """A field that reads as ``T`` on an instance (the descriptor itself on the class)."""

        @overload
        def __get__(self, obj: None, owner: object = None) -> Self: ...
        @overload
        def __get__(self, obj: object, owner: object = None) -> T: ...
        def __get__(self, obj: object, owner: object = None) -> Self | T:
            raise NotImplementedError

    class UInt8(_ReaderField[int]):
        def __init__(self, offset: int, xor: int = 0) -> None:
            raise NotImplementedError

    class Int(_ReaderField[int]):
        def __init__(self, width: str, offset: int, xor: int = 0) -> None:
            raise NotImplementedError

    class Float(_ReaderField[float]):
        def __init__(self, bits: int, offset: int, xor: int = 0) -> None:
            raise NotImplementedError

    class Bool(_ReaderField[bool]):
        def __init__(self, byte: int, bit: int, default: bool = False) -> None:
            raise NotImplementedError

    class Text(_ReaderField[str]):
        def __init__(self, slot: int, default: str = "") -> None:
            raise NotImplementedError

    class Struct(_ReaderField[R]):
        """A struct field; the module binds its reader class (and encoded default)."""

        def __init__(self, slot: int) -> None:
            raise NotImplementedError

        def bind(self, cls: type[R], default: Sequence[bytes] | None = None) -> None:
            raise NotImplementedError

    class StructList(_ReaderField[ListReader[R]]):
        def __init__(self, slot: int) -> None:
            raise NotImplementedError

        def bind(self, cls: type[R]) -> None:
            raise NotImplementedError

    class List(_ReaderField[T]):
        def __init__(self, slot: int) -> None:
            raise NotImplementedError

        def bind(self, make: Callable[[MessageReader, int, int, int], T]) -> None:
            raise NotImplementedError

    class Group(_ReaderField[T]):
        def __init__(self) -> None:
            raise NotImplementedError

        def bind(self, cls: type[T]) -> None:
            raise NotImplementedError

    class BuilderGroup(_ReaderField[T]):
        def __init__(self, disc_at: int = -1, disc: int = 0) -> None:
            raise NotImplementedError

        def bind(self, cls: type[T]) -> None:
            raise NotImplementedError

        def init(self, obj: object) -> T:
            raise NotImplementedError

        def __set__(self, obj: object, value: Mapping[str, Any] | tuple[Any, ...]) -> None:
            raise NotImplementedError

    class Enum(_ReaderField[T]):
        def __init__(self, offset: int, xor: int = 0) -> None:
            raise NotImplementedError

        def bind(self, cls: Callable[[int], T], members: tuple[T, ...]) -> None:
            raise NotImplementedError

    class Field(_ReaderField[T], Generic[T, S]):
        """A builder field: reads as ``T``, takes ``S``."""

        def __set__(self, obj: object, value: S) -> None:
            raise NotImplementedError

    def int_property(
        width: str,
        offset: int,
        xor: int,
        label: str,
        schema_type: str,
        disc_at: int = -1,
        disc: int = 0,
    ) -> Field[int, int]:
        raise NotImplementedError

    def float_property(
        bits: int,
        offset: int,
        xor: int,
        label: str,
        schema_type: str,
        disc_at: int = -1,
        disc: int = 0,
    ) -> Field[float, float]:
        raise NotImplementedError

    def bool_property(
        byte: int, bit: int, default: bool, label: str, disc_at: int = -1, disc: int = 0
    ) -> Field[bool, bool]:
        raise NotImplementedError

    def text_property(
        slot: int, default: str, label: str, disc_at: int = -1, disc: int = 0
    ) -> Field[str, str]:
        raise NotImplementedError

elif COMPILED:
    from capsvc.codec import accessors as _accessors
    from capsvc.codec.accessors import (
        Bool,
        Enum,
        Float,
        Group,
        Int,
        List,
        Struct,
        StructList,
        Text,
        UInt8,
        bool_property,
        float_property,
        int_property,
        text_property,
    )

    class _GroupProperty(property):
        """A builder's group in the compiled build: a ``property`` (a compiled class has no
        ``__set__`` slot) whose getter and setter are the compiled accessors.BuilderGroup's
        bound methods, so reading and setting ``builder.group`` run no Python frame."""

        def __init__(self, group: _accessors.BuilderGroup) -> None:
            super().__init__(group.get, group.set)
            self.group = group

        def bind(self, cls: type[Any]) -> None:
            self.group.bind(cls)

        def init(self, obj: Any) -> Any:
            return self.group.init(obj)

    def BuilderGroup(disc_at: int = -1, disc: int = 0) -> Any:
        return _GroupProperty(_accessors.BuilderGroup(disc_at, disc))

else:
    from capsvc.codec._pure_descriptors import (
        Bool,
        BuilderGroup,
        Enum,
        Float,
        Group,
        Int,
        List,
        Struct,
        StructList,
        Text,
        UInt8,
        bool_property,
        float_property,
        int_property,
        text_property,
    )
