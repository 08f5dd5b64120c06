"""Low-rank adapters over frozen weights (LoRA; over quantized weights, QLoRA's idea on ggml): adding them to a
compiled model (``ggml_add_lora``), saving and loading them as a GGUF file of their own beside the base model's
(``ggml_save_lora``, ``ggml_load_lora``), and merging them into the weights (``ggml_merge_lora``).

The adapters' factors are weights of their layers (network/low_rank.py says how they enter the products); while a
layer has one, only the factors of its adapters train. A whole-model file (``ggml_save_model``) holds them too,
listed in its ``ggmlpy.lora`` metadata, so that ``ggml_load_model`` gives them back.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

from ...core.args import float_arg, is_int, is_real, positive_int_arg
from ...core.paths import PathArg
from ...core.quants import QuantizedArray
from ...errors import GgmlValueError, GgufFileError
from ...gguf.weights import ggml_save_weights_gguf, read_gguf
from ..engine.compile import compile_again, compiled
from ..engine.runtime import model_in_use
from ..layers.layer import Layer
from ..layers.weight import ParamSpec
from ..network.low_rank import adaptable, adapter_names, adapters, attach, detach
from ..network.model import Model
from ..network.parameters import quantized_types, strip_leading_ones


LORA_KEY = "ggmlpy.lora"   # {"<layer>.<weight>": [rank, alpha]} in a file that holds adapters


def ggml_add_lora(model: Model, rank: int = 8, alpha: float = 16.0, targets: object = None) -> Model:
    """Add low-rank adapters (LoRA) to a compiled model's product weights, to fine-tune it while those weights stay
    frozen: quantized (a model loaded from a quantized file, or ``ggml_quantize_model``: QLoRA's idea) or F32.

    An adapter on a weight ``W`` (a dense layer's kernel, an attention projection, a recurrent layer's input
    kernel: the weights a layer multiplies) adds ``alpha / rank * (x A) B`` to the layer's product ``x W``, with
    ``A`` of shape ``(inputs, rank)`` (random at first) and ``B`` of shape ``(rank, outputs)`` (zeros at first, so
    the model predicts as before). Afterwards only the adapters train: the layers given adapters keep their own
    weights frozen, and every other layer is frozen (``trainable=False``; set a full-precision layer's
    ``trainable`` back to True to train it as well, a new output layer for one). Train with ``ggml_fit`` or
    ``ggml_fit_generator`` as usual; then ``ggml_save_lora`` saves the adapters alone and ``ggml_merge_lora``
    merges them into the weights.

    The whole training step stays on the model's device. Where ggml has no backward pass of a quantized product
    (Vulkan's and CUDA's OUT_PROD take F32 weights), each training step decodes the frozen quantized weights in its
    own graph (``ggml_get_rows`` of every row, in the step's working memory) and multiplies in F32; the model's
    weights stay quantized, and predictions use the quantized kernels.

    Arguments:
        model: a compiled model.
        rank: the adapters' rank (default 8): an int >= 1 (one above a weight's smaller side adds nothing).
        alpha: the scale numerator (default 16), finite and > 0: the adapter's product is scaled by
            ``alpha / rank``.
        targets: which weights get adapters: None (the default: every weight that can have one), or a list
            of layer names (every such weight of the layer) and weight names ("<layer>.<weight>"). A weight that
            has an adapter already is refused: merge it first (``ggml_merge_lora``).

    Value: the model, compiled again on its backend with its settings (the optimizer's state starts afresh).

    Example:
        >>> model = g.ggml_load_model("model-q4.gguf")        # quantized weights, kept quantized
        >>> model = g.ggml_add_lora(model, rank=8, alpha=16)
        >>> g.ggml_fit(model, x_new, y_new, epochs=3)
        >>> g.ggml_save_lora(model, "adapter.gguf")
    """
    fn = "ggml_add_lora"
    compiled(model, fn)
    rank = positive_int_arg(fn, "rank", rank)
    alpha = float_arg(fn, "alpha", alpha, finite=True)
    if alpha <= 0:
        raise GgmlValueError(f"{fn}: alpha must be > 0 (the adapters' scale is alpha / rank), got {alpha!r}")
    chosen = _targets(model, targets, fn)
    again = [f"{layer.name}.{spec.name}" for layer, spec in chosen if spec.name in adapters(layer)]
    if again:
        raise GgmlValueError(f"{fn}: {again} have adapters already; merge them into the weights first "
                             "(ggml_merge_lora(model)), or give targets= without them")
    kept = _state(model)
    for layer, spec in chosen:
        attach(layer, spec.name, rank, alpha)
    _freeze_all_but_adapted(model)
    return compile_again(model, lambda: _restore(model, kept))


def ggml_save_lora(model: Model, path: PathArg) -> None:
    """Save a model's adapters (``ggml_add_lora``) to a GGUF file of their own: their factors (tensors
    ``<layer>.<weight>_lora_a`` / ``_lora_b``, F32) and, in the metadata, each adapter's rank and alpha
    (``ggmlpy.lora``), beside the GGUF keys other tools read (``general.type`` "adapter", ``adapter.type``
    "lora", ``adapter.lora.alpha``). The base model is not in it: ship the base file (quantized, for instance)
    and this one, and ``ggml_load_lora`` puts them together.

    Arguments:
        model: a compiled model with adapters.
        path: the file to write (a str or os.PathLike); an existing file is replaced.

    Value: None. A model without adapters raises ValueError.

    Example:
        >>> g.ggml_save_lora(model, "adapter.gguf")
    """
    fn = "ggml_save_lora"
    compiled(model, fn)
    with model_in_use(model) as runtime:
        store = runtime.readable()
        tensors = store.named_tensors()
        listed = lora_metadata(model)
        if not listed:
            raise GgmlValueError(f"{fn}: the model has no adapters; add them with ggml_add_lora(model, ...) and "
                                 "train them first")
        factors = {n: t for n, t in tensors.items() if n.endswith(("_lora_a", "_lora_b"))}
        alphas = {alpha for _, alpha in listed.values()}
        meta: dict[str, object] = {"general.architecture": "ggmlpy", "general.type": "adapter",
                                   "general.name": model.name, "ggmlpy.format": "lora", "adapter.type": "lora",
                                   LORA_KEY: json.dumps(listed)}
        if len(alphas) == 1:
            meta["adapter.lora.alpha"] = float(alphas.pop())
        ggml_save_weights_gguf(path, factors, meta)


def ggml_load_lora(model: Model, path: PathArg) -> Model:
    """Load adapters saved by ``ggml_save_lora`` into a compiled model of the same architecture (the base model
    they were trained on, loaded from its own file): adapters it lacks are added (the model is compiled again,
    as by ``ggml_add_lora``), and their factors take the file's values. Every name and shape is checked before
    anything changes.

    Arguments:
        model: a compiled model: the base the adapters were trained on (the same layer names and shapes).
        path: a GGUF file written by ``ggml_save_lora``.

    Value: the model, with the file's adapters (only they train from now on, as after ``ggml_add_lora``).

    Example:
        >>> model = g.ggml_load_model("model-q4.gguf")
        >>> model = g.ggml_load_lora(model, "adapter.gguf")
        >>> g.ggml_predict(model, x)
    """
    fn = "ggml_load_lora"
    compiled(model, fn)
    tensors, meta = read_gguf(path, fn, "keep")
    listed = parse_lora_metadata(meta, f"{fn}: {os.fspath(path)!r}")
    if not listed:
        raise GgmlValueError(f"{fn}: {os.fspath(path)!r} holds no adapters (no {LORA_KEY} metadata): save them "
                             "with ggml_save_lora")
    chosen = _targets(model, list(listed), fn, listed_by=str(os.fspath(path)))
    plan = []
    for layer, spec in chosen:
        rank, _ = listed[f"{layer.name}.{spec.name}"]
        for name, ne in zip(adapter_names(spec.name), ((spec.fans[0], rank), (rank, spec.fans[1]))):
            key = f"{layer.name}.{name}"
            value = tensors.get(key)
            if value is None or strip_leading_ones(value.shape) != strip_leading_ones(tuple(reversed(ne))):
                raise GgmlValueError(f"{fn}: {os.fspath(path)!r} lacks '{key}' of shape {tuple(reversed(ne))} "
                                     f"(it has {None if value is None else tuple(value.shape)}): adapters of another "
                                     "model?")
            floats = value.floats() if isinstance(value, QuantizedArray) else value
            plan.append((layer, name, np.asarray(floats, np.float32).reshape(tuple(reversed(ne)))))
    wanted = {(id(layer), spec.name): listed[f"{layer.name}.{spec.name}"] for layer, spec in chosen}
    have = {(id(layer), w): v for layer in model.layers for w, v in adapters(layer).items()}
    kept = _state(model)
    if have != wanted:   # the model's adapters become the file's: others go, missing ones come
        for layer in model.layers:
            for w in list(adapters(layer)):
                detach(layer, w)
        for layer, spec in chosen:
            attach(layer, spec.name, *wanted[(id(layer), spec.name)])
    _freeze_all_but_adapted(model)
    if have != wanted:
        compile_again(model, lambda: _restore(model, kept))
    return _written(model, plan)


def ggml_merge_lora(model: Model, dequantize: bool = False) -> Model:
    """Merge a model's adapters into the weights they adapt (``W + alpha / rank * A B``) and remove them: the model
    then predicts as it did with them, with no adapter products.

    A quantized weight is decoded, summed and quantized again in its type (ggml's quantizer), so the merged model
    predicts within that type's rounding of the adapter model; ``dequantize=True`` keeps the merged weights in F32
    instead (exactly the sum). The layers' ``trainable`` flags are left as they are.

    Arguments:
        model: a compiled model with adapters.
        dequantize: False (the default) keeps quantized weights quantized; True makes the merged weights F32.

    Value: the model, compiled again on its backend with its settings.

    Example:
        >>> model = g.ggml_merge_lora(model)
        >>> g.ggml_save_model(model, "merged-q4.gguf")
    """
    fn = "ggml_merge_lora"
    compiled(model, fn)
    if not isinstance(dequantize, bool):
        raise GgmlValueError(f"{fn}: dequantize must be True or False, got {dequantize!r}")
    with model_in_use(model) as runtime:
        store = runtime.params
        merged = []
        for layer in model.layers:
            for weight, (rank, alpha) in adapters(layer).items():
                a, b = (store.read(layer, n) for n in adapter_names(weight))   # numpy (rank, K), (M, rank)
                w = store.read(layer, weight)
                delta = (alpha / rank) * (b.astype(np.float64) @ a.astype(np.float64))   # (M, K)
                merged.append((layer, weight, (w.reshape(delta.shape) + delta).astype(np.float32).reshape(w.shape)))
    if not merged:
        raise GgmlValueError(f"{fn}: the model has no adapters to merge")
    kept = _state(model)
    for layer, weight, _ in merged:
        detach(layer, weight)
        if dequantize:
            layer.__dict__["_quantized"] = {k: v for k, v in quantized_types(layer).items() if k != weight}
    compile_again(model, lambda: _restore(model, kept))
    return _written(model, merged)


def _written(model: Model, values: list[tuple[Layer, str, np.ndarray]]) -> Model:
    """The model with ``(layer, weight name, values)`` written into its weights (and its replicas')."""
    with model_in_use(model) as runtime:
        for layer, name, value in values:
            runtime.params.write(layer, name, value)
        runtime.sync_replicas()
    return model


def lora_metadata(model: Model) -> dict[str, list]:
    """``{"<layer>.<weight>": [rank, alpha]}`` of a model's adapters (what a file lists in ``ggmlpy.lora``)."""
    return {f"{layer.name}.{w}": [rank, alpha] for layer in model.layers
            for w, (rank, alpha) in adapters(layer).items()}


def parse_lora_metadata(meta: dict, where: str) -> dict[str, tuple[int, float]] | None:
    """A file's ``ggmlpy.lora`` entry, checked (None where it has none)."""
    if LORA_KEY not in meta:
        return None
    try:
        listed = json.loads(meta[LORA_KEY])
        out = {k: (int(v[0]), float(v[1])) for k, v in listed.items()
               if isinstance(k, str) and isinstance(v, list) and len(v) == 2 and is_int(v[0]) and v[0] >= 1
               and is_real(v[1]) and math.isfinite(v[1]) and v[1] > 0}
        if len(out) != len(listed):
            raise ValueError("an entry is not [rank >= 1, finite alpha > 0]")
    except (ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise GgufFileError(f"{where} holds damaged adapter metadata ({LORA_KEY}: {exc})") from None
    return out


def attach_listed(model: Model, listed: dict[str, tuple[int, float]], fn: str) -> None:
    """Give a model rebuilt from a file the adapters the file lists (before its weights are matched)."""
    for layer, spec in _targets(model, list(listed), fn):
        attach(layer, spec.name, *listed[f"{layer.name}.{spec.name}"])


def _freeze_all_but_adapted(model: Model) -> None:
    """Only adapters train: the layers that have some stay trainable (their own weights are frozen by
    ``Layer.trains``), every other layer is frozen."""
    for layer in model.layers:
        layer.trainable = bool(adapters(layer))


def _targets(model: Model, targets: object, fn: str, listed_by: str | None = None) -> list[tuple[Layer, ParamSpec]]:
    """(layer, weight spec) of each weight that ``targets`` names (None: every weight that can take an adapter);
    ``listed_by``: the file whose adapters they are (for the errors)."""
    model.graph()   # builds a sequential model's layers
    every = [(layer, p) for layer in model.layers for p in (layer.params or []) if adaptable(p)]
    if targets is None:
        if not every:
            raise GgmlValueError(f"{fn}: the model has no weight an adapter can go on (dense, attention or recurrent "
                                 "layers' kernels)")
        return every
    names = [targets] if isinstance(targets, str) else list(targets) if isinstance(targets, (list, tuple)) else None
    if names is None or not names or not all(isinstance(n, str) for n in names):
        raise GgmlValueError(f"{fn}: targets must be None, or a list of layer names and '<layer>.<weight>' names, "
                             f"got {targets!r}")
    chosen = [(layer, p) for layer, p in every if layer.name in names or f"{layer.name}.{p.name}" in names]
    found = {layer.name for layer, _ in chosen} | {f"{layer.name}.{p.name}" for layer, p in chosen}
    missing = [n for n in names if n not in found]
    if missing:
        can = sorted({f"{layer.name}.{p.name}" for layer, p in every})
        what = f"{listed_by!r} holds adapters on {missing}, which this model lacks (adapters of another model?)" \
            if listed_by else f"targets {missing} name no weight an adapter can go on"
        raise GgmlValueError(f"{fn}: {what}; these weights can take one: {can[:8]}{'...' if len(can) > 8 else ''}")
    return chosen


def _state(model: Model) -> list[tuple[Layer, list | None, dict, dict, bool]]:
    """What adding or removing adapters changes of each layer, to put back when compiling fails."""
    return [(layer, list(layer.params) if layer.params is not None else None, dict(adapters(layer)),
             dict(quantized_types(layer)), layer.trainable) for layer in model.layers]


def _restore(model: Model, kept: list[tuple[Layer, list | None, dict, dict, bool]]) -> None:
    for layer, params, lora, types, trainable in kept:
        layer.params = params
        layer.__dict__["_lora"] = lora
        layer.__dict__["_quantized"] = types
        layer.trainable = trainable
