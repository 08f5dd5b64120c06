"""Layers that wrap another layer, as Keras' wrappers: ``TimeDistributed`` (the same layer on every step of a
sequence) and ``Bidirectional`` (a recurrent layer run forwards and backwards, the two outputs merged).

A wrapper owns its inner layers' weights (saved as ``<wrapper>.<weight>``, ``<wrapper>.forward_<weight>`` /
``backward_<weight>``) and builds them through a view of the graph builder that maps the inner layer's weights
to its own (and, for TimeDistributed, counts every step of every sample as a sample of the inner layer).
"""
from __future__ import annotations

import weakref
from dataclasses import replace
from typing import Any, cast, TYPE_CHECKING

from ...errors import GgmlTypeError, GgmlValueError
from ...graph.objects import Tensor
from ...ops.elementwise import ggml_add, ggml_mul, ggml_scale
from ...ops.layout import ggml_reshape
from ...ops.reduce import ggml_concat
from .layer import Builder, Layer, LayerOptions, NATURAL
from .sequence import Recurrent
from .weight import BoundWeight, weight_name


if TYPE_CHECKING:
    from typing_extensions import Unpack


class _InnerView:
    """The graph builder as an inner layer sees it: its weights are the wrapper's (``prefix`` + name), and
    ``batch`` counts the inner layer's samples."""

    def __init__(self, g: Builder, wrapper: Layer, inner: Layer, prefix: str, batch: int) -> None:
        self._g, self._wrapper, self._inner, self._prefix = g, wrapper, inner, prefix
        self.batch = batch
        self.input_mask = None  # the wrapper's mask is over its steps, not the inner layer's samples

    def _own(self, layer: Layer, weight: BoundWeight | str) -> str:
        """The wrapper's name for the inner layer's ``weight``."""
        if layer is not self._inner:
            raise GgmlTypeError(f"internal: layer '{layer.name}' asked for a weight inside {self._wrapper.kind} "
                                f"'{self._wrapper.name}'; this is a bug in ggmlpy, please report it")
        return self._prefix + weight_name(weight)

    def param(self, layer: Layer, weight: BoundWeight | str) -> Any:
        return self._g.param(self._wrapper, self._own(layer, weight))

    def product_weight(self, layer: Layer, weight: BoundWeight | str, ne: tuple[int, ...] | None = None) -> Tensor:
        return self._g.product_weight(self._wrapper, self._own(layer, weight), ne)

    def product(self, layer: Layer, weight: BoundWeight | str, x: Tensor, ne: tuple[int, ...] | None = None) -> Tensor:
        return self._g.product(self._wrapper, self._own(layer, weight), x, ne)

    def convert(self, t: Tensor, shape: tuple[int, ...], src: str, dst: str) -> Tensor:
        # the builder's, with this view's batch (the view stands in for the builder: the rest is its own)
        return type(self._g).convert(cast(Builder, self), t, shape, src, dst)

    def __getattr__(self, key: str) -> Any:
        return getattr(self._g, key)


def _fresh_inner(layer: Any, kind: str) -> Layer:
    if not isinstance(layer, Layer):
        raise GgmlTypeError(f"{kind}: expected a layer object to wrap (ggml_dense(8), ggml_lstm(16), ...), got "
                            f"{type(layer).__name__}")
    if layer.params is not None or layer.__dict__.get("_param_stores") or layer.__dict__.get("_wrapped"):
        raise GgmlValueError(f"{kind}: layer '{layer.name}' is already part of a model or a wrapper; wrap a new "
                             "layer object (its weights become the wrapper's)")
    if layer.many_inputs is True or layer.takes_int is True:
        raise GgmlValueError(f"{kind} cannot wrap a {layer.kind} layer (it takes "
                             f"{'several inputs' if layer.many_inputs else 'token ids'})")
    if not layer.trainable:
        raise GgmlValueError(f"{kind}: the wrapped layer has trainable=False, which the wrapper's weights would not "
                             f"follow; freeze the wrapper itself ({kind}(..., trainable=False) or "
                             "ggml_freeze_weights)")
    if layer.kind == "dropout":
        raise GgmlValueError(f"{kind} cannot wrap a dropout layer: a dropout drops each value on its own anyway, so "
                             "put it before or after the wrapper")
    layer.__dict__["_wrapped"] = True
    return layer


