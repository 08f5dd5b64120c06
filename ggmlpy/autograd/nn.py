"""ggmlR's ``ag_*`` layers: modules with parameters (``ag_linear``, ``ag_layer_norm``, ``ag_batch_norm``,
``ag_embedding``), ``ag_dropout``, ``ag_sequential``, and ``ag_train``/``ag_eval`` to switch their mode. A layer is
called on an AgTensor (samples first) and returns a lazy AgTensor; ``parameters()`` is an ordered dict of its
trainable leaves.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..core.args import is_real, positive_int_arg
from ..errors import GgmlTypeError, GgmlValueError
from ..graph.objects import Tensor
from ..ops.elementwise import ggml_add, ggml_dropout, ggml_norm, ggml_scale
from ..ops.layout import ggml_cpy, ggml_get_rows
from .device import engine, next_epoch, resolve_device, Storage
from .lazy import Builder, Op
from .ops import (
    ag_add,
    ag_mean,
    ag_mul,
    ag_pow,
    ag_relu,
    ag_sigmoid,
    ag_softmax,
    ag_sub,
    ag_tanh,
    floating,
    linear,
    ne_of,
    reshaped,
    tensor_arg,
)
from .tensor import ag_param, AgTensor, result


__all__ = ["ag_linear", "ag_sequential", "ag_dropout", "ag_batch_norm", "ag_layer_norm", "ag_embedding", "ag_train",
           "ag_eval"]

ACTIVATIONS = {"relu": ag_relu, "sigmoid": ag_sigmoid, "tanh": ag_tanh, "softmax": ag_softmax}


class Module:
    """A layer of the autograd engine: ``forward(x)`` (or calling it), ``parameters()``, ``training``."""

    def __init__(self) -> None:
        self.training = True

    def forward(self, x: AgTensor) -> AgTensor:
        raise NotImplementedError

    def __call__(self, x: AgTensor) -> AgTensor:
        return self.forward(x)

    def _own(self) -> dict[str, AgTensor]:
        return {}

    def children(self) -> list[Module]:
        return []

    def parameters(self) -> dict[str, AgTensor]:
        """The trainable leaves, by name, in order."""
        return dict(self._own())

    def params(self) -> dict[str, AgTensor]:
        """The same as ``parameters()`` (ggmlR's ``$params()``)."""
        return self.parameters()

    def state(self) -> dict[str, AgTensor]:
        """What saving keeps: the parameters and the running statistics."""
        return self.parameters()

    def set_training(self, mode: bool) -> None:
        self.training = mode
        for c in self.children():
            c.set_training(mode)


def ag_train(model: Module) -> Module:
    """Put a layer (and every layer inside it) in training mode: dropout drops, batch norm uses batch statistics.

    Arguments:
        model: an ag_* layer or ag_sequential.

    Value: model itself.

    Example:
        >>> ag_train(model)
    """
    if not isinstance(model, Module):
        raise GgmlTypeError(f"ag_train: model must be an ag_* layer, got {type(model).__name__}")
    model.set_training(True)
    return model


def ag_eval(model: Module) -> Module:
    """Put a layer (and every layer inside it) in evaluation mode: dropout is the identity, batch norm uses its
    running statistics.

    Arguments:
        model: an ag_* layer or ag_sequential.

    Value: model itself.

    Example:
        >>> pred = ag_eval(model)(x)
    """
    if not isinstance(model, Module):
        raise GgmlTypeError(f"ag_eval: model must be an ag_* layer, got {type(model).__name__}")
    model.set_training(False)
    return model


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, activation: str | None, device: str | None) -> None:
        super().__init__()
        limit = math.sqrt(6.0 / (in_features + out_features))
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.W = ag_param(np.random.uniform(-limit, limit, (out_features, in_features)), device)
        self.b = ag_param(np.zeros(out_features), device)

    def _own(self) -> dict[str, AgTensor]:
        return {"W": self.W, "b": self.b}

    def forward(self, x: AgTensor) -> AgTensor:
        y = linear(x, self.W, self.b, "ag_linear")   # x @ W.T + b, one op
        return ACTIVATIONS[self.activation](y) if self.activation else y

    def __repr__(self) -> str:
        return f"ag_linear({self.in_features}, {self.out_features}, activation={self.activation!r})"


