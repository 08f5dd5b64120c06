"""ONNX's arithmetic: element-wise operators with numpy broadcasting, activations, softmax, matrix products (MatMul,
Gemm), reductions, and the comparisons and selections that masks use."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..ops import activation as A
from ..ops import elementwise as E
from ..ops.activation import ggml_floor, ggml_gelu_erf
from ..ops.conv import GGML_OP_POOL_MAX as POOL_MAX
from ..ops.conv import ggml_pool_1d
from ..ops.elementwise import ggml_gelu, ggml_leaky_relu, ggml_soft_max
from ..ops.layout import ggml_permute
from ..ops.linalg import ggml_mul_mat
from ..ops.reduce import ggml_sum_rows
from .operators_activations import elu, softplus
from .registry import axis_of, const_arg, op
from .values import Build, Value


# ---------------------------------------------------------------- element-wise
def _shape(*vs: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in np.broadcast_shapes(*(v.shape for v in vs)))


def _fold_binary(fn):
    return lambda node, xs, opset: [fn(*[np.asarray(x) for x in xs])]


def _int_div(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(a / b).astype(np.result_type(a, b))
    return a / b


BINARY: dict[str, tuple[Callable, Callable]] = {
    "Add": (E.ggml_add, np.add), "Sub": (E.ggml_sub, np.subtract), "Mul": (E.ggml_mul, np.multiply),
    "Div": (E.ggml_div, _int_div)}


def _binary(b: Build, node, xs, opset):
    fn = BINARY[node.op][0]
    x, y = xs
    shape = _shape(x, y)
    b.check_rank(shape)
    a = b.broadcast(x, shape)
    other = b.tensor(y) if len(y.shape) <= len(shape) else b.broadcast(y, shape)
    if y.shape != shape:   # ggml repeats its second operand when each of its sizes divides the first's
        padded = (1,) * (len(shape) - len(y.shape)) + y.shape
        other = b.reshaped(y, padded)
    return [Value(shape, fn(b.ctx, a, other))]


for _name, (_, _np) in BINARY.items():
    op(_name, fold=_fold_binary(_np))(_binary)


UNARY: dict[str, tuple[Callable, Callable]] = {
    "Relu": (E.ggml_relu, lambda x: np.maximum(x, 0)), "Sigmoid": (E.ggml_sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "Tanh": (E.ggml_tanh, np.tanh), "Exp": (E.ggml_exp, np.exp), "Log": (E.ggml_log, np.log),
    "Abs": (E.ggml_abs, np.abs), "Neg": (E.ggml_neg, np.negative), "Sqrt": (E.ggml_sqrt, np.sqrt),
    "Floor": (A.ggml_floor, np.floor), "Ceil": (A.ggml_ceil, np.ceil), "Sin": (E.ggml_sin, np.sin),
    "Cos": (E.ggml_cos, np.cos)}


def _unary(b: Build, node, xs, opset):
    return [Value(xs[0].shape, UNARY[node.op][0](b.ctx, b.tensor(xs[0])))]


for _name, (_, _np1) in UNARY.items():
    op(_name, fold=(lambda f: lambda node, xs, opset: [f(np.asarray(xs[0]))])(_np1))(_unary)


@op("Identity", "Dropout", attrs=("ratio", "seed", "training_mode"))
def _identity(b: Build, node, xs, opset):
    outs = [xs[0]]
    if node.op == "Dropout" and (int(node.attrs.get("training_mode", 0)) or len(xs) > 2 and xs[2] is not None and (
            not xs[2].known or bool(np.asarray(xs[2].const).reshape(-1)[0]))):
        raise b.fail("Dropout in training mode (or with a training_mode input not known to be false) is not "
                     "supported: the importer runs inference")
    if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:   # inference: the mask is all ones
        outs.append(Value.of(np.ones(xs[0].shape, bool)))
    return outs


@op("LeakyRelu", attrs=("alpha",))
def _leaky_relu(b: Build, node, xs, opset):
    return [Value(xs[0].shape, ggml_leaky_relu(b.ctx, b.tensor(xs[0]), float(node.attrs.get("alpha", 0.01))))]


@op("Elu", attrs=("alpha",))
def _elu(b: Build, node, xs, opset):
    alpha, x = float(node.attrs.get("alpha", 1.0)), b.tensor(xs[0])
    return [Value(xs[0].shape, E.ggml_elu(b.ctx, x) if alpha == 1.0 else elu(b, x, alpha))]


@op("Gelu", attrs=("approximate",), since=20)
def _gelu(b: Build, node, xs, opset):
    approx = node.attrs.get("approximate", "none")
    fn = ggml_gelu if approx == "tanh" else ggml_gelu_erf
    return [Value(xs[0].shape, fn(b.ctx, b.tensor(xs[0])))]


@op("Softplus")
def _softplus(b: Build, node, xs, opset):
    return [Value(xs[0].shape, softplus(b, b.tensor(xs[0])))]


@op("HardSigmoid", attrs=("alpha", "beta"))
def _hard_sigmoid(b: Build, node, xs, opset):
    alpha, beta = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    y = E.ggml_scale_bias(b.ctx, b.tensor(xs[0]), alpha, beta)
    return [Value(xs[0].shape, E.ggml_clamp(b.ctx, y, 0.0, 1.0))]


# Abramowitz and Stegun 7.1.26: |error| < 1.5e-7 for every x
_ERF_P, _ERF_A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


@op("Erf", fold=lambda node, xs, opset: [np.vectorize(math.erf)(np.asarray(xs[0], np.float64)).astype(np.float32)])
def _erf(b: Build, node, xs, opset):
    """erf from ggml's ops: sign(x) (1 - poly(t) exp(-x^2)), t = 1 / (1 + p|x|) (within 1.5e-7)."""
    ctx, x = b.ctx, b.tensor(xs[0])
    ax = E.ggml_abs(ctx, x)
    one_plus = E.ggml_scale_bias(ctx, ax, _ERF_P, 1.0)
    t = E.ggml_div(ctx, E.ggml_div(ctx, one_plus, one_plus), one_plus)   # 1 / (1 + p|x|), no constant needed
    poly = E.ggml_scale(ctx, t, _ERF_A[4])
    for coef in reversed(_ERF_A[:4]):
        poly = E.ggml_mul(ctx, E.ggml_scale_bias(ctx, poly, 1.0, coef), t)
    decay = E.ggml_exp(ctx, E.ggml_neg(ctx, E.ggml_sqr(ctx, x)))
    magnitude = E.ggml_scale_bias(ctx, E.ggml_mul(ctx, poly, decay), -1.0, 1.0)
    sign = E.ggml_scale_bias(ctx, E.ggml_step(ctx, x), 2.0, -1.0)
    return [Value(xs[0].shape, E.ggml_mul(ctx, magnitude, sign))]


