"""A model's weights in ggml: ``ParamStore`` holds every weight and state tensor of a model's layers in one
buffer on one backend, and decides where each weight starts from (the model's earlier values, another live
model holding the same layer, the values a layer carries, its initializer). When a store is freed, the
layers that no other live store holds take host copies of their weights along (Keras keeps weights in the
layer).
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

import numpy as np

from ..._ffi import lib
from ...backend.backend import Backend
from ...backend.buffer import ggml_backend_alloc_ctx_tensors
from ...backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data, read_bytes, write_array
from ...core.quants import quantize_rows, QuantizedArray
from ...core.types import GGML_TYPE_F32, type_name
from ...errors import GgmlStateError, GgmlTypeError, GgmlValueError
from ...graph.context import ggml_init, ggml_tensor_overhead
from ...graph.objects import Tensor
from ...graph.tensor import ggml_new_tensor, ggml_set_name, new_quantized_tensor, set_trainable
from ..layers.fused import device_computes_quantized
from ..layers.layer import Layer
from ..layers.weight import ParamSpec
from .low_rank import adapters


if TYPE_CHECKING:
    from .model import Model


_stamps = itertools.count(1)  # when a store's weights last changed, in one order for every store


def quantized_types(layer: Layer) -> dict[str, int]:
    """The quantized types ``layer``'s weights are held in, by weight name (``ggml_quantize_model``, a quantized
    file loaded by ``ggml_load_model``): a property of the layer, as Keras' quantization mode is, so the weights
    stay quantized in every model holding the layer."""
    return layer.__dict__.get("_quantized") or {}


def can_hold(spec: ParamSpec, t: int) -> bool:
    """Whether a weight can be held in quantized type ``t``: its layer reads it on quantized data
    (``Weight(quantizable=...)``) and its rows (ne[0]) are whole blocks of the type."""
    return spec.quantizable is not None and spec.ne[0] % int(lib.ggml_blck_size(t)) == 0


def held_type(layer: Layer, spec: ParamSpec, backend: Backend) -> int:
    """The type a weight is held in: the quantized type its layer chose, where the weight can hold it
    (``can_hold``) and the backend's device computes that read; F32 otherwise."""
    t = quantized_types(layer).get(spec.name)
    if t is None or spec.quantizable is None or not can_hold(spec, t):
        return GGML_TYPE_F32
    return t if device_computes_quantized(backend.device, t, spec.quantizable) else GGML_TYPE_F32


