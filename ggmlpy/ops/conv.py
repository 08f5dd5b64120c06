"""Convolutions and pooling: im2col, 1-D and 2-D convolutions (plain, transposed, depthwise, direct) and pools."""
from __future__ import annotations

import numpy as np

from .._ffi import lib
from ..core.args import c_int_arg, fail, float_arg
from ..core.types import GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, type_name
from ..errors import GgmlTypeError
from ..graph.objects import Context, Tensor
from .base import contiguous, F32_F16, floating, make_op, operand, out_size, rows_contiguous, types


GGML_OP_POOL_MAX = int(lib.GGML_OP_POOL_MAX)
GGML_OP_POOL_AVG = int(lib.GGML_OP_POOL_AVG)


def ggml_im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
                is_2D: bool = True, dst_type: int = GGML_TYPE_F32) -> Tensor:
    """Unfold convolution patches into columns, so that a convolution becomes a ``ggml_mul_mat``.

    2-D (``is_2D=True``): kernel ``a [KW, KH, Cin, Cout]`` (only its shape is used) and data
    ``b [W, H, Cin, N]`` give ``[Cin * KH * KW, OW, OH, N]``, with
    ``OW = (W + 2 p0 - d0 (KW - 1) - 1) // s0 + 1`` and likewise OH from H, KH, s1, p1, d1.
    1-D (``is_2D=False``): kernel ``a [K, Cin, Cout]`` and data ``b [L, Cin, N]`` give
    ``[Cin * K, OL, N]``; s1 and d1 may then be 0 and p1 must be 0. Output sizes below 1, channel
    counts that differ and bad types raise before ggml is called.

    Arguments:
        ctx: [glossary]
        a: the convolution kernel (any type; its shape sets the patch size).
        b: the data, F32 (F32 or F16 when ``dst_type`` is F16), with contiguous rows.
        s0, s1: strides along width and height (>= 1). p0, p1: zero padding on each side (>= 0).
        d0, d1: dilations (>= 1).
        is_2D: True (the default) for 2-D patches, False for 1-D.
        dst_type: ``GGML_TYPE_F32`` (the default) or ``GGML_TYPE_F16``, the type of the result.

    Value: a new Tensor of the shape above and type ``dst_type``.

    Example:
        >>> cols = ggml_im2col(ctx, kernel, images, 1, 1, 1, 1, 1, 1)   # 3x3, padding 1: same size
    """
    fn = "ggml_im2col"
    a, b = operand(fn, a), operand(fn, b, "b")
    if dst_type not in (GGML_TYPE_F32, GGML_TYPE_F16):
        fail(fn, "dst_type must be GGML_TYPE_F32 or GGML_TYPE_F16", GgmlTypeError)
    # the CPU kernel asserts an F32 source for an F32 result (F16 sources only give F16 results)
    types(fn, b, {GGML_TYPE_F32} if dst_type == GGML_TYPE_F32 else {GGML_TYPE_F32, GGML_TYPE_F16}, "b")
    rows_contiguous(fn, b, "b")
    for name, v, lo in (("s0", s0, 1), ("p0", p0, 0), ("d0", d0, 1)):
        c_int_arg(fn, name, v, lo)
    # 1-D: ggml ignores s1/d1 (ggml_conv_1d passes 0), and p1 > 0 would silently zero the output
    for name, v, lo in (("s1", s1, 1 if is_2D else 0), ("p1", p1, 0), ("d1", d1, 1 if is_2D else 0)):
        c_int_arg(fn, name, v, lo)
    if not is_2D and p1 != 0:
        fail(fn, f"p1 must be 0 for a 1-D im2col, got {p1}")
    if is_2D:
        if a.shape[2] != b.shape[2]:
            fail(fn, f"kernel channels a.ne[2]={a.shape[2]} must equal input channels b.ne[2]={b.shape[2]}")
        ow = out_size(fn, "width", b.shape[0], a.shape[0], s0, p0, d0)
        oh = out_size(fn, "height", b.shape[1], a.shape[1], s1, p1, d1)
        shape = (a.shape[2] * a.shape[1] * a.shape[0], ow, oh, b.shape[3])
    else:
        if a.shape[1] != b.shape[1]:
            fail(fn, f"kernel channels a.ne[1]={a.shape[1]} must equal input channels b.ne[1]={b.shape[1]}")
        if b.shape[3] != 1:
            fail(fn, f"1-D data b must have ne[3] == 1, got {list(b.shape)}")
        ol = out_size(fn, "length", b.shape[0], a.shape[0], s0, p0, d0)
        shape = (a.shape[1] * a.shape[0], ol, b.shape[2], 1)
    return make_op(fn, ctx, lib.ggml_im2col, (a, b), shape, (s0, s1, p0, p1, d0, d1, bool(is_2D), dst_type), dst_type)


