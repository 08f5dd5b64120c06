"""Convolutions beyond im2col (transposed, depthwise, direct), padding, upscaling, rolling, writing into tensors and diagonals.

Same conventions as ``ops.py``: ggml's argument order (context, operands, then C's scalars), every
operand checked in Python against what ggml's constructor and its CPU kernel assert (ggml aborts the
process otherwise), the result a ``Tensor`` of ``ctx``. Shapes are written in ggml's ``ne`` order
(``[ne0, ne1, ne2, ne3]``, ne0 fastest); a C-ordered numpy array of shape ``(ne3, ne2, ne1, ne0)``
holds the same data.
"""
from __future__ import annotations

from typing import Any

from . import _checks as chk
from ._ffi import ffi, lib
from .context import GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, Context, Tensor
from .errors import GgmlTypeError
from .ops import F32_F16, _op, _t

GGML_SCALE_MODE_NEAREST = int(lib.GGML_SCALE_MODE_NEAREST)
GGML_SCALE_MODE_BILINEAR = int(lib.GGML_SCALE_MODE_BILINEAR)
GGML_SCALE_MODE_BICUBIC = int(lib.GGML_SCALE_MODE_BICUBIC)
_SCALE_MODES = (GGML_SCALE_MODE_NEAREST, GGML_SCALE_MODE_BILINEAR, GGML_SCALE_MODE_BICUBIC)

# ggml's CPU kernel of the direct 2-D convolution works through patches in a 16 MiB scratch area
# (GGML_IM2COL_WORK_SIZE): one patch (the kernel's KW*KH*Cin values and Cout results) must fit
_CONV_2D_WORK_SIZE = 16 * 1024 * 1024
_INT32_MAX = (1 << 31) - 1


def _esize(t: Tensor) -> int:
    return int(lib.ggml_type_size(t.type))


def _strides(t: Tensor) -> tuple[int, int, int, int]:
    p = t.ptr
    return (int(p.nb[0]), int(p.nb[1]), int(p.nb[2]), int(p.nb[3]))


