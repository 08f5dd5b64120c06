"""ONNX's neural-network operators: convolutions (1-D and 2-D, padding and auto_pad, strides, dilations, groups),
pooling, batch and layer normalization. ONNX's NCHW images are ggml's ``[W, H, C, N]`` layout as they are."""
from __future__ import annotations

import numpy as np

from ..core.types import GGML_TYPE_F16, GGML_TYPE_F32
from ..models.layers.fused import device_computes
from ..ops import elementwise as E
from ..ops.conv import (
    ggml_conv_2d_tiled,
    ggml_conv_transpose_2d_p0,
    ggml_im2col,
    GGML_OP_POOL_AVG,
    GGML_OP_POOL_MAX,
    ggml_pool_2d,
)
from ..ops.layout import ggml_permute, ggml_reshape_2d, ggml_reshape_4d
from ..ops.linalg import ggml_mul_mat
from ..ops.reduce import ggml_concat, ggml_sum_rows
from ..ops.resize import ggml_pad_ext
from .operators_image import along_axis, pad_value
from .operators_shape import slice_axis
from .protobuf import Node
from .registry import axis_of, op
from .values import Build, Value


def _auto_pads(b: Build, node, spatial: tuple[int, ...], kernel: list[int], strides: list[int],
               dilations: list[int]) -> list[int]:
    """ONNX's ``pads`` (begins then ends) for the node's ``auto_pad`` (or its ``pads``)."""
    mode = node.attrs.get("auto_pad", "NOTSET")
    n = len(spatial)
    if mode in ("NOTSET", ""):
        pads = list(node.attrs.get("pads", [0] * (2 * n)))
        return [int(p) for p in pads]
    if mode == "VALID":
        return [0] * (2 * n)
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    return begins + ends


def _as_2d(b: Build, x: Value) -> tuple[Value, bool]:
    """A 1-D convolution's or pool's [N, C, L] input as [N, C, 1, L]."""
    if len(x.shape) == 3:
        shape = (x.shape[0], x.shape[1], 1, x.shape[2])
        return Value(shape, b.reshaped(x, shape)), True
    if len(x.shape) != 4:
        raise b.fail(f"takes 1-D or 2-D images (N, C, L) or (N, C, H, W), got shape {x.shape}")
    return x, False


def _pad(b: Build, t, pads: list[int], value: float = 0.0):
    """``t`` (an image ``[W, H, C, N]``) padded by ONNX's ``[top, left, bottom, right]`` with ``value``."""
    w, h, c, n = t.shape
    return pad_value(b, Value((n, c, h, w), t), [0, 0, pads[0], pads[1]], [0, 0, pads[2], pads[3]], "constant",
                     value).tensor