def ggml_conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, p0: int = 0, d0: int = 1) -> Tensor:
    """Kernel ``a [K, Cin, Cout]``, data ``b [L, Cin, N]`` -> ``[OL, Cout, N]`` (im2col + mul_mat)."""
    fn = "ggml_conv_1d"
    a, b = operand(fn, a), operand(fn, b, "b")
    floating(fn, ("a", a), ("b", b))
    rows_contiguous(fn, b, "b")
    if a.type == GGML_TYPE_BF16 and b.type != GGML_TYPE_F32:  # a BF16 kernel makes an F32 im2col: F32 data only
        fail(fn, "with a BF16 kernel the data b must be F32", GgmlTypeError)
    for name, v, lo in (("s0", s0, 1), ("p0", p0, 0), ("d0", d0, 1)):
        c_int_arg(fn, name, v, lo)
    if a.shape[1] != b.shape[1] or b.shape[3] != 1:
        fail(fn, f"kernel a {list(a.shape)} and data b {list(b.shape)} must share ne[1] (channels)")
    ol = out_size(fn, "length", b.shape[0], a.shape[0], s0, p0, d0)
    ctx.reserve(4 * (a.shape[0] * a.shape[1] * ol * b.shape[2]) * 3, n_objects=4, what="ggml_conv_1d intermediates")
    out = make_op(fn, ctx, lib.ggml_conv_1d, (a, b), (ol, a.shape[2], b.shape[2], 1), (s0, p0, d0))
    n, oc = b.shape[2], a.shape[2]
    if n > 1:
        # ggml_conv_1d's data is laid out [OL, N, OC] although its shape says [OL, OC, N] (the upstream
        # bug fixed for ggml_conv_2d only): reorder it to the documented [OL, OC, N].
        ctx.reserve(4 * ol * oc * n, n_objects=3, what="ggml_conv_1d batch reorder")
        c = ctx.ptr
        out = Tensor(lib.ggml_cont(c, lib.ggml_permute(c, lib.ggml_reshape_3d(c, out.ptr, ol, n, oc), 0, 2, 1, 3)), ctx,
                     sources=(out,))
    return out


def ggml_conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
                 d0: int = 1, d1: int = 1) -> Tensor:
    """Kernel ``a [KW, KH, Cin, Cout]``, data ``b [W, H, Cin, N]`` -> ``[OW, OH, Cout, N]`` (im2col + mul_mat).

    ggml builds the im2col patches in F16 (F32 only for a BF16 kernel), for an F32 kernel too: the data is
    rounded to half precision (errors of about 1e-3 relative). ``ggml_conv_2d_direct`` computes in F32 (forward only);
    the model layer's ``ggml_layer_conv_2d`` uses an F32 im2col and trains in F32."""
    fn = "ggml_conv_2d"
    a, b = operand(fn, a), operand(fn, b, "b")
    floating(fn, ("a", a), ("b", b))
    rows_contiguous(fn, b, "b")
    if a.type == GGML_TYPE_BF16 and b.type != GGML_TYPE_F32:  # a BF16 kernel makes an F32 im2col: F32 data only
        fail(fn, "with a BF16 kernel the data b must be F32", GgmlTypeError)
    for name, v, lo in (("s0", s0, 1), ("s1", s1, 1), ("p0", p0, 0), ("p1", p1, 0), ("d0", d0, 1), ("d1", d1, 1)):
        c_int_arg(fn, name, v, lo)
    if a.shape[2] != b.shape[2]:
        fail(fn, f"kernel a {list(a.shape)} and data b {list(b.shape)} must share ne[2] (input channels)")
    ow = out_size(fn, "width", b.shape[0], a.shape[0], s0, p0, d0)
    oh = out_size(fn, "height", b.shape[1], a.shape[1], s1, p1, d1)
    cols = a.shape[0] * a.shape[1] * a.shape[2] * ow * oh * b.shape[3]
    ctx.reserve(4 * cols * 3, n_objects=6, what="ggml_conv_2d intermediates")
    return make_op(fn, ctx, lib.ggml_conv_2d, (a, b), (ow, oh, a.shape[3], b.shape[3]), (s0, s1, p0, p1, d0, d1))


def _pool_op(fn: str, op: object) -> int:
    if op not in (GGML_OP_POOL_MAX, GGML_OP_POOL_AVG):
        fail(fn, f"op must be GGML_OP_POOL_MAX or GGML_OP_POOL_AVG, got {op!r}")
    return int(op)


