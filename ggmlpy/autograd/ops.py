"""The differentiable ops and losses of ggmlR's autograd engine (``ag_add`` ... ``ag_softmax_cross_entropy_loss``),
each a lazy ``AgTensor`` and how it becomes ggml ops. Shapes are numpy's (samples first): ``ag_matmul(A, B)`` is
``A @ B``, reductions take numpy axes, softmax runs over the last axis. The second operand of ``ag_add``,
``ag_sub``, ``ag_mul`` broadcasts to the first by numpy's rules (either way round for ``+`` and ``*``), and its
gradient is summed back to its shape. Gradients are ggml's own backward passes, computed on the device.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..core.args import float_arg, is_int, is_real
from ..errors import GgmlTypeError, GgmlValueError
from ..graph.objects import Context, Tensor
from ..models.layers.fused import device_computes_half_products
from ..ops.elementwise import (
    ggml_abs,
    ggml_add,
    ggml_clamp,
    ggml_cont,
    ggml_div,
    ggml_exp,
    ggml_log,
    ggml_mul,
    ggml_relu,
    ggml_scale,
    ggml_sgn,
    ggml_sigmoid,
    ggml_soft_max,
    ggml_sqr,
    ggml_sqrt,
    ggml_sub,
    ggml_tanh,
)
from ..ops.layout import ggml_cast, ggml_permute, ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d
from ..ops.linalg import ggml_mul_mat
from ..ops.reduce import ggml_repeat, ggml_sum, ggml_sum_rows
from .device import DTYPES
from .lazy import Builder, Op
from .tensor import AgTensor, leaf_values, OPERATORS, result


__all__ = ["ag_add", "ag_sub", "ag_mul", "ag_matmul", "ag_scale", "ag_relu", "ag_sigmoid", "ag_tanh", "ag_softmax",
           "ag_exp", "ag_log", "ag_sum", "ag_mean", "ag_reshape", "ag_transpose", "ag_pow", "ag_clamp"]

NpShape = tuple[int, ...]  # numpy's order


# ---------------------------------------------------------------- operands and layouts

def operand(x: object, like: AgTensor, fn: str, what: str) -> AgTensor:
    """An AgTensor for ``x``: itself, or a number or array as data on ``like``'s device."""
    if isinstance(x, AgTensor):
        return x
    if isinstance(x, (bool, np.bool_)) or not (is_real(x) or isinstance(x, (np.ndarray, list, tuple))):
        raise GgmlTypeError(f"{fn}: {what} must be an AgTensor, a number or an array, got {type(x).__name__}")
    arr = leaf_values(x, f"{fn}({what})", integer=False)
    t = AgTensor(like.engine, arr.shape, "f32")
    t.host = arr
    return t


def tensor_arg(x: object, fn: str, what: str = "x") -> AgTensor:
    if not isinstance(x, AgTensor):
        raise GgmlTypeError(f"{fn}: {what} must be an AgTensor (make one with ag_tensor or ag_param), got "
                            f"{type(x).__name__}")
    return x


def floating(x: AgTensor, fn: str, what: str = "x") -> AgTensor:
    if x.dtype == "i32":
        raise GgmlTypeError(f"{fn}: {what} holds integers; this op takes floating-point values")
    return x


def ne_of(shape: NpShape) -> tuple[int, ...]:
    """ggml's sizes (ne0 first) of a numpy shape."""
    return tuple(reversed(shape)) or (1,)


def reshaped(b: Builder, t: Tensor, shape: NpShape) -> Tensor:
    """``t`` (contiguous) as ggml's tensor of numpy ``shape``."""
    ne = ne_of(shape)
    if tuple(t.shape[:len(ne)]) == ne and all(d == 1 for d in t.shape[len(ne):]):
        return t
    fns = (ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d)
    return fns[len(ne) - 1](b.ctx, t, *ne)


def broadcasts(small: NpShape, big: NpShape) -> bool:
    """Whether numpy broadcasts ``small`` to exactly ``big``."""
    if len(small) > len(big):
        return False
    return all(s in (1, g) for s, g in zip(reversed(small), reversed(big)))


