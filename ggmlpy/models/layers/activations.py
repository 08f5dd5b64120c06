"""Activations by Keras' names (``activation="relu"`` of a layer, ``ggml_layer_activation``): ggml's unary ops, and
the others Keras names composed of ops that have a backward pass in ggml (relu, exp, abs, softplus, tanh, sigmoid,
clamp), so that each trains on every backend.

The formulas are Keras 3's, with its default parameters: ``elu`` and ``celu`` (alpha 1: the same function),
``selu`` (its two constants), ``leaky_relu`` (negative slope 0.2), ``relu6``, ``hard_sigmoid`` (``relu6(x + 3) /
6``), ``hard_silu`` (``x * hard_sigmoid(x)``), ``hard_tanh`` (``x`` clipped to [-1, 1]), ``softsign``, ``softplus``,
``log_sigmoid`` (``-softplus(-x)``), ``mish`` (``x * tanh(softplus(x))``), ``soft_shrink`` (threshold 0.5),
``tanh_shrink`` (``x - tanh(x)``), ``squareplus`` (``(x + sqrt(x^2 + 4)) / 2``), ``sparse_plus`` (0 below -1, ``x``
above 1, ``(x + 1)^2 / 4`` between), ``exponential``. ``gelu`` is ggml's tanh approximation (Keras'
``gelu(approximate=True)``; Keras' default, the erf form, differs by at most 4.7e-4). Keras' ``glu``,
``hard_shrink``, ``log_softmax``, ``sparsemax`` and ``threshold`` are not provided (``NOT_PROVIDED`` says why).
"""
from __future__ import annotations

from collections.abc import Callable

from ...errors import GgmlTypeError, GgmlValueError
from ...graph.objects import Context, Tensor
from ...ops.elementwise import (
    ggml_abs,
    ggml_add,
    ggml_clamp,
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
    ggml_sqr,
    ggml_sqrt,
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


# The clipped activations are ggml's CLAMP (its gradient from patches/0055): composed of relus, as relu(x) -
# relu(x - 6), they lost the bound once x and x - 6 round to one float32 (relu6(1e8) was 8)

def _relu6(ctx: Context, x: Tensor) -> Tensor:
    return ggml_clamp(ctx, x, 0.0, 6.0)


def _hard_sigmoid(ctx: Context, x: Tensor) -> Tensor:
    """relu6(x + 3) / 6 = clamp(x / 6 + 1/2, 0, 1)."""
    return ggml_clamp(ctx, ggml_scale_bias(ctx, x, 1.0 / 6.0, 0.5), 0.0, 1.0)


def _hard_silu(ctx: Context, x: Tensor) -> Tensor:
    return ggml_mul(ctx, x, _hard_sigmoid(ctx, x))


def _softsign(ctx: Context, x: Tensor) -> Tensor:
    return ggml_div(ctx, x, ggml_scale_bias(ctx, ggml_abs(ctx, x), 1.0, 1.0))


def _mish(ctx: Context, x: Tensor) -> Tensor:
    return ggml_mul(ctx, x, ggml_tanh(ctx, ggml_softplus(ctx, x)))


def _log_sigmoid(ctx: Context, x: Tensor) -> Tensor:
    return ggml_scale(ctx, ggml_softplus(ctx, ggml_scale(ctx, x, -1.0)), -1.0)


def _hard_tanh(ctx: Context, x: Tensor) -> Tensor:
    return ggml_clamp(ctx, x, -1.0, 1.0)


SHRINK_THRESHOLD = 0.5   # Keras 3's soft_shrink default


def _soft_shrink(ctx: Context, x: Tensor) -> Tensor:
    """x - t above t, x + t below -t, 0 between = relu(x - t) - relu(-x - t)."""
    t = SHRINK_THRESHOLD
    return ggml_sub(ctx, ggml_relu(ctx, ggml_scale_bias(ctx, x, 1.0, -t)),
                    ggml_relu(ctx, ggml_scale_bias(ctx, x, -1.0, -t)))


def _tanh_shrink(ctx: Context, x: Tensor) -> Tensor:
    return ggml_sub(ctx, x, ggml_tanh(ctx, x))


def _squareplus(ctx: Context, x: Tensor) -> Tensor:
    """(x + sqrt(x^2 + b)) / 2 with Keras' b = 4."""
    return ggml_scale(ctx, ggml_add(ctx, x, ggml_sqrt(ctx, ggml_scale_bias(ctx, ggml_sqr(ctx, x), 1.0, 4.0))), 0.5)


def _sparse_plus(ctx: Context, x: Tensor) -> Tensor:
    """(c + 1)^2 / 4 + relu(x - 1), c = hard_tanh(x): 0 below -1, (x + 1)^2 / 4 between, x above 1."""
    c1 = ggml_scale_bias(ctx, _hard_tanh(ctx, x), 1.0, 1.0)
    return ggml_add(ctx, ggml_scale(ctx, ggml_sqr(ctx, c1), 0.25), ggml_relu(ctx, ggml_scale_bias(ctx, x, 1.0, -1.0)))


ACTIVATIONS: dict[str | None, Callable | None] = {
    None: None, "linear": None, "relu": ggml_relu, "sigmoid": ggml_sigmoid, "tanh": ggml_tanh,
    "gelu": ggml_gelu, "silu": ggml_silu, "softmax": ggml_soft_max,
    "elu": _elu, "selu": _selu, "leaky_relu": _leaky_relu, "relu6": _relu6, "hard_sigmoid": _hard_sigmoid,
    "hard_silu": _hard_silu, "softsign": _softsign, "softplus": ggml_softplus, "mish": _mish,
    "exponential": ggml_exp, "celu": _elu, "log_sigmoid": _log_sigmoid, "hard_tanh": _hard_tanh,
    "soft_shrink": _soft_shrink, "tanh_shrink": _tanh_shrink, "squareplus": _squareplus, "sparse_plus": _sparse_plus,
}
ALIASES = {"swish": "silu", "hard_swish": "hard_silu"}  # Keras' names of the same functions
# Keras' activations that ggmlpy leaves out, and what to write instead
NOT_PROVIDED = {
    "glu": "it halves the last axis (a*sigmoid(b) of its two halves): write a custom layer (ggml_custom_layer)",
    "log_softmax": "ggml has no stable log-softmax with a backward pass: end in a softmax (or logits with "
                   "from_logits=True), which the cross-entropy takes",
    "hard_shrink": "its step (x where |x| > 0.5, else 0) has no gradient in ggml: use soft_shrink",
    "threshold": "its step has no gradient in ggml: use relu, or a custom layer",
    "sparsemax": "ggml has no sort with a backward pass: use softmax",
}


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
    if isinstance(activation, str) and activation in NOT_PROVIDED:
        raise GgmlValueError(f"activation {activation!r} (Keras') is not provided: {NOT_PROVIDED[activation]}")
    if activation not in ACTIVATIONS:
        names = ", ".join(repr(a) for a in [*ACTIVATIONS, *ALIASES] if a is not None)
        raise GgmlValueError(f"unknown activation {activation!r}; expected one of {names} or None")
    return None if activation == "linear" else activation