def ggml_pool_1d(ctx: Context, a: Tensor, op: int, k0: int, s0: int | None = None, p0: int = 0) -> Tensor:
    """Max or average pooling along ne[0]: ``[L, ...]`` becomes ``[(L + 2 p0 - k0) // s0 + 1, ...]``.

    Each window of ``k0`` elements (every ``s0``-th start, the row padded by ``p0`` on each side)
    gives its maximum or its mean; padding positions are skipped, so an average counts only the
    elements inside the row. ggml has no backward pass for it (use it for inference, or
    ``ggml_pool_2d`` with a height-1 kernel in trainable graphs).

    Arguments:
        ctx: [glossary]
        a: F32 or F16 tensor.
        op: ``GGML_OP_POOL_MAX`` or ``GGML_OP_POOL_AVG``.
        k0: window size (>= 1). s0: stride (>= 1; default ``k0``, windows side by side, as in ggmlR).
        p0: padding on each side (>= 0, default 0).

    Value: a new F32 Tensor; raises GgmlValueError when the output length would be below 1.

    Example:
        >>> y = ggml_pool_1d(ctx, x, GGML_OP_POOL_MAX, 2)   # halve ne[0] (stride 2 by default)
    """
    fn = "ggml_pool_1d"
    s0 = k0 if s0 is None else s0
    a = operand(fn, a)
    types(fn, a, F32_F16)
    contiguous(fn, a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    _pool_op(fn, op)
    c_int_arg(fn, "k0", k0, 1), c_int_arg(fn, "s0", s0, 1), c_int_arg(fn, "p0", p0, 0)
    ol = out_size(fn, "length", a.shape[0], k0, s0, p0)
    return make_op(fn, ctx, lib.ggml_pool_1d, (a,), (ol,) + a.shape[1:], (op, k0, s0, p0))


def _pool_out(n: int, k: int, s: int, p: float) -> int:
    f = np.float32
    with np.errstate(all="ignore"):
        size = (f(n) + f(2) * f(p) - f(k)) / f(s) + f(1)
    return int(size) if np.isfinite(size) and abs(size) < 2.0 ** 62 else 0


def ggml_pool_2d(ctx: Context, a: Tensor, op: int, k0: int, k1: int, s0: int | None = None,
                 s1: int | None = None, p0: float = 0, p1: float = 0) -> Tensor:
    """Max or average pooling over ne[0] x ne[1]: ``[W, H, C, N]`` becomes ``[OW, OH, C, N]``.

    ``OW = int((W + 2 p0 - k0) / s0) + 1`` and ``OH = int((H + 2 p1 - k1) / s1) + 1``. Each window gives
    its maximum or its mean; an average always divides by ``k0 * k1`` (padding counts as zeros).
    Differentiable.

    Arguments:
        ctx: [glossary]
        a: F32 or F16 tensor ``[W, H, C, N]`` (images in ggml layout).
        op: ``GGML_OP_POOL_MAX`` or ``GGML_OP_POOL_AVG``.
        k0, k1: window width and height (>= 1).
        s0, s1: strides (>= 1; default ``k0`` and ``k1``: windows side by side, as in ggmlR).
        p0, p1: padding on each side (>= 0, default 0; whole numbers, as ggml's kernel stores ints).

    Value: a new F32 Tensor ``[OW, OH, C, N]``; raises GgmlValueError when OW or OH would be below 1.

    Example:
        >>> y = ggml_pool_2d(ctx, x, GGML_OP_POOL_MAX, 2, 2)   # [28, 28, 8, n] -> [14, 14, 8, n]
    """
    fn = "ggml_pool_2d"
    s0 = k0 if s0 is None else s0
    s1 = k1 if s1 is None else s1
    a = operand(fn, a)
    types(fn, a, F32_F16)
    _pool_op(fn, op)
    contiguous(fn, a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    for name, v in (("k0", k0), ("k1", k1), ("s0", s0), ("s1", s1)):
        c_int_arg(fn, name, v, 1)
    p0f, p1f = float_arg(fn, "p0", p0, finite=True), float_arg(fn, "p1", p1, finite=True)
    if p0f < 0 or p1f < 0:
        fail(fn, f"padding must be >= 0, got p0={p0f}, p1={p1f}")
    # ggml's ggml_calc_pool_output_size, exactly: (ins + 2*p - k) / s + 1 in float32, truncated (a kernel larger
    # than the input by less than a stride gives 0.5 -> 0 there, and ggml asserts the size > 0)
    ow, oh = _pool_out(a.shape[0], k0, s0, p0f), _pool_out(a.shape[1], k1, s1, p1f)
    if ow < 1 or oh < 1:
        fail(fn, f"the pooled size would be {ow}x{oh} for input {a.shape[0]}x{a.shape[1]} and kernel {k0}x{k1}")
    return make_op(fn, ctx, lib.ggml_pool_2d, (a,), (ow, oh) + a.shape[2:], (op, k0, k1, s0, s1, p0f, p1f))


GGML_SCALE_MODE_NEAREST = int(lib.GGML_SCALE_MODE_NEAREST)
GGML_SCALE_MODE_BILINEAR = int(lib.GGML_SCALE_MODE_BILINEAR)
GGML_SCALE_MODE_BICUBIC = int(lib.GGML_SCALE_MODE_BICUBIC)
SCALE_MODES = (GGML_SCALE_MODE_NEAREST, GGML_SCALE_MODE_BILINEAR, GGML_SCALE_MODE_BICUBIC)

# ggml's CPU kernel of the direct 2-D convolution works through patches in a 16 MiB scratch area
# (GGML_IM2COL_WORK_SIZE): one patch (the kernel's KW*KH*Cin values and Cout results) must fit
_CONV_2D_WORK_SIZE = 16 * 1024 * 1024
INT32_LIMIT = (1 << 31) - 1


def element_size(t: Tensor) -> int:
    return int(lib.ggml_type_size(t.type))


def strides_of(t: Tensor) -> tuple[int, int, int, int]:
    p = t.ptr
    return (int(p.nb[0]), int(p.nb[1]), int(p.nb[2]), int(p.nb[3]))


def _conv_args(fn: str, **values: object) -> None:
    """Strides and dilations (names starting with s or d) >= 1, paddings >= 0, all C ints."""
    for name, v in values.items():
        c_int_arg(fn, name, v, 0 if name.startswith("p") else 1)


# ---------------------------------------------------------------- transposed convolutions

def ggml_conv_transpose_1d(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, p0: int = 0, d0: int = 1) -> Tensor:
    """Transposed 1-D convolution (a "deconvolution"): each input position scatters a scaled kernel.

    Kernel ``a [K, Cout, Cin]`` and data ``b [L, Cin]`` give ``[(L - 1) * s0 + K, Cout]``:
    ``out[c, i * s0 + k] += sum_ci b[ci, i] * a[ci, c, k]`` (numpy indices). It is the adjoint of the
    strided 1-D convolution with the same kernel (what its backward pass computes for the data),
    as PyTorch's ``conv_transpose1d`` with weight ``(Cin, Cout, K)``: numpy shapes are ``a`` as
    ``(Cin, Cout, K)``, ``b`` as ``(Cin, L)`` and the result as ``(Cout, OL)``. One sample at a time
    (``b`` is a matrix). ggml implements neither padding nor dilation here: ``p0`` must be 0 and
    ``d0`` 1 (crop the result with ``ggml_view_2d`` for an output padding). With an F16 kernel the
    data is rounded to F16 before the products. ggml has no backward pass for it: in a trainable
    graph it may not lie between a parameter and the loss (training raises an error naming it).

    Arguments:
        ctx: [glossary]
        a: the kernel, F32 or F16 ``[K, Cout, Cin]`` with contiguous rows.
        b: the data, F32 ``[L, Cin]`` (a matrix: ne[2] == ne[3] == 1) with contiguous rows; Cin must
            equal a's ne[2].
        s0: the stride (>= 1, default 1): how far apart the scattered kernels start.
        p0: must be 0 (the default; ggml has no padding for this op).
        d0: must be 1 (the default; ggml has no dilation for this op).

    Value: a new F32 Tensor ``[(L - 1) * s0 + K, Cout]``. Raises GgmlTypeError for other types,
    GgmlValueError for shapes that do not fit or p0/d0 other than 0/1.

    Example:
        >>> up = ggml_conv_transpose_1d(ctx, kernel, signal, 2)   # kernel [4, 8, 16], signal [50, 16] -> [102, 8]
    """
    fn = "ggml_conv_transpose_1d"
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, a, F32_F16, "a (the kernel)")
    types(fn, b, {GGML_TYPE_F32}, "b (the data)")
    rows_contiguous(fn, a, "a (the kernel)")
    rows_contiguous(fn, b, "b (the data)")
    _conv_args(fn, s0=s0)
    c_int_arg(fn, "p0", p0), c_int_arg(fn, "d0", d0)
    if p0 != 0 or d0 != 1:
        fail(fn, f"ggml implements only p0 = 0 and d0 = 1 for a transposed 1-D convolution, got p0={p0}, "
                     f"d0={d0}; crop the result with ggml_view_2d instead of padding")
    (k, cout, cin, a3), (length, b1, b2, b3) = a.shape, b.shape
    if a3 != 1:
        fail(fn, f"the kernel a must be 3-D [K, Cout, Cin], got {list(a.shape)}")
    if b2 != 1 or b3 != 1:
        fail(fn, f"the data b must be a matrix [L, Cin] (one sample; loop over samples with ggml_view_2d), got "
                     f"{list(b.shape)}")
    if b1 != cin:
        fail(fn, f"the kernel's input channels a.ne[2]={cin} must equal the data's channels b.ne[1]={b1} "
                     f"(kernel [K, Cout, Cin], data [L, Cin])")
    return make_op(fn, ctx, lib.ggml_conv_transpose_1d, (a, b), ((length - 1) * s0 + k, cout, 1, 1), (s0, p0, d0))


def ggml_conv_transpose_2d_p0(ctx: Context, a: Tensor, b: Tensor, stride: int = 1) -> Tensor:
    """Transposed 2-D convolution without padding: each input pixel scatters a scaled kernel.

    Kernel ``a [KW, KH, Cout, Cin]`` and data ``b [W, H, Cin, 1]`` give
    ``[(W - 1) * stride + KW, (H - 1) * stride + KH, Cout, 1]``:
    ``out[c, y * stride + ky, x * stride + kx] += sum_ci b[ci, y, x] * a[ci, c, ky, kx]`` (numpy
    indices). It is the adjoint of the strided 2-D convolution with the same kernel, as PyTorch's
    ``conv_transpose2d`` with weight ``(Cin, Cout, KH, KW)`` and ``padding=0``: numpy shapes are
    ``a`` as ``(Cin, Cout, KH, KW)``, ``b`` as ``(1, Cin, H, W)``. One image at a time: ggml's CPU
    kernel computes only the first sample of a batch, so ``b.ne[3]`` must be 1 (take each sample
    with ``ggml_view_4d`` and join the results with ``ggml_concat``). With an F16 kernel the data is
    rounded to F16 before the products. ggml has no backward pass for it: in a trainable graph it
    may not lie between a parameter and the loss (training raises an error naming it).

    Arguments:
        ctx: [glossary]
        a: the kernel, F32 or F16 ``[KW, KH, Cout, Cin]``, contiguous.
        b: the data, F32 ``[W, H, Cin, 1]`` with contiguous rows; Cin must equal a's ne[3].
        stride: the stride along width and height (>= 1, default 1).

    Value: a new F32 Tensor ``[(W - 1) * stride + KW, (H - 1) * stride + KH, Cout, 1]``.

    Example:
        >>> up = ggml_conv_transpose_2d_p0(ctx, kernel, img, 2)
        >>> # kernel [2, 2, 8, 16], img [7, 7, 16, 1] -> up [14, 14, 8, 1]
    """
    fn = "ggml_conv_transpose_2d_p0"
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, a, F32_F16, "a (the kernel)")
    types(fn, b, {GGML_TYPE_F32}, "b (the data)")
    contiguous(fn, a, "a (the kernel)")  # the CPU kernel reads each KW x KH plane as contiguous
    rows_contiguous(fn, b, "b (the data)")
    _conv_args(fn, stride=stride)
    (kw, kh, cout, cin), (w, h, b2, b3) = a.shape, b.shape
    if b2 != cin:
        fail(fn, f"the kernel's input channels a.ne[3]={cin} must equal the data's channels b.ne[2]={b2} "
                     f"(kernel [KW, KH, Cout, Cin], data [W, H, Cin, 1])")
    if b3 != 1:
        fail(fn, f"the data b must hold one image (b.ne[3] == 1; ggml's CPU kernel would compute only the first "
                     f"of a batch and leave the others 0), got {list(b.shape)}; transpose-convolve each sample (a "
                     "ggml_view_4d of b) and join the results with ggml_concat")
    shape = ((w - 1) * stride + kw, (h - 1) * stride + kh, cout, 1)
    return make_op(fn, ctx, lib.ggml_conv_transpose_2d_p0, (a, b), shape, (stride,))


