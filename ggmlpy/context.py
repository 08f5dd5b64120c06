"""Contexts, tensors and graphs (ggml.h).

A ``Context`` owns a ``ggml_context``; a ``Tensor`` and a ``Graph`` are views of memory
the context owns, so they keep it alive and refuse to work once it is freed.
"""
from __future__ import annotations

import functools
import numbers
import os
from typing import Any, Iterable, Iterator

from ._ffi import ffi, lib
from ._handle import _LOCK, Handle, bump_memory_epoch, free_handle, raise_type, unwrap
from .errors import GgmlInUseError, GgmlStateError, GgmlTypeError, GgmlValueError, expect

GGML_TYPE_F32 = lib.GGML_TYPE_F32
GGML_TYPE_F16 = lib.GGML_TYPE_F16
GGML_TYPE_BF16 = lib.GGML_TYPE_BF16
GGML_TYPE_I8 = lib.GGML_TYPE_I8
GGML_TYPE_I16 = lib.GGML_TYPE_I16
GGML_TYPE_I32 = lib.GGML_TYPE_I32
GGML_TYPE_I64 = lib.GGML_TYPE_I64
GGML_TYPE_F64 = lib.GGML_TYPE_F64
GGML_TYPE_Q4_0 = lib.GGML_TYPE_Q4_0
GGML_TYPE_Q8_0 = lib.GGML_TYPE_Q8_0
PLAIN_TYPES = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_I8, GGML_TYPE_I16,
               GGML_TYPE_I32, GGML_TYPE_I64, GGML_TYPE_F64}
FLOAT_TYPES = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16}

GGML_DEFAULT_GRAPH_SIZE = int(lib.GGML_DEFAULT_GRAPH_SIZE)
_MEM_ALIGN = 16
# ggml stores a graph's size in an int and hashes 2*size entries: larger graphs overflow its arithmetic.
MAX_GRAPH_SIZE = 1 << 30
INT64_MAX = (1 << 63) - 1


@functools.lru_cache(maxsize=1)
def physical_memory() -> int:
    """Bytes of physical memory (RAM plus swap when /proc/meminfo says so); 2**62 when unknown. Read once."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "SwapTotal"):
                    total += int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        total = 0
    if total <= 0:
        try:
            total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            total = 1 << 62
    return total


def _read_kv(path: str) -> dict[str, int]:
    """'key value [kB]' lines of a /proc or cgroup file as bytes (kB converted); {} if unreadable."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.replace(":", " ").split()
                if len(parts) >= 2 and parts[1].isdigit():
                    out[parts[0]] = int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    except (OSError, ValueError):
        pass
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError):
        return None


def _cgroup_available() -> int | None:
    """Bytes this process's memory cgroup (a container's limit) still allows, or None without a limit."""
    roots = [("/sys/fs/cgroup", "memory.max", "memory.current"),                       # cgroup v2
             ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes")]  # cgroup v1
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f]
    except OSError:
        lines = []
    best = None
    for root, limit_file, usage_file in roots:
        rel = next((p for _, ctrl, p in (x for x in lines if len(x) == 3)
                    if (ctrl == "" and root.endswith("cgroup")) or "memory" in ctrl.split(",")), "/")
        for d in dict.fromkeys((os.path.join(root, rel.lstrip("/")), root)):
            limit, usage = _read_int(os.path.join(d, limit_file)), _read_int(os.path.join(d, usage_file))
            if limit is None or usage is None or limit >= 1 << 60:
                continue
            stat = _read_kv(os.path.join(d, "memory.stat"))
            reclaimable = stat.get("inactive_file", stat.get("total_inactive_file", 0))
            free = max(0, limit - usage + reclaimable)
            best = free if best is None else min(best, free)
            break
    return best


def available_memory() -> int:
    """Bytes a new allocation can have now (not only the machine's total): /proc/meminfo's MemAvailable plus
    free swap, less under a container's memory limit (cgroup) and, with strict overcommit
    (vm.overcommit_memory=2), under CommitLimit - Committed_AS. physical_memory() when unknown."""
    info = _read_kv("/proc/meminfo")
    if "MemAvailable" not in info:
        return physical_memory()
    avail = info["MemAvailable"] + info.get("SwapFree", 0)
    if _read_int("/proc/sys/vm/overcommit_memory") == 2 and "CommitLimit" in info:
        avail = min(avail, max(0, info["CommitLimit"] - info.get("Committed_AS", 0)))
    cgroup = _cgroup_available()
    if cgroup is not None:
        avail = min(avail, cgroup)
    limited = _rlimit_available()
    if limited is not None:
        avail = min(avail, limited)
    return avail


