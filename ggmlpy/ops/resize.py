"""Spatial rearrangement: reflect and extended padding, upscaling, rolling, and SAM's window partitions."""
from __future__ import annotations

from .._ffi import lib
from ..core.args import c_int_arg, fail, INT32_MAX, is_int
from ..core.types import GGML_TYPE_F32
from ..graph.objects import Context, Tensor
from .attention import shape_text
from .base import contiguous, make_op, operand, rows_contiguous, types
from .conv import GGML_SCALE_MODE_NEAREST, SCALE_MODES


def ggml_pad_reflect_1d(ctx: Context, a: Tensor, p0: int, p1: int) -> Tensor:
    """Pad every row (along ne[0]) by reflection: ``p0`` values before, ``p1`` after.

    Row ``[x0, x1, x2, x3]`` padded with ``p0 = 2, p1 = 1`` becomes ``[x2, x1, x0, x1, x2, x3, x2]``:
    the edge value itself is not repeated, as numpy's ``np.pad(x, (p0, p1), mode="reflect")`` along
    the last numpy axis. Each padding must be shorter than the row. ggml has no backward pass for it:
    in a trainable graph it may not lie between a parameter and the loss.

    Arguments:
        ctx: [glossary]
        a: F32 tensor ``[ne0, ne1, ne2, ne3]``, contiguous (apply ``ggml_cont`` to a view first).
        p0: the number of values added before each row, ``0 <= p0 < ne0``.
        p1: the number added after each row, ``0 <= p1 < ne0``.

    Value: a new F32 Tensor ``[ne0 + p0 + p1, ne1, ne2, ne3]``.

    Example:
        >>> y = ggml_pad_reflect_1d(ctx, audio, 256, 256)   # [4096, batch] -> [4608, batch]
    """
    fn = "ggml_pad_reflect_1d"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    contiguous(fn, a)
    p0, p1 = c_int_arg(fn, "p0", p0, 0), c_int_arg(fn, "p1", p1, 0)
    n0 = a.shape[0]
    if p0 >= n0 or p1 >= n0:
        fail(fn, f"each padding must be shorter than the row (a.ne[0] = {n0}), got p0={p0}, p1={p1}: a reflection "
                     "repeats the row's inner values only; pad in several steps or use ggml_pad_ext for zeros")
    return make_op(fn, ctx, lib.ggml_pad_reflect_1d, (a,), (n0 + p0 + p1,) + a.shape[1:], (p0, p1))


def ggml_pad_ext(ctx: Context, a: Tensor, lp0: int = 0, rp0: int = 0, lp1: int = 0, rp1: int = 0, lp2: int = 0,
                 rp2: int = 0, lp3: int = 0, rp3: int = 0) -> Tensor:
    """Zero padding on both sides of each dimension: ``ne[i]`` becomes ``lp_i + ne[i] + rp_i``.

    ``lp_i`` zeros go before and ``rp_i`` after the values along ggml dimension i (``ggml_pad`` pads
    after only). In numpy terms (reversed axes) it is
    ``np.pad(x, ((lp3, rp3), (lp2, rp2), (lp1, rp1), (lp0, rp0)))`` on the 4-D array. ggml has no
    backward pass for it: in a trainable graph it may not lie between a parameter and the loss.

    Arguments:
        ctx: [glossary]
        a: F32 tensor (any strides).
        lp0, rp0: zeros before / after along ne[0] (ints >= 0, default 0).
        lp1, rp1: the same along ne[1]; lp2, rp2 along ne[2]; lp3, rp3 along ne[3].

    Value: a new F32 Tensor ``[lp0 + ne0 + rp0, lp1 + ne1 + rp1, lp2 + ne2 + rp2, lp3 + ne3 + rp3]``.

    Example:
        >>> y = ggml_pad_ext(ctx, img, 1, 1, 1, 1)          # [W, H, C, N] -> [W + 2, H + 2, C, N]
    """
    fn = "ggml_pad_ext"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    names = ("lp0", "rp0", "lp1", "rp1", "lp2", "rp2", "lp3", "rp3")
    pads = tuple(c_int_arg(fn, name, v, 0) for name, v in zip(names, (lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)))
    shape = tuple(n + pads[2 * i] + pads[2 * i + 1] for i, n in enumerate(a.shape))
    return make_op(fn, ctx, lib.ggml_pad_ext, (a,), shape, pads)


