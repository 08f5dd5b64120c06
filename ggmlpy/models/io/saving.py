"""Saving models to GGUF: weights only (``ggml_save_weights``) or the whole model with its
architecture and compile settings (``ggml_save_model``).

Each weight is one F32 tensor named ``<layer>.<weight>`` ("dense_1.weight") in ggml's layout, so
any GGUF reader (the ``gguf`` package, ggml itself) can read the file. The metadata holds
``general.architecture = "ggmlpy"``, ``ggmlpy.format`` ("weights" or "model") and, for a model,
``ggmlpy.model`` and ``ggmlpy.compile`` (JSON).

With ``include_optimizer=True`` the optimizer's state follows the weights: AdamW's moments as F32
tensors ``optimizer.m.<layer>.<weight>`` and ``optimizer.v.<layer>.<weight>`` (weight's shape; a name
longer than ggml's 63 bytes becomes ``optimizer.m.#<i>``), and the metadata ``ggmlpy.optimizer.type``
("adamw"/"sgd"), ``ggmlpy.optimizer.iter`` (the number of the next optimizer step, for the bias
correction), ``ggmlpy.optimizer.params`` (the weights with moments, in order) and the hyper-parameters
``ggmlpy.optimizer.learning_rate``, ``.beta1``, ``.beta2``, ``.eps``, ``.weight_decay``. Another optimizer's
slots (``"momentum"``, RMSprop's ``"velocity"``, Adagrad's ``"accumulator"``, ...) are tensors
``optimizer.<slot>.<layer>.<weight>`` (``optimizer.<slot>.#<i>`` when longer), listed in
``ggmlpy.optimizer.slots``; its settings (momentum, rho, clipping, ...) are in the compile settings.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ...backend.transfer import ggml_backend_tensor_set_data, numpy_shape
from ...core.args import bool_arg, is_int, is_real
from ...core.quants import QuantizedArray
from ...core.types import GGML_TYPE_F32, type_name
from ...errors import GgmlInUseError, GgmlpyError, GgmlTypeError, GgmlValueError, GgufFileError, GgufFileNotFoundError
from ...gguf.weights import ggml_save_weights_gguf, read_gguf
from ...graph.context import ggml_init, ggml_tensor_overhead
from ...graph.tensor import ggml_new_tensor, ggml_set_name
from ...opt.constants import OPTIMIZER_ADAMW
from ...opt.params import LrUserdata
from ...opt.rules import OPTIMIZER_NAMES, OPTIMIZER_SETTINGS
from ..engine.compile import compiled, ggml_compile
from ..engine.runtime import model_in_use
from ..layers.layer import check_rebuildable, Layer, layer_class
from ..layers.weight import ParamSpec
from ..network.model import apply_layer, InputLayer, Model, Node, Sequential
from ..network.parameters import can_hold, strip_leading_ones
from .lora import attach_listed, LORA_KEY, lora_metadata, parse_lora_metadata
from .quantized import quantization_plan, quantized_tensors


FORMAT_VERSION = 1


def _metadata(model: Model, fmt: str) -> dict:
    return {"general.architecture": "ggmlpy", "general.name": model.name, "ggmlpy.format": fmt,
            "ggmlpy.format_version": FORMAT_VERSION,
            "ggmlpy.layers": json.dumps([layer.name for layer in model.layers])}


def ggml_save_weights(model: Model, path: Any) -> None:
    """Save the model's weights (and batch-norm statistics) to a GGUF file.

    Arguments:
        model: a compiled model.
        path: the file to write.

    Example:
        >>> g.ggml_save_weights(model, "weights.gguf")
    """
    compiled(model, "ggml_save_weights")
    with model_in_use(model):  # no compile from another thread while ggml reads the weights
        ggml_save_weights_gguf(path, model.runtime.readable().named_tensors(), _metadata(model, "weights"))


def ggml_load_weights(model: Model, path: Any, include_optimizer: bool = False) -> Model:
    """Load weights saved by ``ggml_save_weights`` or ``ggml_save_model`` into a compiled model of the same
    architecture. Weights are matched by name ("dense_1.weight") when the file has every weight's name,
    otherwise in order, layer by layer (a model built again gets new default names), and then each must be
    the same kind of weight ("kernel", "gamma", ...). Every shape must be the same, and everything is checked
    first: a file of another architecture raises ValueError naming the first tensor that does not fit, and
    nothing is loaded. Float weights other than f32 (f16, bf16, f64) are converted.

    Arguments:
        model: a compiled model.
        path: a GGUF file written by ggmlpy.
        include_optimizer: False (the default) loads the weights only, and the model's optimizer state is left
            as it is; True also takes the optimizer state of a file saved with
            ``ggml_save_model(..., include_optimizer=True)`` (the next fit or trainer continues it), and raises
            ValueError when the file has none or the model is compiled with another optimizer (nothing is
            loaded then).

    Value: the model, with the file's weights.

    Example:
        >>> model = g.ggml_load_weights(model, "weights.gguf")
    """
    fn = "ggml_load_weights"
    compiled(model, fn)
    bool_arg(fn, "include_optimizer", include_optimizer)
    tensors, meta = _read(path, fn)
    weights, state = _split(tensors, meta, fn)
    with model_in_use(model):  # no compile from another thread while the weights are written
        plan = _plan(_specs(model), weights, fn)
        if include_optimizer:
            if state is None:
                raise GgmlValueError(f"{fn}: {os.fspath(path)!r} holds no optimizer state (saved without "
                                     "include_optimizer=True); load it with include_optimizer=False")
            _no_live_trainer(model, fn, "its optimizer state would be overwritten when the trainer is freed")
            model.runtime.opt_state.set(state, model.compiled.optimizer_spec, fn)
            _restore_loss_scale(model, meta, path, fn)
        _write(model, plan)
    return model


def _no_live_trainer(model: Model, fn: str, why: str) -> None:
    """A live ``ggml_trainer`` holds the model's current optimizer state in its opt context."""
    if model.runtime.live_trainers():
        raise GgmlInUseError(f"{fn}: a ggml_trainer of this model is live and holds its optimizer state ({why}); "
                             "free the trainer first (tr.free()), or save with tr.save(path)")


