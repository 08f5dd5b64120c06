"""Preconditions checked in Python before ggml is called (ggml's asserts abort the process).

Every check raises a GgmlValueError/GgmlTypeError whose message names the function,
what was expected and what was given.
"""
from __future__ import annotations

import math
import numbers
import re
from typing import Any, Iterable

import numpy as np

from ._ffi import ffi, lib
from .context import FLOAT_TYPES, GGML_TYPE_F32, INT64_MAX, Graph, Tensor, type_name  # noqa: F401 - ops use chk.INT64_MAX
from .errors import GgmlStateError, GgmlTypeError, GgmlValueError

Shape = tuple[int, int, int, int]


def fail(fn: str, message: str, kind: type[Exception] = GgmlValueError) -> None:
    raise kind(f"{fn}: {message}")


INT32_MAX = (1 << 31) - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32: below it, values lose precision or 0


def is_int(value: Any) -> bool:
    """An integer argument: a Python or numpy int, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """A real-number argument: a Python or numpy int or float, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def learning_rate_arg(what: str, value: Any) -> float:
    """A learning rate as ggml keeps it, a float32: a finite number in [FLOAT32_TINY, FLOAT32_MAX] (1e-300
    would become 0 and change nothing, 1e300 inf and make every weight NaN)."""
    if not is_real(value) or not FLOAT32_TINY <= value <= FLOAT32_MAX:
        raise GgmlValueError(f"{what} must be a finite number > 0 that float32 holds (ggml keeps it as one: "
                             f"{FLOAT32_TINY:.3g} to {FLOAT32_MAX:.4g}), got {value!r}")
    return float(value)


