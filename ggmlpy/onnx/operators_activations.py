"""More of ONNX's element-wise operators: the activations beyond the common ones (Swish and ggmlR's Silu, HardSwish,
Mish, Selu, Celu, PRelu, ThresholdedRelu, Softsign, Shrink), Sign, Reciprocal, Tan, Round (half to even), the
logical operators on 0/1 values and the comparisons GreaterOrEqual / LessOrEqual; ArgMax / ArgMin; and
InstanceNormalization. Each is built from ops ggml differentiates where it can, so a fine-tuned import trains
through them too."""
from __future__ import annotations

import numpy as np

from ..ops import elementwise as E
from ..ops.activation import ggml_floor
from ..ops.conv import GGML_OP_POOL_MAX as POOL_MAX
from ..ops.conv import ggml_pool_1d
from .operators_shape import transpose_tensor
from .registry import axis_of, op
from .values import Build, Value


# the activations' attributes and their ONNX defaults (each read through _attr)
DEFAULTS = {"Swish": {"alpha": 1.0}, "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
            "Celu": {"alpha": 1.0}, "ThresholdedRelu": {"alpha": 1.0}, "Shrink": {"lambd": 0.5, "bias": 0.0},
            "InstanceNormalization": {"epsilon": 1e-5}}


def _attr(node, name: str) -> float:
    return float(node.attrs.get(name, DEFAULTS[node.op][name]))


def round_half_even(b: Build, t):
    """``t`` rounded to the nearest whole number, ties to even (numpy's rint): floor(t + 1/2), less one where
    t + 1/2 was whole and odd, on t clamped to +-2^23 (beyond it every float is whole, and t + 1/2 would round);
    the part clamped off (0, or the whole excess: infinities stay) added back."""
    ctx = b.ctx
    clamped = E.ggml_clamp(ctx, t, -8388608.0, 8388608.0)
    excess = E.ggml_sub(ctx, t, clamped)
    return E.ggml_add(ctx, _round_small(b, clamped), excess)


def _round_small(b: Build, t):
    ctx = b.ctx
    up = E.ggml_scale_bias(ctx, t, 1.0, 0.5)
    f = ggml_floor(ctx, up)
    tie = E.ggml_scale_bias(ctx, E.ggml_step(ctx, E.ggml_sub(ctx, up, f)), -1.0, 1.0)   # 1 where t + 1/2 is whole
    odd = E.ggml_sub(ctx, f, E.ggml_scale(ctx, ggml_floor(ctx, E.ggml_scale(ctx, f, 0.5)), 2.0))
    return E.ggml_sub(ctx, f, E.ggml_mul(ctx, tie, odd))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# name -> (builder of the tensor from (b, node, t), numpy of (node, x))
