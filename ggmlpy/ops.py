"""Graph operations, with ggml's argument order: context, operands, then C's scalars.

Each op checks its operands (shapes, types, ranges) and the context's free memory in
Python, then calls ggml; the result is a ``Tensor`` of ``ctx``.
"""
from __future__ import annotations

from typing import Any, Callable

from . import _checks as chk
from ._ffi import ffi, lib
from ._handle import unwrap
from .context import (FLOAT_TYPES, GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I16, GGML_TYPE_I32,
                      Context, Tensor, as_tensor)

F32_F16 = {GGML_TYPE_F32, GGML_TYPE_F16}

GGML_OP_POOL_MAX = int(lib.GGML_OP_POOL_MAX)
GGML_OP_POOL_AVG = int(lib.GGML_OP_POOL_AVG)


def _op(fn: str, ctx: Context, c_fn: Callable, tensors: tuple, shape: tuple | None, args: tuple = (),
        out_type: int = GGML_TYPE_F32) -> Tensor:
    """Check the context, reserve room for the result, call ggml and wrap the result."""
    ctx_ptr = unwrap(ctx, Context, f"{fn}(ctx)")
    n = 1
    for d in shape or (1,):
        n *= d
    ctx.reserve(n * int(lib.ggml_type_size(out_type)), what=f"{fn} result")
    ptrs = [t.ptr if t is not None else ffi.NULL for t in tensors]
    return Tensor(c_fn(ctx_ptr, *ptrs, *args), ctx)


def _t(fn: str, x: Any, what: str = "a") -> Tensor:
    return as_tensor(x, f"{fn}({what})")


# ---------------------------------------------------------------- element-wise binary

