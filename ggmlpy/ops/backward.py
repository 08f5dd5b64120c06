"""ggml's explicit backward ops (``*_back``), for graphs that build a gradient by hand."""
from __future__ import annotations

from .._ffi import lib
from ..core.args import eps_arg, fail, float_arg
from ..core.glossary import fill_doc
from ..core.types import GGML_TYPE_F32, GGML_TYPE_I32, type_name
from ..graph.objects import Context, Tensor
from .attention import check_index_bound, shape_text
from .base import contiguous, F32_F16, make_op, operand, rows_contiguous, same_shape, types


def _dy_and_x(fn: str, a: object, b: object, dy_types: set[int], whole: bool) -> tuple[Tensor, Tensor]:
    """The operands of a ``*_back`` op of one element-wise or row-wise forward op: ``a`` the incoming gradient
    (``dy``) of one of ``dy_types``, ``b`` the forward op's input (``x``) of a's type and shape; both contiguous
    (``whole``) or with contiguous rows."""
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, a, dy_types, "a (dy)")
    types(fn, b, {a.type}, f"b (x, like a: {type_name(a.type)})")
    same_shape(fn, a, b)
    layout = contiguous if whole else rows_contiguous
    layout(fn, a, "a (dy)")
    layout(fn, b, "b (x)")
    return a, b


def ggml_silu_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Gradient of SiLU: ``dx = dy * s(x) * (1 + x * (1 - s(x)))`` with ``s`` the sigmoid.

    This is the op ggml's autodiff inserts for ``ggml_silu``; call it yourself to write a backward
    pass by hand. Note the operand order, ggml's: the incoming gradient first, then the input of the
    forward pass. Not differentiable itself.

    Arguments:
        ctx: [glossary]
        a: ``dy``, the gradient of the loss with respect to ``silu(x)``: contiguous F32 or F16.
        b: ``x``, the input of the forward ``ggml_silu``: contiguous, a's type and shape.

    Value: a new Tensor of a's shape and type: the gradient with respect to ``x``.

    Example:
        >>> dx = ggml_silu_back(ctx, dy, x)
    """
    fn = "ggml_silu_back"
    a, b = _dy_and_x(fn, a, b, F32_F16, whole=True)
    return make_op(fn, ctx, lib.ggml_silu_back, (a, b), a.shape, out_type=a.type)


def ggml_gelu_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Gradient of GELU (the tanh form ``ggml_gelu`` computes): ``dx = dy * gelu'(x)``, element by element.

    With ``gelu(x) = x * s``, ``s = 1 / (1 + exp(-2u))`` and ``u = sqrt(2/pi) * x * (1 + 0.044715 x**2)``:
    ``gelu'(x) = s + 2 sqrt(2/pi) x s (1 - s) (1 + 3 * 0.044715 x**2)``. ggml's autodiff inserts this one op
    for an F32 ``ggml_gelu`` (``patches/0064``; the CPU, Vulkan and CUDA compute it); call it yourself to
    write a backward pass by hand. The operand order is ggml's, as for ``ggml_silu_back``: the incoming
    gradient first, then the input of the forward pass. Not differentiable itself.

    Arguments:
        ctx: [glossary]
        a: ``dy``, the gradient of the loss with respect to ``gelu(x)``: contiguous F32.
        b: ``x``, the input of the forward ``ggml_gelu``: contiguous F32 of a's shape (``ggml_cont`` a view
            first).

    Value: a new F32 Tensor of a's shape: the gradient with respect to ``x``.

    Example:
        >>> dx = ggml_gelu_back(ctx, dy, x)
    """
    fn = "ggml_gelu_back"
    a, b = _dy_and_x(fn, a, b, {GGML_TYPE_F32}, whole=True)
    return make_op(fn, ctx, lib.ggml_gelu_back, (a, b), a.shape, out_type=GGML_TYPE_F32)


