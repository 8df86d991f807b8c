"""``mypyc_attr`` and native integer types for modules capsvc compiles, without mypy
installed at run time.

mypyc reads the decorator at compile time (it names ``mypy_extensions.mypyc_attr``, so
the type checker and mypyc see the real one) and leaves nothing of it in the compiled
code; the pure-Python build gets this no-op instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_extensions import i64 as i64
    from mypy_extensions import mypyc_attr as mypyc_attr
    from mypy_extensions import u8 as u8
else:

    def mypyc_attr(*_: Any, **__: Any) -> Any:
        return lambda cls: cls

    # Native integer types: machine integers in compiled code, plain ints in pure Python.
    i64 = int
    u8 = int
