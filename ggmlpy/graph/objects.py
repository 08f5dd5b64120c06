"""The wrappers of ggml.h's objects: ``Context`` (owns its tensors), ``Tensor`` and ``Graph``, and the
conversions that check an argument is one.
"""
from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Iterator

from .._ffi import CData, ffi, lib
from ..core.handle import bump_memory_epoch, Handle, HANDLE_LOCK, Lifetime, raise_type
from ..core.types import type_name
from ..errors import GgmlStateError, GgmlValueError


_MEM_ALIGN = 16


class Context(Handle):
    kind = "ggml context"

    def __init__(self, mem_size: int, no_alloc: bool) -> None:
        params = ffi.new("struct ggml_init_params *", {"mem_size": mem_size, "mem_buffer": ffi.NULL,
                                                        "no_alloc": no_alloc})
        super().__init__(lib.ggml_init(params[0]), lib.ggml_free)
        self.mem_size = mem_size
        self.no_alloc = no_alloc
        self.buffers: list = []  # buffers holding this context's tensors (ggml_backend_alloc_ctx_tensors)

    @property
    def lock(self) -> threading.RLock:
        """The lock public calls on this context hold (the public-call guard, ``_guard.py``): ggml's context is not
        thread-safe (two threads creating tensors in it at once corrupt it, a free under a thread building in it
        crashes)."""
        lock = self.__dict__.get("_lock")
        if lock is None:  # made on first use, also for subclasses that build their context otherwise
            with HANDLE_LOCK:
                lock = self.__dict__.setdefault("_lock", threading.RLock())
        return lock

    def free(self) -> None:
        with self.lock:  # not under a thread building in it (the guard holds it for public calls)
            super().free()

    def _describe(self) -> str:
        return f" {self.mem_size} bytes{' no_alloc' if self.no_alloc else ''}"

    @property
    def used_mem(self) -> int:
        return int(lib.ggml_used_mem(self.ptr))

    def reserve(self, data_bytes: int, n_objects: int = 1, what: str = "tensor", graph_bytes: int = 0) -> None:
        """Check that ``n_objects`` tensors with ``data_bytes`` of data, and graphs of ``graph_bytes`` (always in
        the context, no_alloc or not), still fit (ggml aborts or returns NULL otherwise)."""
        data = 0 if self.no_alloc else data_bytes + _MEM_ALIGN * n_objects
        need = n_objects * int(lib.ggml_tensor_overhead()) + data + graph_bytes
        free = self.mem_size - self.used_mem
        if need > free:
            raise GgmlValueError(
                f"the ggml context is full: creating this {what} needs {need} bytes, {free} of "
                f"{self.mem_size} are left; create the context with a larger mem_size")

    def tensor_ptrs(self) -> Iterator[CData]:
        t = lib.ggml_get_first_tensor(self.ptr)
        while t != ffi.NULL:
            yield t
            t = lib.ggml_get_next_tensor(self.ptr, t)

    def detach_buffer(self, buffer_ptr: CData) -> None:
        for t in self.tensor_ptrs():
            if t.buffer == buffer_ptr:
                t.buffer = ffi.NULL
                t.data = ffi.NULL
        bump_memory_epoch()  # views of these tensors in other contexts lost their memory too

    @property
    def deps_of(self) -> dict[int, tuple[Lifetime, ...]]:
        """Tensor address -> the handles its sources live in (other contexts, ...), for wrappers made later
        (created on first use: subclasses that bypass ``__init__`` have it too)."""
        d = self.__dict__.get("_deps_of")
        if d is None:
            d = self.__dict__["_deps_of"] = {}
        return d

    def wrap_tensor(self, ptr: CData) -> Tensor:
        """A wrapper of a tensor of this context, knowing what its sources depend on."""
        return Tensor(ptr, self, deps=self.deps_of.get(int(ffi.cast("uintptr_t", ptr)), ()))

    @property
    def generation(self) -> Generation:
        """The current lifetime of this context's memory (``ggml_reset`` ends it): every tensor and graph made
        in the context depends on it (created on first use: subclasses that bypass ``__init__`` have it too)."""
        gen = self.__dict__.get("_generation")
        if gen is None or gen._ptr is None:
            ptr = self._ptr
            if ptr is None:
                raise GgmlStateError(f"this {self.kind} has been freed")
            gen = self.__dict__["_generation"] = Generation(self, ptr)
        return gen