def int_arg(fn: str, name: str, value: Any, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
    """``value`` as an int in [minimum, maximum] (numpy ints accepted). ``maximum`` defaults to the largest
    int64 (what C receives for sizes); C ``int`` arguments pass INT32_MAX (``c_int_arg``), else cffi raises
    OverflowError."""
    if not is_int(value):
        fail(fn, f"{name} must be an int, got {value!r}", GgmlTypeError)
    v = int(value)
    if minimum is not None and v < minimum:
        fail(fn, f"{name} must be >= {minimum}, got {v}")
    if v > maximum:
        fail(fn, f"{name} must be <= {maximum}, got {v}")
    if v < -maximum - 1:
        fail(fn, f"{name} must be >= {-maximum - 1}, got {v}")
    return v


MAX_THREADS = int(getattr(lib, "GGML_MAX_N_THREADS", 512))


def n_threads_arg(fn: str, value: Any, name: str = "n_threads") -> int:
    """A thread count for ggml's CPU backend: an int in [1, GGML_MAX_N_THREADS] (a larger one would overflow
    C or make ggml start that many threads)."""
    return int_arg(fn, name, value, 1, MAX_THREADS)


def list_arg(fn: str, name: str, value: Any, what: str = "values") -> list:
    """``value`` (a list, tuple or other iterable, not a str/bytes/dict) as a list; GgmlTypeError otherwise."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        fail(fn, f"{name} must be a list of {what}, got {value!r}", GgmlTypeError)
    return list(value)


def c_int_arg(fn: str, name: str, value: Any, minimum: int | None = None) -> int:
    """An argument ggml takes as a C ``int`` (32 bits)."""
    return int_arg(fn, name, value, minimum, INT32_MAX)


def float_arg(fn: str, name: str, value: Any, finite: bool = False) -> float:
    """``value`` as a float: any real number (numpy scalars included), never NaN (no ggml parameter means
    anything with NaN: the result would be NaN garbage). ``finite``: also not inf nor beyond float32's range
    (C ``float`` parameters: a larger value would silently become inf)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        fail(fn, f"{name} must be a number, got {value!r}", GgmlTypeError)
    try:
        v = float(value)
    except OverflowError:
        fail(fn, f"{name} must be a number in float range, got {value!r}")
    if math.isnan(v):
        fail(fn, f"{name} must be a number, got NaN")
    if finite and not abs(v) <= FLOAT32_MAX:
        fail(fn, f"{name} must be finite (within float32's range, +-{FLOAT32_MAX:.4g}), got {value!r}")
    return v


def eps_arg(fn: str, name: str, value: Any) -> float:
    """A finite number >= 0 (ggml's norm kernels assert eps >= 0, which NaN also fails)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        fail(fn, f"{name} must be a number, got {value!r}", GgmlTypeError)
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
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


def _is_padded_1d(p: Any) -> bool:
    """ggml_is_padded_1d of tensor pointer ``p``."""
    return int(p.nb[0]) == int(lib.ggml_type_size(p.type)) and int(p.nb[2]) == int(p.nb[1]) * int(p.ne[1]) \
        and int(p.nb[3]) == int(p.nb[2]) * int(p.ne[2])


def padded_1d(fn: str, t: Tensor, what: str = "a") -> None:
    """ggml's ggml_is_padded_1d, which some op constructors assert (ggml_scale): contiguous elements and
    ne[1]-rows stacked without gaps. Stricter than ggml_is_contiguous, which skips dimensions of size 1 (a
    transposed [1, n] tensor is contiguous but not padded-1d)."""
    p = t.ptr
    ok = int(p.nb[0]) == int(lib.ggml_type_size(p.type)) and int(p.nb[2]) == int(p.nb[1]) * int(p.ne[1]) \
        and int(p.nb[3]) == int(p.nb[2]) * int(p.ne[2])
    if not ok:
        fail(fn, f"{what} must be laid out contiguously (apply ggml_cont first), got a view with strides "
                 f"{[int(p.nb[i]) for i in range(4)]} for shape {[int(p.ne[i]) for i in range(4)]}")


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
    if int(lib.ggml_blck_size(a.type)) == 1:  # plain types: offsets and strides fall on whole elements
        for name, v in [("offset", offset)] + [(f"nb{i + 1}", n) for i, n in enumerate(nb)]:
            if v % esize:
                fail(fn, f"{name} is in bytes and must be a multiple of the element size {esize} "
                         f"({type_name(a.type)}), got {v}; for an element offset k pass k * {esize}")
    strides = (esize,) + tuple(nb)
    last = offset + sum((n - 1) * s for n, s in zip(ne, strides)) + esize
    if last > a.nbytes():
        fail(fn, f"the view reaches byte {last}, beyond a's {a.nbytes()} bytes")
    return tuple(list(ne) + [1] * (4 - len(ne)))  # type: ignore[return-value]


def permutation(fn: str, axes: tuple[int, ...]) -> None:
    if not all(is_int(x) for x in axes) or sorted(int(x) for x in axes) != [0, 1, 2, 3]:
        fail(fn, f"the axes must be a permutation of 0, 1, 2, 3, got {list(axes)}")


def out_size(fn: str, what: str, n: int, k: int, s: int, p: int, d: int = 1) -> int:
    # ggml computes sizes in C int (32 bits): a padding, kernel or dilation that overflows there gives it a
    # negative size (an abort, or a tensor of negative shape), whatever Python's exact integers say
    for name, v in (("input + 2 * padding", n + 2 * p), ("dilation * (kernel - 1)", d * (k - 1)),
                    ("stride", s), ("padding", p)):
        if abs(v) > INT32_MAX:
            fail(fn, f"{what}: {name} is {v}, beyond ggml's 32-bit sizes ({INT32_MAX}); use a smaller padding, "
                     "kernel or dilation")
    size = (n + 2 * p - d * (k - 1) - 1) // s + 1
    if size < 1:
        fail(fn, f"the output {what} would be {size}: input {n}, kernel {k}, stride {s}, padding {p}, dilation {d}")
    return size


# ---------------------------------------------------------------- backward support

_BACKWARD_OPS = {
    "NONE", "DUP", "ADD", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "SCALE",
    "SUM", "SUM_ROWS", "MEAN", "REPEAT", "REPEAT_BACK", "RMS_NORM", "MUL_MAT", "SET", "CPY", "CONT",
    "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX",
    "ROPE", "IM2COL", "POOL_2D", "CROSS_ENTROPY_LOSS", "NORM", "CONCAT", "DROPOUT",
}
# SIGMOID, TANH, GELU and NORM come from our patch 0004, CONCAT from 0006 (ggml 0.25.3 has no backward for them),
# DROPOUT (the op itself) from 0018.
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
    if name == "GLU":  # 'GLU (SWIGLU)': the GLU family shares one op
        return f"GLU ({ffi.string(lib.ggml_glu_op_name(lib.ggml_get_glu_op(p))).decode()})"
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
    flags_loss = int(lib.GGML_TENSOR_FLAG_LOSS)
    needs_grad: set[int] = set()
    for n in nodes:  # nodes are in topological order
        if n.type == lib.GGML_TYPE_I32:
            continue
        # as ggml_build_backward_expand decides it: a parameter, a loss, or a node reading a tensor that needs one
        srcs = _grad_srcs(n, needs_grad)
        for s in srcs[:1]:
            if s.type not in (lib.GGML_TYPE_F32, lib.GGML_TYPE_F16):
                raise GgmlTypeError(f"ggml's backward pass needs F32 or F16 tensors on the path to a trainable "
                                    f"parameter; {_op_label(n)} reads a {type_name(s.type)} one (cast it with "
                                    "ggml_cpy into an F32 tensor first)")
        if not (n.flags & (flags_param | flags_loss) or srcs):
            continue
        _check_not_inplace(n, srcs)
        needs_grad.add(ptr_key(n))
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
        if _op_label(n) == "VIEW" and ptr_key(src) in needs_grad and not src.flags & flags_loss and \
                not (accumulating and src.flags & flags_param) and (src.type != GGML_TYPE_F32 or not _is_padded_1d(src)):
            # ggml adds a view's gradient into the gradient its source already has, else into a zero copy of the
            # source (ggml_scale by 0, then ggml_acc), which asserts a contiguous (padded-1d) F32 source: the
            # first to pass a gradient to the source is the last of its users in the graph
            later = [m for m in nodes[i + 1:] if ptr_key(m) in gets_grad
                     and any(ptr_key(s) == ptr_key(src) for s in _grad_srcs(m, needs_grad))]
            if not later:
                got = (f"a {type_name(src.type).upper()} one" if src.type != GGML_TYPE_F32 else
                       f"a strided one (strides {[int(src.nb[k]) for k in range(4)]})")
                fix = ("ggml_cont(ctx, x) before taking the view" if src.type == GGML_TYPE_F32 else
                       "convert it first (ggml_cpy into an F32 tensor) and view that")
                raise GgmlValueError(f"ggml cannot build the backward pass of a view ({_tensor_label(n)}) of "
                                     f"{_tensor_label(src)}: it expects the viewed tensor to be F32 and laid out "
                                     f"contiguously, got {got}, and would abort. Apply {fix}")
        if _op_label(n) == "MEAN" and lib.ggml_nelements(n) > 1 and ptr_key(src) in gets_grad:
            # ggml adds MEAN's gradient with ADD1 (scalar only) when the input already has one,
            # i.e. when a later node also passes a gradient to it: that build aborts.
            later = [m for m in nodes[i + 1:] if ptr_key(m) in gets_grad
                     and any(s != ffi.NULL and ptr_key(s) == ptr_key(src) for s in m.src)]
            if later or (accumulating and src.flags & flags_param):
                why = (f"is also used by {_op_label(later[0])}" if later else
                       "is a parameter whose gradient is accumulated")
                raise GgmlValueError(f"ggml cannot build the backward pass of MEAN ({_tensor_label(n)}) when its input "
                                     f"{why}; use ggml_scale(ggml_sum_rows(x), 1/n) instead of ggml_mean")


# ops that may be views of another tensor (view_src) on the gradient path: ggml asserts every other one is not
_VIEW_OPS = {"CPY", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


def _check_not_inplace(n: Any, srcs: list) -> None:
    """ggml_build_backward_expand asserts that no node needing a gradient is an in-place op (it has a view_src
    and is not a CPY/VIEW/RESHAPE/PERMUTE/TRANSPOSE): raise instead, naming the op and the fix."""
    if n.view_src == ffi.NULL:
        return
    op = ffi.string(lib.ggml_op_name(n.op)).decode()
    if op in _VIEW_OPS:
        return
    label = _op_label(n)
    if n.flags & int(lib.GGML_TENSOR_FLAG_PARAM):
        why = "it is a trainable parameter"
    elif srcs:
        why = (f"its operand {_tensor_label(srcs[0])} is (or is computed from) a trainable parameter (side outputs "
               "too: ggml gives a gradient to every tensor computed from one)")
    else:
        why = "it is the loss"
    base = label.split(" ")[0].lower()
    fix = f"Use the out-of-place op (ggml_{base}, not ggml_{base}_inplace or inplace=True)"
    raise GgmlValueError(f"ggml cannot build the backward pass through the in-place op {label} ({_tensor_label(n)}): "
                         f"it writes into its operand's memory, and it needs a gradient because {why}. {fix}, or "
                         "compute it in a graph without trainable parameters")


# sources ggml_build_backward_expand never differentiates (shape-only, indices, piecewise-constant ops)
_IGNORED_SRCS = {"IM2COL": (0,), "IM2COL_BACK": (0,), "CPY": (1,), "GET_ROWS": (1,), "GET_ROWS_BACK": (1,),
                 "ROPE": (1,), "SGN": (0,), "STEP": (0,), "DROPOUT": (1,)}


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
    if op == "GLU":
        # ggml differentiates the split SwiGLU (silu(a) * b, two operands) only; the fused form aborts
        split = n.src[1] != ffi.NULL
        if int(lib.ggml_get_glu_op(n)) == int(lib.GGML_GLU_OP_SWIGLU) and split:
            return
        raise GgmlValueError(f"ggml has no backward pass for {label} ({_tensor_label(n)}"
                             f"{', fused: one operand holding both halves' if not split else ''}) on the path to a "
                             "trainable parameter; expected the split SwiGLU: ggml_swiglu_split(ctx, a, b) with the "
                             "two halves as separate tensors (views of the fused input work: ggml_view_2d/ggml_cont)")
    if not supported:
        hint = _COMPOSITE_HINT.get(label, "rebuild it from ops that have one")
        raise GgmlValueError(f"ggml has no backward pass for {label} ({_tensor_label(n)}) on the path to a "
                             f"trainable parameter; {hint}")
    if op in ("SUB", "DIV"):
        a, b = n.src[0], n.src[1]
        if tuple(a.ne) != tuple(b.ne) and (needs_grad is None or ptr_key(b) in needs_grad):
            raise GgmlValueError(f"{op} with a broadcast second operand has no backward pass in ggml; make the "
                                 "shapes equal with ggml_repeat(ctx, b, a) first")
    def needs(j: int) -> bool:  # source j is there and needs a gradient
        src = n.src[j]
        return src != ffi.NULL and (needs_grad is None or ptr_key(src) in needs_grad)
    if op == "SOFT_MAX" and (needs(1) or needs(2)):
        what = "mask" if needs(1) else "sinks"
        raise GgmlValueError(f"ggml has no backward pass for the {what} of ggml_soft_max_ext ({_tensor_label(n)}): "
                             f"its {what} {_tensor_label(n.src[1 if needs(1) else 2])} is (or is computed from) a "
                             f"trainable parameter, and ggml would abort. Expected a {what} that is data, not "
                             "trained: build it from tensors without ggml_set_param")
    if op == "ROPE" and needs(2):
        raise GgmlValueError(f"ggml has no backward pass for the frequency factors of ggml_rope_ext "
                             f"({_tensor_label(n)}): {_tensor_label(n.src[2])} is (or is computed from) a trainable "
                             "parameter, and ggml would abort. Expected constant frequency factors: pass data (or "
                             "None), not a tensor marked with ggml_set_param or computed from one")
    if op == "CROSS_ENTROPY_LOSS" and needs(1):
        raise GgmlValueError(f"ggml has no backward pass for the labels of ggml_cross_entropy_loss "
                             f"({_tensor_label(n)}): {_tensor_label(n.src[1])} is (or is computed from) a trainable "
                             "parameter, and ggml would abort. Expected labels that are data: only the logits (a) "
                             "can be trained")
    if op == "SOFT_MAX":
        max_bias = op_param_f32(n, 1)
        if max_bias != 0.0:
            raise GgmlValueError(f"ggml has no backward pass for ggml_soft_max_ext with max_bias != 0 (ALiBi; "
                                 f"{_tensor_label(n)} has max_bias={max_bias}) on the path to a trainable parameter; use "
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


class IndexBound(int):
    """The exclusive upper bound of an index input (an int), with ``what`` the indices are, for messages."""
    what: str = "row indices for ggml_get_rows"

    def __new__(cls, value: int, what: str) -> "IndexBound":
        self = super().__new__(cls, value)
        self.what = what
        return self


# ops reading an I32 source as indices: (which source, its bound from the node, what the indices are). ggml
# aborts on an index out of range (get_rows, mul_mat_id) or writes outside its memory (get_rows_back).
_INDEX_SRCS = {
    "GET_ROWS": (1, lambda t: int(t.src[0].ne[1]), "row indices for ggml_get_rows"),
    "GET_ROWS_BACK": (1, lambda t: int(t.ne[1]), "row indices for ggml_get_rows_back (rows of its result, c's ne[1])"),
    "MUL_MAT_ID": (2, lambda t: int(t.src[0].ne[2]), "expert indices for ggml_mul_mat_id (matrices of as_, its ne[2])"),
}


def index_bounds(inputs: list[Tensor] | None, outputs: list[Tensor]) -> dict[int, int]:
    """Inputs that ggml reads as indices (the rows of ggml_get_rows/ggml_get_rows_back, the experts of
    ggml_mul_mat_id; directly or through a reshape/view) and their exclusive bound (an ``IndexBound``): an
    index outside [0, bound) aborts the process inside ggml (or corrupts memory), so batches are checked.
    ``inputs=None``: every leaf tensor (not computed by an op) counts as an input. Keys are ``ptr_key``s."""
    return {key: bound for key, (_, bound) in _index_inputs(inputs, outputs).items()}


def index_inputs(outputs: list[Tensor]) -> list[tuple[Any, int]]:
    """(leaf tensor pointer, bound) for every leaf that ggml reads as indices (see ``index_bounds``)."""
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
        entry = _INDEX_SRCS.get(ffi.string(lib.ggml_op_name(t.op)).decode())
        if entry is None or t.src[entry[0]] == ffi.NULL:
            continue
        idx = t.src[entry[0]]
        exact_view = False  # a contiguous view of part of an input holds exactly the indices read: check it
        while not _is_input(idx, wanted) and ffi.string(lib.ggml_op_name(idx.op)).decode() in _DATA_MOVES:
            if ffi.string(lib.ggml_op_name(idx.op)).decode() in ("VIEW", "RESHAPE") and lib.ggml_is_contiguous(idx) \
                    and idx.view_src != ffi.NULL and _is_input(idx.view_src, wanted) \
                    and lib.ggml_nelements(idx) < lib.ggml_nelements(idx.view_src):
                exact_view = True
                break
            idx = idx.src[0]
        if exact_view or _is_input(idx, wanted):
            bound = entry[1](t)
            old = found.get(ptr_key(idx))
            if old is None or bound < old[1]:
                found[ptr_key(idx)] = (idx, IndexBound(bound, entry[2]))
    return found


def check_index_inputs(leaves: list[tuple[Any, int]]) -> None:
    """Check the current contents of index leaves (before a compute ggml would abort)."""
    for t, bound in leaves:
        # a contiguous view of an index input is read through the input itself, at the view's offset: the view's
        # own data pointer is only set when a scheduler allocates its graph (stale before, from the last one)
        src, offset = (t.view_src, int(t.view_offs)) if t.view_src != ffi.NULL else (t, 0)
        if src.data == ffi.NULL or not lib.ggml_is_contiguous(t) or t.type != lib.GGML_TYPE_I32:
            continue
        values = np.empty(int(lib.ggml_nelements(t)), dtype=np.int32)
        if src.buffer != ffi.NULL:
            lib.ggml_backend_tensor_get(src, ffi.from_buffer(values), offset, values.nbytes)
        else:
            ffi.memmove(ffi.from_buffer(values), ffi.cast("char *", src.data) + offset, values.nbytes)
        check_indices(values, bound, _tensor_label(t))


# ops whose I32 result holds values of their first source (a bound on those is a bound on the result)
_VALUE_MOVES = _DATA_MOVES | {"REPEAT", "GET_ROWS", "CPY", "DUP"}


def computed_index_bound(t: Any, depth: int = 0) -> int | None:
    """An exclusive upper bound on the values of I32 tensor pointer ``t`` that ggml computes, when the ops
    computing it give one: ``ggml_argmax`` of ``[k, ...]`` yields values in ``[0, k)``, and reshapes, views,
    copies, repeats and row lookups keep the values of their source. None when no bound is known: a leaf
    (an input: its contents are checked before each compute instead) or values converted from floats."""
    if depth > 64 or t.type != lib.GGML_TYPE_I32:
        return None
    op = ffi.string(lib.ggml_op_name(t.op)).decode()
    if op == "ARGMAX":
        return int(t.src[0].ne[0])
    if op in _VALUE_MOVES and t.src[0] != ffi.NULL:
        return computed_index_bound(t.src[0], depth + 1)
    return None


def check_computed_indices(fn: str, table: Tensor, indices: Tensor) -> None:
    """ggml_get_rows: indices computed in the graph whose range is known must fit the table's rows (ggml
    aborts the process on an out-of-range row, and it cannot be checked once computed)."""
    bound = computed_index_bound(indices.ptr)
    rows = int(table.ptr.ne[1])
    if bound is not None and bound > rows:
        fail(fn, f"the indices b are computed in the graph (from a ggml_argmax over {bound} values), so they can be up "
                 f"to {bound - 1}, but the table a has only {rows} rows (ne[1]); ggml would abort the process on such "
                 f"an index. Give the table at least {bound} rows, or take the argmax over at most {rows} values")


def _is_input(t: Any, wanted: set[int] | None) -> bool:
    return t.op == lib.GGML_OP_NONE if wanted is None else ptr_key(t) in wanted


def check_indices(values: np.ndarray, bound: int, where: str) -> None:
    """``values`` must be in [0, bound) (``bound``: an int or an ``IndexBound``, which says what they index)."""
    if values.size and (values.min() < 0 or values.max() >= bound):
        bad = values[(values < 0) | (values >= bound)].reshape(-1)
        what = getattr(bound, "what", IndexBound.what)
        raise GgmlValueError(f"{where} holds {what}, which must be in [0, {int(bound)}); got {bad[0]}, out of range "
                             f"({bad.size} bad indices; ggml would abort or write outside its memory). Fix the "
                             "indices, or make the indexed tensor larger")


# ---------------------------------------------------------------- memory of tensors and graphs

_GGML_NAMES = re.compile(r"^(leaf|node)_\d+$")


def _tensor_label(t: Any) -> str:
    """How an error names tensor pointer ``t``: its user-given name, type and shape ('leaf_3' and the like
    are names ggml gives unnamed tensors while building a graph: said so)."""
    name = ffi.string(t.name).decode("utf-8", "replace")
    ne = [int(t.ne[i]) for i in range(4)]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    what = f"{type_name(t.type).upper()} {ne}"
    if not name:
        return f"an unnamed {what} tensor (name it with ggml_set_name)"
    if name.startswith(" ("):  # ggml names a view/copy of an unnamed tensor ' (view)', ' (copy)'
        return f"an unnamed {what} tensor ({name.strip(' ()')} of an unnamed one; name it with ggml_set_name)"
    if _GGML_NAMES.match(name):
        return f"an unnamed {what} tensor ('{name}' is the name ggml gave it; name it with ggml_set_name)"
    return f"tensor '{name}' ({what})"


NO_MEMORY_FIX = ("allocate it first: ggml_backend_alloc_ctx_tensors for its context, ggml_backend_sched_alloc_graph "
                 "or ggml_gallocr_alloc_graph for a graph (or create its context with no_alloc=False); memory goes "
                 "when the buffer, scheduler or graph allocator that gave it is freed or reset")


def tensor_memory(t: Any, what: str | None = None) -> str:
    """Where tensor pointer ``t`` has its data: 'backend' (a backend buffer) or 'host' (context memory).

    Raises GgmlStateError when it has none: never allocated, or its buffer, scheduler or graph allocator
    has since been freed or reset (ggml would read a NULL or dangling pointer). A view follows the tensor
    it views (its ``view_src``): when that one got new memory since the view was made, the view is pointed
    at it (what ggml_backend_view_init does), instead of at the memory it had."""
    root = t.view_src if t.view_src != ffi.NULL else None
    if root is None:
        if t.data == ffi.NULL:
            raise GgmlStateError(f"{what or _tensor_label(t)} has no memory: {NO_MEMORY_FIX}")
        return "backend" if t.buffer != ffi.NULL else "host"
    if root.data == ffi.NULL:
        raise GgmlStateError(f"{what or _tensor_label(t)} is a view of {_tensor_label(root)}, which has no memory: "
                             f"{NO_MEMORY_FIX}")
    want = ffi.cast("char *", root.data) + int(t.view_offs)
    if t.data != want:
        t.data = want
    if t.buffer != ffi.NULL and t.buffer != root.buffer:  # (a view without buffer is placed by ggml each time)
        t.buffer = root.buffer
    return "backend" if root.buffer != ffi.NULL else "host"


# sources an op reads only for their shape (or writes into): a leaf used only there needs no values
_SHAPE_ONLY_SRCS = {"CPY": (1,), "IM2COL": (0,), "IM2COL_BACK": (0,)}


def value_read(nodes: Iterable[Any]) -> set[int]:
    """Keys of the tensors some node of ``nodes`` reads the values of (not only the shape, or as the
    destination of a copy); reading a view reads the tensor it views."""
    read: set[int] = set()
    for p in nodes:
        skip = _SHAPE_ONLY_SRCS.get(ffi.string(lib.ggml_op_name(p.op)).decode(), ())
        for j, src in enumerate(p.src):
            if src != ffi.NULL and j not in skip:
                read.add(ptr_key(src))
                if src.view_src != ffi.NULL:
                    read.add(ptr_key(src.view_src))
    return read


def graph_tensor_ptrs(g: Any) -> tuple[list, list]:
    """(nodes, every tensor) of graph pointer ``g``: its nodes in order, then the sources they read that
    are not nodes (the leafs), each once."""
    nodes = [lib.ggml_graph_node(g, i) for i in range(int(lib.ggml_graph_n_nodes(g)))]
    tensors = list(nodes)
    seen = {ptr_key(p) for p in nodes}
    for p in nodes:
        for s in p.src:
            if s != ffi.NULL:
                k = ptr_key(s)
                if k not in seen:
                    seen.add(k)
                    tensors.append(s)
    return nodes, tensors


def buffer_usable(backend: Any, buf: Any) -> bool:
    """Whether ``backend`` (a Backend) can compute on tensors in buffer ``buf`` (the CPU: host memory; a
    device backend: its own buffers)."""
    if backend.is_cpu:
        return bool(lib.ggml_backend_buffer_is_host(buf))
    buft = lib.ggml_backend_buffer_get_type(buf)
    return buft == lib.ggml_backend_get_default_buffer_type(backend.ptr) or \
        buft == lib.ggml_backend_dev_buffer_type(lib.ggml_backend_get_device(backend.ptr))


def backend_runs(backend: Any, p: Any) -> tuple[bool, str]:
    """Whether ``backend`` implements node ``p`` for its types and layouts: ggml's ``supports_op``, confirmed
    for the CPU by running its kernel once (``_capabilities``: the CPU answers True for kernels that abort)."""
    if not lib.ggml_backend_supports_op(backend.ptr, p):
        return False, f"{backend.name} does not implement it (ggml_backend_supports_op)"
    if backend.is_cpu:
        from ._capabilities import cpu_kernel_runs
        ok, why = cpu_kernel_runs(p)
        if not ok:
            where = why.split("/src/", 1)[-1]
            return False, f"ggml's CPU kernel for it aborts ({where})"
    return True, ""


def describe_node(p: Any) -> str:
    """'CPY of tensor 'y' (result I8; operands F32, I8)': what a node computes, from which types."""
    srcs = ", ".join(type_name(s.type).upper() for s in p.src if s != ffi.NULL)
    return (f"{_op_label(p)} of {_tensor_label(p)} (result {type_name(p.type).upper()}"
            + (f"; operands {srcs})" if srcs else ")"))


# ---------------------------------------------------------------- memory a graph allocation needs

_POOLS: dict[int, tuple[str, int, int, bool]] = {}


def memory_pool(backend: Any) -> tuple[int, str, int, int, bool]:
    """(key, name, largest buffer, total memory, host) of the memory ``backend`` (a Backend) places a graph's
    tensors in: its default buffer type (what schedulers and graph allocators use). The largest buffer is
    ggml_backend_buft_get_max_size (read through an empty buffer: the cffi declarations have no buft form);
    the total is the device's memory (the machine's for host memory), 0 when the device does not say."""
    from .context import physical_memory
    buft = lib.ggml_backend_get_default_buffer_type(backend.ptr)
    key = ptr_key(buft)
    if key not in _POOLS:
        buf = lib.ggml_backend_alloc_buffer(backend.ptr, 0)  # ggml's zero-size dummy buffer: no memory taken
        try:
            max_size = int(lib.ggml_backend_buffer_get_max_size(buf)) if buf != ffi.NULL else 0
        finally:
            if buf != ffi.NULL:
                lib.ggml_backend_buffer_free(buf)
        host = bool(lib.ggml_backend_buft_is_host(buft))
        if host:
            total = physical_memory()
        else:
            free_p, total_p = ffi.new("size_t *"), ffi.new("size_t *")
            lib.ggml_backend_dev_memory(lib.ggml_backend_get_device(backend.ptr), free_p, total_p)
            total = int(total_p[0])
        _POOLS[key] = (ffi.string(lib.ggml_backend_buft_name(buft)).decode(), max_size or (1 << 64) - 1, total, host)
    return (key, *_POOLS[key])


def pool_free(backend: Any) -> int:
    """Bytes free now in the memory ``backend`` allocates from (0 when the device does not say)."""
    from .context import available_memory
    if lib.ggml_backend_buft_is_host(lib.ggml_backend_get_default_buffer_type(backend.ptr)):
        return available_memory()
    free_p, total_p = ffi.new("size_t *"), ffi.new("size_t *")
    lib.ggml_backend_dev_memory(lib.ggml_backend_get_device(backend.ptr), free_p, total_p)
    return int(free_p[0])


def _size_text(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n} bytes ({n / (1 << shift):.1f} {unit})"
    return f"{n} bytes"


def _placed_root(t: Any) -> Any | None:
    """The tensor an allocator gives memory for when it places ``t`` (t, or the tensor it views), or None when
    that one already has memory."""
    root = t.view_src if t.view_src != ffi.NULL else t
    return root if root.data == ffi.NULL else None


def unallocated_bytes(tensors: list) -> int:
    """An upper bound on what placing ``tensors`` (pointers) takes: each tensor without memory once (a view
    counts the tensor it views), plus alignment. Allocators reuse memory, so they usually need less."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        root = _placed_root(t)
        if root is not None and ptr_key(root) not in seen:
            seen.add(ptr_key(root))
            total += int(lib.ggml_nbytes(root)) + 512
    return total