def _rlimit_available() -> int | None:
    """What the process's own limits leave (``ulimit -v``: RLIMIT_AS against VmSize, ``ulimit -d``: RLIMIT_DATA
    against VmData, as on many clusters): malloc fails beyond them whatever the machine has free. None when
    unlimited."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    status = _read_kv("/proc/self/status")
    room = []
    for limit, used in ((getattr(resource, "RLIMIT_AS", None), "VmSize"),
                        (getattr(resource, "RLIMIT_DATA", None), "VmData")):
        if limit is None:
            continue
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY and used in status:
            room.append(max(0, soft - status[used]))
    return min(room) if room else None


# Allocations below this size are not checked against the available memory (reading it costs file reads).
_SMALL_ALLOCATION = 64 << 20


def check_fits_memory(fn: str, what: str, nbytes: int, fix: str) -> None:
    """Refuse an allocation larger than the memory available now (ggml would abort when malloc fails, C++
    throw bad_alloc, or the kernel kill the process once the memory is touched)."""
    limit = physical_memory()
    if nbytes > limit:
        raise GgmlValueError(f"{fn}: {what} needs {nbytes} bytes, more than this machine's memory ({limit} bytes); "
                             f"{fix}")
    if nbytes > _SMALL_ALLOCATION:
        avail = available_memory()
        if nbytes > avail:
            raise GgmlValueError(f"{fn}: {what} needs {nbytes} bytes, more than the memory available now "
                                 f"({avail} of {limit} bytes; other processes or a container limit use the rest); "
                                 f"{fix}")


def c_string(fn: str, what: str, value: Any) -> bytes:
    """``value`` (a str) as UTF-8 bytes for C; refuses NUL characters, which C would cut the string at."""
    if not isinstance(value, str):
        raise GgmlTypeError(f"{fn}: {what} must be a str, got {value!r}")
    if "\0" in value:
        raise GgmlValueError(f"{fn}: {what} must not contain NUL characters ('\\0'): C would cut it at the first "
                             f"one, got {value!r}; remove them")
    try:
        return value.encode()
    except UnicodeEncodeError:  # lone surrogates ('\udc80' from undecodable bytes) have no UTF-8 form
        raise GgmlValueError(f"{fn}: {what} must be valid Unicode text, got {value!r} (it holds lone surrogate "
                             "characters, which have no UTF-8 form)") from None


def check_graph_size(fn: str, size: Any, what: str = "graph size") -> int:
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise GgmlValueError(f"{fn}: {what} must be an int >= 1, got {size!r}")
    if size > MAX_GRAPH_SIZE:
        raise GgmlValueError(f"{fn}: {what} must be at most {MAX_GRAPH_SIZE} (2**30) nodes, got {size}; "
                             "split the computation into smaller graphs")
    return size


def type_name(t: int) -> str:
    return ffi.string(lib.ggml_type_name(t)).decode()


class Context(Handle):
    kind = "ggml context"

    def __init__(self, mem_size: int, no_alloc: bool) -> None:
        params = ffi.new("struct ggml_init_params *", {"mem_size": mem_size, "mem_buffer": ffi.NULL,
                                                        "no_alloc": no_alloc})
        super().__init__(lib.ggml_init(params[0]), lib.ggml_free)
        self.mem_size = mem_size
        self.no_alloc = no_alloc
        self._buffers: list = []  # buffers holding this context's tensors (ggml_backend_alloc_ctx_tensors)

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

    def _iter_tensor_ptrs(self) -> Iterator[Any]:
        t = lib.ggml_get_first_tensor(self.ptr)
        while t != ffi.NULL:
            yield t
            t = lib.ggml_get_next_tensor(self.ptr, t)

    def _detach_buffer(self, buffer_ptr: Any) -> None:
        for t in self._iter_tensor_ptrs():
            if t.buffer == buffer_ptr:
                t.buffer = ffi.NULL
                t.data = ffi.NULL
        bump_memory_epoch()  # views of these tensors in other contexts lost their memory too

    @property
    def deps_of(self) -> dict[int, tuple]:
        """Tensor address -> the handles its sources live in (other contexts, ...), for wrappers made later
        (created on first use: subclasses that bypass ``__init__`` have it too)."""
        d = self.__dict__.get("_deps_of")
        if d is None:
            d = self.__dict__["_deps_of"] = {}
        return d

    def _tensor(self, ptr: Any) -> "Tensor":
        """A wrapper of a tensor of this context, knowing what its sources depend on."""
        return Tensor(ptr, self, deps=self.deps_of.get(int(ffi.cast("uintptr_t", ptr)), ()))

    @property
    def generation(self) -> "Generation":
        """The current lifetime of this context's memory (``ggml_reset`` ends it): every tensor and graph made
        in the context depends on it (created on first use: subclasses that bypass ``__init__`` have it too)."""
        gen = self.__dict__.get("_generation")
        if gen is None or gen._ptr is None:
            if self._ptr is None:
                raise GgmlStateError(f"this {self.kind} has been freed")
            gen = self.__dict__["_generation"] = Generation(self)
        return gen


class Generation(Handle):
    """One lifetime of a context's memory, from its creation (or a ``ggml_reset``) to the next reset or its
    free. Tensors and graphs of the context depend on it: after ``ggml_reset`` the context reuses the memory
    of their headers and data, so they must refuse to work although the context itself lives on."""
    kind = "ggml context (reset since)"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx._ptr, None, parents=(ctx,))

    __eq__ = object.__eq__
    __hash__ = object.__hash__


RESET_MESSAGE = ("{what} was created in a ggml context before ggml_reset was called on it: the context reuses that "
                 "memory for new tensors, so the old ones no longer exist; create it again after the reset")


def merge_deps(owner: Any, sources: Iterable[Any] = (), deps: Iterable[Any] = ()) -> tuple:
    """The handles, other than ``owner``, that a tensor made from ``sources`` (Tensors) depends on: their
    owners and what they depend on, plus ``deps``; each once (by identity)."""
    out: dict[int, Any] = {}
    for s in sources:
        if s is None:
            continue
        out.setdefault(id(s.owner), s.owner)
        for d in s._deps:
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
    __slots__ = ("_ptr", "owner", "_deps", "__weakref__")

    def __init__(self, ptr: Any, owner: Handle, sources: Iterable["Tensor | None"] = (), deps: Iterable[Any] = ()) -> None:
        if ptr == ffi.NULL:
            raise GgmlStateError("ggml returned a NULL tensor")
        self._ptr = ptr
        self.owner = owner
        self._deps = merge_deps(owner, sources, deps)
        if isinstance(owner, Context):
            if self._deps:
                owner.deps_of[int(ffi.cast("uintptr_t", ptr))] = self._deps
            gen = owner.generation  # the tensor's header lives until the context's next ggml_reset
            if not any(d is gen for d in self._deps):
                self._deps = self._deps + (gen,)

    @property
    def ptr(self) -> Any:
        if not self.owner.alive:
            raise GgmlStateError(f"this tensor belongs to a {self.owner.kind} that has been freed")
        for d in self._deps:
            if not d.alive:
                if isinstance(d, Generation):
                    what = "this tensor" if d._parents[0] is self.owner else "a tensor this one reads from (or views)"
                    raise GgmlStateError(RESET_MESSAGE.format(what=what[0].upper() + what[1:]))
                raise GgmlStateError(f"this tensor reads from (or views) a tensor of a {d.kind} that has been freed: "
                                     f"its inputs are gone; rebuild it from live tensors")
        return self._ptr

    @property
    def alive(self) -> bool:
        """Whether the tensor's header and everything it reads from are still alive."""
        return self.owner.alive and all(d.alive for d in self._deps)

    @property
    def keepers(self) -> tuple:
        """Every handle this tensor needs: its owner and what it depends on."""
        return (self.owner,) + self._deps

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


def as_tensor(obj: Any, what: str) -> Tensor:
    if not isinstance(obj, Tensor):
        raise_type(what, "Tensor", obj)
    obj.ptr  # raises if freed
    return obj


def as_graph(obj: Any, what: str) -> "Graph":
    if not isinstance(obj, Graph):
        raise_type(what, "Graph (ggml_new_graph)", obj)
    obj.ptr  # raises if its context was freed
    return obj


