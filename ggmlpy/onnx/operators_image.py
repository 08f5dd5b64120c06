"""ONNX's Pad (constant, edge, reflect, wrap) and Resize / Upsample (nearest, linear, cubic; every coordinate
transformation but crop-and-resize; any scales or sizes, per axis).

Resizing is separable: along each axis whose size changes, every output element is a fixed weighted sum of input
elements (one weight of 1 for nearest, two for linear, four for cubic), so the axis is resized by one matrix product
with the (output x input) matrix of those weights, made in numpy from ONNX's formulas. Where the graph trains
(``Build.differentiable``) everything here is built from ops ggml differentiates (products, concatenation, views);
otherwise an integer nearest or half-pixel bilinear upscale takes ggml's upscale op, and constant padding its pad op.
"""
from __future__ import annotations

import math

import numpy as np

from ..ops import elementwise as E
from ..ops.conv import GGML_SCALE_MODE_BILINEAR, GGML_SCALE_MODE_NEAREST
from ..ops.layout import ggml_permute, ggml_reshape_2d
from ..ops.linalg import ggml_mul_mat
from ..ops.reduce import ggml_concat, ggml_repeat
from ..ops.resize import ggml_pad_ext, ggml_upscale
from .operators_shape import slice_axis
from .registry import axis_of, const_arg, op
from .values import Build, ne_of, Value


def _text(node, name: str, default: str) -> str:
    return str(node.attrs.get(name, default))


# ---- padding
def pad_value(b: Build, x: Value, begins: list[int], ends: list[int], mode: str = "constant",
              value: float = 0.0) -> Value:
    """``x`` padded by ``begins`` / ``ends`` per ONNX axis: with ``value`` (constant), the edge element repeated
    (edge), the elements mirrored about the edge (reflect) or the other end's (wrap)."""
    shape = tuple(d + p + q for d, p, q in zip(x.shape, begins, ends))
    t = b.tensor(x)
    if mode == "constant" and not b.differentiable:
        rank = len(x.shape)
        pads = []
        for g in range(4):   # ggml's axis g is ONNX's rank-1-g
            a = rank - 1 - g
            pads += [begins[a], ends[a]] if a >= 0 else [0, 0]
        y = ggml_pad_ext(b.ctx, b.contiguous(t), *pads)
        if value != 0.0:   # the value where the padding is (0 inside: no 0 x inf there), broadcast along the axes
            padded = [bool(p or q) for p, q in zip(begins, ends)]   # that are not padded
            inside = np.zeros(tuple(n if on else 1 for n, on in zip(shape, padded)), bool)
            inside[tuple(slice(p, p + d) if on else slice(None) for p, d, on in zip(begins, x.shape, padded))] = True
            y = E.ggml_add(b.ctx, y, b.tensor(Value.of(np.where(inside, 0.0, value).astype(np.float32))))
        return Value(shape, y)
    current = list(x.shape)
    for axis, (before, after) in enumerate(zip(begins, ends)):
        if before or after:
            t = _pad_axis(b, t, tuple(current), axis, before, after, mode, value)
            current[axis] += before + after
    return Value(shape, t)


def _pad_axis(b: Build, t, shape: tuple[int, ...], axis: int, before: int, after: int, mode: str, value: float):
    n, g = shape[axis], len(shape) - 1 - axis

    def piece(start: int, stop: int):
        return slice_axis(b, t, shape, axis, start, stop)

    def block(size: int, first: bool) -> list:
        if not size:
            return []
        if mode == "constant":
            block_shape = tuple(size if a == axis else d for a, d in enumerate(shape))
            return [b.tensor(Value.of(np.full(block_shape, value, np.float32)))]
        if mode == "edge":
            edge = piece(0, 1) if first else piece(n - 1, n)
            target = tuple(size if a == axis else d for a, d in enumerate(shape))
            return [edge if size == 1 else ggml_repeat(b.ctx, b.contiguous(edge), b.shape_target(target))]
        if mode == "wrap":
            if size > n:
                raise b.fail(f"Pad mode wrap of {size} along an axis of {n}: at most the axis' size")
            return [piece(n - size, n) if first else piece(0, size)]
        if size >= n:   # reflect
            raise b.fail(f"Pad mode reflect of {size} along an axis of {n}: less than the axis' size")
        return [piece(i, i + 1) for i in (range(size, 0, -1) if first else range(n - 2, n - 2 - size, -1))]

    parts = block(before, True) + [b.contiguous(t)] + block(after, False)
    y = parts[0]
    for p in parts[1:]:
        y = ggml_concat(b.ctx, b.contiguous(y), b.contiguous(p), g)
    return y


