"""Transposed convolution (Keras' ``Conv2DTranspose``): the adjoint of a strided convolution; it upsamples.

Each input pixel scatters ``pixel x kernel`` into the output at ``stride`` steps; the windows overlap where
the kernel is larger than the stride and add up. ggml's own CONV_TRANSPOSE_2D has no backward pass, and
"insert ``stride - 1`` zeros between the pixels, then convolve" spends ``1 - 1/stride**2`` of its products on
those zeros. This layer computes it by **phases** (the sub-pixel form), from ops that ggml differentiates
and that run on the device (a training step on Vulkan is one split, nothing on the CPU):

* output row ``o = q * stride + r`` only sees the kernel taps ``r, r + stride, r + 2 stride, ...``, so each of
  the ``stride`` phases ``r`` is an ordinary stride-1 correlation of the input with ``ceil(kernel / stride)``
  taps (the taps reversed: a correlation runs the other way round from a scatter);
* one im2col of the input serves every phase, and one matrix product computes all of them at once, the
  phases side by side with the filters (``stride_rows * stride_cols * filters`` outputs per position);
* the phases are interleaved back into rows and columns by two views and permutes (a pixel shuffle), the
  views also cropping the window Keras keeps (``padding``).

A training step takes 2x (kernel 3, stride 2) to 4.7x (kernel 5, stride 2) less time than zero insertion
on the CPU, the same at stride 1. The phase kernel is made from the layer's kernel in the graph by one small
product with a constant 0/1 matrix (it reverses, splits and zero-pads the taps), so the trained weight
stays in Keras' orientation ``(rows, cols, filters, in channels)``. The image layout is ``conv.py``'s
(``SPATIAL``): a sample ``(H, W, C)`` is the tensor ``[W, H, C, N]``.
"""
from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from ...core.args import int_pair_arg
from ...core.types import GGML_TYPE_F32
from ...errors import GgmlValueError
from ...ops.conv import ggml_im2col
from ...ops.elementwise import ggml_cont
from ...ops.layout import ggml_permute, ggml_reshape_2d, ggml_reshape_4d, ggml_view_3d, ggml_view_4d
from ...ops.linalg import ggml_mul_mat
from .convolutional import Convolution
from .layer import Builder, LayerOptions


if TYPE_CHECKING:
    from typing_extensions import Unpack


F32 = 4  # bytes per value: the views below count strides in bytes