class Generation(Handle):
    """One lifetime of a context's memory, from its creation (or a ``ggml_reset``) to the next reset or its
    free. Tensors and graphs of the context depend on it: after ``ggml_reset`` the context reuses the memory
    of their headers and data, so they must refuse to work although the context itself lives on."""
    kind = "ggml context (reset since)"

    def __init__(self, ctx: Context, ptr: CData) -> None:
        super().__init__(ptr, None, parents=(ctx,))

    __eq__ = object.__eq__
    __hash__ = object.__hash__


RESET_MESSAGE = ("{what} was created in a ggml context before ggml_reset was called on it: the context reuses that "
                 "memory for new tensors, so the old ones no longer exist; create it again after the reset")


def merge_deps(owner: Handle, sources: Iterable[Tensor | None] = (),
               deps: Iterable[Lifetime] = ()) -> tuple[Lifetime, ...]:
    """The handles, other than ``owner``, that a tensor made from ``sources`` (Tensors) depends on: their
    owners and what they depend on, plus ``deps``; each once (by identity)."""
    out: dict[int, Lifetime] = {}
    for s in sources:
        if s is None:
            continue
        out.setdefault(id(s.owner), s.owner)
        for d in s.deps:
            out.setdefault(id(d), d)
    for d in deps:
        out.setdefault(id(d), d)
    out.pop(id(owner), None)
    return tuple(out.values())


class Tensor:
    """A tensor of a context (or of an opt context / dataset); cheap, non-owning.

    ``owner`` is the handle whose memory holds the tensor's header; ``_deps`` the other handles its
    sources or viewed tensor live in (a view or an op whose operands are in another context). Using the
    tensor after any of them was freed raises GgmlStateError (ggml would follow dangling pointers)."""
    __slots__ = ("_ptr", "owner", "deps", "__weakref__")

    def __init__(self, ptr: CData, owner: Handle, sources: Iterable[Tensor | None] = (),
                 deps: Iterable[Lifetime] = ()) -> None:
        if ptr == ffi.NULL:
            raise GgmlStateError("ggml returned a NULL tensor")
        self._ptr = ptr
        self.owner = owner
        self.deps = merge_deps(owner, sources, deps)
        if isinstance(owner, Context):
            if self.deps:
                owner.deps_of[int(ffi.cast("uintptr_t", ptr))] = self.deps
            gen = owner.generation  # the tensor's header lives until the context's next ggml_reset
            if not any(d is gen for d in self.deps):
                self.deps = self.deps + (gen,)

    @property
    def ptr(self) -> CData:
        if not self.owner.alive:
            raise GgmlStateError(f"this tensor belongs to a {self.owner.kind} that has been freed")
        for d in self.deps:
            if not d.alive:
                if isinstance(d, Generation):
                    what = "this tensor" if d.parents[0] is self.owner else "a tensor this one reads from (or views)"
                    raise GgmlStateError(RESET_MESSAGE.format(what=what[0].upper() + what[1:]))
                raise GgmlStateError(f"this tensor reads from (or views) a tensor of a {d.kind} that has been freed: "
                                     f"its inputs are gone; rebuild it from live tensors")
        return self._ptr

    @property
    def alive(self) -> bool:
        """Whether the tensor's header and everything it reads from are still alive."""
        return self.owner.alive and all(d.alive for d in self.deps)

    @property
    def keepers(self) -> tuple[Lifetime, ...]:
        """Every handle this tensor needs: its owner and what it depends on."""
        return (self.owner,) + self.deps

    @property
    def ctx(self) -> Context | None:
        return self.owner if isinstance(self.owner, Context) else None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        ne = self.ptr.ne
        return (int(ne[0]), int(ne[1]), int(ne[2]), int(ne[3]))

    @property
    def type(self) -> int:
        return int(self.ptr.type)

    @property
    def name(self) -> str:
        return ffi.string(self.ptr.name).decode("utf-8", "replace")

    @property
    def op_name(self) -> str:
        return ffi.string(lib.ggml_op_desc(self.ptr)).decode()

    def nelements(self) -> int:
        return int(lib.ggml_nelements(self.ptr))

    def nbytes(self) -> int:
        return int(lib.ggml_nbytes(self.ptr))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and other._ptr == self._ptr

    def __hash__(self) -> int:
        return hash(int(ffi.cast("uintptr_t", self._ptr)))

    def __repr__(self) -> str:
        if not self.alive:
            return "<Tensor (freed)>"
        return f"<Tensor {self.name or '?'} {type_name(self.type)} {list(self.shape)} op={self.op_name}>"