class ParamStore:
    """Every weight and state tensor of a model's layers, in one buffer on one backend.

    A weight starts from ``values`` (``values_by_layer()`` of an earlier store, for copies: matched by layer
    object, not just by name, so a new layer never inherits a removed one's weights), else from the newest
    values of the same layer object: those of the live store that changed them last (a sub-model of
    trained layers starts trained; the model's own store when it is compiled again), or the copy the layer
    kept when its last store was freed (a layer popped from one model and added to another, or re-added
    after a compile, takes its weights along, as in Keras), else from its initializer."""

    def __init__(self, layers: Sequence[Layer], backend: Backend, values: dict | None = None,
                 share: bool = True) -> None:
        self.layers = list(layers)
        self.backend = backend
        self.fits_running = 0  # counted by Runtime.use(training=True): layers refuse trainable changes meanwhile
        # the type the layers' matrix products compute in (ggml_compile's precision): the weights stay F32 here
        # and a graph casts them (GraphBuilder.product_weight)
        self.compute_type = GGML_TYPE_F32
        self.shared = False  # True once every weight is written: only then does free() hand them to the layers
        specs = [(each, p) for each in self.layers for p in (each.params or [])]
        self.ctx = ggml_init(mem_size=(len(specs) + 2) * ggml_tensor_overhead(), no_alloc=True)
        self.tensors: dict[tuple[int, str], Tensor] = {}
        self.specs: list[tuple[Layer, Any]] = specs
        self.quantized: dict[tuple[int, str], int] = {}  # the weights held in a quantized type (frozen), by type
        for layer, spec in specs:
            held = held_type(layer, spec, backend)
            if held == GGML_TYPE_F32:
                t = ggml_new_tensor(self.ctx, GGML_TYPE_F32, len(spec.ne), spec.ne)
            else:
                t = new_quantized_tensor(self.ctx, held, spec.ne)
                self.quantized[(id(layer), spec.name)] = held
            ggml_set_name(t, f"{layer.name}.{spec.name}")
            self.tensors[(id(layer), spec.name)] = t
        check_device_can_use(backend, self.tensors.values(), "make the layer smaller, or compile with backend='cpu'")
        self.buffer = ggml_backend_alloc_ctx_tensors(self.ctx, backend) if specs else None
        self.stamp = 0
        for layer, spec in specs:
            value = _kept_value(values, layer, spec)
            if value is None:
                value = _freshest_value(layer, spec, self)
            # a new or reshaped layer starts afresh (``read`` drops the size-1 axes a weight of one output unit
            # has, so shapes are compared without them)
            if value is None or strip_leading_ones(_shape(value)) != strip_leading_ones(tuple(reversed(spec.ne))):
                value = _initial(spec)
            self.write(layer, spec.name, value)
        self.stamp = next(_stamps)  # as fresh as the values it was given
        self.shared = share
        if share:  # snapshots keep their copy to themselves
            for layer in {id(each): each for each, _ in specs}.values():
                stores = layer.__dict__.setdefault("_param_stores", [])
                stores[:] = [r for r in stores if r() is not None] + [weakref.ref(self)]
                layer.__dict__.pop("_kept_values", None)  # this store holds the layer's weights now

    @property
    def alive(self) -> bool:
        return self.ctx.alive

    def _leave_with_layers(self) -> None:
        """Host copies of the weights go with the layer objects that no other live store holds (a popped
        layer, a model dropped by a change), so that the next model holding them starts from them."""
        for layer in {id(each): each for each, _ in self.specs}.values():
            if _fresher_store(layer, self.stamp, self) is not None:
                continue  # a live store has newer values, and hands them on when it goes
            kept = layer.__dict__.get("_kept_values")
            if kept is not None and kept[0] > self.stamp:
                continue
            try:
                layer.__dict__["_kept_values"] = (self.stamp, {p.name: self.value(layer, p.name)
                                                               for p in (layer.params or [])})
            except Exception:  # noqa: BLE001 - a lost device (an RPC server gone) must not keep the store alive
                layer.__dict__.pop("_kept_values", None)

    def touch(self) -> None:
        """The weights changed (a training step, a write): the newest values of their layers are here now."""
        self.stamp = next(_stamps)

    def tensor(self, layer: Layer, name: str) -> Tensor:
        try:
            return self.tensors[(id(layer), name)]
        except KeyError:
            raise GgmlStateError(f"layer '{layer.name}' has no weight '{name}' in this model; was it added "
                                 "after ggml_compile? compile again") from None

    def read(self, layer: Layer, name: str) -> np.ndarray:
        """A weight's values as float32 (a quantized one decoded), in numpy order."""
        value = self.value(layer, name)
        return value.floats() if isinstance(value, QuantizedArray) else value

    def value(self, layer: Layer, name: str) -> np.ndarray | QuantizedArray:
        """A weight's values as held: float32, or a quantized one's bytes (``QuantizedArray``)."""
        t = self.tensor(layer, name)
        shape = tuple(reversed(_ne(t)))
        if (id(layer), name) in self.quantized:
            return QuantizedArray(t.type, read_bytes(t.ptr).tobytes(), shape)
        return ggml_backend_tensor_get_data(t).reshape(shape)

    def read_tensor(self, t: Tensor) -> np.ndarray:
        return ggml_backend_tensor_get_data(t).reshape(-1)

    def write(self, layer: Layer, name: str, value: np.ndarray | QuantizedArray) -> None:
        """Set a weight: float values (quantized by ggml's quantizer for a weight held quantized), or a
        ``QuantizedArray`` copy (its bytes as they are where the types agree)."""
        t = self.tensor(layer, name)
        shape = tuple(reversed(_ne(t)))
        held = self.quantized.get((id(layer), name))
        if isinstance(value, QuantizedArray) and value.type == held:
            write_array(t.ptr, np.frombuffer(value.data, np.uint8))
        else:
            floats = np.asarray(value.floats() if isinstance(value, QuantizedArray) else value, dtype=np.float32)
            if held is None:
                ggml_backend_tensor_set_data(t, floats.reshape(shape))
            elif not np.array_equal(floats.reshape(shape), self.read(layer, name)):   # the held values stay as held
                raw = quantize_rows(held, floats.reshape(-1, shape[-1]), f"the weight '{layer.name}.{name}'")
                write_array(t.ptr, np.frombuffer(raw, np.uint8))
        self.stamp = next(_stamps)

    def values(self) -> dict[str, np.ndarray]:
        """Host copies, keyed "<layer>.<weight>"."""
        return {f"{layer.name}.{p.name}": self.read(layer, p.name) for layer, p in self.specs}

    def values_by_layer(self) -> dict[int, tuple[Layer, dict[str, np.ndarray | QuantizedArray]]]:
        """Host copies keyed by layer object: ``{id(layer): (layer, {weight name: array or QuantizedArray})}``
        (the layer is kept with its values, so its id cannot be taken by a new layer meanwhile)."""
        out: dict[int, tuple[Layer, dict[str, np.ndarray | QuantizedArray]]] = {}
        for layer, p in self.specs:
            out.setdefault(id(layer), (layer, {}))[1][p.name] = self.value(layer, p.name)
        return out

    def quantized_names(self) -> dict[str, str]:
        """The weights held quantized: ``{"<layer>.<weight>": type name}``."""
        names = {(id(layer), p.name): f"{layer.name}.{p.name}" for layer, p in self.specs}
        return {names[key]: type_name(t) for key, t in self.quantized.items()}

    def named_tensors(self) -> dict[str, Tensor]:
        return {f"{layer.name}.{p.name}": self.tensor(layer, p.name) for layer, p in self.specs}

    def synced_tensors(self, every: bool = False) -> list[Tensor]:
        """The tensors a data-parallel step changes, in one order for every replica: the trainable weights and
        the state a forward pass updates (batch-norm running statistics); ``every``: all of them."""
        return [self.tensor(layer, p.name) for layer, p in self.specs if every or not p.trainable or layer.trains(p)]

    def mark_trainable(self) -> int:
        """Flag the weights of trainable layers for ggml's optimizer; returns how many are flagged. A trainable
        layer holding a quantized weight is refused unless it has adapters: ggml's optimizers update F32 weights.
        In a layer with low-rank adapters
        only the adapters' factors train (network/low_rank.py)."""
        held = [f"{layer.name}.{spec.name} ({type_name(self.quantized[(id(layer), spec.name)])})"
                for layer, spec in self.specs
                if layer.trainable and (id(layer), spec.name) in self.quantized and not adapters(layer)]
        if held:
            raise GgmlValueError(f"the model's weights {held} are quantized, and ggml trains F32 weights only; freeze "
                                 "their layers (layer.trainable = False) to train the others, add low-rank adapters "
                                 "to train (ggml_add_lora), or train a full-"
                                 "precision model (ggml_load_model(path, dequantize=True) decodes a quantized file)")
        n = 0
        for layer, spec in self.specs:
            on = layer.trains(spec)
            set_trainable(self.tensor(layer, spec.name), on)
            n += on
        return n

    def copy(self) -> ParamStore:
        """A private copy of the weights (a trainer's snapshot), computing its products as this store does."""
        store = ParamStore(self.layers, self.backend, self.values_by_layer(), share=False)
        store.compute_type = self.compute_type
        return store

    def free(self) -> None:
        if self.alive and self.buffer is not None and self.shared:
            self._leave_with_layers()
        if self.buffer is not None:
            self.buffer.free()
        self.ctx.free()


