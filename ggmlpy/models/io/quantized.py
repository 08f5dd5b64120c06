"""Quantized models: which weights of a model take which quantized type (``quantization_plan``), quantizing a
compiled model's weights in memory (``ggml_quantize_model``), and their quantized copies as host tensors the GGUF
writer stores with that type (``ggml_save_model(model, path, quantize=...)``).

A weight is quantized when its layer reads it on quantized data (``Weight(quantizable=...)``: a dense or recurrent
layer's kernel, attention's projections, an embedding's table) and its rows (ggml's ne[0]) are a whole number of
the type's blocks; biases, normalisation weights and statistics, convolution kernels and weights whose rows do not
fit stay F32. A model holding quantized weights computes its products on them (ggml's quantized matrix products:
no decoded copy is kept), and they are frozen: ggml's optimizers update F32 weights.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..._ffi import ffi, lib
from ...core.quants import quantize_rows, type_by_name
from ...core.types import type_name
from ...errors import GgmlValueError
from ...graph.context import ggml_init, ggml_tensor_overhead
from ...graph.objects import Context, Tensor
from ...graph.tensor import ggml_set_name, new_quantized_tensor
from ..engine.compile import compile_again, compiled
from ..engine.runtime import model_in_use
from ..network.model import Model
from ..network.parameters import can_hold, ParamStore, quantized_types


def quantization_plan(store: ParamStore, quantize: object, fn: str) -> dict[str, int | None]:
    """"<layer>.<weight>" -> ggml type of each weight of ``store``'s model to quantize. ``quantize``: a type name for
    every weight that takes it, or a dict by layer name or weight name (``{"dense_1": "q4_0", "dense_2.weight":
    "q8_0"}``; a weight's own entry wins over its layer's; None: F32); names of neither are a ValueError."""
    specs = {f"{layer.name}.{p.name}": p for layer, p in store.specs}
    names = list(specs)
    if isinstance(quantize, str):
        chosen: dict[str, int | None] = {n: type_by_name(quantize, fn) for n in names}
    elif isinstance(quantize, Mapping):
        layers = {n.rsplit(".", 1)[0] for n in names}
        unknown = [k for k in quantize if k not in names and k not in layers]
        if unknown:
            raise GgmlValueError(f"{fn}: quantize names {unknown}, which are neither a layer nor a weight of the "
                                 f"model (weights: {names[:6]}{'...' if len(names) > 6 else ''})")
        chosen = {}
        for n in names:
            key = n if n in quantize else n.rsplit(".", 1)[0]
            if key in quantize:
                chosen[n] = None if quantize[key] is None else type_by_name(quantize[key], fn)
    else:
        raise GgmlValueError(f"{fn}: quantize must be a type name such as 'q8_0', or a dict by layer or weight name, "
                             f"got {quantize!r}")
    plan = {n: t for n, t in chosen.items() if t is None or can_hold(specs[n], t)}
    if isinstance(quantize, Mapping):   # a name given explicitly must quantize something
        for key, kind in quantize.items():
            covered = [n for n in names if key in (n, n.rsplit(".", 1)[0])]
            if kind is not None and not any(plan.get(n) is not None for n in covered):
                t = type_by_name(kind, fn)
                raise GgmlValueError(
                    f"{fn}: quantize names {key!r}, none of whose weights can be held in {type_name(t)}: a quantized "
                    "model holds the kernels of dense, attention and recurrent layers and embedding tables, whose "
                    f"rows (the layer's input size) are whole blocks ({int(lib.ggml_blck_size(t))} values for "
                    f"{type_name(t)}); {key!r} has {[f'{n} (ne {list(specs[n].ne)})' for n in covered]}")
    return plan


def ggml_quantize_model(model: Model, quantize: object = "q8_0") -> Model:
    """Quantize a compiled model's weights in memory, as Keras' ``model.quantize``: from now on its matrix
    products compute on the quantized weights (ggml's quantized matrix products, no decoded copy kept), on its
    backend, and the weights take a fraction of their F32 memory.

    The weights quantized are those a layer reads on quantized data: the kernels of dense and recurrent layers,
    attention's projections and an embedding's table, where their rows (ggml's ne[0]: the layer's input size)
    are whole blocks of the type (32 values for q8_0/q4_0/q5_0, 256 for the K-quants); biases, normalisation
    weights, convolution kernels and weights whose rows do not fit stay F32. A weight whose device has no
    product of the type (ggml's supports_op) stays F32 too (``ggml_model_quantization`` says which are held
    quantized). Quantized weights are frozen: a fit refuses a model whose trainable layers hold some (freeze
    those layers with ``layer.trainable = False`` to train the others).

    Arguments:
        model: a compiled model.
        quantize: a type for every weight that takes it (default "q8_0": 8.5 bits per weight, within a point
            of F32 accuracy; "q4_0": 4.5 bits, "q4_K": 4.5, "q5_K": 5.5, "q6_K": 6.56, or any of the
            ``quantize_*`` family's types), or a dict by layer or weight name for mixed types (``{"dense_1":
            "q4_K", "head.weight": "q8_0"}``; None sets a weight back to F32, its quantized values decoded;
            weights it does not name stay as they are).

    Value: the model, compiled again on its backend with the same settings (the optimizer's state starts
    afresh, as after ``ggml_compile``).

    Example:
        >>> model = g.ggml_quantize_model(model, "q8_0")
        >>> g.ggml_model_quantization(model)
        {'dense_1.weight': 'q8_0', 'dense_2.weight': 'q8_0'}
        >>> y = g.ggml_predict(model, x)
    """
    fn = "ggml_quantize_model"
    compiled(model, fn)
    with model_in_use(model) as runtime:
        plan = quantization_plan(runtime.params, quantize, fn)
    layers = {layer.name: layer for layer in model.layers}
    before = {name: dict(quantized_types(layer)) for name, layer in layers.items()}
    for key, t in plan.items():
        layer_name, weight = key.rsplit(".", 1)
        types = layers[layer_name].__dict__.setdefault("_quantized", {})
        if t is None:
            types.pop(weight, None)
        else:
            types[weight] = t

    def undo() -> None:
        for name, layer in layers.items():
            layer.__dict__["_quantized"] = before[name]
    # the weights come from the old runtime (each layer's newest holder), quantized as they are written
    compile_again(model, undo)
    return model


def ggml_model_quantization(model: Model) -> dict[str, str]:
    """The weights a compiled model holds quantized, by name: ``{"<layer>.<weight>": type name}`` (empty for a
    full-precision model). They are the ones ``ggml_quantize_model`` or a quantized file loaded by
    ``ggml_load_model`` quantized, where the model's device computes products of that type.

    Arguments:
        model: a compiled model.

    Value: a dict, weight name -> its quantized type's name ("q8_0", "q4_K", ...).

    Example:
        >>> g.ggml_model_quantization(g.ggml_load_model("model-q4.gguf"))
        {'dense_1.weight': 'q4_0', 'dense_2.weight': 'q4_0'}
    """
    compiled(model, "ggml_model_quantization")
    with model_in_use(model) as runtime:
        return runtime.params.quantized_names()


def quantized_tensors(values: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]],
                      plan: Mapping[str, int], fn: str) -> tuple[Context | None, dict[str, Tensor]]:
    """Host tensors of the planned types holding the quantized weights (ggml's quantizer), in one context the
    caller frees after writing."""
    if not plan:
        return None, {}
    size = sum(int(lib.ggml_row_size(t, shapes[n][0])) * int(np.prod(shapes[n][1:])) + 64 for n, t in plan.items())
    ctx = ggml_init(mem_size=size + len(plan) * ggml_tensor_overhead() + 1024, no_alloc=False)
    out = {}
    try:
        for n, t in plan.items():
            ne = shapes[n]
            raw = quantize_rows(t, np.asarray(values[n], np.float32).reshape(-1, ne[0]), fn)
            tensor = ggml_set_name(new_quantized_tensor(ctx, t, ne), n)
            if int(lib.ggml_nbytes(tensor.ptr)) != len(raw):
                raise GgmlValueError(f"{fn}: {n} as {type_name(t)} takes {lib.ggml_nbytes(tensor.ptr)} bytes, the "
                                     f"quantizer wrote {len(raw)}")
            ffi.memmove(tensor.ptr.data, raw, len(raw))
            out[n] = tensor
    except BaseException:
        ctx.free()
        raise
    return ctx, out
