"""Convolution and pooling for the autograd engine, in PyTorch's layout: images ``(N, C, H, W)``, kernels
``(C_out, C_in, KH, KW)`` (which are ggml's ``[W, H, C, N]`` and ``[KW, KH, C_in, C_out]`` as they are). The
convolution is an F32 im2col and one matrix product (trained in F32, as the model layer's); pooling is ggml's
``pool_2d``.
"""
from __future__ import annotations

from ..core.args import int_arg, int_pair_arg
from ..core.types import GGML_TYPE_F32
from ..errors import GgmlValueError
from ..graph.objects import Tensor
from ..ops.conv import ggml_im2col, GGML_OP_POOL_AVG, GGML_OP_POOL_MAX, ggml_pool_2d
from ..ops.elementwise import ggml_cont
from ..ops.layout import ggml_permute, ggml_reshape_2d, ggml_reshape_4d
from ..ops.linalg import ggml_mul_mat
from .lazy import Builder, Op
from .ops import ag_add, ag_reshape, floating, tensor_arg
from .tensor import AgTensor, result


__all__ = ["ag_conv2d", "ag_max_pool2d", "ag_avg_pool2d"]


def _lower_conv(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
    x, w = xs
    (sh, sw), (ph, pw), (n, cout, oh, ow) = attrs
    cols = ggml_im2col(b.ctx, w, x, sw, sh, pw, ph, 1, 1, True, GGML_TYPE_F32)   # [K, OW, OH, N]
    k = cols.shape[0]
    y = ggml_mul_mat(b.ctx, ggml_reshape_2d(b.ctx, cols, k, ow * oh * n), ggml_reshape_2d(b.ctx, w, k, cout))
    # [OW*OH*N, Cout] -> [OW, OH, N, Cout] -> [OW, OH, Cout, N]
    return ggml_cont(b.ctx, ggml_permute(b.ctx, ggml_reshape_4d(b.ctx, y, ow, oh, n, cout), 0, 1, 3, 2))


_CONV = Op("conv2d", _lower_conv)


def _out(fn: str, size: int, k: int, s: int, p: int, what: str) -> int:
    o = (size + 2 * p - k) // s + 1
    if o < 1:
        raise GgmlValueError(f"{fn}: the output {what} would be {o} (input {size}, kernel {k}, stride {s}, "
                             f"padding {p})")
    return o


def ag_conv2d(x: AgTensor, weight: AgTensor, bias: AgTensor | None = None, stride: int | tuple[int, int] = 1,
              padding: int | tuple[int, int] = 0) -> AgTensor:
    """2-D convolution (cross-correlation, as PyTorch's ``conv2d``) of images ``(N, C_in, H, W)`` with kernels
    ``(C_out, C_in, KH, KW)``, plus a bias per output channel.

    Arguments:
        x: the images, an AgTensor ``(N, C_in, H, W)``.
        weight: the kernels ``(C_out, C_in, KH, KW)`` (an ag_param to train them).
        bias: ``(C_out,)`` or None.
        stride: an int or (height, width).
        padding: zeros on each side: an int or (height, width).

    Value: a lazy AgTensor ``(N, C_out, OH, OW)``, ``OH = (H + 2 pad - KH) // stride + 1``.

    Example:
        >>> k = ag_param(np.random.randn(8, 1, 3, 3) * 0.3)
        >>> y = ag_relu(ag_conv2d(images, k, padding=1))
    """
    fn = "ag_conv2d"
    x, w = floating(tensor_arg(x, fn), fn), floating(tensor_arg(weight, fn, "weight"), fn, "weight")
    if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[1]:
        raise GgmlValueError(f"{fn}: x must be (N, C_in, H, W) and weight (C_out, C_in, KH, KW) with one C_in, "
                             f"got {x.shape} and {w.shape}")
    s = int_pair_arg(fn, "stride", stride)
    pair = (padding, padding) if not isinstance(padding, (tuple, list)) else tuple(padding)
    if len(pair) != 2:
        raise GgmlValueError(f"{fn}: padding must be an int or (height, width), got {padding!r}")
    p = (int_arg(fn, "padding", pair[0], 0), int_arg(fn, "padding", pair[1], 0))
    n, _, h, wd = x.shape
    cout, _, kh, kw = w.shape
    oh, ow = _out(fn, h, kh, s[0], p[0], "height"), _out(fn, wd, kw, s[1], p[1], "width")
    y = result(_CONV, (x, w), (n, cout, oh, ow), (s, p, (n, cout, oh, ow)))
    if bias is not None:
        bias = tensor_arg(bias, fn, "bias")
        if bias.shape != (cout,):
            raise GgmlValueError(f"{fn}: bias must be ({cout},), got {bias.shape}")
        y = ag_add(y, ag_reshape(bias, (cout, 1, 1)))
    return y


def _lower_pool(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
    op, (kh, kw), (sh, sw) = attrs
    return ggml_pool_2d(b.ctx, xs[0], op, kw, kh, sw, sh)


_POOL = Op("pool2d", _lower_pool)


def _pool(fn: str, op: int, x: AgTensor, kernel_size: int | tuple[int, int],
          stride: int | tuple[int, int] | None) -> AgTensor:
    x = floating(tensor_arg(x, fn), fn)
    if x.ndim != 4:
        raise GgmlValueError(f"{fn}: x must be (N, C, H, W), got {x.shape}")
    k = int_pair_arg(fn, "kernel_size", kernel_size)
    s = k if stride is None else int_pair_arg(fn, "stride", stride)
    n, c, h, w = x.shape
    shape = (n, c, _out(fn, h, k[0], s[0], 0, "height"), _out(fn, w, k[1], s[1], 0, "width"))
    return result(_POOL, (x,), shape, (op, k, s))


def ag_max_pool2d(x: AgTensor, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None
                  ) -> AgTensor:
    """2-D max pooling of ``(N, C, H, W)`` images (the gradient goes to each window's maximum).

    Arguments:
        x: the images.
        kernel_size: the window: an int or (height, width).
        stride: an int or (height, width); None: the window (windows side by side).

    Value: a lazy AgTensor ``(N, C, OH, OW)``.

    Example:
        >>> y = ag_max_pool2d(h, 2)          # (N, 8, 28, 28) -> (N, 8, 14, 14)
    """
    return _pool("ag_max_pool2d", GGML_OP_POOL_MAX, x, kernel_size, stride)


def ag_avg_pool2d(x: AgTensor, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None
                  ) -> AgTensor:
    """2-D average pooling of ``(N, C, H, W)`` images.

    Arguments:
        x: the images.
        kernel_size: the window: an int or (height, width).
        stride: an int or (height, width); None: the window.

    Value: a lazy AgTensor ``(N, C, OH, OW)``.

    Example:
        >>> y = ag_avg_pool2d(h, 2)
    """
    return _pool("ag_avg_pool2d", GGML_OP_POOL_AVG, x, kernel_size, stride)