def _read(path: Any, fn: str) -> tuple[dict, dict]:
    if isinstance(path, (str, os.PathLike)) and not os.path.exists(path):
        raise GgufFileNotFoundError(f"{fn}: no such file: {os.fspath(path)!r}")
    tensors, meta = read_gguf(path, fn, "keep")   # a quantized file's weights as their bytes (QuantizedArray)
    version = meta.get("ggmlpy.format_version", FORMAT_VERSION)
    if meta.get("general.architecture") == "ggmlpy" and (not is_int(version) or not 1 <= version <= FORMAT_VERSION):
        raise GgufFileError(f"{fn}: {os.fspath(path)!r} is in ggmlpy's file format version {version!r}, this "
                            f"ggmlpy reads versions 1 to {FORMAT_VERSION}; upgrade ggmlpy to read it")
    return tensors, meta


OPT_PREFIX = "optimizer."


def _opt_names(key: str, i: int, slots: tuple = ("m", "v")) -> tuple[str, ...]:
    """The GGUF names of one weight's slots (ggml names hold at most 63 bytes)."""
    names = tuple(f"{OPT_PREFIX}{k}.{key}" for k in slots)
    if max(len(n.encode()) for n in names) < 64:
        return names
    return tuple(f"{OPT_PREFIX}{k}.#{i}" for k in slots)