def ggml_upscale(ctx: Context, a: Tensor, scale_factor: int, mode: int = GGML_SCALE_MODE_NEAREST) -> Tensor:
    """Upscale images by an integer factor along ne[0] and ne[1] (width and height).

    ``a [W, H, C, N]`` becomes ``[W * scale_factor, H * scale_factor, C, N]``. Modes, with pixel
    centres aligned as in PyTorch's ``interpolate(..., align_corners=False)``:
    ``GGML_SCALE_MODE_NEAREST`` repeats each pixel in a ``scale_factor`` x ``scale_factor`` block;
    ``GGML_SCALE_MODE_BILINEAR`` interpolates linearly between the 4 nearest pixels, at source
    coordinate ``(i + 0.5) / scale_factor - 0.5``, clamped to the image (edges are repeated);
    ``GGML_SCALE_MODE_BICUBIC`` uses the 16 nearest pixels with the cubic convolution kernel
    (``a = -0.75``, as PyTorch), indices clamped to the image. ggml has no backward pass for it: in a
    trainable graph it may not lie between a parameter and the loss.

    Arguments:
        ctx: [glossary]
        a: F32 tensor ``[W, H, C, N]`` (any strides).
        scale_factor: the integer factor, >= 2 (ggml refuses 1; skip the op instead).
        mode: ``GGML_SCALE_MODE_NEAREST`` (the default, 0), ``GGML_SCALE_MODE_BILINEAR`` (1) or
            ``GGML_SCALE_MODE_BICUBIC`` (2).

    Value: a new F32 Tensor ``[W * scale_factor, H * scale_factor, C, N]``.

    Example:
        >>> up = ggml_upscale(ctx, img, 2, GGML_SCALE_MODE_BILINEAR)   # [8, 8, 3, n] -> [16, 16, 3, n]
    """
    fn = "ggml_upscale"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    sf = c_int_arg(fn, "scale_factor", scale_factor)
    if sf < 2:
        fail(fn, f"scale_factor must be an int >= 2, got {sf} (a factor of 1 changes nothing: leave the op out)")
    if not is_int(mode) or int(mode) not in SCALE_MODES:
        fail(fn, f"mode must be GGML_SCALE_MODE_NEAREST (0), GGML_SCALE_MODE_BILINEAR (1) or "
                     f"GGML_SCALE_MODE_BICUBIC (2), got {mode!r}")
    w, h, c, n = a.shape
    return make_op(fn, ctx, lib.ggml_upscale, (a,), (w * sf, h * sf, c, n), (sf, int(mode)))


def ggml_roll(ctx: Context, a: Tensor, shift0: int = 0, shift1: int = 0, shift2: int = 0, shift3: int = 0) -> Tensor:
    """Shift elements circularly along each dimension, as ``np.roll``.

    Along ggml dimension i, the element at index ``j`` moves to ``(j + shift_i) mod ne[i]``; a
    negative shift moves towards the start. In numpy terms (reversed axes) the result is
    ``np.roll(x, (shift3, shift2, shift1, shift0), axis=(0, 1, 2, 3))`` on the 4-D array. Each shift
    must be smaller than its dimension in absolute value. ggml has no backward pass for it: in a
    trainable graph it may not lie between a parameter and the loss.

    Arguments:
        ctx: [glossary]
        a: F32 tensor with contiguous rows.
        shift0, shift1, shift2, shift3: the shifts along ne[0] .. ne[3] (ints, default 0),
            ``|shift_i| < ne[i]`` (reduce a larger shift modulo ne[i] first).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> y = ggml_roll(ctx, x, 1)               # [x3, x0, x1, x2] from [x0, x1, x2, x3]
    """
    fn = "ggml_roll"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    rows_contiguous(fn, a)
    shifts = tuple(c_int_arg(fn, f"shift{i}", s) for i, s in enumerate((shift0, shift1, shift2, shift3)))
    for i, (s, n) in enumerate(zip(shifts, a.shape)):
        if abs(s) >= n:
            fail(fn, f"|shift{i}| must be smaller than a.ne[{i}] = {n}, got {s}; use {s} % {n} = {s % n}")
    return make_op(fn, ctx, lib.ggml_roll, (a,), a.shape, shifts, a.type)


