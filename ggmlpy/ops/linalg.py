"""Matrix products (``ggml_mul_mat``, ``ggml_out_prod``, ``ggml_mul_mat_id``), their precision, and ggml's
cross-entropy loss.
"""
from __future__ import annotations

from .._ffi import lib
from ..core.args import fail, is_int
from ..core.types import FLOAT_TYPES, GGML_TYPE_F32, GGML_TYPE_I32, type_name
from ..errors import GgmlTypeError, GgmlValueError
from ..graph.objects import Context, Tensor
from .attention import check_index_bound, shape_text
from .base import (
    floating,
    make_op,
    mul_mat,
    not_transposed,
    operand,
    out_prod,
    rows_contiguous,
    same_shape,
    types,
)


# the precisions ggml_prec_set_acc / ggml_prec_set_src take, widest first
GGML_PREC_DEFAULT = int(lib.GGML_PREC_DEFAULT)
GGML_PREC_F32 = int(lib.GGML_PREC_F32)
GGML_PREC_BF16 = int(lib.GGML_PREC_BF16)
GGML_PREC_F16 = int(lib.GGML_PREC_F16)
GGML_PREC_Q8 = int(lib.GGML_PREC_Q8)
GGML_PREC_Q4 = int(lib.GGML_PREC_Q4)
_PRECS = {GGML_PREC_DEFAULT: "GGML_PREC_DEFAULT", GGML_PREC_F32: "GGML_PREC_F32", GGML_PREC_BF16: "GGML_PREC_BF16",
          GGML_PREC_F16: "GGML_PREC_F16", GGML_PREC_Q8: "GGML_PREC_Q8", GGML_PREC_Q4: "GGML_PREC_Q4"}