class Graph:
    """A computation graph living in a context.

    ``_deps`` are the handles its nodes and leafs live in besides ``ctx`` (the tensors added with
    ``ggml_build_forward_expand`` may belong to other contexts); the graph is unusable once one is freed.
    ``_checked`` caches the last successful pre-compute check (see ``_checks.check_graph_ready``);
    ``_allocators`` the graph allocators / schedulers whose memory its tensors got."""
    __slots__ = ("_ptr", "ctx", "size", "grads", "_deps", "_checked", "_allocators", "__weakref__")

    def __init__(self, ptr: Any, ctx: Context, size: int, grads: bool) -> None:
        self._ptr, self.ctx, self.size, self.grads = ptr, ctx, size, grads
        gen = ctx.generation  # the graph lives in the context's memory until its next ggml_reset
        self._deps: dict[int, Any] = {id(gen): gen}
        self._checked: Any = None
        self._allocators: dict[int, Any] = {}

    @property
    def ptr(self) -> Any:
        if not self.ctx.alive:
            raise GgmlStateError("this graph belongs to a ggml context that has been freed")
        for d in self._deps.values():
            if not d.alive:
                if isinstance(d, Generation):
                    what = "This graph" if d._parents[0] is self.ctx else "A tensor of this graph"
                    raise GgmlStateError(RESET_MESSAGE.format(what=what))
                raise GgmlStateError(f"this graph holds tensors of a {d.kind} that has been freed; build the graph "
                                     "again from live tensors")
        return self._ptr

    @property
    def keepers(self) -> tuple:
        """Every handle the graph's tensors need: its context, the contexts of its tensors, their buffers."""
        hs = [self.ctx, *self._deps.values()]
        for h in list(hs):
            hs.extend(b for b in getattr(h, "_buffers", ()) if b.alive)  # a freed one was replaced or is unused
        hs.extend(a for a in self._allocators.values() if a.alive)
        return tuple(hs)

    def add_deps(self, tensor: Tensor) -> None:
        for h in tensor.keepers:
            if h is not self.ctx:
                self._deps.setdefault(id(h), h)

    def n_nodes(self) -> int:
        return int(lib.ggml_graph_n_nodes(self.ptr))

    def node_tensor(self, ptr: Any) -> Tensor:
        """A wrapper of a node or leaf of this graph."""
        return Tensor(ptr, self.ctx, deps=self._deps.values())

    def nodes(self) -> list[Tensor]:
        return [self.node_tensor(lib.ggml_graph_node(self.ptr, i)) for i in range(self.n_nodes())]

    def __repr__(self) -> str:
        return f"<Graph size={self.size} nodes={self.n_nodes() if self.ctx.alive else '?'}>"


# ---------------------------------------------------------------- contexts

def ggml_init(mem_size: int = 16 * 1024 * 1024, no_alloc: bool = False) -> Context:
    """Create a ggml context: the memory pool that holds tensor headers, graphs and (optionally) data.

    Every tensor and graph is created in a context. With ``no_alloc=False`` the context also holds the
    tensors' data (enough for ``ggml_graph_compute`` on the CPU); with ``no_alloc=True`` it holds only
    headers and the data goes to a backend buffer (``ggml_backend_alloc_ctx_tensors``) or is placed by
    a scheduler: the usual setup for training on any backend. The context is freed with ``ggml_free``,
    at the end of a ``with`` block, or when it is garbage-collected; its tensors then stop working.

    Arguments:
        mem_size: the pool size in bytes (default 16 MiB). It must cover ``ggml_tensor_overhead()`` per
            tensor, ``ggml_graph_overhead(size)`` per graph and, unless ``no_alloc``, the tensors' data.
        no_alloc: False (the default) allocates tensor data inside the context; True creates headers only.

    Value: a Context handle (a context manager). Raises GgmlValueError for a mem_size that is not a
    positive int.

    Example:
        >>> ctx = ggml_init(100 * ggml_tensor_overhead() + ggml_graph_overhead(), no_alloc=True)
        >>> with ggml_init(1 << 20) as ctx:
        ...     x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 10)
    """
    expect(isinstance(mem_size, int) and not isinstance(mem_size, bool) and mem_size > 0,
           f"ggml_init: mem_size must be a positive int (bytes), got {mem_size!r}")
    expect(isinstance(no_alloc, bool), f"ggml_init: no_alloc must be a bool, got {no_alloc!r}", GgmlTypeError)
    check_fits_memory("ggml_init", f"a context of mem_size={mem_size}", mem_size,
                      "size it from ggml_tensor_overhead() and ggml_graph_overhead() (and the data, unless no_alloc)")
    return Context(mem_size, no_alloc)


