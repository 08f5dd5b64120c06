"""Graph operations, with ggml's argument order: context, operands, then C's scalars.

Each op checks its operands (shapes, types, ranges) and the context's free memory in
Python, then calls ggml; the result is a ``Tensor`` of ``ctx``.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from . import _checks as chk
from ._ffi import ffi, lib
from ._handle import unwrap
from .context import (FLOAT_TYPES, GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I16, GGML_TYPE_I32,
                      Context, Tensor, as_tensor)

F32_F16 = {GGML_TYPE_F32, GGML_TYPE_F16}

GGML_OP_POOL_MAX = int(lib.GGML_OP_POOL_MAX)
GGML_OP_POOL_AVG = int(lib.GGML_OP_POOL_AVG)
# the precisions ggml_prec_set_acc / ggml_prec_set_src take, widest first
GGML_PREC_DEFAULT = int(lib.GGML_PREC_DEFAULT)
GGML_PREC_F32 = int(lib.GGML_PREC_F32)
GGML_PREC_BF16 = int(lib.GGML_PREC_BF16)
GGML_PREC_F16 = int(lib.GGML_PREC_F16)
GGML_PREC_Q8 = int(lib.GGML_PREC_Q8)
GGML_PREC_Q4 = int(lib.GGML_PREC_Q4)
_PRECS = {GGML_PREC_DEFAULT: "GGML_PREC_DEFAULT", GGML_PREC_F32: "GGML_PREC_F32", GGML_PREC_BF16: "GGML_PREC_BF16",
          GGML_PREC_F16: "GGML_PREC_F16", GGML_PREC_Q8: "GGML_PREC_Q8", GGML_PREC_Q4: "GGML_PREC_Q4"}


def _op(fn: str, ctx: Context, c_fn: Callable, tensors: tuple, shape: tuple | None, args: tuple = (),
        out_type: int = GGML_TYPE_F32) -> Tensor:
    """Check the context, reserve room for the result, call ggml and wrap the result."""
    ctx_ptr = unwrap(ctx, Context, f"{fn}(ctx)")
    n = 1
    for d in shape or (1,):
        n *= d
    if n * int(lib.ggml_type_size(out_type)) > chk.INT64_MAX:
        chk.fail(fn, f"the result would have shape {list(shape)}: {n} elements, beyond ggml's 64-bit sizes; "
                     "use smaller operands")
    ctx.reserve(n * int(lib.ggml_type_size(out_type)), what=f"{fn} result")
    ptrs = [t.ptr if t is not None else ffi.NULL for t in tensors]
    return Tensor(c_fn(ctx_ptr, *ptrs, *args), ctx, sources=tensors)  # it depends on its operands' contexts


def _t(fn: str, x: Any, what: str = "a") -> Tensor:
    return as_tensor(x, f"{fn}({what})")


# ---------------------------------------------------------------- element-wise binary

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


def _check_binary(fn: str, a: Any, b: Any) -> tuple[Tensor, Tensor, tuple]:
    """The operands of an element-wise binary op (also its in-place form, ops_inplace): (a, b, result shape)."""
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.floating(fn, ("a", a), ("b", b))
    if b.type not in (a.type, GGML_TYPE_F32):  # the CPU kernels: same types, or an F32 b
        chk.fail(fn, f"b must be {chk.type_name(a.type)} or F32 when a is {chk.type_name(a.type)}, got "
                     f"{chk.type_name(b.type)}", chk.GgmlTypeError)
    chk.rows_contiguous(fn, a)
    return a, b, chk.broadcast_into(fn, a, b)


def _binary(name: str, c_fn: Callable) -> Callable:
    def op(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        a, b, shape = _check_binary(name, a, b)
        return _op(name, ctx, c_fn, (a, b), shape, out_type=a.type)
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
    "ggml_gelu": "Differentiable. On the CPU, F32 inputs in (-10, 10) are looked up in an F16 table (about three\n"
                 "    significant digits).",
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


# name -> check(fn, a) -> a: what each element-wise unary op accepts (shared with its in-place form, ops_inplace)
_UNARY_CHECKS: dict[str, Callable[[str, Any], Tensor]] = {}


def _unary_check(needs_contiguous_rows: bool, types) -> Callable[[str, Any], Tensor]:
    def check(fn: str, a: Any) -> Tensor:
        a = _t(fn, a)
        chk.types(fn, a, types)
        if needs_contiguous_rows:
            chk.rows_contiguous(fn, a)
        return a
    return check


def _unary(name: str, c_fn: Callable, needs_contiguous_rows: bool = True, types=FLOAT_TYPES) -> Callable:
    check = _UNARY_CHECKS[name] = _unary_check(needs_contiguous_rows, types)

    def op(ctx: Context, a: Tensor) -> Tensor:
        a = check(name, a)
        return _op(name, ctx, c_fn, (a,), a.shape, out_type=a.type)
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
        ctx: the context the result tensor is created in.
        a: F32 tensor, contiguous (apply ``ggml_cont`` to a transposed or permuted view first).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> probs = ggml_soft_max(ctx, logits)      # logits [n_classes, batch]
    """
    a = _check_soft_max("ggml_soft_max", a)
    return _op("ggml_soft_max", ctx, lib.ggml_soft_max, (a,), a.shape)


def _check_soft_max(fn: str, a: Any) -> Tensor:
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.contiguous(fn, a)
    return a