def _split(tensors: dict, meta: dict, fn: str) -> tuple[dict, dict | None]:
    """(the weights, the optimizer state or None) of a file's tensors."""
    kind = meta.get("ggmlpy.optimizer.type")
    if kind is None:
        return tensors, None
    keys = meta.get("ggmlpy.optimizer.params") or []
    if isinstance(keys, str):
        keys = [keys]
    slot_names = meta.get("ggmlpy.optimizer.slots") or (["m", "v"] if kind == "adamw" else [])
    if isinstance(slot_names, str):
        slot_names = [slot_names]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or kind not in OPTIMIZER_NAMES or \
            not isinstance(slot_names, list) or not all(isinstance(k, str) and k for k in slot_names) or \
            len(set(slot_names)) != len(slot_names):
        raise GgmlValueError(f"{fn}: the file's optimizer metadata is damaged (ggmlpy.optimizer.type {kind!r}, "
                             f"ggmlpy.optimizer.params {keys!r:.80}, ggmlpy.optimizer.slots {slot_names!r:.80})")
    values: dict = {slot: {} for slot in slot_names}
    taken: set[str] = set()
    for i, key in enumerate(keys):
        names = _opt_names(key, i, tuple(slot_names))
        missing = [n for n in names if n not in tensors]
        if missing:
            raise GgmlValueError(f"{fn}: the file's optimizer state lacks the {'/'.join(slot_names)} of '{key}' "
                                 f"({', '.join(repr(n) for n in missing)}); the file is damaged")
        for slot, n in zip(slot_names, names):
            values[slot][key] = tensors[n]
        taken.update(names)
    m, v = values.pop("m", {}), values.pop("v", {})
    hparams = {k: meta[f"ggmlpy.optimizer.{k}"] for k in ("learning_rate", "beta1", "beta2", "eps", "weight_decay")
               if f"ggmlpy.optimizer.{k}" in meta}
    step = meta.get("ggmlpy.optimizer.iter", 1)
    if not is_int(step) or step < 1:
        raise GgufFileError(f"{fn}: the file's optimizer metadata is damaged: ggmlpy.optimizer.iter must be an "
                            f"int >= 1 (the next step's number), got {step!r:.40}")
    state = {"optimizer": kind, "iter": int(step), "m": m, "v": v, "hparams": hparams}
    if values:
        state["slots"] = values
    return {k: t for k, t in tensors.items() if k not in taken}, state


def _opt_metadata_and_tensors(state: dict) -> tuple[dict, list[tuple[str, np.ndarray]]]:
    meta: dict = {"ggmlpy.optimizer.type": state["optimizer"], "ggmlpy.optimizer.iter": np.int64(state["iter"])}
    kinds = {"m": state["m"], "v": state["v"]} if state["optimizer"] == "adamw" else dict(state.get("slots") or {})
    keys = sorted(next(iter(kinds.values()))) if kinds else []
    if keys:
        meta["ggmlpy.optimizer.params"] = keys
        if state["optimizer"] != "adamw":
            meta["ggmlpy.optimizer.slots"] = list(kinds)
    for k, value in (state.get("hparams") or {}).items():
        meta[f"ggmlpy.optimizer.{k}"] = float(value)
    arrays = []
    for i, key in enumerate(keys):
        arrays += [(n, kinds[slot][key]) for slot, n in zip(kinds, _opt_names(key, i, tuple(kinds)))]
    return meta, arrays


def _specs(model: Model) -> list:
    """(layer, weight spec) of every weight, in the order of the model's layers (known once the layers are
    built, before any memory is allocated for them)."""
    model.graph()  # builds a sequential model's layers
    return [(layer, spec) for layer in model.layers for spec in (layer.params or [])]


