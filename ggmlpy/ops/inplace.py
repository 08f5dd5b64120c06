"""In-place variants of ggml's ops: the result is a view of the first operand.

Each ``ggml_<op>_inplace`` takes the arguments of ``ggml_<op>`` and checks them the same way (the
checks live with the out-of-place op, in ops.elementwise / ops.activation); instead of a new tensor it
returns a view of ``a`` that ggml computes into a's own memory. The view's lifetime follows ``a``
(like ``ggml_view_*``): it is unusable once the context holding ``a`` is freed.
"""
from __future__ import annotations

from typing import Callable

from .._ffi import CData, ffi, lib
from ..core.args import fail
from ..graph.backward import IGNORED_SRCS
from ..graph.nodes import op_label, ptr_key, tensor_label
from ..graph.objects import Context, Tensor
from . import activation as ops_activation
from .base import make_op
from .elementwise import (
    check_binary,
    check_clamp,
    check_diag_mask_inf,
    check_norm,
    check_rms_norm,
    check_scale,
    check_soft_max,
    check_soft_max_ext,
    UNARY_CHECKS,
)


def _trainable_source(t: CData) -> CData | None:
    """A trainable parameter (tensor pointer) that tensor pointer ``t`` is, or is computed from, along the
    paths ggml's backward pass follows (it skips I32 results and operands it never differentiates, such as
    row indices); None if there is none."""
    stack, seen = [t], set()
    while stack:
        p = stack.pop()
        key = ptr_key(p)
        if key in seen:
            continue
        seen.add(key)
        if p.flags & int(lib.GGML_TENSOR_FLAG_PARAM):
            return p
        if p.type == lib.GGML_TYPE_I32:
            continue
        ignored = IGNORED_SRCS.get(op_label(p), ())
        stack.extend(s for j, s in enumerate(p.src) if s != ffi.NULL and j not in ignored)
    return None


def _refuse_trainable(fn: str, plain: str, *operands: tuple[str, Tensor | None]) -> None:
    """ggml aborts the process when it builds a backward pass through an in-place op whose operand needs a
    gradient (ggml_build_backward_expand: "inplace operations are currently not supported"), so such an op
    is refused as soon as it is made."""
    for what, t in operands:
        if t is None:
            continue
        param = _trainable_source(t.ptr)
        if param is not None:
            whose = "is" if ptr_key(param) == ptr_key(t.ptr) else "is computed from"
            fail(fn, f"{what} {whose} a trainable parameter ({tensor_label(param)}, marked with "
                         "ggml_set_param): ggml has no backward pass through in-place ops (building one aborts), so "
                         f"an in-place op may not follow a parameter; use {plain}, which computes the same values "
                         "into a new tensor")


def _inplace(fn: str, ctx: Context, c_fn: Callable, a: Tensor, others: tuple = (), args: tuple = ()) -> Tensor:
    """Call ``c_fn(ctx, a, *other tensors, *args)`` for a view of ``a``; ``others`` are (name, tensor or None)
    pairs. The view follows a's (and the operands') lifetimes like any op result (and like ``ggml_view_*``),
    and takes no data of its own in ``ctx``."""
    _refuse_trainable(fn, fn[:-len("_inplace")], ("a", a), *others)
    return make_op(fn, ctx, c_fn, (a, *(t for _, t in others)), None, args, a.type)


# ---------------------------------------------------------------- docstrings

_WHAT_INPLACE = """The result is a view of ``a``: when the graph runs, a's own data is overwritten with the result
    (a later reader of ``a`` sees the new values, and computing the graph again applies the op again).
    Use it to save memory in inference graphs. In-place ops have no backward pass in ggml: the op is
    refused (GgmlValueError) when an operand is a trainable parameter or is computed from one; use
    ``{plain}`` in trainable graphs."""


def _doc(name: str, summary: str, args: str, value: str, example: str) -> str:
    plain = name[:-len("_inplace")]
    return f"""{summary} (in place; see ``{plain}``).

    {_WHAT_INPLACE.format(plain=plain)}

    Arguments:
        ctx: the context the result tensor (a view, no data of its own) is created in.
{args}

    Value: {value}

    Example:
        >>> {example}
    """


# ---------------------------------------------------------------- element-wise unary