_MEMORY_FIX = ("Expected sizes that fit: check the shape arguments of the op that made it (a padding, an arange's "
               "range, a repeat or an upscale far larger than meant), or split the work into smaller graphs (smaller "
               "batches)")


def check_graph_memory(nodes: list, tensors: list, backends: list, fn: str) -> None:
    """Refuse a graph whose allocation cannot succeed on ``backends`` (Backends: a scheduler's, or a graph
    allocator's one), before ggml tries: a tensor larger than the memory of every backend, or a node whose
    operands alone (all in memory while it is computed) exceed their memory together. ggml does not survive
    a failed graph allocation: a scheduler dereferences the missing buffer (segfault). (A buffer type's largest
    buffer, ggml_backend_buft_get_max_size, is no limit here: ggml gives a larger tensor a buffer of its own,
    which the backend may still manage; ``allocation_may_fail`` has the allocation reserved first then.)"""
    pools = {}
    for b in backends:
        key, name, _, total, _ = memory_pool(b)
        pools[key] = (name, total)
    totals = [tot for _, tot in pools.values()]
    if not all(totals):
        return  # a device that does not say how much memory it has
    names = "/".join(dict.fromkeys(b.name for b in backends))
    # one tensor: it must fit the memory of some backend
    one = max(totals)
    for t in tensors:
        root = _placed_root(t)
        if root is None:
            continue
        size = int(lib.ggml_nbytes(root))
        if size > one:
            what = "; ".join(f"{name}: {_size_text(tot)}" for name, tot in pools.values())
            op = f", the result of {_op_label(root)}," if root.op != lib.GGML_OP_NONE else ""
            raise GgmlValueError(f"{fn}: {_tensor_label(root)}{op} needs {_size_text(size)}, more than the memory "
                                 f"of {names} ({what}); ggml would fail to allocate it and crash. {_MEMORY_FIX}")
    # one node: its operands (and its result, unless it reuses an operand's memory) are in memory together
    memory = sum(totals)
    for p in nodes:
        roots = {}
        for src in p.src:
            if src != ffi.NULL:
                r = _placed_root(src)
                if r is not None:
                    roots[ptr_key(r)] = r
        own = _placed_root(p)
        need = max(sum(int(lib.ggml_nbytes(r)) for r in roots.values()),
                   int(lib.ggml_nbytes(own)) if own is not None else 0)
        if need > memory:
            raise GgmlValueError(f"{fn}: computing {_tensor_label(p)} ({_op_label(p)}) needs its operands and result "
                                 f"in memory together: at least {_size_text(need)}, more than {names} have "
                                 f"({_size_text(memory)}); ggml would fail to allocate the graph and crash. "
                                 f"{_MEMORY_FIX}")


