"""Reductions and broadcasts (sum, mean, argmax, count_equal, repeat, concat) and the group and L2 norms."""
from __future__ import annotations

from .._ffi import lib
from ..core.args import c_int_arg, eps_arg, fail
from ..core.glossary import fill_doc
from ..core.types import GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I16, GGML_TYPE_I32
from ..errors import GgmlTypeError
from ..graph.objects import Context, Tensor
from .base import can_repeat, contiguous, floating, make_op, operand, rows_contiguous, same_shape, types


def ggml_sum(ctx: Context, a: Tensor) -> Tensor:
    """Sum of all elements, as a one-element tensor.

    Differentiable; ``ggml_sum`` of a per-element loss followed by ``ggml_scale`` is the usual way to
    build a scalar loss for ``ggml_set_loss``.

    Arguments:
        ctx: [glossary]
        a: F32, F16 or BF16 tensor.

    Value: a new Tensor of shape ``[1, 1, 1, 1]`` and a's type.

    Example:
        >>> loss = ggml_set_loss(ggml_scale(ctx, ggml_sum(ctx, ggml_sqr(ctx, err)), 1 / n))
    """
    a = operand("ggml_sum", a)
    floating("ggml_sum", ("a", a))
    contiguous("ggml_sum", a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    return make_op("ggml_sum", ctx, lib.ggml_sum, (a,), (1, 1, 1, 1), out_type=a.type)


def ggml_sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """Sum of each row: ``[ne0, ne1, ne2, ne3]`` becomes ``[1, ne1, ne2, ne3]``.

    Reduces over ne[0] (the fastest axis: the features of a sample in ggml layout). Differentiable.

    Arguments:
        ctx: [glossary]
        a: F32 tensor with contiguous rows.

    Value: a new F32 Tensor of shape ``[1, ne1, ne2, ne3]``.

    Example:
        >>> totals = ggml_sum_rows(ctx, x)          # x [features, batch] -> [1, batch]
    """
    a = operand("ggml_sum_rows", a)
    types("ggml_sum_rows", a, {GGML_TYPE_F32})
    rows_contiguous("ggml_sum_rows", a)
    return make_op("ggml_sum_rows", ctx, lib.ggml_sum_rows, (a,), (1,) + a.shape[1:], out_type=a.type)


def ggml_mean(ctx: Context, a: Tensor) -> Tensor:
    """Mean of each row: ``[ne0, ne1, ne2, ne3]`` becomes ``[1, ne1, ne2, ne3]``.

    Reduces over ne[0]. Differentiable, with one limit of ggml's backward pass: when the input of a
    mean over more than one row also feeds another op on the path to the loss, training is refused
    with an error; use ``ggml_scale(ctx, ggml_sum_rows(ctx, x), 1 / ne0)`` there.

    Arguments:
        ctx: [glossary]
        a: F32 tensor.

    Value: a new F32 Tensor of shape ``[1, ne1, ne2, ne3]``.

    Example:
        >>> m = ggml_mean(ctx, x)                   # x [features, batch] -> [1, batch]
    """
    a = operand("ggml_mean", a)
    types("ggml_mean", a, {GGML_TYPE_F32})
    contiguous("ggml_mean", a)  # the CPU kernel reads a as contiguous: a strided view gives garbage
    return make_op("ggml_mean", ctx, lib.ggml_mean, (a,), (1,) + a.shape[1:])


def ggml_argmax(ctx: Context, a: Tensor) -> Tensor:
    """Index of the largest value in each row (over ne[0]): ``[ne0, ne1]`` becomes ``[ne1]`` (I32).

    The predicted class of each column of logits. Not differentiable, but an I32 side output next to
    a trainable graph is fine.

    Arguments:
        ctx: [glossary]
        a: F32 matrix: ne[2] == ne[3] == 1 (else GgmlValueError).

    Value: a new I32 Tensor of shape ``[ne1, 1, 1, 1]``, 0-based indices into ne[0].

    Example:
        >>> pred = ggml_argmax(ctx, logits)         # logits [n_classes, batch] -> [batch]
    """
    a = operand("ggml_argmax", a)
    types("ggml_argmax", a, {GGML_TYPE_F32})
    rows_contiguous("ggml_argmax", a)  # the CPU kernel reads each row as contiguous
    if a.shape[2] != 1 or a.shape[3] != 1:
        fail("ggml_argmax", f"a must be a matrix (ne[2] == ne[3] == 1), got {list(a.shape)}")
    return make_op("ggml_argmax", ctx, lib.ggml_argmax, (a,), (a.shape[1], 1, 1, 1), out_type=GGML_TYPE_I32)


def ggml_count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Number of positions where two I32 tensors hold the same value, as an I64 scalar.

    With ``ggml_argmax`` of the outputs and of one-hot labels this counts the correct predictions.

    Arguments:
        ctx: [glossary]
        a: I32 tensor. b: I32 tensor of the same shape (else GgmlValueError).

    Value: a new I64 Tensor of shape ``[1, 1, 1, 1]``.

    Example:
        >>> n_ok = ggml_count_equal(ctx, ggml_argmax(ctx, logits), ggml_argmax(ctx, labels))
    """
    a, b = operand("ggml_count_equal", a), operand("ggml_count_equal", b, "b")
    types("ggml_count_equal", a, {GGML_TYPE_I32})
    types("ggml_count_equal", b, {GGML_TYPE_I32}, "b")
    same_shape("ggml_count_equal", a, b)
    return make_op("ggml_count_equal", ctx, lib.ggml_count_equal, (a, b), (1, 1, 1, 1), out_type=lib.GGML_TYPE_I64)


def ggml_repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Tile ``a`` to the shape of ``b`` (only b's shape is used, not its data).

    Every ne[i] of b must be a multiple of a's ne[i]; a is repeated that many times along each
    dimension. Differentiable (its backward is ``ggml_repeat_back``). Use it to make a broadcast
    explicit, e.g. before a ``ggml_sub``/``ggml_div`` whose second operand needs a gradient.

    Arguments:
        ctx: [glossary]
        a: F32, F16, BF16, I16 or I32 tensor with contiguous rows.
        b: any tensor whose shape is a multiple of a's in every dimension (else GgmlValueError).

    Value: a new Tensor of b's shape and a's type.

    Example:
        >>> bias_full = ggml_repeat(ctx, bias, h)   # bias [n, 1] -> h's [n, batch]
    """
    a, b = operand("ggml_repeat", a), operand("ggml_repeat", b, "b")
    types("ggml_repeat", a, {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_I16, GGML_TYPE_I32})
    rows_contiguous("ggml_repeat", a)
    if not can_repeat(a.shape, b.shape):
        fail("ggml_repeat", f"a {list(a.shape)} cannot be repeated to b's shape {list(b.shape)}")
    return make_op("ggml_repeat", ctx, lib.ggml_repeat, (a, b), b.shape, out_type=a.type)


def ggml_repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Sum ``a`` down to the shape of ``b``: the adjoint of ``ggml_repeat``.

    Each element of the result is the sum of the elements of ``a`` that ``ggml_repeat`` would have
    copied it to; b's shape must repeat into a's (each ne[i] of a a multiple of b's). Only b's shape
    is used.

    Arguments:
        ctx: [glossary]
        a: F32 tensor with contiguous rows.
        b: a tensor whose shape divides a's in every dimension (else GgmlValueError).

    Value: a new F32 Tensor of b's shape.

    Example:
        >>> per_feature = ggml_repeat_back(ctx, grads, bias)   # [n, batch] -> [n, 1]
    """
    a, b = operand("ggml_repeat_back", a), operand("ggml_repeat_back", b, "b")
    types("ggml_repeat_back", a, {GGML_TYPE_F32})
    rows_contiguous("ggml_repeat_back", a)
    if not can_repeat(b.shape, a.shape):
        fail("ggml_repeat_back", f"b {list(b.shape)} must repeat into a {list(a.shape)}")
    return make_op("ggml_repeat_back", ctx, lib.ggml_repeat_back, (a, b), b.shape, out_type=a.type)


def ggml_concat(ctx: Context, a: Tensor, b: Tensor, dim: int = 0) -> Tensor:
    """Concatenate ``a`` and ``b`` along dimension ``dim``.

    The shapes must agree in every other dimension and the types must match. Differentiable.

    Arguments:
        ctx: [glossary]
        a: a tensor. b: a tensor of a's type, with a's shape outside ``dim``.
        dim: the ggml dimension to join along, 0-3 (default 0: ne[0], the features of a sample).

    Value: a new Tensor of a's type whose ``ne[dim]`` is ``a.ne[dim] + b.ne[dim]``.

    Example:
        >>> h = ggml_concat(ctx, h1, h2, 0)         # [n1, batch] + [n2, batch] -> [n1 + n2, batch]
    """
    fn = "ggml_concat"
    a, b = operand(fn, a), operand(fn, b, "b")
    c_int_arg(fn, "dim", dim, 0)
    if dim > 3:
        fail(fn, f"dim must be in [0, 3], got {dim}")
    if a.type != b.type:
        fail(fn, "a and b must have the same type", GgmlTypeError)
    if any(a.shape[i] != b.shape[i] for i in range(4) if i != dim):
        fail(fn, f"a {list(a.shape)} and b {list(b.shape)} must match outside dimension {dim}")
    shape = list(a.shape)
    shape[dim] += b.shape[dim]
    return make_op(fn, ctx, lib.ggml_concat, (a, b), tuple(shape), (dim,), a.type)


def _group_norm(fn: str, ctx: Context, a: object, n_groups: object, eps: object, inplace: bool) -> Tensor:
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    rows_contiguous(fn, a)
    channels = a.shape[2]
    n_groups = c_int_arg(fn, "n_groups", n_groups, 1)
    if n_groups > channels:
        fail(fn, f"n_groups must be between 1 and the number of channels a.ne[2]={channels}, got {n_groups}")
    eps = eps_arg(fn, "eps", eps)
    c_fn = lib.ggml_group_norm_inplace if inplace else lib.ggml_group_norm
    return make_op(fn, ctx, c_fn, (a,), None if inplace else a.shape, (n_groups, eps))


_GROUP_NORM_BODY = """The channels (ne[2]) are split into ``n_groups`` consecutive groups of ``ceil(C / n_groups)``
    channels (the last group may be smaller); for each group and each sample (ne[3]) the values
    ``[ne0, ne1, channels of the group]`` are normalised to mean 0 and variance 1:
    ``(x - mean) / sqrt(var + eps)``. No learnable scale or shift (multiply and add them yourself).
    ggml has no backward pass for it: it may not lie between a trainable parameter and the loss."""


def ggml_group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float = 1e-5) -> Tensor:
    """Group normalisation of images ``[W, H, C, N]`` over groups of channels (as in Stable Diffusion).

    {body}

    Arguments:
        ctx: [glossary]
        a: F32 tensor ``[W, H, C, N]`` with contiguous rows.
        n_groups: the number of groups, an int in ``[1, C]``.
        eps: a finite number >= 0 added to the variance (default 1e-5, as in ggmlR).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> h = ggml_group_norm(ctx, feat, 32, 1e-6)          # feat [64, 64, 320, 1]
    """
    return _group_norm("ggml_group_norm", ctx, a, n_groups, eps, False)


def ggml_group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float = 1e-5) -> Tensor:
    """``ggml_group_norm`` **in place**: the normalised values overwrite a's data.

    {body} The result is a view of ``a`` (inference only).

    Arguments:
        ctx: [glossary: header]
        a: F32 tensor ``[W, H, C, N]`` with contiguous rows.
        n_groups: the number of groups, an int in ``[1, C]``.
        eps: a finite number >= 0 added to the variance (default 1e-5).

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> h = ggml_group_norm_inplace(ctx, feat, 32)
    """
    return _group_norm("ggml_group_norm_inplace", ctx, a, n_groups, eps, True)


def _l2_norm(fn: str, ctx: Context, a: object, eps: object, inplace: bool) -> Tensor:
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    eps = eps_arg(fn, "eps", eps)
    c_fn = lib.ggml_l2_norm_inplace if inplace else lib.ggml_l2_norm
    return make_op(fn, ctx, c_fn, (a,), None if inplace else a.shape, (eps,))


_L2_BODY = """Each row (the ne[0] values at fixed ne[1], ne[2], ne[3]) is divided by its Euclidean norm:
    ``x / max(||x||, eps)`` (a row of zeros stays zero). ggml has no backward pass for it: it may not
    lie between a trainable parameter and the loss."""


def ggml_l2_norm(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    """Scale each row to unit length: ``x / max(||x||_2, eps)`` over ne[0] (as in RWKV-7).

    {body}

    Arguments:
        ctx: [glossary]
        a: F32 tensor (strided views are fine).
        eps: a finite number >= 0, the smallest norm divided by (default 1e-5, as in ggmlR).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> unit = ggml_l2_norm(ctx, emb)                      # each column of emb has length 1
    """
    return _l2_norm("ggml_l2_norm", ctx, a, eps, False)


def ggml_l2_norm_inplace(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    """``ggml_l2_norm`` **in place**: each row of ``a`` is scaled to unit length in a's own data.

    {body} The result is a view of ``a`` (inference only).

    Arguments:
        ctx: [glossary: header]
        a: F32 tensor.
        eps: a finite number >= 0, the smallest norm divided by (default 1e-5).

    Value: a Tensor of a's shape viewing a's data.

    Example:
        >>> emb = ggml_l2_norm_inplace(ctx, emb)
    """
    return _l2_norm("ggml_l2_norm_inplace", ctx, a, eps, True)


fill_doc(ggml_group_norm, body=_GROUP_NORM_BODY)
fill_doc(ggml_group_norm_inplace, body=_GROUP_NORM_BODY)
fill_doc(ggml_l2_norm, body=_L2_BODY)
fill_doc(ggml_l2_norm_inplace, body=_L2_BODY)