# ---------------------------------------------------------------- depthwise and direct convolutions

def ggml_conv_1d_dw(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, p0: int = 0, d0: int = 1) -> Tensor:
    """Depthwise 1-D convolution: each channel of the data is convolved with its own kernel.

    Kernel ``a [K, 1, C]`` and data ``b [L, C]`` give ``[OL, C]`` with
    ``OL = (L + 2 p0 - d0 (K - 1) - 1) // s0 + 1`` and
    ``out[c, o] = sum_k a[c, 0, k] * b[c, o * s0 + k * d0 - p0]`` (numpy indices; positions outside
    ``[0, L)`` count as 0). Numpy shapes: ``a`` ``(C, 1, K)``, ``b`` ``(C, L)``, result ``(C, OL)``.
    Built from ``ggml_im2col`` (F16 patches, so the data is rounded to F16) and ``ggml_mul_mat``, one
    sample at a time. Differentiable with respect to the kernel and the data (train an F32 kernel).

    Arguments:
        ctx: [glossary]
        a: the kernels, F32 or F16 ``[K, 1, C]``, contiguous.
        b: the data, F32 ``[L, C]`` (one sample), contiguous.
        s0: the stride (>= 1, default 1). p0: zero padding on each side (>= 0, default 0).
        d0: the dilation (>= 1, default 1).

    Value: a new F32 Tensor ``[OL, C, 1]``. Raises GgmlValueError when the shapes do not fit or OL
    would be below 1, GgmlTypeError for other types.

    Example:
        >>> y = ggml_conv_1d_dw(ctx, kernels, x, 1, 1)   # kernels [3, 1, 16], x [100, 16] -> [100, 16]
    """
    fn = "ggml_conv_1d_dw"
    a, b = operand(fn, a), operand(fn, b, "b")
    # ggml multiplies the F16 patches (src0) by the kernel (src1): the CPU takes an F32 or F16 src1 there
    types(fn, a, F32_F16, "a (the kernels)")
    types(fn, b, {GGML_TYPE_F32}, "b (the data)")
    contiguous(fn, a, "a (the kernels)")
    contiguous(fn, b, "b (the data)")  # ggml reshapes it
    _conv_args(fn, s0=s0, p0=p0, d0=d0)
    (k, a1, c, a3), (length, b1, b2, b3) = a.shape, b.shape
    if a1 != 1 or a3 != 1:
        fail(fn, f"the kernels a must be [K, 1, C] (one kernel per channel), got {list(a.shape)}")
    if b2 != 1 or b3 != 1:
        fail(fn, f"the data b must be one sample [L, C], got {list(b.shape)}; convolve each sample separately")
    if b1 != c:
        fail(fn, f"the number of kernels a.ne[2]={c} must equal the data's channels b.ne[1]={b1}")
    ol = out_size(fn, "length", length, k, s0, p0, d0)
    ctx.reserve(4 * (k * ol * c) + 4 * ol * c, n_objects=4, what=f"{fn} intermediates")
    return make_op(fn, ctx, lib.ggml_conv_1d_dw, (a, b), (ol, c, 1, 1), (s0, p0, d0))