def transposed_size(size: int, k: int, s: int, padding: str) -> tuple[int, int]:
    """(output size, where Keras' window starts in the full scatter) along one axis.

    The full scatter of ``size`` positions is ``(size - 1) * s + k`` long. Keras (``output_padding=None``)
    keeps ``size * s + max(k - s, 0)`` positions from its start for 'valid' (zeros past the end when the
    stride exceeds the kernel) and ``size * s`` for 'same', starting ``(k - s) // 2`` in: when ``k - s`` is odd
    the extra position is cut from the end.
    """
    if padding == "valid":
        return size * s + max(k - s, 0), 0
    return size * s, max((k - s) // 2, 0)


def _phase_plan(size: int, k: int, s: int, padding: str) -> dict:
    """How one axis is computed: ``taps`` per phase, the im2col ``pad``, the ``positions`` computed per phase,
    and the ``start`` of Keras' window in the interleaved phases."""
    out, start = transposed_size(size, k, s, padding)
    taps = -(-k // s)
    lo, hi = start // s, -(-(start + out) // s)         # the phase positions the window touches: [lo, hi)
    # phase position q reads input positions q - taps + 1 .. q; with im2col's (symmetric) padding ``pad`` the
    # first position computed is taps - 1 - pad and the last size - 1 + pad: reach back to lo and on to hi - 1
    pad = max(taps - 1 - lo, hi - size, 0)
    first = taps - 1 - pad
    return {"out": out, "taps": taps, "pad": pad, "positions": size + 2 * pad - taps + 1,
            "start": start - first * s}


def phase_matrix(kh: int, kw: int, sh: int, sw: int) -> np.ndarray:
    """The constant 0/1 matrix that makes the phase kernel from the kernel's taps: numpy shape
    ``(R', kh * kw)``, row ``r' = jw + tw * (jh + th * (rh + sh * rw))`` for tap ``(jh, jw)`` of phase
    ``(rh, rw)`` (``th, tw`` taps per phase), picking kernel tap ``(rh + (th-1-jh) sh, rw + (tw-1-jw) sw)``
    (reversed), or nothing where that is past the kernel (zero padding)."""
    th, tw = -(-kh // sh), -(-kw // sw)
    m = np.zeros((th * tw * sh * sw, kh * kw), dtype=np.float32)
    for rw in range(sw):
        for rh in range(sh):
            for jh in range(th):
                for jw in range(tw):
                    a, b = rh + (th - 1 - jh) * sh, rw + (tw - 1 - jw) * sw
                    if a < kh and b < kw:
                        m[jw + tw * (jh + th * (rh + sh * rw)), a * kw + b] = 1.0
    return m


class Conv2DTranspose(Convolution):
    """Transposed 2-D convolution of channels-last images ``(H, W, C)`` (Keras' ``Conv2DTranspose``, often
    called deconvolution): each input pixel adds ``pixel x kernel`` into the output at ``strides`` steps, so
    the image grows by the stride; ``filters`` output channels, a bias, then ``activation``. A decoder's or a
    generator's upsampling layer, and the adjoint of ``conv_2d`` with the same kernel size and strides.

    The output has ``H * stride`` rows (``padding='same'``) or ``H * stride + max(kernel - stride, 0)`` rows
    (``'valid'``: the whole scatter, ``(H - 1) * stride + kernel`` when the kernel is at least the stride), and
    likewise columns, as Keras with ``output_padding=None``. The kernel is ``(rows, cols, filters, in
    channels)`` in ``ggml_get_weights``, Keras' orientation (filters before in channels, the reverse of
    ``conv_2d``'s), so Keras' weights load as they are. Computed in float32 by phases (one im2col and one
    matrix product for all of them); a training step on Vulkan stays on the device.

    Example:
        >>> x = g.ggml_input(shape=(7, 7, 32))
        >>> up = g.ggml_layer_conv_2d_transpose(x, 16, (3, 3), strides=2, padding='same', activation='relu')
        >>> up.shape
        (14, 14, 16)
    """
    kind = "conv_2d_transpose"
    ARG_DOCS = {  # where the meaning differs from conv_2d's (read by ggmlpy's generated help)
        "kernel_size": "the kernel's size, (rows, cols) or an int n for (n, n).",
        "strides": "the upsampling factor: the step between the kernel's copies in the output, (rows, cols) or "
                   "an int for both.",
        "padding": "'same' (the output is input * strides) or 'valid' (the whole scatter: (input - 1) * strides "
                   "+ kernel_size, at least input * strides), as Keras.",
    }

    def __init__(self, filters: int, kernel_size: Any, strides: Any = (1, 1), padding: str = "valid",
                 activation: str | None = None, use_bias: bool = True, kernel_initializer: str = "glorot_uniform",
                 bias_initializer: str = "zeros", **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self._set_common(filters, padding, activation, use_bias, kernel_initializer, bias_initializer)
        self.kernel_size = int_pair_arg(None, "kernel_size", kernel_size)
        self.strides = int_pair_arg(None, "strides", strides)

    def _plans(self, shape) -> tuple[dict, dict]:
        if len(shape) != 3:
            raise GgmlValueError(f"conv_2d_transpose '{self.name}' takes image samples (height, width, channels), "
                                 f"got shape {shape}")
        (kh, kw), (sh, sw) = self.kernel_size, self.strides
        return (_phase_plan(shape[0], kh, sh, self.padding), _phase_plan(shape[1], kw, sw, self.padding))

    def output_shape(self, shapes):
        rows, cols = self._plans(shapes[0])
        return (rows["out"], cols["out"], self.filters)

    def make_params(self, shapes):
        (kh, kw), cin = self.kernel_size, shapes[0][2]
        # Keras' fans of a (kh, kw, filters, cin) kernel: the filters are its fan-in (the layer runs backwards)
        fans = (kh * kw * self.filters, kh * kw * cin)
        return [self.kernel.spec((kw, kh, self.filters, cin), fans, user_axes=(2, 3, 1, 0)),
                self.bias.spec((self.filters,), (self.filters, self.filters))]

    def _phase_kernel(self, g: Builder, cin: int, th: int, tw: int) -> Any:
        """The kernel as the product with im2col's columns needs it: ``[tw * th * cin, filters * sh * sw]``,
        the taps of each phase reversed, rows in im2col's order (column tap fastest, then row tap, then channel),
        columns filter fastest, then row phase, then column phase."""
        ctx = g.ctx
        (kh, kw), (sh, sw), f = self.kernel_size, self.strides, self.filters
        kernel = ggml_reshape_2d(ctx, g.param(self, self.kernel), kw * kh, f * cin)       # [taps, F*Cin]
        taps = ggml_mul_mat(ctx, kernel, g.constant(phase_matrix(kh, kw, sh, sw)))     # [F*Cin, T*phases]
        taps = ggml_reshape_4d(ctx, taps, f, cin, tw * th, sh * sw)
        taps = ggml_cont(ctx, ggml_permute(ctx, taps, 2, 1, 0, 3))                     # [T, Cin, F, phases]
        return ggml_reshape_2d(ctx, taps, tw * th * cin, f * sh * sw)

    def forward(self, g, xs, shapes):
        ctx = g.ctx
        rows, cols = self._plans(shapes[0])
        (sh, sw), f, cin = self.strides, self.filters, shapes[0][2]
        x = xs[0]                                                                      # [W, H, Cin, N]
        n = x.shape[3]
        th, tw = rows["taps"], cols["taps"]
        # im2col reads only its kernel operand's shape. Not the phase kernel: ggml's backward asserts on the
        # gradient of every source that needs one, and would find that kernel's not made yet (a null pointer)
        im = ggml_im2col(ctx, g.zeros((tw, th, cin)), x, 1, 1, cols["pad"], rows["pad"], 1, 1, True,
                         GGML_TYPE_F32)                                                # [TW*TH*Cin, QW, QH, N]
        qw, qh = cols["positions"], rows["positions"]
        # every phase of every filter at each position: [F * sh * sw, QW * QH * N], the phases beside the filters
        y = ggml_mul_mat(ctx, self._phase_kernel(g, cin, th, tw),
                         ggml_reshape_2d(ctx, im, tw * th * cin, qw * qh * n))
        # columns: the column phase sits just before the column position, so column index w = rw + sw * q is
        # one axis of stride F*sh; keep Keras' window of it and bring it first (views of contiguous tensors
        # only: a view's backward writes into its source at the view's strides)
        ow, oh = cols["out"], rows["out"]
        y = ggml_view_3d(ctx, y, f * sh, ow, qh * n, f * sh * F32, f * sh * sw * qw * F32,
                         cols["start"] * f * sh * F32)                                 # [F*sh, OW, QH*N]
        y = ggml_cont(ctx, ggml_permute(ctx, y, 1, 0, 2, 3))                           # [OW, F*sh, QH*N]
        # rows: in [OW, F, sh, QH, N] the row phase and position make row index h = rh + sh * q, stride OW*F
        y = ggml_view_4d(ctx, y, ow, f, oh, n, ow * F32, ow * f * F32, ow * f * sh * qh * F32,
                         rows["start"] * ow * f * F32)                                 # [OW, F, OH, N]
        y = ggml_permute(ctx, y, 0, 2, 1, 3)                                           # [OW, OH, F, N]
        bias = ggml_reshape_4d(ctx, g.param(self, self.bias), 1, 1, f, 1) if self.use_bias else None
        return self._activate(g, self._add_bias(g, y, bias), shapes)
