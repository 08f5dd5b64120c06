"""A layer's weights as its class declares them: ``Weight`` (one class attribute per weight: its name,
initializer, regularizer, trainability, orientation, presence), ``BoundWeight`` (a declaration as one layer has
it) and ``ParamSpec`` (one weight for one build: its ggml shape and starting values)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import overload, Protocol

import numpy as np

from ...errors import GgmlValueError
from .initializers import check_weight_initializer, initial_values


# how a layer may read a quantized weight (the op that reads it: ggml_mul_mat's first operand, ggml_get_rows)
QUANTIZABLE = (None, "product", "rows")


class Owner(Protocol):
    """What a weight's declaration reads of the layer that has it (``layer.Layer``): its name; ``when=`` and
    ``initializer_arg=`` name its other attributes."""
    name: str | None


@dataclass
class ParamSpec:
    """One weight of a layer: its ggml shape, how it starts and whether the optimizer trains it."""
    name: str                  # "weight", "bias", "kernel", "gamma", "running_mean", ...
    ne: tuple[int, ...]        # ggml shape
    init: str                  # "glorot", "zeros", "ones", "embedding", "orthogonal", "unit_forget_bias"
    fans: tuple[int, int] = (1, 1)
    trainable: bool = True     # False: state the layer updates itself (batch-norm running statistics)
    user_axes: tuple[int, ...] | None = None  # transpose from ggml's numpy order to the user's (Keras') order
    value: np.ndarray | None = None  # init "given": the starting values (numpy order), e.g. adapted statistics
    quantizable: str | None = None  # how the layer reads it on quantized data: "product" or "rows" (Weight's)
    adapts: str | None = None  # a low-rank adapter's factor: the name of the weight it adapts (network/low_rank.py)

    def initial(self, rng: np.random.RandomState) -> np.ndarray:
        shape = tuple(reversed(self.ne))
        if self.init == "given":
            return np.asarray(self.value, dtype=np.float32).reshape(shape)
        return initial_values(self.init, shape, self.fans, rng)


class Weight:
    """One weight of a layer, declared once as a class attribute: ``kernel = Weight(regularizer=
    "kernel_regularizer")`` names the weight "kernel" (its name in saved files, in ``ggml_get_weights`` and
    in the graph: ``"<layer>.kernel"``).

    Its shape follows from the input, so ``make_params`` gives it per build (``self.kernel.spec(ne, fans)``),
    and ``forward`` reads its tensor with ``g.param(self, self.kernel)``. What the declaration says is not
    repeated anywhere: the layer's regularizer arguments (``REGULARIZED``) and which weights it may have
    (``WEIGHTS``) are read from it.

    Arguments:
        name: the weight's name (default: the attribute's).
        initializer: how it starts when ``initializer_arg`` is None: "glorot", "zeros", "ones",
            "embedding", "orthogonal" or "given" (values from ``spec(value=...)``).
        initializer_arg: the layer argument that holds its initializer ("kernel_initializer").
        regularizer: the Keras argument that penalises it ("kernel_regularizer"), if any.
        trainable: False for state the layer updates itself (batch norm's running statistics).
        user_axes: the transpose from ggml's numpy order to the user's (Keras') order.
        when: the layer's bool argument that says whether the layer has it ("use_bias").
        quantizable: how the layer reads the weight, when ggml computes that on quantized data, so that a
            quantized model (``ggml_quantize_model``, a quantized file loaded by ``ggml_load_model``) keeps it
            quantized: "product" (only as the first operand of matrix products, through ``g.product(self,
            weight, x)``, which also adds a low-rank adapter's product, or ``g.product_weight``, which does not)
            or "rows" (only by ``ggml_get_rows``, an embedding's lookup); None (the default): read in F32.
    """

    def __init__(self, name: str | None = None, *, initializer: str = "glorot", initializer_arg: str | None = None,
                 regularizer: str | None = None, trainable: bool = True, user_axes: tuple[int, ...] | None = None,
                 when: str | None = None, quantizable: str | None = None) -> None:
        if quantizable not in QUANTIZABLE:
            raise GgmlValueError(f"Weight {name!r}: quantizable must be one of {QUANTIZABLE}, got {quantizable!r}")
        self.name = name
        self.quantizable = quantizable
        self.initializer = check_weight_initializer(initializer, "g.Weight")
        self.initializer_arg = initializer_arg
        self.regularizer, self.trainable, self.user_axes, self.when = regularizer, trainable, user_axes, when

    def __set_name__(self, owner: type, attribute: str) -> None:
        if self.name is None:
            self.name = attribute

    @overload
    def __get__(self, layer: None, owner: type | None = None) -> Weight: ...

    @overload
    def __get__(self, layer: Owner, owner: type | None = None) -> BoundWeight: ...

    def __get__(self, layer: Owner | None, owner: type | None = None) -> Weight | BoundWeight:
        return self if layer is None else BoundWeight(self, layer)

    def __repr__(self) -> str:
        return f"Weight({self.name!r})"


def weight_name(weight: BoundWeight | str) -> str:
    """The name of a weight given as a declared one (``self.kernel``) or by name (a custom layer's)."""
    return weight if isinstance(weight, str) else weight.name


class BoundWeight:
    """A declared weight as one layer has it: ``spec`` describes it for a build, ``name`` names it."""

    def __init__(self, weight: Weight, layer: Owner) -> None:
        self.weight, self.layer = weight, layer

    @property
    def name(self) -> str:
        return str(self.weight.name)

    @property
    def present(self) -> bool:
        """Whether the layer has this weight (its ``when`` argument, if any, is true)."""
        return self.weight.when is None or bool(getattr(self.layer, self.weight.when))

    def spec(self, ne: tuple[int, ...], fans: tuple[int, int] = (1, 1), init: str | None = None,
             value: np.ndarray | None = None, user_axes: tuple[int, ...] | None = None) -> ParamSpec:
        """The weight for one build: its ggml shape ``ne``, its fans (Glorot's), and the initializer when it
        is not the declared one."""
        w = self.weight
        what = f"layer '{self.layer.name}' ({type(self.layer).__qualname__}), weight {self.name!r}"
        if init is None and w.initializer_arg:
            if not hasattr(self.layer, w.initializer_arg):
                raise GgmlValueError(f"{what}: initializer_arg={w.initializer_arg!r} names no attribute of the layer; "
                                     "give the constructor argument that holds the initializer's name")
            init = getattr(self.layer, w.initializer_arg)
        init = check_weight_initializer(w.initializer if init is None else init, what)
        if init == "given" and value is None:
            raise GgmlValueError(f"{what}: initializer 'given' takes its values from spec(value=...)")
        return ParamSpec(self.name, tuple(ne), str(init), fans, w.trainable,
                         user_axes if user_axes is not None else w.user_axes, value, w.quantizable)