@op("Pow", fold=_fold_binary(np.power), numbers=(1,))
def _pow(b: Build, node, xs, opset):
    """A known exponent: by products (1, 2, 3), sqrt (0.5), ones (0), or |x|^p with the sign of x for odd integer p
    (negative bases give real results for integer exponents); a computed one: exp(y log x), bases > 0."""
    x, y = xs
    shape = _shape(x, y)
    if y.known and np.asarray(y.const).size == 1:
        p = float(np.asarray(y.const).reshape(()))
        t = b.broadcast(x, shape)
        if p == 0:
            return [Value(shape, E.ggml_scale_bias(b.ctx, t, 0.0, 1.0))]
        simple = {1.0: lambda: t, 2.0: lambda: E.ggml_sqr(b.ctx, t), 0.5: lambda: E.ggml_sqrt(b.ctx, t),
                  3.0: lambda: E.ggml_mul(b.ctx, E.ggml_sqr(b.ctx, t), t)}
        if p in simple:
            return [Value(shape, simple[p]())]
        mag = E.ggml_exp(b.ctx, E.ggml_scale(b.ctx, E.ggml_log(b.ctx, E.ggml_abs(b.ctx, t)), p))
        if p == int(p) and int(p) % 2:   # odd: the base's sign (+ for 0: 0^p is 0, or +inf for p < 0)
            sign = E.ggml_scale_bias(b.ctx, E.ggml_step(b.ctx, E.ggml_neg(b.ctx, t)), -2.0, 1.0)
            mag = E.ggml_mul(b.ctx, mag, sign)
        return [Value(shape, mag)]
    return [Value(shape, E.ggml_exp(b.ctx, E.ggml_mul(b.ctx, E.ggml_log(b.ctx, b.broadcast(x, shape)),
                                                     b.broadcast(y, shape))))]


@op("Clip", attrs=("min", "max"), static=(1, 2), fold=lambda node, xs, opset: [np.clip(
    xs[0], node.attrs.get("min", -np.inf) if len(xs) < 2 or xs[1] is None else xs[1],
    node.attrs.get("max", np.inf) if len(xs) < 3 or xs[2] is None else xs[2])])
