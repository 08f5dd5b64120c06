"""ggmlR's model-building functions.

Each layer comes twice: ``ggml_layer_<name>(model_or_node, ...)`` appends to a sequential model (and
returns it, R's pipe style) or applies to a node (and returns the new node), and ``ggml_<name>(...)``
makes a layer object that ``ggml_apply`` can apply to several nodes, sharing its weights.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from ..backend.transfer import as_numeric, checked_values
from ..core.args import is_int
from ..errors import GgmlInUseError, GgmlTypeError, GgmlValueError
from ..graph.objects import Context
from ..ops import conv as _conv
from ..ops import elementwise as _elementwise
from .engine.compile import compiled
from .layers import basic as Lyr
from .layers import convolutional as conv
from .layers import custom, pooling, sequence, shaping
from .layers import multi_head as attention
from .layers import normalization as norm
from .layers.conv_transpose import Conv2DTranspose
from .layers.layer import Layer, ParamSpec
from .layers.masking import Masking
from .layers.normalization import Normalization
from .layers.wrappers import Bidirectional, TimeDistributed
from .network.model import apply_layer, default_name, InputLayer, Model, Node, Sequential


def ggml_model_sequential(name: str | None = None) -> Sequential:
    """An empty sequential model: add layers with ``ggml_layer_*(model, ...)``; the first needs
    ``input_shape``.

    Example:
        >>> model = g.ggml_model_sequential()
        >>> model = g.ggml_layer_dense(model, 32, activation="relu", input_shape=(8,))
        >>> model = g.ggml_layer_dense(model, 3, activation="softmax")
    """
    return Sequential(name=name)


def ggml_input(shape: Any, name: str | None = None, dtype: str = "float32") -> Node:
    """An input node of a functional model: one sample's ``shape`` (no batch axis), ``dtype`` "float32"
    or "int32" (token ids for an embedding).

    Example:
        >>> x = g.ggml_input(shape=(28, 28, 1))
    """
    layer = InputLayer(shape, dtype, name=name)
    default_name(layer)
    return Node(layer, [], layer.shape, dtype)


def ggml_model(inputs: Any, outputs: Any, name: str | None = None) -> Model:
    """A functional model from its input node(s) to its output node(s) (lists for several).

    Example:
        >>> x = g.ggml_input(shape=(64,))
        >>> out = g.ggml_layer_dense(g.ggml_layer_dense(x, 32, activation="relu"), 3, activation="softmax")
        >>> model = g.ggml_model(inputs=x, outputs=out)
    """
    return Model(inputs, outputs, name)


def ggml_apply(node: Any, layer: Layer) -> Node:
    """Apply a layer object (``ggml_dense(...)`` etc.) to a node, or a list of nodes for add/concatenate.
    Applying one object twice shares its weights.

    Example:
        >>> enc = g.ggml_dense(16, activation="relu")
        >>> a, b = g.ggml_apply(x1, enc), g.ggml_apply(x2, enc)
    """
    if not isinstance(layer, Layer) or isinstance(layer, InputLayer):
        raise GgmlTypeError(f"ggml_apply: expected a layer object (ggml_dense(...), ...), got {type(layer).__name__}")
    if isinstance(node, Model):
        raise GgmlTypeError("ggml_apply applies a layer to a node; to add a layer to a sequential model use "
                            "ggml_layer_<name>(model, ...)")
    default_name(layer)
    return apply_layer(layer, node)


def _add_or_apply(target: Any, layer: Layer, fn: str) -> Any:
    if isinstance(target, Sequential):
        if getattr(layer, "return_state", False):
            raise GgmlTypeError(f"{fn}: return_state=True gives several outputs ([output, state_h, ...]): use it in a "
                                "functional model (ggml_input, then layers on nodes, then ggml_model)")
        return target.add(layer)
    if isinstance(target, Model):
        raise GgmlTypeError(f"{fn}: layers are added to sequential models; a functional model is built from nodes "
                            "(ggml_input, then ggml_layer_* on nodes, then ggml_model)")
    if isinstance(target, (Node, list, tuple)):
        default_name(layer)
        node = apply_layer(layer, target)
        if isinstance(layer, sequence.Recurrent) and layer.return_state:  # Keras' [output, state_h(, state_c)]
            return sequence.state_outputs(layer, node, apply_layer)
        return node
    raise GgmlTypeError(f"{fn}: expected a sequential model or a node, got {type(target).__name__}")


def _layer_parameters(cls: type[Layer]) -> list[inspect.Parameter]:
    """A layer class's arguments, with the ``**kw`` it passes on spelt out as the base class's."""
    # the class's own constructor (the metaclass' __call__ takes any arguments)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        return params
    params = [p for p in params if p.kind is not p.VAR_KEYWORD]
    names = {p.name for p in params}
    base = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in list(inspect.signature(Layer.__init__).parameters.values())[1:]
            if p.name not in names and p.kind is not p.VAR_KEYWORD]
    regs = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in cls.REGULARIZED]
    return params + base + regs


def _pair(cls: type[Layer], stem: str, doc: str) -> tuple[Callable, Callable]:
    def layer_fn(model_or_node: Any, *args: Any, **kwargs: Any) -> Any:
        return _add_or_apply(model_or_node, cls(*args, **kwargs), f"ggml_layer_{stem}")

    def object_fn(*args: Any, **kwargs: Any) -> Layer:
        return default_name(cls(*args, **kwargs))

    layer_fn.__name__ = layer_fn.__qualname__ = f"ggml_layer_{stem}"
    object_fn.__name__ = object_fn.__qualname__ = f"ggml_{stem}"
    # the layer's own arguments, for help() and for the guard's message on a misspelt one ("activaton=")
    own = _layer_parameters(cls)
    target = inspect.Parameter("model_or_node", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    # inspect.signature (help(), the guard's messages) reads a function's __signature__
    layer_fn.__signature__ = inspect.Signature([target] + own)  # type: ignore[attr-defined]  # set, as inspect reads it
    object_fn.__signature__ = inspect.Signature(own)  # type: ignore[attr-defined]  # set, as inspect reads it
    description, _, example = doc.partition("\n\nExample:")
    layer_fn.__doc__ = (f"{description}\n\n``ggml_layer_{stem}(model_or_node, ...)``: on a sequential model, "
                        f"appends the layer and returns the model; on a node (functional API), returns the new "
                        f"node.\n\nArguments:\n    model_or_node: {ARG_DOCS['model_or_node']}\n{_arguments(cls)}\n"
                        f"Value: the model (sequential) or the new node (functional).\n\nExample:{example}")
    object_fn.__doc__ = (f"{description}\n\nA layer object to apply with ``ggml_apply(node, layer)``; applied "
                         f"to several nodes it shares its weights.\n\nArguments:\n{_arguments(cls)}\n"
                         f"Value: the layer object.\n\nExample:\n    >>> layer = g.ggml_{stem}(...)\n"
                         f"    >>> node = g.ggml_apply(node, layer)")
    return layer_fn, object_fn


ARG_DOCS = {
    "model_or_node": "a sequential model (the layer is appended) or a node (from ggml_input or another layer).",
    "units": "the number of outputs (an int >= 1).",
    "activation": "relu, sigmoid, tanh, gelu (tanh form), silu (Keras' swish), softmax, or None / 'linear' for "
                  "none.",
    "use_bias": "add a learned bias (one per output).",
    "filters": "the number of output channels.",
    "kernel_size": "the kernel's size: (rows, cols) for 2-D, an int for 1-D (an int n means (n, n) in 2-D).",
    "strides": "the step between windows, like kernel_size.",
    "kernel_initializer": "how the kernel starts, by Keras' name: glorot_uniform, glorot_normal, he_uniform, "
                          "he_normal, lecun_uniform, lecun_normal, random_normal, random_uniform, uniform (+-0.05), "
                          "orthogonal, zeros or ones.",
    "recurrent_initializer": "how the recurrent kernel starts, one of kernel_initializer's names (Keras' default "
                             "orthogonal).",
    "bias_initializer": "how the bias starts, one of kernel_initializer's names.",
    "input_dim": "Keras 2's input_dim=n for a first layer: the same as input_shape=(n,).",
    "dilation_rate": "the spacing between a kernel's taps, like kernel_size (1: none; above 1 needs strides of 1).",
    "padding": "'valid' (no padding: the output shrinks) or 'same' (as Keras: ceil(size / stride) positions).",
    "pool_size": "the window: (rows, cols) or an int for a square one in 2-D; a number of steps in 1-D.",
    "size": "how many times each pixel is repeated, (rows, cols) or an int for both.",
    "target_shape": "the new shape of a sample, a tuple of 1 to 3 ints, one of which may be -1 (inferred).",
    "n": "how many times the vector is repeated (the new steps axis).",
    "rate": "the fraction of values dropped in training, in [0, 1).",
    "vocab_size": "the number of token ids: ids must be in [0, vocab_size).",
    "dim": "the length of each token's vector.",
    "eps": "added to the variance before the square root (> 0).",
    "momentum": "the running statistics keep this share of their value at each training step, in [0, 1] "
                "(Keras' 0.99 default settles after a few hundred steps; 0.9 after a few dozen).",
    "return_sequences": "True: the output at every step (steps, units); False: the last step's (units,).",
    "recurrent_dropout": "the fraction of the recurrent state dropped in training, in [0, 1) (one mask per gate, "
                         "the same at every step, as Keras).",
    "return_state": "True (functional models): the layer gives [output, state_h, state_c] (an LSTM) or "
                    "[output, state_h] (a GRU), Keras' return_state; a list [sequence, *states] as input starts from "
                    "those states (Keras' initial_state).",
    "go_backwards": "True: the steps are read last to first (a sequence output lists them in that order).",
    "num_heads": "the number of attention heads.",
    "key_dim": "the size of each head's query, key and value vectors.",
    "causal": "True: each step attends only to itself and earlier steps (language models).",
    "sequence_length": "the longest sequence the table covers (steps <= sequence_length).",
    "axis": "the axis of a sample to join along (default -1, the last: features or channels).",
    "kernel_regularizer": "a penalty on the kernel added to the loss: 'l1', 'l2' (factor 0.01, Keras') or "
                          "ggml_regularizer_l1/_l2/_l1_l2(...); None for none.",
    "bias_regularizer": "a penalty on the bias, as kernel_regularizer.",
    "recurrent_regularizer": "a penalty on the recurrent kernel, as kernel_regularizer.",
    "embeddings_regularizer": "a penalty on the embedding table, as kernel_regularizer.",
    "mean": "the features' means (one per feature, or one for all); None: set by ggml_layer_adapt.",
    "variance": "the features' variances, as mean (>= 0).",
    "name": "the layer's name (default: '<type>_<k>'); weights are saved as '<name>.<weight>'.",
    "trainable": "False freezes the layer's weights (see ggml_freeze_weights).",
    "input_shape": "the first layer of a sequential model: one sample's shape, no batch axis.",
}


def _arguments(cls: type[Layer]) -> str:
    """The ``Arguments:`` entries of a layer's constructor (and the arguments every layer takes)."""
    import inspect
    lines = []
    common = ("name", "trainable", "input_shape")  # every layer's, listed once below (a layer without an
    # __init__ of its own has Layer's signature, which holds them)
    params = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name not in ("self", "kw") + common]
    params = [p for p in params if p.kind is not p.VAR_KEYWORD]
    regs = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in cls.REGULARIZED]
    for p in params + regs + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
                              for n, d in (("name", None), ("trainable", True), ("input_shape", None))]:
        default = "" if p.default is inspect.Parameter.empty else f" (default {p.default!r})"
        meaning = (getattr(cls, "ARG_DOCS", {}).get(p.name) or ARG_DOCS.get(p.name, "")).rstrip(".")
        lines.append(f"    {p.name}: {meaning}{default}.")
    return "\n".join(lines)


