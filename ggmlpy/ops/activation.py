"""Activations, rounding, ggml's add1 and the GLU family (ggmlR parity)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .._ffi import lib
from ..core.args import bool_arg, fail, float_arg, is_int
from ..core.glossary import fill_doc
from ..core.types import FLOAT_TYPES, type_name
from ..errors import GgmlTypeError
from ..graph.objects import Context, Tensor
from . import base as _base
from .base import F32_F16, make_op, operand, same_shape
from .elementwise import check_binary, unary_check


GGML_GLU_OP_REGLU = int(lib.GGML_GLU_OP_REGLU)
GGML_GLU_OP_GEGLU = int(lib.GGML_GLU_OP_GEGLU)
GGML_GLU_OP_SWIGLU = int(lib.GGML_GLU_OP_SWIGLU)
GGML_GLU_OP_SWIGLU_OAI = int(lib.GGML_GLU_OP_SWIGLU_OAI)
GGML_GLU_OP_GEGLU_ERF = int(lib.GGML_GLU_OP_GEGLU_ERF)
GGML_GLU_OP_GEGLU_QUICK = int(lib.GGML_GLU_OP_GEGLU_QUICK)

# the gating ops ggml_glu/ggml_glu_split take: (name, the activation applied to the value half)
_GLU_OPS = {GGML_GLU_OP_REGLU: ("GGML_GLU_OP_REGLU", "relu"), GGML_GLU_OP_GEGLU: ("GGML_GLU_OP_GEGLU", "gelu"),
            GGML_GLU_OP_SWIGLU: ("GGML_GLU_OP_SWIGLU", "silu"),
            GGML_GLU_OP_GEGLU_ERF: ("GGML_GLU_OP_GEGLU_ERF", "gelu_erf"),
            GGML_GLU_OP_GEGLU_QUICK: ("GGML_GLU_OP_GEGLU_QUICK", "gelu_quick")}


# ---------------------------------------------------------------- add1

def ggml_add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Add the one value of the scalar tensor ``b`` to every element of ``a``: ``a + b``.

    ``b`` holds a single value (shape ``[1, 1, 1, 1]``), e.g. a learnable offset or a value computed in
    the graph (a ``ggml_sum``). The result is ggml's broadcast ``ggml_add``: same values as ggml's
    deprecated ADD1 op, but with a correct backward pass (ggml's ADD1 backward takes the mean of the
    gradient for ``b`` instead of its sum, and aborts when ``a`` is a matrix). Differentiable with
    respect to both ``a`` and ``b``.

    Arguments:
        ctx: [glossary: room]
        a: F32, F16 or BF16 tensor with contiguous rows.
        b: a one-element tensor, of a's type or F32 (anything else is a GgmlValueError/GgmlTypeError;
            use ``ggml_add`` for a bias with more than one value).

    Value: a new Tensor of a's shape and type, computed when the graph runs.

    Example:
        >>> y = ggml_add1(ctx, x, offset)       # x [n, batch], offset [1]
    """
    fn = "ggml_add1"
    a, b = operand(fn, a), operand(fn, b, "b")
    if b.shape != (1, 1, 1, 1):
        fail(fn, f"b must be a scalar (one element, shape [1, 1, 1, 1]), got shape {list(b.shape)}; to add a "
                     "tensor that is repeated into a's shape use ggml_add")
    a, b, shape = check_binary(fn, a, b)  # ggml_add's checks
    return make_op(fn, ctx, lib.ggml_add, (a, b), shape, out_type=a.type)


# ---------------------------------------------------------------- element-wise activations and rounding

# name -> check(fn, a) -> a, shared with the in-place forms (ops.inplace)
UNARY_CHECKS: dict[str, Callable[[str, object], Tensor]] = {}

_NO_BACKWARD = ("Not differentiable: ggml has no backward pass for it, so in a trainable graph it may not lie\n"
                "    between a parameter and the loss (training raises an error naming {label}){hint}.")