@op("Pad", attrs=("mode", "pads", "value"), static=(1, 2, 3))
def _pad_op(b: Build, node, xs, opset):
    x = xs[0]
    mode = _text(node, "mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise b.fail(f"Pad mode '{mode}' is not supported (constant, edge, reflect and wrap are)")
    rank = len(x.shape)
    if opset < 11:
        pads, value = [int(p) for p in node.attrs["pads"]], float(node.attrs.get("value", 0.0))
    else:
        pads = [int(p) for p in const_arg(b, xs[1], "pads").reshape(-1)]
        value = float(const_arg(b, xs[2], "constant_value").reshape(-1)[0]) if len(xs) > 2 and xs[2] is not None \
            else 0.0
        if len(xs) > 3 and xs[3] is not None:   # the axes the pads are for
            axes = [axis_of(b, a, rank) for a in const_arg(b, xs[3], "axes").reshape(-1)]
            full = [0] * (2 * rank)
            for i, a in enumerate(axes):
                full[a], full[rank + a] = pads[i], pads[len(axes) + i]
            pads = full
    if len(pads) != 2 * rank:
        raise b.fail(f"pads {pads} must hold 2 x rank = {2 * rank} values")
    if min(pads) < 0:
        raise b.fail("negative pads (cropping) are not supported")
    b.check_rank(x.shape)
    return [pad_value(b, x, pads[:rank], pads[rank:], mode, value)]


# ---- resizing
def _source(out_n: int, in_n: int, scale: float, ctm: str, roi: tuple[float, float]) -> np.ndarray:
    """ONNX's coordinate transformation: each output index's position in the input (float64). The output's length
    in the formulas is ``scale * in_n``, as ONNX's reference has it (not the rounded ``out_n``)."""
    x = np.arange(out_n, dtype=np.float64)
    length = scale * in_n
    if ctm == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if length != 1 else np.full(out_n, -0.5)
    if ctm == "align_corners":
        return x * (in_n - 1) / (length - 1) if length != 1 else np.zeros(out_n)
    if ctm == "asymmetric":
        return x / scale
    if ctm == "tf_crop_and_resize":
        start, end = roi
        if length == 1:
            return np.full(out_n, (end - start) * (in_n - 1) / 2 + start * (in_n - 1))
        return x * (end - start) * (in_n - 1) / (length - 1) + start * (in_n - 1)
    # half_pixel_symmetric (opset 19): the centre of the input maps to the centre of the output
    center = in_n / 2
    return center * (1 - out_n / length) + (x + 0.5) / scale - 0.5


def _nearest(pos: np.ndarray, mode: str) -> np.ndarray:
    if mode == "floor":
        return np.floor(pos)
    if mode == "ceil":
        return np.ceil(pos)
    frac = pos - np.floor(pos)
    half = np.isclose(frac, 0.5)
    rounded = np.floor(pos + 0.5)
    return np.where(half, np.floor(pos) if mode == "round_prefer_floor" else np.ceil(pos), rounded)


def _kernel(d: np.ndarray, mode: str, a: float) -> np.ndarray:
    """The interpolation kernel at distances ``d``: linear (the triangle), cubic (Keys' with coefficient ``a``)."""
    d = np.abs(d)
    if mode == "linear":
        return np.clip(1 - d, 0, 1)
    return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                    np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))