@op("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(b: Build, node, xs, opset):
    x, w = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 else None
    x, one_d = _as_2d(b, x)
    if one_d:
        w = Value((w.shape[0], w.shape[1], 1, w.shape[2]), const=None if not w.known else
                  np.asarray(w.const).reshape(w.shape[0], w.shape[1], 1, w.shape[2]),
                  tensor=None if w.known else b.reshaped(w, (w.shape[0], w.shape[1], 1, w.shape[2])))
    n, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    group = int(node.attrs.get("group", 1))
    strides = [int(s) for s in node.attrs.get("strides", [1] * (1 if one_d else 2))]
    dil = [int(d) for d in node.attrs.get("dilations", [1] * (1 if one_d else 2))]
    if one_d:
        strides, dil = [1] + strides, [1] + dil
    pads = _auto_pads(b, node, (h, wd), [kh, kw], strides, dil)
    if one_d and len(pads) == 2:
        pads = [0, pads[0], 0, pads[1]]
    if c != cin_g * group or cout % group:
        raise b.fail(f"Conv of {c} channels with weights {w.shape} in {group} groups")
    t = b.tensor(x)
    sym = pads[0] == pads[2] and pads[1] == pads[3]
    if not sym:
        t = _pad(b, t, pads)
        h, wd = h + pads[0] + pads[2], wd + pads[1] + pads[3]
        pads = [0, 0, 0, 0]
    kernel = b.weights.get(node.inputs[1]) if not one_d and node.inputs[1] in b.weights else b.tensor(w)
    s0, s1, p0, p1, d0, d1 = strides[1], strides[0], pads[1], pads[0], dil[1], dil[0]
    if group == 1:
        y, fused = _conv_product(b, kernel, b.contiguous(t), s0, s1, p0, p1, d0, d1, bias)
        bias = None if fused else bias
    else:   # each group of channels on its own, concatenated along the channels
        per_out = cout // group
        y = None
        for gi in range(group):
            part_x = b.contiguous(slice_axis(b, t, (n, c, h, wd), 1, gi * cin_g, (gi + 1) * cin_g))
            part_k = b.contiguous(slice_axis(b, kernel, (cout, cin_g, kh, kw), 0, gi * per_out, (gi + 1) * per_out))
            yi, _ = _conv_product(b, part_k, part_x, s0, s1, p0, p1, d0, d1)
            y = yi if y is None else ggml_concat(b.ctx, y, yi, 2)
    oh, ow = y.shape[1], y.shape[0]
    if bias is not None:
        y = E.ggml_add(b.ctx, y, b.reshaped(bias, (1, cout, 1, 1)))
    shape = (n, cout, oh, ow)
    if one_d:
        return [Value((n, cout, ow), b.reshaped(Value(shape, y), (n, cout, ow)))]
    return [Value(shape, y)]


def _conv_product(b: Build, kernel, x, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
                  bias: Value | None = None):
    """``kernel [KW, KH, Cin, Cout]`` over ``x [W, H, Cin, N]`` -> ``[OW, OH, Cout, N]``, and whether ``bias`` (Cout
    values) is added in it: the CPU's tiled kernel adds it; else im2col in the kernel's type for an F16 kernel, else
    F32 (ggml's own conv_2d makes F16 patches of F32 data: 4e-4 off), then one product."""
    kw, kh, cin, cout = kernel.shape
    if kernel.type == GGML_TYPE_F32 and b.device is not None and device_computes(b.device, "conv_2d_tiled"):
        # the CPU's fused convolution (patches/0036): tile by tile, no im2col matrix of the whole batch
        added = b.tensor(bias) if bias is not None and bias.shape == (cout,) else None
        return ggml_conv_2d_tiled(b.ctx, b.contiguous(kernel), x, added, s0, s1, p0, p1, d0, d1), added is not None
    kind = GGML_TYPE_F16 if kernel.type == GGML_TYPE_F16 else GGML_TYPE_F32
    cols = ggml_im2col(b.ctx, kernel, x, s0, s1, p0, p1, d0, d1, True, kind)   # [Cin*KH*KW, OW, OH, N]
    k, ow, oh, n = cols.shape
    y = ggml_mul_mat(b.ctx, ggml_reshape_2d(b.ctx, cols, k, ow * oh * n),
                     ggml_reshape_2d(b.ctx, b.contiguous(kernel), k, cout))                 # [OW*OH*N, Cout]
    y = ggml_reshape_4d(b.ctx, y, ow, oh, n, cout)
    return E.ggml_cont(b.ctx, ggml_permute(b.ctx, y, 0, 1, 3, 2)), False                 # [OW, OH, Cout, N]


def _pool(b: Build, node, xs, opset):
    x, one_d = _as_2d(b, xs[0])
    n, c, h, wd = x.shape
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    strides = [int(s) for s in node.attrs.get("strides", [1] * len(kernel))]
    if any(int(d) != 1 for d in node.attrs.get("dilations", [1])):
        raise b.fail("pooling with dilations is not supported")
    if one_d:
        kernel, strides = [1] + kernel, [1] + strides
    pads = _auto_pads(b, node, (h, wd), kernel, strides, [1, 1])
    if one_d and len(pads) == 2:
        pads = [0, pads[0], 0, pads[1]]
    t = b.tensor(x)
    if int(node.attrs.get("ceil_mode", 0)):
        spans = [(sz + pads[i] + pads[i + 2] - k, s) for i, (sz, k, s) in enumerate(zip((h, wd), kernel, strides))]
        floor_out = [span // s + 1 for span, s in spans]
        ceil_out = [-(-span // s) + 1 for span, s in spans]
        if floor_out != ceil_out:
            raise b.fail("ceil_mode=1 where it changes the output size is not supported")
    max_pool = node.op == "MaxPool"
    inside = np.ones((1, 1, h, wd), np.float32)   # where the image is (1) and its padding (0)
    if any(pads) and (max_pool or not (pads[0] == pads[2] and pads[1] == pads[3])):   # padded here, explicitly
        t = _pad(b, t, pads, -3.0e38 if max_pool else 0.0)
        inside = np.pad(inside, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        h, wd = h + pads[0] + pads[2], wd + pads[1] + pads[3]
        pads = [0, 0, 0, 0]
    kind = GGML_OP_POOL_MAX if max_pool else GGML_OP_POOL_AVG
    y = ggml_pool_2d(b.ctx, b.contiguous(t), kind, kernel[1], kernel[0], strides[1], strides[0], pads[1], pads[0])
    if not max_pool and not inside.all() or not max_pool and any(pads):
        if not int(node.attrs.get("count_include_pad", 0)):   # the mean over the window's part in the image
            share = ggml_pool_2d(b.ctx, b.tensor(Value.of(inside)), kind, kernel[1], kernel[0], strides[1],
                                 strides[0], pads[1], pads[0])
            y = E.ggml_div(b.ctx, y, share)
    shape = (n, c, y.shape[1], y.shape[0])
    if one_d:
        return [Value((n, c, y.shape[0]), b.reshaped(Value(shape, y), (n, c, y.shape[0])))]
    return [Value(shape, y)]


op("MaxPool", "AveragePool", attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape",
                                    "pads", "strides", "storage_order"))(_pool)


@op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(b: Build, node, xs, opset):
    x = xs[0]
    if len(x.shape) < 3:
        raise b.fail(f"takes images (N, C, ...), got shape {x.shape}")
    n, c = x.shape[:2]
    size = int(np.prod(x.shape[2:], dtype=np.int64))
    flat = b.reshaped(x, (n, c, 1, size))
    kind = GGML_OP_POOL_MAX if node.op == "GlobalMaxPool" else GGML_OP_POOL_AVG
    y = ggml_pool_2d(b.ctx, flat, kind, size, 1, size, 1, 0, 0)
    shape = (n, c) + (1,) * (len(x.shape) - 2)
    return [Value(shape, b.reshaped(Value((n, c, 1, 1), y), shape))]


@op("BatchNormalization", attrs=("epsilon", "momentum", "training_mode", "spatial"))
def _batch_norm(b: Build, node, xs, opset):
    x, scale, bias, mean, var = xs[:5]
    if int(node.attrs.get("training_mode", 0)):
        raise b.fail("BatchNormalization in training mode is not supported (export the model in eval mode)")
    eps = float(node.attrs.get("epsilon", 1e-5))
    c = x.shape[1]
    shape = (1, c) + (1,) * (len(x.shape) - 2)
    if all(v.known for v in (scale, bias, mean, var)):   # folded into one scale and shift per channel
        a = np.asarray(scale.const, np.float64) / np.sqrt(np.asarray(var.const, np.float64) + eps)
        shift = np.asarray(bias.const, np.float64) - np.asarray(mean.const, np.float64) * a
        mul = b.tensor(Value.of(a.astype(np.float32).reshape(shape)))
        add = b.tensor(Value.of(shift.astype(np.float32).reshape(shape)))
        return [Value(x.shape, E.ggml_add(b.ctx, E.ggml_mul(b.ctx, b.tensor(x), mul), add))]
    inv = E.ggml_sqrt(b.ctx, E.ggml_scale_bias(b.ctx, b.reshaped(var, shape), 1.0, eps))
    y = E.ggml_div(b.ctx, E.ggml_sub(b.ctx, b.tensor(x), b.reshaped(mean, shape)), inv)
    return [Value(x.shape, E.ggml_add(b.ctx, E.ggml_mul(b.ctx, y, b.reshaped(scale, shape)), b.reshaped(bias, shape)))]


@op("LayerNormalization", attrs=("axis", "epsilon", "stash_type"), since=17)
def _layer_norm(b: Build, node, xs, opset):
    x, scale = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 else None
    rank = len(x.shape)
    axis = axis_of(b, node.attrs.get("axis", -1), rank)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    size = int(np.prod(x.shape[axis:], dtype=np.int64))
    eps = float(node.attrs.get("epsilon", 1e-5))
    flat = b.reshaped(x, (rows, size))
    extras: list[Value] = []
    if len(node.outputs) > 1 and any(node.outputs[1:]):   # the mean and 1 / std per row as well
        stat_shape = x.shape[:axis] + (1,) * (rank - axis)
        mean = E.ggml_scale(b.ctx, ggml_sum_rows(b.ctx, flat), 1.0 / size)
        centered = E.ggml_sub(b.ctx, flat, mean)
        var = E.ggml_scale(b.ctx, ggml_sum_rows(b.ctx, E.ggml_sqr(b.ctx, centered)), 1.0 / size)
        inv = E.ggml_div(b.ctx, E.ggml_scale_bias(b.ctx, var, 0.0, 1.0),
                         E.ggml_sqrt(b.ctx, E.ggml_scale_bias(b.ctx, var, 1.0, eps)))
        extras = [Value(stat_shape, b.reshaped(Value((rows, 1), mean), stat_shape)),
                  Value(stat_shape, b.reshaped(Value((rows, 1), inv), stat_shape))]
        y = E.ggml_mul(b.ctx, centered, inv)
    else:
        y = E.ggml_norm(b.ctx, flat, eps)
    y = b.reshaped(Value((rows, size), y), x.shape)
    y = E.ggml_mul(b.ctx, y, b.reshaped(scale, (1,) * (rank - len(scale.shape)) + scale.shape))
    if bias is not None:
        y = E.ggml_add(b.ctx, y, b.reshaped(bias, (1,) * (rank - len(bias.shape)) + bias.shape))
    return [Value(x.shape, y)] + extras


@op("ConvTranspose", attrs=("auto_pad", "dilations", "group", "kernel_shape", "output_padding", "pads", "strides"))
def _conv_transpose(b: Build, node, xs, opset):
    """ggml's transposed 2-D convolution (one image and one group at a time, one stride for both axes), its
    borders then cropped by ``pads`` and extended by ``output_padding``; 1-D as 2-D of height 1."""
    x, w = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 else None
    x, one_d = _as_2d(b, x)
    if one_d:
        w = Value((w.shape[0], w.shape[1], 1, w.shape[2]), b.reshaped(w, (w.shape[0], w.shape[1], 1, w.shape[2])))
    n, c, h, wd = x.shape
    cin, cout_g, kh, kw = w.shape
    group = int(node.attrs.get("group", 1))
    strides = [int(s) for s in node.attrs.get("strides", [1] * (1 if one_d else 2))]
    strides = [strides[0]] + strides if one_d else strides
    mode = node.attrs.get("auto_pad", "NOTSET")
    if any(int(d) != 1 for d in node.attrs.get("dilations", [1])) or mode not in ("NOTSET", "VALID"):
        raise b.fail("ConvTranspose with dilations or auto_pad SAME is not supported")
    pads = [int(p) for p in node.attrs.get("pads", [0] * (2 if one_d else 4))] if mode == "NOTSET" else \
        [0] * (2 if one_d else 4)
    extra = [int(p) for p in node.attrs.get("output_padding", [0] * (1 if one_d else 2))]
    if one_d:
        pads, extra = [0, pads[0], 0, pads[1]], [0] + extra
    if c != cin or cin % group:
        raise b.fail(f"ConvTranspose of {c} channels with weights {w.shape} in {group} groups")
    if b.differentiable:
        out = _conv_transpose_as_conv(b, node, x, w, bias, group, strides, pads, extra, opset)
        if one_d:
            return [Value((n, out.shape[1], out.shape[3]), b.reshaped(out, (n, out.shape[1], out.shape[3])))]
        return [out]
    s = strides[1]
    source = b.tensor(x)
    if strides[0] != strides[1]:   # unequal strides: zeros between the pixels, then a stride of 1
        source, (h, wd), s = _spread(b, source, (n, c, h, wd), strides), ((h - 1) * strides[0] + 1,
                                                                          (wd - 1) * strides[1] + 1), 1
        strides = [1, 1]
    kernel, per_in = b.tensor(w), cin // group
    images = []
    for i in range(n):
        img = slice_axis(b, source, (n, c, h, wd), 0, i, i + 1)
        parts = []
        for gi in range(group):
            xi = slice_axis(b, img, (1, c, h, wd), 1, gi * per_in, (gi + 1) * per_in)
            ki = slice_axis(b, kernel, w.shape, 0, gi * per_in, (gi + 1) * per_in)
            parts.append(ggml_conv_transpose_2d_p0(b.ctx, b.contiguous(ki), b.contiguous(xi), s))
        y = parts[0]
        for p in parts[1:]:
            y = ggml_concat(b.ctx, y, p, 2)
        images.append(y)
    y = images[0]
    for p in images[1:]:
        y = ggml_concat(b.ctx, y, p, 3)
    full_h, full_w = (h - 1) * strides[0] + kh, (wd - 1) * s + kw
    cout = cout_g * group
    top, left, bottom, right = pads
    out_h, out_w = full_h - top - bottom + extra[0], full_w - left - right + extra[1]
    shape = (n, cout, full_h, full_w)
    t = Value(shape, y)
    if top or left:
        t = Value((n, cout, full_h - top, full_w), slice_axis(b, t.tensor, shape, 2, top, full_h))
        t = Value((n, cout, full_h - top, full_w - left), slice_axis(b, t.tensor, t.shape, 3, left, full_w))
    keep_h, keep_w = min(out_h, t.shape[2] - bottom), min(out_w, t.shape[3] - right)
    if keep_h < t.shape[2]:
        t = Value((n, cout, keep_h, t.shape[3]), slice_axis(b, t.tensor, t.shape, 2, 0, keep_h))
    if keep_w < t.shape[3]:
        t = Value((n, cout, t.shape[2], keep_w), slice_axis(b, t.tensor, t.shape, 3, 0, keep_w))
    assert t.tensor is not None
    yt = b.contiguous(t.tensor)
    if out_h > keep_h or out_w > keep_w:   # output_padding past the cropped border: zeros
        yt = ggml_pad_ext(b.ctx, yt, 0, out_w - keep_w, 0, out_h - keep_h, 0, 0, 0, 0)
    if bias is not None:
        yt = E.ggml_add(b.ctx, yt, b.reshaped(bias, (1, cout, 1, 1)))
    if one_d:
        return [Value((n, cout, out_w), b.reshaped(Value((n, cout, out_h, out_w), yt), (n, cout, out_w)))]
    return [Value((n, cout, out_h, out_w), yt)]


def _conv_transpose_as_conv(b: Build, node, x: Value, w: Value, bias: Value | None, group: int, strides: list[int],
                            pads: list[int], extra: list[int], opset: int) -> Value:
    """ConvTranspose from ops ggml differentiates (a graph that trains): the input with zeros between its pixels
    (one-hot matrix products), padded by the kernel's size less one, less ``pads``, plus ``output_padding``, then
    a convolution of stride 1 with the kernel flipped and its channel axes swapped (per group)."""
    n, c, h, wd = x.shape
    cin, cout_g, kh, kw = w.shape
    t, shape = b.tensor(x), x.shape
    for axis, (size, stride) in enumerate(zip((h, wd), strides), start=2):
        if stride > 1:
            m = np.zeros(((size - 1) * stride + 1, size))
            m[np.arange(size) * stride, np.arange(size)] = 1.0
            t = along_axis(b, t, shape, axis, m)
            shape = tuple(m.shape[0] if i == axis else d for i, d in enumerate(shape))
    top, left, bottom, right = pads
    v = Value(shape, t)
    want = [(kh - 1 - top, kh - 1 - bottom + extra[0]), (kw - 1 - left, kw - 1 - right + extra[1])]
    for axis, (before, after) in enumerate(want, start=2):   # a negative pad crops
        if before < 0 or after < 0:
            start, stop = max(0, -before), v.shape[axis] - max(0, -after)
            v = Value(tuple(stop - start if i == axis else d for i, d in enumerate(v.shape)),
                      slice_axis(b, v.tensor, v.shape, axis, start, stop))
    begins = [0, 0, max(0, want[0][0]), max(0, want[1][0])]
    ends = [0, 0, max(0, want[0][1]), max(0, want[1][1])]
    v = pad_value(b, v, begins, ends)
    per_in = cin // group
    kernel = b.tensor(w)
    for axis, size in ((2, kh), (3, kw)):   # flipped along H and W
        kernel = along_axis(b, kernel, w.shape, axis, np.eye(size)[::-1])
    parts = []
    for gi in range(group):   # [per_in, cout_g, kh, kw] -> [cout_g, per_in, kh, kw]
        piece = slice_axis(b, kernel, w.shape, 0, gi * per_in, (gi + 1) * per_in)
        parts.append(E.ggml_cont(b.ctx, ggml_permute(b.ctx, b.contiguous(piece), 0, 1, 3, 2)))
    k = parts[0]
    for p in parts[1:]:
        k = ggml_concat(b.ctx, k, p, 3)
    flipped = Value((cout_g * group, per_in, kh, kw), k)
    operands = [f"{node.name}#x", f"{node.name}#k"] + ([f"{node.name}#b"] if bias is not None else [])
    conv = Node("Conv", node.name, operands, [f"{node.name}#y"], {"group": group, "kernel_shape": [kh, kw]})
    return _conv(b, conv, [v, flipped] + ([bias] if bias is not None else []), opset)[0]


def _spread(b: Build, t, shape: tuple[int, int, int, int], strides: list[int]):
    """Images ``t`` (N, C, H, W) with ``strides[0] - 1`` rows and ``strides[1] - 1`` columns of zeros between their
    pixels: (N, C, (H - 1) sh + 1, (W - 1) sw + 1)."""
    n, c, h, w = shape
    sh, sw = strides
    if sw > 1:   # each pixel followed by sw - 1 zeros along W, the last ones cut
        t = ggml_pad_ext(b.ctx, ggml_reshape_4d(b.ctx, b.contiguous(t), 1, w, h, c * n), 0, sw - 1, 0, 0, 0, 0, 0, 0)
        t = ggml_reshape_4d(b.ctx, t, sw * w, h, c, n)
        t = slice_axis(b, t, (n, c, h, sw * w), 3, 0, (w - 1) * sw + 1)
        w = (w - 1) * sw + 1
    if sh > 1:
        t = ggml_pad_ext(b.ctx, ggml_reshape_4d(b.ctx, b.contiguous(t), w, 1, h, c * n), 0, 0, 0, sh - 1, 0, 0, 0, 0)
        t = ggml_reshape_4d(b.ctx, t, w, sh * h, c, n)
        t = slice_axis(b, t, (n, c, sh * h, w), 2, 0, (h - 1) * sh + 1)
    return b.contiguous(t)


@op("GroupNormalization", attrs=("epsilon", "num_groups", "stash_type"), since=18)
def _group_norm(b: Build, node, xs, opset):
    """Each sample's channels in ``num_groups`` groups, each group normalized over its channels and pixels, then a
    scale and bias per channel (opset 21; per group before it)."""
    x, scale, bias = xs[0], xs[1], xs[2]
    groups = int(node.attrs["num_groups"]) if "num_groups" in node.attrs else 0
    if len(x.shape) < 2 or groups < 1 or x.shape[1] % groups:
        raise b.fail(f"num_groups {groups} must divide the {x.shape[1] if len(x.shape) > 1 else '?'} channels of "
                     f"an input of shape {x.shape}")
    n, c = x.shape[0], x.shape[1]
    rest = int(np.prod(x.shape[2:], dtype=np.int64))
    y = E.ggml_norm(b.ctx, b.reshaped(x, (n, groups, c // groups * rest)), float(node.attrs.get("epsilon", 1e-5)))
    grouped = (n, groups, c // groups, rest)
    y = b.reshaped(Value((n, groups, c // groups * rest), y), grouped)
    per = (1, groups, c // groups, 1) if scale.shape[0] == c else (1, groups, 1, 1)   # per group before opset 21
    y = E.ggml_add(b.ctx, E.ggml_mul(b.ctx, y, b.reshaped(scale, per)), b.reshaped(bias, per))
    return [Value(x.shape, b.reshaped(Value(grouped, y), x.shape))]


@op("RMSNormalization", attrs=("axis", "epsilon", "stash_type"), since=23)
def _rms_norm(b: Build, node, xs, opset):
    """x / sqrt(mean(x^2) + epsilon) over the axes from ``axis`` on, times ``scale``."""
    x, scale = xs[0], xs[1]
    rank = len(x.shape)
    axis = axis_of(b, node.attrs.get("axis", -1), rank)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    size = int(np.prod(x.shape[axis:], dtype=np.int64))
    y = E.ggml_rms_norm(b.ctx, b.reshaped(x, (rows, size)), float(node.attrs.get("epsilon", 1e-5)))
    y = b.reshaped(Value((rows, size), y), x.shape)
    return [Value(x.shape, E.ggml_mul(b.ctx, y, b.reshaped(scale, (1,) * (rank - len(scale.shape)) + scale.shape)))]