def allocation_may_fail(tensors: list, backends: list) -> bool:
    """Whether placing ``tensors`` might fail on ``backends``: it might need more memory than they have free
    now, or a tensor is larger than a buffer type's largest buffer (ggml then asks the backend for a buffer of
    its own, which it may refuse). The caller then reserves the memory first (a failed reservation returns
    False; a failed allocation inside a scheduler crashes ggml). Cheap for small graphs: the free memory is
    only read above 64 MiB."""
    need = unallocated_bytes(tensors)
    if need <= 64 << 20:
        return False
    pools = {}
    for b in backends:
        key, _, max_size, _, _ = memory_pool(b)
        if key not in pools:
            pools[key] = (max_size, pool_free(b))
    smallest = min(m for m, _ in pools.values())
    if any(int(lib.ggml_nbytes(r)) > smallest for r in filter(None, map(_placed_root, tensors))):
        return True
    return need > sum(f for _, f in pools.values())


_PURE_VIEWS = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}  # (a copy's result views its destination: placed)


def check_graph_ready(graph: Graph, backends: list, fn: str, mode: str, scheduler: bool = False) -> None:
    """Refuse to compute a graph that would crash ggml or compute garbage, naming the tensor:

    * memory: ``mode`` "backend" (``ggml_backend_graph_compute`` on ``backends[0]``) and "allocated" (a
      scheduler that allocated the graph) need memory for every tensor; "sched" (a scheduler that will
      allocate it while computing) needs it for the leafs (inputs and weights: a leaf without memory
      holds no values); "alloc" (an allocator about to place the graph) for none. The tensor a view views
      needs memory unless the graph has it. Memory must be on a backend that can use it.
    * support: every op must be implemented for its types by one of ``backends`` (on the backend its
      pre-allocated memory pins it to) — ggml aborts inside a kernel otherwise.

    A graph that passed is not checked again until its node count, the backends or the memory epoch
    (``_handle.memory_epoch``: some memory was given back) change."""
    from ._handle import memory_epoch
    g = graph.ptr
    key = (memory_epoch(), int(lib.ggml_graph_n_nodes(g)), mode, scheduler, tuple(id(b) for b in backends))
    if graph._checked == key:
        return
    nodes, tensors = graph_tensor_ptrs(g)
    keys = {ptr_key(t) for t in tensors}
    read = value_read(nodes) if mode == "sched" else set()
    names = "/".join(b.name for b in backends)
    unplaced_view = None
    # leafs some node writes into (a copy's destination, an in-place op's): the scheduler places those
    written = {ptr_key(t.view_src) for t in nodes if t.view_src != ffi.NULL
               and ffi.string(lib.ggml_op_name(t.op)).decode() not in _PURE_VIEWS}
    for t in tensors:
        root = t.view_src if t.view_src != ffi.NULL else t
        leaf = t.op == lib.GGML_OP_NONE and t.view_src == ffi.NULL
        if mode in ("sched", "alloc") and root.data == ffi.NULL:
            if leaf and mode == "sched" and ptr_key(t) in read:
                raise GgmlStateError(f"{fn}: {_tensor_label(t)} is an input of the graph without memory, so it holds no "
                                     "values: allocate the graph with ggml_backend_sched_alloc_graph and write the "
                                     "tensor with ggml_backend_tensor_set_data before computing (or allocate its "
                                     "context with ggml_backend_alloc_ctx_tensors)")
            if root is not t and ptr_key(root) not in keys:
                raise GgmlStateError(f"{fn}: {_tensor_label(t)} views {_tensor_label(root)}, which has no memory and "
                                     f"is not computed by this graph: {NO_MEMORY_FIX}")
            if (scheduler or mode == "sched") and root is not t and root.op == lib.GGML_OP_NONE \
                    and ffi.string(lib.ggml_op_name(t.op)).decode() in _PURE_VIEWS \
                    and not root.flags & int(lib.GGML_TENSOR_FLAG_INPUT) and ptr_key(root) not in written \
                    and unplaced_view is None:
                unplaced_view = (t, root)  # refused below, after the ops (a missing kernel says more)
            continue
        where = tensor_memory(t, f"{fn}: {_tensor_label(t)}")
        if where == "host" and mode == "backend" and not backends[0].is_cpu:
            raise GgmlStateError(f"{fn}: {_tensor_label(root)} lives in context memory (the CPU's), which "
                                 f"{names} cannot compute on; allocate its context on that backend with "
                                 "ggml_backend_alloc_ctx_tensors, or use a scheduler")
        if where == "host" and mode != "backend" and any(b.device.type not in ("cpu", "accel") for b in backends):
            # ggml's scheduler copies a tensor to another device through its buffer: one in context memory
            # has none, and the copy dereferenced it (segfault)
            raise GgmlStateError(f"{fn}: {_tensor_label(root)} lives in context memory (ggml_init without "
                                 f"no_alloc), which a scheduler with {names} cannot move between devices; create "
                                 "it in a no_alloc context and allocate that with ggml_backend_alloc_ctx_tensors "
                                 "(on the CPU backend or the device), or compute on a CPU-only scheduler")
        if where == "backend" and not any(buffer_usable(b, root.buffer) for b in backends):
            buf = ffi.string(lib.ggml_backend_buffer_name(root.buffer)).decode()
            raise GgmlStateError(f"{fn}: {_tensor_label(root)} lives in a {buf} buffer, which {names} cannot compute "
                                 f"on; compute with a scheduler that has the {buf} backend (or allocate the tensor on "
                                 "one of these backends)")
    check_nodes_supported(nodes, backends, fn, pinned=mode != "backend")
    if unplaced_view is not None:
        # ggml's scheduler gives memory to leafs that nodes read, not to one only seen through a view (it
        # aborted: "buffer_id >= 0"); a graph allocator places it
        t, root = unplaced_view
        raise GgmlStateError(f"{fn}: {_tensor_label(t)} views {_tensor_label(root)}, a leaf without memory that is "
                             "not marked as an input: ggml's scheduler would not place it. Mark it with ggml_set_input "
                             "(then write it after allocating the graph), or allocate its context with "
                             "ggml_backend_alloc_ctx_tensors")
    if mode in ("sched", "alloc"):
        check_graph_memory(nodes, tensors, backends, fn)
    graph._checked = key


