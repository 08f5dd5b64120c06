"""ONNX's linear quantization: DequantizeLinear (``(x - zero_point) * scale``) and QuantizeLinear (``x / scale``
rounded half to even, plus the zero point, saturated to the 8- or 16-bit integer type), per tensor or per axis;
QLinearConv and QLinearMatMul, and onnxruntime's QLinearAdd, QLinearMul, QLinearSigmoid and QLinearConcat
(domain com.microsoft): their operands dequantized, the float op, the result quantized. The integers are held in
F32 as every integer the importer computes (exact below 2^24), and so are the products' sums."""
from __future__ import annotations

import numpy as np

from ..ops import elementwise as E
from . import operators_math, operators_nn, operators_shape  # noqa: F401 - the operators these build on
from .operators_activations import round_half_even
from .protobuf import Node, np_dtype
from .registry import axis_of, const_arg, op, OPS
from .values import Build, Value


_RANGES = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.int8, np.uint8, np.int16, np.uint16)}


def _per_axis(b: Build, node, x: Value, v: Value | None, what: str, axis: int | None = None) -> Value | None:
    """A scale or zero point (a scalar, or one value per index of ``axis``, the node's by default) shaped to
    broadcast over ``x``."""
    if v is None:
        return None
    if int(node.attrs.get("block_size", 0)):
        raise b.fail("blocked quantization (block_size > 0) is not supported")
    if len(v.shape) == 0 or (len(v.shape) == 1 and v.shape[0] == 1):
        return _shaped(b, v, (1,) * len(x.shape))
    axis = axis_of(b, node.attrs.get("axis", 1) if axis is None else axis, len(x.shape))
    if len(v.shape) != 1 or v.shape[0] != x.shape[axis]:
        raise b.fail(f"its {what} of shape {v.shape} must be a scalar or hold one value per index of axis {axis} "
                     f"({x.shape[axis]})")
    return _shaped(b, v, tuple(x.shape[axis] if i == axis else 1 for i in range(len(x.shape))))


def _shaped(b: Build, v: Value, shape: tuple[int, ...]) -> Value:
    return Value.of(np.asarray(v.const).reshape(shape)) if v.known else Value(shape, b.reshaped(v, shape))


def _zero_dtype(node, xs) -> np.dtype | None:
    """The quantized type: the zero point's (None where it is computed as floats: 8-bit float types), else
    ``output_dtype``'s, else uint8."""
    if len(xs) > 2 and xs[2] is not None:
        return np.asarray(xs[2].const).dtype if xs[2].known else xs[2].dtype
    if "output_dtype" in node.attrs and int(node.attrs["output_dtype"]):
        return np_dtype(int(node.attrs["output_dtype"]), f"{node.op} node '{node.name}': its output_dtype")
    return np.dtype(np.uint8)


def _scale_and_zero(node, x: np.ndarray, xs) -> tuple[np.ndarray, np.ndarray]:
    """A (de)quantization's scale and zero point in float64, shaped to broadcast over ``x`` (per tensor, or one
    value per index of the node's axis)."""
    scale = np.asarray(xs[1], np.float64)
    zero = np.asarray(xs[2] if len(xs) > 2 and xs[2] is not None else 0, np.float64)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * x.ndim
        shape[int(node.attrs.get("axis", 1)) % x.ndim] = scale.size
        scale, zero = scale.reshape(shape), (zero.reshape(shape) if zero.size > 1 else zero)
    return scale, zero


def _fold_dequantize(node, xs, opset):
    x = np.asarray(xs[0], np.float64)
    scale, zero = _scale_and_zero(node, x, xs)
    return [((x - zero) * scale).astype(np.asarray(xs[1]).dtype)]


def dequantized(b: Build, node, x: Value, scale: Value | None, zero: Value | None, axis: int | None = None) -> Value:
    """``(x - zero) * scale``, the scale and zero point per tensor or per index of ``axis``."""
    s = _per_axis(b, node, x, scale, "scale", axis)
    z = _per_axis(b, node, x, zero, "zero point", axis)
    assert s is not None
    t = b.tensor(x)
    if z is not None:
        t = E.ggml_sub(b.ctx, t, b.broadcast(z, x.shape))
    return Value(x.shape, E.ggml_mul(b.ctx, t, b.broadcast(s, x.shape)))


@op("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"), fold=_fold_dequantize, numbers=(1, 2))
def _dequantize(b: Build, node, xs, opset):
    return [dequantized(b, node, xs[0], xs[1], xs[2] if len(xs) > 2 else None)]


def _fold_quantize(node, xs, opset):
    x = np.asarray(xs[0], np.float64)
    dtype = _zero_dtype(node, [Value.of(np.asarray(a)) if a is not None else None for a in xs]) or np.dtype(np.uint8)
    if dtype not in _RANGES:
        raise ValueError(f"QuantizeLinear to {dtype.name} is not supported (int8, uint8, int16 and uint16 are)")
    scale, zero = _scale_and_zero(node, x, xs)
    low, high = _RANGES[dtype]
    return [np.clip(np.rint(x / scale) + zero, low, high).astype(dtype)]


@op("QuantizeLinear", attrs=("axis", "block_size", "output_dtype", "saturate", "precision"), fold=_fold_quantize,
    numbers=(1, 2))
def _quantize(b: Build, node, xs, opset):
    return [quantized(b, node, xs[0], xs[1], xs[2] if len(xs) > 2 else None, _zero_dtype(node, xs))]


