"""ggml contexts (``Context``): creating, resetting and freeing them, their memory, and walking the tensors
they hold. A context owns its tensors; its ``Generation`` tells tensors from before a reset apart.
"""
from __future__ import annotations

import numbers
from collections.abc import Collection, Sequence

from .._ffi import CData, ffi, lib
from ..core.args import is_int, is_real
from ..core.handle import bump_memory_epoch, free_handle, HANDLE_LOCK, unwrap
from ..core.sysmem import check_fits_memory
from ..core.types import GGML_TYPE_F32
from ..errors import expect, GgmlInUseError, GgmlTypeError, GgmlValueError
from .objects import as_tensor, Context, Tensor


GGML_DEFAULT_GRAPH_SIZE = int(lib.GGML_DEFAULT_GRAPH_SIZE)


# ggml stores a graph's size in an int and hashes 2*size entries: larger graphs overflow its arithmetic.
MAX_GRAPH_SIZE = 1 << 30


def check_graph_size(fn: str, size: object, what: str = "graph size") -> int:
    if not is_int(size) or size < 1:
        raise GgmlValueError(f"{fn}: {what} must be an int >= 1, got {size!r}")
    if size > MAX_GRAPH_SIZE:
        raise GgmlValueError(f"{fn}: {what} must be at most {MAX_GRAPH_SIZE} (2**30) nodes, got {size}; "
                             "split the computation into smaller graphs")
    return int(size)


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
    expect(is_int(mem_size) and mem_size > 0,
           f"ggml_init: mem_size must be a positive int (bytes), got {mem_size!r}")
    expect(isinstance(no_alloc, bool), f"ggml_init: no_alloc must be a bool, got {no_alloc!r}", GgmlTypeError)
    check_fits_memory("ggml_init", f"a context of mem_size={mem_size}", mem_size,
                      "size it from ggml_tensor_overhead() and ggml_graph_overhead() (and the data, unless no_alloc)")
    return Context(mem_size, no_alloc)


def ggml_init_auto(*shapes: int | Sequence[int], extra_mb: float = 10, type: int = GGML_TYPE_F32,
                   no_alloc: bool = False, **named_shapes: int | Sequence[int]) -> Context:
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
    if not is_real(extra_mb) or not extra_mb >= 0 \
            or extra_mb == float("inf"):
        raise GgmlValueError(f"{fn}: extra_mb must be a finite number >= 0, got {extra_mb!r}")
    if not is_int(type) or not 0 <= type < int(lib.GGML_TYPE_COUNT) \
            or int(lib.ggml_blck_size(type)) == 0:
        raise GgmlTypeError(f"{fn}: type must be a GGML_TYPE_* int, got {type!r}")
    expect(isinstance(no_alloc, bool), f"{fn}: no_alloc must be a bool, got {no_alloc!r}", GgmlTypeError)
    total = 0
    for label, shape in [*((f"shapes[{i}]", s) for i, s in enumerate(shapes)), *named_shapes.items()]:
        dims: object = [shape] if isinstance(shape, numbers.Integral) else shape
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Collection) or not 1 <= len(dims) <= 4 or \
                any(not is_int(n) or n < 1 for n in dims):
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
    with HANDLE_LOCK:
        busy = ctx.busy_in_tree()
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


def _ctx(ctx: object, fn: str) -> CData:
    return unwrap(ctx, Context, f"{fn}(ctx)")


def ggml_get_mem_size(ctx: Context) -> int:
    """The size in bytes of a context's memory pool (its ``mem_size``).

    Arguments:
        ctx: a Context.

    Value: an int.

    Example:
        >>> ggml_get_mem_size(ggml_init(1 << 20))
        1048576
    """
    return int(lib.ggml_get_mem_size(_ctx(ctx, "ggml_get_mem_size")))


def ggml_get_no_alloc(ctx: Context) -> bool:
    """Whether new tensors of a context get no memory (headers only).

    Arguments:
        ctx: a Context.

    Value: a bool.

    Example:
        >>> ggml_get_no_alloc(ctx)
    """
    return bool(lib.ggml_get_no_alloc(_ctx(ctx, "ggml_get_no_alloc")))


def ggml_set_no_alloc(ctx: Context, no_alloc: bool) -> None:
    """Switch whether tensors created from now on in a context get memory in it.

    Tensors created before keep what they have.

    Arguments:
        ctx: a Context.
        no_alloc: True: headers only (data goes to a backend buffer later); False: data in the context.

    Value: None.

    Example:
        >>> ggml_set_no_alloc(ctx, True)
    """
    p = _ctx(ctx, "ggml_set_no_alloc")
    if not isinstance(no_alloc, bool):
        raise GgmlTypeError(f"ggml_set_no_alloc: no_alloc must be a bool, got {no_alloc!r}")
    lib.ggml_set_no_alloc(p, no_alloc)
    ctx.no_alloc = no_alloc  # the Python side's size checks follow


def ggml_get_max_tensor_size(ctx: Context) -> int:
    """The size in bytes of the largest tensor of a context (0 when it has none).

    Arguments:
        ctx: a Context.

    Value: an int.

    Example:
        >>> ggml_get_max_tensor_size(ctx)
    """
    return int(lib.ggml_get_max_tensor_size(_ctx(ctx, "ggml_get_max_tensor_size")))


def ggml_get_first_tensor(ctx: Context) -> Tensor | None:
    """The first tensor created in a context (since its last ``ggml_reset``), or None when it has none.

    Walk all of them with ``ggml_get_next_tensor``.

    Arguments:
        ctx: a Context.

    Value: a Tensor or None.

    Example:
        >>> t = ggml_get_first_tensor(ctx)
        >>> while t is not None:
        ...     print(ggml_get_name(t)); t = ggml_get_next_tensor(ctx, t)
    """
    ptr = lib.ggml_get_first_tensor(_ctx(ctx, "ggml_get_first_tensor"))
    return ctx.wrap_tensor(ptr) if ptr != ffi.NULL else None


def ggml_get_next_tensor(ctx: Context, tensor: Tensor) -> Tensor | None:
    """The tensor created in a context after ``tensor``, or None after the last one.

    Arguments:
        ctx: a Context.
        tensor: a Tensor of that context (else GgmlValueError: ggml would walk memory that is not
            the context's).

    Value: a Tensor or None.

    Example:
        >>> second = ggml_get_next_tensor(ctx, ggml_get_first_tensor(ctx))
    """
    fn = "ggml_get_next_tensor"
    p = _ctx(ctx, fn)
    t = as_tensor(tensor, f"{fn}(tensor)").ptr
    if tensor.owner is not ctx and not any(x == t for x in ctx.tensor_ptrs()):
        raise GgmlValueError(f"{fn}: the tensor does not belong to this context (it was created in another one); "
                             "pass the context it was created in")
    ptr = lib.ggml_get_next_tensor(p, t)
    return ctx.wrap_tensor(ptr) if ptr != ffi.NULL else None


def ggml_tensor_num(ctx: Context) -> int:
    """The number of tensors in a context (created since it was made or last reset).

    Arguments:
        ctx: a Context.

    Value: an int.

    Example:
        >>> ggml_tensor_num(ctx)
    """
    _ctx(ctx, "ggml_tensor_num")
    return sum(1 for _ in ctx.tensor_ptrs())