def ggml_rms_norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float = 1e-5) -> Tensor:
    """Gradient of RMS normalisation: ``dx`` from ``dy`` and ``x``, row by row over ne[0].

    With ``r = 1 / sqrt(mean(x**2) + eps)``: ``dx = r * (dy - x * sum(x * dy) / (sum(x**2) + n * eps))``,
    the derivative of ``ggml_rms_norm(x, eps)`` (the op ggml's autodiff inserts for it). Note the
    operand order, ggml's: the incoming gradient first, then the input of the forward pass. Not
    differentiable itself.

    Arguments:
        ctx: [glossary]
        a: ``dy``, the gradient with respect to ``rms_norm(x)``: F32 with contiguous rows.
        b: ``x``, the input of the forward pass: F32 of a's shape with contiguous rows.
        eps: the eps of the forward pass, a finite number >= 0 (default 1e-5, as in ggmlR).

    Value: a new F32 Tensor of a's shape: the gradient with respect to ``x``.

    Example:
        >>> dx = ggml_rms_norm_back(ctx, dy, x, 1e-6)
    """
    fn = "ggml_rms_norm_back"
    a, b = _dy_and_x(fn, a, b, {GGML_TYPE_F32}, whole=False)
    return make_op(fn, ctx, lib.ggml_rms_norm_back, (a, b), a.shape, (eps_arg(fn, "eps", eps),))


def ggml_norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float = 1e-5) -> Tensor:
    """Gradient of layer normalisation (``ggml_norm``): ``dx`` from ``dy`` and ``x``, row by row over ne[0].

    With ``xc = x - mean(x)`` and ``r = 1 / sqrt(mean(xc**2) + eps)``:
    ``dx = r * (dy - mean(dy)) - r**3 * xc * mean(dy * xc)``, the derivative of ``ggml_norm(x, eps)``. ggml's
    autodiff inserts this one op for an F32 ``ggml_norm`` (``patches/0067``; the CPU, Vulkan and CUDA compute
    it); call it yourself to write a backward pass by hand. The operand order is ggml's: the incoming gradient
    first, then the input of the forward pass. Not differentiable itself.

    Arguments:
        ctx: [glossary]
        a: ``dy``, the gradient with respect to ``norm(x)``: contiguous F32.
        b: ``x``, the input of the forward pass: contiguous F32 of a's shape (``ggml_cont`` a view first).
        eps: the eps of the forward pass, a finite number >= 0 (default 1e-5, as ``ggml_norm``'s).

    Value: a new F32 Tensor of a's shape: the gradient with respect to ``x``.

    Example:
        >>> dx = ggml_norm_back(ctx, dy, x, 1e-5)
    """
    fn = "ggml_norm_back"
    a, b = _dy_and_x(fn, a, b, {GGML_TYPE_F32}, whole=True)
    return make_op(fn, ctx, lib.ggml_norm_back, (a, b), a.shape, (eps_arg(fn, "eps", eps),))


def _soft_max_back(fn: str, ctx: Context, a: object, b: object, scale: object, max_bias: object,
                   inplace: bool) -> Tensor:
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, a, {GGML_TYPE_F32}, "a (dy)")
    types(fn, b, {GGML_TYPE_F32}, "b (y)")
    same_shape(fn, a, b)
    contiguous(fn, a, "a (dy)")
    contiguous(fn, b, "b (y)")
    scale = float_arg(fn, "scale", scale, finite=True)
    max_bias = float_arg(fn, "max_bias", max_bias, finite=True)
    if max_bias != 0.0:
        fail(fn, f"ggml implements the softmax gradient without ALiBi only: max_bias must be 0, got {max_bias}")
    c_fn = lib.ggml_soft_max_ext_back_inplace if inplace else lib.ggml_soft_max_ext_back
    return make_op(fn, ctx, c_fn, (a, b), None if inplace else a.shape, (scale, max_bias))


_SOFT_MAX_BACK_ARGS = """a: ``dy``, the gradient with respect to the softmax output: contiguous F32.
        b: ``y``, the output of the forward ``ggml_soft_max_ext``: contiguous F32 of a's shape.
        scale: the scale of the forward pass (default 1.0).
        max_bias: must be 0.0 (the default): ggml has no gradient for ALiBi slopes."""


