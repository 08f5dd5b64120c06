"""ONNX's detection operators: NonMaxSuppression (computed in numpy where its inputs are known when the graph is
built: its output's length depends on the values, which a ggml graph cannot) and RoiAlign (the regions known when
the graph is built: each output pixel a fixed weighted sum of bilinear samples, one matrix product per image; max
mode as ONNX's reference defines it, the largest weighted corner of any sample)."""
from __future__ import annotations

import math

import numpy as np

from ..ops import elementwise as E
from ..ops.conv import GGML_OP_POOL_MAX, ggml_pool_2d
from ..ops.layout import ggml_reshape_2d, ggml_reshape_4d, ggml_view_4d
from ..ops.linalg import ggml_mul_mat
from ..ops.reduce import ggml_concat
from .registry import const_arg, op
from .values import Build, Value


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """Boxes as (y_min, x_min, y_max, x_max)."""
    if center:   # (x_center, y_center, width, height)
        x, y, w, h = boxes[:, 0], boxes[:, 1], boxes[:, 2] / 2, boxes[:, 3] / 2
        return np.stack([y - h, x - w, y + h, x + w], axis=1)
    return np.stack([np.minimum(boxes[:, 0], boxes[:, 2]), np.minimum(boxes[:, 1], boxes[:, 3]),
                     np.maximum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 1], boxes[:, 3])], axis=1)


def _suppresses(kept: np.ndarray, box: np.ndarray, threshold: float) -> bool:
    """Whether ``box`` overlaps any of ``kept`` by an intersection over union above ``threshold``."""
    if not len(kept):
        return False
    iy = np.minimum(kept[:, 2], box[2]) - np.maximum(kept[:, 0], box[0])
    ix = np.minimum(kept[:, 3], box[3]) - np.maximum(kept[:, 1], box[1])
    inter = np.where((iy > 0) & (ix > 0), iy * ix, 0.0)
    union = (kept[:, 2] - kept[:, 0]) * (kept[:, 3] - kept[:, 1]) + (box[2] - box[0]) * (box[3] - box[1]) - inter
    iou = np.where((inter > 0) & (union > 0), inter / np.where(union > 0, union, 1.0), 0.0)
    return bool((iou > threshold).any())


def _nms(node, xs, opset):
    boxes, scores = np.asarray(xs[0], np.float64), np.asarray(xs[1], np.float64)
    limit = int(np.asarray(xs[2]).reshape(-1)[0]) if len(xs) > 2 and xs[2] is not None and np.size(xs[2]) else 0
    iou = float(np.asarray(xs[3]).reshape(-1)[0]) if len(xs) > 3 and xs[3] is not None and np.size(xs[3]) else 0.0
    floor = float(np.asarray(xs[4]).reshape(-1)[0]) if len(xs) > 4 and xs[4] is not None and np.size(xs[4]) else None
    center = bool(int(node.attrs.get("center_point_box", 0)))
    selected = []
    for batch in range(boxes.shape[0]):
        corners = _corners(boxes[batch], center)
        for cls in range(scores.shape[1]):
            s = scores[batch, cls]
            order = [int(i) for i in np.lexsort((np.arange(len(s)), -s)) if floor is None or s[i] > floor]
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                if not _suppresses(corners[kept], corners[i], iou):
                    kept.append(i)
            selected += [(batch, cls, i) for i in kept]
    return [np.array(selected, np.int64).reshape(-1, 3)]


@op("NonMaxSuppression", attrs=("center_point_box",), fold=_nms, static=(0, 1, 2, 3, 4))
def _nms_build(b: Build, node, xs, opset):
    raise b.fail("NonMaxSuppression of boxes or scores the graph computes: its output's length depends on the "
                 "values (ggml's graphs have fixed shapes)")


