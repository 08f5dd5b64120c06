"""Preconditions checked in Python before ggml is called (ggml's asserts abort the process).

Every check raises a GgmlValueError/GgmlTypeError whose message names the function,
what was expected and what was given.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from ._ffi import ffi, lib
from .context import FLOAT_TYPES, GGML_TYPE_F32, INT64_MAX, Graph, Tensor, type_name  # noqa: F401 - ops use chk.INT64_MAX
from .errors import GgmlTypeError, GgmlValueError

Shape = tuple[int, int, int, int]


def fail(fn: str, message: str, kind: type[Exception] = GgmlValueError) -> None:
    raise kind(f"{fn}: {message}")


def int_arg(fn: str, name: str, value: Any, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        fail(fn, f"{name} must be an int, got {value!r}", GgmlTypeError)
    if minimum is not None and value < minimum:
        fail(fn, f"{name} must be >= {minimum}, got {value}")
    return value


def float_arg(fn: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(fn, f"{name} must be a number, got {value!r}", GgmlTypeError)
    return float(value)


def eps_arg(fn: str, name: str, value: Any) -> float:
    """A finite number >= 0 (ggml's norm kernels assert eps >= 0, which NaN also fails)."""
    v = float_arg(fn, name, value)
    if not math.isfinite(v) or v < 0:
        fail(fn, f"{name} must be a finite number >= 0, got {value!r}; the usual value is 1e-5 (1e-6 for RMS norm)")
    return v


def types(fn: str, t: Tensor, allowed: Iterable[int], what: str = "a") -> None:
    allowed = set(allowed)
    if t.type not in allowed:
        names = "/".join(sorted(type_name(x) for x in allowed))
        fail(fn, f"{what} must be {names}, got {type_name(t.type)}", GgmlTypeError)


def floating(fn: str, *named: tuple[str, Tensor]) -> None:
    for what, t in named:
        types(fn, t, FLOAT_TYPES, what)


def can_repeat(small: Shape, big: Shape) -> bool:
    return all(s > 0 and b % s == 0 for s, b in zip(small, big))


def broadcast_into(fn: str, a: Tensor, b: Tensor) -> Shape:
    """b must repeat into a (ggml broadcasts the second operand only)."""
    if not can_repeat(b.shape, a.shape):
        fail(fn, f"b {list(b.shape)} cannot be broadcast to a {list(a.shape)} (each dimension of a must be a "
                 "multiple of b's; ggml broadcasts the second operand only, so swap them or use ggml_repeat)")
    return a.shape


def same_shape(fn: str, a: Tensor, b: Tensor) -> Shape:
    if a.shape != b.shape:
        fail(fn, f"a and b must have the same shape, got {list(a.shape)} and {list(b.shape)}")
    return a.shape


def contiguous(fn: str, t: Tensor, what: str = "a") -> None:
    if not lib.ggml_is_contiguous(t.ptr):
        fail(fn, f"{what} must be contiguous (apply ggml_cont first), got a strided view")


def rows_contiguous(fn: str, t: Tensor, what: str = "a") -> None:
    p = t.ptr
    if int(p.nb[0]) != int(lib.ggml_type_size(p.type)):
        fail(fn, f"{what} must have contiguous rows (apply ggml_cont first), got a transposed/strided view")


def not_transposed(fn: str, t: Tensor, what: str = "a") -> None:
    if lib.ggml_is_transposed(t.ptr):
        fail(fn, f"{what} must not be transposed (apply ggml_cont to the transpose first)")


def mul_mat(fn: str, a: Tensor, b: Tensor) -> Shape:
    (a0, a1, a2, a3), (b0, b1, b2, b3) = a.shape, b.shape
    if a0 != b0:
        fail(fn, f"a and b must share ne[0] (the reduced dimension), got a {list(a.shape)} and b {list(b.shape)}")
    if b2 % a2 or b3 % a3:
        fail(fn, f"b's ne[2], ne[3] must be multiples of a's, got a {list(a.shape)} and b {list(b.shape)}")
    if lib.ggml_is_transposed(a.ptr):
        fail(fn, "a must not be transposed (apply ggml_cont to the transpose first)")
    return (a1, b1, b2, b3)


def out_prod(fn: str, a: Tensor, b: Tensor) -> Shape:
    (a0, a1, a2, a3), (b0, b1, b2, b3) = a.shape, b.shape
    if a1 != b1:
        fail(fn, f"a and b must share ne[1], got a {list(a.shape)} and b {list(b.shape)}")
    if b2 % a2 or b3 % a3:
        fail(fn, f"b's ne[2], ne[3] must be multiples of a's, got a {list(a.shape)} and b {list(b.shape)}")
    return (a0, b0, b2, b3)


def reshape(fn: str, a: Tensor, ne: tuple[int, ...]) -> Shape:
    for i, n in enumerate(ne):
        int_arg(fn, f"ne{i}", n, 1)
    count = 1
    for n in ne:
        count *= n
    if count != a.nelements():
        fail(fn, f"the new shape {list(ne)} has {count} elements, a {list(a.shape)} has {a.nelements()}")
    contiguous(fn, a)
    return tuple(list(ne) + [1] * (4 - len(ne)))  # type: ignore[return-value]


def view(fn: str, a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...], offset: int) -> Shape:
    for i, n in enumerate(ne):
        int_arg(fn, f"ne{i}", n, 1)
    for i, n in enumerate(nb):
        int_arg(fn, f"nb{i + 1}", n, 1)
    int_arg(fn, "offset", offset, 0)
    esize = int(lib.ggml_type_size(a.type))
    strides = (esize,) + tuple(nb)
    last = offset + sum((n - 1) * s for n, s in zip(ne, strides)) + esize
    if last > a.nbytes():
        fail(fn, f"the view reaches byte {last}, beyond a's {a.nbytes()} bytes")
    return tuple(list(ne) + [1] * (4 - len(ne)))  # type: ignore[return-value]