ACTIVATIONS = {
    "Swish": (lambda b, n, t: E.ggml_mul(b.ctx, t, E.ggml_sigmoid(b.ctx, E.ggml_scale(b.ctx, t, _attr(n, "alpha")))),
              lambda n, x: x * _sigmoid(_attr(n, "alpha") * x)),
    "Silu": (lambda b, n, t: E.ggml_mul(b.ctx, t, E.ggml_sigmoid(b.ctx, t)), lambda n, x: x * _sigmoid(x)),
    "HardSwish": (lambda b, n, t: E.ggml_mul(b.ctx, t, E.ggml_clamp(b.ctx, E.ggml_scale_bias(b.ctx, t, 1 / 6, 0.5),
                                                                    0.0, 1.0)),
                  lambda n, x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "Mish": (lambda b, n, t: E.ggml_mul(b.ctx, t, E.ggml_tanh(b.ctx, softplus(b, t))),
             lambda n, x: x * np.tanh(np.logaddexp(0, x))),
    "Selu": (lambda b, n, t: E.ggml_scale(b.ctx, elu(b, t, _attr(n, "alpha")),
                                          _attr(n, "gamma")),
             lambda n, x: _attr(n, "gamma") * np.where(
                 x > 0, x, _attr(n, "alpha") * np.expm1(np.minimum(x, 0)))),
    "Celu": (lambda b, n, t: _celu(b, t, _attr(n, "alpha")),
             lambda n, x: np.maximum(x, 0) + np.minimum(0, _attr(n, "alpha") * np.expm1(
                 np.minimum(x, 0) / _attr(n, "alpha")))),
    "ThresholdedRelu": (lambda b, n, t: E.ggml_mul(b.ctx, t, E.ggml_step(b.ctx, E.ggml_scale_bias(
        b.ctx, t, 1.0, -_attr(n, "alpha")))), lambda n, x: np.where(x > _attr(n, "alpha"), x, 0)),
    "Softsign": (lambda b, n, t: E.ggml_div(b.ctx, t, E.ggml_scale_bias(b.ctx, E.ggml_abs(b.ctx, t), 1.0, 1.0)),
                 lambda n, x: x / (1 + np.abs(x))),
    "Shrink": (lambda b, n, t: _shrink(b, t, _attr(n, "lambd"), _attr(n, "bias")),
               lambda n, x: np.where(x < -_attr(n, "lambd"), x + _attr(n, "bias"),
                                     np.where(x > _attr(n, "lambd"), x - _attr(n, "bias"), 0))),
    "Sign": (lambda b, n, t: E.ggml_sgn(b.ctx, t), lambda n, x: np.sign(x)),
    "Reciprocal": (lambda b, n, t: E.ggml_div(b.ctx, _ones(b, t), t), lambda n, x: 1 / x),
    "Tan": (lambda b, n, t: E.ggml_div(b.ctx, E.ggml_sin(b.ctx, t), E.ggml_cos(b.ctx, t)), lambda n, x: np.tan(x)),
    "Round": (lambda b, n, t: round_half_even(b, t), lambda n, x: np.rint(x)),
}


def _ones(b: Build, t):
    """Ones of ``t``'s shape (NaN where t is NaN): step(|t| + 1), never 0 x inf."""
    return E.ggml_step(b.ctx, E.ggml_scale_bias(b.ctx, E.ggml_abs(b.ctx, t), 1.0, 1.0))


def softplus(b: Build, t):
    """log(1 + exp(t)) = relu(t) + log(1 + exp(-|t|)): no overflow."""
    tail = E.ggml_log(b.ctx, E.ggml_scale_bias(b.ctx, E.ggml_exp(b.ctx, E.ggml_neg(b.ctx, E.ggml_abs(b.ctx, t))),
                                                1.0, 1.0))
    return E.ggml_add(b.ctx, E.ggml_relu(b.ctx, t), tail)


def elu(b: Build, t, alpha: float):
    """t where t > 0, else alpha (exp(t) - 1) (the exponent of min(t, 0): no overflow)."""
    negative = E.ggml_neg(b.ctx, E.ggml_relu(b.ctx, E.ggml_neg(b.ctx, t)))   # min(t, 0)
    tail = E.ggml_scale(b.ctx, E.ggml_scale_bias(b.ctx, E.ggml_exp(b.ctx, negative), 1.0, -1.0), alpha)
    return E.ggml_add(b.ctx, E.ggml_relu(b.ctx, t), tail)


def _celu(b: Build, t, alpha: float):
    """alpha elu(t / alpha)."""
    return E.ggml_scale(b.ctx, elu(b, E.ggml_scale(b.ctx, t, 1 / alpha), 1.0), alpha)


def _shrink(b: Build, t, lambd: float, bias: float):
    above = E.ggml_step(b.ctx, E.ggml_scale_bias(b.ctx, t, 1.0, -lambd))                  # t > lambd
    below = E.ggml_step(b.ctx, E.ggml_scale_bias(b.ctx, t, -1.0, -lambd))                 # t < -lambd
    return E.ggml_add(b.ctx, E.ggml_mul(b.ctx, above, E.ggml_scale_bias(b.ctx, t, 1.0, -bias)),
                      E.ggml_mul(b.ctx, below, E.ggml_scale_bias(b.ctx, t, 1.0, bias)))


def _activation(b: Build, node, xs, opset):
    return [Value(xs[0].shape, ACTIVATIONS["Silu" if node.op == "SiLU" else node.op][0](b, node, b.tensor(xs[0])))]


for _name, (_, _numpy) in ACTIVATIONS.items():
    op(_name, *(("SiLU",) if _name == "Silu" else ()), attrs=tuple(DEFAULTS.get(_name, ())),
       fold=(lambda f: lambda node, xs, opset: [f(node, np.asarray(xs[0]))])(_numpy))(_activation)


def _shape(*vs: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in np.broadcast_shapes(*(v.shape for v in vs)))


@op("PRelu", fold=lambda node, xs, opset: [np.where(np.asarray(xs[0]) < 0, np.asarray(xs[0]) * xs[1], xs[0])])
def _prelu(b: Build, node, xs, opset):
    """relu(x) - slope relu(-x), the slope broadcast to x."""
    x, slope = xs
    shape = _shape(x, slope)
    t = b.broadcast(x, shape)
    neg = E.ggml_relu(b.ctx, E.ggml_neg(b.ctx, t))
    return [Value(shape, E.ggml_sub(b.ctx, E.ggml_relu(b.ctx, t), E.ggml_mul(b.ctx, neg, b.broadcast(slope, shape))))]


# ---- logic on 0/1 values, and the comparisons that include equality
LOGIC = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
         "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal}


def _logic(b: Build, node, xs, opset):
    x, y = xs
    shape = _shape(x, y)
    a, c = b.broadcast(x, shape), b.broadcast(y, shape)
    ctx = b.ctx
    if node.op == "And":
        out = E.ggml_mul(ctx, a, c)
    elif node.op == "Or":
        out = E.ggml_sub(ctx, E.ggml_add(ctx, a, c), E.ggml_mul(ctx, a, c))
    elif node.op == "Xor":
        out = E.ggml_sqr(ctx, E.ggml_sub(ctx, a, c))
    else:   # not strictly less (GreaterOrEqual), not strictly greater (LessOrEqual)
        d = E.ggml_sub(ctx, c, a) if node.op == "GreaterOrEqual" else E.ggml_sub(ctx, a, c)
        out = E.ggml_scale_bias(ctx, E.ggml_step(ctx, d), -1.0, 1.0)
    return [Value(shape, out, dtype=np.dtype(np.bool_))]


for _name, _fn in LOGIC.items():
    op(_name, fold=(lambda f: lambda node, xs, opset: [f(np.asarray(xs[0]), np.asarray(xs[1]))])(_fn))(_logic)


# ---- ArgMax, ArgMin
def _arg_fold(node, xs, opset):
    x = np.asarray(xs[0])
    axis = int(node.attrs.get("axis", 0)) % max(x.ndim, 1)
    fn = np.argmax if node.op == "ArgMax" else np.argmin
    if int(node.attrs.get("select_last_index", 0)):
        idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    idx = np.asarray(idx, np.int64)
    return [np.expand_dims(idx, axis) if int(node.attrs.get("keepdims", 1)) else idx]


@op("ArgMax", "ArgMin", attrs=("axis", "keepdims", "select_last_index"), fold=_arg_fold)
def _arg(b: Build, node, xs, opset):
    """In F32 (exact; every backend): with the axis moved to the rows, the positions where the row's maximum (of -x
    for ArgMin) is, each other position pushed past the row's length, and the smallest of them (the largest, with
    select_last_index, the others pushed below 0)."""
    x = xs[0]
    rank = len(x.shape)
    axis = axis_of(b, node.attrs.get("axis", 0), rank)
    order = [i for i in range(rank) if i != axis] + [axis]
    t = b.tensor(x)
    if order != list(range(rank)):
        t = transpose_tensor(b, t, rank, order)
    moved = tuple(x.shape[i] for i in order)
    n = x.shape[axis]
    rows = int(np.prod(moved[:-1], dtype=np.int64))
    ctx = b.ctx
    flat = b.reshaped(Value(moved, t), (rows, n))
    if node.op == "ArgMin":
        flat = E.ggml_neg(ctx, flat)
    flat = E.ggml_clamp(ctx, flat, -3.4028234e38, 3.4028234e38)   # a row of -inf: its first element, not inf - inf
    top = ggml_pool_1d(ctx, flat, POOL_MAX, n, n, 0)                                         # [1, rows]
    other = E.ggml_step(ctx, E.ggml_neg(ctx, E.ggml_sub(ctx, flat, top)))                      # 1 below the max
    positions = b.tensor(Value.of(np.arange(n, dtype=np.float32).reshape(1, n)))
    if int(node.attrs.get("select_last_index", 0)):
        cost = E.ggml_add(ctx, E.ggml_scale(ctx, other, -float(n + 1)), positions)
        idx = ggml_pool_1d(ctx, cost, POOL_MAX, n, n, 0)
    else:
        cost = E.ggml_add(ctx, E.ggml_scale(ctx, other, float(n + 1)), positions)
        idx = E.ggml_neg(ctx, ggml_pool_1d(ctx, E.ggml_neg(ctx, cost), POOL_MAX, n, n, 0))
    keep = bool(int(node.attrs.get("keepdims", 1)))
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i != axis)
    return [Value(shape, b.reshaped(Value((rows, 1), idx), shape), dtype=np.dtype(np.int64))]


@op("InstanceNormalization", attrs=("epsilon",))
def _instance_norm(b: Build, node, xs, opset):
    """Each sample's each channel normalized over its pixels, then a scale and bias per channel."""
    x, scale, bias = xs
    if len(x.shape) < 3:
        raise b.fail(f"InstanceNormalization takes (N, C, D1, ...), got shape {x.shape}")
    n, c = x.shape[0], x.shape[1]
    rest = int(np.prod(x.shape[2:], dtype=np.int64))
    y = E.ggml_norm(b.ctx, b.reshaped(x, (n, c, rest)), _attr(node, "epsilon"))
    y = E.ggml_add(b.ctx, E.ggml_mul(b.ctx, y, b.reshaped(scale, (1, c, 1))), b.reshaped(bias, (1, c, 1)))
    return [Value(x.shape, b.reshaped(Value((n, c, rest), y), x.shape))]