def roi_matrix(roi: np.ndarray, height: int, width: int, out_h: int, out_w: int, scale: float, ratio: int,
               half_pixel: bool, max_mode: bool) -> np.ndarray:
    """One region's weights over the image's pixels (H*W columns): a row per output pixel (avg: the mean of its
    bilinear samples), or (max) a row per output pixel, sample and corner (each corner's weighted value)."""
    offset = 0.5 if half_pixel else 0.0
    x0, y0, x1, y1 = (float(v) * scale - offset for v in roi)
    rw, rh = x1 - x0, y1 - y0
    if not half_pixel:
        rw, rh = max(rw, 1.0), max(rh, 1.0)
    bh, bw = rh / out_h, rw / out_w
    gh = ratio if ratio > 0 else int(math.ceil(rh / out_h))
    gw = ratio if ratio > 0 else int(math.ceil(rw / out_w))
    if gh * gw <= 0:   # an empty region: no samples, every output 0 (max: one zero row per output)
        return np.zeros((out_h * out_w, height * width))
    count = gh * gw
    rows = out_h * out_w * (gh * gw * 4 if max_mode else 1)
    m = np.zeros((rows, height * width), np.float64)
    for ph in range(out_h):
        for pw in range(out_w):
            for iy in range(gh):
                y = y0 + ph * bh + (iy + 0.5) * bh / gh
                for ix in range(gw):
                    x = x0 + pw * bw + (ix + 0.5) * bw / gw
                    sample = ((ph * out_w + pw) * gh + iy) * gw + ix
                    if y < -1.0 or y > height or x < -1.0 or x > width:
                        continue   # outside: weight 0 (a max row of zeros)
                    yl, yh, ly = _neighbours(max(y, 0.0), height)
                    xl, xh, lx = _neighbours(max(x, 0.0), width)
                    weights = ((1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx)
                    places = (yl * width + xl, yl * width + xh, yh * width + xl, yh * width + xh)
                    for k, (w, p) in enumerate(zip(weights, places)):
                        if max_mode:
                            m[sample * 4 + k, p] += w
                        else:
                            m[ph * out_w + pw, p] += w / count
    return m


def _neighbours(pos: float, size: int) -> tuple[int, int, float]:
    """The two pixels a bilinear sample at ``pos`` (>= 0) reads along an axis of ``size``, and its weight of the
    second (past the last pixel: the last one, weight 0)."""
    low = int(pos)
    if low >= size - 1:
        return size - 1, size - 1, 0.0
    return low, low + 1, pos - low


@op("RoiAlign", attrs=("coordinate_transformation_mode", "mode", "output_height", "output_width", "sampling_ratio",
                       "spatial_scale"), static=(1, 2), since=10)
def _roi_align(b: Build, node, xs, opset):
    x = xs[0]
    if len(x.shape) != 4:
        raise b.fail(f"RoiAlign takes images (N, C, H, W), got shape {x.shape}")
    n, c, h, w = x.shape
    rois = np.asarray(const_arg(b, xs[1], "rois"), np.float64).reshape(-1, 4)
    batch = np.asarray(const_arg(b, xs[2], "batch_indices"), np.int64).reshape(-1)
    if not len(rois):
        raise b.fail("RoiAlign of no regions (an empty output) is not supported")
    if len(batch) != len(rois) or ((batch < 0) | (batch >= n)).any():
        raise b.fail(f"batch_indices {batch.tolist()} must give an image (0..{n - 1}) for each of the {len(rois)} "
                     "regions")
    half_pixel = node.attrs.get("coordinate_transformation_mode",
                                "half_pixel" if opset >= 16 else "output_half_pixel") == "half_pixel"
    max_mode = node.attrs.get("mode", "avg") == "max"
    oh, ow = int(node.attrs.get("output_height", 1)), int(node.attrs.get("output_width", 1))
    scale, ratio = float(node.attrs.get("spatial_scale", 1.0)), int(node.attrs.get("sampling_ratio", 0))
    t = b.contiguous(b.tensor(x))
    parts = []
    for roi, img in zip(rois, batch):
        m = roi_matrix(roi, h, w, oh, ow, scale, ratio, half_pixel, max_mode)
        nb = [int(t.ptr.nb[i]) for i in range(4)]
        pixels = ggml_view_4d(b.ctx, t, w * h, c, 1, 1, nb[2], nb[3], nb[3], int(img) * nb[3])
        if img:   # a copy: a GPU's kernels take operands at aligned offsets only
            pixels = E.ggml_cont(b.ctx, pixels)
        pixels = ggml_reshape_2d(b.ctx, pixels, w * h, c)                                       # [H*W, C]
        y = ggml_mul_mat(b.ctx, b.tensor(Value.of(m.astype(np.float32))), pixels)              # [rows, C]
        if max_mode:
            per = m.shape[0] // (oh * ow)
            y = ggml_pool_2d(b.ctx, ggml_reshape_4d(b.ctx, y, m.shape[0], c, 1, 1), GGML_OP_POOL_MAX, per, 1, per, 1,
                             0, 0)
        parts.append(ggml_reshape_4d(b.ctx, E.ggml_cont(b.ctx, y), ow, oh, c, 1))
    out = parts[0]
    for p in parts[1:]:
        out = ggml_concat(b.ctx, out, p, 3)
    return [Value((len(rois), c, oh, ow), out)]