def permutation(fn: str, axes: tuple[int, ...]) -> None:
    if sorted(axes) != [0, 1, 2, 3] or not all(isinstance(x, int) for x in axes):
        fail(fn, f"the axes must be a permutation of 0, 1, 2, 3, got {list(axes)}")


def out_size(fn: str, what: str, n: int, k: int, s: int, p: int, d: int = 1) -> int:
    size = (n + 2 * p - d * (k - 1) - 1) // s + 1
    if size < 1:
        fail(fn, f"the output {what} would be {size}: input {n}, kernel {k}, stride {s}, padding {p}, dilation {d}")
    return size


# ---------------------------------------------------------------- backward support

_BACKWARD_OPS = {
    "NONE", "DUP", "ADD", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "SCALE",
    "SUM", "SUM_ROWS", "MEAN", "REPEAT", "REPEAT_BACK", "RMS_NORM", "MUL_MAT", "SET", "CPY", "CONT",
    "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX",
    "ROPE", "IM2COL", "POOL_2D", "CROSS_ENTROPY_LOSS", "NORM", "CONCAT",
}
# SIGMOID, TANH, GELU and NORM come from our patch 0004, CONCAT from 0006 (ggml 0.20.2 has no backward for them).
_BACKWARD_UNARY = {"ABS", "SGN", "NEG", "STEP", "RELU", "SILU", "EXP", "EXPM1", "SOFTPLUS", "SIGMOID", "TANH", "GELU"}
_COMPOSITE_HINT = {
    "LEAKY_RELU": "use ggml_relu, or x - slope*relu(-x) built from ggml_relu/ggml_scale/ggml_sub",
    "CLAMP": "clamp the data instead, or use relu-based bounds (min(x, c) = x - relu(x - c))",
    "ELU": "use ggml_silu or ggml_softplus",
}


def ptr_key(p: Any) -> int:
    """A hashable identity for a cffi tensor pointer."""
    return int(ffi.cast("uintptr_t", p))


# op_params (int32[16]) lies between ``op`` and ``flags`` in struct ggml_tensor; the cdef does not declare it
_OP_PARAMS_AT = ffi.offsetof("struct ggml_tensor", "op") + 4
assert ffi.offsetof("struct ggml_tensor", "flags") - _OP_PARAMS_AT == int(lib.GGML_MAX_OP_PARAMS) \
    if hasattr(lib, "GGML_MAX_OP_PARAMS") else True


def op_param_f32(p: Any, i: int) -> float:
    """Float op parameter ``i`` of tensor pointer ``p`` (as ggml_get_op_params_f32)."""
    return float(ffi.cast("float *", ffi.cast("char *", p) + _OP_PARAMS_AT)[i])


def _op_label(p: Any) -> str:
    name = ffi.string(lib.ggml_op_name(p.op)).decode()
    if name == "UNARY":
        return ffi.string(lib.ggml_op_desc(p)).decode()
    return name


def check_backward_graph(graph: Graph) -> None:
    """Refuse graphs whose backward pass ggml cannot build (it would abort), naming the op."""
    g = graph.ptr
    nodes = [lib.ggml_graph_node(g, i) for i in range(lib.ggml_graph_n_nodes(g))]
    flags_loss = int(lib.GGML_TENSOR_FLAG_LOSS)
    if not any(n.flags & flags_loss for n in nodes):
        raise GgmlValueError("the graph has no loss: mark a scalar F32 tensor with ggml_set_loss")
    check_backward_nodes(nodes, [n for n in nodes if n.flags & flags_loss])


