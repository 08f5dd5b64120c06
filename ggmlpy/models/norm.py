"""Batch normalisation.

Training normalises each channel (the last axis of a sample) with the batch's mean and biased
variance, taken over the batch and every other axis, then scales by ``gamma`` and shifts by
``beta``. Each training step also updates the running statistics from the batch's as in Keras,
``running = momentum * running + (1 - momentum) * batch``, inside the graph (copied into the layer's
state on its device; no trip to the host). ``ggml_predict``/``ggml_evaluate`` use the running statistics.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.args import is_real, positive_float32_arg
from ..errors import GgmlValueError
from ..ops.elementwise import (
    ggml_add,
    ggml_cont,
    ggml_div,
    ggml_mul,
    ggml_norm,
    ggml_scale,
    ggml_scale_bias,
    ggml_sqr,
    ggml_sqrt,
    ggml_sub,
)
from ..ops.layout import ggml_cpy, ggml_reshape, ggml_reshape_1d, ggml_reshape_2d, ggml_transpose
from ..ops.reduce import ggml_repeat, ggml_sum_rows
from .layers import Layer, LayerOptions, ParamSpec


if TYPE_CHECKING:
    from typing_extensions import Unpack


class BatchNorm(Layer):
    """Batch normalisation over the last axis of a sample. A frozen batch norm (``trainable=False``,
    ``ggml_freeze_weights``) runs in inference mode while the rest trains, as in Keras: it normalises with
    its running statistics and leaves them unchanged."""
    kind = "batch_norm"

    def __init__(self, eps: float = 1e-5, momentum: float = 0.99, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if not is_real(momentum) or not 0 <= momentum <= 1:
            raise GgmlValueError(f"batch_norm momentum must be in [0, 1], got {momentum!r}")
        self.eps = positive_float32_arg("batch_norm eps", eps, "; the usual value is 1e-5")
        self.momentum = float(momentum)

    def config(self) -> dict:
        return {"eps": self.eps, "momentum": self.momentum}

    def make_params(self, shapes):
        c = shapes[0][-1]
        return [ParamSpec("gamma", (c,), "ones"), ParamSpec("beta", (c,), "zeros"),
                ParamSpec("running_mean", (c,), "zeros", trainable=False),
                ParamSpec("running_var", (c,), "ones", trainable=False)]

    def forward(self, g, xs, shapes):
        if not self.trainable:
            return self.predict_forward(g, xs, shapes)
        c = shapes[0][-1]
        rows = int(np.prod(shapes[0][:-1])) * g.batch   # values per channel
        ctx = g.ctx
        x = ggml_reshape_2d(ctx, xs[0], c, rows)

        def channel_mean(t):  # [C, rows] -> [C, 1]; sum_rows works along ne[0], so transpose first
            m = ggml_scale(ctx, ggml_sum_rows(ctx, ggml_cont(ctx, ggml_transpose(ctx, t))), 1 / rows)
            return m

        mean = channel_mean(x)                                          # [1, C]
        centered = ggml_sub(ctx, x, ggml_repeat(ctx, ggml_reshape_2d(ctx, mean, c, 1), x))
        var = channel_mean(ggml_sqr(ctx, centered))                 # biased, as Keras
        std = ggml_sqrt(ctx, ggml_scale_bias(ctx, ggml_reshape_2d(ctx, var, c, 1), 1.0, self.eps))
        normed = ggml_div(ctx, centered, ggml_repeat(ctx, std, centered))
        y = ggml_add(ctx, ggml_mul(ctx, normed, g.param(self, "gamma")), g.param(self, "beta"))
        # after each step the running statistics take the batch's in, on the device (Keras' update):
        # running = momentum * running + (1 - momentum) * batch
        for name, batch in (("running_mean", mean), ("running_var", var)):
            running = g.param(self, name)
            new = ggml_add(ctx, ggml_scale(ctx, running, self.momentum),
                               ggml_scale(ctx, ggml_reshape_1d(ctx, batch, c), 1.0 - self.momentum))
            g.side_output(ggml_cpy(ctx, new, running))
        return ggml_reshape(ctx, y, xs[0])

    def predict_forward(self, g, xs, shapes):
        ctx = g.ctx
        inv_std = ggml_sqrt(ctx, ggml_scale_bias(ctx, g.param(self, "running_var"), 1.0, self.eps))
        scale = ggml_div(ctx, g.param(self, "gamma"), inv_std)
        centered = ggml_sub(ctx, xs[0], g.param(self, "running_mean"))
        return ggml_add(ctx, ggml_mul(ctx, centered, scale), g.param(self, "beta"))


class LayerNorm(Layer):
    """Layer normalisation: each position normalised over its last axis (mean 0, biased variance 1,
    as Keras), then scaled by ``gamma`` and shifted by ``beta``; the same in training and inference."""
    kind = "layer_norm"
    mask_support = "propagate"  # each position on its own

    def __init__(self, eps: float = 1e-5, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.eps = positive_float32_arg("layer_norm eps", eps, "; the usual value is 1e-5")

    def config(self) -> dict:
        return {"eps": self.eps}

    def make_params(self, shapes):
        c = shapes[0][-1]
        return [ParamSpec("gamma", (c,), "ones"), ParamSpec("beta", (c,), "zeros")]

    def forward(self, g, xs, shapes):
        ctx = g.ctx
        normed = ggml_norm(ctx, xs[0], self.eps)     # over ne[0]: the last axis of a sample
        return ggml_add(ctx, ggml_mul(ctx, normed, g.param(self, "gamma")), g.param(self, "beta"))