def ag_linear(in_features: int, out_features: int, activation: str | None = None, device: str | None = None) -> Linear:
    """A dense layer: ``act(x @ W.T + b)`` with ``W`` (out, in) uniform in ``+-sqrt(6 / (in + out))`` and ``b``
    zeros.

    Arguments:
        in_features: the size of x's last axis.
        out_features: the size of the output's last axis.
        activation: "relu", "sigmoid", "tanh", "softmax" or None.
        device: where the parameters live; None: the default (ag_device).

    Value: a layer; ``layer(x)`` maps (N, in) to (N, out); ``parameters()`` holds ``W`` and ``b``.

    Example:
        >>> fc = ag_linear(784, 128, activation="relu")
    """
    fn = "ag_linear"
    if activation is not None and activation not in ACTIVATIONS:
        raise GgmlValueError(f"{fn}: activation must be one of {sorted(ACTIVATIONS)} or None, got {activation!r}")
    return Linear(positive_int_arg(fn, "in_features", in_features), positive_int_arg(fn, "out_features", out_features),
                  activation, device)


class Sequential(Module):
    def __init__(self, layers: list[Module]) -> None:
        super().__init__()
        self.layers = layers

    def children(self) -> list[Module]:
        return list(self.layers)

    def parameters(self) -> dict[str, AgTensor]:
        return {f"layer{i}_{k}": v for i, layer in enumerate(self.layers, 1) for k, v in layer.parameters().items()}

    def state(self) -> dict[str, AgTensor]:
        return {f"layer{i}_{k}": v for i, layer in enumerate(self.layers, 1) for k, v in layer.state().items()}

    def forward(self, x: AgTensor) -> AgTensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def __repr__(self) -> str:
        return "ag_sequential(" + ", ".join(repr(layer) for layer in self.layers) + ")"


def ag_sequential(*layers: object) -> Sequential:
    """Layers applied one after the other.

    Arguments:
        layers: ag_* layers (or one list of them), in order.

    Value: a layer whose ``parameters()`` names each layer's as ``layer{i}_{name}`` (i from 1); ``.layers``.

    Example:
        >>> model = ag_sequential(ag_linear(784, 128, "relu"), ag_dropout(0.2), ag_linear(128, 10))
    """
    items = list(layers[0]) if len(layers) == 1 and isinstance(layers[0], Iterable) and \
        not isinstance(layers[0], Module) else list(layers)
    checked: list[Module] = []
    for i, layer in enumerate(items, 1):
        if not isinstance(layer, Module):
            raise GgmlTypeError(f"ag_sequential: layer {i} is not an ag_* layer but a {type(layer).__name__}")
        checked.append(layer)
    return Sequential(checked)


def _lower_dropout(b: Builder, xs: list, attrs: tuple) -> Tensor:
    return ggml_dropout(b.ctx, xs[0], xs[1], attrs[0])


_DROPOUT = Op("dropout", _lower_dropout)


class Dropout(Module):
    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def forward(self, x: AgTensor) -> AgTensor:
        x = floating(tensor_arg(x, "ag_dropout"), "ag_dropout")
        if not self.training or self.rate == 0.0:
            return x
        seed = AgTensor(x.engine, (1,), "i32")
        seed.host = np.array([np.random.randint(0, 2 ** 31 - 1)], np.int32)  # an input: a new mask each step
        return result(_DROPOUT, (x, seed), x.shape, (self.rate,))

    def __repr__(self) -> str:
        return f"ag_dropout({self.rate})"


def ag_dropout(rate: float) -> Dropout:
    """Inverted dropout: in training, each element is zeroed with probability ``rate`` and the others scaled by
    ``1 / (1 - rate)``; the identity in evaluation mode or at rate 0. The mask is drawn on the device from a seed
    taken from ``np.random`` at each call.

    Arguments:
        rate: the drop probability, in [0, 1).

    Value: a layer without parameters.

    Example:
        >>> drop = ag_dropout(0.5)
    """
    if not is_real(rate) or isinstance(rate, bool) or not 0.0 <= float(rate) < 1.0:
        raise GgmlValueError(f"ag_dropout: rate must be in [0, 1), got {rate!r}")
    return Dropout(float(rate))


def _lower_norm(b: Builder, xs: list, attrs: tuple) -> Tensor:
    return ggml_norm(b.ctx, xs[0], attrs[0])