def check_backward_nodes(nodes: list, losses: list, accumulating: bool = False) -> None:
    """The check behind every trainable graph. ``nodes`` in topological order, ``losses`` the nodes the
    loss is built from; ``accumulating``: parameters get gradient accumulators (ggml-opt, period > 1).

    Mirrors ggml_build_backward_expand: I32 nodes never need a gradient, and only nodes between
    a parameter and the loss get one (side outputs such as an argmax are fine).
    """
    flags_param = int(lib.GGML_TENSOR_FLAG_PARAM)
    if not any(n.flags & flags_param for n in nodes):
        raise GgmlValueError("the graph has no trainable tensor: mark parameters with ggml_set_param")
    needs_grad: set[int] = set()
    for n in nodes:  # nodes are in topological order
        if n.type == lib.GGML_TYPE_I32:
            continue
        if n.flags & flags_param:
            needs_grad.add(ptr_key(n))
            continue
        for s in _grad_srcs(n, needs_grad):
            if s.type not in (lib.GGML_TYPE_F32, lib.GGML_TYPE_F16):
                raise GgmlTypeError(f"ggml's backward pass needs F32 or F16 tensors on the path to a trainable "
                                    f"parameter; {_op_label(n)} reads a {type_name(s.type)} one (cast it with "
                                    "ggml_cpy into an F32 tensor first)")
            needs_grad.add(ptr_key(n))
            break
    # the nodes that receive a gradient: those needing one that the loss depends on
    gets_grad: set[int] = set()
    stack = [n for n in losses if ptr_key(n) in needs_grad]
    while stack:
        t = stack.pop()
        key = ptr_key(t)
        if key in gets_grad:
            continue
        gets_grad.add(key)
        stack.extend(_grad_srcs(t, needs_grad))
    for i, n in enumerate(nodes):
        if ptr_key(n) not in gets_grad or n.flags & flags_param:
            continue
        check_node_backward(n, needs_grad)
        src = n.src[0]
        if _op_label(n) == "MEAN" and lib.ggml_nelements(n) > 1 and ptr_key(src) in gets_grad:
            # ggml adds MEAN's gradient with ADD1 (scalar only) when the input already has one,
            # i.e. when a later node also passes a gradient to it: that build aborts.
            later = [m for m in nodes[i + 1:] if ptr_key(m) in gets_grad
                     and any(s != ffi.NULL and ptr_key(s) == ptr_key(src) for s in m.src)]
            if later or (accumulating and src.flags & flags_param):
                name = ffi.string(n.name).decode() or "?"
                why = (f"is also used by {_op_label(later[0])}" if later else
                       "is a parameter whose gradient is accumulated")
                raise GgmlValueError(f"ggml cannot build the backward pass of MEAN (tensor '{name}') when its input "
                                     f"{why}; use ggml_scale(ggml_sum_rows(x), 1/n) instead of ggml_mean")


# sources ggml_build_backward_expand never differentiates (shape-only, indices, piecewise-constant ops)
_IGNORED_SRCS = {"IM2COL": (0,), "IM2COL_BACK": (0,), "CPY": (1,), "GET_ROWS": (1,), "GET_ROWS_BACK": (1,),
                 "ROPE": (1,), "SGN": (0,), "STEP": (0,)}


def _grad_srcs(n: Any, needs_grad: set[int]) -> list:
    """The sources of ``n`` that a gradient flows to, as ggml decides it."""
    ignored = _IGNORED_SRCS.get(_op_label(n), ())
    return [s for j, s in enumerate(n.src) if s != ffi.NULL and j not in ignored and ptr_key(s) in needs_grad]


