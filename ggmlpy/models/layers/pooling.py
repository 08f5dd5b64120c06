"""Pooling and resampling layers beyond convolutional.py's: average pooling 2-D, 1-D pooling of sequences (windowed
and global), and nearest-neighbour up-sampling of images, as Keras defines them (``padding="valid"`` or
``"same"``).

Sequences ``(steps, channels)`` are ``[steps, C, N]`` in ggml's sequence layout and images ``(H, W, C)`` are
``[W, H, C, N]``; a 1-D window is a 2-D pool of ``k x 1`` over ``[steps, C, N]`` (ggml has a backward pass for
POOL_2D on every backend, none for POOL_1D). Up-sampling is a broadcast (``ggml_repeat``), whose backward is a
sum (REPEAT_BACK).
"""
from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from ...core.args import FLOAT32_MAX, int_pair_arg, positive_int_arg
from ...errors import GgmlValueError
from ...ops.conv import GGML_OP_POOL_AVG, GGML_OP_POOL_MAX, ggml_pool_2d
from ...ops.elementwise import ggml_clamp, ggml_div, ggml_mul, ggml_scale
from ...ops.layout import ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d
from ...ops.reduce import ggml_repeat, ggml_sum_rows
from .convolutional import pad_axis, padding_arg, pooled_size, Pooling2D, same_padding
from .layer import Layer, LayerOptions, NATURAL, SPATIAL


if TYPE_CHECKING:
    from typing_extensions import Unpack


def window_counts(size: int, k: int, s: int) -> np.ndarray:
    """For ``padding='same'``: how many positions inside the input each output's window covers."""
    out, before, _ = same_padding(size, k, s)
    starts = np.arange(out) * s - before
    return (np.minimum(starts + k, size) - np.maximum(starts, 0)).astype(np.float64)


class AveragePooling2D(Pooling2D):
    """2-D average pooling: the mean over ``pool_size=(rows, cols)`` windows with ``strides`` (default: the pool
    size) and ``padding`` ``"valid"`` (the default) or ``"same"`` (Keras': a window at the edge averages the
    positions inside the image only).

    Example:
        >>> model = g.ggml_layer_average_pooling_2d(model, (2, 2))
    """
    kind = "average_pooling_2d"
    edge_padding = False   # zeros, then each window's mean rescaled to the positions it covers

    def forward(self, g, xs, shapes):
        (kh, kw), (sh, sw) = self.pool_size, self.strides
        y = ggml_pool_2d(g.ctx, self.padded(g, xs[0], shapes[0]), GGML_OP_POOL_AVG, kw, kh, sw, sh, 0, 0)
        if self.padding != "same":
            return y
        h, w = shapes[0][:2]
        covered = np.outer(window_counts(h, kh, sh), window_counts(w, kw, sw))     # (OH, OW)
        return ggml_mul(g.ctx, y, g.constant(kh * kw / covered))


def _sequence_shape(layer: Layer, shapes: list) -> tuple[int, int]:
    if len(shapes[0]) != 2:
        raise GgmlValueError(f"{layer.kind} '{layer.name}' takes sequence samples (steps, channels), got shape "
                             f"{shapes[0]}")
    return shapes[0]