def _conv_args(fn: str, **values: Any) -> None:
    """Strides and dilations (names starting with s or d) >= 1, paddings >= 0, all C ints."""
    for name, v in values.items():
        chk.c_int_arg(fn, name, v, 0 if name.startswith("p") else 1)


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
        ctx: the context the result tensor is created in.
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
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.types(fn, a, F32_F16, "a (the kernel)")
    chk.types(fn, b, {GGML_TYPE_F32}, "b (the data)")
    chk.rows_contiguous(fn, a, "a (the kernel)")
    chk.rows_contiguous(fn, b, "b (the data)")
    _conv_args(fn, s0=s0)
    chk.c_int_arg(fn, "p0", p0), chk.c_int_arg(fn, "d0", d0)
    if p0 != 0 or d0 != 1:
        chk.fail(fn, f"ggml implements only p0 = 0 and d0 = 1 for a transposed 1-D convolution, got p0={p0}, "
                     f"d0={d0}; crop the result with ggml_view_2d instead of padding")
    (k, cout, cin, a3), (length, b1, b2, b3) = a.shape, b.shape
    if a3 != 1:
        chk.fail(fn, f"the kernel a must be 3-D [K, Cout, Cin], got {list(a.shape)}")
    if b2 != 1 or b3 != 1:
        chk.fail(fn, f"the data b must be a matrix [L, Cin] (one sample; loop over samples with ggml_view_2d), got "
                     f"{list(b.shape)}")
    if b1 != cin:
        chk.fail(fn, f"the kernel's input channels a.ne[2]={cin} must equal the data's channels b.ne[1]={b1} "
                     f"(kernel [K, Cout, Cin], data [L, Cin])")
    return _op(fn, ctx, lib.ggml_conv_transpose_1d, (a, b), ((length - 1) * s0 + k, cout, 1, 1), (s0, p0, d0))


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
        ctx: the context the result tensor is created in.
        a: the kernel, F32 or F16 ``[KW, KH, Cout, Cin]``, contiguous.
        b: the data, F32 ``[W, H, Cin, 1]`` with contiguous rows; Cin must equal a's ne[3].
        stride: the stride along width and height (>= 1, default 1).

    Value: a new F32 Tensor ``[(W - 1) * stride + KW, (H - 1) * stride + KH, Cout, 1]``.

    Example:
        >>> up = ggml_conv_transpose_2d_p0(ctx, kernel, img, 2)
        >>> # kernel [2, 2, 8, 16], img [7, 7, 16, 1] -> up [14, 14, 8, 1]
    """
    fn = "ggml_conv_transpose_2d_p0"
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.types(fn, a, F32_F16, "a (the kernel)")
    chk.types(fn, b, {GGML_TYPE_F32}, "b (the data)")
    chk.contiguous(fn, a, "a (the kernel)")  # the CPU kernel reads each KW x KH plane as contiguous
    chk.rows_contiguous(fn, b, "b (the data)")
    _conv_args(fn, stride=stride)
    (kw, kh, cout, cin), (w, h, b2, b3) = a.shape, b.shape
    if b2 != cin:
        chk.fail(fn, f"the kernel's input channels a.ne[3]={cin} must equal the data's channels b.ne[2]={b2} "
                     f"(kernel [KW, KH, Cout, Cin], data [W, H, Cin, 1])")
    if b3 != 1:
        chk.fail(fn, f"the data b must hold one image (b.ne[3] == 1; ggml's CPU kernel would compute only the first "
                     f"of a batch and leave the others 0), got {list(b.shape)}; transpose-convolve each sample (a "
                     "ggml_view_4d of b) and join the results with ggml_concat")
    shape = ((w - 1) * stride + kw, (h - 1) * stride + kh, cout, 1)
    return _op(fn, ctx, lib.ggml_conv_transpose_2d_p0, (a, b), shape, (stride,))


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
        ctx: the context the result tensor is created in.
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
    a, b = _t(fn, a), _t(fn, b, "b")
    # ggml multiplies the F16 patches (src0) by the kernel (src1): the CPU takes an F32 or F16 src1 there
    chk.types(fn, a, F32_F16, "a (the kernels)")
    chk.types(fn, b, {GGML_TYPE_F32}, "b (the data)")
    chk.contiguous(fn, a, "a (the kernels)")
    chk.contiguous(fn, b, "b (the data)")  # ggml reshapes it
    _conv_args(fn, s0=s0, p0=p0, d0=d0)
    (k, a1, c, a3), (length, b1, b2, b3) = a.shape, b.shape
    if a1 != 1 or a3 != 1:
        chk.fail(fn, f"the kernels a must be [K, 1, C] (one kernel per channel), got {list(a.shape)}")
    if b2 != 1 or b3 != 1:
        chk.fail(fn, f"the data b must be one sample [L, C], got {list(b.shape)}; convolve each sample separately")
    if b1 != c:
        chk.fail(fn, f"the number of kernels a.ne[2]={c} must equal the data's channels b.ne[1]={b1}")
    ol = chk.out_size(fn, "length", length, k, s0, p0, d0)
    ctx.reserve(4 * (k * ol * c) + 4 * ol * c, n_objects=4, what=f"{fn} intermediates")
    return _op(fn, ctx, lib.ggml_conv_1d_dw, (a, b), (ol, c, 1, 1), (s0, p0, d0))


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
        ctx: the context the result tensor is created in.
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
    a, b = _t(fn, a), _t(fn, b, "b")
    if a.type not in (GGML_TYPE_F16, GGML_TYPE_BF16):
        chk.fail(fn, f"the kernels a must be F16 or BF16 (ggml multiplies them with F16 patches), got "
                     f"{chk.type_name(a.type)}; convert them with ggml_cpy into an F16 tensor, or use "
                     "ggml_conv_2d_dw_direct, which takes F32 kernels", GgmlTypeError)
    chk.types(fn, b, {GGML_TYPE_F32}, "b (the images)")
    chk.contiguous(fn, a, "a (the kernels)")  # ggml reshapes both
    chk.contiguous(fn, b, "b (the images)")
    _conv_args(fn, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    (kw, kh, a2, a3), (w, h, c, n) = a.shape, b.shape
    if min(a2, a3) != 1 or a2 * a3 != c:
        chk.fail(fn, f"the kernels a must be [KW, KH, 1, C] with C = b.ne[2] = {c} (one kernel per channel), got "
                     f"{list(a.shape)}")
    ow = chk.out_size(fn, "width", w, kw, s0, p0, d0)
    oh = chk.out_size(fn, "height", h, kh, s1, p1, d1)
    ctx.reserve(4 * (kw * kh * ow * oh * c * n) + 4 * ow * oh * c * n, n_objects=8, what=f"{fn} intermediates")
    return _op(fn, ctx, lib.ggml_conv_2d_dw, (a, b), (ow, oh, c, n), (s0, s1, p0, p1, d0, d1))


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
        ctx: the context the result tensor is created in.
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
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.types(fn, a, F32_F16, "a (the kernels)")
    chk.types(fn, b, {GGML_TYPE_F32}, "b (the images)")  # the CPU kernel reads the images as F32
    chk.contiguous(fn, a, "a (the kernels)")
    chk.contiguous(fn, b, "b (the images)")
    _conv_args(fn, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    (kw, kh, a2, a3), (w, h, c, n) = a.shape, b.shape
    if a2 != 1 or a3 != c:
        chk.fail(fn, f"the kernels a must be [KW, KH, 1, C] with C = b.ne[2] = {c} (one kernel per channel), got "
                     f"{list(a.shape)}")
    ow = chk.out_size(fn, "width", w, kw, s0, p0, d0)
    oh = chk.out_size(fn, "height", h, kh, s1, p1, d1)
    return _op(fn, ctx, lib.ggml_conv_2d_dw_direct, (a, b), (ow, oh, c, n), (s0, s1, p0, p1, d0, d1))


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
        ctx: the context the result tensor is created in.
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
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.types(fn, a, F32_F16, "a (the kernel)")
    chk.types(fn, b, {GGML_TYPE_F32}, "b (the images)")  # the result takes b's type; the CPU reads b as F32
    chk.contiguous(fn, a, "a (the kernel)")
    _conv_args(fn, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)
    (kw, kh, cin, cout), (w, h, b2, n) = a.shape, b.shape
    if cin != b2:
        chk.fail(fn, f"the kernel's input channels a.ne[2]={cin} must equal the images' channels b.ne[2]={b2} "
                     "(kernel [KW, KH, Cin, Cout], images [W, H, Cin, N])")
    patch = kw * kh * cin * _esize(a) + cout * 4
    if patch > _CONV_2D_WORK_SIZE:
        chk.fail(fn, f"one patch of this kernel needs {patch} bytes, beyond the {_CONV_2D_WORK_SIZE} bytes of ggml's "
                     "scratch area for the direct convolution; use ggml_conv_2d (im2col) for kernels this large")
    ow = chk.out_size(fn, "width", w, kw, s0, p0, d0)
    oh = chk.out_size(fn, "height", h, kh, s1, p1, d1)
    return _op(fn, ctx, lib.ggml_conv_2d_direct, (a, b), (ow, oh, cout, n), (s0, s1, p0, p1, d0, d1))


# ---------------------------------------------------------------- padding, upscaling, rolling

def ggml_pad_reflect_1d(ctx: Context, a: Tensor, p0: int, p1: int) -> Tensor:
    """Pad every row (along ne[0]) by reflection: ``p0`` values before, ``p1`` after.

    Row ``[x0, x1, x2, x3]`` padded with ``p0 = 2, p1 = 1`` becomes ``[x2, x1, x0, x1, x2, x3, x2]``:
    the edge value itself is not repeated, as numpy's ``np.pad(x, (p0, p1), mode="reflect")`` along
    the last numpy axis. Each padding must be shorter than the row. ggml has no backward pass for it:
    in a trainable graph it may not lie between a parameter and the loss.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor ``[ne0, ne1, ne2, ne3]``, contiguous (apply ``ggml_cont`` to a view first).
        p0: the number of values added before each row, ``0 <= p0 < ne0``.
        p1: the number added after each row, ``0 <= p1 < ne0``.

    Value: a new F32 Tensor ``[ne0 + p0 + p1, ne1, ne2, ne3]``.

    Example:
        >>> y = ggml_pad_reflect_1d(ctx, audio, 256, 256)   # [4096, batch] -> [4608, batch]
    """
    fn = "ggml_pad_reflect_1d"
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.contiguous(fn, a)
    p0, p1 = chk.c_int_arg(fn, "p0", p0, 0), chk.c_int_arg(fn, "p1", p1, 0)
    n0 = a.shape[0]
    if p0 >= n0 or p1 >= n0:
        chk.fail(fn, f"each padding must be shorter than the row (a.ne[0] = {n0}), got p0={p0}, p1={p1}: a reflection "
                     "repeats the row's inner values only; pad in several steps or use ggml_pad_ext for zeros")
    return _op(fn, ctx, lib.ggml_pad_reflect_1d, (a,), (n0 + p0 + p1,) + a.shape[1:], (p0, p1))


def ggml_pad_ext(ctx: Context, a: Tensor, lp0: int = 0, rp0: int = 0, lp1: int = 0, rp1: int = 0, lp2: int = 0,
                 rp2: int = 0, lp3: int = 0, rp3: int = 0) -> Tensor:
    """Zero padding on both sides of each dimension: ``ne[i]`` becomes ``lp_i + ne[i] + rp_i``.

    ``lp_i`` zeros go before and ``rp_i`` after the values along ggml dimension i (``ggml_pad`` pads
    after only). In numpy terms (reversed axes) it is
    ``np.pad(x, ((lp3, rp3), (lp2, rp2), (lp1, rp1), (lp0, rp0)))`` on the 4-D array. ggml has no
    backward pass for it: in a trainable graph it may not lie between a parameter and the loss.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor (any strides).
        lp0, rp0: zeros before / after along ne[0] (ints >= 0, default 0).
        lp1, rp1: the same along ne[1]; lp2, rp2 along ne[2]; lp3, rp3 along ne[3].

    Value: a new F32 Tensor ``[lp0 + ne0 + rp0, lp1 + ne1 + rp1, lp2 + ne2 + rp2, lp3 + ne3 + rp3]``.

    Example:
        >>> y = ggml_pad_ext(ctx, img, 1, 1, 1, 1)          # [W, H, C, N] -> [W + 2, H + 2, C, N]
    """
    fn = "ggml_pad_ext"
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    names = ("lp0", "rp0", "lp1", "rp1", "lp2", "rp2", "lp3", "rp3")
    pads = tuple(chk.c_int_arg(fn, name, v, 0) for name, v in zip(names, (lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)))
    shape = tuple(n + pads[2 * i] + pads[2 * i + 1] for i, n in enumerate(a.shape))
    return _op(fn, ctx, lib.ggml_pad_ext, (a,), shape, pads)


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
        ctx: the context the result tensor is created in.
        a: F32 tensor ``[W, H, C, N]`` (any strides).
        scale_factor: the integer factor, >= 2 (ggml refuses 1; skip the op instead).
        mode: ``GGML_SCALE_MODE_NEAREST`` (the default, 0), ``GGML_SCALE_MODE_BILINEAR`` (1) or
            ``GGML_SCALE_MODE_BICUBIC`` (2).

    Value: a new F32 Tensor ``[W * scale_factor, H * scale_factor, C, N]``.

    Example:
        >>> up = ggml_upscale(ctx, img, 2, GGML_SCALE_MODE_BILINEAR)   # [8, 8, 3, n] -> [16, 16, 3, n]
    """
    fn = "ggml_upscale"
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    sf = chk.c_int_arg(fn, "scale_factor", scale_factor)
    if sf < 2:
        chk.fail(fn, f"scale_factor must be an int >= 2, got {sf} (a factor of 1 changes nothing: leave the op out)")
    if not chk.is_int(mode) or int(mode) not in _SCALE_MODES:
        chk.fail(fn, f"mode must be GGML_SCALE_MODE_NEAREST (0), GGML_SCALE_MODE_BILINEAR (1) or "
                     f"GGML_SCALE_MODE_BICUBIC (2), got {mode!r}")
    w, h, c, n = a.shape
    return _op(fn, ctx, lib.ggml_upscale, (a,), (w * sf, h * sf, c, n), (sf, int(mode)))