_F32_F16_BF16 = "F32, F16 or BF16 tensor with contiguous rows"
# name: (summary, the C function, what ``a`` may be)
_UNARY: dict[str, tuple[str, Callable[..., CData]] | tuple[str, Callable[..., CData], str]] = {
    "abs": ("Absolute value ``|x|``, element-wise", lib.ggml_abs_inplace),
    "dup": ("A copy of ``a`` into itself (a no-op that gives a separate graph node)", lib.ggml_dup_inplace,
            "F32, F16 or BF16 tensor (any layout)"),
    "elu": ("ELU (alpha 1), element-wise: ``x if x > 0 else exp(x) - 1``", lib.ggml_elu_inplace),
    "exp": ("Exponential ``exp(x)``, element-wise", lib.ggml_exp_inplace),
    "log": ("Natural logarithm ``log(x)``, element-wise", lib.ggml_log_inplace),
    "neg": ("Negation ``-x``, element-wise", lib.ggml_neg_inplace),
    "gelu": ("GELU (tanh approximation), element-wise", lib.ggml_gelu_inplace,
             "F32 or F16 tensor with contiguous rows"),
    "relu": ("ReLU ``max(x, 0)``, element-wise", lib.ggml_relu_inplace),
    "silu": ("SiLU ``x * sigmoid(x)``, element-wise", lib.ggml_silu_inplace, "F32 or F16 tensor with contiguous rows"),
    "sigmoid": ("Logistic sigmoid ``1 / (1 + exp(-x))``, element-wise", lib.ggml_sigmoid_inplace),
    "tanh": ("Hyperbolic tangent ``tanh(x)``, element-wise", lib.ggml_tanh_inplace),
    "softplus": ("Softplus ``log(1 + exp(x))``, element-wise", lib.ggml_softplus_inplace),
    "sqr": ("Square ``x * x``, element-wise", lib.ggml_sqr_inplace),
    "sqrt": ("Square root ``sqrt(x)``, element-wise", lib.ggml_sqrt_inplace),
    "ceil": ("Round up, element-wise", lib.ggml_ceil_inplace),
    "floor": ("Round down, element-wise", lib.ggml_floor_inplace),
    "round": ("Round halves away from zero, element-wise", lib.ggml_round_inplace),
}


def unary_check(plain: str) -> Callable[[str, object], Tensor]:
    return UNARY_CHECKS.get(plain) or ops_activation.UNARY_CHECKS[plain]


def _unary(kind: str) -> Callable:
    name, plain = f"ggml_{kind}_inplace", f"ggml_{kind}"
    summary, c_fn, *kinds = _UNARY[kind]
    check = unary_check(plain)

    def op(ctx: Context, a: Tensor) -> Tensor:
        a = check(name, a)
        return _inplace(name, ctx, c_fn, a)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = _doc(name, summary, f"        a: {kinds[0] if kinds else _F32_F16_BF16}; it is overwritten.",
                      "a Tensor of a's shape and type viewing a's data.", f"y = {name}(ctx, ggml_mul_mat(ctx, w, x))")
    return op


ggml_abs_inplace = _unary("abs")
ggml_dup_inplace = _unary("dup")
ggml_elu_inplace = _unary("elu")
ggml_exp_inplace = _unary("exp")
ggml_log_inplace = _unary("log")
ggml_neg_inplace = _unary("neg")
ggml_gelu_inplace = _unary("gelu")
ggml_relu_inplace = _unary("relu")
ggml_silu_inplace = _unary("silu")
ggml_sigmoid_inplace = _unary("sigmoid")
ggml_tanh_inplace = _unary("tanh")
ggml_softplus_inplace = _unary("softplus")
ggml_sqr_inplace = _unary("sqr")
ggml_sqrt_inplace = _unary("sqrt")
ggml_ceil_inplace = _unary("ceil")
ggml_floor_inplace = _unary("floor")
ggml_round_inplace = _unary("round")


# ---------------------------------------------------------------- element-wise binary

_BINARY = {"add": ("a + b", "Add", lib.ggml_add_inplace), "sub": ("a - b", "Subtract", lib.ggml_sub_inplace),
           "mul": ("a * b", "Multiply", lib.ggml_mul_inplace), "div": ("a / b", "Divide", lib.ggml_div_inplace)}


