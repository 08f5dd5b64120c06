"""Ownership of C objects: one pattern for every handle.

A ``Handle`` owns one C pointer and the function that frees it. It keeps its parents
alive (Python references), frees its children before itself (C's order), frees
exactly once (``free()`` is idempotent, a finalizer catches what the user forgot),
and turns use after free into a RuntimeError instead of a crash.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

from ._ffi import ffi
from .errors import GgmlStateError


class Handle:
    kind = "handle"

    def __init__(self, ptr: Any, free_fn: Callable[[Any], None] | None = None,
                 parents: Iterable["Handle"] = ()) -> None:
        if ptr is None or ptr == ffi.NULL:
            raise GgmlStateError(f"ggml returned NULL while creating a {self.kind}")
        self._ptr = ptr
        self._addr = int(ffi.cast("uintptr_t", ptr))
        self._parents = tuple(p for p in parents if p is not None)
        self._children: weakref.WeakSet[Handle] = weakref.WeakSet()
        for parent in self._parents:
            parent._children.add(self)
        self._finalizer = weakref.finalize(self, free_fn, ptr) if free_fn else None

    @property
    def ptr(self) -> Any:
        """The live C pointer; raises if this handle or one it depends on was freed."""
        ptr = self._ptr
        if ptr is None:
            raise GgmlStateError(f"this {self.kind} has been freed")
        for parent in self._parents:
            if parent._ptr is None:
                raise GgmlStateError(f"this {self.kind} depends on a {parent.kind} that has been freed")
        return ptr

    @property
    def alive(self) -> bool:
        return self._ptr is not None and all(p.alive for p in self._parents)

    def free(self) -> None:
        """Free the C object (children first). Safe to call more than once."""
        if self._ptr is None:
            return
        for child in list(self._children):
            child.free()
        self._before_free()
        if self._finalizer is not None:
            self._finalizer()
        self._ptr = None

    def _before_free(self) -> None:
        """Hook for subclasses that must tidy C state before the free call."""

    close = free

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "" if self._ptr is not None else " (freed)"
        return f"<{type(self).__name__}{self._describe()}{state}>"

    def _describe(self) -> str:
        return ""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._addr == self._addr

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._addr))


def unwrap(obj: Any, cls: type, what: str) -> Any:
    """The C pointer of ``obj`` if it is a live ``cls`` handle; TypeError otherwise."""
    if not isinstance(obj, cls):
        raise_type(what, cls.kind, obj)
    return obj.ptr


def raise_type(what: str, expected: str, given: Any) -> None:
    from .errors import GgmlTypeError
    raise GgmlTypeError(f"{what}: expected a {expected}, got {type(given).__name__} ({given!r:.80})")


def free_handle(obj: Any, cls: type, what: str) -> None:
    """The ``*_free`` functions: type-checked, and idempotent (a freed handle is freed again silently)."""
    if not isinstance(obj, cls):
        raise_type(what, cls.kind, obj)
    obj.free()