def ggml_soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float = 1.0, max_bias: float = 0.0) -> Tensor:
    """Gradient of ``ggml_soft_max_ext``: ``dx = scale * y * (dy - sum(y * dy))`` per row.

    From the softmax output ``y = softmax(scale * x + mask)`` and the incoming gradient ``dy`` (the op
    ggml's autodiff inserts for the softmax). Note the operand order, ggml's: the gradient first, then
    the forward output (ggmlR's help page has them the other way round). Not differentiable itself.

    Arguments:
        ctx: [glossary]
        {args}

    Value: a new F32 Tensor of a's shape: the gradient with respect to ``x``.

    Example:
        >>> dx = ggml_soft_max_ext_back(ctx, dy, probs, 1 / 8)
    """
    return _soft_max_back("ggml_soft_max_ext_back", ctx, a, b, scale, max_bias, False)


def ggml_soft_max_ext_back_inplace(ctx: Context, a: Tensor, b: Tensor, scale: float = 1.0,
                                   max_bias: float = 0.0) -> Tensor:
    """``ggml_soft_max_ext_back`` **in place**: the gradient overwrites ``a`` (dy) in its own data.

    ``dx = scale * y * (dy - sum(y * dy))`` per row; the result is a view of ``a``. Not differentiable
    itself.

    Arguments:
        ctx: [glossary: header]
        {args}

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> dx = ggml_soft_max_ext_back_inplace(ctx, dy, probs)
    """
    return _soft_max_back("ggml_soft_max_ext_back_inplace", ctx, a, b, scale, max_bias, True)


fill_doc(ggml_soft_max_ext_back, args=_SOFT_MAX_BACK_ARGS)
fill_doc(ggml_soft_max_ext_back_inplace, args=_SOFT_MAX_BACK_ARGS)


def ggml_get_rows_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Gradient of ``ggml_get_rows`` for the table: the rows of ``a`` summed into the rows ``b`` points at.

    ``result`` has c's shape ``[n_embd, n_rows]``, zero except ``result[:, b[i]] += a[:, i]`` (an index
    that repeats accumulates). This is the op ggml's autodiff inserts for an embedding lookup. Not
    differentiable itself. Every index must be in ``[0, n_rows)``: ggml does not check it, and writes
    outside the result otherwise.

    Arguments:
        ctx: [glossary]
        a: the gradient of the lookup's result, an F32 or F16 matrix ``[n_embd, n_idx]`` with contiguous
            rows.
        b: the row indices of the lookup: a contiguous I32 vector ``[n_idx]``.
        c: the table of the lookup (only its shape is used): a matrix ``[n_embd, n_rows]``.

    Value: a new F32 Tensor ``[n_embd, n_rows]``.

    Example:
        >>> d_table = ggml_get_rows_back(ctx, d_emb, ids, table)   # d_emb [64, seq], ids [seq], table [64, vocab]
    """
    fn = "ggml_get_rows_back"
    a, b, c = operand(fn, a), operand(fn, b, "b"), operand(fn, c, "c")
    types(fn, a, F32_F16)
    rows_contiguous(fn, a)
    types(fn, b, {GGML_TYPE_I32}, "b (the indices)")
    if a.shape[2:] != (1, 1) or c.shape[2:] != (1, 1):
        fail(fn, f"a and c must be matrices, got a {shape_text(a)} and c {shape_text(c)}")
    if b.shape != (a.shape[1], 1, 1, 1) or not lib.ggml_is_contiguous(b.ptr):
        fail(fn, f"b must be a contiguous I32 vector with one index per column of a ({a.shape[1]}), got shape "
                     f"{shape_text(b)}")
    if c.shape[0] != a.shape[0]:
        fail(fn, f"a and c must share ne[0] (the row size), got a {shape_text(a)} and c {shape_text(c)}")
    check_index_bound(fn, "the indices b", b, c.shape[1], "the table c (its ne[1]: the rows)")
    return make_op(fn, ctx, lib.ggml_get_rows_back, (a, b, c), (c.shape[0], c.shape[1], 1, 1))