def _unary(name: str, c_fn: Callable, types: set, label: str, summary: str, notes: str, hint: str,
           example: str) -> Callable:
    check = UNARY_CHECKS[name] = unary_check(True, types)

    def op(ctx: Context, a: Tensor) -> Tensor:
        a = check(name, a)
        return make_op(name, ctx, c_fn, (a,), a.shape, out_type=a.type)
    kinds = "F32 or F16" if set(types) == F32_F16 else "F32, F16 or BF16"
    body = "\n    ".join(x for x in (notes, _NO_BACKWARD.format(label=label, hint=hint)) if x)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"""{summary}

    {body}

    Arguments:
        ctx: the context the result tensor is created in (it must have room for it).
        a: {kinds} tensor with contiguous rows (apply ``ggml_cont`` to a transposed view first).

    Value: a new Tensor of a's shape and type, computed when the graph runs. Raises GgmlTypeError for
    other types.

    Example:
        >>> {example}
    """
    return op


ggml_gelu_quick = _unary(
    "ggml_gelu_quick", lib.ggml_gelu_quick, F32_F16, "GELU_QUICK",
    "Quick GELU, element-wise: ``x * sigmoid(1.702 x)``.",
    "A cheaper approximation of GELU (CLIP, some vision models). On the CPU the result is looked up in an\n"
    "    F16 table indexed by the F16-rounded input (about three significant digits); inputs beyond F16's\n"
    "    range (|x| > 65504) give NaN (negative x) or inf (positive x) there.",
    "; use ``ggml_gelu`` or ``ggml_silu``", "y = ggml_gelu_quick(ctx, x)")
ggml_gelu_erf = _unary(
    "ggml_gelu_erf", lib.ggml_gelu_erf, F32_F16, "GELU_ERF",
    "GELU in its exact form, element-wise: ``0.5 x (1 + erf(x / sqrt(2)))``.",
    "``ggml_gelu`` is the tanh approximation of the same function (they differ by less than 1e-3).",
    "; ``ggml_gelu`` is differentiable", "y = ggml_gelu_erf(ctx, x)")
ggml_hardsigmoid = _unary(
    "ggml_hardsigmoid", lib.ggml_hardsigmoid, FLOAT_TYPES, "HARDSIGMOID",
    "Hard sigmoid, element-wise: ``min(1, max(0, (x + 3) / 6))``.",
    "A piecewise-linear sigmoid (MobileNetV3); ``ggml_hardswish`` is ``x * hardsigmoid(x)``.",
    "; use ``ggml_sigmoid``", "y = ggml_hardsigmoid(ctx, x)")
ggml_floor = _unary(
    "ggml_floor", lib.ggml_floor, FLOAT_TYPES, "FLOOR",
    "Round down, element-wise: the largest whole number ``<= x``.",
    "", "", "y = ggml_floor(ctx, x)          # [-1.5, 0.2, 2.7] -> [-2, 0, 2]")
ggml_ceil = _unary(
    "ggml_ceil", lib.ggml_ceil, FLOAT_TYPES, "CEIL",
    "Round up, element-wise: the smallest whole number ``>= x``.",
    "", "", "y = ggml_ceil(ctx, x)           # [-1.5, 0.2, 2.7] -> [-1, 1, 3]")
ggml_round = _unary(
    "ggml_round", lib.ggml_round, FLOAT_TYPES, "ROUND",
    "Round to the nearest whole number, element-wise, halves away from zero (C's ``roundf``).",
    "``2.5`` gives ``3`` and ``-2.5`` gives ``-3`` (numpy's ``np.round`` rounds halves to even instead).",
    "", "y = ggml_round(ctx, x)          # [-2.5, 0.4, 2.5] -> [-3, 0, 3]")


# ---------------------------------------------------------------- gated linear units

def _glu_op(fn: str, op: object) -> int:
    if not is_int(op):
        fail(fn, f"op must be one of the GGML_GLU_OP_* constants (an int), got {op!r}", GgmlTypeError)
    op = int(op)
    if op == GGML_GLU_OP_SWIGLU_OAI:
        fail(fn, "GGML_GLU_OP_SWIGLU_OAI needs its alpha and limit parameters, which ggml_glu and ggml_glu_split do "
                     "not pass (ggml would compute with alpha = limit = 0); use GGML_GLU_OP_SWIGLU")
    if op not in _GLU_OPS:
        names = ", ".join(f"{n} ({v})" for v, (n, _) in sorted(_GLU_OPS.items()))
        fail(fn, f"op must be one of {names}, got {op}")
    return op


