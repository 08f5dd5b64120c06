"""Library and tensor facts: ggml's version, timers, type sizes, layout predicates, context introspection.

Thin, checked wrappers of ggml.h's query functions under their ggmlR names. Everything ggml would index out
of bounds with (a type or op number out of range) or assert on (the unary op of a non-unary tensor, the
next tensor of a tensor from another context, a dot file that cannot be opened) is refused here first.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from ._checks import is_int
from ._ffi import ffi, ggml_logger, lib
from ._handle import unwrap
from .context import Context, Graph, Tensor, as_graph, as_tensor
from .errors import GgmlTypeError, GgmlValueError

_OP_COUNT = int(lib.GGML_OP_COUNT)
_UNARY_OP_COUNT = int(lib.GGML_UNARY_OP_COUNT)
_TYPE_COUNT = int(lib.GGML_TYPE_COUNT)
_OP_UNARY = next(i for i in range(_OP_COUNT) if ffi.string(lib.ggml_op_name(i)) == b"UNARY")


# ---------------------------------------------------------------- library

def ggml_version() -> str:
    """The version of the ggml library ggmlpy runs on, e.g. ``"0.20.2"``.

    Value: a str (ggml's own ``ggml_version()``; ggmlR reports a fixed version string instead).

    Example:
        >>> ggml_version()
        '0.20.2'
    """
    return ffi.string(lib.ggml_version()).decode()


def ggml_time_init() -> None:
    """Initialise ggml's timer (ggmlR calls it before ``ggml_time_ms``/``ggml_time_us``; harmless to repeat).

    Value: None.

    Example:
        >>> ggml_time_init(); t0 = ggml_time_ms()
    """
    lib.ggml_time_init()


def ggml_time_ms() -> int:
    """ggml's monotonic clock in milliseconds (differences measure elapsed time).

    Value: an int (milliseconds).

    Example:
        >>> t0 = ggml_time_ms(); ...; elapsed = ggml_time_ms() - t0
    """
    return int(lib.ggml_time_ms())


def ggml_time_us() -> int:
    """ggml's monotonic clock in microseconds (the clock of ggml's progress bars).

    Value: an int (microseconds).

    Example:
        >>> t0 = ggml_time_us(); ...; elapsed_us = ggml_time_us() - t0
    """
    return int(lib.ggml_time_us())


def ggml_cycles() -> int:
    """ggml's cycle counter (C's ``clock()``: processor time in clock ticks), for low-level benchmarks.

    Value: an int.

    Example:
        >>> c0 = ggml_cycles()
    """
    return int(lib.ggml_cycles())


def ggml_cycles_per_ms() -> int:
    """How many ``ggml_cycles()`` ticks make a millisecond.

    Value: an int.

    Example:
        >>> (ggml_cycles() - c0) / ggml_cycles_per_ms()     # milliseconds of processor time
    """
    return int(lib.ggml_cycles_per_ms())


# ---------------------------------------------------------------- types

def _type(fn: str, type: Any) -> int:
    """``type`` as a ggml type that exists (ggml indexes a table with it; removed types have no block size)."""
    if not is_int(type):
        raise GgmlTypeError(f"{fn}: type must be a GGML_TYPE_* int, got {type!r}")
    t = int(type)
    if not 0 <= t < _TYPE_COUNT or int(lib.ggml_blck_size(t)) == 0:
        raise GgmlValueError(f"{fn}: {t} is not a ggml type (GGML_TYPE_* values are in [0, {_TYPE_COUNT}), a few of "
                             "them removed)")
    return t


def ggml_type_name(type: int) -> str:
    """The short name of a ggml type: ``"f32"``, ``"f16"``, ``"q4_0"``, ``"i32"``, ...

    Arguments:
        type: a ``GGML_TYPE_*`` int (else GgmlValueError / GgmlTypeError).

    Value: a str.

    Example:
        >>> ggml_type_name(GGML_TYPE_Q4_0)
        'q4_0'
    """
    return ffi.string(lib.ggml_type_name(_type("ggml_type_name", type))).decode()


def ggml_type_size(type: int) -> int:
    """Bytes of one block of a type (one element for plain types; 18 bytes per 32 values for Q4_0).

    Arguments:
        type: a ``GGML_TYPE_*`` int.

    Value: an int (bytes).

    Example:
        >>> ggml_type_size(GGML_TYPE_F32)
        4
    """
    return int(lib.ggml_type_size(_type("ggml_type_size", type)))


def ggml_estimate_memory(type: int = lib.GGML_TYPE_F32, ne0: int | None = None, ne1: int = 1, ne2: int = 1,
                         ne3: int = 1) -> int:
    """The bytes to reserve for a tensor in a context with its own memory (``ggml_init(..., no_alloc=False)``):
    its header (``ggml_tensor_overhead()``), its data, and room for ggml's 16-byte alignment. The sum over
    a context's tensors is a ``mem_size`` that holds them.

    Unlike ggmlR, which counts 4 bytes per element whatever the type, this uses the type's real size
    (2 for F16, 18 bytes per 32 values for Q4_0, ...).

    Arguments:
        type: a ``GGML_TYPE_*`` int (default F32).
        ne0: elements along ne[0] (required; a multiple of the type's block size for quantized types).
        ne1, ne2, ne3: the other sizes (default 1).

    Value: an int (bytes).

    Example:
        >>> ggml_estimate_memory(GGML_TYPE_F32, 1000, 1000)   # 4,000,000 bytes of data + the header
    """
    fn = "ggml_estimate_memory"
    t = _type(fn, type)
    if ne0 is None:
        raise GgmlTypeError(f"{fn}: ne0 is required (the tensor's size along ne[0]), e.g. "
                            f"ggml_estimate_memory(GGML_TYPE_F32, 1000, 1000)")
    sizes = []
    for name, v in (("ne0", ne0), ("ne1", ne1), ("ne2", ne2), ("ne3", ne3)):
        if not is_int(v) or int(v) < 1:
            raise GgmlValueError(f"{fn}: {name} must be an int >= 1, got {v!r}")
        sizes.append(int(v))
    blck = int(lib.ggml_blck_size(t))
    if sizes[0] % blck:
        raise GgmlValueError(f"{fn}: ne0 must be a multiple of {blck} for {ggml_type_name(t)}, got {sizes[0]}")
    data = sizes[0] // blck * int(lib.ggml_type_size(t)) * sizes[1] * sizes[2] * sizes[3]
    return int(lib.ggml_tensor_overhead()) + data + 16


def ggml_blck_size(type: int) -> int:
    """The number of values in one block of a type (1 for plain types, 32 for Q4_0/Q8_0, 256 for K-quants).

    Arguments:
        type: a ``GGML_TYPE_*`` int.

    Value: an int.

    Example:
        >>> ggml_blck_size(GGML_TYPE_Q4_0)
        32
    """
    return int(lib.ggml_blck_size(_type("ggml_blck_size", type)))


def ggml_type_sizef(type: int) -> float:
    """Average bytes per value of a type: ``ggml_type_size / ggml_blck_size`` (fractional when quantized).

    Arguments:
        type: a ``GGML_TYPE_*`` int.

    Value: a float (4.0 for F32, 0.5625 for Q4_0).

    Example:
        >>> ggml_type_sizef(GGML_TYPE_F16)
        2.0
    """
    t = _type("ggml_type_sizef", type)
    return float(lib.ggml_type_size(t)) / float(lib.ggml_blck_size(t))


def ggml_is_quantized(type: int) -> bool:
    """Whether a type is a quantized (block) format such as Q4_0 or Q8_0.

    Arguments:
        type: a ``GGML_TYPE_*`` int.

    Value: a bool.

    Example:
        >>> ggml_is_quantized(GGML_TYPE_Q8_0), ggml_is_quantized(GGML_TYPE_F32)
        (True, False)
    """
    return bool(lib.ggml_is_quantized(_type("ggml_is_quantized", type)))


# ---------------------------------------------------------------- tensors

def ggml_element_size(tensor: Tensor) -> int:
    """Bytes of one element (block) of a tensor's type.

    Arguments:
        tensor: a Tensor.

    Value: an int.

    Example:
        >>> ggml_element_size(ggml_new_tensor_1d(ctx, GGML_TYPE_F16, 8))
        2
    """
    return int(lib.ggml_element_size(as_tensor(tensor, "ggml_element_size(tensor)").ptr))


def ggml_nrows(tensor: Tensor) -> int:
    """The number of rows of a tensor: ``ne1 * ne2 * ne3``.

    Arguments:
        tensor: a Tensor.

    Value: an int.

    Example:
        >>> ggml_nrows(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4, 3, 2))
        6
    """
    return int(lib.ggml_nrows(as_tensor(tensor, "ggml_nrows(tensor)").ptr))


def ggml_tensor_nb(tensor: Tensor) -> tuple[int, int, int, int]:
    """The byte strides ``(nb0, nb1, nb2, nb3)`` of a tensor (a view's differ from its shape's).

    Arguments:
        tensor: a Tensor.

    Value: a tuple of four ints.

    Example:
        >>> ggml_tensor_nb(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2))
        (4, 12, 24, 24)
    """
    t = as_tensor(tensor, "ggml_tensor_nb(tensor)").ptr
    return (int(t.nb[0]), int(t.nb[1]), int(t.nb[2]), int(t.nb[3]))


def _pair(fn: str, a: Any, b: Any) -> tuple[Any, Any]:
    return as_tensor(a, f"{fn}(a)").ptr, as_tensor(b, f"{fn}(b)").ptr


def ggml_are_same_shape(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors have the same ``ne`` (type and strides aside).

    Arguments:
        a, b: Tensors.

    Value: a bool.

    Example:
        >>> ggml_are_same_shape(x, y)
    """
    return bool(lib.ggml_are_same_shape(*_pair("ggml_are_same_shape", a, b)))