def _plan(specs: list, tensors: dict, fn: str) -> list:
    """Where each of the file's weights goes: ``[(layer, spec, float32 array)]``, every one checked before any
    is written. By name when the file has every weight's name; otherwise in order (a model built again gets
    new layer names), then each weight must be of the same kind ('kernel', 'gamma', ...). Shapes must be the
    same, not just hold as many values."""
    mine = [(layer, spec, f"{layer.name}.{spec.name}") for layer, spec in specs]
    theirs = list(tensors.items())
    by_name = len(theirs) == len(mine) and all(key in tensors for _, _, key in mine)
    plan: list[tuple[Layer, ParamSpec, np.ndarray | QuantizedArray]] = []
    for i, (layer, spec, key) in enumerate(mine):
        if i >= len(theirs):
            raise GgmlValueError(f"{fn}: the file has {len(theirs)} weight tensors, the model {len(mine)}: '{key}' "
                                 "is missing (another architecture?)")
        name, value = (key, tensors[key]) if by_name else theirs[i]
        if not by_name and name.rsplit(".", 1)[-1] != spec.name:
            raise GgmlValueError(f"{fn}: tensor {i} of the file ('{name}') is not a '{spec.name}' like weight {i} of "
                                 f"the model ('{key}'); the names differ, so weights are matched in order, and this "
                                 "order does not fit (another architecture?)")
        shape = tuple(reversed(spec.ne))
        where = f"tensor {i} of the file ('{name}')" if not by_name else f"the file's '{name}'"
        if strip_leading_ones(value.shape) != strip_leading_ones(shape):
            raise GgmlValueError(f"{fn}: {where} has shape {tuple(value.shape)}, weight '{key}' of the model "
                                 f"{shape} (another architecture?)")
        if isinstance(value, QuantizedArray):   # written as its bytes where the model holds it in its type
            plan.append((layer, spec, value))
            continue
        if not np.issubdtype(value.dtype, np.floating):
            raise GgmlValueError(f"{fn}: {where} holds {value.dtype} values; weights are float (f32, or f16/bf16/f64 "
                                 "converted): the file is not a ggmlpy weights file, or is damaged")
        with np.errstate(over="ignore"):
            arr = np.ascontiguousarray(value, dtype=np.float32).reshape(shape)
        if np.isinf(arr).any() and not np.isinf(value).any():
            raise GgmlValueError(f"{fn}: {where} holds values beyond float32's range")
        plan.append((layer, spec, arr))
    if len(theirs) > len(mine):
        raise GgmlValueError(f"{fn}: the file has {len(theirs)} weight tensors, the model {len(mine)}: "
                             f"'{theirs[len(mine)][0]}' has no place in this model (another architecture?)")
    return plan


def _write(model: Model, plan: list) -> None:
    params = model.runtime.params
    for layer, spec, arr in plan:
        params.write(layer, spec.name, arr)


def ggml_save_model(model: Model, path: Any, include_optimizer: bool = False, quantize: object = None) -> None:
    """Save a compiled model, architecture, compile settings and weights, to one GGUF file that
    ``ggml_load_model`` turns back into a model predicting identically.

    Arguments:
        model: a compiled model.
        path: the file to write.
        include_optimizer: False (the default, ggmlR's behaviour) saves no optimizer state: training a loaded
            model is a warm restart (AdamW's moments start from zero, its bias correction from step 1). True
            also saves the optimizer's state (AdamW's moments per trainable weight, the step count and its
            hyper-parameters; for SGD the step count), so that training resumed from the file follows the same
            trajectory as training that never stopped (also when saved by a callback during a fit). A model
            that has not trained yet saves the fresh state.
        quantize: None (the default: F32 weights, but those the model holds quantized), or a quantized type for
            the file's matrices (``"q8_0"``: blocks of 32 values, 8.5 bits per weight; ``"q4_0"``: 32, 4.5;
            ``"q4_K"``: 256, 4.5; ``"q5_K"``: 256, 5.5; ``"q6_K"``: 256, 6.56; or any of the quantize_* family's
            types), or a dict by layer or weight name for mixed types (``{"dense_1": "q4_K", "head.weight":
            "q8_0"}``; weights it does not name stay F32). The weights quantized are those a quantized model holds
            quantized (``ggml_quantize_model``): matrices its layers multiply or look rows up in, whose rows are
            a whole number of the type's blocks; biases, normalisation weights and statistics, convolution
            kernels stay F32. The file records each tensor's type (any GGUF reader sees it); weights the model
            holds quantized already are saved as they are. ``ggml_load_model`` reads such a file back with its
            weights quantized (or decoded to F32: ``dequantize=True``).

    Example:
        >>> g.ggml_save_model(model, "model.gguf")
        >>> same = g.ggml_load_model("model.gguf")
        >>> g.ggml_save_model(model, "checkpoint.gguf", include_optimizer=True)   # resumable
    """
    compiled(model, "ggml_save_model")
    with model_in_use(model):
        if include_optimizer is True:
            _no_live_trainer(model, "ggml_save_model", "the model's own copy is from before the trainer's steps")
        save_model(model, path, include_optimizer, model.runtime.opt_state.current(), "ggml_save_model", quantize)