def _glu_operand(fn: str, t: object, what: str) -> Tensor:
    t = operand(fn, t, what)
    _base.types(fn, t, F32_F16, what)  # the CPU kernels implement F32 and F16 only
    if not lib.ggml_is_contiguous_1(t.ptr):  # ggml asserts it: contiguous rows, stacked without gaps
        fail(fn, f"{what} must have contiguous rows stacked one after the other (apply ggml_cont first), got a "
                     "strided view")
    return t


def _glu(fn: str, ctx: Context, a: object, b: object, op: int, swapped: bool = False) -> Tensor:
    a = _glu_operand(fn, a, "a")
    if b is None:
        if a.shape[0] % 2:
            fail(fn, f"a.ne[0] must be even (its first half is the value, its second half the gate), got "
                         f"{a.shape[0]}; pass the two halves separately to the _split form (ggml_glu_split)")
        return make_op(fn, ctx, lib.ggml_glu, (a,), (a.shape[0] // 2,) + a.shape[1:], (op, bool(swapped)), a.type)
    b = _glu_operand(fn, b, "b")
    if a.type != b.type:
        fail(fn, f"a and b must have the same type, got {type_name(a.type)} and {type_name(b.type)}",
                 GgmlTypeError)
    same_shape(fn, a, b)
    return make_op(fn, ctx, lib.ggml_glu_split, (a, b), a.shape, (op,), a.type)


_GLU_NO_BACKWARD = ("Not differentiable in ggmlpy: in a trainable graph it may not lie between a parameter and\n"
                    "    the loss (training raises an error naming GLU). To train, build it from differentiable ops:\n"
                    "    ``ggml_mul(ctx, ggml_silu(ctx, x), g)`` for SwiGLU, ``ggml_relu``/``ggml_gelu`` likewise.")


def ggml_glu(ctx: Context, a: Tensor, op: int, swapped: bool = False) -> Tensor:
    """Gated linear unit on the two halves of each row: ``act(x) * g``, ``x`` and ``g`` being a's halves.

    Each row of ``a`` (``ne[0]`` values, an even number) is split in two: by default the first half is
    the value ``x`` that the activation is applied to and the second half is the gate ``g``; with
    ``swapped=True`` the roles change (``act(second half) * first half``). The activation is set by
    ``op``: ``GGML_GLU_OP_REGLU`` (relu), ``GGML_GLU_OP_GEGLU`` (gelu, tanh form; on the CPU read from
    an F16 table like ``ggml_gelu``), ``GGML_GLU_OP_SWIGLU`` (silu), ``GGML_GLU_OP_GEGLU_ERF`` (exact
    gelu) or ``GGML_GLU_OP_GEGLU_QUICK`` (``x * sigmoid(1.702 x)``, F16 table on the CPU).
    ``GGML_GLU_OP_SWIGLU_OAI`` needs parameters this call cannot pass and is refused.
    Not differentiable in ggmlpy: in a trainable graph it may not lie between a parameter and
    the loss (training raises an error naming GLU). To train, build it from differentiable ops:
    ``ggml_mul(ctx, ggml_silu(ctx, x), g)`` for SwiGLU, ``ggml_relu``/``ggml_gelu`` likewise.

    Arguments:
        ctx: [glossary: room]
        a: F32 or F16 tensor ``[2 n, ...]`` with contiguous rows stacked without gaps (apply ``ggml_cont``
            to a view first).
        op: one of the ``GGML_GLU_OP_*`` constants above.
        swapped: False (the default): activation on the first half; True: on the second half.

    Value: a new Tensor ``[n, ne1, ne2, ne3]`` of a's type. Raises GgmlValueError for an odd ``ne[0]``
    or an unknown op, GgmlTypeError for other types.

    Example:
        >>> h = ggml_glu(ctx, ggml_mul_mat(ctx, w_up, x), GGML_GLU_OP_SWIGLU)   # w_up [n_in, 2 n_ff]
    """
    fn = "ggml_glu"
    op = _glu_op(fn, op)
    return _glu(fn, ctx, a, None, op, bool_arg(fn, "swapped", swapped))


def ggml_glu_split(ctx: Context, a: Tensor, b: Tensor, op: int) -> Tensor:
    """Gated linear unit with separate value and gate tensors: ``act(a) * b``, element-wise.

    The activation, chosen by ``op`` as in ``ggml_glu`` (``GGML_GLU_OP_REGLU``, ``GGML_GLU_OP_GEGLU``,
    ``GGML_GLU_OP_SWIGLU``, ``GGML_GLU_OP_GEGLU_ERF``, ``GGML_GLU_OP_GEGLU_QUICK``), is applied to ``a``;
    ``b`` is the gate it is multiplied with. This is the form of LLaMA's feed-forward block
    (``silu(x W_gate) * (x W_up)``).
    Not differentiable in ggmlpy: in a trainable graph it may not lie between a parameter and
    the loss (training raises an error naming GLU). To train, build it from differentiable ops:
    ``ggml_mul(ctx, ggml_silu(ctx, a), b)`` for SwiGLU, ``ggml_relu``/``ggml_gelu`` likewise.

    Arguments:
        ctx: [glossary: room]
        a: F32 or F16 tensor (the values), contiguous rows stacked without gaps.
        b: the gate: a tensor of a's type and shape (else GgmlTypeError/GgmlValueError), laid out likewise.
        op: one of the ``GGML_GLU_OP_*`` constants above.

    Value: a new Tensor of a's shape and type.

    Example:
        >>> h = ggml_glu_split(ctx, ggml_mul_mat(ctx, w_gate, x), ggml_mul_mat(ctx, w_up, x), GGML_GLU_OP_SWIGLU)
    """
    fn = "ggml_glu_split"
    op = _glu_op(fn, op)
    if b is None:
        fail(fn, "b (the gate) must be a Tensor, got None; use ggml_glu for a tensor holding both halves",
                 GgmlTypeError)
    return _glu(fn, ctx, a, b, op)


# what each named GLU computes, for its docstring: (the activation, its formula, the C function)
_GLU_NAMED = {
    "reglu": (GGML_GLU_OP_REGLU, "ReGLU", "relu", "max(x, 0)"),
    "geglu": (GGML_GLU_OP_GEGLU, "GeGLU", "gelu (tanh form; an F16 table on the CPU, as ``ggml_gelu``)",
              "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))"),
    "swiglu": (GGML_GLU_OP_SWIGLU, "SwiGLU", "silu", "x * sigmoid(x)"),
    "geglu_erf": (GGML_GLU_OP_GEGLU_ERF, "GeGLU with exact GELU", "gelu, erf form", "0.5 x (1 + erf(x / sqrt(2)))"),
    "geglu_quick": (GGML_GLU_OP_GEGLU_QUICK, "GeGLU with quick GELU",
                    "quick gelu (an F16 table on the CPU, as ``ggml_gelu_quick``: NaN/inf for |x| > 65504)",
                    "x * sigmoid(1.702 x)"),
}


def _named_glu(kind: str) -> Callable:
    name = f"ggml_{kind}"
    op_value, title, act, formula = _GLU_NAMED[kind]

    def op(ctx: Context, a: Tensor) -> Tensor:
        return _glu(name, ctx, a, None, op_value)
    op.__name__ = op.__qualname__ = name
    short = act.split(" (")[0]
    op.__doc__ = f"""{title} on the two halves of each row: ``act(first half) * second half``, act = {short}.

    ``ggml_glu(ctx, a, {_GLU_OPS[op_value][0]}, False)``: each row of ``a`` (an even number ``2 n`` of
    values) gives ``n`` values ``act(x_i) * x_(n+i)``, with ``act(x) = {formula}`` ({act}).
    {_GLU_NO_BACKWARD}

    Arguments:
        ctx: the context the result tensor is created in (it must have room for it).
        a: F32 or F16 tensor ``[2 n, ...]`` with contiguous rows stacked without gaps.

    Value: a new Tensor ``[n, ne1, ne2, ne3]`` of a's type. Raises GgmlValueError for an odd ``ne[0]``.

    Example:
        >>> h = {name}(ctx, ggml_mul_mat(ctx, w, x))    # w [n_in, 2 n_ff] -> h [n_ff, batch]
    """
    return op


def _named_glu_split(kind: str) -> Callable:
    name = f"ggml_{kind}_split"
    op_value, title, act, formula = _GLU_NAMED[kind]

    def op(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        if b is None:
            fail(name, f"b (the gate) must be a Tensor, got None; use ggml_{kind} for one tensor holding both halves",
                     GgmlTypeError)
        return _glu(name, ctx, a, b, op_value)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"""{title} with separate value and gate tensors: ``{act.split(" (")[0]}(a) * b``, element-wise.

    ``ggml_glu_split(ctx, a, b, {_GLU_OPS[op_value][0]})``, with ``act(x) = {formula}`` ({act}).
    {_GLU_NO_BACKWARD}

    Arguments:
        ctx: the context the result tensor is created in (it must have room for it).
        a: F32 or F16 tensor (the values), contiguous rows stacked without gaps.
        b: the gate: a tensor of a's type and shape.

    Value: a new Tensor of a's shape and type.

    Example:
        >>> h = {name}(ctx, ggml_mul_mat(ctx, w_gate, x), ggml_mul_mat(ctx, w_up, x))
    """
    return op


ggml_reglu = _named_glu("reglu")
ggml_geglu = _named_glu("geglu")
ggml_swiglu = _named_glu("swiglu")
ggml_geglu_erf = _named_glu("geglu_erf")
ggml_geglu_quick = _named_glu("geglu_quick")
ggml_reglu_split = _named_glu_split("reglu")
ggml_geglu_split = _named_glu_split("geglu")
ggml_swiglu_split = _named_glu_split("swiglu")


def ggml_swiglu_clamp(ctx: Context, a: Tensor, b: Tensor, limit: float) -> Tensor:
    """SwiGLU with clamped operands: ``silu(min(a, limit)) * clamp(b, -limit, limit)``, element-wise.

    The form of the feed-forward blocks that bound their activations (ggml 0.25's ``GGML_GLU_OP_SWIGLU_CLAMP``):
    the value ``a`` is capped above at ``limit`` before the SiLU, the gate ``b`` is kept within
    ``[-limit, limit]``. With ``limit = inf`` it is ``ggml_swiglu_split``.
    {no_backward}

    Arguments:
        ctx: [glossary: room]
        a: F32 or F16 tensor (the values), contiguous rows stacked without gaps.
        b: the gate: a tensor of a's type and shape.
        limit: the bound, a number > 0 (``inf`` for none).

    Value: a new Tensor of a's shape and type.

    Example:
        >>> h = ggml_swiglu_clamp(ctx, ggml_mul_mat(ctx, w_gate, x), ggml_mul_mat(ctx, w_up, x), 7.0)
    """
    fn = "ggml_swiglu_clamp"
    if b is None:
        fail(fn, "b (the gate) must be a Tensor, got None", GgmlTypeError)
    lim = float_arg(fn, "limit", limit)
    if not np.float32(lim) > 0:  # as the C float ggml receives (1e-50 would be 0)
        fail(fn, f"limit must be > 0 in float32 (the gate is clamped into [-limit, limit]), got {limit!r}")
    a, b = _glu_operand(fn, a, "a"), _glu_operand(fn, b, "b")
    if a.type != b.type:
        fail(fn, f"a and b must have the same type, got {type_name(a.type)} and {type_name(b.type)}",
                 GgmlTypeError)
    same_shape(fn, a, b)
    return make_op(fn, ctx, lib.ggml_swiglu_clamp, (a, b), a.shape, (lim,), a.type)


fill_doc(ggml_swiglu_clamp, no_backward=_GLU_NO_BACKWARD)