ggml_layer_dense, ggml_dense = _pair(
    Lyr.Dense, "dense", "Fully connected layer: ``activation(x W + b)`` over the last axis of a sample, "
    "``units`` outputs. Activations: relu, sigmoid, tanh, gelu, silu (swish), softmax, None/'linear'.\n\n"
    "Example:\n    >>> model = g.ggml_layer_dense(model, 64, activation='relu', input_shape=(20,))")
ggml_layer_conv_2d, _conv_2d_object = _pair(
    conv.Conv2D, "conv_2d", "2-D convolution of channels-last images (H, W, C): ``filters`` output channels, "
    "``kernel_size=(rows, cols)``, ``strides``, ``padding`` 'valid' or 'same' (as Keras), a bias, then "
    "``activation``.\n\nExample:\n    >>> model = g.ggml_layer_conv_2d(model, 16, (3, 3), activation='relu', "
    "input_shape=(28, 28, 1))")
ggml_layer_conv_2d_transpose, ggml_conv_2d_transpose = _pair(
    Conv2DTranspose, "conv_2d_transpose", "Transposed 2-D convolution (Keras' ``Conv2DTranspose``) of "
    "channels-last images (H, W, C): each pixel adds ``pixel x kernel`` into the output at ``strides`` steps, so "
    "the image grows by the stride ('same': H * stride rows; 'valid': (H - 1) * stride + kernel, at least "
    "H * stride); ``filters`` output channels, a bias, then ``activation``. The kernel is (rows, cols, filters, "
    "in channels), Keras' orientation.\n\nExample:\n    >>> x = g.ggml_layer_conv_2d_transpose(x, 16, (3, 3), "
    "strides=2, padding='same', activation='relu')")