def ggml_leaky_relu(ctx: Context, a: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """Leaky ReLU: ``x`` where ``x > 0``, else ``negative_slope * x``, element-wise.

    ggml has no backward pass for it: in a trainable graph it may not lie between a parameter and the
    loss (training raises an error naming it; build ``x - slope * relu(-x)`` from ``ggml_relu``,
    ``ggml_scale`` and ``ggml_sub`` instead). Fine for inference.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 or F16 tensor.
        negative_slope: the factor applied to negative values, a finite number (default 0.01, as in Keras and
            PyTorch; NaN or inf is a GgmlValueError).
        inplace: False (the default) computes into a new tensor; True returns a view of ``a`` and
            overwrites a's data when the graph runs.

    Value: a Tensor of a's shape and type.

    Example:
        >>> h = ggml_leaky_relu(ctx, ggml_mul_mat(ctx, w, x), 0.2)
    """
    a = _t("ggml_leaky_relu", a)
    chk.types("ggml_leaky_relu", a, F32_F16)
    chk.contiguous("ggml_leaky_relu", a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    slope = chk.float_arg("ggml_leaky_relu", "negative_slope", negative_slope, finite=True)
    return _op("ggml_leaky_relu", ctx, lib.ggml_leaky_relu, (a,), a.shape, (slope, bool(inplace)), a.type)


def ggml_scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    """Multiply every element by the number ``s``: ``s * a``.

    Differentiable (the usual way to turn a sum into a mean: ``ggml_scale(ctx, ggml_sum(ctx, x), 1/n)``).

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor, contiguous (apply ``ggml_cont`` to a view first).
        s: the factor (a Python number).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> half = ggml_scale(ctx, x, 0.5)
    """
    a, s = _check_scale("ggml_scale", a, s)
    return _op("ggml_scale", ctx, lib.ggml_scale, (a,), a.shape, (s,), a.type)


def ggml_dropout(ctx: Context, a: Tensor, seed: Tensor, p: float, scale: float | None = None) -> Tensor:
    """Inverted dropout with its mask made where the graph runs: each element of ``a`` is kept and
    multiplied by ``scale`` (default ``1/(1 - p)``), or set to 0 with probability ``p``.

    Which elements are kept depends only on the value in ``seed`` and the element's index in a's logical
    order (``i0 + ne0*(i1 + ne1*(i2 + ne2*i3))``), through an integer hash (patches/0018): every backend makes
    the same mask bit for bit, and writing a new seed between two computes of the same graph draws a new mask
    without rebuilding it. Differentiable: the gradient goes through the same mask (the seed gets none). The
    keep test is ``u >= p`` for a 24-bit uniform ``u``, so ``p`` is used in steps of 2**-24.

    Arguments:
        ctx: the context the result tensor is created in.
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
    a, seed = _t(fn, a), _t(fn, seed, "seed")
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.types(fn, seed, {GGML_TYPE_I32}, "seed")
    if seed.nelements() != 1:
        chk.fail(fn, f"seed must hold exactly one I32 value, got shape {list(seed.shape)}")
    rate = chk.float_arg(fn, "p", p, finite=True)
    if not 0 <= np.float32(rate) < 1:  # as the C float ggml receives: 1 - 1e-9 would be 1
        chk.fail(fn, f"p must be in [0, 1) as a float32, got {p!r}")
    factor = chk.float_arg(fn, "scale", 1.0 / (1.0 - float(np.float32(rate))) if scale is None else scale,
                           finite=True)
    return _op(fn, ctx, lib.ggml_dropout, (a, seed), a.shape, (float(np.float32(rate)), factor), GGML_TYPE_F32)


def _check_scale(fn: str, a: Any, s: Any) -> tuple[Tensor, float]:
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})  # the CPU kernel is F32-only and needs contiguous data
    chk.contiguous(fn, a)
    chk.padded_1d(fn, a)  # ggml asserts it (a transposed [1, n] tensor is contiguous but not padded)
    return a, chk.float_arg(fn, "s", s, finite=True)


def ggml_clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:  # noqa: A002 - ggml's names
    """Clamp every element into ``[min, max]``: ``minimum(maximum(a, min), max)``.

    A new tensor (since ggml 0.25; ggml 0.20 clamped ``a`` in place, which ``ggml_clamp_inplace`` still
    does). ggml has no backward pass for it, so it may not lie between a trainable parameter and the loss
    (clamp the data instead, or use relu-based bounds such as ``x - relu(x - c)`` for ``min(x, c)``).

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 or F16 tensor with contiguous rows.
        min: the lower bound (a number); max: the upper bound, ``min <= max`` (else GgmlValueError).
            Infinite bounds are allowed (no bound on that side).

    Value: a new Tensor of a's shape and type, computed when the graph runs.

    Example:
        >>> p = ggml_clamp(ctx, ggml_sigmoid(ctx, z), 1e-6, 1 - 1e-6)
    """
    a, lo, hi = _check_clamp("ggml_clamp", a, min, max)
    return _op("ggml_clamp", ctx, lib.ggml_clamp, (a,), a.shape, (lo, hi), a.type)


def _check_clamp(fn: str, a: Any, lo: Any, hi: Any) -> tuple[Tensor, float, float]:
    a = _t(fn, a)
    chk.types(fn, a, F32_F16)
    chk.rows_contiguous(fn, a)
    lo, hi = chk.float_arg(fn, "min", lo), chk.float_arg(fn, "max", hi)
    if lo > hi:
        chk.fail(fn, f"min must be <= max, got {lo} > {hi}")
    return a, lo, hi


def ggml_norm(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    """Normalise each row to mean 0 and variance 1: ``(x - mean) / sqrt(var + eps)`` over ne[0].

    The statistics are taken over the ne[0] values of each row; there is no learnable scale or shift
    (multiply and add tensors yourself, as layer normalisation does). Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor.
        eps: a small positive number added to the variance to avoid dividing by zero (default 1e-5).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> y = ggml_add(ctx, ggml_mul(ctx, ggml_norm(ctx, x, 1e-5), gamma), beta)   # layer norm
    """
    a, eps = _check_norm("ggml_norm", a, eps)
    return _op("ggml_norm", ctx, lib.ggml_norm, (a,), a.shape, (eps,))


def _check_norm(fn: str, a: Any, eps: Any) -> tuple[Tensor, float]:
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    return a, chk.eps_arg(fn, "eps", eps)


def ggml_rms_norm(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    """RMS normalisation of each row: ``x / sqrt(mean(x**2) + eps)`` over ne[0].

    Like ``ggml_norm`` without subtracting the mean (as in RMSNorm / LLaMA). Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor with contiguous rows.
        eps: a small positive number added to the mean square (default 1e-5).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> y = ggml_mul(ctx, ggml_rms_norm(ctx, x), weight)
    """
    a, eps = _check_rms_norm("ggml_rms_norm", a, eps)
    return _op("ggml_rms_norm", ctx, lib.ggml_rms_norm, (a,), a.shape, (eps,))


def _check_rms_norm(fn: str, a: Any, eps: Any) -> tuple[Tensor, float]:
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.rows_contiguous(fn, a)
    return a, chk.eps_arg(fn, "eps", eps)


def ggml_soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None = None, scale: float = 1.0,
                      max_bias: float = 0.0) -> Tensor:
    """Fused softmax of ``a * scale + mask`` over ne[0], with optional ALiBi slopes.

    The attention softmax: each row of ``a * scale`` plus the matching row of ``mask`` (use -inf to
    exclude positions) is turned into a distribution. With ``max_bias > 0`` the mask is multiplied by
    per-head ALiBi slopes derived from ``max_bias`` (heads along ne[2]).

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor ``[n_kv, n_q, n_head, n_seq]``, contiguous.
        mask: None (the default: no mask) or a contiguous F32/F16 tensor with ``ne[0] == a.ne[0]``,
            ``ne[1] >= a.ne[1]`` and ne[2], ne[3] dividing a's (it is broadcast over them).
        scale: the factor applied to ``a`` first (default 1.0; ``1/sqrt(d_head)`` in attention).
        max_bias: 0.0 (the default) for no ALiBi; > 0 needs a mask (else GgmlValueError).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> attn = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, k, q), kq_mask, 1 / d_head ** 0.5)
    """
    a, mask, scale, max_bias = _check_soft_max_ext("ggml_soft_max_ext", a, mask, scale, max_bias)
    return _op("ggml_soft_max_ext", ctx, lib.ggml_soft_max_ext, (a, mask), a.shape, (scale, max_bias))


def _check_soft_max_ext(fn: str, a: Any, mask: Any, scale: Any, max_bias: Any) -> tuple:
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.contiguous(fn, a)
    scale, max_bias = chk.float_arg(fn, "scale", scale), chk.float_arg(fn, "max_bias", max_bias)
    if not math.isfinite(scale) or not math.isfinite(max_bias) or max_bias < 0:
        chk.fail(fn, f"scale must be finite and max_bias a finite number >= 0 (0 for no ALiBi), got scale={scale}, "
                     f"max_bias={max_bias}")
    if mask is not None:
        mask = _t(fn, mask, "mask")
        chk.types(fn, mask, {GGML_TYPE_F32, GGML_TYPE_F16}, "mask")
        chk.contiguous(fn, mask, "mask")
        if mask.shape[0] != a.shape[0] or mask.shape[1] < a.shape[1] or a.shape[2] % mask.shape[2] \
                or a.shape[3] % mask.shape[3]:
            chk.fail(fn, f"mask {list(mask.shape)} must have ne[0] == {a.shape[0]}, ne[1] >= {a.shape[1]} and "
                         f"ne[2], ne[3] dividing a's {a.shape[2]}, {a.shape[3]}")
    elif max_bias > 0:
        chk.fail(fn, f"max_bias > 0 (ALiBi) needs a mask, got max_bias={max_bias} and no mask")
    return a, mask, scale, max_bias


def ggml_diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Causal mask: set the elements above the (shifted) diagonal to -inf.

    In each row ``j`` (index along ne[1]) the elements at columns ``i > n_past + j`` (index along ne[0])
    become ``-inf``, the others are copied; the same for every ne[2], ne[3]. Followed by
    ``ggml_soft_max`` this gives causal attention weights. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor, contiguous (typically ``[n_kv, n_q, ...]`` attention scores).
        n_past: the number of earlier positions every row may also see (an int >= 0; 0 is a plain
            lower-triangular mask).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> w = ggml_soft_max(ctx, ggml_diag_mask_inf(ctx, scores, 0))
    """
    a, n_past = _check_diag_mask_inf("ggml_diag_mask_inf", a, n_past)
    return _op("ggml_diag_mask_inf", ctx, lib.ggml_diag_mask_inf, (a,), a.shape, (n_past,), a.type)