def _binary(name: str, c_fn: Callable) -> Callable:
    def op(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        a, b = _t(name, a), _t(name, b, "b")
        chk.floating(name, ("a", a), ("b", b))
        if b.type not in (a.type, GGML_TYPE_F32):  # the CPU kernels: same types, or an F32 b
            chk.fail(name, f"b must be {chk.type_name(a.type)} or F32 when a is {chk.type_name(a.type)}, got "
                           f"{chk.type_name(b.type)}", chk.GgmlTypeError)
        chk.rows_contiguous(name, a)
        return _op(name, ctx, c_fn, (a, b), chk.broadcast_into(name, a, b), out_type=a.type)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``{name}(ctx, a, b)``: element-wise, b broadcast (repeated) into a's shape."
    return op


ggml_add = _binary("ggml_add", lib.ggml_add)
ggml_sub = _binary("ggml_sub", lib.ggml_sub)
ggml_mul = _binary("ggml_mul", lib.ggml_mul)
ggml_div = _binary("ggml_div", lib.ggml_div)


# ---------------------------------------------------------------- element-wise unary

def _unary(name: str, c_fn: Callable, needs_contiguous_rows: bool = True, types=FLOAT_TYPES) -> Callable:
    def op(ctx: Context, a: Tensor) -> Tensor:
        a = _t(name, a)
        chk.types(name, a, types)
        if needs_contiguous_rows:
            chk.rows_contiguous(name, a)
        return _op(name, ctx, c_fn, (a,), a.shape, out_type=a.type)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``{name}(ctx, a)``: element-wise."
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
    """Softmax over ne[0] (F32, contiguous)."""
    a = _t("ggml_soft_max", a)
    chk.types("ggml_soft_max", a, {GGML_TYPE_F32})
    chk.contiguous("ggml_soft_max", a)
    return _op("ggml_soft_max", ctx, lib.ggml_soft_max, (a,), a.shape)


def ggml_leaky_relu(ctx: Context, a: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    a = _t("ggml_leaky_relu", a)
    chk.types("ggml_leaky_relu", a, F32_F16)
    slope = chk.float_arg("ggml_leaky_relu", "negative_slope", negative_slope)
    return _op("ggml_leaky_relu", ctx, lib.ggml_leaky_relu, (a,), a.shape, (slope, bool(inplace)), a.type)


def ggml_scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    a = _t("ggml_scale", a)
    chk.types("ggml_scale", a, {GGML_TYPE_F32})  # the CPU kernel is F32-only and needs contiguous data
    chk.contiguous("ggml_scale", a)
    return _op("ggml_scale", ctx, lib.ggml_scale, (a,), a.shape, (chk.float_arg("ggml_scale", "s", s),), a.type)


def ggml_clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:  # noqa: A002 - ggml's names
    a = _t("ggml_clamp", a)
    chk.types("ggml_clamp", a, F32_F16)
    chk.rows_contiguous("ggml_clamp", a)  # NB: ggml_clamp returns a view: it clamps a in place
    lo, hi = chk.float_arg("ggml_clamp", "min", min), chk.float_arg("ggml_clamp", "max", max)
    if lo > hi:
        chk.fail("ggml_clamp", f"min must be <= max, got {lo} > {hi}")
    return _op("ggml_clamp", ctx, lib.ggml_clamp, (a,), a.shape, (lo, hi), a.type)


def ggml_norm(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    a = _t("ggml_norm", a)
    chk.types("ggml_norm", a, {GGML_TYPE_F32})
    return _op("ggml_norm", ctx, lib.ggml_norm, (a,), a.shape, (chk.float_arg("ggml_norm", "eps", eps),))


def ggml_rms_norm(ctx: Context, a: Tensor, eps: float = 1e-5) -> Tensor:
    a = _t("ggml_rms_norm", a)
    chk.types("ggml_rms_norm", a, {GGML_TYPE_F32})
    chk.rows_contiguous("ggml_rms_norm", a)
    return _op("ggml_rms_norm", ctx, lib.ggml_rms_norm, (a,), a.shape, (chk.float_arg("ggml_rms_norm", "eps", eps),))


def ggml_soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None = None, scale: float = 1.0,
                      max_bias: float = 0.0) -> Tensor:
    fn = "ggml_soft_max_ext"
    a = _t(fn, a)
    chk.types(fn, a, {GGML_TYPE_F32})
    chk.contiguous(fn, a)
    scale, max_bias = chk.float_arg(fn, "scale", scale), chk.float_arg(fn, "max_bias", max_bias)
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
    return _op(fn, ctx, lib.ggml_soft_max_ext, (a, mask), a.shape, (scale, max_bias))


def ggml_diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    a = _t("ggml_diag_mask_inf", a)
    chk.types("ggml_diag_mask_inf", a, {GGML_TYPE_F32})
    chk.contiguous("ggml_diag_mask_inf", a)
    return _op("ggml_diag_mask_inf", ctx, lib.ggml_diag_mask_inf, (a,), a.shape,
               (chk.int_arg("ggml_diag_mask_inf", "n_past", n_past, 0),), a.type)


# ---------------------------------------------------------------- reductions, broadcast

def ggml_sum(ctx: Context, a: Tensor) -> Tensor:
    a = _t("ggml_sum", a)
    chk.floating("ggml_sum", ("a", a))
    return _op("ggml_sum", ctx, lib.ggml_sum, (a,), (1, 1, 1, 1), out_type=a.type)


def ggml_sum_rows(ctx: Context, a: Tensor) -> Tensor:
    a = _t("ggml_sum_rows", a)
    chk.types("ggml_sum_rows", a, {GGML_TYPE_F32})
    chk.rows_contiguous("ggml_sum_rows", a)
    return _op("ggml_sum_rows", ctx, lib.ggml_sum_rows, (a,), (1,) + a.shape[1:], out_type=a.type)


def ggml_mean(ctx: Context, a: Tensor) -> Tensor:
    a = _t("ggml_mean", a)
    chk.types("ggml_mean", a, {GGML_TYPE_F32})
    return _op("ggml_mean", ctx, lib.ggml_mean, (a,), (1,) + a.shape[1:])


def ggml_argmax(ctx: Context, a: Tensor) -> Tensor:
    a = _t("ggml_argmax", a)
    chk.types("ggml_argmax", a, {GGML_TYPE_F32})
    if a.shape[2] != 1 or a.shape[3] != 1:
        chk.fail("ggml_argmax", f"a must be a matrix (ne[2] == ne[3] == 1), got {list(a.shape)}")
    return _op("ggml_argmax", ctx, lib.ggml_argmax, (a,), (a.shape[1], 1, 1, 1), out_type=GGML_TYPE_I32)


def ggml_count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    a, b = _t("ggml_count_equal", a), _t("ggml_count_equal", b, "b")
    chk.types("ggml_count_equal", a, {GGML_TYPE_I32})
    chk.types("ggml_count_equal", b, {GGML_TYPE_I32}, "b")
    chk.same_shape("ggml_count_equal", a, b)
    return _op("ggml_count_equal", ctx, lib.ggml_count_equal, (a, b), (1, 1, 1, 1), out_type=lib.GGML_TYPE_I64)


def ggml_repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Repeat ``a`` to the shape of ``b``."""
    a, b = _t("ggml_repeat", a), _t("ggml_repeat", b, "b")
    chk.types("ggml_repeat", a, {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_I16, GGML_TYPE_I32})
    chk.rows_contiguous("ggml_repeat", a)
    if not chk.can_repeat(a.shape, b.shape):
        chk.fail("ggml_repeat", f"a {list(a.shape)} cannot be repeated to b's shape {list(b.shape)}")
    return _op("ggml_repeat", ctx, lib.ggml_repeat, (a, b), b.shape, out_type=a.type)


def ggml_repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Sum ``a`` back down to the shape of ``b`` (the adjoint of repeat)."""
    a, b = _t("ggml_repeat_back", a), _t("ggml_repeat_back", b, "b")
    chk.types("ggml_repeat_back", a, {GGML_TYPE_F32})
    chk.rows_contiguous("ggml_repeat_back", a)
    if not chk.can_repeat(b.shape, a.shape):
        chk.fail("ggml_repeat_back", f"b {list(b.shape)} must repeat into a {list(a.shape)}")
    return _op("ggml_repeat_back", ctx, lib.ggml_repeat_back, (a, b), b.shape, out_type=a.type)


def ggml_concat(ctx: Context, a: Tensor, b: Tensor, dim: int = 0) -> Tensor:
    fn = "ggml_concat"
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.int_arg(fn, "dim", dim, 0)
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
    """``a [K, M]`` times ``b [K, N]`` gives ``[M, N]`` (both share ne[0])."""
    a, b = _t("ggml_mul_mat", a), _t("ggml_mul_mat", b, "b")
    chk.floating("ggml_mul_mat", ("a", a), ("b", b))
    if b.type not in (a.type, GGML_TYPE_F32):  # the CPU backend: b is F32 or a's dot-product type
        chk.fail("ggml_mul_mat", f"b must be F32 or {chk.type_name(a.type)} when a is {chk.type_name(a.type)}, got "
                                 f"{chk.type_name(b.type)}", chk.GgmlTypeError)
    chk.rows_contiguous("ggml_mul_mat", a)
    chk.rows_contiguous("ggml_mul_mat", b, "b")
    return _op("ggml_mul_mat", ctx, lib.ggml_mul_mat, (a, b), chk.mul_mat("ggml_mul_mat", a, b))


def ggml_out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a [M, K]`` and ``b [N, K]`` give ``[M, N]`` = sum over k of outer products."""
    a, b = _t("ggml_out_prod", a), _t("ggml_out_prod", b, "b")
    chk.types("ggml_out_prod", a, F32_F16)
    chk.types("ggml_out_prod", b, {GGML_TYPE_F32}, "b")
    if a.type == GGML_TYPE_F16 and a.shape[2:] != b.shape[2:]:
        chk.fail("ggml_out_prod", f"an F16 a cannot be broadcast: a {list(a.shape)}, b {list(b.shape)}")
    chk.not_transposed("ggml_out_prod", a)
    return _op("ggml_out_prod", ctx, lib.ggml_out_prod, (a, b), chk.out_prod("ggml_out_prod", a, b))


def ggml_cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Mean over rows of -sum(b * log_softmax(a)); ``a`` are logits, ``b`` label probabilities."""
    a, b = _t("ggml_cross_entropy_loss", a), _t("ggml_cross_entropy_loss", b, "b")
    chk.types("ggml_cross_entropy_loss", a, {GGML_TYPE_F32})
    chk.types("ggml_cross_entropy_loss", b, {GGML_TYPE_F32}, "b")
    chk.same_shape("ggml_cross_entropy_loss", a, b)
    chk.rows_contiguous("ggml_cross_entropy_loss", a)
    chk.rows_contiguous("ggml_cross_entropy_loss", b, "b")
    return _op("ggml_cross_entropy_loss", ctx, lib.ggml_cross_entropy_loss, (a, b), (1, 1, 1, 1))


# ---------------------------------------------------------------- layout

def ggml_reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
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
    return op


ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d = (_reshape(n) for n in (1, 2, 3, 4))


def ggml_view_1d(ctx: Context, a: Tensor, ne0: int, offset: int = 0) -> Tensor:
    a = _t("ggml_view_1d", a)
    chk.view("ggml_view_1d", a, (ne0,), (), offset)
    return _op("ggml_view_1d", ctx, lib.ggml_view_1d, (a,), None, (ne0, offset), a.type)


def ggml_view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0) -> Tensor:
    a = _t("ggml_view_2d", a)
    chk.view("ggml_view_2d", a, (ne0, ne1), (nb1,), offset)
    return _op("ggml_view_2d", ctx, lib.ggml_view_2d, (a,), None, (ne0, ne1, nb1, offset), a.type)


def ggml_view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int = 0) -> Tensor:
    a = _t("ggml_view_3d", a)
    chk.view("ggml_view_3d", a, (ne0, ne1, ne2), (nb1, nb2), offset)
    return _op("ggml_view_3d", ctx, lib.ggml_view_3d, (a,), None, (ne0, ne1, ne2, nb1, nb2, offset), a.type)


