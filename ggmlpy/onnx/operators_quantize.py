"""ONNX's linear quantization: DequantizeLinear (``(x - zero_point) * scale``) and QuantizeLinear (``x / scale``
rounded half to even, plus the zero point, saturated to the 8-, 16- or 32-bit integer type), per tensor or per
axis. The integers are held in F32 as every integer the importer computes (exact below 2^24)."""
from __future__ import annotations

import numpy as np

from ..ops import elementwise as E
from ..ops.activation import ggml_floor
from .registry import axis_of, op
from .values import Build, Value


_RANGES = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.int8, np.uint8, np.int16, np.uint16)}


def _per_axis(b: Build, node, x: Value, v: Value | None, what: str) -> Value | None:
    """A scale or zero point (a scalar, or one value per index of ``axis``) shaped to broadcast over ``x``."""
    if v is None:
        return None
    if int(node.attrs.get("block_size", 0)):
        raise b.fail("blocked quantization (block_size > 0) is not supported")
    if len(v.shape) == 0 or (len(v.shape) == 1 and v.shape[0] == 1):
        return _shaped(b, v, (1,) * len(x.shape))
    axis = axis_of(b, node.attrs.get("axis", 1), len(x.shape))
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
        from .protobuf import onnx_package
        return np.dtype(onnx_package("onnx_load").helper.tensor_dtype_to_np_dtype(int(node.attrs["output_dtype"])))
    return np.dtype(np.uint8)


def _fold_dequantize(node, xs, opset):
    x = np.asarray(xs[0], np.float64)
    scale, zero = np.asarray(xs[1], np.float64), np.asarray(xs[2] if len(xs) > 2 and xs[2] is not None else 0,
                                                            np.float64)
    if scale.ndim == 1 and scale.size > 1:
        axis = int(node.attrs.get("axis", 1)) % x.ndim
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), (zero.reshape(shape) if zero.size > 1 else zero)
    return [((x - zero) * scale).astype(np.asarray(xs[1]).dtype)]


@op("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"), fold=_fold_dequantize)
def _dequantize(b: Build, node, xs, opset):
    x = xs[0]
    scale = _per_axis(b, node, x, xs[1], "scale")
    zero = _per_axis(b, node, x, xs[2] if len(xs) > 2 else None, "zero point")
    assert scale is not None
    t = b.tensor(x)
    if zero is not None:
        t = E.ggml_sub(b.ctx, t, b.broadcast(zero, x.shape))
    return [Value(x.shape, E.ggml_mul(b.ctx, t, b.broadcast(scale, x.shape)))]


def _fold_quantize(node, xs, opset):
    x = np.asarray(xs[0], np.float64)
    scale = np.asarray(xs[1], np.float64)
    dtype = _zero_dtype(node, [Value.of(np.asarray(a)) if a is not None else None for a in xs]) or np.dtype(np.uint8)
    if dtype not in _RANGES:
        raise ValueError(f"QuantizeLinear to {dtype.name} is not supported (int8, uint8, int16 and uint16 are)")
    zero = np.asarray(xs[2] if len(xs) > 2 and xs[2] is not None else 0, np.float64)
    if scale.ndim == 1 and scale.size > 1:
        axis = int(node.attrs.get("axis", 1)) % x.ndim
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), (zero.reshape(shape) if zero.size > 1 else zero)
    low, high = _RANGES[dtype]
    return [np.clip(np.rint(x / scale) + zero, low, high).astype(dtype)]


@op("QuantizeLinear", attrs=("axis", "block_size", "output_dtype", "saturate", "precision"), fold=_fold_quantize)
def _quantize(b: Build, node, xs, opset):
    x = xs[0]
    dtype = _zero_dtype(node, xs)
    if dtype not in _RANGES:
        raise b.fail(f"QuantizeLinear to {'a float type' if dtype is None else dtype.name} is not supported (int8, "
                     "uint8, int16 and uint16 are)")
    scale = _per_axis(b, node, x, xs[1], "scale")
    zero = _per_axis(b, node, x, xs[2] if len(xs) > 2 else None, "zero point")
    assert scale is not None
    ctx = b.ctx
    v = E.ggml_div(ctx, b.tensor(x), b.broadcast(scale, x.shape))
    # round half to even: floor(v + 1/2), less one where v + 1/2 was a whole odd number (a tie rounded up to odd)
    up = E.ggml_scale_bias(ctx, v, 1.0, 0.5)
    f = ggml_floor(ctx, up)
    d = E.ggml_sub(ctx, up, f)
    tie = E.ggml_scale_bias(ctx, E.ggml_step(ctx, d), -1.0, 1.0)           # 1 where v + 1/2 is whole
    odd = E.ggml_sub(ctx, f, E.ggml_scale(ctx, ggml_floor(ctx, E.ggml_scale(ctx, f, 0.5)), 2.0))
    r = E.ggml_sub(ctx, f, E.ggml_mul(ctx, tie, odd))
    if zero is not None:
        r = E.ggml_add(ctx, r, b.broadcast(zero, x.shape))
    low, high = _RANGES[dtype]
    return [Value(x.shape, E.ggml_clamp(ctx, r, float(low), float(high)), dtype=dtype)]