ggml_layer_conv_1d, _conv_1d_object = _pair(
    conv.Conv1D, "conv_1d", "1-D convolution of sequences (steps, channels): ``filters`` output channels, "
    "``kernel_size``, ``strides``, ``padding`` 'valid' or 'same', a bias, then ``activation``.\n\nExample:\n"
    "    >>> model = g.ggml_layer_conv_1d(model, 8, 3, activation='relu', input_shape=(100, 2))")
ggml_layer_max_pooling_2d, ggml_max_pooling_2d = _pair(
    conv.MaxPooling2D, "max_pooling_2d", "2-D max pooling over ``pool_size=(rows, cols)`` windows with "
    "``strides`` (default: the pool size), no padding.\n\nExample:\n    >>> model = "
    "g.ggml_layer_max_pooling_2d(model, (2, 2))")
ggml_layer_global_average_pooling_2d, ggml_global_average_pooling_2d = _pair(
    conv.GlobalAveragePooling2D, "global_average_pooling_2d", "The mean of each channel over the image: "
    "(H, W, C) becomes (C,).\n\nExample:\n    >>> model = g.ggml_layer_global_average_pooling_2d(model)")
ggml_layer_global_max_pooling_2d, ggml_global_max_pooling_2d = _pair(
    conv.GlobalMaxPooling2D, "global_max_pooling_2d", "The maximum of each channel over the image: (H, W, C) "
    "becomes (C,).\n\nExample:\n    >>> model = g.ggml_layer_global_max_pooling_2d(model)")