def as_tensor(obj: object, what: str) -> Tensor:
    if not isinstance(obj, Tensor):
        raise_type(what, "Tensor", obj)
    _ = obj.ptr  # raises if freed
    return obj


def as_graph(obj: object, what: str) -> Graph:
    if not isinstance(obj, Graph):
        raise_type(what, "Graph (ggml_new_graph)", obj)
    _ = obj.ptr  # raises if its context was freed
    return obj


class Graph:
    """A computation graph living in a context.

    ``_deps`` are the handles its nodes and leafs live in besides ``ctx`` (the tensors added with
    ``ggml_build_forward_expand`` may belong to other contexts); the graph is unusable once one is freed.
    ``_checked`` caches the last successful pre-compute check (see ``compute.checks.check_graph_ready``);
    ``_allocators`` the graph allocators / schedulers whose memory its tensors got."""
    __slots__ = ("_ptr", "ctx", "size", "grads", "deps", "checked_key", "allocators", "__weakref__")

    def __init__(self, ptr: CData, ctx: Context, size: int, grads: bool) -> None:
        self._ptr, self.ctx, self.size, self.grads = ptr, ctx, size, grads
        gen = ctx.generation  # the graph lives in the context's memory until its next ggml_reset
        self.deps: dict[int, Lifetime] = {id(gen): gen}
        self.checked_key: Hashable = None
        self.allocators: dict[int, Handle] = {}

    @property
    def ptr(self) -> CData:
        if not self.ctx.alive:
            raise GgmlStateError("this graph belongs to a ggml context that has been freed")
        for d in self.deps.values():
            if not d.alive:
                if isinstance(d, Generation):
                    what = "This graph" if d.parents[0] is self.ctx else "A tensor of this graph"
                    raise GgmlStateError(RESET_MESSAGE.format(what=what))
                raise GgmlStateError(f"this graph holds tensors of a {d.kind} that has been freed; build the graph "
                                     "again from live tensors")
        return self._ptr

    @property
    def keepers(self) -> tuple[Lifetime, ...]:
        """Every handle the graph's tensors need: its context, the contexts of its tensors, their buffers."""
        hs = [self.ctx, *self.deps.values()]
        for h in list(hs):
            hs.extend(b for b in getattr(h, "buffers", ()) if b.alive)  # a freed one was replaced or is unused
        hs.extend(a for a in self.allocators.values() if a.alive)
        return tuple(hs)

    def add_deps(self, tensor: Tensor) -> None:
        for h in tensor.keepers:
            if h is not self.ctx:
                self.deps.setdefault(id(h), h)

    def n_nodes(self) -> int:
        return int(lib.ggml_graph_n_nodes(self.ptr))

    def node_tensor(self, ptr: CData) -> Tensor:
        """A wrapper of a node or leaf of this graph."""
        return Tensor(ptr, self.ctx, deps=self.deps.values())

    def nodes(self) -> list[Tensor]:
        return [self.node_tensor(lib.ggml_graph_node(self.ptr, i)) for i in range(self.n_nodes())]

    def __repr__(self) -> str:
        return f"<Graph size={self.size} nodes={self.n_nodes() if self.ctx.alive else '?'}>"