def _clip(b: Build, node, xs, opset):
    lo = node.attrs.get("min", -3.4e38) if len(xs) < 2 or xs[1] is None else float(const_arg(b, xs[1], "min"))
    hi = node.attrs.get("max", 3.4e38) if len(xs) < 3 or xs[2] is None else float(const_arg(b, xs[2], "max"))
    lo = min(float(lo), float(hi))   # min > max: every value becomes max, as numpy's clip
    return [Value(xs[0].shape, E.ggml_clamp(b.ctx, b.tensor(xs[0]), float(lo), float(hi)))]


def _max_min(b: Build, node, xs, opset):
    out = xs[0]
    for y in xs[1:]:
        shape = _shape(out, y)
        a, c = b.broadcast(out, shape), b.broadcast(y, shape)
        d = E.ggml_relu(b.ctx, E.ggml_sub(b.ctx, c, a) if node.op == "Max" else E.ggml_sub(b.ctx, a, c))
        out = Value(shape, E.ggml_add(b.ctx, a, d) if node.op == "Max" else E.ggml_sub(b.ctx, a, d))
    return [out]


op("Max", fold=lambda node, xs, opset: [np.maximum.reduce(np.broadcast_arrays(*xs))])(_max_min)
op("Min", fold=lambda node, xs, opset: [np.minimum.reduce(np.broadcast_arrays(*xs))])(_max_min)


@op("Sum", "Mean", fold=lambda node, xs, opset: [sum(np.asarray(x) for x in xs) /
                                                  (len(xs) if node.op == "Mean" else 1)])
def _sum_mean(b: Build, node, xs, opset):
    shape = _shape(*xs)
    out = b.broadcast(xs[0], shape)
    for y in xs[1:]:
        out = E.ggml_add(b.ctx, out, b.broadcast(y, shape))
    return [Value(shape, E.ggml_scale(b.ctx, out, 1.0 / len(xs)) if node.op == "Mean" else out)]


# ---------------------------------------------------------------- comparisons and selection (0/1 as float)
def _compare(b: Build, node, xs, opset):
    x, y = xs
    shape = _shape(x, y)
    a, c = b.broadcast(x, shape), b.broadcast(y, shape)
    if node.op == "Greater":
        out = E.ggml_step(b.ctx, E.ggml_sub(b.ctx, a, c))
    elif node.op == "Less":
        out = E.ggml_step(b.ctx, E.ggml_sub(b.ctx, c, a))
    else:   # Equal: neither greater nor less
        above, below = E.ggml_step(b.ctx, E.ggml_sub(b.ctx, a, c)), E.ggml_step(b.ctx, E.ggml_sub(b.ctx, c, a))
        both = E.ggml_add(b.ctx, above, below)
        out = E.ggml_scale_bias(b.ctx, both, -1.0, 1.0)
    return [Value(shape, out, dtype=np.dtype(np.bool_))]


for _name, _np2 in (("Greater", np.greater), ("Less", np.less), ("Equal", np.equal)):
    op(_name, fold=_fold_binary(_np2))(_compare)


@op("Not", fold=lambda node, xs, opset: [np.logical_not(xs[0])])
def _not(b: Build, node, xs, opset):
    return [Value(xs[0].shape, E.ggml_scale_bias(b.ctx, b.tensor(xs[0]), -1.0, 1.0), dtype=np.dtype(np.bool_))]


@op("Where", fold=lambda node, xs, opset: [np.where(*xs)])
def _where(b: Build, node, xs, opset):
    """cond * x + (1 - cond) * y, each term exact (cond 0 or 1). A known branch's infinities (an attention mask's
    -inf) would make 0 * inf = NaN: they enter as log(0) = -inf where they are chosen, 0 elsewhere."""
    cond, x, y = xs
    shape = _shape(cond, x, y)
    c = b.broadcast(cond, shape)
    keep = {"x": c, "y": E.ggml_scale_bias(b.ctx, c, -1.0, 1.0)}   # 1 where each branch is chosen
    out = None
    for name, v in (("x", x), ("y", y)):
        if v.known and not np.isfinite(np.asarray(v.const, np.float64)).all():
            arr = np.broadcast_to(np.asarray(v.const, np.float64), shape)
            finite = Value.of(np.where(np.isfinite(arr), arr, 0.0).astype(np.float32))
            term = E.ggml_mul(b.ctx, keep[name], b.tensor(finite))
            for sign in (1.0, -1.0):   # log(1 - chosen * [v == sign * inf]): -inf exactly there, else 0
                hits = (arr == sign * np.inf).astype(np.float32)
                if hits.any():
                    picked = E.ggml_mul(b.ctx, keep[name], b.tensor(Value.of(hits)))
                    inf = E.ggml_log(b.ctx, E.ggml_scale_bias(b.ctx, picked, -1.0, 1.0))
                    term = E.ggml_add(b.ctx, term, inf if sign < 0 else E.ggml_neg(b.ctx, inf))
        else:
            term = E.ggml_mul(b.ctx, keep[name], b.broadcast(v, shape))
        out = term if out is None else E.ggml_add(b.ctx, out, term)
    return [Value(shape, out)]