def check_device_can_use(backend: Backend, tensors: Any, fix: str) -> None:
    """Tensors the model layer puts in a GPU's memory itself (weights, a graph's inputs) must be ones the device
    can compute with: a tensor beyond its largest buffer (Vulkan's storage-buffer range: 128 MiB on lavapipe)
    cannot be moved to the CPU by the scheduler once allocated there, and ggml aborts at the first compute."""
    if backend.is_cpu:
        return
    for t in tensors:
        if not lib.ggml_backend_supports_op(backend.ptr, t.ptr):
            raise GgmlValueError(f"'{t.name}' (ne {list(t.shape)}, {t.nbytes()} bytes) is more than {backend.name} "
                                 "can use as one tensor (ggml_backend_supports_op: beyond the device's largest "
                                 f"buffer), and ggml would abort computing with it; {fix}")


def strip_leading_ones(shape: Sequence[int]) -> tuple[int, ...]:
    """A numpy shape without its leading 1-axes (how ggml-layout arrays come back from a file)."""
    shape = tuple(int(n) for n in shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def _shape(value: np.ndarray | QuantizedArray) -> tuple[int, ...]:
    return value.shape if isinstance(value, QuantizedArray) else np.shape(value)


def _kept_value(values: dict | None, layer: Layer, spec: ParamSpec) -> np.ndarray | QuantizedArray | None:
    entry = values.get(id(layer)) if values else None
    return entry[1].get(spec.name) if entry is not None and entry[0] is layer else None


def _fresher_store(layer: Layer, stamp: int, me: ParamStore | None) -> ParamStore | None:
    """The live store (of another model) holding ``layer`` whose weights changed last, if after ``stamp``."""
    best = None
    for ref in layer.__dict__.get("_param_stores", []):
        store = ref()
        if store is not None and store is not me and store.alive and store.shared and store.stamp > stamp \
                and (best is None or store.stamp > best.stamp):
            best = store
    return best


def _freshest_value(layer: Layer, spec: ParamSpec, me: ParamStore) -> np.ndarray | QuantizedArray | None:
    """The weight's newest value: in the live store that changed it last, or the copy the layer kept when
    its last store went (a popped layer, a model changed or compiled again), whichever is newer. A layer
    shared by several models is one set of weights, as in Keras: the last one trained is what counts."""
    kept = layer.__dict__.get("_kept_values")
    store = _fresher_store(layer, kept[0] if kept is not None else 0, me)
    if store is not None and (id(layer), spec.name) in store.tensors:
        return store.value(layer, spec.name)
    return kept[1].get(spec.name) if kept is not None else None


def _initial(spec: Any) -> np.ndarray:
    try:
        return spec.initial(np.random)
    except MemoryError:
        raise GgmlValueError(f"the initial values of weight '{spec.name}' ({int(np.prod(spec.ne)):,} values) do not "
                             "fit in memory; make the layer smaller") from None


def _ne(t: Tensor) -> tuple[int, ...]:
    ne = list(t.shape)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)