def ggml_roll(ctx: Context, a: Tensor, shift0: int = 0, shift1: int = 0, shift2: int = 0, shift3: int = 0) -> Tensor:
    """Shift elements circularly along each dimension, as ``np.roll``.

    Along ggml dimension i, the element at index ``j`` moves to ``(j + shift_i) mod ne[i]``; a
    negative shift moves towards the start. In numpy terms (reversed axes) the result is
    ``np.roll(x, (shift3, shift2, shift1, shift0), axis=(0, 1, 2, 3))`` on the 4-D array. Each shift
    must be smaller than its dimension in absolute value. ggml has no backward pass for it: in a
    trainable graph it may not lie between a parameter and the loss.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor with contiguous rows.
        shift0, shift1, shift2, shift3: the shifts along ne[0] .. ne[3] (ints, default 0),
            ``|shift_i| < ne[i]`` (reduce a larger shift modulo ne[i] first).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> y = ggml_roll(ctx, x, 1)               # [x3, x0, x1, x2] from [x0, x1, x2, x3]
    """
    fn = "ggml_roll"
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.rows_contiguous(fn, a)
    shifts = tuple(chk.c_int_arg(fn, f"shift{i}", s) for i, s in enumerate((shift0, shift1, shift2, shift3)))
    for i, (s, n) in enumerate(zip(shifts, a.shape)):
        if abs(s) >= n:
            chk.fail(fn, f"|shift{i}| must be smaller than a.ne[{i}] = {n}, got {s}; use {s} % {n} = {s % n}")
    return _op(fn, ctx, lib.ggml_roll, (a,), a.shape, shifts, a.type)