def ggml_win_part(ctx: Context, a: Tensor, w: int) -> Tensor:
    """Split ``[C, W, H]`` into non-overlapping ``w x w`` windows ``[C, w, w, n_windows]``, zero-padded.

    W and H are padded with zeros up to multiples of ``w``; window ``py * ceil(W / w) + px`` holds
    ``a[:, px*w : px*w + w, py*w : py*w + w]``. ``ggml_win_unpart`` undoes it. ggml has no backward
    pass for it: it may not lie between a trainable parameter and the loss.

    Arguments:
        ctx: [glossary]
        a: contiguous F32 tensor ``[C, W, H]`` (ne[3] == 1).
        w: the window size (an int >= 1).

    Value: a new F32 Tensor ``[C, w, w, ceil(W / w) * ceil(H / w)]``.

    Example:
        >>> win = ggml_win_part(ctx, x, 14)                   # x [768, 64, 64] -> [768, 14, 14, 25]
    """
    fn = "ggml_win_part"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    contiguous(fn, a)
    if a.shape[3] != 1:
        fail(fn, f"a must be 3-D [C, W, H] (ne[3] == 1), got {shape_text(a)}")
    w = c_int_arg(fn, "w", w, 1)
    npx, npy = -(-a.shape[1] // w), -(-a.shape[2] // w)
    if npx * npy > INT32_MAX:
        fail(fn, f"too many windows: {npx} x {npy}; use a larger w")
    return make_op(fn, ctx, lib.ggml_win_part, (a,), (a.shape[0], w, w, npx * npy), (w,))


def ggml_win_unpart(ctx: Context, a: Tensor, w0: int, h0: int, w: int) -> Tensor:
    """Reassemble ``w x w`` windows ``[C, w, w, n_windows]`` into ``[C, w0, h0]``: the inverse of ``ggml_win_part``.

    The padding ``ggml_win_part`` added is dropped. ggml has no backward pass for it.

    Arguments:
        ctx: [glossary]
        a: contiguous F32 windows ``[C, w, w, ceil(w0 / w) * ceil(h0 / w)]``.
        w0: the original width (an int >= 1).
        h0: the original height (an int >= 1).
        w: the window size (an int >= 1), equal to a.ne[1] and a.ne[2].

    Value: a new F32 Tensor ``[C, w0, h0]``.

    Example:
        >>> x = ggml_win_unpart(ctx, win, 64, 64, 14)         # [768, 14, 14, 25] -> [768, 64, 64]
    """
    fn = "ggml_win_unpart"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    contiguous(fn, a)
    w0, h0, w = c_int_arg(fn, "w0", w0, 1), c_int_arg(fn, "h0", h0, 1), c_int_arg(fn, "w", w, 1)
    n_win = -(-w0 // w) * -(-h0 // w)
    if a.shape[1:] != (w, w, n_win):
        fail(fn, f"a must be [C, w, w, ceil(w0 / w) * ceil(h0 / w)] = [C, {w}, {w}, {n_win}] for w0={w0}, "
                     f"h0={h0}, w={w}, got {shape_text(a)}")
    return make_op(fn, ctx, lib.ggml_win_unpart, (a,), (a.shape[0], w0, h0, 1), (w0, h0, w))