def _binary(kind: str) -> Callable:
    name = f"ggml_{kind}_inplace"
    formula, verb, c_fn = _BINARY[kind]

    def op(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        a, b, _ = check_binary(name, a, b)
        return _inplace(name, ctx, c_fn, a, (("b", b),))
    op.__name__ = op.__qualname__ = name
    op.__doc__ = _doc(name, f"{verb} element-wise, ``{formula}`` with ``b`` broadcast into a's shape, into ``a``",
                      "        a: F32, F16 or BF16 tensor with contiguous rows; it is overwritten.\n"
                      "        b: a tensor of a's type or F32 whose shape repeats into a's (each ne[i] of a a "
                      "multiple of b's).",
                      "a Tensor of a's shape and type viewing a's data. Raises GgmlValueError when b does not "
                      "broadcast into a.",
                      f"h = {name}(ctx, ggml_mul_mat(ctx, w, x), bias)")
    return op


ggml_add_inplace = _binary("add")
ggml_sub_inplace = _binary("sub")
ggml_mul_inplace = _binary("mul")
ggml_div_inplace = _binary("div")


# ---------------------------------------------------------------- ops with parameters

def ggml_scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    """Multiply every element of ``a`` by the number ``s``, in place (see ``ggml_scale``).

    The result is a view of ``a``: when the graph runs, a's own data is overwritten with the result
    (a later reader of ``a`` sees the new values, and computing the graph again applies the op again).
    Use it to save memory in inference graphs. In-place ops have no backward pass in ggml: the op is
    refused (GgmlValueError) when ``a`` is a trainable parameter or is computed from one; use
    ``ggml_scale`` in trainable graphs.

    Arguments:
        ctx: [glossary: view]
        a: F32 tensor, contiguous; it is overwritten.
        s: the factor (a finite number).

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> scores = ggml_scale_inplace(ctx, ggml_mul_mat(ctx, k, q), 1 / d_head ** 0.5)
    """
    fn = "ggml_scale_inplace"
    a, s = check_scale(fn, a, s)
    return _inplace(fn, ctx, lib.ggml_scale_inplace, a, (), (s,))


def ggml_clamp_inplace(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:  # noqa: A002 - ggml's names
    """Clamp every element of ``a`` into ``[min, max]``, in place (see ``ggml_clamp``).

    The result is a view of ``a``: when the graph runs, a's own data is overwritten with the result
    (ggml 0.20's ``ggml_clamp`` always did this; since 0.25 ``ggml_clamp`` makes a new tensor). In-place
    ops have no backward pass in ggml: the op is refused (GgmlValueError) when ``a`` is a trainable
    parameter or is computed from one.

    Arguments:
        ctx: [glossary: view]
        a: F32 or F16 tensor with contiguous rows; it is overwritten.
        min: the lower bound; max: the upper bound, ``min <= max`` (else GgmlValueError).

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> x = ggml_clamp_inplace(ctx, x, -1.0, 1.0)
    """
    fn = "ggml_clamp_inplace"
    a, lo, hi = check_clamp(fn, a, min, max)
    return _inplace(fn, ctx, lib.ggml_clamp_inplace, a, (), (lo, hi))


def ggml_norm_inplace(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    """Normalise each row to mean 0 and variance 1, in place (see ``ggml_norm``).

    ``(x - mean) / sqrt(var + eps)`` over ne[0], written over ``a``. The result is a view of ``a``: when
    the graph runs, a's own data is overwritten (a later reader of ``a`` sees the new values, and
    computing the graph again applies the op again). In-place ops have no backward pass in ggml: the op
    is refused (GgmlValueError) when ``a`` is a trainable parameter or is computed from one; use
    ``ggml_norm`` in trainable graphs.

    Arguments:
        ctx: [glossary: view]
        a: F32 tensor; it is overwritten.
        eps: a small number >= 0 added to the variance (default 1e-5).

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> h = ggml_norm_inplace(ctx, h, 1e-5)
    """
    fn = "ggml_norm_inplace"
    a, eps = check_norm(fn, a, eps)
    return _inplace(fn, ctx, lib.ggml_norm_inplace, a, (), (eps,))


def ggml_rms_norm_inplace(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    """RMS normalisation of each row, in place (see ``ggml_rms_norm``): ``x / sqrt(mean(x**2) + eps)``.

    The result is a view of ``a``: when the graph runs, a's own data is overwritten (a later reader of
    ``a`` sees the new values, and computing the graph again applies the op again). In-place ops have
    no backward pass in ggml: the op is refused (GgmlValueError) when ``a`` is a trainable parameter or
    is computed from one; use ``ggml_rms_norm`` in trainable graphs.

    Arguments:
        ctx: [glossary: view]
        a: F32 tensor with contiguous rows; it is overwritten.
        eps: a small number >= 0 added to the mean square (default 1e-5).

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> h = ggml_rms_norm_inplace(ctx, h, 1e-6)
    """
    fn = "ggml_rms_norm_inplace"
    a, eps = check_rms_norm(fn, a, eps)
    return _inplace(fn, ctx, lib.ggml_rms_norm_inplace, a, (), (eps,))


def ggml_soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    """Softmax of each row over ne[0], in place (see ``ggml_soft_max``).

    The result is a view of ``a``: when the graph runs, a's own data is overwritten (a later reader of
    ``a`` sees the new values, and computing the graph again applies the op again). In-place ops have
    no backward pass in ggml: the op is refused (GgmlValueError) when ``a`` is a trainable parameter or
    is computed from one; use ``ggml_soft_max`` in trainable graphs.

    Arguments:
        ctx: [glossary: view]
        a: F32 tensor, contiguous; it is overwritten.

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> probs = ggml_soft_max_inplace(ctx, logits)
    """
    fn = "ggml_soft_max_inplace"
    a = check_soft_max(fn, a)
    return _inplace(fn, ctx, lib.ggml_soft_max_inplace, a)


def ggml_soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None = None, scale: float = 1.0,
                              max_bias: float = 0.0) -> Tensor:
    """Fused softmax of ``a * scale + mask`` over ne[0], in place (see ``ggml_soft_max_ext``).

    The result is a view of ``a``: when the graph runs, a's own data is overwritten (a later reader of
    ``a`` sees the new values, and computing the graph again applies the op again). In-place ops have
    no backward pass in ggml: the op is refused (GgmlValueError) when ``a`` or ``mask`` is a trainable
    parameter or is computed from one; use ``ggml_soft_max_ext`` in trainable graphs.

    Arguments:
        ctx: [glossary: view]
        a: F32 tensor ``[n_kv, n_q, n_head, n_seq]``, contiguous; it is overwritten.
        mask: None (the default: no mask) or a contiguous F32/F16 tensor with ``ne[0] == a.ne[0]``,
            ``ne[1] >= a.ne[1]`` and ne[2], ne[3] dividing a's.
        scale: the factor applied to ``a`` first (default 1.0).
        max_bias: 0.0 (the default) for no ALiBi; > 0 needs a mask.

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> attn = ggml_soft_max_ext_inplace(ctx, kq, kq_mask, 1 / d_head ** 0.5)
    """
    fn = "ggml_soft_max_ext_inplace"
    a, mask, scale, max_bias = check_soft_max_ext(fn, a, mask, scale, max_bias)
    return _inplace(fn, ctx, lib.ggml_soft_max_ext_inplace, a, (("mask", mask),), (scale, max_bias))


def ggml_diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Causal mask, in place (see ``ggml_diag_mask_inf``): elements at columns ``i > n_past + j`` of row
    ``j`` become ``-inf``.

    The result is a view of ``a``: when the graph runs, a's own data is overwritten (a later reader of
    ``a`` sees the new values). In-place ops have no backward pass in ggml: the op is refused
    (GgmlValueError) when ``a`` is a trainable parameter or is computed from one; use
    ``ggml_diag_mask_inf`` in trainable graphs.

    Arguments:
        ctx: [glossary: view]
        a: F32 tensor, contiguous (``[n_kv, n_q, ...]`` scores); it is overwritten.
        n_past: the number of earlier positions every row may also see (an int >= 0).

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> w = ggml_soft_max_inplace(ctx, ggml_diag_mask_inf_inplace(ctx, scores, 0))
    """
    fn = "ggml_diag_mask_inf_inplace"
    a, n_past = check_diag_mask_inf(fn, a, n_past)
    return _inplace(fn, ctx, lib.ggml_diag_mask_inf_inplace, a, (), (n_past,))