# ---------------------------------------------------------------- writing into tensors

def _set_checks(fn: str, a: Tensor, b: Tensor, nb1: Any, nb2: Any, nb3: Any, offset: Any) -> tuple[int, ...]:
    """What ggml_set's constructor, CPU kernel and backward pass assert, for byte strides and offset."""
    chk.types(fn, a, {GGML_TYPE_F32, GGML_TYPE_I32})
    if b.type != a.type:
        chk.fail(fn, f"b must have a's type {chk.type_name(a.type)}, got {chk.type_name(b.type)}; convert it with "
                     "ggml_cpy first", GgmlTypeError)
    chk.contiguous(fn, a)
    chk.rows_contiguous(fn, b, "b")
    esize = _esize(a)
    vals = []
    for k, (name, v) in enumerate((("nb1", nb1), ("nb2", nb2), ("nb3", nb3), ("offset", offset))):
        v = chk.int_arg(fn, name, v, 0)
        if k < 3 and b.shape[k + 1] == 1:  # a stride along a dimension of size 1 is never used
            vals.append(v)
            continue
        # ggml stores them as 32-bit ints (and asserts offset < 2**30)
        limit = (1 << 30) - 1 if name == "offset" else _INT32_MAX
        if v > limit:
            chk.fail(fn, f"{name} must be <= {limit} bytes (ggml keeps it in 32 bits), got {v}")
        if v % esize:
            chk.fail(fn, f"{name} is in bytes and must be a multiple of the element size {esize}, got {v}")
        vals.append(v)
    if b.nelements() > a.nelements():
        chk.fail(fn, f"b {list(b.shape)} has more elements than a {list(a.shape)}")
    strides = (esize, vals[0], vals[1], vals[2])
    last = vals[3] + sum((n - 1) * st for n, st in zip(b.shape, strides)) + esize
    size = a.nbytes()
    if last > size or vals[3] + b.nelements() * esize > size:
        chk.fail(fn, f"b {list(b.shape)} placed at byte offset {vals[3]} with row strides {vals[:3]} reaches byte "
                     f"{max(last, vals[3] + b.nelements() * esize)}, beyond a's {size} bytes")
    return tuple(vals)


