"""The layer base: what every layer is (``Layer``: its name, arguments, declared weights and hooks), the registry of
layer classes by kind and the config read from their constructors, layer names, activations and per-sample shapes."""
from __future__ import annotations

import importlib
import inspect
import itertools
import json
import math
import pkgutil
import re
import sys
import weakref
from collections.abc import Sequence
from typing import Any, Protocol, TYPE_CHECKING, TypedDict, TypeVar

import numpy as np

from ...core.args import bool_arg, is_int, positive_int_arg
from ...errors import GgmlInUseError, GgmlStateError, GgmlTypeError, GgmlValueError
from ...graph.objects import Context, Tensor
from .activations import ACTIVATIONS
from .regularizers import regularizer_arg
from .weight import BoundWeight, ParamSpec, Weight


if TYPE_CHECKING:

    from ...backend.backend import Backend
    from ...training.config import StepHook


NATURAL, SPATIAL = "natural", "spatial"


class WeightStore(Protocol):
    """What layers read of a model's weights (``weights.ParamStore``): the backend they are on."""
    @property
    def backend(self) -> Backend: ...


class Builder(Protocol):
    """What a layer's ``forward`` builds its ops with (``runtime.GraphBuilder``): the context, the batch size,
    whether the graph trains, the layer's weights, constants, dropout, inputs that a hook writes before each step
    (``step_input``, ``on_train_step``), and the input's padding mask."""
    ctx: Context
    batch: int
    training: bool
    strip_softmax: bool
    input_mask: Tensor | None

    @property
    def params(self) -> WeightStore: ...

    def param(self, layer: Layer, weight: BoundWeight | str) -> Tensor: ...
    @property
    def half_products(self) -> bool: ...
    def product_weight(self, layer: Layer, weight: BoundWeight | str, ne: tuple[int, ...] | None = None) -> Tensor: ...
    def product(self, layer: Layer, weight: BoundWeight | str, x: Tensor,
                ne: tuple[int, ...] | None = None) -> Tensor: ...
    def zeros(self, ne: tuple[int, ...]) -> Tensor: ...
    def constant(self, values: np.ndarray) -> Tensor: ...
    def shape_target(self, ne: tuple[int, ...]) -> Tensor: ...
    def dropout(self, x: Tensor, rate: float) -> Tensor: ...
    def side_output(self, t: Tensor) -> None: ...
    def note_relu(self, out: Tensor, x: Tensor) -> None: ...
    def note(self, text: str) -> None: ...
    def relu_input(self, t: Tensor) -> Tensor | None: ...
    def on_train_step(self, hook: StepHook) -> None: ...
    def step_input(self, ne: tuple[int, ...], name: str, dtype: str = "float32") -> Tensor: ...
    def convert(self, t: Tensor, shape: tuple[int, ...], src: str, dst: str) -> Tensor: ...


class LayerOptions(TypedDict, total=False):
    """The keyword arguments every layer takes (``Layer.__init__``), and the regularizers of those that have
    weights (a Keras spec: ``"l2"``, ``ggml_regularizer_l1(0.01)``, ...; ``REGULARIZED`` says which)."""
    name: str | None
    trainable: bool
    input_shape: int | Sequence[int | None] | None
    kernel_regularizer: object
    bias_regularizer: object
    recurrent_regularizer: object
    embeddings_regularizer: object
MAX_NAME = 40  # GGUF/ggml tensor names are at most 63 bytes: "<layer name>.<weight>"

def sample_shape(shape: Any, what: str = "input_shape", variable: bool = False) -> tuple[int, ...]:
    """A per-sample shape: a tuple of 1 to 3 positive ints (an int means (int,)); with ``variable``, a size may be
    None (Keras' variable size: a sequence's length, an image's height), fixed by the data of each call."""
    if is_int(shape):
        shape = (shape,)
    sizes = "positive ints, or None for a size that varies with the data" if variable else "positive ints"
    if not isinstance(shape, (tuple, list)) or not 1 <= len(shape) <= 3 or \
            any(n is not None and (not is_int(n) or n < 1) for n in shape):
        raise GgmlValueError(f"{what} must be a tuple of 1 to 3 sizes, {sizes} (one sample, no batch axis), "
                             f"got {shape!r}")
    if any(n is None for n in shape) and not variable:
        raise GgmlValueError(f"{what} {tuple(shape)!r} leaves a size open (None): only a model's inputs may "
                             "(ggml_input(shape=(None, ...)), or the first layer's input_shape); give every size "
                             "here")
    out = tuple(None if n is None else positive_int_arg(None, what, n) for n in shape)
    fixed = math.prod(n for n in out if n is not None)
    if fixed > MAX_SAMPLE_VALUES:
        raise GgmlValueError(f"{what} {out} holds {fixed:,} values per sample, more than ggml's tensors can "
                             f"hold for a batch (at most {MAX_SAMPLE_VALUES:,} per sample)")
    return out  # type: ignore[return-value]  # None only where ``variable`` allows it


