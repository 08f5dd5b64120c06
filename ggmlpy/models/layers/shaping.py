"""Layers without weights that change a sample's shape or apply a function to it, as Keras defines them:
an activation on its own, a reshape (C order, as numpy's), and repeating a vector along a new steps axis."""
from __future__ import annotations

import math
from typing import Any, TYPE_CHECKING

from ...core.args import is_int, positive_int_arg
from ...errors import GgmlValueError
from ...graph.introspect import ggml_is_contiguous
from ...ops.elementwise import ggml_cont
from ...ops.layout import ggml_reshape, ggml_reshape_3d
from ...ops.reduce import ggml_repeat
from .activations import check_activation
from .layer import activate, Layer, LayerOptions, natural_ne


if TYPE_CHECKING:
    from typing_extensions import Unpack


class Activation(Layer):
    """An activation as a layer of its own (Keras' ``Activation``): relu, sigmoid, tanh, gelu, silu/swish,
    softmax (over the last axis) or linear.

    Example:
        >>> model = g.ggml_layer_activation(model, 'relu')
    """
    kind = "activation"
    mask_support = "propagate"

    def __init__(self, activation: str | None, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.activation = check_activation(activation)

    def forward(self, g, xs, shapes):
        return activate(g, xs[0], self.activation)


class Reshape(Layer):
    """A sample as ``target_shape`` (the same number of values, in C order as numpy's ``reshape``; one axis
    may be -1, inferred from the others).

    Example:
        >>> model = g.ggml_layer_reshape(model, (28, 28, 1))
    """
    kind = "reshape"
    builder_functions = "layer"  # ggml_layer_reshape only: ggml_reshape is the op

    def __init__(self, target_shape: Any, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        shape = (target_shape,) if is_int(target_shape) else target_shape
        if not isinstance(shape, (tuple, list)) or not 1 <= len(shape) <= 3 or \
                not all(is_int(d) and (d >= 1 or d == -1) for d in shape) or list(shape).count(-1) > 1:
            raise GgmlValueError(f"target_shape must be a tuple of 1 to 3 ints >= 1 (one of them may be -1), "
                                 f"got {target_shape!r}")
        self.target_shape = tuple(int(d) for d in shape)

    def output_shape(self, shapes):
        n = math.prod(shapes[0])
        known = math.prod(d for d in self.target_shape if d != -1)
        if -1 in self.target_shape:
            if n % known:
                raise GgmlValueError(f"reshape '{self.name}': a sample of shape {shapes[0]} ({n} values) cannot be "
                                     f"reshaped to {self.target_shape}: {n} is not a multiple of {known}")
            return tuple(n // known if d == -1 else d for d in self.target_shape)
        if known != n:
            raise GgmlValueError(f"reshape '{self.name}': a sample of shape {shapes[0]} has {n} values, "
                                 f"target_shape {self.target_shape} has {known}")
        return self.target_shape

    def forward(self, g, xs, shapes):
        x = xs[0] if ggml_is_contiguous(xs[0]) else ggml_cont(g.ctx, xs[0])
        return ggml_reshape(g.ctx, x, g.shape_target(natural_ne(self.output_shape(shapes), g.batch)))


class RepeatVector(Layer):
    """A vector sample (features,) repeated ``n`` times along a new steps axis: (n, features), e.g. to feed an
    encoder's state to every step of a decoder.

    Example:
        >>> model = g.ggml_layer_repeat_vector(model, 10)
    """
    kind = "repeat_vector"

    def __init__(self, n: int, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.n = positive_int_arg(None, "n", n)

    def output_shape(self, shapes):
        if len(shapes[0]) != 1:
            raise GgmlValueError(f"repeat_vector '{self.name}' takes vector samples (features,), got shape "
                                 f"{shapes[0]}")
        return (self.n, shapes[0][0])

    def forward(self, g, xs, shapes):
        features = shapes[0][0]
        column = ggml_reshape_3d(g.ctx, xs[0], features, 1, g.batch)
        return ggml_repeat(g.ctx, column, g.shape_target((features, self.n, g.batch)))