_NORM = Op("layer_norm", _lower_norm)


class LayerNorm(Module):
    def __init__(self, size: int, eps: float, affine: bool, device: str | None) -> None:
        super().__init__()
        self.size, self.eps, self.affine = size, eps, affine
        self.gamma = ag_param(np.ones(size), device) if affine else None
        self.beta = ag_param(np.zeros(size), device) if affine else None

    def _own(self) -> dict[str, AgTensor]:
        return {"gamma": self.gamma, "beta": self.beta} if self.gamma is not None and self.beta is not None else {}

    def forward(self, x: AgTensor) -> AgTensor:
        x = floating(tensor_arg(x, "ag_layer_norm"), "ag_layer_norm")
        if not x.shape or x.shape[-1] != self.size:
            raise GgmlValueError(f"ag_layer_norm: expected a last axis of {self.size}, got shape {x.shape}")
        y = result(_NORM, (x,), x.shape, (self.eps,))
        if self.gamma is not None and self.beta is not None:
            y = ag_add(ag_mul(y, self.gamma), self.beta)
        return y

    def __repr__(self) -> str:
        return f"ag_layer_norm({self.size}, eps={self.eps}, elementwise_affine={self.affine})"


def ag_layer_norm(normalized_shape: int, eps: float = 1e-5, elementwise_affine: bool = True,
                  device: str | None = None) -> LayerNorm:
    """Layer normalisation over the last axis: each sample's ``(x - mean) / sqrt(var + eps) * gamma + beta``.

    Arguments:
        normalized_shape: the size of the last axis.
        eps: added to the variance.
        elementwise_affine: learn ``gamma`` (ones) and ``beta`` (zeros); False: none.
        device: where the parameters live; None: the default.

    Value: a layer.

    Example:
        >>> ln = ag_layer_norm(64)
    """
    if not is_real(eps) or float(eps) <= 0:
        raise GgmlValueError(f"ag_layer_norm: eps must be > 0, got {eps!r}")
    return LayerNorm(positive_int_arg("ag_layer_norm", "normalized_shape", normalized_shape), float(eps),
                     bool(elementwise_affine), device)


def _lower_running(b: Builder, xs: list, attrs: tuple) -> Tensor:
    """running = (1 - m) running + m stat, written into the running statistic."""
    running, stat = xs
    m = attrs[0]
    new = ggml_add(b.ctx, ggml_scale(b.ctx, running, 1.0 - m), ggml_scale(b.ctx, reshaped(b, stat, ne_of(
        tuple(reversed(running.shape[:1])))), m))
    return ggml_cpy(b.ctx, new, running)


_RUNNING = Op("running_update", _lower_running, deferred=True)


class BatchNorm(Module):
    def __init__(self, n: int, eps: float, momentum: float, device: str | None) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = n, eps, momentum
        self.gamma = ag_param(np.ones(n), device)
        self.beta = ag_param(np.zeros(n), device)
        eng = engine(resolve_device(device, "ag_batch_norm"))
        self.running_mean = AgTensor(eng, (n,), "f32")
        self.running_mean.storage = Storage(eng, (n,), "f32", np.zeros(n, np.float32))
        self.running_var = AgTensor(eng, (n,), "f32")
        self.running_var.storage = Storage(eng, (n,), "f32", np.ones(n, np.float32))

    def _own(self) -> dict[str, AgTensor]:
        return {"gamma": self.gamma, "beta": self.beta}

    def state(self) -> dict[str, AgTensor]:
        return {**self._own(), "running_mean": self.running_mean, "running_var": self.running_var}

    def forward(self, x: AgTensor) -> AgTensor:
        x = floating(tensor_arg(x, "ag_batch_norm"), "ag_batch_norm")
        if x.ndim != 2 or x.shape[1] != self.num_features:
            raise GgmlValueError(f"ag_batch_norm: expected x of shape (N, {self.num_features}), got {x.shape}")
        if self.training:
            mean = ag_mean(x, dim=0)
            centred = ag_sub(x, mean)
            var = ag_mean(ag_pow(centred, 2), dim=0)
            next_epoch()   # the statistics change here: values recorded before read the old ones
            for stored, stat in ((self.running_mean, mean), (self.running_var, var)):
                effect = result(_RUNNING, (stored, stat), stored.shape, (self.momentum,), differentiable=False)
                effect.writes = (stored.storage,)  # type: ignore[assignment]
                x.engine.effects.append(effect)   # written by the next graph computed on the device
        else:
            centred = ag_sub(x, self.running_mean)
            var = self.running_var
        y = ag_mul(centred, ag_pow(ag_add(var, self.eps), -0.5))
        return ag_add(ag_mul(y, self.gamma), self.beta)

    def __repr__(self) -> str:
        return f"ag_batch_norm({self.num_features}, eps={self.eps}, momentum={self.momentum})"