# ---------------------------------------------------------------- softmax
def _to_last(b: Build, t, rank: int, axis: int):
    """``t`` with ONNX axis ``axis`` moved to ggml's ne0 (and the permutation that moves it back)."""
    g = rank - 1 - axis     # the axis in ggml's order
    if g == 0:
        return t, None
    order = [0, 1, 2, 3]
    order[0], order[g] = g, 0
    return E.ggml_cont(b.ctx, ggml_permute(b.ctx, t, *order)), order


def _softmax(b: Build, node, xs, opset):
    x = xs[0]
    rank = len(x.shape)
    axis = axis_of(b, node.attrs.get("axis", -1 if opset >= 13 else 1), rank)
    log = node.op == "LogSoftmax"
    if opset < 13:   # the input as a matrix [prod(shape[:axis]), prod(shape[axis:])], softmax over its rows
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        t = b.reshaped(x, (rows, int(np.prod(x.shape[axis:], dtype=np.int64))))
        y = ggml_soft_max(b.ctx, t)
        y = E.ggml_log(b.ctx, y) if log else y
        return [Value(x.shape, b.reshaped(Value((rows, y.shape[0]), y), x.shape))]
    t, order = _to_last(b, b.tensor(x), max(rank, 1), axis)
    y = ggml_soft_max(b.ctx, t)
    y = E.ggml_log(b.ctx, y) if log else y
    if order is not None:
        y = E.ggml_cont(b.ctx, ggml_permute(b.ctx, y, *order))
    return [Value(x.shape, y)]


op("Softmax", "LogSoftmax", attrs=("axis",))(_softmax)


