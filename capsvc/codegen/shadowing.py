"""Builtin type names that a generated class's own members shadow, qualified.

Theory of operation: a schema may name a field ``str``, ``bool`` or ``bytes`` (schema.capnp's
``Value.bool``, test.capnp's ``getEnormousString -> (str :Text)``, sandstorm's
``Body.bytes``). The generated reader then has a property ``str``, and in that class's own
body the annotations of its methods (``def to_dict(self) -> dict[str, Any]``, ``assign(*,
str: str | None)``) would name the property, not the type: mypy rejects them ("Variable
... is not valid as a type"). Python resolves names in a class body before the module's,
but not inside its methods' bodies, nor in nested classes.

So, after rendering, ``qualify`` finds each class whose members (properties, methods,
class attributes) shadow a builtin type, and rewrites the uses of that name in the
annotations the class body itself holds (method signatures, class-level annotations) as
``_builtins.str``, the module importing ``builtins as _builtins``. Only those spots
change: a schema without such names renders byte for byte as before, and the member
keeps the schema's own name (the approach of mypy-protobuf, which spells every builtin
as ``builtins.int``).
"""

from __future__ import annotations

import ast

__all__ = ["BUILTIN_IMPORT", "qualify"]

#: The builtin types the generator writes in annotations, and the builtin decorators it
#: writes in class bodies (a field named ``property``, as workerd's rtti.capnp has, would
#: make every ``@property`` after it call the field's property object).
_TYPES = frozenset(
    {"bool", "bytes", "bytearray", "dict", "float", "int", "list", "memoryview", "object"}
    | {"str", "tuple", "type"}
)
_DECORATORS = frozenset({"property", "staticmethod", "classmethod"})
BUILTIN_IMPORT = "import builtins as _builtins"


def qualify(source: str) -> str:
    """``source`` with shadowed builtin type names in class-body annotations qualified
    (and ``builtins`` imported once, after ``from __future__``), or ``source`` itself."""
    spots: list[tuple[int, int, int]] = []  # (line from 1, start and end byte column)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            members = _members(node)
            shadowed = members & _TYPES
            if shadowed:
                spots.extend(_uses(node, shadowed))
            spots.extend(_decorations(node, members & _DECORATORS))
    if not spots:
        return source
    lines = source.split("\n")
    for line, start, _ in sorted(spots, reverse=True):
        text = lines[line - 1].encode()  # ast's columns count UTF-8 bytes
        lines[line - 1] = (text[:start] + b"_builtins." + text[start:]).decode()
    future = lines.index("from __future__ import annotations")
    lines[future + 1 : future + 1] = ["", BUILTIN_IMPORT]
    return "\n".join(lines)


def _members(cls: ast.ClassDef) -> set[str]:
    """The names a class body binds itself."""
    names: set[str] = set()
    for statement in cls.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names.update(t.id for t in statement.targets if isinstance(t, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
    return names


def _decorations(cls: ast.ClassDef, shadowed: set[str]) -> list[tuple[int, int, int]]:
    """Where the class body decorates a method with one of ``shadowed`` (``@property``,
    or ``@x.setter`` of a property named ``property``... only the bare builtin names)."""
    return [
        (decorator.lineno, decorator.col_offset, decorator.end_col_offset or 0)
        for statement in cls.body
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef)
        for decorator in statement.decorator_list
        if isinstance(decorator, ast.Name) and decorator.id in shadowed
    ]


def _uses(cls: ast.ClassDef, shadowed: set[str]) -> list[tuple[int, int, int]]:
    """Where the class body's own annotations name one of ``shadowed``."""
    annotations: list[ast.expr] = []
    for statement in cls.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = statement.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            annotations += [a.annotation for a in every if a.annotation is not None]
            if statement.returns is not None:
                annotations.append(statement.returns)
        elif isinstance(statement, ast.AnnAssign):
            annotations.append(statement.annotation)
    return [
        (name.lineno, name.col_offset, name.end_col_offset or name.col_offset)
        for annotation in annotations
        for name in ast.walk(annotation)
        if isinstance(name, ast.Name) and name.id in shadowed
    ]