class TimeDistributed(Layer):
    """Keras' TimeDistributed: one layer (one set of weights) applied to every step of a sequence, ``(steps,
    ...)`` to ``(steps, *the layer's output)``. The inner layer sees each step as a sample of its own (a dense
    layer on ``(steps, features)``, a 1-D convolution on ``(steps, length, channels)``).

    Example:
        >>> model = g.ggml_layer_time_distributed(model, g.ggml_dense(8, activation='relu'))
    """
    kind = "time_distributed"
    mask_support = "propagate"
    ARG_DOCS = {"layer": "a new layer object (ggml_dense(8), ggml_conv_1d(4, 3), ...) applied to every step; its "
                         "weights become the wrapper's."}

    def __init__(self, layer: Any, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.layer = _fresh_inner(layer, "time_distributed")
        self.regularizers = dict(layer.regularizers)
        layer.__dict__["_wrapper"] = weakref.ref(self)  # what adapting the inner layer writes into

    @property
    def activation(self) -> Any:  # the loss reads it (a softmax left to the fused cross-entropy)
        return getattr(self.layer, "activation", None)

    @property
    def savable(self) -> bool:  # type: ignore[override]  # the wrapped layer's (a custom layer's forward is code)
        return self.layer.savable

    def config(self) -> dict:
        return {"layer": self.layer.full_config()}

    def _step_shape(self, shape: tuple) -> tuple:
        if len(shape) < 2:
            raise GgmlValueError(f"time_distributed '{self.name}' takes sequences (steps, ...), got samples of shape "
                                 f"{shape}")
        if len(shape) > 3:
            raise GgmlValueError(f"time_distributed '{self.name}': samples of shape {shape} with the batch make "
                                 f"{len(shape) + 1} axes, and ggml tensors have at most 4; use steps of at most 2 axes")
        return shape[1:]

    def output_shape(self, shapes):
        inner = self.layer.output_shape([self._step_shape(shapes[0])])
        if len(inner) + 1 > 3:
            raise GgmlValueError(f"time_distributed '{self.name}': {self.layer.kind} makes steps of shape {inner}; "
                                 "with the steps and the batch that is more than ggml's 4 axes")
        return (shapes[0][0],) + tuple(inner)

    def make_params(self, shapes):
        return self.layer.weight_specs([self._step_shape(shapes[0])])

    def graph_tensors(self, shapes):
        return 32 + self.layer.graph_tensors([self._step_shape(shapes[0])])

    def dropout_seeds(self) -> int:
        return self.layer.dropout_seeds()

    def _apply(self, g, xs, shapes, training: bool):
        steps, inner_in = shapes[0][0], self._step_shape(shapes[0])
        inner_out = self.layer.output_shape([inner_in])
        view = cast(Builder, _InnerView(g, self, self.layer, "", g.batch * steps))  # a Builder by delegation
        x = xs[0]   # natural [inner ne..., steps, N]: the same memory as [inner ne..., steps * N]
        x = ggml_reshape(g.ctx, x, g.shape_target(tuple(reversed(inner_in)) + (steps * g.batch,)))
        x = view.convert(x, inner_in, NATURAL, self.layer.layout)
        fwd = self.layer.forward if training else self.layer.predict_forward
        y = fwd(view, [x], [inner_in])
        y = view.convert(y, inner_out, self.layer.out_layout or self.layer.layout, NATURAL)
        return ggml_reshape(g.ctx, y, g.shape_target(tuple(reversed(inner_out)) + (steps, g.batch)))

    def forward(self, g, xs, shapes):
        return self._apply(g, xs, shapes, True)

    def predict_forward(self, g, xs, shapes):
        return self._apply(g, xs, shapes, False)


MERGE_MODES = ("concat", "sum", "mul", "ave")


class Bidirectional(Layer):
    """Keras' Bidirectional: an LSTM or GRU run forwards and, with weights of its own, backwards over the
    sequence; the two outputs concatenated (or summed, multiplied, averaged: ``merge_mode``). With
    ``return_sequences`` the backward outputs are put back in the input's order first, as Keras does.
    Weights: ``forward_kernel``, ..., ``backward_kernel``, ...

    Example:
        >>> model = g.ggml_layer_bidirectional(model, g.ggml_lstm(16, return_sequences=True))
    """
    kind = "bidirectional"
    mask_support = "consume"
    ARG_DOCS = {"layer": "a new LSTM or GRU layer object (ggml_lstm(16), ggml_gru(8)); its weights become the "
                         "wrapper's, a copy of it runs backwards.",
                "merge_mode": "how the two directions join: 'concat' (features side by side), 'sum', 'mul', 'ave'."}

    def __init__(self, layer: Any, merge_mode: str = "concat", **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        layer = _fresh_inner(layer, "bidirectional")
        if not isinstance(layer, Recurrent):
            raise GgmlValueError(f"bidirectional wraps a recurrent layer (ggml_lstm, ggml_gru), got {layer.kind}")
        if layer.return_state:
            raise GgmlValueError("bidirectional: return_state is not supported yet; use the sequence or last output "
                                 "(return_sequences)")
        if layer.go_backwards:
            raise GgmlValueError("bidirectional: give the forward layer (go_backwards=False); the wrapper makes the "
                                 "backward one")
        if merge_mode not in MERGE_MODES:
            raise GgmlValueError(f"bidirectional merge_mode must be one of {', '.join(MERGE_MODES)}, got "
                                 f"{merge_mode!r}")
        self.layer, self.merge_mode = layer, merge_mode
        self.regularizers = {f"{d}_{k}": r for k, r in layer.regularizers.items() for d in ("forward", "backward")}

    def config(self) -> dict:
        return {"layer": self.layer.full_config(), "merge_mode": self.merge_mode}

    def output_shape(self, shapes):
        inner = self.layer.output_shape(shapes)
        return inner[:-1] + (2 * inner[-1],) if self.merge_mode == "concat" else inner

    def make_params(self, shapes):
        specs = self.layer.weight_specs(shapes)
        return [replace(s, name=f"{d}_{s.name}") for d in ("forward", "backward") for s in specs]

    def graph_tensors(self, shapes):
        return 16 + 2 * self.layer.graph_tensors(shapes)

    def dropout_seeds(self) -> int:
        return 2 * self.layer.dropout_seeds()

    @property
    def passes_mask(self) -> bool:
        return self.layer.return_sequences

    def forward(self, g, xs, shapes):
        ctx, mask = g.ctx, g.input_mask
        fwd, _ = self.layer.run(_InnerView(g, self, self.layer, "forward_", g.batch), xs, shapes, False, True, mask)
        bwd, _ = self.layer.run(_InnerView(g, self, self.layer, "backward_", g.batch), xs, shapes, True, True, mask)
        if self.merge_mode == "concat":
            return ggml_concat(ctx, fwd, bwd, 0)
        if self.merge_mode == "sum":
            return ggml_add(ctx, fwd, bwd)
        if self.merge_mode == "mul":
            return ggml_mul(ctx, fwd, bwd)
        return ggml_scale(ctx, ggml_add(ctx, fwd, bwd), 0.5)