# ---------------------------------------------------------------- matrix products
@op("MatMul", fold=lambda node, xs, opset: [np.matmul(*xs)])
def _matmul(b: Build, node, xs, opset):
    x, y = xs
    xs_, ys_ = x.shape, y.shape
    a_shape = (1,) + xs_ if len(xs_) == 1 else xs_
    b_shape = ys_ + (1,) if len(ys_) == 1 else ys_
    batch = tuple(int(d) for d in np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    if b_shape[-2] != k:
        raise b.fail(f"MatMul of shapes {xs_} and {ys_}: inner sizes {k} and {b_shape[-2]} differ")
    out_shape = batch + (m, n)
    b.check_rank(out_shape)
    bt = _transposed(b, y, node.inputs[1], b_shape, batch)                       # ggml [K, N, batch...]
    a = b.broadcast(Value(a_shape, b.reshaped(x, a_shape)), batch + (m, k)) if a_shape[:-2] != batch else \
        b.reshaped(x, a_shape)
    out = ggml_mul_mat(b.ctx, bt, b.contiguous(a))                              # [N, M, batch...]
    dropped = {len(out_shape) - 2} if len(xs_) == 1 else set()   # numpy drops a 1-D operand's added axis
    dropped |= {len(out_shape) - 1} if len(ys_) == 1 else set()
    shape = tuple(d for i, d in enumerate(out_shape) if i not in dropped)
    return [Value(shape, out if shape == out_shape else b.reshaped(Value(out_shape, out), shape))]


def _transposed(b: Build, y: Value, name: str, shape: tuple[int, ...], batch: tuple[int, ...]):
    """The second operand of ``A @ B`` as ggml's ``mul_mat`` takes it: B transposed, ggml [K, N, batch...]; a 2-D
    weight from the device's memory as the model loaded it (transposed once, at load)."""
    if len(shape) == 2 and name in b.weights_t:
        return b.weights_t[name]
    if y.known:
        arr = np.swapaxes(np.asarray(y.const, np.float32).reshape(shape), -1, -2)
        arr = np.broadcast_to(arr, batch + arr.shape[-2:]) if shape[:-2] != batch and len(shape) > 2 else arr
        return b.tensor(Value.of(np.ascontiguousarray(arr)))
    t = b.reshaped(y, shape)
    order = [1, 0, 2, 3]
    tt = E.ggml_cont(b.ctx, ggml_permute(b.ctx, t, *order))
    if shape[:-2] != batch:
        tt = b.broadcast(Value(shape[:-2] + (shape[-1], shape[-2]), tt), batch + (shape[-1], shape[-2]))
    return tt


@op("Gemm", attrs=("alpha", "beta", "transA", "transB"),
    fold=lambda node, xs, opset: [float(node.attrs.get("alpha", 1.0)) *
                                  (xs[0].T if node.attrs.get("transA", 0) else xs[0]) @
                                  (xs[1].T if node.attrs.get("transB", 0) else xs[1]) +
                                  (0 if len(xs) < 3 or xs[2] is None else float(node.attrs.get("beta", 1.0)) * xs[2])])
def _gemm(b: Build, node, xs, opset):
    a, w = xs[0], xs[1]
    c = xs[2] if len(xs) > 2 else None
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    if len(a.shape) != 2 or len(w.shape) != 2:
        raise b.fail(f"Gemm takes matrices, got shapes {a.shape} and {w.shape}")
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    n = w.shape[0] if tb else w.shape[1]
    at = b.tensor(a)
    if ta:
        at = E.ggml_cont(b.ctx, ggml_permute(b.ctx, at, 1, 0, 2, 3))
    if tb:   # B given as [N, K] (numpy): ggml [K, N] is what mul_mat takes
        bt = b.weights[node.inputs[1]] if node.inputs[1] in b.weights else b.tensor(w)
    else:
        bt = _transposed(b, w, node.inputs[1], w.shape, ())
    y = ggml_mul_mat(b.ctx, bt, at)     # [N, M]
    if alpha != 1.0:
        y = E.ggml_scale(b.ctx, y, alpha)
    if c is not None:
        cv = c if beta == 1.0 else (Value.of(np.asarray(c.const) * beta) if c.known else
                                   Value(c.shape, E.ggml_scale(b.ctx, b.tensor(c), beta)))
        padded = (1,) * (2 - len(cv.shape)) + cv.shape
        y = E.ggml_add(b.ctx, y, b.reshaped(cv, padded))
    return [Value((m, n), y)]


# ---------------------------------------------------------------- reductions
REDUCTIONS = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min,
              "ReduceProd": np.prod,
              "ReduceL1": lambda x, **k: np.sum(np.abs(x), **k),
              "ReduceL2": lambda x, **k: np.sqrt(np.sum(np.square(x), **k)),
              "ReduceSumSquare": lambda x, **k: np.sum(np.square(x), **k),
              "ReduceLogSum": lambda x, **k: np.log(np.sum(x, **k)),
              "ReduceLogSumExp": lambda x, **k: np.log(np.sum(np.exp(x), **k))}


# with noop_with_empty_axes and no axes, the element-wise part of a reduction is still applied
NOOP_PARTS = {"ReduceL1": (E.ggml_abs, np.abs), "ReduceL2": (E.ggml_abs, np.abs),
              "ReduceSumSquare": (E.ggml_sqr, np.square), "ReduceLogSum": (E.ggml_log, np.log)}


def _reduce_fold(node, xs, opset):
    fn = REDUCTIONS[node.op]
    axes = _axes_attr(node, xs, opset)
    keep = bool(node.attrs.get("keepdims", 1))
    if axes is None:
        if node.attrs.get("noop_with_empty_axes", 0):   # no reduction; the element-wise part stays (ONNX's reference)
            return [NOOP_PARTS.get(node.op, (None, lambda x: x))[1](np.asarray(xs[0]))]
        return [fn(xs[0], keepdims=keep)]
    return [fn(xs[0], axis=tuple(int(a) for a in axes), keepdims=keep)]


def _axes_attr(node, xs, opset):
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(xs) > 1 and xs[1] is not None:
        arr = np.asarray(xs[1] if not isinstance(xs[1], Value) else xs[1].const).reshape(-1)
        return list(arr) if arr.size else None
    return None