def ggml_set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """A copy of ``a`` with the block ``b`` written into it at a byte offset, with given byte strides.

    The element ``b[i0, i1, i2, i3]`` (ggml indices) lands at byte
    ``offset + i0 * esize + i1 * nb1 + i2 * nb2 + i3 * nb3`` of a's data (``esize`` = 4 for F32/I32);
    everything else keeps a's values. With a's own strides (``ggml_nb``-style: ``nb1 = ne0 * esize``,
    ...) this writes a sub-block. ``a`` itself is not changed. Differentiable with respect to both
    ``a`` (the gradient is zero where b was written) and ``b``.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the destination, F32 or I32, contiguous.
        b: the block, of a's type, with contiguous rows and at most as many elements as a.
        nb1, nb2, nb3: the byte distances between b's rows, planes and 3-D blocks inside a (ints >= 0,
            multiples of the element size).
        offset: the byte position of b's first element in a (an int >= 0, a multiple of the element
            size, below 2**30). Every element of b must land inside a.

    Value: a new Tensor of a's shape and type.

    Example:
        >>> # m F32 [6, 5], block [3, 2]: rows 1-2, columns 2-4 of m replaced
        >>> y = ggml_set(ctx, m, block, 6 * 4, 6 * 4 * 5, 6 * 4 * 5, (1 * 6 + 2) * 4)
    """
    fn = "ggml_set"
    a, b = _t(fn, a), _t(fn, b, "b")
    nb1, nb2, nb3, offset = _set_checks(fn, a, b, nb1, nb2, nb3, offset)
    return _op(fn, ctx, lib.ggml_set, (a, b), a.shape, (nb1, nb2, nb3, offset), a.type)


