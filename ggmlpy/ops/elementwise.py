"""Element-wise ops: the binary arithmetic ops, the unary math and activation ops, scaling, clamping,
softmax and the norms over rows.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .._ffi import lib
from ..core.args import c_int_arg, eps_arg, fail, float_arg
from ..core.types import FLOAT_TYPES, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, type_name
from ..errors import GgmlTypeError
from ..graph.objects import Context, Tensor
from . import base as _base
from .base import broadcast_into, contiguous, F32_F16, floating, make_op, operand, padded_1d, rows_contiguous


# (operator, verb) of each element-wise binary op, for its docstring
_BINARY_DOCS = {"ggml_add": ("a + b", "Add"), "ggml_sub": ("a - b", "Subtract"),
                "ggml_mul": ("a * b", "Multiply"), "ggml_div": ("a / b", "Divide")}
_BINARY_BACKWARD = ("\n    In a trainable graph, a broadcast ``b`` that needs a gradient is refused (ggml has no\n"
                    "    backward pass for it): make the shapes equal with ``ggml_repeat(ctx, b, a)`` first.")


def _binary_doc(name: str) -> str:
    formula, verb = _BINARY_DOCS[name]
    backward = _BINARY_BACKWARD if name in ("ggml_sub", "ggml_div") else ""
    return f"""{verb} element-wise: ``{formula}``, with ``b`` broadcast (repeated) into a's shape.

    Each ne[i] of ``a`` must be a multiple of b's: ``b`` is repeated along every dimension where it is
    smaller (a bias ``[n, 1]`` is applied to every column of ``[n, batch]``). ggml broadcasts the second
    operand only; swap the operands or use ``ggml_repeat`` otherwise. Differentiable.{backward}

    Arguments:
        ctx: the context the result tensor is created in (it must have room for it).
        a: F32, F16 or BF16 tensor with contiguous rows (apply ``ggml_cont`` to a transposed view).
        b: a tensor of a's type or F32 whose shape repeats into a's.

    Value: a new Tensor of a's shape and type, computed when the graph runs. Raises GgmlTypeError
    for other types, GgmlValueError when b does not broadcast into a.

    Example:
        >>> y = {name}(ctx, h, bias)        # h [n, batch], bias [n, 1]
    """


def check_binary(fn: str, a: object, b: object) -> tuple[Tensor, Tensor, tuple]:
    """The operands of an element-wise binary op (also its in-place form, ops.inplace): (a, b, result shape)."""
    a, b = operand(fn, a), operand(fn, b, "b")
    floating(fn, ("a", a), ("b", b))
    if b.type not in (a.type, GGML_TYPE_F32):  # the CPU kernels: same types, or an F32 b
        fail(fn, f"b must be {type_name(a.type)} or F32 when a is {type_name(a.type)}, got "
                     f"{type_name(b.type)}", GgmlTypeError)
    rows_contiguous(fn, a)
    return a, b, broadcast_into(fn, a, b)


def _binary(name: str, c_fn: Callable) -> Callable:
    def op(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        a, b, shape = check_binary(name, a, b)
        return make_op(name, ctx, c_fn, (a, b), shape, out_type=a.type)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = _binary_doc(name)
    return op


ggml_add = _binary("ggml_add", lib.ggml_add)
ggml_sub = _binary("ggml_sub", lib.ggml_sub)
ggml_mul = _binary("ggml_mul", lib.ggml_mul)
ggml_div = _binary("ggml_div", lib.ggml_div)


# ---------------------------------------------------------------- element-wise unary

# (summary, formula) of each element-wise unary op, for its docstring; a note on its backward pass
_UNARY_DOCS = {
    "ggml_sqr": ("Square", "x * x"), "ggml_sqrt": ("Square root (NaN for negative x)", "sqrt(x)"),
    "ggml_log": ("Natural logarithm (-inf at 0, NaN below)", "log(x)"), "ggml_exp": ("Exponential", "exp(x)"),
    "ggml_sin": ("Sine", "sin(x)"), "ggml_cos": ("Cosine", "cos(x)"), "ggml_abs": ("Absolute value", "|x|"),
    "ggml_sgn": ("Sign", "1 if x > 0, -1 if x < 0, else 0"), "ggml_neg": ("Negation", "-x"),
    "ggml_step": ("Step function", "1 if x > 0 else 0"), "ggml_relu": ("ReLU", "max(x, 0)"),
    "ggml_elu": ("ELU (alpha 1)", "x if x > 0 else exp(x) - 1"), "ggml_silu": ("SiLU (swish)", "x * sigmoid(x)"),
    "ggml_gelu": ("GELU, tanh approximation", "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))"),
    "ggml_tanh": ("Hyperbolic tangent", "tanh(x)"), "ggml_sigmoid": ("Logistic sigmoid", "1 / (1 + exp(-x))"),
    "ggml_softplus": ("Softplus", "log(1 + exp(x)), and x itself for x > 20"),
    "ggml_hardswish": ("Hard swish", "x * min(1, max(0, (x + 3) / 6))"),
}
_UNARY_NOTES = {
    "ggml_sgn": "It passes no gradient back (its derivative is 0 almost everywhere).",
    "ggml_step": "It passes no gradient back (its derivative is 0 almost everywhere).",
    "ggml_elu": "ggml has no backward pass for it: in a trainable graph it may not lie between a parameter and\n"
                "    the loss (use ``ggml_silu`` or ``ggml_softplus``).",
    "ggml_hardswish": "ggml has no backward pass for it: in a trainable graph it may not lie between a parameter\n"
                      "    and the loss (use ``ggml_silu``).",
    "ggml_gelu": "Differentiable. The tanh approximation ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``,\n"
                 "    computed in float32 on every backend (ggml's CPU used an F16 table; patches/0019).",
}
_COPY_DOCS = {
    "ggml_dup": ("A copy of ``a`` in a new contiguous tensor.",
                 "The copy has a's shape and type and is laid out contiguously even when ``a`` is a strided\n"
                 "    view (like ``ggml_cont``). Differentiable.", "c = ggml_dup(ctx, a)"),
    "ggml_cont": ("A contiguous copy of ``a``: what to apply after ``ggml_transpose``/``ggml_permute``.",
                  "Views made by ``ggml_transpose``, ``ggml_permute`` or ``ggml_view_*`` are strided; ops that need\n"
                  "    contiguous data (``ggml_reshape``, ``ggml_mul_mat``'s first operand, ``ggml_soft_max``, ...)\n"
                  "    take their ``ggml_cont``. The elements keep their logical (ggml) order. Differentiable.",
                  "wt = ggml_cont(ctx, ggml_transpose(ctx, w))"),
}


def _unary_doc(name: str, needs_contiguous_rows: bool, types: set) -> str:
    kinds = "F32 or F16" if set(types) == F32_F16 else "F32, F16 or BF16"
    rows = " with contiguous rows (apply ``ggml_cont`` to a transposed view first)" if needs_contiguous_rows else ""
    if name in _COPY_DOCS:
        summary, body, example = _COPY_DOCS[name]
    else:
        what, formula = _UNARY_DOCS[name]
        summary = f"{what}, element-wise: ``{formula}``."
        body = _UNARY_NOTES.get(name, "Differentiable.")
        example = f"y = {name}(ctx, x)"
    return f"""{summary}

    {body}

    Arguments:
        ctx: the context the result tensor is created in (it must have room for it).
        a: {kinds} tensor{rows}.

    Value: a new Tensor of a's shape and type, computed when the graph runs.

    Example:
        >>> {example}
    """


# name -> check(fn, a) -> a: what each element-wise unary op accepts (shared with its in-place form, ops.inplace)
UNARY_CHECKS: dict[str, Callable[[str, object], Tensor]] = {}


def unary_check(needs_contiguous_rows: bool, types) -> Callable[[str, object], Tensor]:
    def check(fn: str, a: object) -> Tensor:
        a = operand(fn, a)
        _base.types(fn, a, types)
        if needs_contiguous_rows:
            rows_contiguous(fn, a)
        return a
    return check


def _unary(name: str, c_fn: Callable, needs_contiguous_rows: bool = True, types=FLOAT_TYPES) -> Callable:
    check = UNARY_CHECKS[name] = unary_check(needs_contiguous_rows, types)

    def op(ctx: Context, a: Tensor) -> Tensor:
        a = check(name, a)
        return make_op(name, ctx, c_fn, (a,), a.shape, out_type=a.type)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = _unary_doc(name, needs_contiguous_rows, types)
    return op


# The CPU kernels of the element-wise ops need contiguous rows; gelu and silu exist for F32/F16 only.
ggml_dup = _unary("ggml_dup", lib.ggml_dup, False)
ggml_sqr = _unary("ggml_sqr", lib.ggml_sqr)
ggml_sqrt = _unary("ggml_sqrt", lib.ggml_sqrt)
ggml_log = _unary("ggml_log", lib.ggml_log)
ggml_exp = _unary("ggml_exp", lib.ggml_exp)
ggml_sin = _unary("ggml_sin", lib.ggml_sin)
ggml_cos = _unary("ggml_cos", lib.ggml_cos)
ggml_abs = _unary("ggml_abs", lib.ggml_abs)
ggml_sgn = _unary("ggml_sgn", lib.ggml_sgn)
ggml_neg = _unary("ggml_neg", lib.ggml_neg)
ggml_step = _unary("ggml_step", lib.ggml_step)
ggml_relu = _unary("ggml_relu", lib.ggml_relu)
ggml_elu = _unary("ggml_elu", lib.ggml_elu)
ggml_silu = _unary("ggml_silu", lib.ggml_silu, types=F32_F16)
ggml_gelu = _unary("ggml_gelu", lib.ggml_gelu, types=F32_F16)
ggml_tanh = _unary("ggml_tanh", lib.ggml_tanh)
ggml_sigmoid = _unary("ggml_sigmoid", lib.ggml_sigmoid)
ggml_softplus = _unary("ggml_softplus", lib.ggml_softplus)
ggml_hardswish = _unary("ggml_hardswish", lib.ggml_hardswish)
ggml_cont = _unary("ggml_cont", lib.ggml_cont, False)


def ggml_soft_max(ctx: Context, a: Tensor) -> Tensor:
    """Softmax of each row: ``exp(a_i) / sum_j exp(a_j)`` over ne[0].

    Every row (the ne[0] values at fixed ne[1], ne[2], ne[3]) becomes a probability distribution.
    Differentiable. For a classifier trained with ``ggml_opt_loss_type_cross_entropy`` do not end the
    graph with it: that loss takes logits and applies the softmax itself.

    Arguments:
        ctx: [glossary]
        a: F32 tensor, contiguous (apply ``ggml_cont`` to a transposed or permuted view first).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> probs = ggml_soft_max(ctx, logits)      # logits [n_classes, batch]
    """
    a = check_soft_max("ggml_soft_max", a)
    return make_op("ggml_soft_max", ctx, lib.ggml_soft_max, (a,), a.shape)


def check_soft_max(fn: str, a: object) -> Tensor:
    a = operand(fn, a)
    _base.types(fn, a, {GGML_TYPE_F32})
    contiguous(fn, a)
    return a


def ggml_leaky_relu(ctx: Context, a: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """Leaky ReLU: ``x`` where ``x > 0``, else ``negative_slope * x``, element-wise.

    ggml has no backward pass for it: in a trainable graph it may not lie between a parameter and the
    loss (training raises an error naming it; build ``x - slope * relu(-x)`` from ``ggml_relu``,
    ``ggml_scale`` and ``ggml_sub`` instead). Fine for inference.

    Arguments:
        ctx: [glossary]
        a: F32 or F16 tensor.
        negative_slope: the factor applied to negative values, a finite number (default 0.01, as in Keras and
            PyTorch; NaN or inf is a GgmlValueError).
        inplace: False (the default) computes into a new tensor; True returns a view of ``a`` and
            overwrites a's data when the graph runs.

    Value: a Tensor of a's shape and type.

    Example:
        >>> h = ggml_leaky_relu(ctx, ggml_mul_mat(ctx, w, x), 0.2)
    """
    a = operand("ggml_leaky_relu", a)
    _base.types("ggml_leaky_relu", a, F32_F16)
    contiguous("ggml_leaky_relu", a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    slope = float_arg("ggml_leaky_relu", "negative_slope", negative_slope, finite=True)
    return make_op("ggml_leaky_relu", ctx, lib.ggml_leaky_relu, (a,), a.shape, (slope, bool(inplace)), a.type)


def ggml_scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    """Multiply every element by the number ``s``: ``s * a``.

    Differentiable (the usual way to turn a sum into a mean: ``ggml_scale(ctx, ggml_sum(ctx, x), 1/n)``).

    Arguments:
        ctx: [glossary]
        a: F32 tensor, contiguous (apply ``ggml_cont`` to a view first).
        s: the factor (a Python number).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> half = ggml_scale(ctx, x, 0.5)
    """
    a, s = check_scale("ggml_scale", a, s)
    return make_op("ggml_scale", ctx, lib.ggml_scale, (a,), a.shape, (s,), a.type)


def ggml_dropout(ctx: Context, a: Tensor, seed: Tensor, p: float, scale: float | None = None) -> Tensor:
    """Inverted dropout with its mask made where the graph runs: each element of ``a`` is kept and
    multiplied by ``scale`` (default ``1/(1 - p)``), or set to 0 with probability ``p``.

    Which elements are kept depends only on the value in ``seed`` and the element's index in a's logical
    order (``i0 + ne0*(i1 + ne1*(i2 + ne2*i3))``), through an integer hash (patches/0018): every backend makes
    the same mask bit for bit, and writing a new seed between two computes of the same graph draws a new mask
    without rebuilding it. Differentiable: the gradient goes through the same mask (the seed gets none). The
    keep test is ``u >= p`` for a 24-bit uniform ``u``, so ``p`` is used in steps of 2**-24.

    Arguments:
        ctx: [glossary]
        a: F32 tensor, any layout (views and transposes are read in their logical order).
        seed: an I32 tensor of one element (write it with ``ggml_backend_tensor_set_data`` before each compute
            that should get a new mask).
        p: the probability of dropping an element, in [0, 1).
        scale: what kept elements are multiplied by (a finite number; default ``1/(1 - p)``, computed here in
            float64 so that every backend multiplies by the same float32).

    Value: a new contiguous F32 Tensor of a's shape.

    Example:
        >>> seed = ggml_set_input(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1))
        >>> h = ggml_dropout(ctx, ggml_relu(ctx, ggml_mul_mat(ctx, w, x)), seed, 0.3)
    """
    fn = "ggml_dropout"
    a, seed = operand(fn, a), operand(fn, seed, "seed")
    _base.types(fn, a, {GGML_TYPE_F32})
    _base.types(fn, seed, {GGML_TYPE_I32}, "seed")
    if seed.nelements() != 1:
        fail(fn, f"seed must hold exactly one I32 value, got shape {list(seed.shape)}")
    rate = float_arg(fn, "p", p, finite=True)
    if not 0 <= np.float32(rate) < 1:  # as the C float ggml receives: 1 - 1e-9 would be 1
        fail(fn, f"p must be in [0, 1) as a float32, got {p!r}")
    factor = float_arg(fn, "scale", 1.0 / (1.0 - float(np.float32(rate))) if scale is None else scale,
                           finite=True)
    return make_op(fn, ctx, lib.ggml_dropout, (a, seed), a.shape, (float(np.float32(rate)), factor), GGML_TYPE_F32)


def check_scale(fn: str, a: object, s: object) -> tuple[Tensor, float]:
    a = operand(fn, a)
    _base.types(fn, a, {GGML_TYPE_F32})  # the CPU kernel is F32-only and needs contiguous data
    contiguous(fn, a)
    padded_1d(fn, a)  # ggml asserts it (a transposed [1, n] tensor is contiguous but not padded)
    return a, float_arg(fn, "s", s, finite=True)


def ggml_clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:  # noqa: A002 - ggml's names
    """Clamp every element into ``[min, max]``: ``minimum(maximum(a, min), max)``.

    A new tensor (since ggml 0.25; ggml 0.20 clamped ``a`` in place, which ``ggml_clamp_inplace`` still
    does). ggml has no backward pass for it, so it may not lie between a trainable parameter and the loss
    (clamp the data instead, or use relu-based bounds such as ``x - relu(x - c)`` for ``min(x, c)``).

    Arguments:
        ctx: [glossary]
        a: F32 or F16 tensor with contiguous rows.
        min: the lower bound (a number); max: the upper bound, ``min <= max`` (else GgmlValueError).
            Infinite bounds are allowed (no bound on that side).

    Value: a new Tensor of a's shape and type, computed when the graph runs.

    Example:
        >>> p = ggml_clamp(ctx, ggml_sigmoid(ctx, z), 1e-6, 1 - 1e-6)
    """
    a, lo, hi = check_clamp("ggml_clamp", a, min, max)
    return make_op("ggml_clamp", ctx, lib.ggml_clamp, (a,), a.shape, (lo, hi), a.type)


def check_clamp(fn: str, a: object, lo: object, hi: object) -> tuple[Tensor, float, float]:
    a = operand(fn, a)
    _base.types(fn, a, F32_F16)
    rows_contiguous(fn, a)
    lo, hi = float_arg(fn, "min", lo), float_arg(fn, "max", hi)
    if lo > hi:
        fail(fn, f"min must be <= max, got {lo} > {hi}")
    return a, lo, hi


def ggml_norm(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    """Normalise each row to mean 0 and variance 1: ``(x - mean) / sqrt(var + eps)`` over ne[0].

    The statistics are taken over the ne[0] values of each row; there is no learnable scale or shift
    (multiply and add tensors yourself, as layer normalisation does). Differentiable.

    Arguments:
        ctx: [glossary]
        a: F32 tensor.
        eps: a small positive number added to the variance to avoid dividing by zero (default 1e-5).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> y = ggml_add(ctx, ggml_mul(ctx, ggml_norm(ctx, x, 1e-5), gamma), beta)   # layer norm
    """
    a, eps = check_norm("ggml_norm", a, eps)
    return make_op("ggml_norm", ctx, lib.ggml_norm, (a,), a.shape, (eps,))


def check_norm(fn: str, a: object, eps: object) -> tuple[Tensor, float]:
    a = operand(fn, a)
    _base.types(fn, a, {GGML_TYPE_F32})
    return a, eps_arg(fn, "eps", eps)


def ggml_rms_norm(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    """RMS normalisation of each row: ``x / sqrt(mean(x**2) + eps)`` over ne[0].

    Like ``ggml_norm`` without subtracting the mean (as in RMSNorm / LLaMA). Differentiable.

    Arguments:
        ctx: [glossary]
        a: F32 tensor with contiguous rows.
        eps: a small positive number added to the mean square (default 1e-5).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> y = ggml_mul(ctx, ggml_rms_norm(ctx, x), weight)
    """
    a, eps = check_rms_norm("ggml_rms_norm", a, eps)
    return make_op("ggml_rms_norm", ctx, lib.ggml_rms_norm, (a,), a.shape, (eps,))


def check_rms_norm(fn: str, a: object, eps: object) -> tuple[Tensor, float]:
    a = operand(fn, a)
    _base.types(fn, a, {GGML_TYPE_F32})
    rows_contiguous(fn, a)
    return a, eps_arg(fn, "eps", eps)


def ggml_soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None = None, scale: float = 1.0,
                      max_bias: float = 0.0) -> Tensor:
    """Fused softmax of ``a * scale + mask`` over ne[0], with optional ALiBi slopes.

    The attention softmax: each row of ``a * scale`` plus the matching row of ``mask`` (use -inf to
    exclude positions) is turned into a distribution. With ``max_bias > 0`` the mask is multiplied by
    per-head ALiBi slopes derived from ``max_bias`` (heads along ne[2]).

    Arguments:
        ctx: [glossary]
        a: F32 tensor ``[n_kv, n_q, n_head, n_seq]``, contiguous.
        mask: None (the default: no mask) or a contiguous F32/F16 tensor with ``ne[0] == a.ne[0]``,
            ``ne[1] >= a.ne[1]`` and ne[2], ne[3] dividing a's (it is broadcast over them).
        scale: the factor applied to ``a`` first (default 1.0; ``1/sqrt(d_head)`` in attention).
        max_bias: 0.0 (the default) for no ALiBi; > 0 needs a mask (else GgmlValueError).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> attn = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, k, q), kq_mask, 1 / d_head ** 0.5)
    """
    a, mask, scale, max_bias = check_soft_max_ext("ggml_soft_max_ext", a, mask, scale, max_bias)
    return make_op("ggml_soft_max_ext", ctx, lib.ggml_soft_max_ext, (a, mask), a.shape, (scale, max_bias))


def check_soft_max_ext(fn: str, a: object, mask: object, scale: object, max_bias: object) -> tuple:
    a = operand(fn, a)
    _base.types(fn, a, {GGML_TYPE_F32})
    contiguous(fn, a)
    scale, max_bias = float_arg(fn, "scale", scale), float_arg(fn, "max_bias", max_bias)
    if not math.isfinite(scale) or not math.isfinite(max_bias) or max_bias < 0:
        fail(fn, f"scale must be finite and max_bias a finite number >= 0 (0 for no ALiBi), got scale={scale}, "
                     f"max_bias={max_bias}")
    if mask is not None:
        mask = operand(fn, mask, "mask")
        _base.types(fn, mask, {GGML_TYPE_F32, GGML_TYPE_F16}, "mask")
        contiguous(fn, mask, "mask")
        if mask.shape[0] != a.shape[0] or mask.shape[1] < a.shape[1] or a.shape[2] % mask.shape[2] \
                or a.shape[3] % mask.shape[3]:
            fail(fn, f"mask {list(mask.shape)} must have ne[0] == {a.shape[0]}, ne[1] >= {a.shape[1]} and "
                         f"ne[2], ne[3] dividing a's {a.shape[2]}, {a.shape[3]}")
    elif max_bias > 0:
        fail(fn, f"max_bias > 0 (ALiBi) needs a mask, got max_bias={max_bias} and no mask")
    return a, mask, scale, max_bias


def ggml_diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Causal mask: set the elements above the (shifted) diagonal to -inf.

    In each row ``j`` (index along ne[1]) the elements at columns ``i > n_past + j`` (index along ne[0])
    become ``-inf``, the others are copied; the same for every ne[2], ne[3]. Followed by
    ``ggml_soft_max`` this gives causal attention weights. Differentiable.

    Arguments:
        ctx: [glossary]
        a: F32 tensor, contiguous (typically ``[n_kv, n_q, ...]`` attention scores).
        n_past: the number of earlier positions every row may also see (an int >= 0; 0 is a plain
            lower-triangular mask).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> w = ggml_soft_max(ctx, ggml_diag_mask_inf(ctx, scores, 0))
    """
    a, n_past = check_diag_mask_inf("ggml_diag_mask_inf", a, n_past)
    return make_op("ggml_diag_mask_inf", ctx, lib.ggml_diag_mask_inf, (a,), a.shape, (n_past,), a.type)


def check_diag_mask_inf(fn: str, a: object, n_past: object) -> tuple[Tensor, int]:
    a = operand(fn, a)
    _base.types(fn, a, {GGML_TYPE_F32})
    contiguous(fn, a)
    return a, c_int_arg(fn, "n_past", n_past, 0)


def ggml_scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """Scale and shift by two numbers: ``s * a + b``, element-wise.

    Arguments:
        ctx: [glossary]
        a: F32 tensor, contiguous.
        s: the factor (a number). b: the number added afterwards.

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> y = ggml_scale_bias(ctx, x, 2.0, -1.0)   # maps [0, 1] to [-1, 1]
    """
    a = operand("ggml_scale_bias", a)
    _base.types("ggml_scale_bias", a, {GGML_TYPE_F32})
    contiguous("ggml_scale_bias", a)
    padded_1d("ggml_scale_bias", a)  # ggml asserts it (a transposed [1, n] tensor is contiguous but not padded)
    return make_op("ggml_scale_bias", ctx, lib.ggml_scale_bias, (a,), a.shape,
               (float_arg("ggml_scale_bias", "s", s, finite=True), float_arg("ggml_scale_bias", "b", b, finite=True)),
               a.type)
