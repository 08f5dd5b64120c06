"""The basic layers: dense, flatten, dropout, embeddings, add, concatenate."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TYPE_CHECKING

import numpy as np

from ...core.args import bool_arg, is_int, is_real, positive_int_arg
from ...errors import GgmlTypeError, GgmlValueError
from ...ops.elementwise import ggml_add, ggml_mul, ggml_scale, ggml_scale_bias, ggml_step, ggml_sub
from ...ops.layout import (
    ggml_get_rows,
    ggml_reshape_1d,
    ggml_reshape_2d,
    ggml_reshape_3d,
    ggml_reshape_4d,
    ggml_view_2d,
)
from ...ops.reduce import ggml_concat
from .activations import check_activation
from .initializers import check_initializer
from .layer import activate, Layer, LayerOptions
from .weight import Weight


if TYPE_CHECKING:
    from typing_extensions import Unpack


class Dense(Layer):
    """Fully connected layer: ``activation(x W + b)`` over the last axis of a sample, ``units`` outputs.
    Activations: relu, sigmoid, tanh, gelu, silu (swish), softmax, None/'linear'.

    Example:
        >>> model = g.ggml_layer_dense(model, 64, activation='relu', input_shape=(20,))
    """
    kind = "dense"
    mask_support = "propagate"  # on sequences: each step on its own
    NOT_SAVED = ("input_dim",)
    weight = Weight(initializer_arg="kernel_initializer", regularizer="kernel_regularizer", user_axes=(1, 0),
                    quantizable="product")
    bias = Weight(initializer_arg="bias_initializer", regularizer="bias_regularizer", when="use_bias")

    def __init__(self, units: int, activation: str | None = None, use_bias: bool = True,
                 kernel_initializer: str = "glorot_uniform", bias_initializer: str = "zeros",
                 input_dim: int | None = None, **kw: Unpack[LayerOptions]) -> None:
        if input_dim is not None:  # Keras 2's Dense(units, input_dim=n): input_shape=(n,)
            if kw.get("input_shape") is not None:
                raise GgmlValueError("give input_dim or input_shape, not both")
            kw["input_shape"] = (positive_int_arg(None, "input_dim", input_dim),)
        super().__init__(**kw)
        self.units = positive_int_arg(None, "units", units)
        self.activation = check_activation(activation)
        self.use_bias = bool_arg(None, "use_bias", use_bias)
        self.kernel_initializer = check_initializer(kernel_initializer, "kernel_initializer")
        self.bias_initializer = check_initializer(bias_initializer, "bias_initializer")

    def output_shape(self, shapes):
        return shapes[0][:-1] + (self.units,)

    def make_params(self, shapes):
        fan_in = shapes[0][-1]
        return [self.weight.spec((fan_in, self.units), (fan_in, self.units)),
                self.bias.spec((self.units,), (self.units, self.units))]

    def forward(self, g, xs, shapes):
        x = xs[0]
        if len(shapes[0]) > 1:  # (..., features): one matrix product over all leading axes (ggml's
            # mul_mat backward cannot broadcast the weight over a 4th axis)
            x = ggml_reshape_2d(g.ctx, x, shapes[0][-1], int(np.prod(shapes[0][:-1])) * g.batch)
        y = g.product(self, self.weight, x)
        if self.use_bias:
            y = ggml_add(g.ctx, y, g.param(self, self.bias))
        y = activate(g, y, self.activation)
        if len(shapes[0]) > 1:
            y = ggml_reshape_4d(g.ctx, y, self.units, *xs[0].shape[1:])
        return y


class Flatten(Layer):
    """All axes of a sample into one, channels fastest (as Keras).

    Example:
        >>> model = g.ggml_layer_flatten(model)
    """
    kind = "flatten"

    def output_shape(self, shapes):
        return (math.prod(shapes[0]),)

    def forward(self, g, xs, shapes):
        return ggml_reshape_2d(g.ctx, xs[0], math.prod(shapes[0]), g.batch)


class Dropout(Layer):
    """Inverted dropout: zeroes a fraction ``rate`` of values with a new mask every training step (made on the
    model's device) and scales the rest by 1/(1-rate); inactive in predict/evaluate.

    Example:
        >>> model = g.ggml_layer_dropout(model, 0.3)
    """
    kind = "dropout"
    mask_support = "propagate"

    def __init__(self, rate: float, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if not is_real(rate) or not 0 <= rate < 1:
            raise GgmlValueError(f"dropout rate must be a number in [0, 1), got {rate!r}")
        self.rate = float(rate)

    def forward(self, g, xs, shapes):
        if self.rate == 0:
            return xs[0]
        return g.dropout(xs[0], self.rate)

    def predict_forward(self, g, xs, shapes):
        return xs[0]

    def dropout_seeds(self) -> int:
        return 1 if self.rate > 0 else 0


def _one_of(ours: Any, keras: Any, our_name: str, keras_name: str) -> Any:
    """An argument given under ggmlR's name or Keras' (one of the two)."""
    if ours is not None and keras is not None:
        raise GgmlValueError(f"give {our_name} or {keras_name} (Keras' name for it), not both")
    if ours is None and keras is None:
        raise GgmlTypeError(f"missing a required argument: '{our_name}' (or Keras' '{keras_name}')")
    return ours if ours is not None else keras


class Embedding(Layer):
    """Token embedding: int32 ids in [0, vocab_size) of a sample (steps,) become (steps, dim) rows of a
    trained table.

    Example:
        >>> model = g.ggml_layer_embedding(model, 1000, 16, input_shape=(20,))
    """
    kind = "embedding"
    NOT_SAVED = ("input_dim", "output_dim")
    weight = Weight(initializer_arg="embeddings_initializer", regularizer="embeddings_regularizer",
                    quantizable="rows")
    takes_int = True
    ARG_DOCS = {"mask_zero": "True: id 0 is padding, and the layers after it skip those steps as after a masking "
                             "layer (Keras' mask_zero); id 0 still has its row.",
                "input_dim": "Keras' name of vocab_size (give one of the two).",
                "output_dim": "Keras' name of dim (give one of the two).",
                "embeddings_initializer": "how the table starts, by Keras' name ('uniform': uniform in +-0.05, as "
                                          "Keras)."}

    def __init__(self, vocab_size: int | None = None, dim: int | None = None, mask_zero: bool = False,
                 embeddings_initializer: str = "uniform", input_dim: int | None = None,
                 output_dim: int | None = None, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        vocab = _one_of(vocab_size, input_dim, "vocab_size", "input_dim")
        self.vocab_size = positive_int_arg(None, "vocab_size", vocab)
        self.dim = positive_int_arg(None, "dim", _one_of(dim, output_dim, "dim", "output_dim"))
        self.mask_zero = bool_arg(None, "mask_zero", mask_zero)
        self.embeddings_initializer = check_initializer(embeddings_initializer, "embeddings_initializer")

    @property
    def makes_mask(self) -> bool:  # type: ignore[override]  # a property over Layer's class attribute: per object
        return self.mask_zero

    def output_mask(self, g, in_mask, xs, out):
        """Keras' mask_zero: 1 for a real token, 0 for id 0, ``[1, T, N]``, read from a 0/1 table by the ids."""
        steps = xs[0].shape[0]
        table = g.constant(np.concatenate([[0.0], np.ones(self.vocab_size - 1)]).reshape(self.vocab_size, 1))
        mask = ggml_get_rows(g.ctx, table, ggml_reshape_1d(g.ctx, xs[0], steps * g.batch))
        return ggml_reshape_3d(g.ctx, mask, 1, steps, g.batch)

    def output_shape(self, shapes):
        if len(shapes[0]) != 1:
            raise GgmlValueError(f"embedding '{self.name}' takes samples of token ids of shape (steps,), got "
                                 f"{shapes[0]}")
        return shapes[0] + (self.dim,)

    def make_params(self, shapes):
        return [self.weight.spec((self.dim, self.vocab_size), (self.vocab_size, self.dim))]

    def forward(self, g, xs, shapes):
        steps = shapes[0][0]
        ids = ggml_reshape_1d(g.ctx, xs[0], steps * g.batch)
        rows = ggml_get_rows(g.ctx, g.param(self, self.weight), ids)
        return ggml_reshape_3d(g.ctx, rows, self.dim, steps, g.batch)


class PositionEmbedding(Layer):
    """Adds a learned vector per position to a sequence (steps, dim), so attention layers know the order of
    the steps: row ``t`` of a ``sequence_length x dim`` table is added at step ``t`` (``steps <=
    sequence_length``).

    Example:
        >>> x = g.ggml_layer_embedding(tokens, 96, 64)
        >>> x = g.ggml_layer_position_embedding(x, 128)
    """
    kind = "position_embedding"
    weight = Weight(initializer="embedding")

    def __init__(self, sequence_length: int, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.sequence_length = positive_int_arg(None, "sequence_length", sequence_length)

    def output_shape(self, shapes):
        if len(shapes[0]) != 2 or shapes[0][0] > self.sequence_length:
            raise GgmlValueError(f"position_embedding '{self.name}' takes sequences (steps, dim) of at most "
                                 f"{self.sequence_length} steps, got samples of shape {shapes[0]}")
        return shapes[0]

    def make_params(self, shapes):
        return [self.weight.spec((shapes[0][1], self.sequence_length))]

    def forward(self, g, xs, shapes):
        steps, dim = shapes[0]
        table = g.param(self, self.weight)
        if steps < self.sequence_length:
            table = ggml_view_2d(g.ctx, table, dim, steps, dim * 4, 0)
        return ggml_add(g.ctx, xs[0], table)    # [dim, steps] broadcast over the batch


class Add(Layer):
    """Element-wise sum of nodes of one shape."""
    kind = "add"
    builder_functions = False  # ggml_layer_add takes the nodes first (builders.py); ggml_add is the op
    many_inputs = True
    exactly_two = False        # Keras' Subtract takes two nodes, the others two or more

    def output_shape(self, shapes):
        count = "two" if self.exactly_two else "two or more"
        if len(shapes) < 2 or self.exactly_two and len(shapes) != 2 or any(s != shapes[0] for s in shapes):
            raise GgmlValueError(f"{self.kind} needs {count} nodes of one shape, got shapes {shapes}")
        return shapes[0]

    def forward(self, g, xs, shapes):
        y = xs[0]
        for x in xs[1:]:
            y = self.combine(g.ctx, y, x)
        return y

    def combine(self, ctx, a, b):
        return ggml_add(ctx, a, b)


class Subtract(Add):
    """The element-wise difference of two nodes of one shape: the first minus the second (Keras' ``Subtract``)."""
    kind = "subtract"
    builder_functions = False   # ggml_layer_subtract takes the nodes first (builders.py)
    exactly_two = True

    def combine(self, ctx, a, b):
        return ggml_sub(ctx, a, b)


class Multiply(Add):
    """The element-wise product of nodes of one shape (Keras' ``Multiply``)."""
    kind = "multiply"
    builder_functions = False   # ggml_layer_multiply takes the nodes first (builders.py)

    def combine(self, ctx, a, b):
        return ggml_mul(ctx, a, b)


class Average(Add):
    """The element-wise mean of nodes of one shape (Keras' ``Average``)."""
    kind = "average"
    builder_functions = False   # ggml_layer_average takes the nodes first (builders.py)

    def forward(self, g, xs, shapes):
        return ggml_scale(g.ctx, super().forward(g, xs, shapes), 1.0 / len(xs))


class Maximum(Add):
    """The element-wise maximum of nodes of one shape (Keras' ``Maximum``): each value is one of its inputs, chosen
    by the sign of their difference (exact, where an arithmetic formula loses the smaller value to rounding); the
    gradient goes to the one chosen (the second where they tie)."""
    kind = "maximum"
    builder_functions = False   # ggml_layer_maximum takes the nodes first (builders.py)
    first_when_positive = True

    def combine(self, ctx, a, b):
        diff = ggml_sub(ctx, a, b) if self.first_when_positive else ggml_sub(ctx, b, a)
        pick_a = ggml_step(ctx, diff)                               # 1 where a is the one, else 0: exact
        return ggml_add(ctx, ggml_mul(ctx, a, pick_a), ggml_mul(ctx, b, ggml_scale_bias(ctx, pick_a, -1.0, 1.0)))


class Minimum(Maximum):
    """The element-wise minimum of nodes of one shape (Keras' ``Minimum``), chosen as ``Maximum`` chooses."""
    kind = "minimum"
    builder_functions = False   # ggml_layer_minimum takes the nodes first (builders.py)
    first_when_positive = False


class Concatenate(Layer):
    """Nodes joined along ``axis`` of a sample (default -1, the feature/channel axis)."""
    kind = "concatenate"
    builder_functions = False  # ggml_layer_concatenate takes the nodes first (builders.py)
    many_inputs = True

    def __init__(self, axis: int = -1, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if not is_int(axis):
            raise GgmlValueError(f"axis must be an int, got {axis!r}")
        self.axis = int(axis)

    def _axis(self, rank: int) -> int:
        axis = self.axis + rank if self.axis < 0 else self.axis
        if not 0 <= axis < rank:
            raise GgmlValueError(f"concatenate axis {self.axis} is outside samples of rank {rank} (the batch axis "
                                 "cannot be joined)")
        return axis

    def output_shape(self, shapes):
        rank = len(shapes[0])
        if len(shapes) < 2 or any(len(s) != rank for s in shapes):
            raise GgmlValueError(f"concatenate needs two or more nodes of one rank, got shapes {shapes}")
        axis = self._axis(rank)
        for s in shapes[1:]:
            if any(a != b for i, (a, b) in enumerate(zip(s, shapes[0])) if i != axis):
                raise GgmlValueError(f"concatenate along axis {self.axis}: the other axes must match, got {shapes}")
        return shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]

    def forward(self, g, xs, shapes):
        dim = len(shapes[0]) - 1 - self._axis(len(shapes[0]))  # ggml counts axes from the fastest
        y = xs[0]
        for x in xs[1:]:
            y = ggml_concat(g.ctx, y, x, dim)
        return y


def layer_sequence(values: Sequence[Any], what: str, exactly_two: bool = False) -> list:
    if not isinstance(values, (list, tuple)) or len(values) < 2 or exactly_two and len(values) != 2:
        count = "two" if exactly_two else "two or more"
        raise GgmlValueError(f"{what} takes a list of {count} nodes, got {values!r:.80}")
    return list(values)