def save_model(model: Model, path: Any, include_optimizer: Any, state: dict | None, fn: str,
               quantize: object = None) -> None:
    """``ggml_save_model`` with a given optimizer state (None: the fresh one)."""
    cfg = compiled(model, fn)
    if not isinstance(include_optimizer, bool):
        raise GgmlValueError(f"{fn}: include_optimizer must be True or False, got {include_optimizer!r}")
    unsavable = [layer.name for layer in model.layers if not layer.savable]
    if unsavable:
        raise GgmlValueError(f"{fn}: layer(s) {unsavable} are custom layers, whose forward functions are code that "
                             "a file or a pickle cannot hold. Save the weights with ggml_save_weights, build the "
                             "model again in code (the same layer names) and load them with ggml_load_weights; or "
                             "write the layer as a Layer subclass (docs/guide/models.md), which saves")
    for layer in model.layers:
        check_rebuildable(layer, fn)
    custom = [h.name for h in cfg.heads if h.custom is not None]
    if custom:
        raise GgmlValueError(f"{fn}: output(s) {custom} are trained with custom losses, whose functions are code that "
                             "a file or a pickle cannot hold. Save the weights with ggml_save_weights, compile the "
                             "model again in code with the same loss and load them with ggml_load_weights")
    meta = _metadata(model, "model")
    meta["ggmlpy.model"] = json.dumps(model.architecture())
    meta["ggmlpy.compile"] = json.dumps(cfg.to_dict())
    store = model.runtime.readable()
    tensors = dict(store.named_tensors())
    types = store.quantized_names()   # weights quantized in memory are saved as they are held
    host = packed = None
    if quantize is not None:
        if include_optimizer:
            raise GgmlValueError(f"{fn}: a quantized file is for inference: save it without the optimizer's state "
                                 "(include_optimizer=False), and a full-precision checkpoint to train on")
        plan = {n: t for n, t in quantization_plan(store, quantize, fn).items() if t is not None and n not in types}
        shapes = {n: tuple(t.shape[:max(1, max((i + 1 for i, d in enumerate(t.shape) if d > 1), default=1))])
                  for n, t in tensors.items() if n in plan}
        values = {f"{layer.name}.{p.name}": store.read(layer, p.name) for layer, p in store.specs
                  if f"{layer.name}.{p.name}" in plan}
        packed, quantized = quantized_tensors(values, shapes, plan, fn)
        tensors.update(quantized)
        types.update({n: type_name(t) for n, t in plan.items()})
    if types:
        meta["ggmlpy.quantized"] = json.dumps(types)
    if lora_metadata(model):
        meta[LORA_KEY] = json.dumps(lora_metadata(model))
    try:
        if include_optimizer:
            if state is None:  # never trained: zero moments, step 1 (what the first fit would start from)
                state = _fresh_state(model)
            opt_meta, arrays = _opt_metadata_and_tensors(state)
            meta.update(opt_meta)
            meta.update(_loss_scale_metadata(model))
            host = ggml_init(mem_size=sum(a.size * 4 + ggml_tensor_overhead() + 64 for _, a in arrays) + 1024,
                             no_alloc=False)
            for name, a in arrays:
                a = np.asarray(a, dtype=np.float32)
                ne = tuple(reversed(a.shape)) or (1,)
                t = ggml_set_name(ggml_new_tensor(host, GGML_TYPE_F32, len(ne), ne), name)
                ggml_backend_tensor_set_data(t, a)
                tensors[name] = t
        ggml_save_weights_gguf(path, tensors, meta)
    finally:
        for ctx in (host, packed):
            if ctx is not None:
                ctx.free()


def _fresh_state(model: Model) -> dict:
    cfg = model.compiled
    lr = LrUserdata(cfg.weight_decay)
    if cfg.learning_rate is not None:
        lr.set(adamw_lr=cfg.learning_rate, sgd_lr=cfg.learning_rate)
    if cfg.adam is not None:
        lr.params.adamw.beta1, lr.params.adamw.beta2, lr.params.adamw.eps = cfg.adam
    p = lr.params
    trainable = model.runtime.opt_state.trainable()
    if cfg.optimizer_type == OPTIMIZER_ADAMW:
        zeros = {k: np.zeros(numpy_shape(t), np.float32) for k, t in trainable.items()}
        return {"optimizer": "adamw", "iter": 1, "m": zeros, "v": {k: z.copy() for k, z in zeros.items()},
                "hparams": {"learning_rate": float(p.adamw.alpha), "beta1": float(p.adamw.beta1),
                            "beta2": float(p.adamw.beta2), "eps": float(p.adamw.eps),
                            "weight_decay": float(p.adamw.wd)}}
    spec = cfg.optimizer_spec
    state = {"optimizer": spec.name, "iter": 1, "m": {}, "v": {},
             "hparams": {"learning_rate": float(p.sgd.alpha), "weight_decay": float(p.sgd.wd)}}
    if spec.slots:
        state["slots"] = {slot: {k: np.full(numpy_shape(t), spec.initial(slot), np.float32)
                                 for k, t in trainable.items()} for slot in spec.slots}
    return state