def check_nodes_supported(nodes: list, backends: list, fn: str, pinned: bool = True) -> None:
    """Every op node (tensor pointer) must be implemented for its types and layouts by one of ``backends``
    (with ``pinned``: by one that can use the memory it already has, as ggml's scheduler requires), else
    GgmlTypeError naming the op, the tensor and its types (ggml would abort inside a kernel)."""
    for p in nodes:
        if p.op == lib.GGML_OP_NONE:
            continue
        root = p.view_src if p.view_src != ffi.NULL else p
        candidates = backends
        if pinned and root.buffer != ffi.NULL and root.data != ffi.NULL:
            candidates = [b for b in backends if buffer_usable(b, root.buffer)]  # ggml pins the op to them
        reasons = []
        for b in candidates:
            ok, why = backend_runs(b, p)
            if ok:
                break
            reasons.append(why)
        else:
            names = "/".join(b.name for b in candidates) or "/".join(b.name for b in backends)
            note = " (the memory it already has pins it to them)" if candidates is not backends else ""
            raise GgmlTypeError(f"{fn}: {names} cannot compute {describe_node(p)}{note}: "
                                f"{'; '.join(reasons) or 'no backend can use its memory'}; ggml would abort the "
                                "process. Convert the operands to a type the op takes (F32 works for every op: "
                                "ggml_cpy into an F32 tensor), or use another op")