def quantized(b: Build, node, x: Value, scale: Value | None, zero: Value | None, dtype: np.dtype | None,
              axis: int | None = None) -> Value:
    """``x / scale`` rounded half to even, plus the zero point, saturated to ``dtype``'s range (held in F32)."""
    if dtype not in _RANGES:
        raise b.fail(f"quantizing to {'a float type' if dtype is None else dtype.name} is not supported (int8, "
                     "uint8, int16 and uint16 are)")
    s = _per_axis(b, node, x, scale, "scale", axis)
    z = _per_axis(b, node, x, zero, "zero point", axis)
    assert s is not None
    ctx = b.ctx
    v = E.ggml_div(ctx, b.tensor(x), b.broadcast(s, x.shape))
    r = round_half_even(b, v)
    if z is not None:
        r = E.ggml_add(ctx, r, b.broadcast(z, x.shape))
    low, high = _RANGES[dtype]
    return Value(x.shape, E.ggml_clamp(ctx, r, float(low), float(high)), dtype=dtype)


def _integer_type(v: Value | None) -> np.dtype:
    """A quantized operand's type, from its zero point (uint8 without one)."""
    if v is None:
        return np.dtype(np.uint8)
    return np.asarray(v.const).dtype if v.known else (v.dtype or np.dtype(np.uint8))


def _synthetic(node, op_name: str, n_inputs: int) -> Node:
    return Node(op_name, node.name, [f"{node.name}#{i}" for i in range(n_inputs)], [f"{node.name}#out"],
                {k: v for k, v in node.attrs.items() if k in OPS[op_name].attrs})


@op("QLinearConv", attrs=tuple(sorted(OPS["Conv"].attrs)), numbers=(1, 2, 4, 5, 6, 7))
def _qlinear_conv(b: Build, node, xs, opset):
    """Dequantized input and weights (per output channel), a float convolution with the bias (int32, of scale
    x_scale * w_scale), the result quantized: what the integer convolution computes, in F32."""
    x, xsc, xzp, w, wsc, wzp, ysc, yzp = xs[:8]
    bias = xs[8] if len(xs) > 8 else None
    xf = dequantized(b, node, x, xsc, xzp)
    wf = dequantized(b, node, w, wsc, wzp, axis=0)
    inputs = [xf, wf]
    if bias is not None:
        scale = np.asarray(const_arg(b, xsc, "x_scale"), np.float64) * np.asarray(const_arg(b, wsc, "w_scale"),
                                                                                   np.float64).reshape(-1)
        inputs.append(Value(bias.shape, E.ggml_mul(b.ctx, b.tensor(bias), b.tensor(Value.of(
            np.broadcast_to(scale, bias.shape).astype(np.float32))))))
    y = OPS["Conv"].build(b, _synthetic(node, "Conv", len(inputs)), inputs, opset)[0]
    return [quantized(b, node, y, ysc, yzp, _integer_type(yzp))]


@op("QLinearMatMul", numbers=(1, 2, 4, 5, 6, 7))
def _qlinear_matmul(b: Build, node, xs, opset):
    """Dequantized operands (a per row, b per column where their scales are vectors), a float product, the result
    quantized (per column)."""
    a, asc, azp, w, wsc, wzp, ysc, yzp = xs
    af = dequantized(b, node, a, asc, azp, axis=-2 if len(a.shape) > 1 else -1)
    wf = dequantized(b, node, w, wsc, wzp, axis=-1)
    y = OPS["MatMul"].build(b, _synthetic(node, "MatMul", 2), [af, wf], opset)[0]
    return [quantized(b, node, y, ysc, yzp, _integer_type(yzp), axis=-1)]


@op("QLinearAdd", "QLinearMul", domain="com.microsoft", numbers=(1, 2, 4, 5, 6, 7))
def _qlinear_binary(b: Build, node, xs, opset):
    """onnxruntime's quantized Add and Mul: both operands dequantized, the float result quantized."""
    a, asc, azp, c, csc, czp, ysc, yzp = (list(xs) + [None] * 8)[:8]
    op_name = "Add" if node.op == "QLinearAdd" else "Mul"
    y = OPS[op_name].build(b, _synthetic(node, op_name, 2), [dequantized(b, node, a, asc, azp),
                                                             dequantized(b, node, c, csc, czp)], opset)[0]
    return [quantized(b, node, y, ysc, yzp, _integer_type(yzp))]


@op("QLinearSigmoid", domain="com.microsoft", numbers=(1, 2, 3, 4))
def _qlinear_sigmoid(b: Build, node, xs, opset):
    x, xsc, xzp, ysc, yzp = (list(xs) + [None] * 5)[:5]
    y = Value(x.shape, E.ggml_sigmoid(b.ctx, b.tensor(dequantized(b, node, x, xsc, xzp))))
    return [quantized(b, node, y, ysc, yzp, _integer_type(yzp))]


@op("QLinearConcat", attrs=("axis",), domain="com.microsoft",
    numbers=(0, 1) + tuple(i for i in range(2, 3 * 256) if (i - 2) % 3))   # scales and zero points
def _qlinear_concat(b: Build, node, xs, opset):
    """onnxruntime's quantized Concat: (Y_scale, Y_zero_point, then X, X_scale, X_zero_point per input)."""
    ysc, yzp, rest = xs[0], xs[1], xs[2:]
    if len(rest) % 3 or not rest:
        raise b.fail(f"QLinearConcat takes the output's scale and zero point, then a (tensor, scale, zero point) "
                     f"triple per input; got {len(xs)} inputs")
    parts = [dequantized(b, node, rest[i], rest[i + 1], rest[i + 2]) for i in range(0, len(rest), 3)]
    y = OPS["Concat"].build(b, _synthetic(node, "Concat", len(parts)), parts, opset)[0]
    return [quantized(b, node, y, ysc, yzp, _integer_type(yzp))]