def ggml_view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
                 offset: int = 0) -> Tensor:
    a = _t("ggml_view_4d", a)
    chk.view("ggml_view_4d", a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)
    return _op("ggml_view_4d", ctx, lib.ggml_view_4d, (a,), None,
               (ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset), a.type)


def ggml_permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    a = _t("ggml_permute", a)
    chk.permutation("ggml_permute", (axis0, axis1, axis2, axis3))
    return _op("ggml_permute", ctx, lib.ggml_permute, (a,), None, (axis0, axis1, axis2, axis3), a.type)


def ggml_transpose(ctx: Context, a: Tensor) -> Tensor:
    a = _t("ggml_transpose", a)
    return _op("ggml_transpose", ctx, lib.ggml_transpose, (a,), None, out_type=a.type)


def ggml_cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    a, b = _t("ggml_cpy", a), _t("ggml_cpy", b, "b")
    if a.nelements() != b.nelements():
        chk.fail("ggml_cpy", f"a and b must have the same number of elements, got {a.nelements()} and {b.nelements()}")
    return _op("ggml_cpy", ctx, lib.ggml_cpy, (a, b), None, out_type=b.type)


def ggml_get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows of ``a`` picked by the I32 indices ``b`` (embeddings). Indices must be in [0, a.ne[1])."""
    fn = "ggml_get_rows"
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.types(fn, b, {GGML_TYPE_I32}, "b (the indices)")
    (a0, _a1, a2, a3), (b0, b1, b2, b3) = a.shape, b.shape
    if a2 != b1 or a3 != b2 or b3 != 1:
        chk.fail(fn, f"shapes do not fit: a {list(a.shape)}, b {list(b.shape)} (need a.ne[2] == b.ne[1], "
                     "a.ne[3] == b.ne[2], b.ne[3] == 1)")
    out_type = GGML_TYPE_I32 if a.type == GGML_TYPE_I32 else GGML_TYPE_F32
    return _op(fn, ctx, lib.ggml_get_rows, (a, b), (a0, b0, b1, b2), out_type=out_type)


def ggml_pad(ctx: Context, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    a = _t("ggml_pad", a)
    chk.types("ggml_pad", a, {GGML_TYPE_F32})
    pads = tuple(chk.int_arg("ggml_pad", f"p{i}", p, 0) for i, p in enumerate((p0, p1, p2, p3)))
    return _op("ggml_pad", ctx, lib.ggml_pad, (a,), tuple(n + p for n, p in zip(a.shape, pads)), pads, a.type)


# ---------------------------------------------------------------- convolution, pooling

def ggml_im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
                is_2D: bool = True, dst_type: int = GGML_TYPE_F32) -> Tensor:
    fn = "ggml_im2col"
    a, b = _t(fn, a), _t(fn, b, "b")
    if dst_type not in (GGML_TYPE_F32, GGML_TYPE_F16):
        chk.fail(fn, "dst_type must be GGML_TYPE_F32 or GGML_TYPE_F16", chk.GgmlTypeError)
    # the CPU kernel asserts an F32 source for an F32 result (F16 sources only give F16 results)
    chk.types(fn, b, {GGML_TYPE_F32} if dst_type == GGML_TYPE_F32 else {GGML_TYPE_F32, GGML_TYPE_F16}, "b")
    chk.rows_contiguous(fn, b, "b")
    for name, v, lo in (("s0", s0, 1), ("p0", p0, 0), ("d0", d0, 1)):
        chk.int_arg(fn, name, v, lo)
    # 1-D: ggml ignores s1/d1 (ggml_conv_1d passes 0), and p1 > 0 would silently zero the output
    for name, v, lo in (("s1", s1, 1 if is_2D else 0), ("p1", p1, 0), ("d1", d1, 1 if is_2D else 0)):
        chk.int_arg(fn, name, v, lo)
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
        chk.int_arg(fn, name, v, lo)
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
        out = Tensor(lib.ggml_cont(c, lib.ggml_permute(c, lib.ggml_reshape_3d(c, out.ptr, ol, n, oc), 0, 2, 1, 3)), ctx)
    return out


def ggml_conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
                 d0: int = 1, d1: int = 1) -> Tensor:
    """Kernel ``a [KW, KH, Cin, Cout]``, data ``b [W, H, Cin, N]`` -> ``[OW, OH, Cout, N]`` (im2col + mul_mat)."""
    fn = "ggml_conv_2d"
    a, b = _t(fn, a), _t(fn, b, "b")
    chk.floating(fn, ("a", a), ("b", b))
    chk.rows_contiguous(fn, b, "b")
    if a.type == GGML_TYPE_BF16 and b.type != GGML_TYPE_F32:  # a BF16 kernel makes an F32 im2col: F32 data only
        chk.fail(fn, "with a BF16 kernel the data b must be F32", chk.GgmlTypeError)
    for name, v, lo in (("s0", s0, 1), ("s1", s1, 1), ("p0", p0, 0), ("p1", p1, 0), ("d0", d0, 1), ("d1", d1, 1)):
        chk.int_arg(fn, name, v, lo)
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


def ggml_pool_1d(ctx: Context, a: Tensor, op: int, k0: int, s0: int, p0: int = 0) -> Tensor:
    fn = "ggml_pool_1d"
    a = _t(fn, a)
    chk.types(fn, a, F32_F16)
    _pool_op(fn, op)
    chk.int_arg(fn, "k0", k0, 1), chk.int_arg(fn, "s0", s0, 1), chk.int_arg(fn, "p0", p0, 0)
    ol = chk.out_size(fn, "length", a.shape[0], k0, s0, p0)
    return _op(fn, ctx, lib.ggml_pool_1d, (a,), (ol,) + a.shape[1:], (op, k0, s0, p0))


def ggml_pool_2d(ctx: Context, a: Tensor, op: int, k0: int, k1: int, s0: int, s1: int, p0: float = 0,
                 p1: float = 0) -> Tensor:
    fn = "ggml_pool_2d"
    a = _t(fn, a)
    chk.types(fn, a, F32_F16)
    _pool_op(fn, op)
    for name, v in (("k0", k0), ("k1", k1), ("s0", s0), ("s1", s1)):
        chk.int_arg(fn, name, v, 1)
    p0f, p1f = chk.float_arg(fn, "p0", p0), chk.float_arg(fn, "p1", p1)
    if p0f < 0 or p1f < 0:
        chk.fail(fn, f"padding must be >= 0, got p0={p0f}, p1={p1f}")
    ow = int((a.shape[0] + 2 * p0f - k0) / s0) + 1
    oh = int((a.shape[1] + 2 * p1f - k1) / s1) + 1
    if ow < 1 or oh < 1:
        chk.fail(fn, f"the pooled size would be {ow}x{oh} for input {a.shape[0]}x{a.shape[1]} and kernel {k0}x{k1}")
    return _op(fn, ctx, lib.ggml_pool_2d, (a,), (ow, oh) + a.shape[2:], (op, k0, k1, s0, s1, p0f, p1f))


def ggml_scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """``s * a + b`` element-wise."""
    a = _t("ggml_scale_bias", a)
    chk.types("ggml_scale_bias", a, {GGML_TYPE_F32})
    chk.contiguous("ggml_scale_bias", a)
    return _op("ggml_scale_bias", ctx, lib.ggml_scale_bias, (a,), a.shape,
               (chk.float_arg("ggml_scale_bias", "s", s), chk.float_arg("ggml_scale_bias", "b", b)), a.type)