def ggml_set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """A copy of ``a`` with the elements of ``b`` written consecutively from a byte offset on.

    For a 1-D ``b`` of n elements: elements ``offset / esize`` .. ``offset / esize + n - 1`` of a (in
    ggml order) are replaced by b's values (``esize`` = 4 for F32/I32). A ``b`` with several rows is
    placed with a's own row strides. ``a`` itself is not changed. Differentiable with respect to
    both ``a`` and ``b``.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the destination, F32 or I32, contiguous.
        b: the values, of a's type, with contiguous rows.
        offset: the byte position of b's first element in a (an int >= 0, a multiple of the element
            size); b must end inside a.

    Value: a new Tensor of a's shape and type.

    Example:
        >>> y = ggml_set_1d(ctx, v, part, 3 * 4)        # v F32 [10], part [4]: elements 3..6 replaced
    """
    fn = "ggml_set_1d"
    a, b = _t(fn, a), _t(fn, b, "b")
    _, nb1, nb2, nb3 = _strides(a)
    nb1, nb2, nb3, offset = _set_checks(fn, a, b, nb1, nb2, nb3, offset)
    return _op(fn, ctx, lib.ggml_set_1d, (a, b), a.shape, (offset,), a.type)


def ggml_set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """A copy of ``a`` with the matrix ``b`` written into it: rows ``nb1`` bytes apart from a byte offset.

    The element ``b[i0, i1]`` (ggml indices) lands at byte ``offset + i0 * esize + i1 * nb1`` of a's
    data (``esize`` = 4 for F32/I32); higher dimensions of b use a's own strides. With ``nb1`` equal to
    a's row size (``a.ne[0] * esize``) this pastes a sub-matrix. ``a`` itself is not changed.
    Differentiable with respect to both ``a`` and ``b``.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the destination, F32 or I32, contiguous.
        b: the block, of a's type, with contiguous rows.
        nb1: the byte distance between b's rows inside a (an int >= 0, a multiple of the element size).
        offset: the byte position of b's first element in a (an int >= 0, a multiple of the element
            size); every element of b must land inside a.

    Value: a new Tensor of a's shape and type.

    Example:
        >>> y = ggml_set_2d(ctx, m, block, 6 * 4, (1 * 6 + 2) * 4)   # m F32 [6, 5], block [3, 2] at row 1, column 2
    """
    fn = "ggml_set_2d"
    a, b = _t(fn, a), _t(fn, b, "b")
    _, _, nb2, nb3 = _strides(a)
    nb1, nb2, nb3, offset = _set_checks(fn, a, b, nb1, nb2, nb3, offset)
    return _op(fn, ctx, lib.ggml_set_2d, (a, b), a.shape, (nb1, offset), a.type)