def is_variable(shape: tuple) -> bool:
    """Whether a sample shape has a variable size (None)."""
    return any(n is None for n in shape)


def _fmt_shapes(shapes: list[tuple]) -> str:
    return ", ".join("(" + ", ".join(str(n) for n in s) + ("," if len(s) == 1 else "") + ")" for s in shapes)


# A variable size (None) is stood in for by each of these sizes in turn when a layer is applied (those the layer
# takes: a kernel longer than the small ones, a position embedding of fewer steps than the large ones): an output
# size that differs between them is variable too, and a weight whose shape differs is refused. Primes up to far
# beyond a stride or a kernel, so that no stride or pooling maps them all to one size.
VARIABLE_PROBES = (2, 3, 5, 7, 67, 131, 1021, 4093, 65521, 262139)


MAX_SAMPLE_VALUES = 1 << 40  # with a batch axis beside it, ggml's int64 element counts stay far from overflow


def natural_ne(shape: tuple[int, ...], batch: int) -> tuple[int, ...]:
    """ggml shape of a batch of samples of ``shape`` in the user's orientation."""
    return tuple(reversed(shape)) + (batch,)


_global_counts: dict[str, itertools.count] = {}
_names_in_use: dict[str, weakref.WeakSet[Layer]] = {}


def next_global_name(kind: str) -> str:
    """A name for a layer made outside a sequential model: the session-wide count of its kind, skipping the
    names live layers have (a sequential model's "dense_1", a loaded or unpickled model's), so that reusing
    a model's layers beside new ones (Keras' transfer-learning pattern) never makes two layers of one name."""
    counter = _global_counts.setdefault(kind, itertools.count(1))
    while True:
        name = f"{kind}_{next(counter)}"
        if not _names_in_use.get(name):
            return name


def _note_name(name: str, layer: Layer) -> None:
    holders = _names_in_use.get(name)
    if holders is None:
        holders = _names_in_use[name] = weakref.WeakSet()
    holders.add(layer)


def give_automatic_name(layer: Layer, name: str) -> None:
    layer.name = name


def layer_name_arg(name: Any) -> str:
    if (not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME
            or not name.replace("_", "").replace("-", "").isalnum()):
        raise GgmlValueError(f"a layer name must be letters, digits, '_' or '-', 1 to {MAX_NAME} bytes in UTF-8 "
                             f"(ggml's tensor names hold 63 bytes), got {name!r}")
    return name


L = TypeVar("L")


class _Sealed(type):
    """Seals each layer once its constructor returns: its arguments were checked there, and the graphs
    built from them (cached per batch size) must not change under the user."""

    def __call__(cls: type[L], *args: object, **kwargs: object) -> L:
        if cls.__dict__.get("_abstract"):
            raise GgmlTypeError(f"{cls.__name__} is a base of layers, not a layer to use; make one of its "
                                "subclasses")
        layer: L = type.__call__(cls, *args, **kwargs)
        if "regularizers" not in vars(layer):  # Layer.__init__ sets it (with the name and the weights' slots)
            raise GgmlTypeError(f"{cls.__name__}.__init__ did not call super().__init__(**kw): the layer has no name "
                                "or weights yet; call it first, passing on the keyword arguments it does not take")
        object.__setattr__(layer, "_sealed", True)
        return layer


LAYER_TYPES: dict[str, type[Layer]] = {}  # kind -> class: every concrete layer class, registered as it is made
_KIND = re.compile(r"[a-z][a-z0-9_]{0,29}")