def _check_diag_mask_inf(fn: str, a: Any, n_past: Any) -> tuple[Tensor, int]:
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.contiguous(fn, a)
    return a, chk.c_int_arg(fn, "n_past", n_past, 0)


# ---------------------------------------------------------------- reductions, broadcast

def ggml_sum(ctx: Context, a: Tensor) -> Tensor:
    """Sum of all elements, as a one-element tensor.

    Differentiable; ``ggml_sum`` of a per-element loss followed by ``ggml_scale`` is the usual way to
    build a scalar loss for ``ggml_set_loss``.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32, F16 or BF16 tensor.

    Value: a new Tensor of shape ``[1, 1, 1, 1]`` and a's type.

    Example:
        >>> loss = ggml_set_loss(ggml_scale(ctx, ggml_sum(ctx, ggml_sqr(ctx, err)), 1 / n))
    """
    a = _t("ggml_sum", a)
    chk.floating("ggml_sum", ("a", a))
    chk.contiguous("ggml_sum", a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    return _op("ggml_sum", ctx, lib.ggml_sum, (a,), (1, 1, 1, 1), out_type=a.type)


def ggml_sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """Sum of each row: ``[ne0, ne1, ne2, ne3]`` becomes ``[1, ne1, ne2, ne3]``.

    Reduces over ne[0] (the fastest axis: the features of a sample in ggml layout). Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor with contiguous rows.

    Value: a new F32 Tensor of shape ``[1, ne1, ne2, ne3]``.

    Example:
        >>> totals = ggml_sum_rows(ctx, x)          # x [features, batch] -> [1, batch]
    """
    a = _t("ggml_sum_rows", a)
    chk.types("ggml_sum_rows", a, {GGML_TYPE_F32})
    chk.rows_contiguous("ggml_sum_rows", a)
    return _op("ggml_sum_rows", ctx, lib.ggml_sum_rows, (a,), (1,) + a.shape[1:], out_type=a.type)


def ggml_mean(ctx: Context, a: Tensor) -> Tensor:
    """Mean of each row: ``[ne0, ne1, ne2, ne3]`` becomes ``[1, ne1, ne2, ne3]``.

    Reduces over ne[0]. Differentiable, with one limit of ggml's backward pass: when the input of a
    mean over more than one row also feeds another op on the path to the loss, training is refused
    with an error; use ``ggml_scale(ctx, ggml_sum_rows(ctx, x), 1 / ne0)`` there.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor.

    Value: a new F32 Tensor of shape ``[1, ne1, ne2, ne3]``.

    Example:
        >>> m = ggml_mean(ctx, x)                   # x [features, batch] -> [1, batch]
    """
    a = _t("ggml_mean", a)
    chk.types("ggml_mean", a, {GGML_TYPE_F32})
    chk.contiguous("ggml_mean", a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    return _op("ggml_mean", ctx, lib.ggml_mean, (a,), (1,) + a.shape[1:])


def ggml_argmax(ctx: Context, a: Tensor) -> Tensor:
    """Index of the largest value in each row (over ne[0]): ``[ne0, ne1]`` becomes ``[ne1]`` (I32).

    The predicted class of each column of logits. Not differentiable, but an I32 side output next to
    a trainable graph is fine.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 matrix: ne[2] == ne[3] == 1 (else GgmlValueError).

    Value: a new I32 Tensor of shape ``[ne1, 1, 1, 1]``, 0-based indices into ne[0].

    Example:
        >>> pred = ggml_argmax(ctx, logits)         # logits [n_classes, batch] -> [batch]
    """
    a = _t("ggml_argmax", a)
    chk.types("ggml_argmax", a, {GGML_TYPE_F32})
    chk.rows_contiguous("ggml_argmax", a)  # the CPU kernel reads each row as contiguous
    if a.shape[2] != 1 or a.shape[3] != 1:
        chk.fail("ggml_argmax", f"a must be a matrix (ne[2] == ne[3] == 1), got {list(a.shape)}")
    return _op("ggml_argmax", ctx, lib.ggml_argmax, (a,), (a.shape[1], 1, 1, 1), out_type=GGML_TYPE_I32)


def ggml_count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Number of positions where two I32 tensors hold the same value, as an I64 scalar.

    With ``ggml_argmax`` of the outputs and of one-hot labels this counts the correct predictions.

    Arguments:
        ctx: the context the result tensor is created in.
        a: I32 tensor. b: I32 tensor of the same shape (else GgmlValueError).

    Value: a new I64 Tensor of shape ``[1, 1, 1, 1]``.

    Example:
        >>> n_ok = ggml_count_equal(ctx, ggml_argmax(ctx, logits), ggml_argmax(ctx, labels))
    """
    a, b = _t("ggml_count_equal", a), _t("ggml_count_equal", b, "b")
    chk.types("ggml_count_equal", a, {GGML_TYPE_I32})
    chk.types("ggml_count_equal", b, {GGML_TYPE_I32}, "b")
    chk.same_shape("ggml_count_equal", a, b)
    return _op("ggml_count_equal", ctx, lib.ggml_count_equal, (a, b), (1, 1, 1, 1), out_type=lib.GGML_TYPE_I64)


def ggml_repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Tile ``a`` to the shape of ``b`` (only b's shape is used, not its data).

    Every ne[i] of b must be a multiple of a's ne[i]; a is repeated that many times along each
    dimension. Differentiable (its backward is ``ggml_repeat_back``). Use it to make a broadcast
    explicit, e.g. before a ``ggml_sub``/``ggml_div`` whose second operand needs a gradient.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32, F16, BF16, I16 or I32 tensor with contiguous rows.
        b: any tensor whose shape is a multiple of a's in every dimension (else GgmlValueError).

    Value: a new Tensor of b's shape and a's type.

    Example:
        >>> bias_full = ggml_repeat(ctx, bias, h)   # bias [n, 1] -> h's [n, batch]
    """
    a, b = _t("ggml_repeat", a), _t("ggml_repeat", b, "b")
    chk.types("ggml_repeat", a, {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_I16, GGML_TYPE_I32})
    chk.rows_contiguous("ggml_repeat", a)
    if not chk.can_repeat(a.shape, b.shape):
        chk.fail("ggml_repeat", f"a {list(a.shape)} cannot be repeated to b's shape {list(b.shape)}")
    return _op("ggml_repeat", ctx, lib.ggml_repeat, (a, b), b.shape, out_type=a.type)


def ggml_repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Sum ``a`` down to the shape of ``b``: the adjoint of ``ggml_repeat``.

    Each element of the result is the sum of the elements of ``a`` that ``ggml_repeat`` would have
    copied it to; b's shape must repeat into a's (each ne[i] of a a multiple of b's). Only b's shape
    is used.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor with contiguous rows.
        b: a tensor whose shape divides a's in every dimension (else GgmlValueError).

    Value: a new F32 Tensor of b's shape.

    Example:
        >>> per_feature = ggml_repeat_back(ctx, grads, bias)   # [n, batch] -> [n, 1]
    """
    a, b = _t("ggml_repeat_back", a), _t("ggml_repeat_back", b, "b")
    chk.types("ggml_repeat_back", a, {GGML_TYPE_F32})
    chk.rows_contiguous("ggml_repeat_back", a)
    if not chk.can_repeat(b.shape, a.shape):
        chk.fail("ggml_repeat_back", f"b {list(b.shape)} must repeat into a {list(a.shape)}")
    return _op("ggml_repeat_back", ctx, lib.ggml_repeat_back, (a, b), b.shape, out_type=a.type)


def ggml_concat(ctx: Context, a: Tensor, b: Tensor, dim: int = 0) -> Tensor:
    """Concatenate ``a`` and ``b`` along dimension ``dim``.

    The shapes must agree in every other dimension and the types must match. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: a tensor. b: a tensor of a's type, with a's shape outside ``dim``.
        dim: the ggml dimension to join along, 0-3 (default 0: ne[0], the features of a sample).

    Value: a new Tensor of a's type whose ``ne[dim]`` is ``a.ne[dim] + b.ne[dim]``.

    Example:
        >>> h = ggml_concat(ctx, h1, h2, 0)         # [n1, batch] + [n2, batch] -> [n1 + n2, batch]
    """
    fn = "ggml_concat"
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.c_int_arg(fn, "dim", dim, 0)
    if dim > 3:
        chk.fail(fn, f"dim must be in [0, 3], got {dim}")
    if a.type != b.type:
        chk.fail(fn, "a and b must have the same type", chk.GgmlTypeError)
    if any(a.shape[i] != b.shape[i] for i in range(4) if i != dim):
        chk.fail(fn, f"a {list(a.shape)} and b {list(b.shape)} must match outside dimension {dim}")
    shape = list(a.shape)
    shape[dim] += b.shape[dim]
    return _op(fn, ctx, lib.ggml_concat, (a, b), tuple(shape), (dim,), a.type)


# ---------------------------------------------------------------- matrix products, losses

def ggml_mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Matrix product sharing ne[0]: ``a [K, M]`` and ``b [K, N]`` give ``[M, N]`` (F32).

    ``result[m, n] = sum_k a[k, m] * b[k, n]``, i.e. ``a^T b`` in the ggml layout, and in numpy terms
    (numpy shape = reversed ne) ``b_np @ a_np.T``. A dense layer with weights ``w [n_in, n_out]`` and a
    batch ``x [n_in, batch]`` is ``ggml_mul_mat(ctx, w, x)`` -> ``[n_out, batch]``. In 3-D/4-D each
    matrix of b is multiplied by the matching matrix of a; a is broadcast when b's ne[2], ne[3] are
    multiples of a's. Differentiable (trainable weights ``a`` must be F32).

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32, F16 or BF16 tensor ``[K, M, A2, A3]``, contiguous rows and not transposed
            (apply ``ggml_cont`` to a transposed view first).
        b: tensor ``[K, N, B2, B3]`` of type F32 or a's type, contiguous rows, with B2 % A2 == 0 and
            B3 % A3 == 0.

    Value: a new F32 Tensor ``[M, N, B2, B3]``. Raises GgmlValueError when ne[0] differ or the
    batch dimensions do not broadcast, GgmlTypeError for other types.

    Example:
        >>> h = ggml_mul_mat(ctx, w, x)             # w [784, 128], x [784, 32] -> [128, 32]
    """
    a, b = _t("ggml_mul_mat", a), _t("ggml_mul_mat", b, "b")
    chk.floating("ggml_mul_mat", ("a", a), ("b", b))
    if b.type not in (a.type, GGML_TYPE_F32):  # the CPU backend: b is F32 or a's dot-product type
        chk.fail("ggml_mul_mat", f"b must be F32 or {chk.type_name(a.type)} when a is {chk.type_name(a.type)}, got "
                                 f"{chk.type_name(b.type)}", chk.GgmlTypeError)
    chk.rows_contiguous("ggml_mul_mat", a)
    chk.rows_contiguous("ggml_mul_mat", b, "b")
    return _op("ggml_mul_mat", ctx, lib.ggml_mul_mat, (a, b), chk.mul_mat("ggml_mul_mat", a, b))


def _prec_arg(fn: str, prec: Any) -> int:
    if not chk.is_int(prec) or int(prec) not in _PRECS:
        names = ", ".join(f"{n} ({v})" for v, n in _PRECS.items())
        chk.fail(fn, f"prec must be one of {names}, got {prec!r}", chk.GgmlValueError if chk.is_int(prec)
                 else chk.GgmlTypeError)
    return int(prec)


def ggml_prec_set_acc(a: Tensor, prec: int) -> bool:
    """Set the narrowest type a matrix product (or fused attention) may accumulate its sums in.

    ``GGML_PREC_F32`` asks every backend to accumulate ``a``'s sums in float32; ``GGML_PREC_DEFAULT``
    leaves the choice to the backend (GPU backends may then accumulate F16 weights' products in F16, which
    is faster and less exact); ``GGML_PREC_BF16``/``GGML_PREC_F16`` allow those types explicitly. ggml
    0.25 reads it for ``ggml_mul_mat``, ``ggml_mul_mat_id`` and ``ggml_flash_attn_ext`` results (it
    replaces ggml 0.20's ``ggml_mul_mat_set_prec``). Float32 weights are always accumulated in float32.

    Arguments:
        a: the result tensor of one of those ops (set before the graph is computed).
        prec: one of ``GGML_PREC_DEFAULT``, ``GGML_PREC_F32``, ``GGML_PREC_BF16``, ``GGML_PREC_F16``
            (``GGML_PREC_Q8``/``GGML_PREC_Q4`` are not allowed for accumulation).

    Value: True when the op takes the setting, False for any other op (nothing is changed then).

    Example:
        >>> h = ggml_mul_mat(ctx, w_f16, x); ggml_prec_set_acc(h, GGML_PREC_F32)
    """
    fn = "ggml_prec_set_acc"
    a = _t(fn, a)
    prec = _prec_arg(fn, prec)
    if prec in (GGML_PREC_Q8, GGML_PREC_Q4):
        chk.fail(fn, f"{_PRECS[prec]} is not an accumulation type (ggml allows it only for operands: "
                     "ggml_prec_set_src); use GGML_PREC_F32, GGML_PREC_BF16 or GGML_PREC_F16")
    return bool(lib.ggml_prec_set_acc(a.ptr, prec))


def ggml_prec_set_src(a: Tensor, prec: int, idx: int) -> bool:
    """Set the narrowest type a backend may convert operand ``idx`` of a matrix product to.

    ``ggml_prec_set_src(h, GGML_PREC_Q8, 1)`` lets a backend quantize ``b`` (the activations) of
    ``h = ggml_mul_mat(ctx, a, b)`` down to 8-bit types before the product; ``GGML_PREC_F32`` keeps them
    float32. ggml 0.25 honours it for operand 1 of ``ggml_mul_mat``/``ggml_mul_mat_id``; other ops and
    operands answer False.

    Arguments:
        a: the result tensor of the product.
        prec: one of ``GGML_PREC_DEFAULT``, ``GGML_PREC_F32``, ``GGML_PREC_BF16``, ``GGML_PREC_F16``,
            ``GGML_PREC_Q8``, ``GGML_PREC_Q4``.
        idx: the operand, an int in ``[0, 10)`` (only 1 is taken today).

    Value: True when the op takes the setting, False otherwise (nothing is changed then).

    Example:
        >>> h = ggml_mul_mat(ctx, w_q4, x); ggml_prec_set_src(h, GGML_PREC_F32, 1)
    """
    fn = "ggml_prec_set_src"
    a = _t(fn, a)
    prec = _prec_arg(fn, prec)
    if not chk.is_int(idx):
        chk.fail(fn, f"idx must be an int, got {idx!r}", chk.GgmlTypeError)
    if not 0 <= int(idx) < int(lib.GGML_MAX_SRC):  # ggml asserts it
        chk.fail(fn, f"idx must be an operand index in [0, {int(lib.GGML_MAX_SRC)}), got {idx}")
    return bool(lib.ggml_prec_set_src(a.ptr, prec, int(idx)))


def ggml_out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Sum of outer products: ``a [M, K]`` and ``b [N, K]`` give ``[M, N]`` (F32).

    ``result[m, n] = sum_k a[m, k] * b[n, k]`` (the ne[1] dimension is reduced); this is how ggml
    computes weight gradients of ``ggml_mul_mat``. In 3-D/4-D, a is broadcast when b's ne[2], ne[3]
    are multiples of a's.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 or F16 tensor ``[M, K, A2, A3]``, not transposed; an F16 a cannot be broadcast.
        b: F32 tensor ``[N, K, B2, B3]`` sharing ne[1] with a.

    Value: a new F32 Tensor ``[M, N, B2, B3]``.

    Example:
        >>> g_w = ggml_out_prod(ctx, x, g_h)        # x [n_in, batch], g_h [n_out, batch] -> [n_in, n_out]
    """
    a, b = _t("ggml_out_prod", a), _t("ggml_out_prod", b, "b")
    chk.types("ggml_out_prod", a, F32_F16)
    chk.types("ggml_out_prod", b, {GGML_TYPE_F32}, "b")
    if a.type == GGML_TYPE_F16 and a.shape[2:] != b.shape[2:]:
        chk.fail("ggml_out_prod", f"an F16 a cannot be broadcast: a {list(a.shape)}, b {list(b.shape)}")
    chk.not_transposed("ggml_out_prod", a)
    return _op("ggml_out_prod", ctx, lib.ggml_out_prod, (a, b), chk.out_prod("ggml_out_prod", a, b))


def ggml_cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Categorical cross-entropy of logits ``a`` against label probabilities ``b``, as a scalar.

    ``-(1/rows) * sum over rows of sum_k b_k * log_softmax(a)_k``, rows being the ne[0] vectors. ``a``
    holds raw logits (the softmax is part of the loss); each row of ``b`` sums to 1 (one-hot labels).
    Differentiable; mark the result with ``ggml_set_loss`` to train on it.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 logits ``[n_classes, batch, ...]`` with contiguous rows.
        b: F32 labels of a's shape with contiguous rows.

    Value: a new F32 Tensor of shape ``[1, 1, 1, 1]``.

    Example:
        >>> loss = ggml_set_loss(ggml_cross_entropy_loss(ctx, logits, labels))
    """
    a, b = _t("ggml_cross_entropy_loss", a), _t("ggml_cross_entropy_loss", b, "b")
    chk.types("ggml_cross_entropy_loss", a, {GGML_TYPE_F32})
    chk.types("ggml_cross_entropy_loss", b, {GGML_TYPE_F32}, "b")
    chk.same_shape("ggml_cross_entropy_loss", a, b)
    chk.rows_contiguous("ggml_cross_entropy_loss", a)
    chk.rows_contiguous("ggml_cross_entropy_loss", b, "b")
    return _op("ggml_cross_entropy_loss", ctx, lib.ggml_cross_entropy_loss, (a, b), (1, 1, 1, 1))


# ---------------------------------------------------------------- layout

def ggml_reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """A view of ``a`` with the shape of ``b`` (no copy; only b's shape is used).

    Arguments:
        ctx: the context the result tensor is created in.
        a: a contiguous tensor (apply ``ggml_cont`` to a transposed/permuted view first).
        b: a tensor with as many elements as a (else GgmlValueError).

    Value: a Tensor of a's type and b's shape sharing a's data. Differentiable.

    Example:
        >>> flat = ggml_reshape(ctx, images, template)   # template: any tensor of the wanted shape
    """
    a, b = _t("ggml_reshape", a), _t("ggml_reshape", b, "b")
    chk.reshape("ggml_reshape", a, b.shape)
    return _op("ggml_reshape", ctx, lib.ggml_reshape, (a, b), None, out_type=a.type)


def _reshape(n: int) -> Callable:
    name = f"ggml_reshape_{n}d"
    c_fn = getattr(lib, name)

    def op(ctx: Context, a: Tensor, *ne: int) -> Tensor:
        a = _t(name, a)
        if len(ne) != n:
            chk.fail(name, f"expected {n} sizes, got {len(ne)}", chk.GgmlTypeError)
        chk.reshape(name, a, ne)
        return _op(name, ctx, c_fn, (a,), None, tuple(ne), a.type)  # a view: no data of its own
    op.__name__ = op.__qualname__ = name
    sizes = ", ".join(f"ne{i}" for i in range(n))
    op.__doc__ = f"""A {n}-D view of ``a`` with shape ``[{sizes}]`` (no copy): ``{name}(ctx, a, {sizes})``.

    The elements keep their ggml order (ne[0] fastest); only the shape changes, as numpy's ``reshape``
    does on the reversed shape. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: a contiguous tensor (apply ``ggml_cont`` to a transposed/permuted view first).
        {sizes}: the new sizes (ints >= 1), exactly {n} of them, whose product is a's element count.

    Value: a Tensor of a's type and the new shape sharing a's data. Raises GgmlValueError when the
    counts differ or a is not contiguous.

    Example:
        >>> y = {name}(ctx, x, {", ".join(str(v) for v in (12, 2, 3, 1)[:n])})
    """
    return op


ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d = (_reshape(n) for n in (1, 2, 3, 4))


def ggml_view_1d(ctx: Context, a: Tensor, ne0: int, offset: int = 0) -> Tensor:
    """A 1-D view of ``ne0`` consecutive elements of ``a``, starting ``offset`` bytes in.

    No copy: the view shares a's memory. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the tensor to view.
        ne0: the number of elements (>= 1).
        offset: the start, in **bytes** from the start of a's data (default 0); the view must end
            within a (else GgmlValueError).

    Value: a Tensor ``[ne0]`` of a's type viewing a's data.

    Example:
        >>> first_row = ggml_view_1d(ctx, m, m_ne0, 0)
    """
    a = _t("ggml_view_1d", a)
    chk.view("ggml_view_1d", a, (ne0,), (), offset)
    return _op("ggml_view_1d", ctx, lib.ggml_view_1d, (a,), None, (ne0, offset), a.type)


def ggml_view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0) -> Tensor:
    """A 2-D view ``[ne0, ne1]`` of ``a``, rows ``nb1`` bytes apart, starting ``offset`` bytes in.

    No copy: the view shares a's memory; elements within a row are consecutive. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the tensor to view.
        ne0, ne1: the view's shape (each >= 1).
        nb1: the distance between rows, in **bytes** (a's own row stride is ``ne0(a) * element size``).
        offset: the start, in bytes (default 0). The last element must lie within a (else
            GgmlValueError).

    Value: a Tensor ``[ne0, ne1]`` of a's type viewing a's data (possibly not contiguous).

    Example:
        >>> left = ggml_view_2d(ctx, x, 3, n, 6 * 4, 0)   # the first 3 of the 6 F32 features of x [6, n]
    """
    a = _t("ggml_view_2d", a)
    chk.view("ggml_view_2d", a, (ne0, ne1), (nb1,), offset)
    return _op("ggml_view_2d", ctx, lib.ggml_view_2d, (a,), None, (ne0, ne1, nb1, offset), a.type)


def ggml_view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int = 0) -> Tensor:
    """A 3-D view ``[ne0, ne1, ne2]`` of ``a`` with byte strides ``nb1``, ``nb2``, starting ``offset`` bytes in.

    No copy: the view shares a's memory. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the tensor to view.
        ne0, ne1, ne2: the view's shape (each >= 1).
        nb1, nb2: the strides of dimensions 1 and 2, in **bytes**.
        offset: the start, in bytes (default 0). The view must end within a (else GgmlValueError).

    Value: a Tensor ``[ne0, ne1, ne2]`` of a's type viewing a's data.

    Example:
        >>> v = ggml_view_3d(ctx, x, 4, 5, 2, 4 * 4, 4 * 4 * 5, 0)   # F32, contiguous [4, 5, 2]
    """
    a = _t("ggml_view_3d", a)
    chk.view("ggml_view_3d", a, (ne0, ne1, ne2), (nb1, nb2), offset)
    return _op("ggml_view_3d", ctx, lib.ggml_view_3d, (a,), None, (ne0, ne1, ne2, nb1, nb2, offset), a.type)


def ggml_view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
                 offset: int = 0) -> Tensor:
    """A 4-D view of ``a`` with byte strides ``nb1``, ``nb2``, ``nb3``, starting ``offset`` bytes in.

    No copy: the view shares a's memory. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the tensor to view.
        ne0, ne1, ne2, ne3: the view's shape (each >= 1).
        nb1, nb2, nb3: the strides of dimensions 1-3, in **bytes**.
        offset: the start, in bytes (default 0). The view must end within a (else GgmlValueError).

    Value: a Tensor ``[ne0, ne1, ne2, ne3]`` of a's type viewing a's data.

    Example:
        >>> v = ggml_view_4d(ctx, x, 4, 5, 2, 1, 16, 80, 160, 0)      # F32 [4, 5, 2, 1]
    """
    a = _t("ggml_view_4d", a)
    chk.view("ggml_view_4d", a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)
    return _op("ggml_view_4d", ctx, lib.ggml_view_4d, (a,), None,
               (ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset), a.type)


