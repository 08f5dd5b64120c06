"""Keras' preprocessing layers that belong in the model, computed on the model's device: ``Rescaling`` (pixel values
to [0, 1], in training and inference) and ``RandomFlip`` (augmentation: each training step flips each image with
probability 1/2, drawn on the device; predict and evaluate leave images as they are).

A flip is a reflection padding (``ggml_pad_reflect_1d`` of ``W - 1`` positions before each row, whose first ``W``
values are the row reversed), chosen per sample by a mask of 0 and 1 that the step's dropout seeds draw
(``x + m (flip(x) - x)``). ggml has no backward pass for the padding, so a flip goes where Keras puts it: on the
inputs, before any layer with weights (elsewhere the fit refuses the graph, naming the op).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...core.args import is_real
from ...errors import GgmlValueError
from ...graph.objects import Tensor
from ...graph.tensor import ggml_set_name
from ...ops.elementwise import ggml_add, ggml_cont, ggml_mul, ggml_scale, ggml_scale_bias, ggml_sub
from ...ops.layout import ggml_permute, ggml_view_4d
from ...ops.resize import ggml_pad_reflect_1d
from .layer import Builder, Layer, LayerOptions, SPATIAL


if TYPE_CHECKING:
    from typing_extensions import Unpack


class Rescaling(Layer):
    """Every value times ``scale`` plus ``offset`` (Keras' ``Rescaling``), in training and inference: pixel values
    0-255 to [0, 1] with ``scale=1/255``, to [-1, 1] with ``scale=1/127.5, offset=-1``.

    Example:
        >>> model = g.ggml_layer_rescaling(model, 1 / 255, input_shape=(28, 28, 1))
    """
    kind = "rescaling"
    mask_support = "propagate"

    def __init__(self, scale: float, offset: float = 0.0, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        for name, value in (("scale", scale), ("offset", offset)):
            if not is_real(value) or not np.isfinite(value):
                raise GgmlValueError(f"rescaling {name} must be a finite number, got {value!r}")
        self.scale, self.offset = float(scale), float(offset)

    def forward(self, g, xs, shapes):
        return ggml_scale_bias(g.ctx, xs[0], self.scale, self.offset)


MODES = ("horizontal", "vertical", "horizontal_and_vertical")


class RandomFlip(Layer):
    """Images (H, W, C) flipped at random in training (Keras' ``RandomFlip``): left-right (``"horizontal"``),
    upside down (``"vertical"``) or each of the two (``"horizontal_and_vertical"``, the default), each with
    probability 1/2 per image, drawn anew every step on the model's device; unchanged in predict and evaluate.
    Put it on the inputs, before the layers with weights (ggml has no backward pass for the flip).

    Example:
        >>> model = g.ggml_layer_random_flip(model, "horizontal", input_shape=(32, 32, 3))
    """
    kind = "random_flip"
    layout = SPATIAL

    def __init__(self, mode: str = "horizontal_and_vertical", **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if mode not in MODES:
            raise GgmlValueError(f"random_flip mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    def output_shape(self, shapes):
        if len(shapes[0]) != 3:
            raise GgmlValueError(f"random_flip '{self.name}' takes image samples (height, width, channels), got "
                                 f"shape {shapes[0]}")
        return shapes[0]

    def _axes(self) -> list[int]:
        """The ggml axes flipped: 0 (W, left-right), 1 (H, upside down)."""
        return [axis for axis, word in ((0, "horizontal"), (1, "vertical")) if word in self.mode]

    def forward(self, g, xs, shapes):
        x = xs[0]                                              # [W, H, C, N]
        for axis in self._axes():
            if x.shape[axis] > 1:
                x = _maybe(g, x, _flipped(g, x, axis, self.name or self.kind))
        return x

    def predict_forward(self, g, xs, shapes):
        return xs[0]

    def dropout_seeds(self) -> int:
        return len(self._axes())


def _flipped(g: Builder, x: Tensor, axis: int, layer: str) -> Tensor:
    """``x`` reversed along ggml axis 0 or 1 (the padding named after ``layer``: an error about its missing
    backward pass then says where the flip is and where it belongs)."""
    ctx = g.ctx
    rows = ggml_cont(ctx, x if axis == 0 else ggml_permute(ctx, x, 1, 0, 2, 3))   # the axis first
    n = rows.shape[0]
    padded = ggml_pad_reflect_1d(ctx, rows, n - 1, 0)        # [x_{n-1} .. x_1, x_0 .. x_{n-1}]
    ggml_set_name(padded, f"{layer[:24]}: put it before the weights")
    nb = [int(padded.ptr.nb[i]) for i in range(4)]
    _, ne1, ne2, ne3 = rows.shape
    first = ggml_cont(ctx, ggml_view_4d(ctx, padded, n, ne1, ne2, ne3, nb[1], nb[2], nb[3], 0))
    return first if axis == 0 else ggml_cont(ctx, ggml_permute(ctx, first, 1, 0, 2, 3))


def _maybe(g: Builder, x: Tensor, flipped: Tensor) -> Tensor:
    """``flipped`` for about half of the samples (drawn every step), ``x`` for the others."""
    ctx = g.ctx
    ones = g.constant(np.ones((g.batch, 1, 1, 1), dtype=np.float32))    # [1, 1, 1, N]
    pick = ggml_scale(ctx, g.dropout(ones, 0.5), 0.5)                    # 0 or 1 per sample
    return ggml_add(ctx, x, ggml_mul(ctx, ggml_sub(ctx, flipped, x), pick))