ggml_layer_average_pooling_2d, ggml_average_pooling_2d = _pair(
    pooling.AveragePooling2D, "average_pooling_2d", "2-D average pooling: the mean over ``pool_size=(rows, cols)`` "
    "windows with ``strides`` (default: the pool size), no padding (Keras' ``padding='valid'``).\n\nExample:\n"
    "    >>> model = g.ggml_layer_average_pooling_2d(model, (2, 2))")
ggml_layer_max_pooling_1d, ggml_max_pooling_1d = _pair(
    pooling.MaxPooling1D, "max_pooling_1d", "1-D max pooling of sequences (steps, channels) over windows of "
    "``pool_size`` steps with ``strides`` (default: the pool size), no padding.\n\nExample:\n"
    "    >>> model = g.ggml_layer_max_pooling_1d(model, 2)")
ggml_layer_average_pooling_1d, ggml_average_pooling_1d = _pair(
    pooling.AveragePooling1D, "average_pooling_1d", "1-D average pooling of sequences (steps, channels): the mean "
    "over windows of ``pool_size`` steps with ``strides`` (default: the pool size), no padding.\n\nExample:\n"
    "    >>> model = g.ggml_layer_average_pooling_1d(model, 4)")
ggml_layer_global_average_pooling_1d, ggml_global_average_pooling_1d = _pair(
    pooling.GlobalAveragePooling1D, "global_average_pooling_1d", "The mean of each channel over the steps of a "
    "sequence: (steps, C) becomes (C,).\n\nExample:\n    >>> model = g.ggml_layer_global_average_pooling_1d(model)")
ggml_layer_global_max_pooling_1d, ggml_global_max_pooling_1d = _pair(
    pooling.GlobalMaxPooling1D, "global_max_pooling_1d", "The maximum of each channel over the steps of a sequence: "
    "(steps, C) becomes (C,).\n\nExample:\n    >>> model = g.ggml_layer_global_max_pooling_1d(model)")
ggml_layer_upsampling_2d, ggml_upsampling_2d = _pair(
    pooling.UpSampling2D, "upsampling_2d", "Nearest-neighbour up-sampling of images: every pixel repeated "
    "``size=(rows, cols)`` times, (H, W, C) becomes (H * rows, W * cols, C).\n\nExample:\n"
    "    >>> model = g.ggml_layer_upsampling_2d(model, (2, 2))")
ggml_layer_activation, ggml_activation = _pair(
    shaping.Activation, "activation", "An activation as a layer of its own (Keras' ``Activation``): relu, sigmoid, "
    "tanh, gelu, silu/swish, softmax (over the last axis) or linear.\n\nExample:\n"
    "    >>> model = g.ggml_layer_activation(model, 'relu')")
ggml_layer_reshape, _reshape_object = _pair(  # the object form would shadow the op ggml_reshape
    shaping.Reshape, "reshape", "A sample as ``target_shape`` (the same number of values, in C order as numpy's "
    "``reshape``; one axis may be -1).\n\nExample:\n    >>> model = g.ggml_layer_reshape(model, (28, 28, 1))")
