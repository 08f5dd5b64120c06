"""Keras' masking of padded sequences: ``Masking(mask_value)`` marks each step of a sample whose features all
equal ``mask_value`` as padding (``(x - v)`` is zero everywhere), and the layers after it skip those steps.

A mask is a ``[1, steps, N]`` F32 tensor of 1 (a real step) and 0 (padding), made on the model's device. The
graph builder hands a node's mask to the layers that read its output (``GraphBuilder.input_mask``): layers that
keep the steps pass it on (``mask_support = "propagate"``: dropout, activation, dense on sequences, layer norm,
time_distributed, a recurrent layer with ``return_sequences``), layers that fold the steps use it (a recurrent
layer carries its state over padding, global average pooling averages the real steps only), and any other
layer drops it with a warning, as Keras 3 does (a flatten after a masking layer: the padding steps then count
like the others).
"""
from __future__ import annotations

import warnings
from typing import Any, TYPE_CHECKING

from ...core.args import FLOAT32_MAX, is_real
from ...errors import GgmlpyWarning, GgmlValueError
from ...graph.objects import Tensor
from ...ops.elementwise import ggml_abs, ggml_add, ggml_cont, ggml_mul, ggml_scale_bias, ggml_step, ggml_sub
from ...ops.layout import ggml_permute, ggml_view_2d
from ...ops.reduce import ggml_sum_rows
from .layer import Builder, Layer, LayerOptions


if TYPE_CHECKING:
    from typing_extensions import Unpack


F32 = 4


class Masking(Layer):
    """Keras' Masking: steps of a sequence (steps, features) whose features all equal ``mask_value`` are
    padding, which the layers after it skip (an LSTM/GRU keeps its state over them, global average pooling
    leaves them out); their values become 0, as in Keras. A layer that cannot honour the mask is refused.

    Example:
        >>> model = g.ggml_layer_masking(model, mask_value=0.0, input_shape=(20, 3))
    """
    kind = "masking"
    mask_support = "propagate"
    makes_mask = True
    ARG_DOCS = {"mask_value": "the value every feature of a padding step holds (0.0, Keras' default)."}

    def __init__(self, mask_value: float = 0.0, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if not is_real(mask_value) or not abs(mask_value) <= FLOAT32_MAX:
            raise GgmlValueError(f"masking mask_value must be a finite number, got {mask_value!r}")
        self.mask_value = float(mask_value)

    def output_shape(self, shapes):
        if len(shapes[0]) != 2:
            raise GgmlValueError(f"masking '{self.name}' takes sequences (steps, features), got samples of shape "
                                 f"{shapes[0]}")
        return shapes[0]

    def step_mask(self, g: Builder, x: Tensor) -> Tensor:
        """1 where a step has a feature other than mask_value: ``step(sum_features |x - v|)``, ``[1, T, N]``."""
        ctx = g.ctx
        return ggml_step(ctx, ggml_sum_rows(ctx, ggml_abs(ctx, ggml_scale_bias(ctx, x, 1.0, -self.mask_value))))

    def forward(self, g, xs, shapes):
        mask = self.step_mask(g, xs[0])
        out = ggml_mul(g.ctx, xs[0], mask)
        self.__dict__["_made"] = (out, mask)  # output_mask follows at once (GraphBuilder.build): no second mask
        return out

    def output_mask(self, g: Builder, in_mask: Tensor | None, xs: list, out: Tensor) -> Tensor | None:
        made = self.__dict__.pop("_made", None)
        mask = made[1] if made is not None and made[0] is out else self.step_mask(g, xs[0])
        return mask if in_mask is None else ggml_mul(g.ctx, mask, in_mask)  # masking after masking: both apply


def time_major_mask(g: Builder, mask: Tensor) -> Tensor:
    """``[1, T, N]`` as ``[1, N, T]``, so that each step's mask is a contiguous ``[1, N]`` block."""
    return ggml_cont(g.ctx, ggml_permute(g.ctx, mask, 0, 2, 1, 3))


def step_of(g: Builder, mask_tn: Tensor, t: int) -> Tensor:
    """Step ``t``'s ``[1, N]`` mask from ``time_major_mask``'s result."""
    n = mask_tn.shape[1]
    return ggml_view_2d(g.ctx, mask_tn, 1, n, F32, t * n * F32)


def carry_over(g: Builder, new: Tensor, old: Tensor | None, m: Tensor) -> Tensor:
    """``new`` where the step is real, ``old`` (0 before the first step) over padding: ``old + m (new - old)``."""
    if old is None:
        return ggml_mul(g.ctx, new, m)
    return ggml_add(g.ctx, old, ggml_mul(g.ctx, ggml_sub(g.ctx, new, old), m))


MASK_AWARE = "lstm, gru, bidirectional and global_average_pooling_1d use it; dropout, activation, dense, layer_norm, " \
    "time_distributed and recurrent layers with return_sequences pass it on"


def masks_output(layer: Layer, carrying: list[int]) -> bool:
    """Whether ``layer``'s output carries a padding mask when its inputs ``carrying`` (their positions) carry one; a
    layer that cannot honour it drops it with a warning (mask_flow's rule per layer; a sequential model checks it as
    each layer is added)."""
    if not carrying:
        return bool(layer.makes_mask)
    if layer.mask_support == "none":
        if not layer.__dict__.get("_mask_dropped"):   # once per layer, not at every compile, fit and predict
            layer.__dict__["_mask_dropped"] = True
            warnings.warn(f"layer '{layer.name}' ({layer.kind}) gets the padding mask of a masking layer, which it "
                          f"cannot honour: the mask is dropped there, and the layers after it see the padding steps "
                          f"as real ones (as in Keras 3). {MASK_AWARE}", GgmlpyWarning, stacklevel=2)
        return False
    if carrying != [0]:
        raise GgmlValueError(f"layer '{layer.name}' ({layer.kind}) gets a padding mask on an input other than "
                             "its sequence (an initial state, a key or value): not supported; mask the "
                             "sequence it reads first")
    return bool(layer.passes_mask)


def mask_flow(model: Any) -> set[int]:
    """The ids of the nodes whose output carries a padding mask, checked from the layers alone (at compile and
    when a graph is built): a mask reaching a layer that cannot honour it is dropped there (a warning); one reaching
    another input than a layer's sequence, or the model's output (its padding steps would count in the loss), is
    refused."""
    inputs, outputs, nodes = model.graph()
    masked: set[int] = set()
    for node in nodes:
        if node.is_input:
            continue
        layer = node.layer
        if masks_output(layer, [i for i, n in enumerate(node.inputs) if id(n) in masked]):
            masked.add(id(node))
    for n in outputs:
        if id(n) in masked:
            raise GgmlValueError(f"output '{n.layer.name}' still carries the padding mask of a masking layer: its "
                                 "padding steps would count in the loss. End the masked part in a recurrent layer "
                                 "without return_sequences (or bidirectional) or a global_average_pooling_1d")
    return masked