def ag_batch_norm(num_features: int, eps: float = 1e-5, momentum: float = 0.1, device: str | None = None) -> BatchNorm:
    """Batch normalisation of (N, F) inputs: in training, each feature's batch mean and biased variance, with the
    gradient through them, and running statistics ``r = (1 - momentum) r + momentum * stat`` (starting at 0 and
    1, updated on the device with the step); in evaluation, the running statistics.

    Arguments:
        num_features: F.
        eps: added to the variance.
        momentum: the running statistics' update factor, in [0, 1].
        device: where the parameters and statistics live; None: the default.

    Value: a layer with ``gamma`` (ones), ``beta`` (zeros), ``running_mean``, ``running_var``.

    Example:
        >>> bn = ag_batch_norm(128)
    """
    fn = "ag_batch_norm"
    if not is_real(eps) or float(eps) <= 0:
        raise GgmlValueError(f"{fn}: eps must be > 0, got {eps!r}")
    if not is_real(momentum) or not 0.0 <= float(momentum) <= 1.0:
        raise GgmlValueError(f"{fn}: momentum must be in [0, 1], got {momentum!r}")
    return BatchNorm(positive_int_arg(fn, "num_features", num_features), float(eps), float(momentum), device)


def _lower_rows(b: Builder, xs: list, attrs: tuple) -> Tensor:
    w, ids = xs
    n, out = attrs
    return reshaped(b, ggml_get_rows(b.ctx, w, reshaped(b, ids, (n,))), out)


_ROWS = Op("embedding", _lower_rows)


class Embedding(Module):
    def __init__(self, vocab: int, dim: int, device: str | None) -> None:
        super().__init__()
        self.vocab_size, self.dim = vocab, dim
        limit = math.sqrt(1.0 / vocab)
        self.weight = ag_param(np.random.uniform(-limit, limit, (vocab, dim)), device)

    def _own(self) -> dict[str, AgTensor]:
        return {"weight": self.weight}

    def forward(self, ids: object) -> AgTensor:
        fn = "ag_embedding"
        arr = ids.numpy() if isinstance(ids, AgTensor) else np.asarray(ids)
        if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.all(arr == np.round(arr))):
            raise GgmlTypeError(f"{fn}: ids must be integers, got {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise GgmlValueError(f"{fn}: ids must be in [0, {self.vocab_size}), got {arr.min()} to {arr.max()}")
        if arr.ndim > 3 or arr.size == 0:
            raise GgmlValueError(f"{fn}: ids must have at most 3 axes and at least one id, got shape {arr.shape}")
        t = AgTensor(self.weight.engine, arr.shape, "i32")
        t.host = np.ascontiguousarray(arr, dtype=np.int32)
        out = arr.shape + (self.dim,)
        return result(_ROWS, (self.weight, t), out, (int(arr.size), out))

    def __repr__(self) -> str:
        return f"ag_embedding({self.vocab_size}, {self.dim})"


def ag_embedding(vocab_size: int, dim: int, device: str | None = None) -> Embedding:
    """A lookup table of ``vocab_size`` vectors of ``dim`` values (``weight`` uniform in ``+-sqrt(1/vocab)``);
    repeated ids add up their gradients.

    Arguments:
        vocab_size: the number of ids.
        dim: the size of each vector.
        device: where the table lives; None: the default.

    Value: a layer; ``layer(ids)`` maps integer ids of any shape (up to 3 axes) to ``ids.shape + (dim,)``; an id
    outside ``[0, vocab_size)`` is a ValueError.

    Example:
        >>> emb = ag_embedding(1000, 64); h = emb(np.array([[1, 5, 9]]))
    """
    fn = "ag_embedding"
    return Embedding(positive_int_arg(fn, "vocab_size", vocab_size), positive_int_arg(fn, "dim", dim), device)