def ggml_load_model(path: Any, backend: str = "auto", include_optimizer: bool = True,
                    custom_objects: dict | None = None, dequantize: bool = False) -> Model:
    """A model saved by ``ggml_save_model``: rebuilt from its architecture, compiled with its saved
    settings on ``backend`` ("auto", "cpu", "vulkan", "cuda" or a device name), with its weights. It predicts
    like the saved model and can be trained further.

    Arguments:
        path: the GGUF file.
        backend: where to put the model (default "auto"); a list of devices trains data-parallel (the file's
            shares apply to the same list of devices).
        include_optimizer: True (the default) takes the optimizer state of a file saved with
            ``include_optimizer=True``: the next ``ggml_fit`` or ``ggml_trainer`` continues the saved training
            exactly (same moments, same step count). A file saved without it, or False here, gives a warm
            restart: the optimizer starts afresh (zero moments, bias correction from step 1), as in ggmlR.
        custom_objects: the layer classes of one's own the model uses, ``{"scaled_dense": ScaledDense}`` (by
            kind or class name), as Keras' ``custom_objects``; a class defined or imported before the call is
            found without it.
        dequantize: for a quantized file (``ggml_save_model(..., quantize=...)``): False (the default) keeps
            its quantized weights quantized in the backend's memory, and the model's products compute on them
            (as ``ggml_quantize_model``: frozen, for inference); True decodes them to F32 weights that train.

    A file saved by ``ggml_save_weights`` has no architecture: build the model and use ``ggml_load_weights``.

    Example:
        >>> model = g.ggml_load_model("checkpoint.gguf", backend="cpu")
        >>> g.ggml_fit(model, x, y, epochs=2)          # continues the saved run
    """
    bool_arg("ggml_load_model", "include_optimizer", include_optimizer)
    bool_arg("ggml_load_model", "dequantize", dequantize)
    tensors, meta = _read(path, "ggml_load_model")
    if meta.get("general.architecture") != "ggmlpy" or "ggmlpy.model" not in meta:
        what = "a weights-only file (ggml_save_weights)" if meta.get("ggmlpy.format") == "weights" else \
            "not a ggmlpy model file"
        raise GgmlValueError(f"ggml_load_model: {os.fspath(path)!r} is {what}: it has no architecture; build the "
                             "model in code and call ggml_load_weights")
    try:  # a damaged file (a flipped byte in the JSON) is a file error, not a JSONDecodeError or KeyError
        model = model_from_architecture(json.loads(meta["ggmlpy.model"]), custom_objects)
        model.graph()  # the layers' shapes (and so their weights' shapes) follow from the input shape
        cfg = json.loads(meta["ggmlpy.compile"])
        settings = {k: cfg[k] for k in ("optimizer", "loss", "metrics", "loss_weights", "learning_rate",
                                        "weight_decay")}
        settings.update({k: cfg[k] for k in ("beta_1", "beta_2", "epsilon") if k in cfg})  # files since Dec 2026
        settings.update({k: cfg[k] for k in OPTIMIZER_SETTINGS + ("from_logits", "precision") if k in cfg})
        if isinstance(backend, (list, tuple)) and cfg.get("shares") and list(backend) == cfg.get("backend"):
            settings["shares"] = cfg["shares"]   # the same devices' split (a pickle's copy; not another backend's)
    except GgmlpyError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
        raise GgufFileError(f"ggml_load_model: {os.fspath(path)!r} holds a damaged model description "
                            f"({type(exc).__name__}: {exc}); save the model again") from None
    weights, state = _split(tensors, meta, "ggml_load_model")
    listed = parse_lora_metadata(meta, f"ggml_load_model: {os.fspath(path)!r}")
    if listed:
        attach_listed(model, listed, "ggml_load_model")
    # the file's tensors against the architecture's weights before anything is allocated for them (a
    # damaged or crafted description could otherwise ask for gigabytes)
    plan = _plan(_specs(model), weights, "ggml_load_model")
    if not dequantize:   # the layers hold the file's quantized types (where they read their weights quantized)
        for layer, spec, value in plan:
            if isinstance(value, QuantizedArray) and can_hold(spec, value.type):
                layer.__dict__.setdefault("_quantized", {})[spec.name] = value.type
    ggml_compile(model, backend=backend, **settings)
    _write(model, plan)
    if include_optimizer and state is not None:
        model.runtime.opt_state.set(state, model.compiled.optimizer_spec, "ggml_load_model")
        _restore_loss_scale(model, meta, path, "ggml_load_model")
    return model


