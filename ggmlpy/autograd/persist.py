"""Saving ``ag_*`` modules to GGUF and loading them back (``ag_save_model``, ``ag_load_model``), and loading the
weights of a model-layer model (``ggml_save_model``'s file, or the model itself) into an equivalent ag_* module.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable

import numpy as np

from ..core.paths import PathArg
from ..errors import GgmlTypeError, GgmlValueError
from ..gguf.weights import ggml_save_weights_gguf, gguf_read
from ..graph.objects import Tensor
from ..graph.tensor import ggml_set_name
from ..models.builders import ggml_get_weights
from ..models.io.lora import LORA_KEY, lora_metadata
from ..models.network.model import Model
from .device import resolve_device, set_default
from .lazy import flush_effects
from .nn import ag_eval, BatchNorm, Embedding, LayerNorm, Linear, Module, Sequential
from .tensor import AgTensor


__all__ = ["ag_save_model", "ag_load_model"]

FORMAT = "ggmlpy.ag"


def _builder_name(model_fn: object, fn: str) -> str:
    """``module:qualname`` of a builder function that can be imported again."""
    if not callable(model_fn):
        raise GgmlTypeError(f"{fn}: model_fn must be a function of no arguments that builds the model, got "
                            f"{model_fn!r}")
    mod, qual = getattr(model_fn, "__module__", None), getattr(model_fn, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in qual:
        raise GgmlValueError(f"{fn}: model_fn {qual or model_fn!r} cannot be imported again (a lambda, a nested "
                             "function or one defined in __main__); define it at the top of a module, or pass "
                             "model_fn to ag_load_model instead")
    return f"{mod}:{qual}"


def _import_builder(name: str, fn: str) -> Callable[[], object]:
    mod, _, qual = name.partition(":")
    try:
        obj: object = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise GgmlValueError(f"{fn}: the file names its builder {name!r}, which cannot be imported ({exc}); pass "
                             "model_fn") from None
    if not callable(obj):
        raise GgmlValueError(f"{fn}: {name!r} is not a function")
    return obj  # a Module is checked after the call


def ag_save_model(model: object, path: PathArg, model_fn: Callable[[], object] | None = None) -> PathArg:
    """Save an ag_* module's parameters and statistics (batch norm's running mean and variance) to a GGUF file,
    each under its name in ``model.state()`` (``layer1_W``, ...).

    Arguments:
        model: an ag_* layer or ag_sequential, or a network of your own: an object whose ``parameters()``
            returns a dict name -> ag_param tensor.
        path: the file to write (replaced if it exists).
        model_fn: the function of no arguments that builds the same architecture, stored as ``module:qualname``
            so that ``ag_load_model(path)`` can rebuild it (it must be importable: not a lambda or a function of
            ``__main__``); None: ag_load_model needs model_fn.

    Value: path.

    Example:
        >>> ag_save_model(model, "mlp.gguf", model_fn=build_mlp)
    """
    fn = "ag_save_model"
    state = _state(model, fn)
    meta: dict[str, object] = {"general.architecture": "ggmlpy-ag", "ggmlpy.format": FORMAT}
    if model_fn is not None:
        meta["ggmlpy.ag.model_fn"] = _builder_name(model_fn, fn)
    for t in state.values():
        flush_effects(t.engine)   # a batch norm's pending statistics are part of what is saved
    tensors: list[Tensor] = []
    for name, t in state.items():
        if t.storage is None:
            raise GgmlValueError(f"{fn}: {name} is not a stored tensor")
        tensors.append(ggml_set_name(t.storage.tensor, name))   # its name in the file
    ggml_save_weights_gguf(path, tensors, meta)
    return path


def ag_load_model(path: PathArg | Model, model_fn: Callable[[], object] | None = None,
                  device: str | None = None) -> object:
    """Rebuild an ag_* module and load its parameters and statistics from a GGUF file, in evaluation mode.

    The file is ``ag_save_model``'s (matched by name), or a model-layer model's (``ggml_save_model``'s file, or
    the compiled model itself): its layers' weights go, in order, into the ag_* layers of ``model_fn()`` with
    weights (dense -> ag_linear, layer normalisation -> ag_layer_norm, batch normalisation -> ag_batch_norm,
    embedding -> ag_embedding).

    Arguments:
        path: the GGUF file, or a model-layer model.
        model_fn: the function of no arguments that builds the architecture; None: the one the file names.
        device: where the module is built; None: the default.

    Value: the module (an ag_* layer in evaluation mode). A missing tensor, one of another shape, or a file with
    tensors the module lacks is a ValueError naming the tensor.

    Example:
        >>> model = ag_load_model("mlp.gguf")
    """
    fn = "ag_load_model"
    live = isinstance(path, Model)
    if isinstance(path, Model):
        tensors, meta = ggml_get_weights(path), {"ggmlpy.format": "model"}
        if lora_metadata(path):
            meta[LORA_KEY] = "live"
    else:
        if not isinstance(path, (str, os.PathLike)):
            raise GgmlTypeError(f"{fn}: path must be a file path or a model-layer model, got {type(path).__name__}")
        tensors, meta = gguf_read(path, dequantize=True)   # a quantized model-layer file: its weights decoded
    if LORA_KEY in meta:
        raise GgmlValueError(f"{fn}: the model has low-rank adapters (ggml_add_lora), which ag_* layers lack; merge "
                             "them into its weights first (ggml_merge_lora(model)) and save or pass that model")
    builder = model_fn
    if builder is None:
        name = meta.get("ggmlpy.ag.model_fn")
        if not isinstance(name, str):
            raise GgmlValueError(f"{fn}: the file does not name the function that builds its model; pass model_fn")
        builder = _import_builder(name, fn)
    before = set_default("device", resolve_device(device, fn)) if device is not None else None
    try:
        model = builder()
    finally:
        if before is not None:
            set_default("device", before)
    if meta.get("ggmlpy.format") == FORMAT:
        state = {name: (t, False) for name, t in _state(model, fn).items()}
    elif not isinstance(model, Module):
        raise GgmlTypeError(f"{fn}: a model-layer model's weights load into ag_* layers; model_fn returned a "
                            f"{type(model).__name__}")
    else:
        state = _model_layer_names(model, tensors, live, fn)
    extra = sorted(set(tensors) - set(state))
    if extra:
        raise GgmlValueError(f"{fn}: the file holds tensors the model lacks: {extra[:5]}; model_fn builds another "
                             "architecture")
    for name, (t, transpose) in state.items():
        _assign(t, tensors, name, transpose, fn)
    return ag_eval(model) if isinstance(model, Module) else model


def _state(model: object, fn: str) -> dict[str, AgTensor]:
    """What is saved of a model: an ag_* layer's ``state()`` (parameters and statistics), or any object's
    ``parameters()`` dict of ag_param tensors (a network of your own)."""
    get = getattr(model, "state", None) if isinstance(model, Module) else getattr(model, "parameters", None)
    state = get() if callable(get) else None
    if not isinstance(state, dict) or not all(isinstance(v, AgTensor) for v in state.values()):
        raise GgmlTypeError(f"{fn}: model must be an ag_* layer or an object whose parameters() returns a dict of "
                            f"AgTensors, got {type(model).__name__}")
    return state


def _assign(t: AgTensor, tensors: dict[str, np.ndarray], name: str, transpose: bool, fn: str) -> None:
    if name not in tensors:
        raise GgmlValueError(f"{fn}: the file has no tensor {name!r}; model_fn builds another architecture")
    value = tensors[name].T if transpose else tensors[name]
    if int(np.prod(value.shape)) != t.size or tuple(d for d in value.shape if d != 1) != \
            tuple(d for d in t.shape if d != 1):
        raise GgmlValueError(f"{fn}: tensor {name!r} has shape {value.shape} in the file and {t.shape} in the model")
    t.data = np.asarray(value, np.float32).reshape(t.shape)


_LAYER_WEIGHTS = {Linear: (("weight", "W"), ("bias", "b")), LayerNorm: (("gamma", "gamma"), ("beta", "beta")),
                  Embedding: (("weight", "weight"),),
                  BatchNorm: (("gamma", "gamma"), ("beta", "beta"), ("running_mean", "running_mean"),
                              ("running_var", "running_var"))}


def _leaves(m: Module) -> list[Module]:
    if isinstance(m, Sequential):
        return [leaf for c in m.layers for leaf in _leaves(c)]
    return [m] if type(m) in _LAYER_WEIGHTS else []


def _model_layer_names(model: Module, tensors: dict[str, np.ndarray], live: bool,
                       fn: str) -> dict[str, tuple[AgTensor, bool]]:
    """The file's tensor name of each stored tensor of ``model`` (and whether it is transposed: a live model's
    dense kernels are Keras' (in, out)), pairing the file's layers (in order) with the module's layers that have
    weights."""
    layers: list[str] = []
    for name in tensors:
        layer = name.rsplit(".", 1)[0]
        if layer not in layers:
            layers.append(layer)
    mine = _leaves(model)
    if len(mine) != len(layers):
        raise GgmlValueError(f"{fn}: the model-layer model has {len(layers)} layers with weights ({layers}), the "
                             f"ag_* module {len(mine)}: build an equivalent module")
    out: dict[str, tuple[AgTensor, bool]] = {}
    for layer, m in zip(layers, mine):
        for file_name, attr in _LAYER_WEIGHTS[type(m)]:
            t = getattr(m, attr)
            if isinstance(t, AgTensor) and f"{layer}.{file_name}" in tensors:
                out[f"{layer}.{file_name}"] = (t, live and isinstance(m, Linear) and attr == "W")
    return out