def ggml_permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Reorder the dimensions of ``a`` (a view, no copy): dimension i of ``a`` goes to position ``axis_i``.

    ggml's convention is the inverse of numpy's ``transpose``: ``result.ne[axis0] = a.ne[0]``,
    ``result.ne[axis1] = a.ne[1]``, and so on. The result is usually not contiguous: apply
    ``ggml_cont`` before ops that need contiguous data. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the tensor to permute.
        axis0, axis1, axis2, axis3: a permutation of 0, 1, 2, 3 (else GgmlValueError).

    Value: a Tensor of a's type viewing a's data with the permuted shape.

    Example:
        >>> y = ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3))     # swap ne[1] and ne[2]
    """
    a = _t("ggml_permute", a)
    chk.permutation("ggml_permute", (axis0, axis1, axis2, axis3))
    return _op("ggml_permute", ctx, lib.ggml_permute, (a,), None, (axis0, axis1, axis2, axis3), a.type)


def ggml_transpose(ctx: Context, a: Tensor) -> Tensor:
    """Swap ne[0] and ne[1] (a view, no copy; ``ggml_permute(ctx, a, 1, 0, 2, 3)``).

    The result is not contiguous: apply ``ggml_cont`` to get a transposed copy that ops needing
    contiguous rows accept. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the tensor to transpose.

    Value: a Tensor ``[ne1, ne0, ne2, ne3]`` of a's type viewing a's data.

    Example:
        >>> wt = ggml_cont(ctx, ggml_transpose(ctx, w))
    """
    a = _t("ggml_transpose", a)
    return _op("ggml_transpose", ctx, lib.ggml_transpose, (a,), None, out_type=a.type)


def ggml_cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Copy the values of ``a`` into ``b``, converting to b's type; returns a view of ``b``.

    When the graph runs, b's data is overwritten with a's elements (in ggml order); the shapes may
    differ as long as the element counts match. This is how to cast, e.g. an I32 or F16 tensor into
    an F32 one. Differentiable with respect to ``a``.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the source tensor.
        b: the destination tensor, with as many elements as a (else GgmlValueError).

    Value: a Tensor of b's shape and type viewing b's data.

    Example:
        >>> x_f32 = ggml_cpy(ctx, x_f16, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 4))
    """
    a, b = _t("ggml_cpy", a), _t("ggml_cpy", b, "b")
    if a.nelements() != b.nelements():
        chk.fail("ggml_cpy", f"a and b must have the same number of elements, got {a.nelements()} and {b.nelements()}")
    return _op("ggml_cpy", ctx, lib.ggml_cpy, (a, b), None, out_type=b.type)