def _loss_scale_metadata(model: Model) -> dict:
    """An F16 model's loss scale and its count of good steps, saved with the optimizer's state."""
    ls = model.runtime.loss_scale
    return {} if ls is None else {"ggmlpy.loss_scale.scale": float(ls.scale),
                                  "ggmlpy.loss_scale.good_steps": np.int64(ls.good_steps)}


def _restore_loss_scale(model: Model, meta: dict, path: str | os.PathLike[str], fn: str) -> None:
    """The saved loss scale into a loaded F16 model (files without one, or of F32 models: nothing)."""
    ls = model.runtime.loss_scale
    if ls is None or "ggmlpy.loss_scale.scale" not in meta:
        return
    scale, good = meta["ggmlpy.loss_scale.scale"], meta.get("ggmlpy.loss_scale.good_steps", 0)
    if not is_real(scale) or not ls.MIN_SCALE <= scale <= ls.MAX_SCALE or not is_int(good) or good < 0:
        raise GgufFileError(f"{fn}: {os.fspath(path)!r} holds a damaged loss scale ({scale!r:.40}, "
                            f"{good!r:.40} good steps); save the model again")
    ls.scale, ls.good_steps = float(scale), int(good)


def _layer(config: dict, custom_objects: dict | None = None) -> Layer:
    config = dict(config)
    cls = layer_class(config.pop("type"), custom_objects)
    for key in ("kernel_size", "strides", "pool_size", "shape"):
        if isinstance(config.get(key), list):
            config[key] = tuple(config[key])
    if isinstance(config.get("layer"), dict):  # a wrapper's inner layer
        config["layer"] = _layer(config["layer"], custom_objects)
    return cls(**config)


def model_from_architecture(arch: dict, custom_objects: dict | None = None) -> Model:
    """Rebuild a model (fresh, uncompiled) from ``Model.architecture()``."""
    if not isinstance(arch, dict) or arch.get("class") not in ("sequential", "functional"):
        raise GgmlTypeError("not a ggmlpy model architecture")
    configs = list(arch["layers"])
    if arch["class"] == "sequential" and configs and arch.get("input_shape"):
        configs[0] = {**configs[0], "input_shape": tuple(arch["input_shape"])}  # a layer is sealed once made
    layers = [_layer(c, custom_objects) for c in configs]
    if arch["class"] == "sequential":
        return Sequential(layers, name=arch.get("name"))
    nodes: list[Node] = []
    for spec in arch["nodes"]:
        if isinstance(spec["layer"], dict):
            inp = _layer(spec["layer"], custom_objects)
            if not isinstance(inp, InputLayer):
                raise GgmlValueError(f"the saved architecture's node of layer type {inp.kind!r} has no inputs")
            nodes.append(Node(inp, [], inp.shape, inp.dtype))
        else:
            layer = layers[spec["layer"]]
            ins = [nodes[i] for i in spec["inputs"]]
            nodes.append(apply_layer(layer, ins if layer.many_inputs is True or len(ins) > 1 else ins[0]))
    return Model([nodes[i] for i in arch["inputs"]], [nodes[i] for i in arch["outputs"]], name=arch.get("name"))