@dataclass(frozen=True)
class WeightsCopy:
    """What ``ModelWeights.get`` returns: a copy of the weights of one weight store, by layer and weight name."""
    params: ParamStore
    values: list[tuple[Layer, str, np.ndarray | QuantizedArray]]


class ModelWeights:
    """A compiled model's weights as a fit's callbacks snapshot and restore them (early stopping's
    ``restore_best_weights``): ``get()`` copies every weight to the host (batch norm's running statistics
    included, the optimizer's moments not, as Keras), ``set(snapshot)`` writes such a copy back."""

    def __init__(self, model: Model) -> None:
        self._model = model

    def get(self) -> WeightsCopy:
        params = self._model.runtime.params
        return WeightsCopy(params, [(layer, spec.name, params.value(layer, spec.name)) for layer, spec in params.specs])

    def set(self, snapshot: object) -> None:
        if not isinstance(snapshot, WeightsCopy):
            raise GgmlTypeError(f"weights.set takes what weights.get() returned, got {type(snapshot).__name__}")
        params, values = snapshot.params, snapshot.values
        if params is not self._model.runtime.params:
            raise GgmlStateError("these weights were copied before the model was compiled again; they no longer "
                                 "fit its weights")
        for layer, name, value in values:
            params.write(layer, name, value)
        # data-parallel replicas get them now: the fit's steps (and its end) take every replica to be in step
        self._model.runtime.sync_replicas()