def ggml_conv_2d_dw(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
                    d0: int = 1, d1: int = 1) -> Tensor:
    """Depthwise 2-D convolution through im2col: each channel is convolved with its own kernel.

    Kernel ``a [KW, KH, 1, C]`` and images ``b [W, H, C, N]`` give ``[OW, OH, C, N]`` with
    ``OW = (W + 2 p0 - d0 (KW - 1) - 1) // s0 + 1`` (OH alike from H, KH, s1, p1, d1) and
    ``out[n, c, y, x] = sum_{ky,kx} a[c, 0, ky, kx] * b[n, c, y s1 + ky d1 - p1, x s0 + kx d0 - p0]``
    (numpy indices, positions outside the image count as 0). Numpy shapes: ``a`` ``(C, 1, KH, KW)``,
    ``b`` ``(N, C, H, W)``. The patches are F16, so the kernel must be F16 (or BF16) and the data is
    rounded to F16; ``ggml_conv_2d_dw_direct`` takes F32 kernels and computes in F32. Differentiable
    with respect to the data ``b`` (the F16 kernel itself cannot be trained).

    Arguments:
        ctx: [glossary]
        a: the kernels, F16 or BF16 ``[KW, KH, 1, C]`` (``[KW, KH, C, 1]`` is accepted too), contiguous.
        b: the images, F32 ``[W, H, C, N]``, contiguous.
        s0, s1: strides along width and height (>= 1, default 1).
        p0, p1: zero padding on each side (>= 0, default 0).
        d0, d1: dilations (>= 1, default 1).

    Value: a new F32 Tensor ``[OW, OH, C, N]``. Raises GgmlValueError when the channel counts differ or
    the output would be empty, GgmlTypeError for other types (an F32 kernel included).

    Example:
        >>> y = ggml_conv_2d_dw(ctx, k16, img, 1, 1, 1, 1)
        >>> # k16 F16 [3, 3, 1, 8], img [28, 28, 8, n] -> y [28, 28, 8, n]
    """
    fn = "ggml_conv_2d_dw"
    a, b = operand(fn, a), operand(fn, b, "b")
    if a.type not in (GGML_TYPE_F16, GGML_TYPE_BF16):
        fail(fn, f"the kernels a must be F16 or BF16 (ggml multiplies them with F16 patches), got "
                     f"{type_name(a.type)}; convert them with ggml_cpy into an F16 tensor, or use "
                     "ggml_conv_2d_dw_direct, which takes F32 kernels", GgmlTypeError)
    types(fn, b, {GGML_TYPE_F32}, "b (the images)")
    contiguous(fn, a, "a (the kernels)")  # ggml reshapes both
    contiguous(fn, b, "b (the images)")
    _conv_args(fn, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    (kw, kh, a2, a3), (w, h, c, n) = a.shape, b.shape
    if min(a2, a3) != 1 or a2 * a3 != c:
        fail(fn, f"the kernels a must be [KW, KH, 1, C] with C = b.ne[2] = {c} (one kernel per channel), got "
                     f"{list(a.shape)}")
    ow = out_size(fn, "width", w, kw, s0, p0, d0)
    oh = out_size(fn, "height", h, kh, s1, p1, d1)
    ctx.reserve(4 * (kw * kh * ow * oh * c * n) + 4 * ow * oh * c * n, n_objects=8, what=f"{fn} intermediates")
    return make_op(fn, ctx, lib.ggml_conv_2d_dw, (a, b), (ow, oh, c, n), (s0, s1, p0, p1, d0, d1))


def ggml_conv_2d_dw_direct(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
                           d0: int = 1, d1: int = 1) -> Tensor:
    """Depthwise 2-D convolution computed directly (no im2col), in F32.

    Same result as ``ggml_conv_2d_dw``: kernel ``a [KW, KH, 1, C]`` and images ``b [W, H, C, N]`` give
    ``[OW, OH, C, N]``, channel c of every image convolved with kernel c (numpy shapes ``a``
    ``(C, 1, KH, KW)``, ``b`` ``(N, C, H, W)``); positions outside the image count as 0. The sums are
    taken in F32 (an F16 kernel is widened). ggml has no backward pass for it: in a trainable graph
    it may not lie between a parameter and the loss (use ``ggml_conv_2d_dw``, or ``ggml_conv_1d_dw``
    in 1-D, where the data needs a gradient).

    Arguments:
        ctx: [glossary]
        a: the kernels, F32 or F16 ``[KW, KH, 1, C]``, contiguous.
        b: the images, F32 ``[W, H, C, N]``, contiguous (apply ``ggml_cont`` to a permuted view).
        s0, s1: strides along width and height (>= 1, default 1).
        p0, p1: zero padding on each side (>= 0, default 0).
        d0, d1: dilations (>= 1, default 1).

    Value: a new F32 Tensor ``[OW, OH, C, N]`` (sizes as in ``ggml_conv_2d_dw``).

    Example:
        >>> y = ggml_conv_2d_dw_direct(ctx, k, img, 2, 2, 1, 1)   # k [3, 3, 1, 8], img [28, 28, 8, n] -> [14, 14, 8, n]
    """
    fn = "ggml_conv_2d_dw_direct"
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, a, F32_F16, "a (the kernels)")
    types(fn, b, {GGML_TYPE_F32}, "b (the images)")  # the CPU kernel reads the images as F32
    contiguous(fn, a, "a (the kernels)")
    contiguous(fn, b, "b (the images)")
    _conv_args(fn, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    (kw, kh, a2, a3), (w, h, c, n) = a.shape, b.shape
    if a2 != 1 or a3 != c:
        fail(fn, f"the kernels a must be [KW, KH, 1, C] with C = b.ne[2] = {c} (one kernel per channel), got "
                     f"{list(a.shape)}")
    ow = out_size(fn, "width", w, kw, s0, p0, d0)
    oh = out_size(fn, "height", h, kh, s1, p1, d1)
    return make_op(fn, ctx, lib.ggml_conv_2d_dw_direct, (a, b), (ow, oh, c, n), (s0, s1, p0, p1, d0, d1))


def _kernel_and_images(fn: str, a: Tensor, b: Tensor) -> tuple[int, ...]:
    """(KW, KH, Cin, Cout, W, H, N) of a 2-D kernel ``[KW, KH, Cin, Cout]`` and images ``[W, H, Cin, N]`` whose
    channels agree."""
    (kw, kh, cin, cout), (w, h, b2, n) = a.shape, b.shape
    if cin != b2:
        fail(fn, f"the kernel's input channels a.ne[2]={cin} must equal the images' channels b.ne[2]={b2} "
                     "(kernel [KW, KH, Cin, Cout], images [W, H, Cin, N])")
    return kw, kh, cin, cout, w, h, n


def ggml_conv_2d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
                        d0: int = 1, d1: int = 1) -> Tensor:
    """2-D convolution computed directly (ggml's CONV_2D op) instead of im2col + mul_mat.

    Kernel ``a [KW, KH, Cin, Cout]`` and images ``b [W, H, Cin, N]`` give ``[OW, OH, Cout, N]`` with
    ``OW = (W + 2 p0 - d0 (KW - 1) - 1) // s0 + 1`` (OH alike) and
    ``out[n, o, y, x] = sum_{c,ky,kx} a[o, c, ky, kx] * b[n, c, y s1 + ky d1 - p1, x s0 + kx d0 - p0]``
    (numpy indices; numpy shapes ``a`` ``(Cout, Cin, KH, KW)``, ``b`` ``(N, Cin, H, W)``), the same as
    ``ggml_conv_2d`` without its large im2col intermediate. With an F16 kernel the patches are
    rounded to F16. ggml has no backward pass for it: in a trainable graph it may not lie between a
    parameter and the loss (use ``ggml_conv_2d`` there).

    Arguments:
        ctx: [glossary]
        a: the kernel, F32 or F16 ``[KW, KH, Cin, Cout]``, contiguous; one patch (``KW*KH*Cin`` values
            plus ``Cout`` results) must fit ggml's 16 MiB scratch area.
        b: the images, F32 ``[W, H, Cin, N]`` (any strides); Cin must equal a's ne[2].
        s0, s1: strides along width and height (>= 1, default 1).
        p0, p1: zero padding on each side (>= 0, default 0).
        d0, d1: dilations (>= 1, default 1).

    Value: a new F32 Tensor ``[OW, OH, Cout, N]``.

    Example:
        >>> y = ggml_conv_2d_direct(ctx, k, img, 1, 1, 1, 1)   # k [3, 3, 1, 8], img [28, 28, 1, n] -> [28, 28, 8, n]
    """
    fn = "ggml_conv_2d_direct"
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, a, F32_F16, "a (the kernel)")
    types(fn, b, {GGML_TYPE_F32}, "b (the images)")  # the result takes b's type; the CPU reads b as F32
    contiguous(fn, a, "a (the kernel)")
    _conv_args(fn, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    kw, kh, cin, cout, w, h, n = _kernel_and_images(fn, a, b)
    patch = kw * kh * cin * element_size(a) + cout * 4
    if patch > _CONV_2D_WORK_SIZE:
        fail(fn, f"one patch of this kernel needs {patch} bytes, beyond the {_CONV_2D_WORK_SIZE} bytes of ggml's "
                     "scratch area for the direct convolution; use ggml_conv_2d (im2col) for kernels this large")
    ow = out_size(fn, "width", w, kw, s0, p0, d0)
    oh = out_size(fn, "height", h, kh, s1, p1, d1)
    return make_op(fn, ctx, lib.ggml_conv_2d_direct, (a, b), (ow, oh, cout, n), (s0, s1, p0, p1, d0, d1))


def ggml_conv_2d_tiled(ctx: Context, a: Tensor, b: Tensor, bias: Tensor | None = None, s0: int = 1, s1: int = 1,
                       p0: int = 0, p1: int = 0, d0: int = 1, d1: int = 1) -> Tensor:
    """A float32 2-D convolution plus an optional per-channel bias, trainable, computed tile by tile on the CPU.

    The same result as ``ggml_conv_2d`` with a float32 im2col followed by the bias: kernel ``a [KW, KH, Cin,
    Cout]`` and images ``b [W, H, Cin, N]`` give ``[OW, OH, Cout, N]`` with ``OW = (W + 2 p0 - d0 (KW - 1) -
    1) // s0 + 1`` (OH alike) and ``out[n, o, y, x] = bias[o] + sum_{c,ky,kx} a[o, c, ky, kx] *
    b[n, c, y s1 + ky d1 - p1, x s0 + kx d0 - p0]`` (numpy indices). The CPU makes the im2col columns of one
    tile of output rows at a time in cache and multiplies them straight into the output planes, so no
    ``[Cin KH KW, OW OH N]`` matrix of the whole batch is written and read back, nor a layout copy after the
    product; its backward pass (one node) gives the gradients of the images, the kernel and the bias the same
    way. Only the CPU backend computes it (patches/0036): for a GPU build the convolution from
    ``ggml_im2col`` and ``ggml_mul_mat``, which every backend has.

    Arguments:
        ctx: [glossary]
        a: the kernel, F32 contiguous ``[KW, KH, Cin, Cout]``.
        b: the images, F32 contiguous ``[W, H, Cin, N]``; Cin must equal a's ne[2].
        bias: ``Cout`` F32 contiguous values (any shape, e.g. ``[1, 1, Cout]``), or None for no bias.
        s0, s1: strides along width and height (>= 1, default 1).
        p0, p1: zero padding on each side (>= 0, default 0).
        d0, d1: dilations (>= 1, default 1).

    Value: a new F32 Tensor ``[OW, OH, Cout, N]``.

    Example:
        >>> y = ggml_conv_2d_tiled(ctx, k, img, b, 1, 1, 1, 1)   # k [3, 3, 1, 8], img [28, 28, 1, n] -> [28, 28, 8, n]
    """
    fn = "ggml_conv_2d_tiled"
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, a, {GGML_TYPE_F32}, "a (the kernel)")
    types(fn, b, {GGML_TYPE_F32}, "b (the images)")
    contiguous(fn, a, "a (the kernel)")
    contiguous(fn, b, "b (the images)")
    _conv_args(fn, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    kw, kh, cin, cout, w, h, n = _kernel_and_images(fn, a, b)
    if bias is not None:
        bias = operand(fn, bias, "bias")
        types(fn, bias, {GGML_TYPE_F32}, "bias")
        contiguous(fn, bias, "bias")
        if bias.nelements() != cout:
            fail(fn, f"bias must hold one value per output channel ({cout}), got shape {list(bias.shape)}")
    ow = out_size(fn, "width", w, kw, s0, p0, d0)
    oh = out_size(fn, "height", h, kh, s1, p1, d1)
    return make_op(fn, ctx, lib.ggml_conv_2d_tiled, (a, b, bias), (ow, oh, cout, n), (s0, s1, p0, p1, d0, d1))