def ggml_get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows of ``a`` picked by the I32 indices ``b``: an embedding lookup.

    ``a [n_embd, n_rows, A2, A3]`` and indices ``b [n_idx, B1, B2]`` give ``[n_embd, n_idx, B1, B2]``:
    row ``b[i]`` of a becomes column i of the result. The shapes must fit: ``a.ne[2] == b.ne[1]``,
    ``a.ne[3] == b.ne[2]``, ``b.ne[3] == 1``. Every index must be in ``[0, a.ne[1])``. Indices held by
    an input tensor (``b`` itself, or a reshape/view of it) are checked before every compute, training
    batch and ``ggml_opt_eval`` (an out-of-range one raises GgmlValueError; ggml would abort). Indices
    computed inside the graph are checked here, where their range is known: those of ``ggml_argmax``
    over ``k`` values (through reshapes, views, copies, repeats) lie in ``[0, k)``, so a table with fewer
    than ``k`` rows raises GgmlValueError. What is not checkable: indices computed otherwise, e.g. floats
    converted with ``ggml_cpy`` into an I32 tensor, or values looked up in an I32 table; their values
    exist only while ggml computes, and an out-of-range one aborts the process inside ggml. Keep those in
    range by construction (clamp the floats before converting them, fill the table with valid rows).
    Differentiable with respect to ``a``.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the table, rows along ne[1].
        b: I32 row indices (0-based).

    Value: a new Tensor ``[a.ne[0], b.ne[0], b.ne[1], b.ne[2]]``, F32 (I32 if a is I32).

    Example:
        >>> emb = ggml_get_rows(ctx, table, token_ids)   # table [64, vocab], ids [seq] -> [64, seq]
    """
    fn = "ggml_get_rows"
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.types(fn, b, {GGML_TYPE_I32}, "b (the indices)")
    (a0, _a1, a2, a3), (b0, b1, b2, b3) = a.shape, b.shape
    if a2 != b1 or a3 != b2 or b3 != 1:
        chk.fail(fn, f"shapes do not fit: a {list(a.shape)}, b {list(b.shape)} (need a.ne[2] == b.ne[1], "
                     "a.ne[3] == b.ne[2], b.ne[3] == 1)")
    chk.check_computed_indices(fn, a, b)
    out_type = GGML_TYPE_I32 if a.type == GGML_TYPE_I32 else GGML_TYPE_F32
    return _op(fn, ctx, lib.ggml_get_rows, (a, b), (a0, b0, b1, b2), out_type=out_type)


def ggml_pad(ctx: Context, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """Append zeros at the end of each dimension: ``ne[i]`` becomes ``ne[i] + p_i``.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor.
        p0, p1, p2, p3: the number of zeros appended along each dimension (ints >= 0, default 0).

    Value: a new F32 Tensor ``[ne0 + p0, ne1 + p1, ne2 + p2, ne3 + p3]``, a's values first.

    Example:
        >>> y = ggml_pad(ctx, x, 2)                 # [5, n] -> [7, n], two zeros per column
    """
    a = _t("ggml_pad", a)
    chk.types("ggml_pad", a, {GGML_TYPE_F32})
    pads = tuple(chk.c_int_arg("ggml_pad", f"p{i}", p, 0) for i, p in enumerate((p0, p1, p2, p3)))
    return _op("ggml_pad", ctx, lib.ggml_pad, (a,), tuple(n + p for n, p in zip(a.shape, pads)), pads, a.type)


# ---------------------------------------------------------------- convolution, pooling

def ggml_im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
                is_2D: bool = True, dst_type: int = GGML_TYPE_F32) -> Tensor:
    """Unfold convolution patches into columns, so that a convolution becomes a ``ggml_mul_mat``.

    2-D (``is_2D=True``): kernel ``a [KW, KH, Cin, Cout]`` (only its shape is used) and data
    ``b [W, H, Cin, N]`` give ``[Cin * KH * KW, OW, OH, N]``, with
    ``OW = (W + 2 p0 - d0 (KW - 1) - 1) // s0 + 1`` and likewise OH from H, KH, s1, p1, d1.
    1-D (``is_2D=False``): kernel ``a [K, Cin, Cout]`` and data ``b [L, Cin, N]`` give
    ``[Cin * K, OL, N]``; s1 and d1 may then be 0 and p1 must be 0. Output sizes below 1, channel
    counts that differ and bad types raise before ggml is called.

    Arguments:
        ctx: the context the result tensor is created in.
        a: the convolution kernel (any type; its shape sets the patch size).
        b: the data, F32 (F32 or F16 when ``dst_type`` is F16), with contiguous rows.
        s0, s1: strides along width and height (>= 1). p0, p1: zero padding on each side (>= 0).
        d0, d1: dilations (>= 1).
        is_2D: True (the default) for 2-D patches, False for 1-D.
        dst_type: ``GGML_TYPE_F32`` (the default) or ``GGML_TYPE_F16``, the type of the result.

    Value: a new Tensor of the shape above and type ``dst_type``.

    Example:
        >>> cols = ggml_im2col(ctx, kernel, images, 1, 1, 1, 1, 1, 1)   # 3x3, padding 1: same size
    """
    fn = "ggml_im2col"
    a, b = _t(fn, a), _t(fn, b, "b")
    if dst_type not in (GGML_TYPE_F32, GGML_TYPE_F16):
        chk.fail(fn, "dst_type must be GGML_TYPE_F32 or GGML_TYPE_F16", chk.GgmlTypeError)
    # the CPU kernel asserts an F32 source for an F32 result (F16 sources only give F16 results)
    chk.types(fn, b, {GGML_TYPE_F32} if dst_type == GGML_TYPE_F32 else {GGML_TYPE_F32, GGML_TYPE_F16}, "b")
    chk.rows_contiguous(fn, b, "b")
    for name, v, lo in (("s0", s0, 1), ("p0", p0, 0), ("d0", d0, 1)):
        chk.c_int_arg(fn, name, v, lo)
    # 1-D: ggml ignores s1/d1 (ggml_conv_1d passes 0), and p1 > 0 would silently zero the output
    for name, v, lo in (("s1", s1, 1 if is_2D else 0), ("p1", p1, 0), ("d1", d1, 1 if is_2D else 0)):
        chk.c_int_arg(fn, name, v, lo)
    if not is_2D and p1 != 0:
        chk.fail(fn, f"p1 must be 0 for a 1-D im2col, got {p1}")
    if is_2D:
        if a.shape[2] != b.shape[2]:
            chk.fail(fn, f"kernel channels a.ne[2]={a.shape[2]} must equal input channels b.ne[2]={b.shape[2]}")
        ow = chk.out_size(fn, "width", b.shape[0], a.shape[0], s0, p0, d0)
        oh = chk.out_size(fn, "height", b.shape[1], a.shape[1], s1, p1, d1)
        shape = (a.shape[2] * a.shape[1] * a.shape[0], ow, oh, b.shape[3])
    else:
        if a.shape[1] != b.shape[1]:
            chk.fail(fn, f"kernel channels a.ne[1]={a.shape[1]} must equal input channels b.ne[1]={b.shape[1]}")
        if b.shape[3] != 1:
            chk.fail(fn, f"1-D data b must have ne[3] == 1, got {list(b.shape)}")
        ol = chk.out_size(fn, "length", b.shape[0], a.shape[0], s0, p0, d0)
        shape = (a.shape[1] * a.shape[0], ol, b.shape[2], 1)
    return _op(fn, ctx, lib.ggml_im2col, (a, b), shape, (s0, s1, p0, p1, d0, d1, bool(is_2D), dst_type), dst_type)


def ggml_conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, p0: int = 0, d0: int = 1) -> Tensor:
    """Kernel ``a [K, Cin, Cout]``, data ``b [L, Cin, N]`` -> ``[OL, Cout, N]`` (im2col + mul_mat)."""
    fn = "ggml_conv_1d"
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.floating(fn, ("a", a), ("b", b))
    chk.rows_contiguous(fn, b, "b")
    if a.type == GGML_TYPE_BF16 and b.type != GGML_TYPE_F32:  # a BF16 kernel makes an F32 im2col: F32 data only
        chk.fail(fn, "with a BF16 kernel the data b must be F32", chk.GgmlTypeError)
    for name, v, lo in (("s0", s0, 1), ("p0", p0, 0), ("d0", d0, 1)):
        chk.c_int_arg(fn, name, v, lo)
    if a.shape[1] != b.shape[1] or b.shape[3] != 1:
        chk.fail(fn, f"kernel a {list(a.shape)} and data b {list(b.shape)} must share ne[1] (channels)")
    ol = chk.out_size(fn, "length", b.shape[0], a.shape[0], s0, p0, d0)
    ctx.reserve(4 * (a.shape[0] * a.shape[1] * ol * b.shape[2]) * 3, n_objects=4, what="ggml_conv_1d intermediates")
    out = _op(fn, ctx, lib.ggml_conv_1d, (a, b), (ol, a.shape[2], b.shape[2], 1), (s0, p0, d0))
    n, oc = b.shape[2], a.shape[2]
    if n > 1:
        # ggml_conv_1d's data is laid out [OL, N, OC] although its shape says [OL, OC, N] (the upstream
        # bug fixed for ggml_conv_2d only): reorder it to the documented [OL, OC, N].
        ctx.reserve(4 * ol * oc * n, n_objects=3, what="ggml_conv_1d batch reorder")
        c = ctx.ptr
        out = Tensor(lib.ggml_cont(c, lib.ggml_permute(c, lib.ggml_reshape_3d(c, out.ptr, ol, n, oc), 0, 2, 1, 3)), ctx,
                     sources=(out,))
    return out


def ggml_conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
                 d0: int = 1, d1: int = 1) -> Tensor:
    """Kernel ``a [KW, KH, Cin, Cout]``, data ``b [W, H, Cin, N]`` -> ``[OW, OH, Cout, N]`` (im2col + mul_mat).

    ggml builds the im2col patches in F16 (F32 only for a BF16 kernel), for an F32 kernel too: the data is
    rounded to half precision (errors of about 1e-3 relative). ``ggml_conv_2d_direct`` computes in F32 (forward only);
    the model layer's ``ggml_layer_conv_2d`` uses an F32 im2col and trains in F32."""
    fn = "ggml_conv_2d"
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.floating(fn, ("a", a), ("b", b))
    chk.rows_contiguous(fn, b, "b")
    if a.type == GGML_TYPE_BF16 and b.type != GGML_TYPE_F32:  # a BF16 kernel makes an F32 im2col: F32 data only
        chk.fail(fn, "with a BF16 kernel the data b must be F32", chk.GgmlTypeError)
    for name, v, lo in (("s0", s0, 1), ("s1", s1, 1), ("p0", p0, 0), ("p1", p1, 0), ("d0", d0, 1), ("d1", d1, 1)):
        chk.c_int_arg(fn, name, v, lo)
    if a.shape[2] != b.shape[2]:
        chk.fail(fn, f"kernel a {list(a.shape)} and data b {list(b.shape)} must share ne[2] (input channels)")
    ow = chk.out_size(fn, "width", b.shape[0], a.shape[0], s0, p0, d0)
    oh = chk.out_size(fn, "height", b.shape[1], a.shape[1], s1, p1, d1)
    cols = a.shape[0] * a.shape[1] * a.shape[2] * ow * oh * b.shape[3]
    ctx.reserve(4 * cols * 3, n_objects=6, what="ggml_conv_2d intermediates")
    return _op(fn, ctx, lib.ggml_conv_2d, (a, b), (ow, oh, a.shape[3], b.shape[3]), (s0, s1, p0, p1, d0, d1))