ggml_layer_repeat_vector, ggml_repeat_vector = _pair(
    shaping.RepeatVector, "repeat_vector", "A vector sample (features,) repeated ``n`` times along a new steps axis: "
    "(n, features), e.g. to feed an encoder's state to every step of a decoder.\n\nExample:\n"
    "    >>> model = g.ggml_layer_repeat_vector(model, 10)")
ggml_layer_flatten, ggml_flatten = _pair(
    Lyr.Flatten, "flatten", "All axes of a sample into one, channels fastest (as Keras).\n\nExample:\n"
    "    >>> model = g.ggml_layer_flatten(model)")
ggml_layer_batch_norm, ggml_batch_norm = _pair(
    norm.BatchNorm, "batch_norm", "Batch normalisation over the last axis (features or channels): batch "
    "statistics in training, running statistics (``momentum``, as Keras) in predict/evaluate, learned "
    "``gamma``/``beta``.\n\nExample:\n    >>> model = g.ggml_layer_batch_norm(model)")
ggml_layer_dropout, _dropout_object = _pair(
    Lyr.Dropout, "dropout", "Inverted dropout: zeroes a fraction ``rate`` of values with a new mask every "
    "training step and scales the rest by 1/(1-rate); inactive in predict/evaluate.\n\nExample:\n"
    "    >>> model = g.ggml_layer_dropout(model, 0.3)")
ggml_layer_embedding, ggml_embedding = _pair(
    Lyr.Embedding, "embedding", "Token embedding: int32 ids in [0, vocab_size) of a sample (steps,) become "
    "(steps, dim) rows of a trained table.\n\nExample:\n    >>> model = g.ggml_layer_embedding(model, 1000, 16, "
    "input_shape=(20,))")

ggml_layer_position_embedding, ggml_position_embedding = _pair(
    Lyr.PositionEmbedding, "position_embedding", "Adds a learned vector per position to a sequence (steps, dim), "
    "so attention layers know the order of the steps.\n\nExample:\n    >>> x = g.ggml_layer_embedding(tokens, 96, "
    "64)\n    >>> x = g.ggml_layer_position_embedding(x, 128)")
ggml_layer_lstm, ggml_lstm = _pair(
    sequence.LSTM, "lstm", "Long short-term memory over sequences (steps, features), as Keras' LSTM (tanh, "
    "sigmoid gates, forget-gate bias 1, zero initial state): the last step's hidden state (units,), or every "
    "step's (steps, units) with ``return_sequences=True``. Unrolled over the steps; ggml differentiates it.\n\n"
    "Example:\n    >>> model = g.ggml_layer_lstm(model, 32, input_shape=(100, 3))")
ggml_layer_gru, ggml_gru = _pair(
    sequence.GRU, "gru", "Gated recurrent unit over sequences (steps, features), as Keras' GRU (reset_after=True, "
    "zero initial state): the last step's hidden state (units,), or every step's (steps, units) with "
    "``return_sequences=True``.\n\nExample:\n    >>> model = g.ggml_layer_gru(model, 32, return_sequences=True, "
    "input_shape=(50, 8))")
ggml_layer_masking, ggml_masking = _pair(
    Masking, "masking", "Keras' Masking: steps of a sequence whose features all equal ``mask_value`` are padding, "
    "which the layers after it skip (an LSTM/GRU keeps its state over them, global average pooling leaves them "
    "out); a layer that cannot honour the mask is refused.\n\nExample:\n    >>> model = "
    "g.ggml_layer_masking(model, mask_value=0.0, input_shape=(20, 3))")
ggml_layer_time_distributed, ggml_time_distributed = _pair(
    TimeDistributed, "time_distributed", "Keras' TimeDistributed: one layer (one set of weights) applied to every "
    "step of a sequence, ``(steps, ...)`` to ``(steps, *the layer's output)``.\n\nExample:\n"
    "    >>> model = g.ggml_layer_time_distributed(model, g.ggml_dense(8, activation='relu'))")
ggml_layer_bidirectional, ggml_bidirectional = _pair(
    Bidirectional, "bidirectional", "Keras' Bidirectional: an LSTM or GRU run forwards and, with weights of its "
    "own, backwards over the sequence; the two outputs concatenated (or summed, multiplied, averaged).\n\n"
    "Example:\n    >>> model = g.ggml_layer_bidirectional(model, g.ggml_lstm(16, return_sequences=True))")
