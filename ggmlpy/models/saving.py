"""Saving models to GGUF: weights only (``ggml_save_weights``) or the whole model with its
architecture and compile settings (``ggml_save_model``).

Each weight is one F32 tensor named ``<layer>.<weight>`` ("dense_1.weight") in ggml's layout, so
any GGUF reader (the ``gguf`` package, ggml itself) can read the file. The metadata holds
``general.architecture = "ggmlpy"``, ``ggmlpy.format`` ("weights" or "model") and, for a model,
``ggmlpy.model`` and ``ggmlpy.compile`` (JSON).
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import GgmlTypeError, GgmlValueError, GgufFileNotFoundError
from ..weights import ggml_save_weights_gguf, gguf_read
from .compile import compiled, ggml_compile
from .graph import InputLayer, Model, Node, Sequential, apply_layer
from .layers import Layer

FORMAT_VERSION = 1


def _layer_types() -> dict[str, type]:
    from . import conv, layers, norm
    classes = [layers.Dense, layers.Flatten, layers.Dropout, layers.Embedding, layers.Add, layers.Concatenate,
               conv.Conv1D, conv.Conv2D, conv.MaxPooling2D, conv.GlobalAveragePooling2D, conv.GlobalMaxPooling2D,
               norm.BatchNorm, InputLayer]
    return {c.kind: c for c in classes}


def _metadata(model: Model, fmt: str) -> dict:
    return {"general.architecture": "ggmlpy", "general.name": model.name, "ggmlpy.format": fmt,
            "ggmlpy.format_version": FORMAT_VERSION,
            "ggmlpy.layers": json.dumps([l.name for l in model.layers])}


def ggml_save_weights(model: Model, path: Any) -> None:
    """Save the model's weights (and batch-norm statistics) to a GGUF file.

    Arguments: model: a compiled model. path: the file to write.

    Example:
        >>> g.ggml_save_weights(model, "weights.gguf")
    """
    compiled(model, "ggml_save_weights")
    ggml_save_weights_gguf(path, model.runtime.params.named_tensors(), _metadata(model, "weights"))


def ggml_load_weights(model: Model, path: Any) -> Model:
    """Load weights saved by ``ggml_save_weights`` or ``ggml_save_model`` into a compiled model of the same
    architecture. Weights are matched in order (layer by layer) and every shape is checked first: a file of
    another architecture raises ValueError naming the first tensor that does not fit, and nothing is loaded.

    Arguments: model: a compiled model. path: a GGUF file written by ggmlpy.

    Value: the model, with the file's weights.

    Example:
        >>> model = g.ggml_load_weights(model, "weights.gguf")
    """
    compiled(model, "ggml_load_weights")
    tensors, _ = _read(path, "ggml_load_weights")
    _assign(model, tensors)
    return model


def _read(path: Any, fn: str) -> tuple[dict, dict]:
    if isinstance(path, (str, os.PathLike)) and not os.path.exists(path):
        raise GgufFileNotFoundError(f"{fn}: no such file: {os.fspath(path)!r}")
    return gguf_read(path)


def _assign(model: Model, tensors: dict) -> None:
    params = model.runtime.params
    mine = list(params.specs)
    theirs = list(tensors.items())
    for i, (layer, spec) in enumerate(mine):
        want = f"{layer.name}.{spec.name}"
        if i >= len(theirs):
            raise GgmlValueError(f"the file has {len(theirs)} tensors, the model {len(mine)}: '{want}' is missing "
                                 "(another architecture?)")
        name, value = theirs[i]
        shape = tuple(reversed(spec.ne))
        if value.size != int(np.prod(shape)) or value.dtype != np.float32 or \
                tuple(d for d in value.shape if d != 1) != tuple(d for d in shape if d != 1):
            raise GgmlValueError(f"tensor {i} of the file ('{name}', shape {value.shape}) does not fit weight "
                                 f"'{want}' of shape {shape} (another architecture?)")
    if len(theirs) != len(mine):
        raise GgmlValueError(f"the file has {len(theirs)} tensors, the model {len(mine)}: '{theirs[len(mine)][0]}' "
                             "has no place in this model (another architecture?)")
    for (layer, spec), (_, value) in zip(mine, theirs):
        params.write(layer, spec.name, value.reshape(tuple(reversed(spec.ne))))


def ggml_save_model(model: Model, path: Any) -> None:
    """Save a compiled model, architecture, compile settings and weights, to one GGUF file that
    ``ggml_load_model`` turns back into a model predicting identically.

    Example:
        >>> g.ggml_save_model(model, "model.gguf")
        >>> same = g.ggml_load_model("model.gguf")
    """
    cfg = compiled(model, "ggml_save_model")
    meta = _metadata(model, "model")
    meta["ggmlpy.model"] = json.dumps(model.architecture())
    meta["ggmlpy.compile"] = json.dumps(cfg.to_dict())
    ggml_save_weights_gguf(path, model.runtime.params.named_tensors(), meta)


def ggml_load_model(path: Any, backend: str = "auto") -> Model:
    """A model saved by ``ggml_save_model``: rebuilt from its architecture, compiled with its saved
    settings on ``backend`` ("auto", "cpu", "vulkan", "cuda" or a device name), with its weights. It predicts
    like the saved model and can be trained further (the optimizer starts afresh: a warm restart).

    A file saved by ``ggml_save_weights`` has no architecture: build the model and use ``ggml_load_weights``.
    """
    tensors, meta = _read(path, "ggml_load_model")
    if meta.get("general.architecture") != "ggmlpy" or "ggmlpy.model" not in meta:
        what = "a weights-only file (ggml_save_weights)" if meta.get("ggmlpy.format") == "weights" else \
            "not a ggmlpy model file"
        raise GgmlValueError(f"ggml_load_model: {os.fspath(path)!r} is {what}: it has no architecture; build the "
                             "model in code and call ggml_load_weights")
    model = model_from_architecture(json.loads(meta["ggmlpy.model"]))
    cfg = json.loads(meta["ggmlpy.compile"])
    ggml_compile(model, optimizer=cfg["optimizer"], loss=cfg["loss"], metrics=cfg["metrics"], backend=backend,
                 loss_weights=cfg["loss_weights"], learning_rate=cfg["learning_rate"],
                 weight_decay=cfg["weight_decay"])
    _assign(model, tensors)
    return model


def _layer(config: dict) -> Layer:
    config = dict(config)
    kind = config.pop("type")
    types = _layer_types()
    if kind not in types:
        raise GgmlValueError(f"unknown layer type {kind!r} in the saved architecture")
    for key in ("kernel_size", "strides", "pool_size", "shape"):
        if isinstance(config.get(key), list):
            config[key] = tuple(config[key])
    return types[kind](**config)


def model_from_architecture(arch: dict) -> Model:
    """Rebuild a model (fresh, uncompiled) from ``Model.architecture()``."""
    if not isinstance(arch, dict) or arch.get("class") not in ("sequential", "functional"):
        raise GgmlTypeError("not a ggmlpy model architecture")
    layers = [_layer(c) for c in arch["layers"]]
    if arch["class"] == "sequential":
        if layers and arch.get("input_shape"):
            layers[0].input_shape = tuple(arch["input_shape"])
        return Sequential(layers, name=arch.get("name"))
    nodes: list[Node] = []
    for spec in arch["nodes"]:
        if isinstance(spec["layer"], dict):
            inp = _layer(spec["layer"])
            nodes.append(Node(inp, [], inp.shape, inp.dtype))
        else:
            layer = layers[spec["layer"]]
            ins = [nodes[i] for i in spec["inputs"]]
            nodes.append(apply_layer(layer, ins if layer.many_inputs else ins[0]))
    return Model([nodes[i] for i in arch["inputs"]], [nodes[i] for i in arch["outputs"]], name=arch.get("name"))