def _snake_case(name: str) -> str:
    """``ScaledDense`` -> "scaled_dense", ``MyLSTM`` -> "my_lstm"."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _register(cls: type[Layer]) -> None:
    kind = cls.kind
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise GgmlValueError(f"layer class {cls.__qualname__}: kind must be lower-case letters, digits and '_', "
                             f"starting with a letter, at most 30 characters (the stem of its layers' names), got "
                             f"{kind!r}")
    old = LAYER_TYPES.get(kind)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise GgmlValueError(f"layer class {cls.__module__}.{cls.__qualname__}: the kind {kind!r} is taken by "
                             f"{old.__module__}.{old.__qualname__}, and a saved model names its layers' classes "
                             f"by kind; give the class a kind of its own (kind = \"my_{kind}\")")
    LAYER_TYPES[kind] = cls   # a class defined again (a notebook cell run twice) replaces its earlier self


_ARGUMENTS: dict[type, tuple[tuple[str, ...], bool]] = {}  # class -> (its config's arguments, takes *args)
BASE_ARGUMENTS = ("name", "trainable", "input_shape")
# what a layer object holds for the base class: a constructor argument of one of these names would overwrite it
RESERVED = frozenset({"params", "built_for", "regularizers", "kind", "layout", "out_layout", "many_inputs",
                      "takes_int", "savable", "builder_functions", "mask_support", "makes_mask", "NOT_SAVED",
                      "REGULARIZED", "WEIGHTS"})


def _constructors(cls: type) -> list:
    """The ``__init__`` functions a layer's construction runs through while each passes ``**kw`` on: the class's
    own (or the nearest base's), then its base's, up to (not including) ``Layer.__init__``."""
    out = []
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        if klass is Layer:
            break
        out.append(init)
        params = inspect.signature(init).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return out


def constructor_arguments(cls: type[Layer]) -> tuple[str, ...]:
    """The arguments of a layer class's constructor that its config holds: its named ones, and those of the
    base constructors it passes ``**kw`` on to (a subclass of ``Dense`` keeps ``activation``), but the ones every
    layer takes (``BASE_ARGUMENTS``)."""
    if cls not in _ARGUMENTS:
        names: list[str] = []
        star = False
        for init in _constructors(cls):
            for p in list(inspect.signature(init).parameters.values())[1:]:
                star = star or p.kind is p.VAR_POSITIONAL
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in BASE_ARGUMENTS + tuple(names):
                    names.append(p.name)
        _ARGUMENTS[cls] = (tuple(names), star)
    return _ARGUMENTS[cls][0]


def _takes_star_args(cls: type[Layer]) -> bool:
    constructor_arguments(cls)
    return _ARGUMENTS[cls][1]


def _check_arguments(cls: type[Layer]) -> None:
    """Refuse, when the class is made, constructor arguments that would overwrite what the base class keeps, and
    ``when=`` settings that name no argument."""
    if "__init__" in vars(cls):
        taken = sorted(set(constructor_arguments(cls)) & RESERVED)
        if taken:
            raise GgmlValueError(f"layer class {cls.__qualname__}: the constructor argument {taken[0]!r} would "
                                 f"overwrite the layer's own {taken[0]!r} (the base class keeps it); give the "
                                 "argument another name")
    for w in cls.WEIGHTS.values():
        if w.when is not None and w.when not in constructor_arguments(cls) and not hasattr(cls, w.when):
            raise GgmlValueError(f"layer class {cls.__qualname__}: Weight {w.name!r} has when={w.when!r}, which is "
                                 f"not a constructor argument (they are {list(constructor_arguments(cls))})")


class Layer(metaclass=_Sealed):
    """A layer: ggmlR's arguments (its constructor's, checked there and saved as its ``config``), the
    weights it declares (``Weight`` class attributes), built once for the first input shape, and a
    forward pass. Applying one layer object to several nodes shares its weights.

    Every concrete subclass is registered under its ``kind`` when its class statement runs (``LAYER_TYPES``):
    that is how a saved model finds the class again. A built-in layer of ``ggmlpy.models.layers`` also gets
    its two public functions from the class (``ggml_layer_<kind>`` and ``ggml_<kind>``, their help from the
    class docstring and the constructor's signature). A user's layer is a subclass like any built-in:
    without a ``kind`` of its own it takes its class name in snake case (``ScaledDense`` -> "scaled_dense").
    A base class that is not a layer by itself says ``class Base(Layer, abstract=True)``.

    After construction only ``trainable`` can change (True or False, not while a fit of a model holding
    the layer runs), and ``name`` can be given once if the layer has none; every other argument is fixed:
    make a new layer instead."""

    kind = "layer"        # ggmlR's type name, also the stem of default names ("dense_1")
    layout = NATURAL      # the ggml layout the forward pass reads
    out_layout: str | None = None  # the layout it returns (None: the same)
    many_inputs: bool | str = False   # add / concatenate take a list of nodes; "either": one node or a list
    takes_int: bool | str = False   # embedding: int32 token ids in; "either": ids or floats (a custom layer)
    savable = True        # its config rebuilds it (a custom layer's forward function does not)
    # a built-in: the package makes ggml_layer_<kind> and ggml_<kind> from the class ("layer": the first only)
    builder_functions: bool | str = True
    NOT_SAVED: tuple[str, ...] = ()  # constructor arguments that only stand for another (Keras 2's input_dim)
    # derived from the declared weights (__init_subclass__): Keras' regularizer argument -> the weight it
    # penalises, and the weights by name
    REGULARIZED: dict[str, str] = {}
    WEIGHTS: dict[str, Weight] = {}
    # what the layer does with a padding mask on its input (masking.py): "propagate" it, "consume" it, or
    # "none": a mask reaching it is refused, as in Keras
    mask_support = "none"
    _abstract = True

    def __init_subclass__(cls, abstract: bool = False, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._abstract = abstract
        cls.WEIGHTS = {w.name: w for klass in reversed(cls.__mro__) for w in vars(klass).values()
                       if isinstance(w, Weight) and w.name is not None}
        cls.REGULARIZED = {w.regularizer: w.name for w in cls.WEIGHTS.values() if w.regularizer and w.name}
        own = [w.name for w in vars(cls).values() if isinstance(w, Weight) and w.name]
        clash = {n for n in own if own.count(n) > 1}
        if clash:
            raise GgmlValueError(f"layer class {cls.__qualname__}: two Weight attributes name the weight "
                                 f"{sorted(clash)[0]!r}; each weight needs a name of its own")
        if abstract:
            return
        _check_arguments(cls)
        if "kind" not in vars(cls):
            cls.kind = _snake_case(cls.__name__)
            cls.builder_functions = False
        _register(cls)

    def __init__(self, name: str | None = None, trainable: bool = True, input_shape: Any = None,
                 **regularizers: Any) -> None:
        unknown = sorted(set(regularizers) - set(self.REGULARIZED))
        if unknown:
            raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument '{unknown[0]}'")
        # weight name -> Regularizer, for the ones given (a penalty of 0 is none)
        self.regularizers = {self.REGULARIZED[k]: r for k, v in regularizers.items()
                             if (r := regularizer_arg(v, f"{self.kind} {k}")) is not None}
        self.name = None if name is None else layer_name_arg(name)
        self.trainable = bool_arg(None, "trainable", trainable)
        self.input_shape = sample_shape(input_shape, variable=True) if input_shape is not None else None
        self.params: list[ParamSpec] | None = None   # set by build()
        self.built_for: list[tuple[int, ...]] | None = None

    # ---- what subclasses define
    def config(self) -> dict:
        """The layer's arguments, saved with the model and given back to the constructor when it loads: each
        argument of the constructor, read from the attribute of the same name (a tuple as a list), but
        ``name``, ``trainable``, ``input_shape`` and the regularizers (``full_config`` adds those) and the
        ``NOT_SAVED`` ones. A layer whose constructor keeps an argument under another name, or in another
        form, says so by defining ``config``."""
        out = {}
        if _takes_star_args(type(self)):
            raise GgmlValueError(f"layer '{self.name}' ({type(self).__qualname__}): a constructor that takes *args "
                                 "cannot be called again from a saved config; take named arguments, or define "
                                 "config() and a constructor that takes what it returns by name")
        for arg in constructor_arguments(type(self)):
            if arg not in self.NOT_SAVED:
                if arg not in self.__dict__ and not hasattr(type(self), arg):
                    cls = type(self).__qualname__
                    raise GgmlValueError(f"layer '{self.name}' ({cls}): its constructor argument {arg!r} is not kept "
                                         f"in an attribute of that name, so its config cannot be read; keep it "
                                         f"(self.{arg} = {arg}), list it in NOT_SAVED if another argument stands "
                                         f"for it, or define {cls}.config() to return the constructor's arguments")
                value = getattr(self, arg)
                out[arg] = list(value) if isinstance(value, tuple) else value
        return out

    def output_shape(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        return shapes[0]

    def make_params(self, shapes: list[tuple[int, ...]]) -> list[ParamSpec]:
        return []

    def forward(self, g: Builder, xs: list[Tensor], shapes: list[tuple[int, ...]]) -> Tensor:
        raise NotImplementedError

    def graph_tensors(self, shapes: list[tuple[int, ...]]) -> int:
        """An upper bound of the ggml tensors ``forward`` creates (sizes the graph's context)."""
        return 96

    def graph_constants(self, shapes: list[tuple[int, ...]]) -> int:
        """An upper bound of the constants (``g.constant``, ``g.zeros``) ``forward`` creates beyond a few."""
        return 0

    def predict_forward(self, g: Builder, xs: list[Tensor], shapes: list[tuple[int, ...]]) -> Tensor:
        """The inference pass (dropout and batch norm differ from training)."""
        return self.forward(g, xs, shapes)

    @property
    def passes_mask(self) -> bool:
        """Whether a padding mask on the input is one on the output too (its steps kept)."""
        return self.mask_support == "propagate"

    def dropout_seeds(self) -> int:
        """How many dropout masks the layer draws per training step (each needs a seed of the graph's)."""
        return 0

    makes_mask = False  # a masking layer, an embedding with mask_zero: its output_mask starts a padding mask

    def output_mask(self, g: Builder, in_mask: Tensor | None, xs: list[Tensor], out: Tensor) -> Tensor | None:
        """The padding mask of the output (``[1, steps, N]``) when ``passes_mask`` or ``makes_mask``: the
        input's by default."""
        return in_mask

    # ---- sealing
    _BOOKKEEPING = frozenset({"params", "built_for"})

    def __setattr__(self, key: str, value: Any) -> None:
        if self.__dict__.get("_sealed") and not key.startswith("_") and key not in self._BOOKKEEPING:
            value = self._changed(key, value)
        object.__setattr__(self, key, value)
        if key == "name" and value is not None:
            _note_name(value, self)

    def __setstate__(self, state: dict) -> None:
        if state.get("_kept_values") is not None:  # stamps count in the process that made them: older than any here
            state = {**state, "_kept_values": (0, state["_kept_values"][1])}
        self.__dict__.update(state)  # unpickled: its name is in use too
        if state.get("name") is not None:
            _note_name(state["name"], self)

    def __delattr__(self, key: str) -> None:
        if self.__dict__.get("_sealed") and not key.startswith("_"):
            raise GgmlStateError(f"layer '{self.name}': {key} cannot be deleted")
        object.__delattr__(self, key)

    def _changed(self, key: str, value: Any) -> Any:
        if key == "trainable":
            value = bool_arg(None, "trainable", value)
            if value != self.trainable and self.in_running_fit():
                raise GgmlInUseError(f"layer '{self.name}': trainable cannot change while a fit of a model holding "
                                     "it runs (this call comes from one of its callbacks or generators, or from "
                                     "another thread); freeze or unfreeze layers before the fit or after it returns")
            return value
        if key == "name" and self.__dict__.get("name") is None:
            return layer_name_arg(value)
        if key == "name":
            raise GgmlStateError(f"layer '{self.name}' is named already, and its name names its weights "
                                 f"('{self.name}.<weight>' in saved files and ggml_get_weights); give the name when "
                                 "making the layer (name=...)")
        raise GgmlStateError(f"layer '{self.name}' ({self.kind}): {key} cannot change after the layer is made (the "
                             "layer's graphs and weights are built from it); make a new layer with "
                             f"{key}={value!r}")

    def __getstate__(self) -> dict:
        # pickled (a model sent to a worker): the weak links to live weight stores stay in this process, and
        # the newest weights go along (those of the live store that changed them last, if newer than the copy
        # the layer carries), so an uncompiled sub-model of trained layers arrives trained
        state = {k: v for k, v in self.__dict__.items() if k != "_param_stores"}
        stores = [ref() for ref in self.__dict__.get("_param_stores", [])]
        live = [s for s in stores if s is not None and s.alive and s.shared]
        newest = max(live, key=lambda s: s.stamp, default=None)
        kept = state.get("_kept_values")
        if newest is not None and (kept is None or newest.stamp > kept[0]):
            state["_kept_values"] = (newest.stamp, {p.name: newest.read(self, p.name) for p in self.params or []})
        return state

    def in_running_fit(self) -> bool:
        """Whether a fit of some model holding this layer's weights runs now."""
        return any(getattr(ref(), "fits_running", 0) for ref in self.__dict__.get("_param_stores", []))

    # ---- shared machinery
    def build(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        """Check the input shapes, make the weights on first use, return the output shape (None where a size is
        variable: ``variable_build``)."""
        if any(is_variable(s) for s in shapes):
            out, specs = self.variable_build(shapes)
        else:
            out, specs = self.output_shape(shapes), None
        if self.built_for is None:
            self.params = specs if specs is not None else self.weight_specs(shapes)
            self.built_for = list(shapes)
        elif list(shapes) != self.built_for:
            raise GgmlValueError(f"layer '{self.name}' was built for input shape(s) {self.built_for} and is now "
                                 f"applied to {list(shapes)}; a shared layer needs inputs of one shape")
        return out

    def shape_of(self, shapes: list[tuple]) -> tuple:
        """The output shape for input ``shapes`` (None where a size is variable), checked without building."""
        return self.variable_build(shapes)[0] if any(is_variable(s) for s in shapes) else self.output_shape(shapes)

    def variable_build(self, shapes: list[tuple]) -> tuple[tuple, list[ParamSpec]]:
        """The output shape and the weights for input shapes with variable sizes (None), from the layer applied to
        each of ``VARIABLE_PROBES`` in their place (those it accepts: a kernel longer than the small ones, a position
        embedding of fewer steps than the large ones): the weights must not depend on them, and an output size that
        does is variable."""
        outs, specs, refusals = [], [], []
        for probe in VARIABLE_PROBES:
            concrete = [tuple(probe if n is None else n for n in s) for s in shapes]
            try:
                out, spec = tuple(self.output_shape(concrete)), self.weight_specs(concrete)
            except GgmlValueError as e:
                refusals.append(e)
                continue
            outs.append(out)
            specs.append(spec)
        if len(outs) < 2:
            raise GgmlValueError(f"{refusals[-1]} (layer '{self.name}' applied to {_fmt_shapes(shapes)}: of the sizes "
                                 f"from {VARIABLE_PROBES[0]} to {VARIABLE_PROBES[-1]:,} tried for the variable size "
                                 f"(None), it takes {'one' if outs else 'none'}; give the input a fixed size)")
        if any([(p.name, p.ne) for p in spec] != [(p.name, p.ne) for p in specs[0]] for spec in specs[1:]):
            raise GgmlValueError(f"layer '{self.name}' ({self.kind}) is applied to {_fmt_shapes(shapes)}: the shapes "
                                 "of its weights would depend on the variable size (None), which changes with the "
                                 "data. Reduce that axis first (a global pooling layer, a recurrent layer without "
                                 "return_sequences, a time-distributed layer), or give the input a fixed size")
        if any(len(out) != len(outs[0]) for out in outs):
            raise GgmlValueError(f"layer '{self.name}' ({self.kind}): its output's rank depends on the variable size "
                                 f"(None) of {_fmt_shapes(shapes)}; give the input a fixed size")
        return tuple(sizes[0] if len(set(sizes)) == 1 else None for sizes in zip(*outs)), specs[0]

    def weight_specs(self, shapes: list[tuple[int, ...]]) -> list[ParamSpec]:
        """The weights the layer has for these input shapes: ``make_params``' that are present."""
        return [p for p in self.make_params(shapes) if self._has_weight(p.name)]

    def _has_weight(self, name: str) -> bool:
        """Whether a weight ``make_params`` gave is one the layer has: declared (for a class that declares
        its weights) and present (its ``when`` argument true)."""
        if not self.WEIGHTS:
            return True   # a custom layer's weights are the user's data (custom.py), a wrapper's its inner layer's
        weight = self.WEIGHTS.get(name)
        if weight is None:
            raise GgmlTypeError(f"{type(self).__name__}.make_params gave a weight {name!r} the class does not declare "
                                f"(it declares {sorted(self.WEIGHTS)}); declare it as a class attribute: "
                                f"{name} = Weight()")
        return weight.when is None or bool(getattr(self, weight.when))

    def trains(self, spec: ParamSpec) -> bool:
        """Whether the optimizer updates this weight of the layer: the layer is trainable and the weight is not
        state the layer updates itself, and where the layer has low-rank adapters (``ggml_add_lora``), only their
        factors train (network/low_rank.py)."""
        return self.trainable and spec.trainable and (spec.adapts is not None or not self.__dict__.get("_lora"))

    def n_params(self, trainable_only: bool = False) -> int:
        return sum(int(np.prod(p.ne)) for p in (self.params or [])
                   if (p.trainable and not trainable_only) or self.trains(p))

    def full_config(self) -> dict:
        regs = {arg: self.regularizers[w].config() for arg, w in self.REGULARIZED.items() if w in self.regularizers}
        return {"type": self.kind, "name": self.name, "trainable": self.trainable, **self.config(), **regs}

    def __repr__(self) -> str:
        try:
            args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        except GgmlValueError:  # a subclass whose config cannot be read still prints (saving says why)
            args = ""
        return f"<{self.kind} '{self.name}'{': ' + args if args else ''}>"


def activate(g: Builder, t: Tensor, activation: str | None) -> Tensor:
    """``activation(t)``; a final softmax is left to the loss when training with ggml's fused cross-entropy."""
    fn = ACTIVATIONS[activation]
    if fn is None or (activation == "softmax" and g.strip_softmax):
        return t
    out = fn(g.ctx, t)
    if activation == "relu":
        g.note_relu(out, t)
    return out


def layer_class(kind: object, custom_objects: object = None) -> type[Layer]:
    """The layer class a saved architecture names by ``kind``: one of ``custom_objects`` (``{kind or class
    name: class}``, Keras' argument), else a registered class (every built-in, and every subclass defined or
    imported in this process)."""
    if custom_objects is not None:
        if not isinstance(custom_objects, dict) or not all(
                isinstance(k, str) and isinstance(c, type) and issubclass(c, Layer) for k, c in custom_objects.items()):
            raise GgmlTypeError(f"custom_objects must be a dict {{name: Layer subclass}} (the name its kind or its "
                                f"class name), got {custom_objects!r:.100}")
        for key, cls in custom_objects.items():
            if kind in (key, cls.kind):
                return cls
    import_built_ins()
    cls = LAYER_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise GgmlValueError(f"the saved architecture has a layer of kind {kind!r}, which no layer class here has: a "
                             "layer class of your own must be defined or imported before loading, or given as "
                             f"custom_objects={{{kind!r}: TheClass}}")
    return cls


def import_built_ins() -> None:
    """Import every module of this package, so that every built-in layer class is registered."""
    package = __name__.rpartition(".")[0]
    for module in pkgutil.iter_modules(sys.modules[package].__path__):
        importlib.import_module(f"{package}.{module.name}")


def check_rebuildable(layer: Layer, fn: str) -> None:
    """Refuse to save a layer its saved config cannot rebuild: arguments its constructor does not take, or
    values that are not plain data (a subclass of one's own whose ``config`` does not match its constructor)."""
    config = layer.full_config()
    del config["type"]
    cls = type(layer)
    try:
        inspect.signature(cls.__init__).bind(layer, **config)
        json.dumps(config)
    except (TypeError, ValueError) as exc:
        raise GgmlValueError(f"{fn}: layer '{layer.name}' ({cls.__qualname__}) saves the config {config!r:.200}, "
                             f"which its constructor {cls.__qualname__}{inspect.signature(cls.__init__)} cannot be "
                             f"called with from a file ({exc}); keep each constructor argument in an attribute of its "
                             "name (as plain data: numbers, strings, lists, dicts), or define config() to return them"
                             ) from None