def padded(t: Tensor, b: Builder, small: NpShape, big: NpShape) -> Tensor:
    """``t`` of numpy shape ``small`` with ``big``'s number of dimensions (leading 1s): ggml's broadcast form."""
    full = (1,) * (len(big) - len(small)) + tuple(small)
    return reshaped(b, t, full) if full else t


# ---------------------------------------------------------------- element-wise

def _bin(name: str, fn: Callable[[Context, Tensor, Tensor], Tensor]) -> Op:
    def lower(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
        small, big = attrs
        return fn(b.ctx, xs[0], padded(xs[1], b, small, big))
    return Op(name, lower)


_ADD, _MUL, _SUB_SAME = _bin("add", ggml_add), _bin("mul", ggml_mul), _bin("sub", ggml_sub)


def _binary(fn: str, a: object, c: object, commutes: bool) -> tuple[AgTensor, AgTensor]:
    """The operands of an element-wise op with the broadcast one second (swapped where the op commutes)."""
    if not isinstance(a, AgTensor):
        c = tensor_arg(c, fn, "b")
        a = operand(a, c, fn, "a")
    else:
        c = operand(c, a, fn, "b")
    floating(a, fn, "a"), floating(c, fn, "b")
    if broadcasts(c.shape, a.shape):
        return a, c
    if commutes and broadcasts(a.shape, c.shape):
        return c, a
    raise GgmlValueError(f"{fn}: b's shape {c.shape} does not broadcast to a's {a.shape} (numpy's rules: b's "
                         "dimensions, from the last, equal a's or are 1); reshape one of them")


def ag_add(a: object, b: object) -> AgTensor:
    """Element-wise sum ``a + b``, with b broadcast to a's shape (numpy's rules).

    Arguments:
        a: an AgTensor (or a number/array when b is one).
        b: an AgTensor, number or array whose shape broadcasts to a's (or a's to its: addition commutes).

    Value: a lazy AgTensor of the larger shape; b's gradient is summed back over the broadcast axes.

    Example:
        >>> h = ag_add(x @ W.T, bias)        # bias (out,) added to every row of (N, out)
    """
    x, y = _binary("ag_add", a, b, True)
    return result(_ADD, (x, y), x.shape, (y.shape, x.shape))


def ag_mul(a: object, b: object) -> AgTensor:
    """Element-wise product ``a * b``, with b broadcast to a's shape (numpy's rules).

    Arguments:
        a: an AgTensor (or a number/array when b is one).
        b: an AgTensor, number or array whose shape broadcasts to a's (or a's to its).

    Value: a lazy AgTensor of the larger shape.

    Example:
        >>> y = ag_mul(x, mask)              # mask (N, 1) scales each row of x (N, F)
    """
    x, y = _binary("ag_mul", a, b, True)
    return result(_MUL, (x, y), x.shape, (y.shape, x.shape))


def ag_sub(a: object, b: object) -> AgTensor:
    """Element-wise difference ``a - b``, with b broadcast to a's shape (numpy's rules).

    Arguments:
        a: an AgTensor (or a number/array when b is one).
        b: an AgTensor, number or array whose shape broadcasts to a's.

    Value: a lazy AgTensor of a's shape (of b's when a broadcasts to b).

    Example:
        >>> centred = ag_sub(x, ag_mean(x, dim=0))
    """
    if isinstance(a, AgTensor) and isinstance(b, AgTensor):
        floating(a, "ag_sub", "a"), floating(b, "ag_sub", "b")
        if a.shape == b.shape:
            return result(_SUB_SAME, (a, b), a.shape, (b.shape, a.shape))
        if broadcasts(a.shape, b.shape) and not broadcasts(b.shape, a.shape):
            return ag_add(ag_scale(b, -1.0), a)
    if not isinstance(a, AgTensor) and isinstance(b, AgTensor):  # a number or array minus an AgTensor
        return ag_add(ag_scale(b, -1.0), a)
    x, y = _binary("ag_sub", a, b, False)
    return ag_add(x, ag_scale(y, -1.0))   # ggml's SUB has no backward for a broadcast b; ADD has


_RECIP = Op("reciprocal", lambda b, xs, attrs: ggml_div(b.ctx, ggml_repeat(b.ctx, b.constant(np.ones(1)), xs[0]),
                                                        xs[0]))


def _div(a: object, c: object) -> AgTensor:
    if not isinstance(a, AgTensor):
        c = floating(tensor_arg(c, "ag_div", "b"), "ag_div", "b")
        return ag_mul(result(_RECIP, (c,), c.shape), a)
    if isinstance(c, AgTensor):
        return ag_mul(a, result(_RECIP, (floating(c, "ag_div", "b"),), c.shape))
    with np.errstate(divide="ignore", invalid="ignore"):   # x / 0 is inf (or nan), as numpy's
        return ag_mul(a, np.float32(1.0) / leaf_values(c, "ag_div(b)", integer=False))


def ag_scale(x: AgTensor, s: float) -> AgTensor:
    """``x * s`` for a number ``s`` fixed in the graph (a changing factor is better an ``ag_mul`` by a number).

    Arguments:
        x: an AgTensor.
        s: a finite number.

    Value: a lazy AgTensor of x's shape.

    Example:
        >>> half = ag_scale(x, 0.5)
    """
    x = floating(tensor_arg(x, "ag_scale"), "ag_scale")
    return result(_SCALE, (x,), x.shape, (float_arg("ag_scale", "s", s, finite=True),))


_SCALE = Op("scale", lambda b, xs, attrs: ggml_scale(b.ctx, xs[0], attrs[0]))


def _unary(name: str, fn: Callable[[Context, Tensor], Tensor], doc: str,
           example: str) -> tuple[Op, Callable[[AgTensor], AgTensor]]:
    op = Op(name, lambda b, xs, attrs: fn(b.ctx, xs[0]))

    def ag(x: AgTensor) -> AgTensor:
        x = floating(tensor_arg(x, f"ag_{name}"), f"ag_{name}")
        return result(op, (x,), x.shape)
    ag.__name__ = ag.__qualname__ = f"ag_{name}"
    ag.__doc__ = (f"{doc}\n\n    Arguments:\n        x: an AgTensor (numbers and arrays: make them with ag_tensor).\n\n"
                  "    Value: a lazy AgTensor of x's shape, differentiable.\n\n"
                  f"    Example:\n        >>> {example}\n    ")
    return op, ag


_RELU, ag_relu = _unary("relu", ggml_relu, "Rectified linear unit, element-wise: ``max(x, 0)`` (gradient 0 at 0).",
                        "h = ag_relu(x @ W.T)")
_SIGMOID, ag_sigmoid = _unary("sigmoid", ggml_sigmoid, "Logistic sigmoid, element-wise: ``1 / (1 + exp(-x))``.",
                              "p = ag_sigmoid(logits)")
_TANH, ag_tanh = _unary("tanh", ggml_tanh, "Hyperbolic tangent, element-wise.", "h = ag_tanh(x)")
_EXP, ag_exp = _unary("exp", ggml_exp, "Exponential, element-wise: ``e ** x``.", "y = ag_exp(x)")
_LOG, ag_log = _unary("log", ggml_log, "Natural logarithm, element-wise (NaN below 0, -inf at 0).",
                      "y = ag_log(p)")
_SOFTMAX, ag_softmax = _unary("softmax", ggml_soft_max, "Softmax over the last axis: each row's "
                              "``exp(x - max) / sum(exp(x - max))``.", "probs = ag_softmax(logits)  # (N, C)")


def ag_clamp(x: AgTensor, lo: float = -math.inf, hi: float = math.inf) -> AgTensor:
    """Clamp every element to ``[lo, hi]``; the gradient is 1 strictly inside, 0 outside.

    Arguments:
        x: an AgTensor.
        lo: the lower bound (default -inf).
        hi: the upper bound (default inf), at least lo.

    Value: a lazy AgTensor of x's shape.

    Example:
        >>> p = ag_clamp(p, 1e-7, 1 - 1e-7)
    """
    x = floating(tensor_arg(x, "ag_clamp"), "ag_clamp")
    for name, v in (("lo", lo), ("hi", hi)):
        if not is_real(v) or isinstance(v, bool) or math.isnan(float(v)):
            raise GgmlValueError(f"ag_clamp: {name} must be a number, got {v!r}")
    if float(lo) > float(hi):
        raise GgmlValueError(f"ag_clamp: lo ({lo}) is above hi ({hi})")
    return result(_CLAMP, (x,), x.shape, (max(float(lo), -3.4e38), min(float(hi), 3.4e38)))


_CLAMP = Op("clamp", lambda b, xs, attrs: ggml_clamp(b.ctx, xs[0], attrs[0], attrs[1]))


def ag_pow(x: AgTensor, p: float) -> AgTensor:
    """``x ** p`` element-wise for a number ``p``: exact for integer p (products), ``sqrt`` for 0.5, else
    ``exp(p * log(x))`` (NaN at x < 0, as for any non-integer power).

    Arguments:
        x: an AgTensor.
        p: a finite number.

    Value: a lazy AgTensor of x's shape.

    Example:
        >>> sq = ag_pow(x, 2)
    """
    x = floating(tensor_arg(x, "ag_pow"), "ag_pow")
    return result(_POW, (x,), x.shape, (float_arg("ag_pow", "p", p, finite=True),))


def _lower_pow(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
    x, p = xs[0], attrs[0]
    if p == 0.5:
        return ggml_sqrt(b.ctx, x)
    if p == int(p) and abs(p) > 64:   # |x|^p, with x's sign for an odd p (sgn has no gradient: it is flat)
        mag = ggml_exp(b.ctx, ggml_scale(b.ctx, ggml_log(b.ctx, ggml_abs(b.ctx, x)), p))
        return ggml_mul(b.ctx, mag, ggml_sgn(b.ctx, x)) if int(p) % 2 else mag
    if p == int(p):
        n = abs(int(p))
        if n == 0:
            return ggml_repeat(b.ctx, b.constant(np.ones(1)), x)
        out, base = None, x
        while n:   # square and multiply
            if n & 1:
                out = base if out is None else ggml_mul(b.ctx, out, base)
            n >>= 1
            if n:
                base = ggml_sqr(b.ctx, base)
        assert out is not None
        return out if p > 0 else ggml_div(b.ctx, ggml_repeat(b.ctx, b.constant(np.ones(1)), x), out)
    return ggml_exp(b.ctx, ggml_scale(b.ctx, ggml_log(b.ctx, x), p))


_POW = Op("pow", _lower_pow)


# ---------------------------------------------------------------- products and layout

def _lower_matmul(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
    a, c = xs
    a_shape, c_shape, out, half = attrs
    if len(c_shape) == 1:
        c_t = reshaped(b, c, (1, c_shape[0]))   # a vector is one row of B^T
    else:
        c_t = b.untransposed(c) or ggml_cont(b.ctx, ggml_permute(b.ctx, c, 1, 0, 2, 3))
    if half is not None:   # a half-precision weight: the product in its type, the gradient into the f32 master
        c_t = ggml_cast(b.ctx, c_t, half)
    if len(a_shape) == 1:
        a_t = reshaped(b, a, (1, a_shape[0]))
    elif len(c_shape) <= 2 and len(a_shape) > 2:   # one matrix for every row: a's leading axes fold into its rows
        a_t = reshaped(b, a, (int(np.prod(a_shape[:-1])), a_shape[-1]))
    else:
        a_t = a
    return reshaped(b, ggml_mul_mat(b.ctx, c_t, a_t), out)


_MATMUL = Op("matmul", _lower_matmul)


def ag_matmul(a: AgTensor, b: AgTensor) -> AgTensor:
    """Matrix product ``a @ b`` (numpy's): ``(..., n, k) @ (..., k, m)`` is ``(..., n, m)``; a 1-D operand is a
    vector; leading (batch) axes of b broadcast to a's.

    Arguments:
        a: an AgTensor of 1 to 4 dimensions.
        b: an AgTensor whose second-to-last axis (its only one, for a vector) is a's last.

    Value: a lazy AgTensor. ``x @ W.T`` multiplies by W without a transposed copy.

    Example:
        >>> y = ag_matmul(x, W.T)            # x (N, in), W (out, in): (N, out)
    """
    a = floating(tensor_arg(a, "ag_matmul", "a"), "ag_matmul", "a")
    b = floating(operand(b, a, "ag_matmul", "b"), "ag_matmul", "b")
    if not a.shape or not b.shape:
        raise GgmlValueError("ag_matmul: 0-d operands have no product; use ag_mul or ag_scale")
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:
        raise GgmlValueError(f"ag_matmul: a {a.shape} @ b {b.shape}: a's last axis ({k_a}) must equal b's "
                             f"{'only' if b.ndim == 1 else 'second-to-last'} axis ({k_b})")
    lead_a, lead_b = a.shape[:-2], b.shape[:-2]
    if b.ndim > 2 and (len(lead_b) > len(lead_a) or any(
            db not in (1, da) or (da % db) for da, db in zip(reversed(lead_a), reversed(lead_b)))):
        raise GgmlValueError(f"ag_matmul: the batch axes of b {b.shape} must broadcast to a's {a.shape}")
    if b.ndim > 2 and any(db == 1 and da > 1 for da, db in zip(reversed(lead_a), reversed(lead_b))) and len(lead_a) > 1:
        raise GgmlValueError(f"ag_matmul: b {b.shape} broadcast over a {a.shape}'s outer batch axis has no "
                             "gradient in ggml; repeat b to a's batch axes")
    out = a.shape[:-1] + (() if b.ndim == 1 else (b.shape[-1],))
    return result(_MATMUL, (a, b), out, (a.shape, b.shape, out, _half_weight(b)))


def _half_weight(b: AgTensor) -> int | None:
    """The ggml type of the product when ``b`` (or the matrix it transposes) is a parameter of dtype f16/bf16 and
    its device computes that type's products (else None: F32)."""
    w = b.inputs[0] if b.op is _TRANSPOSE and b.ndim == 2 else b
    if w.op is not None or w.storage is None or w.dtype not in ("f16", "bf16"):
        return None
    kind = DTYPES[w.dtype]
    return kind if device_computes_half_products(w.engine.backend.device, kind) else None


def _lower_linear(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
    x, w = xs[0], xs[1]
    x_shape, out, half = attrs
    rows = int(np.prod(x_shape[:-1])) if len(x_shape) > 1 else 1
    if half is not None:
        w = ggml_cast(b.ctx, w, half)
    y = ggml_mul_mat(b.ctx, w, reshaped(b, x, (rows, x_shape[-1])))
    if len(xs) > 2:
        y = ggml_add(b.ctx, y, xs[2])
    return reshaped(b, y, out)


_LINEAR = Op("linear", _lower_linear)


def linear(x: AgTensor, w: AgTensor, bias: AgTensor | None, fn: str) -> AgTensor:
    """``x @ w.T + bias`` as one op (the layers' product: ggml multiplies by ``w`` as it is stored, no transpose);
    ``w`` (out, in), ``bias`` (out,) or None, x (..., in)."""
    x = floating(tensor_arg(x, fn), fn)
    if not x.shape or x.shape[-1] != w.shape[1]:
        raise GgmlValueError(f"{fn}: expected x with {w.shape[1]} features in its last axis, got shape {x.shape}")
    out = x.shape[:-1] + (w.shape[0],)
    ins = (x, w) if bias is None else (x, w, bias)
    return result(_LINEAR, ins, out, (x.shape, out, _half_weight(w)))


def _lower_transpose(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
    nd, i, j = attrs
    axes = [0, 1, 2, 3]
    gi, gj = nd - 1 - i, nd - 1 - j     # numpy axis k is ggml axis nd-1-k
    axes[gi], axes[gj] = gj, gi
    t = ggml_cont(b.ctx, ggml_permute(b.ctx, xs[0], *axes))
    if nd == 2:
        b.note_transpose(t, xs[0])  # a product by this transpose multiplies by the original instead
    return t


_TRANSPOSE = Op("transpose", _lower_transpose)


def ag_transpose(x: AgTensor, dim0: int = -2, dim1: int = -1) -> AgTensor:
    """Swap two axes (by default the last two: a matrix's transpose; ``x.T`` too).

    Arguments:
        x: an AgTensor of at least 2 dimensions (a 1-D one is returned as is).
        dim0: the first axis (numpy's numbering, negative from the end).
        dim1: the second axis.

    Value: a lazy AgTensor with the two axes swapped.

    Example:
        >>> y = ag_transpose(x)              # (N, F) -> (F, N)
    """
    x = tensor_arg(x, "ag_transpose")
    if x.ndim < 2:
        return x
    floating(x, "ag_transpose")   # ggml copies floating-point tensors only
    i, j = (_axis(d, x.ndim, "ag_transpose", n) for d, n in ((dim0, "dim0"), (dim1, "dim1")))
    if i == j:
        return x
    shape = list(x.shape)
    shape[i], shape[j] = shape[j], shape[i]
    return result(_TRANSPOSE, (x,), tuple(shape), (x.ndim, i, j))


def _axis(d: object, nd: int, fn: str, what: str = "dim") -> int:
    if not is_int(d) or not -nd <= int(d) < nd:
        raise GgmlValueError(f"{fn}: {what} must be an axis of a {nd}-d tensor ({-nd} to {nd - 1}), got {d!r}")
    return int(d) % nd


_RESHAPE = Op("reshape", lambda b, xs, attrs: reshaped(b, xs[0], attrs[0]))


def ag_reshape(x: AgTensor, shape: int | Sequence[int]) -> AgTensor:
    """The same elements in another shape (C order, numpy's ``reshape``; one axis may be -1).

    Arguments:
        x: an AgTensor.
        shape: a tuple of sizes (or one int) with x's element count, at most 4 axes.

    Value: a lazy AgTensor of that shape.

    Example:
        >>> flat = ag_reshape(images, (n, -1))
    """
    x = tensor_arg(x, "ag_reshape")
    given: list[object] = [shape] if is_int(shape) else list(shape) if isinstance(shape, (tuple, list)) else []
    dims = tuple(int(d) for d in given if is_int(d))
    if not (is_int(shape) or isinstance(shape, (tuple, list))) or len(dims) != len(given) or len(dims) > 4:
        raise GgmlValueError(f"ag_reshape: shape must be up to 4 ints, got {shape!r}")
    if sum(1 for d in dims if d == -1) > 1 or any(d < -1 or d == 0 for d in dims):
        raise GgmlValueError(f"ag_reshape: sizes must be >= 1, with at most one -1; got {shape!r}")
    known_n = math.prod(int(d) for d in dims if d != -1)
    if -1 in dims:
        if known_n == 0 or x.size % known_n:
            raise GgmlValueError(f"ag_reshape: {x.size} elements of {x.shape} do not fill {dims}")
        dims = tuple(x.size // known_n if d == -1 else int(d) for d in dims)
    if math.prod(int(d) for d in dims) != x.size:
        raise GgmlValueError(f"ag_reshape: shape {dims} holds {math.prod(int(d) for d in dims)} elements, x "
                             f"{x.shape} has {x.size}")
    return result(_RESHAPE, (x,), tuple(int(d) for d in dims), (tuple(int(d) for d in dims),), x.dtype)


# ---------------------------------------------------------------- reductions

def _lower_sum(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
    shape, axis, keep, scale = attrs
    x = xs[0]
    if axis is None:
        t = ggml_sum(b.ctx, x)
    else:
        nd = len(shape)
        g = nd - 1 - axis
        if g:
            axes = [0, 1, 2, 3]
            axes[0], axes[g] = g, 0
            x = ggml_cont(b.ctx, ggml_permute(b.ctx, x, *axes))
        t = ggml_sum_rows(b.ctx, x)
    if scale != 1.0:
        t = ggml_scale(b.ctx, t, scale)
    out = () if axis is None else tuple(1 if k == axis else d for k, d in enumerate(shape))
    if axis is not None and axis != len(shape) - 1:   # the summed axis went to ne0; put the others back
        order = list(range(len(shape)))
        order[axis], order[-1] = order[-1], order[axis]
        perm_shape = tuple(shape[k] if k != axis else 1 for k in order)
        t = reshaped(b, t, perm_shape)
        t = _lower_transpose(b, [t], (len(shape), axis, len(shape) - 1)) if len(shape) > 1 else t
    del keep
    return reshaped(b, t, out)


_SUM = Op("sum", _lower_sum)


def _reduce(fn: str, x: object, dim: object, keepdim: bool, mean: bool) -> AgTensor:
    x = floating(tensor_arg(x, fn), fn)
    if dim is None:
        out: NpShape = tuple(1 for _ in x.shape) if keepdim else ()
        return result(_SUM, (x,), out, (x.shape, None, bool(keepdim), 1.0 / x.size if mean else 1.0))
    axis = _axis(dim, max(x.ndim, 1), fn)
    if x.ndim == 0:
        return x
    n = x.shape[axis]
    kept = tuple(1 if k == axis else d for k, d in enumerate(x.shape))
    t = result(_SUM, (x,), kept, (x.shape, axis, True, 1.0 / n if mean else 1.0))
    return t if keepdim else _squeeze(t, x.shape[:axis] + x.shape[axis + 1:])


_SQUEEZE = Op("squeeze", lambda b, xs, attrs: reshaped(b, xs[0], attrs[0]))


def _squeeze(t: AgTensor, shape: NpShape) -> AgTensor:
    return result(_SQUEEZE, (t,), shape, (shape,))


def ag_sum(x: AgTensor, dim: int | None = None, keepdim: bool = False) -> AgTensor:
    """Sum of all elements (a 0-d scalar) or along one axis.

    Arguments:
        x: an AgTensor.
        dim: the numpy axis to sum over (R's ``dim=1`` is 0, ``dim=2`` is 1); None: every element.
        keepdim: keep the summed axis with size 1.

    Value: a lazy AgTensor.

    Example:
        >>> per_sample = ag_sum(x, dim=1)    # (N, F) -> (N,)
    """
    return _reduce("ag_sum", x, dim, keepdim, False)


def ag_mean(x: AgTensor, dim: int | None = None, keepdim: bool = False) -> AgTensor:
    """Mean of all elements (a 0-d scalar) or along one axis.

    Arguments:
        x: an AgTensor.
        dim: the numpy axis to average over; None: every element.
        keepdim: keep the averaged axis with size 1.

    Value: a lazy AgTensor.

    Example:
        >>> mu = ag_mean(x, dim=0)           # feature means of a batch (N, F) -> (F,)
    """
    return _reduce("ag_mean", x, dim, keepdim, True)


# ---------------------------------------------------------------- the operators of AgTensor

OPERATORS.update({
    "add": ag_add, "sub": ag_sub, "rsub": lambda a, o: ag_sub(o, a), "mul": ag_mul, "div": _div,
    "rdiv": lambda a, o: _div(o, a),
    "matmul": ag_matmul, "rmatmul": lambda a, o: ag_matmul(operand(o, a, "ag_matmul", "a"), a), "pow": ag_pow,
    "neg": lambda a: ag_scale(a, -1.0), "transpose": ag_transpose,
})