def resize_matrix(in_n: int, out_n: int, scale: float, mode: str, ctm: str, nearest: str = "round_prefer_floor",
                  cubic_a: float = -0.75, exclude_outside: bool = False, antialias: bool = False,
                  roi: tuple[float, float] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """The (out_n x in_n) matrix that resizes one axis as ONNX's Resize does, and which output positions fall
    inside the input (crop-and-resize gives the others its extrapolation value).

    Linear and cubic weigh the neighbours of each output's source position by the kernel at their distance (past
    the ends, the edge element: its index clamped); with ``antialias`` and a scale below 1 the kernel is stretched
    by 1/scale and its weights normalized, so that downscaling averages."""
    pos = _source(out_n, in_n, scale, ctm, roi)
    inside = (pos >= 0) & (pos <= in_n - 1) if ctm == "tf_crop_and_resize" else np.ones(out_n, bool)
    m = np.zeros((out_n, in_n), np.float64)
    rows = np.arange(out_n)
    if mode == "nearest":
        m[rows, np.clip(_nearest(pos, nearest), 0, in_n - 1).astype(np.int64)] = 1.0
    else:
        stretch = min(scale, 1.0) if antialias else 1.0
        support = 1 if mode == "linear" else 2
        start = int(np.floor(-support / stretch)) + 1
        offsets = np.arange(start, 2 - start)
        base = np.floor(pos)
        weights = _kernel((offsets[None, :] - (pos - base)[:, None]) * stretch, mode, cubic_a)
        if antialias:
            weights = weights / weights.sum(axis=1, keepdims=True)
        idx = base[:, None].astype(np.int64) + offsets[None, :]
        if exclude_outside:
            weights = np.where((idx >= 0) & (idx < in_n), weights, 0.0)
            weights = weights / weights.sum(axis=1, keepdims=True)
        np.add.at(m, (np.repeat(rows, len(offsets)), np.clip(idx, 0, in_n - 1).reshape(-1)), weights.reshape(-1))
    m[~inside] = 0.0
    return m, inside


def along_axis(b: Build, t, shape: tuple[int, ...], axis: int, matrix: np.ndarray):
    """``t`` (ONNX ``shape``) with the axis ``axis`` mapped through ``matrix`` (out x in): one matrix product, the
    axis moved to ggml's first dimension and back where it is not there."""
    rank = len(shape)
    g = rank - 1 - axis
    ne = list(ne_of(shape)) + [1] * (4 - len(ne_of(shape)))
    swap = [0, 1, 2, 3]
    swap[0], swap[g] = g, 0
    t = b.contiguous(t)
    if g:
        t = E.ggml_cont(b.ctx, ggml_permute(b.ctx, t, *swap))
        ne[0], ne[g] = ne[g], ne[0]
    rows = ggml_reshape_2d(b.ctx, t, ne[0], math.prod(ne[1:]))
    y = ggml_mul_mat(b.ctx, b.tensor(Value.of(matrix.astype(np.float32))), rows)   # [out, rest]
    ne[0] = matrix.shape[0]
    y = b.reshaped(Value(tuple(reversed(ne)), y), tuple(reversed(ne)))
    if g:
        y = E.ggml_cont(b.ctx, ggml_permute(b.ctx, y, *swap))
    return y


@op("Resize", "Upsample", attrs=("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                                 "exclude_outside", "extrapolation_value", "antialias", "keep_aspect_ratio_policy",
                                 "axes", "scales"), static=(1, 2, 3))
def _resize(b: Build, node, xs, opset):
    x = xs[0]
    rank = len(x.shape)
    mode = _text(node, "mode", "nearest")
    ctm = _text(node, "coordinate_transformation_mode", "half_pixel" if node.op == "Resize" and opset >= 11
                else "asymmetric")
    nearest = _text(node, "nearest_mode", "round_prefer_floor" if node.op == "Resize" and opset >= 11 else "floor")
    if mode not in ("nearest", "linear", "cubic", "bilinear"):
        raise b.fail(f"Resize mode '{mode}' is not supported (nearest, linear and cubic are)")
    mode = "linear" if mode == "bilinear" else mode
    if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
                   "tf_crop_and_resize"):
        raise b.fail(f"coordinate_transformation_mode '{ctm}' is not supported")
    antialias = bool(int(node.attrs.get("antialias", 0)))
    if antialias and mode == "nearest":
        raise b.fail("antialias=1 with mode 'nearest' is not defined")
    policy = _text(node, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise b.fail(f"keep_aspect_ratio_policy '{policy}' is not supported")
    axes = [axis_of(b, a, rank) for a in node.attrs.get("axes", range(rank))]
    scales = sizes = None
    if node.op == "Upsample" or opset < 11:
        scales = [float(s) for s in (node.attrs["scales"] if "scales" in node.attrs else
                                     const_arg(b, xs[1], "scales").reshape(-1))]
    elif len(xs) > 2 and xs[2] is not None and np.asarray(const_arg(b, xs[2], "scales")).size:
        scales = [float(s) for s in const_arg(b, xs[2], "scales").reshape(-1)]
    elif len(xs) > 3 and xs[3] is not None:
        sizes = [int(s) for s in const_arg(b, xs[3], "sizes").reshape(-1)]
    else:
        raise b.fail("Resize needs scales or sizes")
    given = scales if scales is not None else sizes
    assert given is not None
    if len(given) != len(axes):
        raise b.fail(f"{'scales' if scales is not None else 'sizes'} {given} must hold one value per axis resized "
                     f"({len(axes)})")
    roi = [(0.0, 1.0)] * rank
    if ctm == "tf_crop_and_resize":
        r = [float(v) for v in const_arg(b, xs[1] if len(xs) > 1 else None, "roi").reshape(-1)]
        if len(r) != 2 * len(axes):
            raise b.fail(f"roi {r} must hold a start and an end per axis resized")
        for i, a in enumerate(axes):
            roi[a] = (r[i], r[len(axes) + i])
    full_scale, out_shape = [1.0] * rank, list(x.shape)
    if sizes is not None and policy != "stretch":
        ratio = [s / x.shape[a] for s, a in zip(sizes, axes)]
        scales, sizes = [min(ratio) if policy == "not_larger" else max(ratio)] * len(axes), None
        for a in axes:
            full_scale[a] = scales[0]
            out_shape[a] = int(scales[0] * x.shape[a] + 0.5)
    elif scales is not None:
        for s, a in zip(scales, axes):
            if s <= 0:
                raise b.fail(f"scales {scales} must be positive")
            full_scale[a], out_shape[a] = s, int(math.floor(x.shape[a] * s))
    else:
        assert sizes is not None
        for s, a in zip(sizes, axes):
            full_scale[a], out_shape[a] = s / x.shape[a], s
    if min(out_shape) < 1:
        raise b.fail(f"the output shape {out_shape} has an empty axis")
    t = b.tensor(x)
    factor = full_scale[-1]
    if (rank == 4 and not b.differentiable and full_scale[:2] == [1.0, 1.0] and full_scale[2] == factor
            and factor == int(factor) and factor >= 2 and not antialias and
            ((mode == "nearest" and ((ctm in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric")
                                      and nearest in ("round_prefer_floor", "round_prefer_ceil"))
                                     or (ctm == "asymmetric" and nearest == "floor")))
             or (mode == "linear" and ctm in ("half_pixel", "pytorch_half_pixel")))):
        kind = GGML_SCALE_MODE_NEAREST if mode == "nearest" else GGML_SCALE_MODE_BILINEAR
        return [Value(tuple(out_shape), ggml_upscale(b.ctx, b.contiguous(t), int(factor), kind))]
    b.check_rank(x.shape)
    shape = tuple(x.shape)
    inside = np.ones(out_shape, bool)
    for a in range(rank):
        if out_shape[a] != shape[a] or full_scale[a] != 1.0 or roi[a] != (0.0, 1.0):
            m, kept = resize_matrix(shape[a], out_shape[a], full_scale[a], mode, ctm, nearest,
                                    float(node.attrs.get("cubic_coeff_a", -0.75)),
                                    bool(int(node.attrs.get("exclude_outside", 0))), antialias, roi[a])
            t = along_axis(b, t, shape, a, m)
            shape = tuple(out_shape[a] if i == a else d for i, d in enumerate(shape))
            inside &= kept.reshape([-1 if i == a else 1 for i in range(rank)])
    extrapolation = float(node.attrs.get("extrapolation_value", 0.0))
    if not inside.all() and extrapolation != 0.0:   # crop-and-resize: the value where the source is outside
        t = E.ggml_add(b.ctx, t, b.tensor(Value.of(np.where(inside, 0.0, extrapolation).astype(np.float32))))
    return [Value(tuple(out_shape), t)]