def _pool_op(fn: str, op: Any) -> int:
    if op not in (GGML_OP_POOL_MAX, GGML_OP_POOL_AVG):
        chk.fail(fn, f"op must be GGML_OP_POOL_MAX or GGML_OP_POOL_AVG, got {op!r}")
    return int(op)


def ggml_pool_1d(ctx: Context, a: Tensor, op: int, k0: int, s0: int | None = None, p0: int = 0) -> Tensor:
    """Max or average pooling along ne[0]: ``[L, ...]`` becomes ``[(L + 2 p0 - k0) // s0 + 1, ...]``.

    Each window of ``k0`` elements (every ``s0``-th start, the row padded by ``p0`` on each side)
    gives its maximum or its mean; padding positions are skipped, so an average counts only the
    elements inside the row. ggml has no backward pass for it (use it for inference, or
    ``ggml_pool_2d`` with a height-1 kernel in trainable graphs).

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 or F16 tensor.
        op: ``GGML_OP_POOL_MAX`` or ``GGML_OP_POOL_AVG``.
        k0: window size (>= 1). s0: stride (>= 1; default ``k0``, windows side by side, as in ggmlR).
        p0: padding on each side (>= 0, default 0).

    Value: a new F32 Tensor; raises GgmlValueError when the output length would be below 1.

    Example:
        >>> y = ggml_pool_1d(ctx, x, GGML_OP_POOL_MAX, 2)   # halve ne[0] (stride 2 by default)
    """
    fn = "ggml_pool_1d"
    s0 = k0 if s0 is None else s0
    a = _t(fn, a)
    chk.types(fn, a, F32_F16)
    chk.contiguous(fn, a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    _pool_op(fn, op)
    chk.c_int_arg(fn, "k0", k0, 1), chk.c_int_arg(fn, "s0", s0, 1), chk.c_int_arg(fn, "p0", p0, 0)
    ol = chk.out_size(fn, "length", a.shape[0], k0, s0, p0)
    return _op(fn, ctx, lib.ggml_pool_1d, (a,), (ol,) + a.shape[1:], (op, k0, s0, p0))


def _pool_out(n: int, k: int, s: int, p: float) -> int:
    f = np.float32
    with np.errstate(all="ignore"):
        size = (f(n) + f(2) * f(p) - f(k)) / f(s) + f(1)
    return int(size) if np.isfinite(size) and abs(size) < 2.0 ** 62 else 0


def ggml_pool_2d(ctx: Context, a: Tensor, op: int, k0: int, k1: int, s0: int | None = None,
                 s1: int | None = None, p0: float = 0, p1: float = 0) -> Tensor:
    """Max or average pooling over ne[0] x ne[1]: ``[W, H, C, N]`` becomes ``[OW, OH, C, N]``.

    ``OW = int((W + 2 p0 - k0) / s0) + 1`` and ``OH = int((H + 2 p1 - k1) / s1) + 1``. Each window gives
    its maximum or its mean; an average always divides by ``k0 * k1`` (padding counts as zeros).
    Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 or F16 tensor ``[W, H, C, N]`` (images in ggml layout).
        op: ``GGML_OP_POOL_MAX`` or ``GGML_OP_POOL_AVG``.
        k0, k1: window width and height (>= 1).
        s0, s1: strides (>= 1; default ``k0`` and ``k1``: windows side by side, as in ggmlR).
        p0, p1: padding on each side (>= 0, default 0; whole numbers, as ggml's kernel stores ints).

    Value: a new F32 Tensor ``[OW, OH, C, N]``; raises GgmlValueError when OW or OH would be below 1.

    Example:
        >>> y = ggml_pool_2d(ctx, x, GGML_OP_POOL_MAX, 2, 2)   # [28, 28, 8, n] -> [14, 14, 8, n]
    """
    fn = "ggml_pool_2d"
    s0 = k0 if s0 is None else s0
    s1 = k1 if s1 is None else s1
    a = _t(fn, a)
    chk.types(fn, a, F32_F16)
    _pool_op(fn, op)
    chk.contiguous(fn, a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    for name, v in (("k0", k0), ("k1", k1), ("s0", s0), ("s1", s1)):
        chk.c_int_arg(fn, name, v, 1)
    p0f, p1f = chk.float_arg(fn, "p0", p0, finite=True), chk.float_arg(fn, "p1", p1, finite=True)
    if p0f < 0 or p1f < 0:
        chk.fail(fn, f"padding must be >= 0, got p0={p0f}, p1={p1f}")
    # ggml's ggml_calc_pool_output_size, exactly: (ins + 2*p - k) / s + 1 in float32, truncated (a kernel larger
    # than the input by less than a stride gives 0.5 -> 0 there, and ggml asserts the size > 0)
    ow, oh = _pool_out(a.shape[0], k0, s0, p0f), _pool_out(a.shape[1], k1, s1, p1f)
    if ow < 1 or oh < 1:
        chk.fail(fn, f"the pooled size would be {ow}x{oh} for input {a.shape[0]}x{a.shape[1]} and kernel {k0}x{k1}")
    return _op(fn, ctx, lib.ggml_pool_2d, (a,), (ow, oh) + a.shape[2:], (op, k0, k1, s0, s1, p0f, p1f))


def ggml_scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """Scale and shift by two numbers: ``s * a + b``, element-wise.

    Arguments:
        ctx: the context the result tensor is created in.
        a: F32 tensor, contiguous.
        s: the factor (a number). b: the number added afterwards.

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> y = ggml_scale_bias(ctx, x, 2.0, -1.0)   # maps [0, 1] to [-1, 1]
    """
    a = _t("ggml_scale_bias", a)
    chk.types("ggml_scale_bias", a, {GGML_TYPE_F32})
    chk.contiguous("ggml_scale_bias", a)
    chk.padded_1d("ggml_scale_bias", a)  # ggml asserts it (a transposed [1, n] tensor is contiguous but not padded)
    return _op("ggml_scale_bias", ctx, lib.ggml_scale_bias, (a,), a.shape,
               (chk.float_arg("ggml_scale_bias", "s", s, finite=True), chk.float_arg("ggml_scale_bias", "b", b, finite=True)), a.type)
