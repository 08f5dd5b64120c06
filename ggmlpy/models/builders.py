"""ggmlR's model-building functions.

Each layer comes twice: ``ggml_layer_<name>(model_or_node, ...)`` appends to a sequential model (and
returns it, R's pipe style) or applies to a node (and returns the new node), and ``ggml_<name>(...)``
makes a layer object that ``ggml_apply`` can apply to several nodes, sharing its weights.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from .. import ops as _ops_package
from ..backend.transfer import as_numeric, checked_values
from ..core.args import is_int
from ..errors import GgmlInUseError, GgmlTypeError, GgmlValueError
from ..graph.objects import Context, Tensor
from . import layers as _layers_package
from .engine.compile import compiled
from .layers import basic as Lyr
from .layers import custom, sequence
from .layers.layer import import_built_ins, Layer, LAYER_TYPES
from .layers.weight import ParamSpec
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


def ggml_apply(node: Any, layer: Layer) -> Any:
    """Apply a layer object (``ggml_dense(...)``, an object of a ``Layer`` subclass of one's own) to a node,
    or a list of nodes for add/concatenate, and return the new node; or append it to a sequential model and
    return the model. Applying one object twice shares its weights.

    Arguments:
        node: a node (from ggml_input or another layer), a list of nodes, or a sequential model.
        layer: a layer object.

    Value: the new node, or the model (sequential).

    Example:
        >>> enc = g.ggml_dense(16, activation="relu")
        >>> a, b = g.ggml_apply(x1, enc), g.ggml_apply(x2, enc)
        >>> model = g.ggml_apply(g.ggml_model_sequential(), g.ggml_dense(4, input_shape=(3,)))
    """
    if not isinstance(layer, Layer) or isinstance(layer, InputLayer):
        raise GgmlTypeError(f"ggml_apply: expected a layer object (ggml_dense(...), ...), got {type(layer).__name__}")
    if isinstance(node, Model) and not isinstance(node, Sequential):
        raise GgmlTypeError("ggml_apply: a functional model is built from nodes (ggml_input, then layers on nodes, "
                            "then ggml_model); apply the layer to a node, or to a sequential model")
    return _add_or_apply(node, layer, "ggml_apply")


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


def _pair(cls: type[Layer]) -> tuple[Callable, Callable]:
    """The two functions of a built-in layer class: its kind names them, its docstring describes them (the
    text before ``Example:``, and the example), its constructor's signature gives their arguments."""
    stem, doc = cls.kind, inspect.cleandoc(cls.__doc__ or "")

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
    "epsilon": "Keras' name for eps: the same (give one of the two).",
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
    """The ``Arguments:`` entries of a layer's constructor (its signature as ``_layer_parameters`` spells it), the
    arguments every layer takes last."""
    common = ("name", "trainable", "input_shape")
    params = _layer_parameters(cls)
    lines = []
    for p in [p for p in params if p.name not in common] + [p for p in params if p.name in common]:
        default = "" if p.default is inspect.Parameter.empty else f" (default {p.default!r})"
        meaning = (getattr(cls, "ARG_DOCS", {}).get(p.name) or ARG_DOCS.get(p.name, "")).rstrip(".")
        lines.append(f"    {p.name}: {meaning}{default}.")
    return "\n".join(lines)


def _op_or_layer(op: Callable, layer_object: Callable, cls: type[Layer]) -> Callable:
    """A layer object's function whose name is a ggml op's (``ggml_conv_2d``, ``ggml_conv_1d``,
    ``ggml_dropout``): the op with a context first, the layer object without."""
    required = [p.name for p in _layer_parameters(cls) if p.default is p.empty and p.kind is not p.VAR_KEYWORD]
    layer_args = ", ".join(required)

    def fn(*args: Any, **kwargs: Any) -> Any:
        if (args and isinstance(args[0], Context)) or "ctx" in kwargs:
            return op(*args, **kwargs)
        return layer_object(*args, **kwargs)
    fn.__name__ = fn.__qualname__ = op.__name__
    fn.__doc__ = (f"``{op.__name__}(ctx, a, ...)``, the ggml op: {op.__doc__}\n\n``{op.__name__}({layer_args}, ...)`` "
                  f"(no context): a layer object for ``ggml_apply``.\n\n{layer_object.__doc__}")
    return fn


def _ops() -> dict[str, Callable]:
    """The ggml ops by name (a layer object's name that is an op's takes the op's call too)."""
    out: dict[str, Callable] = {}
    for module in pkgutil.iter_modules(_ops_package.__path__):
        for name, value in vars(importlib.import_module(f"{_ops_package.__name__}.{module.name}")).items():
            if name.startswith("ggml_") and inspect.isfunction(value):
                out.setdefault(name, value)
    return out


def _layer_functions() -> dict[str, Callable]:
    """``ggml_layer_<kind>`` and ``ggml_<kind>`` of every built-in layer class (``Layer.builder_functions``),
    made from the class: tools/exports.py exports them."""
    import_built_ins()
    ops, out = _ops(), dict[str, Callable]()
    for cls in LAYER_TYPES.values():
        if not cls.builder_functions or not cls.__module__.startswith(_layers_package.__name__ + "."):
            continue
        layer_fn, object_fn = _pair(cls)
        out[layer_fn.__name__] = layer_fn
        if cls.builder_functions == "layer":   # the object's name is an op's, which keeps it alone
            continue
        op = ops.get(object_fn.__name__)
        out[object_fn.__name__] = object_fn if op is None else _op_or_layer(op, object_fn, cls)
    return out


LAYER_FUNCTIONS = _layer_functions()


def _merge(cls: type[Layer], what: str, example: str) -> tuple[Callable[..., Node], Callable[..., Layer]]:
    """``ggml_layer_<kind>(nodes, ...)`` (functional API) and ``ggml_<kind>_layer(...)`` (a layer object) for an
    element-wise merge layer."""
    kind = cls.kind

    def layer_fn(nodes: Any, name: str | None = None, trainable: bool = True) -> Node:
        return ggml_apply(Lyr.layer_sequence(nodes, f"ggml_layer_{kind}", getattr(cls, "exactly_two", False)),
                          cls(name=name, trainable=trainable))

    def object_fn(name: str | None = None, trainable: bool = True) -> Layer:
        return default_name(cls(name=name, trainable=trainable))
    layer_fn.__name__ = layer_fn.__qualname__ = f"ggml_layer_{kind}"
    layer_fn.__doc__ = f"{what} (functional API).\n\nExample:\n    >>> {example}"
    object_fn.__name__ = object_fn.__qualname__ = f"ggml_{kind}_layer"
    object_fn.__doc__ = f"A {kind} layer object for ``ggml_apply(nodes, layer)``: {what[0].lower()}{what[1:]}."
    return layer_fn, object_fn


ggml_layer_add, ggml_add_layer = _merge(
    Lyr.Add, "The element-wise sum of two or more nodes of one shape",
    "out = g.ggml_layer_add([h, g.ggml_layer_dense(x, 32)])   # or h + g.ggml_layer_dense(x, 32)")
ggml_layer_subtract, ggml_subtract_layer = _merge(
    Lyr.Subtract, "The element-wise difference of two nodes of one shape, the first minus the second (Keras' "
    "Subtract)", "diff = g.ggml_layer_subtract([a, b])   # or a - b")
ggml_layer_multiply, ggml_multiply_layer = _merge(
    Lyr.Multiply, "The element-wise product of two or more nodes of one shape (Keras' Multiply: a gate)",
    "gated = g.ggml_layer_multiply([h, g.ggml_layer_dense(x, 32, activation='sigmoid')])   # or h * gate")
ggml_layer_average, ggml_average_layer = _merge(
    Lyr.Average, "The element-wise mean of two or more nodes of one shape (Keras' Average)",
    "ensemble = g.ggml_layer_average([a, b, c])")
ggml_layer_maximum, ggml_maximum_layer = _merge(
    Lyr.Maximum, "The element-wise maximum of two or more nodes of one shape (Keras' Maximum)",
    "m = g.ggml_layer_maximum([a, b])")
ggml_layer_minimum, ggml_minimum_layer = _merge(
    Lyr.Minimum, "The element-wise minimum of two or more nodes of one shape (Keras' Minimum)",
    "m = g.ggml_layer_minimum([a, b])")


def ggml_layer_concatenate(nodes: Any, axis: int = -1, name: str | None = None, trainable: bool = True) -> Node:
    """Two or more nodes joined along ``axis`` of a sample (default -1: the features / channels); the other
    axes must match (functional API). Trains through ggml's concat (backward pass from patches/0006). The axis
    counts a sample's axes (ggmlR's rule): Keras' ``axis=1`` (the steps of a sequence, counting the batch) is
    ``axis=0`` here; negative axes are the same in both.

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
    params = model.runtime.readable()   # a lost RPC device's weights from a local replica's copy
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
            layer changes it (default: the input's); after a variable size (None) a function, called with the
            data's sizes (``lambda s: (s[0], 8)``).
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


def ggml_custom(forward: Callable[..., Tensor], weights: dict | None = None,
                output_shape: Sequence[int] | Callable[[tuple], Sequence[int]] | None = None, name: str | None = None,
                trainable: bool = True, input_shape: Sequence[int | None] | None = None) -> Layer:
    """The layer object of ``ggml_custom_layer`` (its free form, as ``ggml_dense`` is ``ggml_layer_dense``'s): for
    ``ggml_apply`` (applied to several nodes it shares its weights) and for the wrappers
    (``ggml_layer_time_distributed`` applies it to every step). The arguments are ``ggml_custom_layer``'s.

    Example:
        >>> def affine(ctx, x, w):              # x: [features, N]
        ...     return g.ggml_add(ctx, g.ggml_mul_mat(ctx, w["kernel"], x), w["bias"])
        >>> step = g.ggml_custom(affine, weights={"kernel": (4, 8), "bias": (8,)}, output_shape=(8,))
        >>> seq = g.ggml_layer_time_distributed(g.ggml_input(shape=(10, 4)), step)    # (10, 8)
    """
    layer = custom.CustomLayer(forward, weights, output_shape, "ggml_custom", name=name, trainable=trainable,
                               input_shape=input_shape)
    return default_name(layer)