def ggml_are_same_layout(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors have the same type, shape ``ne`` and byte strides ``nb``: the same memory layout,
    so that the bytes of one can be copied into the other as they are.

    Arguments:
        a, b: Tensors.

    Value: a bool.

    Example:
        >>> ggml_are_same_layout(x, ggml_dup_tensor(ctx, x))
        True
    """
    pa, pb = _pair("ggml_are_same_layout", a, b)
    return pa.type == pb.type and bool(lib.ggml_are_same_shape(pa, pb)) and bool(lib.ggml_are_same_stride(pa, pb))


def ggml_are_same_stride(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors have the same byte strides ``nb``.

    Arguments:
        a, b: Tensors.

    Value: a bool.

    Example:
        >>> ggml_are_same_stride(x, ggml_transpose(ctx, x))
        False
    """
    return bool(lib.ggml_are_same_stride(*_pair("ggml_are_same_stride", a, b)))


def ggml_can_repeat(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` can be broadcast (repeated) to the shape of ``b``: each ``b.ne[k]`` a multiple of ``a.ne[k]``.

    Arguments:
        a: the smaller Tensor. b: the target Tensor.

    Value: a bool.

    Example:
        >>> ggml_can_repeat(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4), ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 8))
        True
    """
    return bool(lib.ggml_can_repeat(*_pair("ggml_can_repeat", a, b)))


def _predicate(name: str, summary: str, example: str) -> Any:
    c_fn = getattr(lib, name)

    def predicate(tensor: Tensor) -> bool:
        return bool(c_fn(as_tensor(tensor, f"{name}(tensor)").ptr))

    predicate.__name__ = predicate.__qualname__ = name
    predicate.__doc__ = f"""{summary}

    Arguments:
        tensor: a Tensor.

    Value: a bool.

    Example:
        >>> {example}
    """
    return predicate


ggml_is_contiguous = _predicate(
    "ggml_is_contiguous", "Whether a tensor's elements are stored densely in ggml order (no gaps, not permuted).",
    "ggml_is_contiguous(ggml_transpose(ctx, x))")
ggml_is_contiguous_0 = _predicate(
    "ggml_is_contiguous_0", "Whether a tensor is contiguous (the same as ``ggml_is_contiguous``).",
    "ggml_is_contiguous_0(x)")
ggml_is_contiguous_1 = _predicate(
    "ggml_is_contiguous_1", "Whether a tensor is contiguous in dimensions >= 1 (rows may have gaps between them).",
    "ggml_is_contiguous_1(ggml_view_2d(ctx, x, 2, 3, 16, 0))")
ggml_is_contiguous_2 = _predicate(
    "ggml_is_contiguous_2", "Whether a tensor is contiguous in dimensions >= 2 (matrices may have gaps between them).",
    "ggml_is_contiguous_2(x)")
ggml_is_contiguous_channels = _predicate(
    "ggml_is_contiguous_channels", "Whether a tensor's channels (dimension 2) are innermost in memory (a "
    "channels-last layout from a permutation).", "ggml_is_contiguous_channels(x)")
ggml_is_contiguous_rows = _predicate(
    "ggml_is_contiguous_rows", "Whether each row of a tensor (its ne0 elements) is stored densely.",
    "ggml_is_contiguous_rows(x)")
ggml_is_contiguously_allocated = _predicate(
    "ggml_is_contiguously_allocated", "Whether a tensor's bytes form one gap-free block (possibly permuted).",
    "ggml_is_contiguously_allocated(ggml_permute(ctx, x, 1, 0, 2, 3))")
ggml_is_permuted = _predicate(
    "ggml_is_permuted", "Whether a tensor's dimensions are permuted (its strides are not increasing).",
    "ggml_is_permuted(ggml_permute(ctx, x, 1, 0, 2, 3))")
ggml_is_transposed = _predicate(
    "ggml_is_transposed", "Whether a tensor is transposed (its ne0 stride is larger than its ne1 stride).",
    "ggml_is_transposed(ggml_transpose(ctx, x))")


# ---------------------------------------------------------------- ops

def _op(fn: str, op: Any, count: int, what: str) -> int:
    if not is_int(op):
        raise GgmlTypeError(f"{fn}: op must be an int ({what}), got {op!r}")
    if not 0 <= int(op) < count:
        raise GgmlValueError(f"{fn}: op must be in [0, {count}) ({what}), got {op}")
    return int(op)


def ggml_op_name(op: int) -> str:
    """The name of a ggml operation number, e.g. ``"ADD"``, ``"MUL_MAT"``.

    Arguments:
        op: an operation number in ``[0, GGML_OP_COUNT)`` (a tensor's ``op``).

    Value: a str.

    Example:
        >>> ggml_op_name(0)
        'NONE'
    """
    return ffi.string(lib.ggml_op_name(_op("ggml_op_name", op, _OP_COUNT, "a ggml_op"))).decode()


def ggml_op_symbol(op: int) -> str:
    """The symbol of a ggml operation number, e.g. ``"x+y"`` for ADD, ``"X*Y"`` for MUL_MAT.

    Arguments:
        op: an operation number in ``[0, GGML_OP_COUNT)``.

    Value: a str.

    Example:
        >>> ggml_op_symbol(0)
        'none'
    """
    return ffi.string(lib.ggml_op_symbol(_op("ggml_op_symbol", op, _OP_COUNT, "a ggml_op"))).decode()


def ggml_unary_op_name(op: int) -> str:
    """The name of a unary operation number, e.g. ``"RELU"``, ``"GELU"``.

    Arguments:
        op: a unary operation number in ``[0, GGML_UNARY_OP_COUNT)`` (``ggml_get_unary_op``).

    Value: a str.

    Example:
        >>> ggml_unary_op_name(ggml_get_unary_op(ggml_relu(ctx, x)))
        'RELU'
    """
    return ffi.string(lib.ggml_unary_op_name(_op("ggml_unary_op_name", op, _UNARY_OP_COUNT,
                                                  "a ggml_unary_op"))).decode()


def ggml_op_desc(tensor: Tensor) -> str:
    """What computes a tensor: its op name, or the unary / GLU op's name for those (``"RELU"``, not ``"UNARY"``).

    Arguments:
        tensor: a Tensor.

    Value: a str (``"NONE"`` for a leaf).

    Example:
        >>> ggml_op_desc(ggml_relu(ctx, x))
        'RELU'
    """
    return ffi.string(lib.ggml_op_desc(as_tensor(tensor, "ggml_op_desc(tensor)").ptr)).decode()


def ggml_get_unary_op(tensor: Tensor) -> int:
    """The unary operation number of a tensor made by a unary op (``ggml_relu``, ``ggml_gelu``, ...).

    Arguments:
        tensor: the result of a unary op (else GgmlValueError: ggml asserts it).

    Value: an int (name it with ``ggml_unary_op_name``).

    Example:
        >>> ggml_get_unary_op(ggml_relu(ctx, x))
    """
    t = as_tensor(tensor, "ggml_get_unary_op(tensor)").ptr
    if int(t.op) != _OP_UNARY:
        raise GgmlValueError(f"ggml_get_unary_op: the tensor is made by {ggml_op_desc(tensor)}, not by a unary op "
                             "(ggml_relu, ggml_gelu, ...); check ggml_op_desc first")
    return int(lib.ggml_get_unary_op(t))


# ---------------------------------------------------------------- contexts

def _ctx(ctx: Any, fn: str) -> Any:
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
    return ctx._tensor(ptr) if ptr != ffi.NULL else None


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
    if tensor.owner is not ctx and not any(x == t for x in ctx._iter_tensor_ptrs()):
        raise GgmlValueError(f"{fn}: the tensor does not belong to this context (it was created in another one); "
                             "pass the context it was created in")
    ptr = lib.ggml_get_next_tensor(p, t)
    return ctx._tensor(ptr) if ptr != ffi.NULL else None


def ggml_tensor_num(ctx: Context) -> int:
    """The number of tensors in a context (created since it was made or last reset).

    Arguments:
        ctx: a Context.

    Value: an int.

    Example:
        >>> ggml_tensor_num(ctx)
    """
    _ctx(ctx, "ggml_tensor_num")
    return sum(1 for _ in ctx._iter_tensor_ptrs())


# ---------------------------------------------------------------- graphs

_LOG_LOCK = threading.Lock()


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def ggml_graph_print(graph: Graph) -> None:
    """Print a graph's nodes (shape, op, whether a parameter or with a gradient) and leafs to stdout.

    Arguments:
        graph: a Graph.

    Value: None (ggml's report is printed).

    Example:
        >>> ggml_graph_print(ggml_build_forward_expand(ctx, out))
    """
    g = as_graph(graph, "ggml_graph_print(graph)").ptr
    handler = _Collect()
    with _LOG_LOCK:  # ggml logs the report at INFO level: collect it here instead of the log's handlers
        level, propagate = ggml_logger.level, ggml_logger.propagate
        ggml_logger.addHandler(handler)
        ggml_logger.setLevel(logging.DEBUG)
        ggml_logger.propagate = False
        try:
            lib.ggml_graph_print(g)
        finally:
            ggml_logger.removeHandler(handler)
            ggml_logger.setLevel(level)
            ggml_logger.propagate = propagate
    sys.stdout.write("".join(line + "\n" for line in handler.lines))
    sys.stdout.flush()


def ggml_graph_dump_dot(graph: Graph, leafs: Graph | None = None, filename: Any = None) -> None:
    """Write a graph in Graphviz's dot format (render it with ``dot -Tpng file.dot -o file.png``).

    Arguments:
        graph: the Graph to draw.
        leafs: None (the default), or a forward Graph whose nodes are drawn as that graph's (ggml's
            ``gf`` argument, for a backward graph ``graph``).
        filename: the file to write, a str or os.PathLike (required; it must be creatable: a missing
            folder raises GgmlValueError instead of ggml's abort).

    Value: None.

    Example:
        >>> ggml_graph_dump_dot(graph, None, "graph.dot")
    """
    fn = "ggml_graph_dump_dot"
    g = as_graph(graph, f"{fn}(graph)").ptr
    gf = ffi.NULL if leafs is None else as_graph(leafs, f"{fn}(leafs)").ptr
    if filename is None:
        raise GgmlTypeError(f"{fn}: filename is required (the .dot file to write)")
    try:
        path = os.fspath(filename)
    except TypeError:
        raise GgmlTypeError(f"{fn}: filename must be a str or os.PathLike, got {filename!r}") from None
    raw = os.fsencode(path)
    if not raw or b"\0" in raw:
        raise GgmlValueError(f"{fn}: filename must be a non-empty path without NUL characters, got {filename!r}")
    from .gguf import _check_writable_path
    _check_writable_path(os.fsdecode(raw), fn)  # a FIFO would block ggml's fopen
    try:
        with open(raw, "w"):
            pass
    except OSError as exc:  # ggml asserts that its fopen succeeds
        raise GgmlValueError(f"{fn}: cannot write {path!r}: {exc.strerror or exc}") from None
    handler = _Collect()
    with _LOG_LOCK:  # ggml logs a 'dot -Tpng ...' hint at INFO level: keep it out of the user's log
        propagate = ggml_logger.propagate
        ggml_logger.addHandler(handler)
        ggml_logger.propagate = False
        try:
            lib.ggml_graph_dump_dot(g, gf, raw)
        finally:
            ggml_logger.removeHandler(handler)
            ggml_logger.propagate = propagate