def ggml_mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Matrix product sharing ne[0]: ``a [K, M]`` and ``b [K, N]`` give ``[M, N]`` (F32).

    ``result[m, n] = sum_k a[k, m] * b[k, n]``, i.e. ``a^T b`` in the ggml layout, and in numpy terms
    (numpy shape = reversed ne) ``b_np @ a_np.T``. A dense layer with weights ``w [n_in, n_out]`` and a
    batch ``x [n_in, batch]`` is ``ggml_mul_mat(ctx, w, x)`` -> ``[n_out, batch]``. In 3-D/4-D each
    matrix of b is multiplied by the matching matrix of a; a is broadcast when b's ne[2], ne[3] are
    multiples of a's. Differentiable (trainable weights ``a`` must be F32).

    Arguments:
        ctx: [glossary]
        a: F32, F16 or BF16 tensor ``[K, M, A2, A3]``, contiguous rows and not transposed
            (apply ``ggml_cont`` to a transposed view first); or a quantized one (``GGML_TYPE_Q8_0``,
            ``GGML_TYPE_Q4_K``, ...: a quantized model's weight) with F32 ``b``, which ggml multiplies block by
            block without decoding it (not differentiable with respect to ``a``).
        b: tensor ``[K, N, B2, B3]`` of type F32 or a's type, contiguous rows, with B2 % A2 == 0 and
            B3 % A3 == 0.

    Value: a new F32 Tensor ``[M, N, B2, B3]``. Raises GgmlValueError when ne[0] differ or the
    batch dimensions do not broadcast, GgmlTypeError for other types.

    Example:
        >>> h = ggml_mul_mat(ctx, w, x)             # w [784, 128], x [784, 32] -> [128, 32]
    """
    a, b = operand("ggml_mul_mat", a), operand("ggml_mul_mat", b, "b")
    floating("ggml_mul_mat", *((("a", a),) if not lib.ggml_is_quantized(a.type) else ()), ("b", b))
    if b.type not in (a.type, GGML_TYPE_F32):  # the CPU backend: b is F32 or a's dot-product type
        fail("ggml_mul_mat", f"b must be F32 or {type_name(a.type)} when a is {type_name(a.type)}, got "
                                 f"{type_name(b.type)}", GgmlTypeError)
    rows_contiguous("ggml_mul_mat", a)
    rows_contiguous("ggml_mul_mat", b, "b")
    return make_op("ggml_mul_mat", ctx, lib.ggml_mul_mat, (a, b), mul_mat("ggml_mul_mat", a, b))


def _prec_arg(fn: str, prec: object) -> int:
    if not is_int(prec) or int(prec) not in _PRECS:
        names = ", ".join(f"{n} ({v})" for v, n in _PRECS.items())
        fail(fn, f"prec must be one of {names}, got {prec!r}", GgmlValueError if is_int(prec)
                 else GgmlTypeError)
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
    a = operand(fn, a)
    prec = _prec_arg(fn, prec)
    if prec in (GGML_PREC_Q8, GGML_PREC_Q4):
        fail(fn, f"{_PRECS[prec]} is not an accumulation type (ggml allows it only for operands: "
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
    a = operand(fn, a)
    prec = _prec_arg(fn, prec)
    if not is_int(idx):
        fail(fn, f"idx must be an int, got {idx!r}", GgmlTypeError)
    if not 0 <= int(idx) < int(lib.GGML_MAX_SRC):  # ggml asserts it
        fail(fn, f"idx must be an operand index in [0, {int(lib.GGML_MAX_SRC)}), got {idx}")
    return bool(lib.ggml_prec_set_src(a.ptr, prec, int(idx)))


def ggml_out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Sum of outer products: ``a [M, K]`` and ``b [N, K]`` give ``[M, N]`` (F32).

    ``result[m, n] = sum_k a[m, k] * b[n, k]`` (the ne[1] dimension is reduced); this is how ggml
    computes weight gradients of ``ggml_mul_mat``. In 3-D/4-D, a is broadcast when b's ne[2], ne[3]
    are multiples of a's.

    Arguments:
        ctx: [glossary]
        a: F32, F16 or BF16 tensor ``[M, K, A2, A3]``, not transposed; a half-precision a (converted to F32
            row by row) cannot be broadcast. A quantized a (a frozen quantized weight in a backward pass) is
            decoded row by row as well, on the backends that take it (ggml's CPU; ``ggml_backend_supports_op``).
        b: F32 tensor ``[N, K, B2, B3]`` sharing ne[1] with a.

    Value: a new F32 Tensor ``[M, N, B2, B3]``.

    Example:
        >>> g_w = ggml_out_prod(ctx, x, g_h)        # x [n_in, batch], g_h [n_out, batch] -> [n_in, n_out]
    """
    a, b = operand("ggml_out_prod", a), operand("ggml_out_prod", b, "b")
    if not lib.ggml_is_quantized(a.type):
        types("ggml_out_prod", a, FLOAT_TYPES)
    types("ggml_out_prod", b, {GGML_TYPE_F32}, "b")
    if a.type != GGML_TYPE_F32 and a.shape[2:] != b.shape[2:]:
        fail("ggml_out_prod", f"an {type_name(a.type).upper()} a cannot be broadcast: a {list(a.shape)}, "
                              f"b {list(b.shape)}")
    not_transposed("ggml_out_prod", a)
    return make_op("ggml_out_prod", ctx, lib.ggml_out_prod, (a, b), out_prod("ggml_out_prod", a, b))


def ggml_cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Categorical cross-entropy of logits ``a`` against label probabilities ``b``, as a scalar.

    ``-(1/rows) * sum over rows of sum_k b_k * log_softmax(a)_k``, rows being the ne[0] vectors. ``a``
    holds raw logits (the softmax is part of the loss); each row of ``b`` sums to 1 (one-hot labels).
    Differentiable; mark the result with ``ggml_set_loss`` to train on it.

    Arguments:
        ctx: [glossary]
        a: F32 logits ``[n_classes, batch, ...]`` with contiguous rows.
        b: F32 labels of a's shape with contiguous rows.

    Value: a new F32 Tensor of shape ``[1, 1, 1, 1]``.

    Example:
        >>> loss = ggml_set_loss(ggml_cross_entropy_loss(ctx, logits, labels))
    """
    a, b = operand("ggml_cross_entropy_loss", a), operand("ggml_cross_entropy_loss", b, "b")
    types("ggml_cross_entropy_loss", a, {GGML_TYPE_F32})
    types("ggml_cross_entropy_loss", b, {GGML_TYPE_F32}, "b")
    same_shape("ggml_cross_entropy_loss", a, b)
    rows_contiguous("ggml_cross_entropy_loss", a)
    rows_contiguous("ggml_cross_entropy_loss", b, "b")
    return make_op("ggml_cross_entropy_loss", ctx, lib.ggml_cross_entropy_loss, (a, b), (1, 1, 1, 1))


def ggml_mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Matrix products with a per-token choice of expert matrices (mixture of experts).

    ``as_`` stacks the expert matrices ``[K, M, n_expert]``, ``b [K, B1, n_tokens]`` holds the inputs
    and ``ids [n_used, n_tokens]`` (I32) the experts chosen for each token. The result ``[M, n_used,
    n_tokens]`` has ``result[:, e, t] = ggml_mul_mat(as_[:, :, ids[e, t]], b[:, e % B1, t])``: with
    ``B1 == 1`` every chosen expert sees the token's single input, with ``B1 == n_used`` each has its
    own. ggml has no backward pass for it. (ggml and ggmlR call the first operand ``as``, a Python
    keyword: here it is ``as_``.)

    Arguments:
        ctx: [glossary]
        as_: the experts, F32, F16 or BF16 ``[K, M, n_expert]`` (3-D), contiguous rows, not transposed.
        b: F32 inputs ``[K, B1, n_tokens]`` (3-D) with contiguous rows; ``n_used`` must be a multiple of B1.
        ids: I32 expert indices ``[n_used, n_tokens]``, each in ``[0, n_expert)`` (ggml does not check
            them and reads or writes outside its memory otherwise).

    Value: a new F32 Tensor ``[M, n_used, n_tokens]``.

    Example:
        >>> y = ggml_mul_mat_id(ctx, experts, x, ids)    # experts [8, 16, 4], x [8, 1, 2], ids [1, 2] -> [16, 1, 2]
    """
    fn = "ggml_mul_mat_id"
    as_, b, ids = operand(fn, as_, "as_"), operand(fn, b, "b"), operand(fn, ids, "ids")
    floating(fn, ("as_", as_))
    types(fn, b, {GGML_TYPE_F32}, "b")
    types(fn, ids, {GGML_TYPE_I32}, "ids")
    rows_contiguous(fn, as_, "as_")
    not_transposed(fn, as_, "as_")
    rows_contiguous(fn, b, "b")
    (k, m, n_expert, a3), (bk, b1, n_tok, b3), (n_used, i1, i2, i3) = as_.shape, b.shape, ids.shape
    if a3 != 1 or b3 != 1 or i2 != 1 or i3 != 1:
        fail(fn, f"as_ and b must be 3-D and ids 2-D, got as_ {shape_text(as_)}, b {shape_text(b)}, ids "
                     f"{shape_text(ids)}")
    if bk != k:
        fail(fn, f"as_ and b must share ne[0] (the reduced dimension), got as_ {shape_text(as_)} and b "
                     f"{shape_text(b)}")
    if i1 != n_tok:
        fail(fn, f"ids needs one column per token: ids.ne[1] must be b.ne[2]={n_tok}, got {shape_text(ids)}")
    if n_used % b1:
        fail(fn, f"ids.ne[0]={n_used} (experts per token) must be a multiple of b.ne[1]={b1}")
    check_index_bound(fn, "the expert indices ids", ids, n_expert, "as_ (its ne[2]: the experts)")
    return make_op(fn, ctx, lib.ggml_mul_mat_id, (as_, b, ids), (m, n_used, n_tok, 1))