def check_node_backward(n: Any, needs_grad: set[int] | None = None) -> None:
    """Raise if ggml has no backward pass for node ``n``. ``needs_grad`` (keys of the tensors that
    need a gradient) refines the SUB/DIV rule; without it every broadcast SUB/DIV is refused."""
    label = _op_label(n)
    op = ffi.string(lib.ggml_op_name(n.op)).decode()
    supported = label in _BACKWARD_UNARY if op == "UNARY" else op in _BACKWARD_OPS
    if not supported:
        hint = _COMPOSITE_HINT.get(label, "rebuild it from ops that have one")
        name = ffi.string(n.name).decode() or "?"
        raise GgmlValueError(f"ggml has no backward pass for {label} (tensor '{name}') on the path to a "
                             f"trainable parameter; {hint}")
    if op in ("SUB", "DIV"):
        a, b = n.src[0], n.src[1]
        if tuple(a.ne) != tuple(b.ne) and (needs_grad is None or ptr_key(b) in needs_grad):
            raise GgmlValueError(f"{op} with a broadcast second operand has no backward pass in ggml; make the "
                                 "shapes equal with ggml_repeat(ctx, b, a) first")
    if op == "SOFT_MAX":
        max_bias = op_param_f32(n, 1)
        if max_bias != 0.0:
            name = ffi.string(n.name).decode() or "?"
            raise GgmlValueError(f"ggml has no backward pass for ggml_soft_max_ext with max_bias != 0 (ALiBi; tensor "
                                 f"'{name}' has max_bias={max_bias}) on the path to a trainable parameter; use "
                                 "max_bias=0 and add the ALiBi biases to the mask yourself")
    if op == "MUL_MAT" and n.src[0].type != GGML_TYPE_F32 and n.src[0].flags & int(lib.GGML_TENSOR_FLAG_PARAM):
        raise GgmlValueError("trainable mul_mat weights must be F32")
    if op == "MUL_MAT" and (needs_grad is None or ptr_key(n.src[0]) in needs_grad):
        a, b = n.src[0], n.src[1]
        if (a.ne[2], a.ne[3]) != (b.ne[2], b.ne[3]) and b.ne[3] > 1:
            # ggml's backward reduces a broadcast first operand over dimension 2 only (it asserts otherwise)
            raise GgmlValueError(f"ggml has no backward pass for MUL_MAT broadcasting a {list(a.ne)} operand over "
                                 f"the 4th dimension of {list(b.ne)}; reshape b to 3-D (or 2-D) first")


# ---------------------------------------------------------------- row indices of ggml_get_rows

_DATA_MOVES = {"RESHAPE", "VIEW", "CONT", "PERMUTE", "TRANSPOSE"}


def index_bounds(inputs: list[Tensor] | None, outputs: list[Tensor]) -> dict[int, int]:
    """Inputs that ggml_get_rows reads as row indices (directly or through a reshape/view) and the number of
    rows they index: an index outside [0, rows) aborts the process inside ggml, so batches are checked.
    ``inputs=None``: every leaf tensor (not computed by an op) counts as an input. Keys are ``ptr_key``s."""
    return {key: bound for key, (_, bound) in _index_inputs(inputs, outputs).items()}


def index_inputs(outputs: list[Tensor]) -> list[tuple[Any, int]]:
    """(leaf tensor pointer, row bound) for every leaf that ggml_get_rows reads as indices."""
    return list(_index_inputs(None, outputs).values())


def _index_inputs(inputs: list[Tensor] | None, outputs: list[Tensor]) -> dict[int, tuple[Any, int]]:
    wanted = None if inputs is None else {ptr_key(t.ptr) for t in inputs}
    found: dict[int, tuple[Any, int]] = {}
    seen: set[int] = set()
    stack = [getattr(o, "ptr", o) for o in outputs]  # Tensors or raw pointers
    while stack:
        t = stack.pop()
        if ptr_key(t) in seen:
            continue
        seen.add(ptr_key(t))
        stack.extend(src for src in t.src if src != ffi.NULL)
        if ffi.string(lib.ggml_op_name(t.op)).decode() != "GET_ROWS":
            continue
        idx = t.src[1]
        while not _is_input(idx, wanted) and ffi.string(lib.ggml_op_name(idx.op)).decode() in _DATA_MOVES:
            idx = idx.src[0]
        if _is_input(idx, wanted):
            bound = min(found.get(ptr_key(idx), (None, 1 << 62))[1], int(t.src[0].ne[1]))
            found[ptr_key(idx)] = (idx, bound)
    return found


def check_index_inputs(leaves: list[tuple[Any, int]]) -> None:
    """Check the current contents of index leaves (before a compute ggml would abort)."""
    for t, bound in leaves:
        if t.data == ffi.NULL or not lib.ggml_is_contiguous(t) or t.type != lib.GGML_TYPE_I32:
            continue
        values = np.empty(int(lib.ggml_nelements(t)), dtype=np.int32)
        if t.buffer != ffi.NULL:
            lib.ggml_backend_tensor_get(t, ffi.from_buffer(values), 0, values.nbytes)
        else:
            ffi.memmove(ffi.from_buffer(values), t.data, values.nbytes)
        check_indices(values, bound, f"tensor '{ffi.string(t.name).decode() or '?'}'")


def _is_input(t: Any, wanted: set[int] | None) -> bool:
    return t.op == lib.GGML_OP_NONE if wanted is None else ptr_key(t) in wanted


def check_indices(values: np.ndarray, bound: int, where: str) -> None:
    if values.size and (values.min() < 0 or values.max() >= bound):
        bad = values[(values < 0) | (values >= bound)].reshape(-1)
        raise GgmlValueError(f"{where} holds row indices for ggml_get_rows, which must be in [0, {bound}); "
                             f"got {bad[0]}, out of range ({bad.size} bad indices; ggml would abort)")