def ggml_init_auto(*shapes: Any, extra_mb: float = 10, type: int = GGML_TYPE_F32, no_alloc: bool = False,
                   **named_shapes: Any) -> Context:
    """A context sized for the tensors you plan to create in it, plus some room (ggmlR's helper).

    Each planned tensor is given by its shape (ne0 first: an int, or a list/tuple of 1 to 4 ints), by
    position or by name as in ggmlR (``ggml_init_auto(mat1=(1000, 1000), mat2=(1000, 1000))``). Each one
    counts its data (of ``type``), ``ggml_tensor_overhead()`` and 256 bytes of alignment; ``extra_mb``
    MiB are added for graphs and intermediate results.

    Arguments:
        *shapes, **named_shapes: the planned tensors' shapes (names are only labels).
        extra_mb: extra memory in MiB (a number >= 0, default 10).
        type: the planned tensors' type (default ``GGML_TYPE_F32``; quantized types count their block size).
        no_alloc: as for ``ggml_init`` (default False). With True only the headers and the extra room count.

    Value: a Context (see ``ggml_init``). Raises GgmlValueError for a shape that is not 1 to 4 ints >= 1.

    Example:
        >>> ctx = ggml_init_auto(mat1=(1000, 1000), mat2=(1000, 1000))
        >>> ggml_get_mem_size(ctx) > 8_000_000
        True
    """
    fn = "ggml_init_auto"
    from ._checks import is_real  # _checks imports this module
    if not is_real(extra_mb) or not extra_mb >= 0 \
            or extra_mb == float("inf"):
        raise GgmlValueError(f"{fn}: extra_mb must be a finite number >= 0, got {extra_mb!r}")
    if not isinstance(type, int) or isinstance(type, bool) or not 0 <= type < int(lib.GGML_TYPE_COUNT) \
            or int(lib.ggml_blck_size(type)) == 0:
        raise GgmlTypeError(f"{fn}: type must be a GGML_TYPE_* int, got {type!r}")
    expect(isinstance(no_alloc, bool), f"{fn}: no_alloc must be a bool, got {no_alloc!r}", GgmlTypeError)
    total = 0
    for label, shape in [*((f"shapes[{i}]", s) for i, s in enumerate(shapes)), *named_shapes.items()]:
        dims = [shape] if isinstance(shape, numbers.Integral) else shape
        if isinstance(dims, (str, bytes)) or not hasattr(dims, "__len__") or not 1 <= len(dims) <= 4 or \
                any(not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1 for n in dims):
            raise GgmlValueError(f"{fn}: {label} must be a tensor shape: an int or 1 to 4 ints >= 1, got {shape!r}")
        count = 1
        for n in dims:
            count *= int(n)
        data = 0 if no_alloc else -(-count // int(lib.ggml_blck_size(type))) * int(lib.ggml_type_size(type))
        total += data + int(lib.ggml_tensor_overhead()) + 256
    total += int(extra_mb * 1024 * 1024)
    expect(total > 0, f"{fn}: the context would have no memory (no shapes and extra_mb=0); give shapes or extra_mb > 0")
    return ggml_init(total, no_alloc)


def ggml_free(ctx: Context) -> None:
    """Free a context: the memory of its tensor headers, graphs and (without ``no_alloc``) data.

    Idempotent: freeing twice does nothing. Tensors and graphs of the context raise GgmlStateError
    when used afterwards. A context is also freed at the end of a ``with`` block, or when it is
    garbage-collected.

    Arguments:
        ctx: a Context from ``ggml_init``.

    Value: None.

    Example:
        >>> ggml_free(ctx)
    """
    free_handle(ctx, Context, "ggml_free(ctx)")


def ggml_reset(ctx: Context) -> None:
    """Empty a context so that its memory can be used again, without freeing and re-creating it.

    Every tensor and graph created in the context before the reset stops working (using one raises
    GgmlStateError): the context hands their memory to the tensors created after the reset. So do
    tensors of other contexts that read from or view them, and an opt context built on them is freed
    (as ``ggml_free`` would). Buffers allocated for the old tensors (``ggml_backend_alloc_ctx_tensors``)
    stay allocated until freed. A context in use by a running computation or fit cannot be reset
    (GgmlInUseError).

    Arguments:
        ctx: a Context from ``ggml_init``.

    Value: None.

    Example:
        >>> ctx = ggml_init(1 << 20)
        >>> a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 100)
        >>> ggml_reset(ctx)                       # a is gone; the memory is free again
        >>> b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 200)
    """
    ptr = unwrap(ctx, Context, "ggml_reset(ctx)")
    with _LOCK:
        busy = ctx._busy_in_tree()
        if busy is not None:
            handle, what = busy
            which = "it" if handle is ctx else f"a {handle.kind} that depends on it"
            raise GgmlInUseError(f"ggml_reset: cannot reset this ggml context: {which} is in use by {what} (from one "
                                 "of its callbacks or generators, or another thread); resetting it now would pull its "
                                 "memory out from under that call. Reset it after that call has returned")
        old = ctx.__dict__.get("_generation")
        if old is not None:
            old.free()  # its tensors and graphs (and what was built on them) stop working
        lib.ggml_reset(ptr)
        ctx.deps_of.clear()
        ctx.__dict__.pop("_generation", None)
        bump_memory_epoch()


def ggml_tensor_overhead() -> int:
    """Bytes of context memory one tensor header takes (without its data).

    Use it to size a ``no_alloc=True`` context: ``n_tensors * ggml_tensor_overhead()`` plus the graphs.

    Value: an int (bytes).

    Example:
        >>> ctx = ggml_init(64 * ggml_tensor_overhead(), no_alloc=True)
    """
    return int(lib.ggml_tensor_overhead())


def ggml_graph_overhead(size: int = GGML_DEFAULT_GRAPH_SIZE, grads: bool = False) -> int:
    """Bytes of context memory a graph of ``size`` nodes takes.

    Arguments:
        size: the graph's node capacity (default ``GGML_DEFAULT_GRAPH_SIZE``, 2048, what
            ``ggml_new_graph`` uses).
        grads: whether the graph also keeps gradients (``ggml_new_graph_custom(..., grads=True)``);
            default False.

    Value: an int (bytes).

    Example:
        >>> ctx = ggml_init(200 * ggml_tensor_overhead() + ggml_graph_overhead(4096, True), no_alloc=True)
    """
    check_graph_size("ggml_graph_overhead", size, "size")
    return int(lib.ggml_graph_overhead_custom(size, bool(grads)))


def ggml_used_mem(ctx: Context) -> int:
    """Bytes of the context's pool used so far (headers, graphs and data created in it).

    Arguments:
        ctx: a Context.

    Value: an int (bytes), at most the context's ``mem_size``.

    Example:
        >>> ggml_used_mem(ctx)
    """
    unwrap(ctx, Context, "ggml_used_mem(ctx)")
    return ctx.used_mem


# ---------------------------------------------------------------- tensors

def _check_type(t: Any, what: str) -> int:
    if not isinstance(t, int) or t not in PLAIN_TYPES:
        names = ", ".join(sorted(f"GGML_TYPE_{type_name(x).upper()}" for x in PLAIN_TYPES))
        raise GgmlTypeError(f"{what}: expected one of {names}, got {t!r}")
    return t


def _new_tensor(ctx: Context, type: int, ne: tuple[int, ...]) -> Tensor:
    ctx_ptr = unwrap(ctx, Context, f"ggml_new_tensor_{len(ne)}d(ctx)")
    _check_type(type, f"ggml_new_tensor_{len(ne)}d(type)")
    for i, n in enumerate(ne):
        if not isinstance(n, numbers.Integral) or isinstance(n, bool):
            raise GgmlTypeError(f"ggml_new_tensor_{len(ne)}d: ne{i} must be an int >= 1, got {n!r}")
        expect(n >= 1, f"ggml_new_tensor_{len(ne)}d: ne{i} must be an int >= 1, got {n!r}")
    ne = tuple(int(n) for n in ne)  # numpy ints too
    count = 1
    for n in ne:
        count *= n
    nbytes = count * int(lib.ggml_type_size(type)) // int(lib.ggml_blck_size(type))
    expect(count <= INT64_MAX and nbytes <= INT64_MAX,
           f"ggml_new_tensor_{len(ne)}d: the shape {list(ne)} has {count} elements ({nbytes} bytes), beyond ggml's "
           f"64-bit sizes (at most {INT64_MAX}); use smaller dimensions")
    ctx.reserve(count * int(lib.ggml_type_size(type)))
    fn = (lib.ggml_new_tensor_1d, lib.ggml_new_tensor_2d, lib.ggml_new_tensor_3d, lib.ggml_new_tensor_4d)[len(ne) - 1]
    return Tensor(fn(ctx_ptr, type, *ne), ctx)


def ggml_new_tensor_1d(ctx: Context, type: int, ne0: int) -> Tensor:
    """A new 1-D tensor ``[ne0]`` in ``ctx``.

    Arguments:
        ctx: the context that owns the tensor (created by ``ggml_init``).
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        ne0: the number of elements (an int >= 1).

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor of shape ``[ne0, 1, 1, 1]``.

    Example:
        >>> b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 128)
    """
    return _new_tensor(ctx, type, (ne0,))


def ggml_new_tensor_2d(ctx: Context, type: int, ne0: int, ne1: int) -> Tensor:
    """A new 2-D tensor ``[ne0, ne1]`` in ``ctx`` (ne0 is the fastest dimension).

    In ggml layout a batch of N samples of F features is ``[F, N]``; its numpy twin is an ``(N, F)``
    array (see ``ggml_backend_tensor_set_data``).

    Arguments:
        ctx: the context that owns the tensor (created by ``ggml_init``).
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        ne0: the size of dimension 0 (features; an int >= 1). ne1: the size of dimension 1 (>= 1).

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor of shape ``[ne0, ne1, 1, 1]``.

    Example:
        >>> x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 784, 32)     # 32 samples of 784 features
    """
    return _new_tensor(ctx, type, (ne0, ne1))


def ggml_new_tensor_3d(ctx: Context, type: int, ne0: int, ne1: int, ne2: int) -> Tensor:
    """A new 3-D tensor ``[ne0, ne1, ne2]`` in ``ctx`` (ne0 is the fastest dimension).

    Arguments:
        ctx: the context that owns the tensor (created by ``ggml_init``).
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        ne0, ne1, ne2: the sizes (ints >= 1).

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor of shape ``[ne0, ne1, ne2, 1]``.

    Example:
        >>> seq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 100, 8)  # 8 sequences of 100 steps x 64
    """
    return _new_tensor(ctx, type, (ne0, ne1, ne2))


def ggml_new_tensor_4d(ctx: Context, type: int, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """A new 4-D tensor ``[ne0, ne1, ne2, ne3]`` in ``ctx`` (ne0 is the fastest dimension).

    Images in ggml layout are ``[W, H, C, N]`` (a numpy ``(N, C, H, W)`` array).

    Arguments:
        ctx: the context that owns the tensor (created by ``ggml_init``).
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        ne0, ne1, ne2, ne3: the sizes (ints >= 1).

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor of shape ``[ne0, ne1, ne2, ne3]``.

    Example:
        >>> images = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 28, 28, 1, 32)
    """
    return _new_tensor(ctx, type, (ne0, ne1, ne2, ne3))


def ggml_new_tensor(ctx: Context, type: int, n_dims: int, ne) -> Tensor:
    """A new tensor with ``n_dims`` dimensions whose sizes are the first ``n_dims`` values of ``ne``.

    The generic form of ``ggml_new_tensor_1d`` ... ``_4d``.

    Arguments:
        ctx: the context that owns the tensor (created by ``ggml_init``).
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        n_dims: 1, 2, 3 or 4.
        ne: a sequence of at least ``n_dims`` sizes (ints >= 1), ne[0] first.

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor; the missing dimensions are 1.

    Example:
        >>> t = ggml_new_tensor(ctx, GGML_TYPE_I32, 2, [10, 4])
    """
    if isinstance(ne, (str, bytes, dict)) or not hasattr(ne, "__iter__"):
        raise GgmlTypeError(f"ggml_new_tensor: ne must be a list of 1 to 4 ints, got {ne!r}")
    ne = tuple(ne)
    expect(isinstance(n_dims, int) and not isinstance(n_dims, bool) and n_dims in (1, 2, 3, 4) and len(ne) >= n_dims,
           f"ggml_new_tensor: n_dims must be 1-4 with that many ne values, got {n_dims!r}, {ne!r}")
    return _new_tensor(ctx, type, ne[:n_dims])


def ggml_dup_tensor(ctx: Context, tensor: Tensor) -> Tensor:
    """A new tensor of the same type and shape as ``tensor`` (its data is not copied).

    Arguments:
        ctx: the context that owns the new tensor (it may differ from tensor's).
        tensor: the tensor whose type and shape are copied.

    Value: a new, unnamed leaf Tensor. A context too full for it raises GgmlValueError.

    Example:
        >>> grad_buf = ggml_dup_tensor(ctx, w)
    """
    return _new_tensor(ctx, as_tensor(tensor, "ggml_dup_tensor(tensor)").type,
                       tuple(n for n in tensor.shape))


def ggml_set_param(tensor: Tensor) -> Tensor:
    """Mark a leaf tensor as trainable: the optimizer computes its gradient and updates it.

    Only tensors created with ``ggml_new_tensor_*`` (not the results of ops) can be parameters, and
    they must be F32 or F16 (ggml-opt's optimizers train F32 only). Initialise the data before training.

    Arguments:
        tensor: a leaf Tensor.

    Value: the same tensor (so calls can be chained). Raises GgmlValueError for an op result,
    GgmlTypeError for another type.

    Example:
        >>> w = ggml_set_param(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 784, 128))
    """
    t = as_tensor(tensor, "ggml_set_param(tensor)").ptr
    expect(t.op == lib.GGML_OP_NONE, f"ggml_set_param: only leaf tensors (created with ggml_new_tensor_*) can be "
                                     f"trainable, got the result of {tensor.op_name}")
    # ggml's backward pass asserts F32/F16 for every tensor a gradient flows to
    expect(t.type in (GGML_TYPE_F32, GGML_TYPE_F16),
           f"ggml_set_param: trainable tensors must be F32 or F16, got {type_name(t.type)}", GgmlTypeError)
    lib.ggml_set_param(t)
    return tensor


def set_trainable(tensor: Tensor, trainable: bool) -> None:
    """Set or clear a leaf's PARAM flag (ggml has no call to clear it; the model layer freezes weights
    this way between fits)."""
    t = as_tensor(tensor, "set_trainable(tensor)").ptr
    if trainable:
        ggml_set_param(tensor)
    else:
        t.flags = t.flags & ~int(lib.GGML_TENSOR_FLAG_PARAM)


def ggml_set_loss(tensor: Tensor) -> Tensor:
    """Mark a scalar F32 tensor as the loss that ``ggml_build_backward_expand`` differentiates.

    Needed for hand-built backward passes; ggml-opt (``ggml_opt_init``, the fit functions) builds and
    marks its own loss from ``outputs`` and the loss type.

    Arguments:
        tensor: an F32 tensor with one element (e.g. from ``ggml_sum`` or ``ggml_cross_entropy_loss``).

    Value: the same tensor. Raises GgmlValueError for any other tensor.

    Example:
        >>> loss = ggml_set_loss(ggml_cross_entropy_loss(ctx, logits, labels))
    """
    t = as_tensor(tensor, "ggml_set_loss(tensor)").ptr
    expect(t.type == GGML_TYPE_F32 and lib.ggml_nelements(t) == 1,
           f"ggml_set_loss: the loss must be a scalar F32 tensor, got {type_name(t.type)} {list(tensor.shape)}")
    lib.ggml_set_loss(t)
    return tensor


def input_leaf(fn: str, t: Tensor, what: str = "tensor") -> Tensor:
    """``t`` if it can be flagged a graph input: ggml (0.25) asserts inputs are leaves made by ggml_new_tensor*."""
    if t.ptr.op != lib.GGML_OP_NONE:
        raise GgmlValueError(f"{fn}: {what} must be a tensor made by ggml_new_tensor* to be a graph input, got the "
                             f"result of {t.op_name} ({t.name or 'unnamed'}); make the tensor you write the data "
                             f"into the input and build the {t.op_name.lower()} from it")
    return t


def ggml_set_input(tensor: Tensor) -> Tensor:
    """Flag a tensor as a graph input, so the allocators never hand its memory to intermediate results.

    Flag tensors you write data into (a batch, labels) before the graph is allocated; the fit
    functions and the model layer do it for you.

    Arguments:
        tensor: a Tensor made by ``ggml_new_tensor*`` (a leaf: not the result of an op, a view or a
            reshape; ggml 0.25 aborts otherwise, so ggmlpy raises GgmlValueError).

    Value: the same tensor.

    Example:
        >>> x = ggml_set_input(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 32))
    """
    t = input_leaf("ggml_set_input", as_tensor(tensor, "ggml_set_input(tensor)"))
    lib.ggml_set_input(t.ptr)
    return tensor


def ggml_set_output(tensor: Tensor) -> Tensor:
    """Flag a tensor as a graph output, so the allocator keeps its memory until the graph has run.

    Without it, a scheduler may reuse an intermediate result's memory for later nodes; flag every
    tensor you want to read after computing.

    Arguments:
        tensor: a Tensor.

    Value: the same tensor.

    Example:
        >>> out = ggml_set_output(ggml_soft_max(ctx, logits))
    """
    lib.ggml_set_output(as_tensor(tensor, "ggml_set_output(tensor)").ptr)
    return tensor


def ggml_set_name(tensor: Tensor, name: str) -> Tensor:
    """Give a tensor a name (used in error messages, by ``ggml_get_tensor`` and as its GGUF name).

    Arguments:
        tensor: a Tensor.
        name: a str of at most ``GGML_MAX_NAME - 1`` (63) bytes in UTF-8 (else GgmlValueError).

    Value: the same tensor.

    Example:
        >>> w = ggml_set_name(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 8), "dense.weight")
    """
    t = as_tensor(tensor, "ggml_set_name(tensor)").ptr
    raw = c_string("ggml_set_name", "name", name)
    expect(len(raw) < int(lib.GGML_MAX_NAME),
           f"ggml_set_name: names are at most {int(lib.GGML_MAX_NAME) - 1} bytes, got {len(raw)}")
    lib.ggml_set_name(t, raw)
    return tensor


def ggml_get_name(tensor: Tensor) -> str:
    """The tensor's name ('' if it has none).

    Arguments:
        tensor: a Tensor.

    Value: a str.

    Example:
        >>> ggml_get_name(w)
        'dense.weight'
    """
    return as_tensor(tensor, "ggml_get_name(tensor)").name


def ggml_tensor_shape(tensor: Tensor) -> tuple[int, int, int, int]:
    """The four sizes ``(ne0, ne1, ne2, ne3)`` of a tensor, ne0 the fastest-varying.

    Unused dimensions are 1. The numpy shape of the same data is the reverse, ``(ne3, ne2, ne1, ne0)``.

    Arguments:
        tensor: a Tensor.

    Value: a tuple of four ints.

    Example:
        >>> ggml_tensor_shape(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 784, 32))
        (784, 32, 1, 1)
    """
    return as_tensor(tensor, "ggml_tensor_shape(tensor)").shape


def ggml_tensor_type(tensor: Tensor) -> int:
    """The element type of a tensor, as a ``GGML_TYPE_*`` int.

    Arguments:
        tensor: a Tensor.

    Value: an int, e.g. ``GGML_TYPE_F32``.

    Example:
        >>> ggml_tensor_type(x) == GGML_TYPE_F32
        True
    """
    return as_tensor(tensor, "ggml_tensor_type(tensor)").type


def ggml_nelements(tensor: Tensor) -> int:
    """The number of elements of a tensor (``ne0 * ne1 * ne2 * ne3``).

    Arguments:
        tensor: a Tensor.

    Value: an int.

    Example:
        >>> ggml_nelements(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 784, 32))
        25088
    """
    return as_tensor(tensor, "ggml_nelements(tensor)").nelements()


def ggml_nbytes(tensor: Tensor) -> int:
    """The size of a tensor's data in bytes (for a view: the span of bytes it covers).

    Arguments:
        tensor: a Tensor.

    Value: an int.

    Example:
        >>> ggml_nbytes(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 10))
        40
    """
    return as_tensor(tensor, "ggml_nbytes(tensor)").nbytes()


def ggml_n_dims(tensor: Tensor) -> int:
    """The number of dimensions of a tensor, not counting trailing sizes of 1 (at least 1).

    Arguments:
        tensor: a Tensor.

    Value: an int from 1 to 4.

    Example:
        >>> ggml_n_dims(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 5, 3, 1))
        2
    """
    return int(lib.ggml_n_dims(as_tensor(tensor, "ggml_n_dims(tensor)").ptr))


def ggml_get_tensor(ctx: Context, name: str) -> Tensor | None:
    """The tensor of ``ctx`` named ``name``, or None if there is none.

    Arguments:
        ctx: a Context.
        name: the name given with ``ggml_set_name`` (or by ggml, e.g. in a GGUF context's ``.ggml_ctx``).

    Value: a Tensor or None.

    Example:
        >>> w = ggml_get_tensor(g.ggml_ctx, "dense.weight")
    """
    ptr = lib.ggml_get_tensor(unwrap(ctx, Context, "ggml_get_tensor(ctx)"), c_string("ggml_get_tensor", "name", name))
    return ctx._tensor(ptr) if ptr != ffi.NULL else None


# ---------------------------------------------------------------- graphs

def ggml_new_graph(ctx: Context) -> Graph:
    """A new computation graph in ``ctx`` with room for ``GGML_DEFAULT_GRAPH_SIZE`` (2048) nodes.

    Add the ops that compute a tensor with ``ggml_build_forward_expand``; use ``ggml_new_graph_custom``
    for larger graphs or for a backward pass.

    Arguments:
        ctx: the context the graph lives in (it needs ``ggml_graph_overhead()`` free bytes).

    Value: a Graph. Raises GgmlValueError when the context is too full.

    Example:
        >>> gf = ggml_build_forward_expand(ggml_new_graph(ctx), out)
    """
    return ggml_new_graph_custom(ctx, GGML_DEFAULT_GRAPH_SIZE, False)


def ggml_new_graph_custom(ctx: Context, size: int = GGML_DEFAULT_GRAPH_SIZE, grads: bool = False) -> Graph:
    """A new computation graph with room for ``size`` nodes, optionally with gradients.

    Arguments:
        ctx: the context the graph lives in (it needs ``ggml_graph_overhead(size, grads)`` free bytes).
        size: the node capacity (default ``GGML_DEFAULT_GRAPH_SIZE``, 2048); nodes and leafs are each
            limited to it.
        grads: True for a graph that ``ggml_build_backward_expand`` may extend (default False).

    Value: a Graph. Raises GgmlValueError for a size below 1 or a context too full.

    Example:
        >>> gf = ggml_new_graph_custom(ctx, 4096, True)
    """
    ctx_ptr = unwrap(ctx, Context, "ggml_new_graph_custom(ctx)")
    check_graph_size("ggml_new_graph_custom", size, "size")
    need = int(lib.ggml_graph_overhead_custom(size, bool(grads)))
    free = ctx.mem_size - ctx.used_mem
    expect(need <= free, f"the ggml context is full: a graph of size {size} needs {need} bytes, {free} are left; "
                         f"create the context with mem_size >= ggml_graph_overhead({size}) + tensors")
    return Graph(lib.ggml_new_graph_custom(ctx_ptr, size, bool(grads)), ctx, size, bool(grads))


def walk_graph(roots: Iterable[Any]) -> Iterator[Any]:
    """Every tensor (cdata pointer) reachable from ``roots`` through its sources, each once."""
    stack, seen = list(roots), set()
    while stack:
        t = stack.pop()
        key = int(ffi.cast("uintptr_t", t))
        if key in seen:
            continue
        seen.add(key)
        yield t
        stack.extend(s for s in t.src if s != ffi.NULL)


def _reachable(root: Any) -> tuple[set, set]:
    """Nodes (ops) and leafs reachable from ``root``, as ggml_build_forward_expand will add them."""
    nodes, leafs = set(), set()
    for t in walk_graph([root]):
        key = int(ffi.cast("uintptr_t", t))
        (nodes if t.op != lib.GGML_OP_NONE or (t.flags & lib.GGML_TENSOR_FLAG_PARAM) else leafs).add(key)
    return nodes, leafs


def ggml_build_forward_expand(graph: Graph | Context, tensor: Tensor) -> Graph:
    """Add ``tensor`` and every op it depends on to ``graph`` (in the order they must run).

    Nodes already in the graph are not added twice, so it can be called once per output. Nothing is
    computed here: compute the graph with a scheduler, ``ggml_backend_graph_compute`` or
    ``ggml_graph_compute``. Two call forms: ggml's ``(graph, tensor)`` expands an existing graph;
    ggmlR's ``(ctx, tensor)`` creates a new graph in the context ``ctx`` (ggml's default size of
    ``GGML_DEFAULT_GRAPH_SIZE`` nodes, larger when the computation needs more) and expands it.

    Arguments:
        graph: a Graph from ``ggml_new_graph``/``ggml_new_graph_custom``, or a Context (ggmlR's form)
            in which a new graph is created.
        tensor: the result to compute.

    Value: the graph: the same one, or the new one for a Context. Raises GgmlValueError when the
    graph's size is too small for the new nodes or leafs (create it with
    ``ggml_new_graph_custom(ctx, size)``), or when the context has no room for a new graph.

    Example:
        >>> gf = ggml_new_graph(ctx)
        >>> ggml_build_forward_expand(gf, out)
        >>> graph = ggml_build_forward_expand(ctx, out)        # ggmlR's form: a new graph
        >>> ggml_graph_compute(ctx, graph)
    """
    if isinstance(graph, Context):
        ctx = graph
        unwrap(ctx, Context, "ggml_build_forward_expand(ctx)")
        t = as_tensor(tensor, "ggml_build_forward_expand(tensor)").ptr
        nodes, leafs = _reachable(t)
        size = max(GGML_DEFAULT_GRAPH_SIZE, len(nodes), len(leafs))
        return ggml_build_forward_expand(ggml_new_graph_custom(ctx, size, False), tensor)
    if not isinstance(graph, Graph):
        raise_type("ggml_build_forward_expand(graph)", "Graph (or a Context, ggmlR's form)", graph)
    t = as_tensor(tensor, "ggml_build_forward_expand(tensor)").ptr
    g = graph.ptr
    nodes, leafs = _reachable(t)
    have = int(lib.ggml_graph_n_nodes(g))
    existing, old_leafs = set(), set()
    param = int(lib.GGML_TENSOR_FLAG_PARAM)
    for i in range(have):
        node = lib.ggml_graph_node(g, i)
        existing.add(int(ffi.cast("uintptr_t", node)))
        for s in node.src:  # the graph's leafs so far: ggml counts them over all calls, not per call
            if s != ffi.NULL and s.op == lib.GGML_OP_NONE and not s.flags & param:
                old_leafs.add(int(ffi.cast("uintptr_t", s)))
    n_nodes = have + len(nodes - existing)
    n_leafs = len(leafs | old_leafs)
    # Leafs are counted separately by ggml; both must stay below the graph's size.
    if n_nodes > graph.size or n_leafs > graph.size:
        raise GgmlValueError(f"ggml_build_forward_expand: the graph is too small: expanding it needs {n_nodes} "
                             f"nodes and {n_leafs} leafs in total, its size is {graph.size}; create it with "
                             "ggml_new_graph_custom(ctx, size) and a larger size")
    graph.add_deps(tensor)
    lib.ggml_build_forward_expand(g, t)
    return graph


def ggml_graph_n_nodes(graph: Graph) -> int:
    """The number of nodes (op results and parameters) in a graph.

    Arguments:
        graph: a Graph.

    Value: an int.

    Example:
        >>> ggml_graph_n_nodes(gf)
    """
    graph = as_graph(graph, "ggml_graph_n_nodes(graph)")
    return graph.n_nodes()


def ggml_graph_node(graph: Graph, i: int) -> Tensor:
    """Node ``i`` of a graph, in execution order; negative ``i`` counts from the end.

    Arguments:
        graph: a Graph.
        i: an index in ``[-n, n)`` where ``n = ggml_graph_n_nodes(graph)`` (else GgmlValueError);
            ``-1`` is the last node (usually the output).

    Value: a Tensor.

    Example:
        >>> out = ggml_graph_node(gf, -1)
    """
    graph = as_graph(graph, "ggml_graph_node(graph)")
    n = graph.n_nodes()
    expect(isinstance(i, int) and -n <= i < n, f"ggml_graph_node: index must be in [-{n}, {n}), got {i!r}")
    return graph.node_tensor(lib.ggml_graph_node(graph.ptr, i))


def ggml_graph_get_tensor(graph: Graph, name: str) -> Tensor | None:
    """The tensor of ``graph`` named ``name`` (a node or a leaf), or None.

    Arguments:
        graph: a Graph.
        name: the name given with ``ggml_set_name``.

    Value: a Tensor or None.

    Example:
        >>> logits = ggml_graph_get_tensor(gf, "logits")
    """
    graph = as_graph(graph, "ggml_graph_get_tensor(graph)")
    ptr = lib.ggml_graph_get_tensor(graph.ptr, c_string("ggml_graph_get_tensor", "name", name))
    return graph.node_tensor(ptr) if ptr != ffi.NULL else None


def ggml_build_backward_expand(ctx: Context, graph: Graph) -> Graph:
    """Add the backward pass of ``graph``: a gradient for every tensor between a parameter and the loss.

    The graph needs a loss (``ggml_set_loss``) and parameters (``ggml_set_param``) and must have been
    created with ``ggml_new_graph_custom(ctx, size, grads=True)``. Ops without a backward pass in ggml
    on the path from a parameter to the loss are refused with an error naming them (ggml would abort).
    Read gradients with ``ggml_graph_get_grad`` after computing; ``ggml_graph_reset`` seeds them.
    ggml-opt (``ggml_opt_init``, the fit functions) does all of this itself.

    Arguments:
        ctx: the context the gradient tensors are created in (typically the graph's).
        graph: a Graph with gradients.

    Value: the same graph. Raises GgmlValueError without a loss or parameter, or for an op that has
    no backward pass.

    Example:
        >>> gf = ggml_new_graph_custom(ctx, 1024, True)
        >>> ggml_build_forward_expand(gf, loss)
        >>> ggml_build_backward_expand(ctx, gf)
    """
    from ._checks import check_backward_graph
    ctx_ptr = unwrap(ctx, Context, "ggml_build_backward_expand(ctx)")
    expect(isinstance(graph, Graph) and graph.grads,
           "ggml_build_backward_expand: the graph must be created with ggml_new_graph_custom(ctx, size, grads=True)")
    check_backward_graph(graph)
    if ctx is not graph.ctx:
        graph._deps.setdefault(id(ctx), ctx)  # the gradients live in ctx
    lib.ggml_build_backward_expand(ctx_ptr, graph.ptr, ffi.NULL)
    return graph


def ggml_graph_get_grad(graph: Graph, tensor: Tensor) -> Tensor | None:
    """The gradient tensor of ``tensor`` in a graph with a backward pass, or None if it has none.

    Arguments:
        graph: a Graph built with ``ggml_build_backward_expand`` (a graph without gradients raises
            GgmlValueError).
        tensor: a tensor of the graph (typically a parameter).

    Value: a Tensor of tensor's shape holding d(loss)/d(tensor) after a compute, or None.

    Example:
        >>> dw = ggml_backend_tensor_get_data(ggml_graph_get_grad(gf, w))
    """
    expect(isinstance(graph, Graph) and graph.grads, "ggml_graph_get_grad: the graph has no gradients")
    ptr = lib.ggml_graph_get_grad(graph.ptr, as_tensor(tensor, "ggml_graph_get_grad(tensor)").ptr)
    return graph.node_tensor(ptr) if ptr != ffi.NULL else None


def ggml_graph_reset(graph: Graph) -> None:
    """Zero the gradients of a graph and set the loss gradient to 1, before a backward compute.

    Arguments:
        graph: a Graph with gradients whose tensors are allocated (else GgmlStateError; allocate with a
            scheduler or a graph allocator first).

    Value: None.

    Example:
        >>> ggml_graph_reset(gf)
        >>> ggml_backend_sched_graph_compute(sched, gf)
    """
    expect(isinstance(graph, Graph) and graph.grads, "ggml_graph_reset: the graph has no gradients")
    for node in graph.nodes():
        grad = lib.ggml_graph_get_grad(graph.ptr, node.ptr)
        if grad != ffi.NULL and grad.data == ffi.NULL:
            raise GgmlStateError("ggml_graph_reset: the graph's gradients are not allocated yet "
                                 "(allocate the graph with a scheduler or gallocr first)")
    lib.ggml_graph_reset(graph.ptr)
