"""Keras' weight regularizers: an L1 and an L2 penalty on a layer's weight, added to the loss it trains (and
reports) as ``l1 * sum(|w|) + l2 * sum(w**2)`` over each regularised trainable weight."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.args import FLOAT32_MAX, is_real
from ...errors import GgmlTypeError, GgmlValueError


KERAS_DEFAULT = 0.01  # Keras' factor when a regularizer is named by a string ("l2")


@dataclass(frozen=True)
class Regularizer:
    """``l1 * sum(|w|) + l2 * sum(w**2)`` of one weight."""
    l1: float = 0.0
    l2: float = 0.0

    def config(self) -> dict:
        return {"l1": self.l1, "l2": self.l2}

    def penalty(self, w: Any) -> float:
        """The penalty of the weight values ``w`` (numpy), in float64."""
        w = np.asarray(w, dtype=np.float64)
        return self.l1 * float(np.abs(w).sum()) + self.l2 * float((w * w).sum())


def _factor(value: Any, what: str) -> float:
    if not is_real(value) or not math.isfinite(value) or not 0 <= value <= FLOAT32_MAX:
        raise GgmlValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return float(value)


def ggml_regularizer_l1(l1: float = KERAS_DEFAULT) -> Regularizer:
    """Keras' ``regularizers.L1``: adds ``l1 * sum(|w|)`` of the weight to the loss (sparse weights).

    Arguments:
        l1: the factor (a finite number >= 0; Keras' default 0.01).

    Value: a regularizer for a layer's ``kernel_regularizer=`` (``bias_regularizer=``,
    ``recurrent_regularizer=``, ``embeddings_regularizer=``).

    Example:
        >>> model = g.ggml_layer_dense(model, 64, activation="relu", kernel_regularizer=g.ggml_regularizer_l1(1e-4))
    """
    return Regularizer(l1=_factor(l1, "ggml_regularizer_l1: l1"))


def ggml_regularizer_l2(l2: float = KERAS_DEFAULT) -> Regularizer:
    """Keras' ``regularizers.L2``: adds ``l2 * sum(w**2)`` of the weight to the loss (small weights). Unlike
    ``weight_decay`` (which shrinks the weights in the optimizer step) it is part of the loss: reported in
    ``train_loss``/``val_loss`` and ``ggml_evaluate``, and its gradient goes through Adam's scaling.

    Arguments:
        l2: the factor (a finite number >= 0; Keras' default 0.01).

    Value: a regularizer for a layer's ``kernel_regularizer=`` (and the other regularizer arguments).

    Example:
        >>> model = g.ggml_layer_dense(model, 64, kernel_regularizer=g.ggml_regularizer_l2(1e-3))
    """
    return Regularizer(l2=_factor(l2, "ggml_regularizer_l2: l2"))


def ggml_regularizer_l1_l2(l1: float = KERAS_DEFAULT, l2: float = KERAS_DEFAULT) -> Regularizer:
    """Keras' ``regularizers.L1L2``: adds ``l1 * sum(|w|) + l2 * sum(w**2)`` of the weight to the loss.

    Arguments:
        l1, l2: the factors (finite numbers >= 0; Keras' defaults 0.01 each).

    Value: a regularizer for a layer's ``kernel_regularizer=`` (and the other regularizer arguments).

    Example:
        >>> model = g.ggml_layer_conv_2d(model, 8, (3, 3), kernel_regularizer=g.ggml_regularizer_l1_l2(1e-5, 1e-4))
    """
    return Regularizer(l1=_factor(l1, "ggml_regularizer_l1_l2: l1"), l2=_factor(l2, "ggml_regularizer_l1_l2: l2"))


# Keras 3's names (factor 0.01); its "l1l2" means L1L2() with both factors 0, which penalises nothing: refused
_BY_NAME = {"l1": Regularizer(l1=KERAS_DEFAULT), "l2": Regularizer(l2=KERAS_DEFAULT)}


def regularizer_arg(value: Any, what: str) -> Regularizer | None:
    """A layer's regularizer argument: None, a ``ggml_regularizer_*`` object, Keras' names ``"l1"``, ``"l2"``
    (factor 0.01), or the ``{"l1": ..., "l2": ...}`` form a saved model holds. A zero penalty is None (nothing to
    add)."""
    if value is None:
        return None
    if isinstance(value, str):
        reg = _BY_NAME.get(value.lower())
        if reg is None:
            hint = " (Keras' 'l1l2' is L1L2() with both factors 0: no penalty)" if value.lower() in ("l1l2", "l1_l2") \
                else ""
            raise GgmlValueError(f"{what}: unknown regularizer {value!r}{hint}; expected 'l1', 'l2' or "
                                 "ggml_regularizer_l1/_l2/_l1_l2(...)")
    elif isinstance(value, Regularizer):
        reg = value
    elif isinstance(value, dict) and set(value) <= {"l1", "l2"}:
        reg = Regularizer(l1=_factor(value.get("l1", 0.0), f"{what}['l1']"),
                          l2=_factor(value.get("l2", 0.0), f"{what}['l2']"))
    else:
        raise GgmlTypeError(f"{what}: expected None, 'l1', 'l2' or a ggml_regularizer_*() object, got "
                            f"{type(value).__name__}")
    return reg if reg.l1 or reg.l2 else None


def regularized_weights(store: Any) -> list[tuple[Any, Any, Regularizer]]:
    """``(layer, weight spec, regularizer)`` of every trainable weight a regularizer penalises, in a store of
    the model's weights (Keras penalises trainable weights only: a frozen layer adds nothing)."""
    return [(layer, spec, layer.regularizers[spec.name]) for layer, spec in store.specs
            if layer.trains(spec) and spec.name in layer.regularizers]


def weight_penalty(store: Any) -> float:
    """The regularizers' penalty of the current weights in ``store``, float64: what the loss Keras reports adds."""
    return float(sum(reg.penalty(store.read(layer, spec.name)) for layer, spec, reg in regularized_weights(store)))
