"""numpy references of the kernels ggmlpy's patches add or change, shared by the CPU and GPU kernel tests:
dropout's mask (patches/0018), max and average pooling with their backward passes by the pooling rule of every
backend (patches/0038), and the im2col gradient (patches/0016). Written from ggml's definitions of the ops, not
from the kernels' code paths; sums are float64.
"""
from __future__ import annotations

import numpy as np


FLT_MAX = float(np.finfo(np.float32).max)


def dropout_keep(seed: int, n: int, p: float, start: int = 0) -> np.ndarray:
    """Which of the elements ``start .. start + n - 1`` (logical indices) ggml_dropout keeps: the lowbias32 hash
    of (seed, index) against p."""
    def mix(x):
        x = x.astype(np.uint32)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
        return x
    i = np.arange(start, start + n, dtype=np.uint64)
    lo, hi = (i & np.uint64(0xFFFFFFFF)).astype(np.uint32), (i >> np.uint64(32)).astype(np.uint32)
    k = mix(np.uint32(seed & 0xFFFFFFFF) ^ mix(hi + np.uint32(0x9E3779B9)))
    h = mix(mix(lo ^ k) + k)
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24) >= np.float32(p)


def pool_out_size(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - k) // s + 1


def _windows(h: int, w: int, k0: int, k1: int, s0: int, s1: int, p0: int, p1: int):
    """(oy, ox, rows, cols) of every output position: the window's in-bounds input rows and columns."""
    for oy in range(pool_out_size(h, k1, s1, p1)):
        iy = oy * s1 - p1
        rows = np.arange(max(iy, 0), min(iy + k1, h))
        for ox in range(pool_out_size(w, k0, s0, p0)):
            ix = ox * s0 - p0
            yield oy, ox, rows, np.arange(max(ix, 0), min(ix + k0, w))


def max_pool_2d(x: np.ndarray, k0: int, k1: int, s0: int, s1: int, p0: int, p1: int):
    """Max pooling of ``x`` (..., H, W) by the rule of every backend: scanning a window row by row, its first
    NaN wins (the window pools to NaN), else its first maximum when that is above -FLT_MAX; a window of
    nothing above -FLT_MAX pools to -FLT_MAX and passes no gradient. Returns (out, arg): the float32 result
    and the flat index y*W + x of the winning element in its plane (-1: none)."""
    h, w = x.shape[-2:]
    lead = x.shape[:-2]
    oh, ow = pool_out_size(h, k1, s1, p1), pool_out_size(w, k0, s0, p0)
    out = np.empty(lead + (oh, ow), np.float32)
    arg = np.empty(lead + (oh, ow), np.int64)
    for oy, ox, rows, cols in _windows(h, w, k0, k1, s0, s1, p0, p1):
        win = x[..., rows[:, None], cols[None, :]].reshape(lead + (-1,))
        flat = (rows[:, None] * w + cols[None, :]).ravel()
        nan = np.isnan(win)
        first_nan = np.argmax(nan, axis=-1)
        m = np.max(np.where(nan, -np.inf, win), axis=-1)
        first_max = np.argmax(np.where(nan, False, win == m[..., None]), axis=-1)
        any_nan = nan.any(axis=-1)
        above = m > -FLT_MAX
        out[..., oy, ox] = np.where(any_nan, np.nan, np.where(above, m, -FLT_MAX))
        arg[..., oy, ox] = np.where(any_nan, flat[first_nan], np.where(above, flat[first_max], -1))
    return out, arg


def pool_2d_back(x: np.ndarray, g: np.ndarray, op: str, k0: int, k1: int, s0: int, s1: int, p0: int,
                 p1: int) -> np.ndarray:
    """d loss / d x of pool_2d (``op`` "max" or "avg"), given d loss / d out = ``g``, in float64. Average pooling
    divides by k0*k1 whatever the padding (ggml's definition); max pooling passes each window's gradient to the
    element ``max_pool_2d`` picks."""
    h, w = x.shape[-2:]
    lead = x.shape[:-2]
    dx = np.zeros(lead + (h * w,), np.float64)
    g64 = g.astype(np.float64)
    if op == "max":
        _, arg = max_pool_2d(x, k0, k1, s0, s1, p0, p1)
        planes = dx.reshape(-1, h * w)
        a, gg = arg.reshape(len(planes), -1), g64.reshape(len(planes), -1)
        for i in range(len(planes)):
            keep = a[i] >= 0
            np.add.at(planes[i], a[i][keep], gg[i][keep])
        return dx.reshape(x.shape)
    dx = dx.reshape(x.shape)
    for oy, ox, rows, cols in _windows(h, w, k0, k1, s0, s1, p0, p1):
        dx[..., rows[:, None], cols[None, :]] += g64[..., oy, ox][..., None, None] / (k0 * k1)
    return dx


def avg_pool_2d_back_terms(shape: tuple, g: np.ndarray, k0: int, k1: int, s0: int, s1: int, p0: int,
                           p1: int) -> tuple[np.ndarray, int]:
    """For average pooling's backward: per input element, the sum of the magnitudes of the terms g/(k0*k1) it
    adds up, and the most terms any element adds (what a per-element rounding bound scales with)."""
    ones = np.zeros(shape, np.float32)
    magnitude = pool_2d_back(ones, np.abs(g), "avg", k0, k1, s0, s1, p0, p1)
    count = pool_2d_back(ones, np.ones_like(g), "avg", k0, k1, s0, s1, p0, p1) * (k0 * k1)
    return magnitude, int(round(count.max()))


def im2col_back(cols: np.ndarray, image_shape: tuple, kh: int, kw: int, s0: int, s1: int, p0: int, p1: int,
                d0: int, d1: int) -> np.ndarray:
    """The gradient of ggml_im2col (2-D) with respect to its image (N, C, H, W), given the gradient ``cols`` of
    its result (N, OH, OW, C*KH*KW), in float64: every tap adds back to the pixel it read."""
    n, c, h, w = image_shape
    _, oh, ow, _ = cols.shape
    dx = np.zeros(image_shape, np.float64)
    g = cols.astype(np.float64).reshape(n, oh, ow, c, kh, kw)
    for ky in range(kh):
        iy = np.arange(oh) * s1 + ky * d1 - p1
        ry = (iy >= 0) & (iy < h)
        for kx in range(kw):
            ix = np.arange(ow) * s0 + kx * d0 - p0
            rx = (ix >= 0) & (ix < w)
            taps = g[:, ry][:, :, rx][..., ky, kx]            # (n, oh', ow', c)
            dx[:, :, iy[ry][:, None], ix[rx][None, :]] += np.transpose(taps, (0, 3, 1, 2))
    return dx
