"""Loss types, and the loss graphs ggml-opt does not build itself.

ggml-opt knows MEAN, SUM, CROSS_ENTROPY and MSE. MAE, Huber (delta 1), binary
cross-entropy (on probabilities), weighted MSE and multi-head losses are built here
from differentiable ops, with ggmlR's definitions (each head's value is a mean over
all output elements). Their labels, weights and per-head values live in a small
context allocated on the first scheduler backend that runs all of its ops (the device
running the outputs, so the loss stays there; else the CPU, which runs everything).

ggml-opt then receives a ``[1, batch]`` tensor whose every entry is the total loss
T = sum_i w_i * L_i, with loss type MEAN: ggml's loss is T / opt_period and its
result bookkeeping (ndata, per-batch loss x opt_period) stays exact.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._ffi import ffi, lib
from ..backend.buffer import ggml_backend_alloc_ctx_tensors
from ..backend.probe import backend_runs
from ..core.types import GGML_TYPE_F32
from ..errors import GgmlValueError
from ..graph.context import ggml_graph_overhead, ggml_init, ggml_tensor_overhead
from ..graph.objects import Context, Tensor
from ..graph.tensor import ggml_new_tensor_2d, ggml_set_input, ggml_set_name, ggml_set_output
from ..ops.elementwise import (
    ggml_abs,
    ggml_add,
    ggml_cont,
    ggml_div,
    ggml_exp,
    ggml_log,
    ggml_mul,
    ggml_relu,
    ggml_scale,
    ggml_scale_bias,
    ggml_soft_max,
    ggml_sqr,
    ggml_sqrt,
    ggml_step,
    ggml_sub,
)
from ..ops.layout import ggml_reshape, ggml_reshape_4d
from ..ops.linalg import ggml_cross_entropy_loss
from ..ops.reduce import ggml_argmax, ggml_count_equal, ggml_repeat, ggml_sum, ggml_sum_rows
from .custom_loss import custom_loss_tensor, CustomLoss, LOSS_CUSTOM


if TYPE_CHECKING:
    from ..backend.backend import Backend
    from ..backend.buffer import Buffer
    from ..compute.sched import Scheduler
    from ..core.handle import Handle


Penalty = tuple[Tensor, float, float]  # a weight, its L1 and L2 factors (Keras' regularizers)


LOSS_MEAN = int(lib.GGML_OPT_LOSS_TYPE_MEAN)
LOSS_SUM = int(lib.GGML_OPT_LOSS_TYPE_SUM)
LOSS_CROSS_ENTROPY = int(lib.GGML_OPT_LOSS_TYPE_CROSS_ENTROPY)
LOSS_MSE = int(lib.GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR)
# ggmlR's extensions, numbered after ggml's own as in ggmlR's ggml-opt; then Keras' losses ggmlR lacks.
LOSS_WEIGHTED_MSE, LOSS_MAE, LOSS_HUBER, LOSS_BINARY_CROSS_ENTROPY = 4, 5, 6, 7
LOSS_KL_DIVERGENCE, LOSS_HINGE, LOSS_SQUARED_HINGE, LOSS_COSINE_SIMILARITY = 8, 9, 10, 11
LOSS_BINARY_CROSS_ENTROPY_LOGITS = 12

LOSS_NAMES = {LOSS_MEAN: "mean", LOSS_SUM: "sum", LOSS_CROSS_ENTROPY: "cross_entropy", LOSS_MSE: "mse",
              LOSS_WEIGHTED_MSE: "weighted_mse", LOSS_MAE: "mae", LOSS_HUBER: "huber",
              LOSS_BINARY_CROSS_ENTROPY: "binary_cross_entropy", LOSS_KL_DIVERGENCE: "kl_divergence",
              LOSS_HINGE: "hinge", LOSS_SQUARED_HINGE: "squared_hinge", LOSS_COSINE_SIMILARITY: "cosine_similarity",
              LOSS_BINARY_CROSS_ENTROPY_LOGITS: "binary_cross_entropy_logits", LOSS_CUSTOM: "custom"}
BINARY_LOSSES = {LOSS_BINARY_CROSS_ENTROPY, LOSS_BINARY_CROSS_ENTROPY_LOGITS}
BUILTIN_LOSSES = {LOSS_MEAN, LOSS_SUM, LOSS_CROSS_ENTROPY, LOSS_MSE}
LABELLED_LOSSES = set(LOSS_NAMES) - {LOSS_MEAN, LOSS_SUM}
BCE_EPS = 1e-7
HUBER_DELTA = 1.0


def ggml_opt_loss_type_mean() -> int:
    """Loss type MEAN: minimise the mean of the outputs themselves (no labels).

    The loss is ``sum(outputs) / nelements(outputs)``: the graph computes its own per-element loss
    and the optimizer minimises its average (ggml's way to define a custom loss). Batches carry inputs
    only (``x``, ``(x,)`` or ``{"inputs": [...]}``); the dataset of ``ggml_opt_fit`` has ``ne_label = 0``.

    Pass it as ``loss_type`` to ``ggml_fit_opt``, ``ggml_fit_opt_gen``, ``ggml_opt_init`` or
    ``ggml_opt_init_for_fit`` (or in ``loss_types`` of the multi-head functions).

    Value: the int constant (ggml's ``GGML_OPT_LOSS_TYPE_MEAN``, 0).

    Example:
        >>> ggml_fit_opt_gen(sched, ctx, x, my_loss_terms, gen, loss_type=ggml_opt_loss_type_mean())
    """
    return LOSS_MEAN


def ggml_opt_loss_type_sum() -> int:
    """Loss type SUM: minimise the sum of the outputs themselves (no labels).

    Like ``ggml_opt_loss_type_mean`` but the loss is ``sum(outputs)``, not divided by the number of
    elements, so its size (and the gradient's) grows with the batch. Cannot be mixed with the
    per-datapoint loss types in a multi-head fit.

    Pass it as ``loss_type`` to ``ggml_fit_opt``, ``ggml_fit_opt_gen``, ``ggml_opt_init`` or
    ``ggml_opt_init_for_fit`` (or in ``loss_types`` of the multi-head functions).

    Value: the int constant (ggml's ``GGML_OPT_LOSS_TYPE_SUM``, 1).

    Example:
        >>> opt = ggml_opt_init(sched, ggml_opt_loss_type_sum(), ctx_compute=ctx, inputs=x, outputs=terms)
    """
    return LOSS_SUM


def ggml_opt_loss_type_cross_entropy() -> int:
    """Loss type CROSS_ENTROPY: categorical cross-entropy on **logits**.

    The outputs must be raw, unnormalised scores (logits) ``[n_classes, batch]``: the loss applies the
    softmax itself, ``-(1/batch) * sum_i sum_k y_ik * log_softmax(z_i)_k``. Do not put ``ggml_soft_max``
    at the end of the graph (that would apply it twice). The labels are one-hot rows (or class
    probabilities), each row summing to 1, in the same ``[n_classes, batch]`` layout. It is the only
    loss type for which an accuracy is reported (argmax of the outputs against argmax of the labels).

    Pass it as ``loss_type`` to ``ggml_fit_opt``, ``ggml_fit_opt_gen``, ``ggml_opt_init`` or
    ``ggml_opt_init_for_fit`` (or in ``loss_types`` of the multi-head functions).

    Value: the int constant (ggml's ``GGML_OPT_LOSS_TYPE_CROSS_ENTROPY``, 2).

    Example:
        >>> logits = ggml_add(ctx, ggml_mul_mat(ctx, w, x), b)          # [10, batch], no softmax
        >>> ggml_fit_opt(sched, ctx, x, logits, dataset, loss_type=ggml_opt_loss_type_cross_entropy())
    """
    return LOSS_CROSS_ENTROPY


def ggml_opt_loss_type_mse() -> int:
    """Loss type MSE: mean squared error against labels of the outputs' shape (the default).

    The loss is ``sum((outputs - labels)**2) / nelements(outputs)``. The outputs are used as they are
    (any real values; no activation implied). The labels have the outputs' layout.

    Pass it as ``loss_type`` to ``ggml_fit_opt``, ``ggml_fit_opt_gen``, ``ggml_opt_init`` or
    ``ggml_opt_init_for_fit`` (or in ``loss_types`` of the multi-head functions).

    Value: the int constant (ggml's ``GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR``, 3).

    Example:
        >>> ggml_fit_opt_gen(sched, ctx, x, y_hat, gen, loss_type=ggml_opt_loss_type_mse())
    """
    return LOSS_MSE


def ggml_opt_loss_type_weighted_mse() -> int:
    """Loss type WEIGHTED_MSE: squared error times a weight per sample or per element (ggmlR's extension).

    The loss is ``sum(w * (outputs - labels)**2) / nelements(outputs)`` for 2-D outputs ``[ne0, batch]``.
    The weights are ``[loss_mask_ne0, batch]``: ``loss_mask_ne0 = 1`` (the default) is one weight per
    sample, ``loss_mask_ne0 = ne0`` one per output element (a mask: 0 ignores an element). With an
    in-memory dataset they come from ``ggml_opt_dataset_weights`` (all 1 until set); with a generator
    each batch gives them as ``{"inputs": ..., "labels": ..., "weights": w}``. Built by ggmlpy from
    differentiable ops, so ``ggml_opt_fit``/``ggml_opt_epoch`` (ggml's C loops) cannot use it.

    Pass it as ``loss_type`` to ``ggml_fit_opt``, ``ggml_fit_opt_gen``, ``ggml_opt_init`` or
    ``ggml_opt_init_for_fit`` (or in ``loss_types`` of the multi-head functions).

    Value: the int constant 4 (numbered after ggml's own, as in ggmlR).

    Example:
        >>> ggml_fit_opt_gen(sched, ctx, x, y_hat, gen, loss_type=ggml_opt_loss_type_weighted_mse(),
        ...                  loss_mask_ne0=1)
    """
    return LOSS_WEIGHTED_MSE


def ggml_opt_loss_type_mae() -> int:
    """Loss type MAE: mean absolute error against labels (ggmlR's extension).

    The loss is ``sum(|outputs - labels|) / nelements(outputs)``; the outputs are used as they are.
    Less sensitive to outliers than MSE. Built by ggmlpy from differentiable ops, so
    ``ggml_opt_fit``/``ggml_opt_epoch`` (ggml's C loops) cannot use it.

    Pass it as ``loss_type`` to ``ggml_fit_opt``, ``ggml_fit_opt_gen``, ``ggml_opt_init`` or
    ``ggml_opt_init_for_fit`` (or in ``loss_types`` of the multi-head functions).

    Value: the int constant 5.

    Example:
        >>> ggml_fit_opt(sched, ctx, x, y_hat, dataset, loss_type=ggml_opt_loss_type_mae())
    """
    return LOSS_MAE


def ggml_opt_loss_type_huber() -> int:
    """Loss type HUBER: the Huber loss with delta 1 against labels (ggmlR's extension).

    Per element, with ``e = outputs - labels``: ``0.5 * e**2`` where ``|e| <= 1``, ``|e| - 0.5``
    beyond; the loss is the mean over all output elements. Quadratic near the target, linear for
    outliers. Built by ggmlpy from differentiable ops, so ``ggml_opt_fit``/``ggml_opt_epoch``
    (ggml's C loops) cannot use it.

    Pass it as ``loss_type`` to ``ggml_fit_opt``, ``ggml_fit_opt_gen``, ``ggml_opt_init`` or
    ``ggml_opt_init_for_fit`` (or in ``loss_types`` of the multi-head functions).

    Value: the int constant 6.

    Example:
        >>> ggml_fit_opt(sched, ctx, x, y_hat, dataset, loss_type=ggml_opt_loss_type_huber())
    """
    return LOSS_HUBER


def ggml_opt_loss_type_binary_cross_entropy() -> int:
    """Loss type BINARY_CROSS_ENTROPY on **probabilities** (ggmlR's extension).

    The outputs must already be probabilities in [0, 1], e.g. the result of ``ggml_sigmoid`` (unlike
    ``ggml_opt_loss_type_cross_entropy``, which takes logits). Per element:
    ``-(y * log(p) + (1 - y) * log(1 - p))`` with ``p`` kept within [1e-7, 1 - 1e-7]; the loss is the
    mean over all output elements. Labels are 0/1 (or soft targets in [0, 1]) in the outputs' layout;
    each output element is an independent yes/no (multi-label classification). Built by ggmlpy from
    differentiable ops, so ``ggml_opt_fit``/``ggml_opt_epoch`` (ggml's C loops) cannot use it.

    Pass it as ``loss_type`` to ``ggml_fit_opt``, ``ggml_fit_opt_gen``, ``ggml_opt_init`` or
    ``ggml_opt_init_for_fit`` (or in ``loss_types`` of the multi-head functions).

    Value: the int constant 7.

    Example:
        >>> p = ggml_sigmoid(ctx, ggml_add(ctx, ggml_mul_mat(ctx, w, x), b))   # probabilities
        >>> ggml_fit_opt_gen(sched, ctx, x, p, gen, loss_type=ggml_opt_loss_type_binary_cross_entropy())
    """
    return LOSS_BINARY_CROSS_ENTROPY


def ggml_opt_loss_type_kl_divergence() -> int:
    """Loss type KL_DIVERGENCE: Kullback-Leibler divergence of the outputs from the labels, as Keras' ``KLDivergence``.

    Both are distributions over the last axis (the outputs probabilities, e.g. a softmax); per row
    ``sum_k y_k * log(y_k / p_k)``, with ``y`` and ``p`` kept above 1e-7 inside the logs as ``p (1 - 2e-7) + 1e-7``
    (a label 0 adds nothing); the loss is the mean over rows (samples, or positions of a sequence). Built by
    ggmlpy from differentiable ops, so ``ggml_opt_fit``/``ggml_opt_epoch`` (ggml's C loops) cannot use it.

    Value: the int constant 8.

    Example:
        >>> ggml_fit_opt_gen(sched, ctx, x, ggml_soft_max(ctx, z), gen, loss_type=ggml_opt_loss_type_kl_divergence())
    """
    return LOSS_KL_DIVERGENCE


def ggml_opt_loss_type_hinge() -> int:
    """Loss type HINGE: ``max(1 - y * p, 0)`` per element, labels -1 or 1 (Keras' ``Hinge``; the model layer turns
    0/1 labels into -1/1 as Keras does); the loss is the mean over all output elements. Built by ggmlpy from
    differentiable ops, so ``ggml_opt_fit``/``ggml_opt_epoch`` (ggml's C loops) cannot use it.

    Value: the int constant 9.

    Example:
        >>> ggml_fit_opt_gen(sched, ctx, x, scores, gen, loss_type=ggml_opt_loss_type_hinge())
    """
    return LOSS_HINGE


def ggml_opt_loss_type_squared_hinge() -> int:
    """Loss type SQUARED_HINGE: ``max(1 - y * p, 0) ** 2`` per element, labels -1 or 1 (Keras' ``SquaredHinge``);
    the loss is the mean over all output elements. Built by ggmlpy from differentiable ops, so
    ``ggml_opt_fit``/``ggml_opt_epoch`` (ggml's C loops) cannot use it.

    Value: the int constant 10.

    Example:
        >>> ggml_fit_opt_gen(sched, ctx, x, scores, gen, loss_type=ggml_opt_loss_type_squared_hinge())
    """
    return LOSS_SQUARED_HINGE


def ggml_opt_loss_type_cosine_similarity() -> int:
    """Loss type COSINE_SIMILARITY: minus the cosine similarity of each output row (ne0 values) with its label row,
    ``-sum(y / |y| * p / |p|)``, averaged over the rows (Keras' ``CosineSimilarity``: -1 when every row points
    the label's way, 0 when orthogonal). Each norm is ``sqrt(sum(x**2) + 1e-12)``, Keras' l2_normalize floor.
    Built by ggmlpy from differentiable ops, so ``ggml_opt_fit``/``ggml_opt_epoch`` (ggml's C loops) cannot use it.

    Value: the int constant 11.

    Example:
        >>> ggml_fit_opt_gen(sched, ctx, x, embeddings, gen, loss_type=ggml_opt_loss_type_cosine_similarity())
    """
    return LOSS_COSINE_SIMILARITY


COSINE_EPS = 1e-12


def ggml_opt_loss_type_binary_cross_entropy_logits() -> int:
    """Loss type BINARY_CROSS_ENTROPY_LOGITS: binary cross-entropy on **logits** (Keras'
    ``BinaryCrossentropy(from_logits=True)``): per element ``max(z, 0) - z * y + log(1 + exp(-|z|))``, which is
    ``-(y log s + (1 - y) log(1 - s))`` with ``s = sigmoid(z)`` computed without overflow and without the
    probabilities' clipping, so large logits still get a gradient. The loss is the mean over all output
    elements; labels are 0/1 (or soft targets in [0, 1]) in the outputs' layout. Leave the sigmoid out of the
    model. Binary accuracy counts a logit above 0 as a yes. Built by ggmlpy from differentiable ops, so
    ``ggml_opt_fit``/``ggml_opt_epoch`` (ggml's C loops) cannot use it.

    Value: the int constant 12.

    Example:
        >>> z = ggml_add(ctx, ggml_mul_mat(ctx, w, x), b)   # logits, no sigmoid
        >>> ggml_fit_opt_gen(sched, ctx, x, z, gen, loss_type=ggml_opt_loss_type_binary_cross_entropy_logits())
    """
    return LOSS_BINARY_CROSS_ENTROPY_LOGITS


def _unit_rows(ctx: Context, x: Tensor) -> Tensor:
    """``x`` with each row (ne0) divided by its L2 norm; the norm repeated to x's shape so that the division's
    backward sees equal shapes."""
    norm = ggml_sqrt(ctx, ggml_scale_bias(ctx, ggml_sum_rows(ctx, ggml_sqr(ctx, x)), 1.0, COSINE_EPS))
    return ggml_div(ctx, x, ggml_repeat(ctx, norm, x))


def check_loss_type(loss_type: object, what: str = "loss_type") -> int:
    if isinstance(loss_type, bool) or not isinstance(loss_type, int) or loss_type not in LOSS_NAMES or \
            loss_type == LOSS_CUSTOM and not isinstance(loss_type, CustomLoss):
        options = ", ".join(f"ggml_opt_loss_type_{n}()" for n in LOSS_NAMES.values() if n != "custom")
        raise GgmlValueError(f"{what}: expected one of {options} or ggml_opt_loss_custom(fn), got {loss_type!r}")
    return loss_type


def physical_batch(t: Tensor) -> int:
    """The samples in a batch tensor. A matrix ``[features, batch]`` (ne2 = ne3 = 1) has ``ne1`` samples, as
    ggml-opt counts them, so a batch of one sample ``[features, 1]`` is one (the rule below made it
    ``features``: accumulation went off and per-sample means were divided by the feature count). A tensor
    of more axes (images ``[W, H, C, batch]``, sequences ``[F, T, batch]``) has ggmlR's rule: its last axis
    whose size is not 1 (1 if all are)."""
    ne = t.shape
    if ne[2] == 1 and ne[3] == 1:
        return ne[1]
    for n in reversed(ne):
        if n != 1:
            return n
    return 1


@dataclass
class Head:
    loss_type: int
    outputs: Tensor
    weight: float = 1.0
    labels: Tensor | None = None
    weights: Tensor | None = None  # weighted MSE: [loss_mask_ne0, batch]
    value: Tensor | None = None    # this head's loss L_i (a scalar), readable after each eval
    ncorrect: Tensor | None = None  # cross-entropy heads: I64 count of argmax matches, set after each eval
    scores: Tensor | None = None   # cross-entropy heads: a readable copy of the outputs (the logits)
    sample_weighted: bool = False  # every loss: a [1, batch] weight per sample (``weights``) scales its loss
    custom: CustomLoss | None = None  # LOSS_CUSTOM: the loss type with its function


@dataclass
class LossGraph:
    """What the loss builder hands to ggml-opt, and the tensors the training loop feeds and reads."""
    heads: list[Head]
    opt_outputs: Tensor
    ggml_loss_type: int
    ctx: Context | None = None
    buffer: Buffer | None = None
    owned: list[Handle] = field(default_factory=list)
    # computed with every eval besides the loss (ggml-opt's extra outputs): each head's count of argmax matches
    extra_outputs: list[Tensor] = field(default_factory=list)

    @property
    def composite(self) -> bool:
        return self.ctx is not None

    def free(self) -> None:
        for h in self.owned:
            h.free()
        self.owned.clear()


def _elementwise_mean(ctx: Context, elementwise: Tensor) -> Tensor:
    return ggml_scale(ctx, ggml_sum(ctx, elementwise), 1.0 / elementwise.nelements())


def _weighted_cross_entropy(ctx: Context, logits: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """-(1/batch) sum_i w_i sum_k y_ik log softmax(z_i)_k. ggml's fused loss cannot take weights (its backward
    assumes labels summing to 1), so this one is built from softmax and log, with p kept >= eps."""
    p = ggml_scale_bias(ctx, ggml_soft_max(ctx, logits), 1.0 - 2.0 * BCE_EPS, BCE_EPS)
    ll = ggml_mul(ctx, ggml_mul(ctx, ggml_log(ctx, p), y), w)
    return ggml_scale(ctx, ggml_sum(ctx, ll), -1.0 / physical_batch(logits))


def _head_value(ctx: Context, head: Head) -> Tensor:
    out, y = head.outputs, head.labels
    t = head.loss_type
    if t == LOSS_CROSS_ENTROPY:
        assert y is not None  # a labelled loss
        if head.scores is not None:
            out = head.scores
        if head.sample_weighted:
            assert head.weights is not None  # made with the labels
            return _weighted_cross_entropy(ctx, out, y, head.weights)
        return ggml_cross_entropy_loss(ctx, out, y)
    if t == LOSS_SUM:
        return ggml_sum(ctx, _elementwise(ctx, head, out, y))
    if t == LOSS_CUSTOM:
        assert y is not None and head.custom is not None  # a labelled loss, with its function
        per = custom_loss_tensor(ctx, head.custom, y, out, physical_batch(out))
        if head.weights is not None:
            if per.nelements() == 1:
                raise GgmlValueError(f"the custom loss '{head.custom.name}' returns one value per batch, so sample "
                                     "weights cannot weigh its samples; return per-sample values (the batch as the "
                                     "last axis)")
            per = ggml_mul(ctx, per, ggml_reshape_4d(ctx, head.weights, *_per_sample_shape(per)))
        return _elementwise_mean(ctx, per)
    return _elementwise_mean(ctx, _elementwise(ctx, head, out, y))


def _elementwise(ctx: Context, head: Head, out: Tensor, y: Tensor | None) -> Tensor:
    """The per-element loss of an element-wise loss type, times the sample weights if the head has them."""
    per = _elementwise_unweighted(ctx, head.loss_type, out, y)
    if head.weights is not None:
        per = ggml_mul(ctx, per, head.weights)
    return per


def _elementwise_unweighted(ctx: Context, t: int, out: Tensor, y: Tensor | None) -> Tensor:
    if t == LOSS_MEAN:
        return out
    assert y is not None  # every other element-wise loss is a labelled one
    if t == LOSS_BINARY_CROSS_ENTROPY:
        # p is squeezed into [eps, 1 - eps] so log never sees 0: p' = p (1 - 2 eps) + eps, and
        # 1 - p' = (1 - p) (1 - 2 eps) + eps. 1 - p is exact in float32 for p >= 0.5, so q keeps eps near
        # p = 1 (1 - eps itself is not representable in float32: -(1 - 2 eps) p + (1 - eps) gave 6e-8).
        p = ggml_scale_bias(ctx, out, 1.0 - 2.0 * BCE_EPS, BCE_EPS)
        q = ggml_scale_bias(ctx, ggml_scale_bias(ctx, out, -1.0, 1.0), 1.0 - 2.0 * BCE_EPS, BCE_EPS)
        not_y = ggml_scale_bias(ctx, y, -1.0, 1.0)
        ll = ggml_add(ctx, ggml_mul(ctx, ggml_log(ctx, p), y),
                          ggml_mul(ctx, ggml_log(ctx, q), not_y))
        return ggml_scale(ctx, ll, -1.0)
    if t == LOSS_BINARY_CROSS_ENTROPY_LOGITS:
        # relu(z) - z y + log(1 + exp(-|z|)): exp never sees a positive argument (Keras' stable form)
        tail = ggml_log(ctx, ggml_scale_bias(ctx, ggml_exp(ctx, ggml_scale(ctx, ggml_abs(ctx, out), -1.0)), 1.0, 1.0))
        return ggml_add(ctx, ggml_sub(ctx, ggml_relu(ctx, out), ggml_mul(ctx, out, y)), tail)
    if t == LOSS_KL_DIVERGENCE:
        # y (log y' - log p') per element, times the row length so that the mean over elements is Keras' mean
        # over rows of the sum over the last axis; y' and p' squeezed into [eps, 1 - eps] as for BCE
        p = ggml_scale_bias(ctx, out, 1.0 - 2.0 * BCE_EPS, BCE_EPS)
        yq = ggml_scale_bias(ctx, y, 1.0 - 2.0 * BCE_EPS, BCE_EPS)
        return ggml_scale(ctx, ggml_mul(ctx, y, ggml_sub(ctx, ggml_log(ctx, yq), ggml_log(ctx, p))), out.shape[0])
    if t == LOSS_COSINE_SIMILARITY:
        # -(y/|y|)(p/|p|) per element, times the row length: the mean over elements is the mean over rows of
        # minus each row's cosine similarity
        return ggml_scale(ctx, ggml_mul(ctx, _unit_rows(ctx, y), _unit_rows(ctx, out)), -float(out.shape[0]))
    if t in (LOSS_HINGE, LOSS_SQUARED_HINGE):
        margin = ggml_relu(ctx, ggml_scale_bias(ctx, ggml_mul(ctx, y, out), -1.0, 1.0))  # max(1 - y p, 0)
        return margin if t == LOSS_HINGE else ggml_sqr(ctx, margin)
    err = ggml_sub(ctx, out, y)
    if t in (LOSS_MSE, LOSS_WEIGHTED_MSE):
        return ggml_sqr(ctx, err)
    a = ggml_abs(ctx, err)
    if t == LOSS_MAE:
        return a
    if t == LOSS_HUBER:
        # Branch-free Huber with delta 1: c = min(|e|, 1) = |e| - relu(|e| - 1); 0.5 c^2 + (|e| - c).
        c = ggml_sub(ctx, a, ggml_relu(ctx, ggml_scale_bias(ctx, a, 1.0, -HUBER_DELTA)))
        return ggml_add(ctx, ggml_scale(ctx, ggml_sqr(ctx, c), 0.5), ggml_sub(ctx, a, c))
    raise GgmlValueError(f"unknown loss type {t}")


def _per_sample_shape(outputs: Tensor) -> list[int]:
    """[1, 1, ..., batch]: one weight per sample, broadcast over the other axes of ``outputs``."""
    shape = [1, 1, 1, 1]
    dims = [i for i, n in enumerate(outputs.shape) if n != 1]
    if dims:
        shape[dims[-1]] = outputs.shape[dims[-1]]
    return shape


def build_loss_graph(heads: Sequence[Head], sched: Scheduler, loss_mask_ne0: int | None = None,
                     force_composite: bool = False, penalties: Sequence[Penalty] = ()) -> LossGraph:
    """Build what ggml-opt trains. One head with a ggml loss goes to ggml-opt unchanged. ``penalties``:
    ``(weight tensor, l1, l2)`` each, ``l1 * sum|w| + l2 * sum w^2`` added to the total (Keras' regularizers)."""
    heads = list(heads)
    force_composite = force_composite or any(h.sample_weighted for h in heads) or bool(penalties)
    if len(heads) == 1 and heads[0].loss_type in BUILTIN_LOSSES and heads[0].weight == 1.0 and not force_composite:
        return LossGraph(heads, heads[0].outputs, heads[0].loss_type)
    kinds = {h.loss_type == LOSS_SUM for h in heads}
    if len(kinds) > 1:
        raise GgmlValueError("heads cannot mix the SUM loss with per-datapoint losses (ggmlR refuses it too)")
    n_tensors = 40 * len(heads) + 8 + 512 * sum(h.loss_type == LOSS_CUSTOM for h in heads) + 8 * len(penalties)
    ctx = ggml_init(mem_size=n_tensors * ggml_tensor_overhead() + ggml_graph_overhead(64) + 4096, no_alloc=True)
    batch = physical_batch(heads[0].outputs)
    graph_extra: list[Tensor] = []
    values: list[Tensor] = []
    for i, h in enumerate(heads):
        if physical_batch(h.outputs) != batch:
            raise GgmlValueError(f"all heads must have the same batch size: head 1 has {batch}, head {i + 1} "
                                 f"has {physical_batch(h.outputs)}")
        if h.loss_type in LABELLED_LOSSES:
            h.labels = ggml_set_input(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, h.outputs.nelements() // batch, batch))
            ggml_set_name(h.labels, f"labels_{i + 1}")
            if h.labels.shape[:2] != h.outputs.shape[:2]:
                h.labels = ggml_reshape(ctx, h.labels, h.outputs)
        if h.sample_weighted:
            h.weights = ggml_set_input(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, batch))
            ggml_set_name(h.weights, f"sample_weights_{i + 1}")
            if h.outputs.shape[2:] != (1, 1) and h.loss_type not in (LOSS_CROSS_ENTROPY, LOSS_CUSTOM):
                h.weights = ggml_reshape_4d(ctx, h.weights, *_per_sample_shape(h.outputs))
        elif h.loss_type == LOSS_WEIGHTED_MSE:
            width = loss_mask_ne0 or 1
            ne0 = h.outputs.shape[0]
            if width not in (1, ne0):
                raise GgmlValueError(f"loss_mask_ne0 must be None, 1 (one weight per sample) or {ne0} (one per "
                                     f"output element), got {loss_mask_ne0!r}")
            h.weights = ggml_set_input(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, width, batch))
            ggml_set_name(h.weights, f"loss_weights_{i + 1}")
            if h.outputs.shape[2:] != (1, 1):
                raise GgmlValueError("weighted MSE needs 2-D outputs [ne0, batch]")
        if h.loss_type == LOSS_CROSS_ENTROPY and h.outputs.shape[2:] == (1, 1):
            # The argmax matches are counted in the graph, where the logits are (on a GPU: no copy to the host);
            # the count feeds no loss, so it is one of ggml-opt's extra outputs.
            assert h.labels is not None  # a labelled loss
            h.scores = scores = ggml_set_name(ggml_cont(ctx, h.outputs), f"scores_{i + 1}")
            h.ncorrect = ggml_set_output(ggml_count_equal(ctx, ggml_argmax(ctx, scores),
                                                              ggml_argmax(ctx, h.labels)))
            ggml_set_name(h.ncorrect, f"ncorrect_{i + 1}")
            graph_extra.append(h.ncorrect)
        elif h.loss_type in BINARY_LOSSES:
            h.ncorrect = ggml_set_name(ggml_set_output(_binary_correct(ctx, h, batch)), f"ncorrect_{i + 1}")
            graph_extra.append(h.ncorrect)
        h.value = value = ggml_set_output(_head_value(ctx, h))
        ggml_set_name(value, f"loss_{i + 1}")
        values.append(value)
    total = values[0] if heads[0].weight == 1.0 else ggml_scale(ctx, values[0], heads[0].weight)
    for h, value in zip(heads[1:], values[1:]):
        total = ggml_add(ctx, total, ggml_scale(ctx, value, h.weight))
    for w, l1, l2 in penalties:
        if l1:
            total = ggml_add(ctx, total, ggml_scale(ctx, ggml_sum(ctx, ggml_abs(ctx, w)), l1))
        if l2:
            total = ggml_add(ctx, total, ggml_scale(ctx, ggml_sum(ctx, ggml_sqr(ctx, w)), l2))
    template = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, batch)  # only its shape is used
    per_datapoint = ggml_set_name(ggml_repeat(ctx, total, template), "loss_per_datapoint")
    graph = LossGraph(heads, per_datapoint, LOSS_SUM if LOSS_SUM in {h.loss_type for h in heads} else LOSS_MEAN,
                      ctx=ctx, extra_outputs=graph_extra)
    if graph.ggml_loss_type == LOSS_SUM:
        # SUM semantics: ggml sums [1, batch] copies of T; hand it T itself instead.
        graph.opt_outputs = total
    graph.buffer = ggml_backend_alloc_ctx_tensors(ctx, loss_backend(ctx, sched))
    graph.owned = [b for b in (graph.buffer, ctx) if b is not None]
    return graph


def _binary_correct(ctx: Context, h: Head, batch: int) -> Tensor:
    """Binary accuracy counted in the graph (Keras' binary_accuracy at 0.5): the samples' shares of outputs on
    the side of 0.5 their label is on (of 0 for logits), summed over the batch (an F32 scalar)."""
    per_sample = h.outputs.nelements() // batch
    threshold = 0.0 if h.loss_type == LOSS_BINARY_CROSS_ENTROPY_LOGITS else 0.5
    pred = ggml_step(ctx, ggml_scale_bias(ctx, h.outputs, 1.0, -threshold))
    assert h.labels is not None  # binary losses are labelled
    truth = ggml_step(ctx, ggml_scale_bias(ctx, h.labels, 1.0, -0.5))
    wrong = ggml_sum(ctx, ggml_abs(ctx, ggml_sub(ctx, pred, truth)))
    return ggml_scale_bias(ctx, wrong, -1.0 / per_sample, float(batch))


def loss_backend(ctx: Context, sched: Scheduler) -> Backend:
    """Where a loss context is allocated: the first of the scheduler's backends that runs every op in it (the
    device with the outputs, so the loss stays there), else the last (the CPU). Its tensors, labels included,
    pin their ops to that backend, as ggml-opt's own results do (patches/0002)."""
    ops_in_ctx, p = [], lib.ggml_get_first_tensor(ctx.ptr)
    while p != ffi.NULL:
        if p.op != lib.GGML_OP_NONE:
            ops_in_ctx.append(p)
        p = lib.ggml_get_next_tensor(ctx.ptr, p)
    for backend in sched.backends:
        if all(backend_runs(backend, t)[0] for t in ops_in_ctx):
            return backend
    return sched.backends[-1]