ggml_layer_normalization, ggml_normalization = _pair(
    Normalization, "normalization", "Keras' Normalization: each feature standardised, ``(x - mean) / "
    "max(sqrt(variance), 1e-7)``, with the mean and variance of data set by ``ggml_layer_adapt(layer, data)`` "
    "(or given as ``mean=``/``variance=``); they are saved with the model and not trained.\n\nExample:\n"
    "    >>> norm = g.ggml_normalization()\n    >>> g.ggml_layer_adapt(norm, x_train)\n"
    "    >>> h = g.ggml_apply(g.ggml_input(shape=(4,)), norm)")
ggml_layer_layer_norm, ggml_layer_norm = _pair(
    norm.LayerNorm, "layer_norm", "Layer normalisation: each position normalised over its last axis (mean 0, "
    "variance 1), then scaled by a learned ``gamma`` and shifted by ``beta``; the same in training and "
    "inference.\n\nExample:\n    >>> x = g.ggml_layer_layer_norm(x)")
ggml_layer_multi_head_attention, ggml_multi_head_attention = _pair(
    attention.MultiHeadAttention, "multi_head_attention", "Keras' MultiHeadAttention: ``num_heads`` heads of "
    "``key_dim`` values each, scaled dot-product softmax, an output projection back to the query's dim. On one "
    "node: self-attention over a sequence (steps, dim). On a list: cross-attention, ``[query, value]`` (key = "
    "value) or ``[query, value, key]`` (the value and key sequences of their own length and dim), with "
    "``attention_mask=True`` a last node (query steps, value steps) of 1 (attend) and 0 (hide); ``causal=True`` "
    "hides later steps.\n\nExample:\n    >>> x = g.ggml_layer_multi_head_attention(x, num_heads=4, key_dim=16, "
    "causal=True)\n    >>> y = g.ggml_layer_multi_head_attention([decoder, encoder, pad_mask], num_heads=2, "
    "key_dim=8, attention_mask=True)")


def _op_or_layer(op: Callable, layer_object: Callable, layer_args: str) -> Callable:
    """``ggml_conv_2d``/``ggml_conv_1d``/``ggml_dropout`` are ggml ops (context first) and, without a context,
    layer objects."""

    def fn(*args: Any, **kwargs: Any) -> Any:
        if (args and isinstance(args[0], Context)) or "ctx" in kwargs:
            return op(*args, **kwargs)
        return layer_object(*args, **kwargs)
    fn.__name__ = fn.__qualname__ = op.__name__
    fn.__doc__ = (f"``{op.__name__}(ctx, a, ...)``, the ggml op: {op.__doc__}\n\n``{op.__name__}({layer_args}, ...)`` "
                  f"(no context): a layer object for ``ggml_apply``.\n\n{layer_object.__doc__}")
    return fn


ggml_conv_2d = _op_or_layer(_conv.ggml_conv_2d, _conv_2d_object, "filters, kernel_size")
ggml_conv_1d = _op_or_layer(_conv.ggml_conv_1d, _conv_1d_object, "filters, kernel_size")
ggml_dropout = _op_or_layer(_elementwise.ggml_dropout, _dropout_object, "rate")


def ggml_layer_add(nodes: Any, name: str | None = None, trainable: bool = True) -> Node:
    """The element-wise sum of two or more nodes of one shape (functional API).

    Example:
        >>> out = g.ggml_layer_add([h, g.ggml_layer_dense(x, 32)])
    """
    return ggml_apply(Lyr.layer_sequence(nodes, "ggml_layer_add"), Lyr.Add(name=name, trainable=trainable))


def ggml_add_layer(name: str | None = None, trainable: bool = True) -> Layer:
    """An add layer object for ``ggml_apply(nodes, layer)``."""
    return default_name(Lyr.Add(name=name, trainable=trainable))


def ggml_layer_concatenate(nodes: Any, axis: int = -1, name: str | None = None, trainable: bool = True) -> Node:
    """Two or more nodes joined along ``axis`` of a sample (default -1: the features / channels); the other
    axes must match (functional API). Trains through ggml's concat (backward pass from patches/0006).

    Example:
        >>> both = g.ggml_layer_concatenate([a, b])
    """
    return ggml_apply(Lyr.layer_sequence(nodes, "ggml_layer_concatenate"),
                      Lyr.Concatenate(axis, name=name, trainable=trainable))


def ggml_concatenate(axis: int = -1, name: str | None = None, trainable: bool = True) -> Layer:
    """A concatenate layer object for ``ggml_apply(nodes, layer)``."""
    return default_name(Lyr.Concatenate(axis, name=name, trainable=trainable))