def check_static_memory(roots: list, fn: str) -> list:
    """ggml-opt's static graphs: every leaf (input, weight, constant) reachable from ``roots`` (tensor pointers:
    the outputs and extra outputs) needs memory, which ggml-opt's copy of the graph keeps; a leaf without would
    get fresh, uninitialised memory at every step (weights reset to garbage). Returns (leaf, data pointer)
    pairs to check later."""
    from .context import walk_graph
    found = []
    everything = list(walk_graph(roots))
    read = value_read(everything)
    for t in everything:
        if t.op == lib.GGML_OP_NONE and t.view_src == ffi.NULL:
            if t.data == ffi.NULL and ptr_key(t) in read:
                raise GgmlStateError(f"{fn}: {_tensor_label(t)} has no memory. ggml-opt runs a copy of the graph "
                                     "that keeps the memory of its inputs and weights: allocate the tensor's context "
                                     "with ggml_backend_alloc_ctx_tensors (and write its values) before building the "
                                     "opt context")
            if t.data != ffi.NULL:
                found.append((t, t.data))
    return found


def check_opt_heads(heads: list, fn: str, ggml_loss: bool) -> None:
    """What ggml-opt asserts about the outputs it trains (it would abort): F32 (its losses and optimizer are
    F32-only), contiguous, and for its own cross-entropy (``ggml_loss``: one head handed to ggml-opt as is)
    a matrix ``[classes, batch]`` (its accuracy takes an argmax per column)."""
    for i, h in enumerate(heads):
        t = h.outputs.ptr
        which = "outputs" if len(heads) == 1 else f"outputs[{i}]"
        label = _tensor_label(t)
        if t.type != GGML_TYPE_F32:
            raise GgmlTypeError(f"{fn}: {which} must be F32 (ggml-opt's losses and optimizer compute in F32), got "
                                f"{label}; convert it: ggml_cpy(ctx, out, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, "
                                "...)) with the same shape")
        if not lib.ggml_is_contiguous(t):
            raise GgmlValueError(f"{fn}: {which} must be contiguous, got a strided view ({label}); apply ggml_cont")
        if ggml_loss and h.loss_type == int(lib.GGML_OPT_LOSS_TYPE_CROSS_ENTROPY) and (t.ne[2] != 1 or t.ne[3] != 1):
            ne = [int(t.ne[k]) for k in range(4)]
            raise GgmlValueError(f"{fn}: ggml's cross-entropy loss needs 2-D outputs [classes, batch] (it takes the "
                                 f"argmax of each column for the accuracy), got {label} with ne {ne}; reshape the "
                                 f"logits with ggml_reshape_2d(ctx, out, {ne[0]}, {ne[1] * ne[2] * ne[3]}) (each "
                                 "column one prediction) and the labels alike")