def _reduce(b: Build, node, xs, opset):
    x = xs[0]
    rank = len(x.shape)
    if len(xs) > 1 and xs[1] is not None:
        const_arg(b, xs[1], "axes")
    axes = _axes_attr(node, [x] + [None if v is None else v for v in xs[1:]], opset)
    if axes is None and node.attrs.get("noop_with_empty_axes", 0):
        part = NOOP_PARTS.get(node.op)
        return [x if part is None else Value(x.shape, part[0](b.ctx, b.tensor(x)))]
    axes = sorted({axis_of(b, a, rank) for a in (range(rank) if axes is None else axes)})
    keep = bool(node.attrs.get("keepdims", 1))
    kept = [i for i in range(rank) if i not in axes]
    moved = kept + axes
    t = b.tensor(x)
    if moved != list(range(rank)):
        from .operators_shape import transpose_tensor
        t = transpose_tensor(b, t, rank, moved)
    rows = int(np.prod([x.shape[i] for i in kept], dtype=np.int64))
    size = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    flat = b.reshaped(Value(tuple(x.shape[i] for i in moved), t), (rows, size))
    r = _reduced(b, node.op, flat, size)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else tuple(x.shape[i] for i in kept)
    return [Value(shape, b.reshaped(Value((rows, 1), r), shape))]


def _reduced(b: Build, name: str, flat, size: int):
    """Each row of ``flat`` (``[size, rows]``) reduced to one value."""
    ctx = b.ctx
    if name == "ReduceMax":
        return ggml_pool_1d(ctx, flat, POOL_MAX, size, size, 0)
    if name == "ReduceMin":
        return E.ggml_neg(ctx, ggml_pool_1d(ctx, E.ggml_neg(ctx, flat), POOL_MAX, size, size, 0))
    if name == "ReduceLogSumExp":   # the row's maximum taken out first (finite: no inf - inf): no overflow
        top = E.ggml_clamp(ctx, ggml_pool_1d(ctx, flat, POOL_MAX, size, size, 0), -3.4028234e38, 3.4028234e38)
        total = ggml_sum_rows(ctx, E.ggml_exp(ctx, E.ggml_sub(ctx, flat, top)))
        return E.ggml_add(ctx, E.ggml_log(ctx, total), top)
    if name == "ReduceProd":   # exp(sum log|x|) (0 where a factor is 0), with the sign of the negatives' count
        magnitude = E.ggml_exp(ctx, ggml_sum_rows(ctx, E.ggml_log(ctx, E.ggml_abs(ctx, flat))))
        negatives = ggml_sum_rows(ctx, E.ggml_step(ctx, E.ggml_neg(ctx, flat)))
        odd = E.ggml_sub(ctx, negatives, E.ggml_scale(ctx, ggml_floor(ctx, E.ggml_scale(ctx, negatives, 0.5)), 2.0))
        return E.ggml_mul(ctx, magnitude, E.ggml_scale_bias(ctx, odd, -2.0, 1.0))
    pre = {"ReduceL1": E.ggml_abs, "ReduceL2": E.ggml_sqr, "ReduceSumSquare": E.ggml_sqr}.get(name)
    r = ggml_sum_rows(ctx, pre(ctx, flat) if pre else flat)
    if name == "ReduceMean":
        return E.ggml_scale(ctx, r, 1.0 / size)
    post = {"ReduceL2": E.ggml_sqrt, "ReduceLogSum": E.ggml_log}.get(name)
    return post(ctx, r) if post else r


op(*REDUCTIONS, attrs=("axes", "keepdims", "noop_with_empty_axes"), fold=_reduce_fold, static=(1,))(_reduce)


@op("Mod", attrs=("fmod",), fold=lambda node, xs, opset: [np.fmod(xs[0], xs[1]) if node.attrs.get("fmod", 0)
                                                          else np.mod(xs[0], xs[1])])
def _mod(b: Build, node, xs, opset):
    """x - y floor(x / y) (numpy's mod), or x - y trunc(x / y) with fmod=1."""
    x, y = xs
    shape = _shape(x, y)
    a, c = b.broadcast(x, shape), b.broadcast(y, shape)
    q = E.ggml_div(b.ctx, a, c)
    if node.attrs.get("fmod", 0):
        sign = E.ggml_scale_bias(b.ctx, E.ggml_step(b.ctx, E.ggml_neg(b.ctx, q)), -2.0, 1.0)
        whole = E.ggml_mul(b.ctx, ggml_floor(b.ctx, E.ggml_abs(b.ctx, q)), sign)
    else:
        whole = ggml_floor(b.ctx, q)
    return [Value(shape, E.ggml_sub(b.ctx, a, E.ggml_mul(b.ctx, c, whole)))]
