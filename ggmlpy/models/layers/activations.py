"""Activations by Keras' names (``activation="relu"`` of a layer, ``ggml_layer_activation``): ggml's unary ops, and
the others Keras names composed of ops that have a backward pass in ggml (relu, exp, abs, softplus, tanh, sigmoid),
so that each trains on every backend.

The formulas are Keras 3's: ``elu`` (alpha 1), ``selu`` (its two constants), ``leaky_relu`` (negative slope 0.2),
``relu6``, ``hard_sigmoid`` (``relu6(x + 3) / 6``), ``hard_silu`` (``x * hard_sigmoid(x)``), ``softsign``,
``softplus``, ``mish`` (``x * tanh(softplus(x))``), ``exponential``.
"""
from __future__ import annotations

from collections.abc import Callable

from ...errors import GgmlTypeError, GgmlValueError
from ...graph.objects import Context, Tensor
from ...ops.elementwise import (
    ggml_abs,
    ggml_add,
    ggml_div,
    ggml_exp,
    ggml_gelu,
    ggml_mul,
    ggml_relu,
    ggml_scale,
    ggml_scale_bias,
    ggml_sigmoid,
    ggml_silu,
    ggml_soft_max,
    ggml_softplus,
    ggml_sub,
    ggml_tanh,
)


SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805   # Keras' (Klambauer et al.)
LEAKY_SLOPE = 0.2   # Keras 3's default negative_slope


def _negative_part(ctx: Context, x: Tensor) -> Tensor:
    """min(x, 0) = -relu(-x)."""
    return ggml_scale(ctx, ggml_relu(ctx, ggml_scale(ctx, x, -1.0)), -1.0)


def _elu(ctx: Context, x: Tensor, alpha: float = 1.0) -> Tensor:
    """x where x > 0, alpha (exp(x) - 1) elsewhere."""
    tail = ggml_scale_bias(ctx, ggml_exp(ctx, _negative_part(ctx, x)), alpha, -alpha)
    return ggml_add(ctx, ggml_relu(ctx, x), tail)


def _selu(ctx: Context, x: Tensor) -> Tensor:
    return ggml_scale(ctx, _elu(ctx, x, SELU_ALPHA), SELU_SCALE)


def _leaky_relu(ctx: Context, x: Tensor) -> Tensor:
    return ggml_add(ctx, ggml_relu(ctx, x), ggml_scale(ctx, _negative_part(ctx, x), LEAKY_SLOPE))


def _relu6(ctx: Context, x: Tensor) -> Tensor:
    """min(relu(x), 6) = relu(x) - relu(x - 6)."""
    return ggml_sub(ctx, ggml_relu(ctx, x), ggml_relu(ctx, ggml_scale_bias(ctx, x, 1.0, -6.0)))


def _hard_sigmoid(ctx: Context, x: Tensor) -> Tensor:
    return ggml_scale(ctx, _relu6(ctx, ggml_scale_bias(ctx, x, 1.0, 3.0)), 1.0 / 6.0)


def _hard_silu(ctx: Context, x: Tensor) -> Tensor:
    return ggml_mul(ctx, x, _hard_sigmoid(ctx, x))


def _softsign(ctx: Context, x: Tensor) -> Tensor:
    return ggml_div(ctx, x, ggml_scale_bias(ctx, ggml_abs(ctx, x), 1.0, 1.0))


def _mish(ctx: Context, x: Tensor) -> Tensor:
    return ggml_mul(ctx, x, ggml_tanh(ctx, ggml_softplus(ctx, x)))


ACTIVATIONS: dict[str | None, Callable | None] = {
    None: None, "linear": None, "relu": ggml_relu, "sigmoid": ggml_sigmoid, "tanh": ggml_tanh,
    "gelu": ggml_gelu, "silu": ggml_silu, "softmax": ggml_soft_max,
    "elu": _elu, "selu": _selu, "leaky_relu": _leaky_relu, "relu6": _relu6, "hard_sigmoid": _hard_sigmoid,
    "hard_silu": _hard_silu, "softsign": _softsign, "softplus": ggml_softplus, "mish": _mish,
    "exponential": ggml_exp,
}
ALIASES = {"swish": "silu", "hard_swish": "hard_silu"}  # Keras' names of the same functions


def check_activation(activation: object) -> str | None:
    if activation is not None and not isinstance(activation, str):
        hint = ""
        if isinstance(activation, (int, tuple, list)):  # Keras' positional strides in ggmlR's activation slot
            hint = ("; in ggmlR's order the conv layers take activation third, where Keras takes strides: "
                    f"pass strides={activation!r} by keyword")
        raise GgmlTypeError(f"activation must be a name (str) or None, got {type(activation).__name__} "
                            f"{activation!r}{hint}")
    if activation is not None:
        activation = ALIASES.get(activation, activation)
    if activation not in ACTIVATIONS:
        names = ", ".join(repr(a) for a in [*ACTIVATIONS, *ALIASES] if a is not None)
        raise GgmlValueError(f"unknown activation {activation!r}; expected one of {names} or None")
    return None if activation == "linear" else activation