# ---------------------------------------------------------------- model helpers

def _model(model: Any, fn: str) -> Model:
    if not isinstance(model, Model):
        raise GgmlTypeError(f"{fn}: expected a model, got {type(model).__name__}")
    return model


def ggml_get_layer(model: Model, index: int | None = None, name: str | None = None) -> Layer:
    """A layer of the model by 0-based ``index`` (negative counts from the end) or by ``name``.

    Example:
        >>> g.ggml_get_layer(model, name="dense_1")
    """
    layers = _model(model, "ggml_get_layer").layers
    if (index is None) == (name is None):
        raise GgmlValueError("ggml_get_layer: give index or name (one of them)")
    if name is not None:
        for layer in layers:
            if layer.name == name:
                return layer
        raise GgmlValueError(f"ggml_get_layer: no layer named {name!r}; the layers are "
                             f"{[each.name for each in layers]}")
    if not is_int(index) or not -len(layers) <= index < len(layers):
        raise GgmlValueError(f"ggml_get_layer: index must be an int in [{-len(layers)}, {len(layers)}), got {index!r}")
    return layers[int(index)]


def ggml_pop_layer(model: Sequential) -> Sequential:
    """Remove the last layer of a sequential model (compile again before training). Returns the model.

    The layer takes its weights along, as a Keras layer does: added back later (after a compile too) or
    to another model, it starts from the values it had here, not from fresh ones.

    Example:
        >>> head = g.ggml_get_layer(model, -1)
        >>> g.ggml_pop_layer(model)              # e.g. to compile the body alone
        >>> model.add(head); g.ggml_compile(model, backend="cpu")   # the trained head again
    """
    if not isinstance(model, Sequential):
        raise GgmlTypeError("ggml_pop_layer: expected a sequential model")
    model.pop()
    return model


def _freeze(model: Model, from_: Any, to: Any, trainable: bool, fn: str) -> Model:
    layers = _model(model, fn).layers
    for name, v in (("from_", from_), ("to", to)):
        if v is not None and (not is_int(v)):
            raise GgmlValueError(f"{fn}: {name} must be an int (a 0-based layer index) or None, got {v!r}")
    runtime = getattr(model, "runtime", None)
    if runtime is not None and runtime.training:
        raise GgmlInUseError(f"{fn}: a fit of this model is running (this call comes from one of its callbacks or "
                             "generators, or from another thread) and trains the layers that were trainable when it "
                             "started; freeze or unfreeze layers before the fit or after it returns")
    for layer in layers[slice(from_, to)]:
        layer.trainable = trainable
    return model


def ggml_freeze_weights(model: Model, from_: int = 0, to: int | None = None) -> Model:
    """Stop training the layers ``layers[from_:to]`` (a Python slice: ``to`` exclusive, None = the end).
    Frozen weights keep their values; the next ``ggml_fit``/``ggml_trainer`` trains only the others (a
    trainer made before keeps the layers it was made with). A frozen batch norm runs in inference mode, as
    in Keras: it normalises with its running statistics and leaves them as they are. Refused
    (GgmlInUseError) while a fit of the model runs, e.g. from one of its callbacks: freeze between fits.

    Example:
        >>> g.ggml_freeze_weights(model, 0, 2)     # the first two layers
    """
    return _freeze(model, from_, to, False, "ggml_freeze_weights")


def ggml_unfreeze_weights(model: Model, from_: int = 0, to: int | None = None) -> Model:
    """Train the layers ``layers[from_:to]`` again (see ``ggml_freeze_weights``)."""
    return _freeze(model, from_, to, True, "ggml_unfreeze_weights")


def ggml_model_summary(model: Model) -> None:
    """Print the layers, their output shapes and parameter counts (``print(model)`` does the same)."""
    print(_model(model, "ggml_model_summary").summary())


def ggml_get_weights(model: Model) -> dict[str, np.ndarray]:
    """The weights of a compiled model, ``{"<layer>.<weight>": array}`` in the user's (Keras) orientation:
    dense ``weight`` is (inputs, units), conv_2d ``kernel`` (rows, cols, in channels, filters), conv_1d
    ``kernel`` (size, in channels, filters); batch norm includes its running statistics."""
    compiled(model, "ggml_get_weights")
    params = model.runtime.params
    return {f"{layer.name}.{p.name}": _to_user(params.read(layer, p.name), p) for layer, p in params.specs}