def ggml_set_zero(tensor: Tensor) -> None:
    """Set every element of an allocated tensor to zero, now (not a graph op).

    Works on tensors in context memory and in backend buffers (CPU or device). Handy to reset an
    accumulator or a gradient between computations.

    Arguments:
        tensor: a contiguous tensor that has memory (allocate its context with
            ``ggml_backend_alloc_ctx_tensors``, or create it in a context with ``no_alloc=False``). A
            strided view is refused: zeroing its byte span would also clear elements it does not show.

    Value: None. Raises GgmlStateError for a tensor without memory, GgmlValueError for a strided view.

    Example:
        >>> ggml_set_zero(acc)
    """
    fn = "ggml_set_zero"
    t = _t(fn, tensor, "tensor")
    p = t.ptr
    if t.nelements() == 0:
        return None
    where = chk.tensor_memory(p, f"{fn}: {chk._tensor_label(p)}")
    chk.contiguous(fn, t, "tensor")
    nbytes = int(lib.ggml_nbytes(p))
    if where == "host":
        lib.ggml_set_zero(p)
        return None
    # through set_tensor, which every backend buffer implements (ggml_set_zero's memset is optional there)
    chunk = min(nbytes, 1 << 24)
    zeros = ffi.new("char[]", chunk)
    for start in range(0, nbytes, chunk):
        lib.ggml_backend_tensor_set(p, zeros, start, min(chunk, nbytes - start))
    return None


# ---------------------------------------------------------------- views and diagonals

def ggml_view_tensor(ctx: Context, src: Tensor) -> Tensor:
    """A view of the whole of ``src``: same shape, type, strides and data, no copy.

    The view is a leaf of a graph, not an op: building a graph from it does not compute ``src``
    (expand the graph with ``src`` too, or give ``src`` its values before computing), and no
    gradient flows through it to ``src``. Writing the view's data writes src's.

    Arguments:
        ctx: the context the view's header is created in.
        src: the tensor to view.

    Value: a Tensor of src's shape and type sharing src's memory.

    Example:
        >>> v = ggml_view_tensor(ctx, weights)
    """
    fn = "ggml_view_tensor"
    src = _t(fn, src, "src")
    return _op(fn, ctx, lib.ggml_view_tensor, (src,), None, out_type=src.type)


def ggml_diag(ctx: Context, a: Tensor) -> Tensor:
    """A diagonal matrix from each row vector: ``[n, 1, ne2, ne3]`` becomes ``[n, n, ne2, ne3]``.

    ``out[..., j, i] = a[..., 0, i]`` if ``i == j`` else 0 (numpy indices): ``np.diag`` of every row.
    ggml has no backward pass for it: in a trainable graph it may not lie between a parameter and the
    loss (multiply by an identity matrix built as data instead).

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor with ``ne[1] == 1`` and contiguous rows (``[n]`` or ``[n, 1, ne2, ne3]``).

    Value: a new F32 Tensor ``[n, n, ne2, ne3]``.

    Example:
        >>> d = ggml_diag(ctx, v)                   # v [3] -> [3, 3]
    """
    fn = "ggml_diag"
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.rows_contiguous(fn, a)
    if a.shape[1] != 1:
        chk.fail(fn, f"a must hold row vectors (ne[1] == 1), got {list(a.shape)}; reshape it with ggml_reshape_4d(ctx, "
                     f"a, n, 1, ...)")
    n = a.shape[0]
    return _op(fn, ctx, lib.ggml_diag, (a,), (n, n, a.shape[2], a.shape[3]), out_type=a.type)


def ggml_diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Set the elements above the (shifted) diagonal to 0: ``ggml_diag_mask_inf`` with zeros.

    In each row ``j`` (index along ne[1]) the elements at columns ``i > n_past + j`` (index along
    ne[0]) become 0, the others are copied; the same for every ne[2], ne[3]. In numpy terms
    ``np.tril(x, n_past)`` on the last two axes. Differentiable (the gradient is masked alike).

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor, contiguous.
        n_past: how many columns beyond the diagonal each row keeps (an int >= 0; 0 keeps the lower
            triangle).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> lower = ggml_diag_mask_zero(ctx, scores, 0)
    """
    fn = "ggml_diag_mask_zero"
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.contiguous(fn, a)
    return _op(fn, ctx, lib.ggml_diag_mask_zero, (a,), a.shape, (chk.c_int_arg(fn, "n_past", n_past, 0),), a.type)