class _Pooling1D(Layer, abstract=True):
    layout = SPATIAL
    op = GGML_OP_POOL_MAX

    def __init__(self, pool_size: int = 2, strides: int | None = None, padding: str = "valid",
                 **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.pool_size = positive_int_arg(None, "pool_size", pool_size)
        self.strides = positive_int_arg(None, "strides", strides) if strides is not None else self.pool_size
        self.padding = padding_arg(padding)

    def output_shape(self, shapes):
        steps, channels = _sequence_shape(self, shapes)
        if self.padding == "same":
            return (same_padding(steps, self.pool_size, self.strides)[0], channels)
        return (pooled_size(steps, self.pool_size, self.strides, self), channels)

    def forward(self, g, xs, shapes):
        x, k, s = xs[0], self.pool_size, self.strides
        if self.padding == "same":   # max: edge copies; average: zeros, each window rescaled to what it covers
            x = pad_axis(g, x, 0, *same_padding(shapes[0][0], k, s)[1:], edge=self.op == GGML_OP_POOL_MAX)
        y = ggml_pool_2d(g.ctx, x, self.op, k, 1, s, 1, 0, 0)
        if self.padding == "same" and self.op == GGML_OP_POOL_AVG:
            y = ggml_mul(g.ctx, y, g.constant(k / window_counts(shapes[0][0], k, s)))
        return y


class MaxPooling1D(_Pooling1D):
    """1-D max pooling of sequences (steps, channels) over windows of ``pool_size`` steps with ``strides``
    (default: the pool size) and ``padding`` ``"valid"`` (the default) or ``"same"`` (Keras').

    Example:
        >>> model = g.ggml_layer_max_pooling_1d(model, 2)
    """
    kind = "max_pooling_1d"


class AveragePooling1D(_Pooling1D):
    """1-D average pooling of sequences (steps, channels): the mean over windows of ``pool_size`` steps with
    ``strides`` (default: the pool size) and ``padding`` ``"valid"`` (the default) or ``"same"`` (Keras': a
    window at the edge averages the steps inside the sequence only).

    Example:
        >>> model = g.ggml_layer_average_pooling_1d(model, 4)
    """
    kind = "average_pooling_1d"
    op = GGML_OP_POOL_AVG


class _GlobalPooling1D(Layer, abstract=True):
    layout = SPATIAL
    out_layout = NATURAL  # a (C,) sample is [C, N] in both layouts

    def output_shape(self, shapes):
        return (_sequence_shape(self, shapes)[1],)


class GlobalAveragePooling1D(_GlobalPooling1D):
    """The mean of each channel over the steps of a sequence: (steps, C) becomes (C,); with a padding mask,
    the mean of the real steps.

    Example:
        >>> model = g.ggml_layer_global_average_pooling_1d(model)
    """
    kind = "global_average_pooling_1d"
    mask_support = "consume"  # the mean of the real steps only

    def forward(self, g, xs, shapes):
        steps, channels = shapes[0]
        ctx, mask = g.ctx, g.input_mask
        if mask is None:
            mean = ggml_scale(ctx, ggml_sum_rows(ctx, xs[0]), 1.0 / steps)  # [1, C, N]
        else:  # spatial [T, C, N] times the mask as [T, 1, N]; a sample of padding only averages to 0
            m = ggml_reshape_3d(ctx, mask, steps, 1, g.batch)
            count = ggml_clamp(ctx, ggml_sum_rows(ctx, m), 1.0, FLOAT32_MAX)   # [1, 1, N]
            mean = ggml_div(ctx, ggml_sum_rows(ctx, ggml_mul(ctx, xs[0], m)), count)
        return ggml_reshape_2d(ctx, mean, channels, g.batch)


class GlobalMaxPooling1D(_GlobalPooling1D):
    """The maximum of each channel over the steps of a sequence: (steps, C) becomes (C,).

    Example:
        >>> model = g.ggml_layer_global_max_pooling_1d(model)
    """
    kind = "global_max_pooling_1d"

    def forward(self, g, xs, shapes):
        steps, channels = shapes[0]
        pooled = ggml_pool_2d(g.ctx, xs[0], GGML_OP_POOL_MAX, steps, 1, steps, 1, 0, 0)  # [1, C, N]
        return ggml_reshape_2d(g.ctx, pooled, channels, g.batch)


class UpSampling2D(Layer):
    """Nearest-neighbour up-sampling of images: every pixel repeated ``size=(rows, cols)`` times, (H, W, C)
    becomes (H * rows, W * cols, C) (Keras' ``interpolation="nearest"``).

    Example:
        >>> model = g.ggml_layer_upsampling_2d(model, (2, 2))
    """
    kind = "upsampling_2d"
    layout = SPATIAL

    def __init__(self, size: Any = (2, 2), **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.size = int_pair_arg(None, "size", size)

    def output_shape(self, shapes):
        if len(shapes[0]) != 3:
            raise GgmlValueError(f"upsampling_2d '{self.name}' takes image samples (height, width, channels), got "
                                 f"shape {shapes[0]}")
        h, w, c = shapes[0]
        return (h * self.size[0], w * self.size[1], c)

    def forward(self, g, xs, shapes):
        h, w, c = shapes[0]
        rows, cols = self.size
        # [W, H, C, N] seen as [1, W, 1, H*C*N], broadcast to [cols, W, rows, H*C*N]: in memory that is the
        # image [cols*W, rows*H, C, N] with every pixel copied into a cols x rows block
        x = ggml_reshape_4d(g.ctx, xs[0], 1, w, 1, h * c * g.batch)
        like = g.shape_target((cols, w, rows, h * c * g.batch))
        return ggml_reshape_4d(g.ctx, ggml_repeat(g.ctx, x, like), cols * w, rows * h, c, g.batch)