def ggml_set_weights(model: Model, weights: dict) -> Model:
    """Set weights of a compiled model from ``{"<layer>.<weight>": array}`` (as ``ggml_get_weights`` gives).

    Every array is checked before any weight is written: the shape, and the values as loading checks them
    (numbers only, no complex data, nothing beyond float32's range, which would become inf). Returns the
    model.

    Arguments:
        model: a compiled model.
        weights: a dict from weight names (``ggml_get_weights(model).keys()``) to arrays of their shapes.

    Value: the model.

    Example:
        >>> w = ggml_get_weights(model)
        >>> ggml_set_weights(model, {k: v * 0.5 for k, v in w.items()})
    """
    compiled(model, "ggml_set_weights")
    if not isinstance(weights, dict):
        raise GgmlTypeError("ggml_set_weights: weights must be a dict name -> array")
    params = model.runtime.params
    specs = {f"{each.name}.{p.name}": (each, p) for each, p in params.specs}
    staged = []
    for key, value in weights.items():
        if key not in specs:
            raise GgmlValueError(f"ggml_set_weights: the model has no weight {key!r}; it has {sorted(specs)}")
        layer, spec = specs[key]
        what = f"ggml_set_weights: {key!r}"
        given = as_numeric(value, what)  # no strings, dates, masked values
        want = _to_user(np.zeros(tuple(reversed(spec.ne)), np.float32), spec).shape
        if given.shape != want:
            raise GgmlValueError(f"{what} must have shape {want}, got {given.shape}")
        # the checks loading applies: complex data and values beyond float32 (which would become inf) are refused
        arr = checked_values(given, np.dtype(np.float32), what).reshape(want)
        staged.append((layer, spec, arr))
    for layer, spec, arr in staged:
        back = arr if spec.user_axes is None else np.transpose(arr, np.argsort(spec.user_axes))
        params.write(layer, spec.name, np.ascontiguousarray(back))
    return model


def _to_user(arr: np.ndarray, spec: ParamSpec) -> np.ndarray:
    arr = arr.reshape(tuple(reversed(spec.ne)))   # ggml drops trailing 1s: a one-head attention's (1, K, D)
    return arr if spec.user_axes is None else np.ascontiguousarray(np.transpose(arr, spec.user_axes))


def ggml_custom_layer(model_or_node: Any, forward: Callable[..., Any], weights: dict | None = None,
                      output_shape: Any = None, name: str | None = None, trainable: bool = True,
                      input_shape: Any = None) -> Any:
    """A layer written with ggmlpy ops, as subclassing ``keras.layers.Layer`` in Keras.

    ``forward(ctx, x, weights)`` builds the layer's output from ``x``, a batch of its input in ggml's order
    (a sample of shape ``(d1, ..., dk)`` is the tensor ``[dk, ..., d1, N]``, channels first as ggml reads
    them), with ggmlpy's ops on the context ``ctx``; ``weights`` maps each weight's name to its tensor. ggml's
    autodiff differentiates it (an op without a backward pass between a weight and the loss is an error at
    compile, not an abort). The weights are created for the layer, trained, frozen, read by
    ``ggml_get_weights`` and saved by ``ggml_save_weights`` as any layer's, under ``<layer>.<name>``.

    Arguments:
        model_or_node: a sequential model (the layer is appended) or a node (functional API).
        forward: the function ``forward(ctx, x, weights) -> tensor``.
        weights: ``{name: ne}``, each weight's shape in ggml's order (ne0 first, as ``ggml_new_tensor``), or
            ``{name: (ne, initializer)}`` with ``"glorot"`` (Glorot uniform, the default for 2-D and more),
            ``"zeros"`` (the default for 1-D: biases) or ``"ones"``.
        output_shape: one output sample's shape (a tuple), or a function of the input sample's shape, when the
            layer changes it (default: the input's).
        name, trainable, input_shape: as for every layer.

    Value: the model (sequential) or the new node (functional). A model with a custom layer cannot be saved
    whole (``ggml_save_model``) or pickled: its function is code, not data; save its weights instead.

    Example:
        >>> def scaled_dense(ctx, x, w):        # x: [features, N]; w["kernel"]: [features, 8]
        ...     return g.ggml_mul(ctx, g.ggml_mul_mat(ctx, w["kernel"], x), w["scale"])
        >>> m = g.ggml_custom_layer(m, scaled_dense, weights={"kernel": (4, 8), "scale": ((8, 1), "ones")},
        ...                         output_shape=(8,))
    """
    layer = custom.CustomLayer(forward, weights, output_shape, name=name, trainable=trainable, input_shape=input_shape)
    return _add_or_apply(model_or_node, layer, "ggml_custom_layer")
