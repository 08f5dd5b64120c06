"""The compiled metrics of the training steps computed in the training graph: each step's sums (absolute and squared
errors, counts of predictions above a threshold, top-k hits, AUC's counts per threshold) summed on the device
(``opt.tallies``) and folded into each ``MetricState``'s float64 sums once per epoch, instead of each step's outputs
read back and counted on the host.

The formulas are those of ``MetricState.add`` (Keras'), on the same predictions: the probabilities are the softmax
(or sigmoid) of a head's outputs as ``metrics.predictions`` makes them, here in F32 on the device. Counts are exact
(F32 integers below 2**24: ``DeviceTally`` reads them before), error sums agree with float64 to F32's rounding, and a
NaN or infinite prediction makes the epoch's values NaN, as on the host. Where a metric's intermediate tensors
would take more device memory than ``BUDGET_BYTES`` (an AUC over a large output, top-k over many classes), the fit
reads the outputs every step as before (``device_bytes``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...graph.introspect import ggml_is_contiguous
from ...graph.objects import Tensor
from ...ops.elementwise import (
    ggml_abs,
    ggml_cont,
    ggml_mul,
    ggml_scale,
    ggml_scale_bias,
    ggml_sigmoid,
    ggml_soft_max,
    ggml_sqr,
    ggml_step,
    ggml_sub,
)
from ...ops.layout import ggml_get_rows, ggml_reshape_1d, ggml_reshape_2d
from ...ops.reduce import ggml_argmax, ggml_concat, ggml_repeat, ggml_sum, ggml_sum_rows
from ...opt.tallies import Fold, TallyGraph


if TYPE_CHECKING:
    from .heads import HeadSpec
    from .metrics import HeadMetrics, MetricState


BUDGET_BYTES = 64 << 20   # device memory the metrics of one head may take for their intermediate tensors


def device_bytes(h: HeadSpec, states: Sequence[MetricState], batch: int) -> int:
    """The device memory a head's metrics take for a batch of ``batch`` samples (their largest tensors)."""
    elements = batch * math.prod(h.shape)
    total = 0
    for st in states:
        if st.spec.kind == "auc":      # predictions against every threshold: four [elements, thresholds] tensors
            total += 4 * 4 * elements * st.spec.num_thresholds
        elif st.spec.kind == "top_k":  # an identity matrix the labels' classes pick rows of
            total += 4 * h.shape[-1] ** 2 + 4 * 4 * elements
        else:
            total += 4 * 4 * elements
    return total


def build(metrics: HeadMetrics, g: TallyGraph, outputs: Sequence[Tensor],
          labels: Sequence[Tensor | None]) -> tuple[list[Tensor], Fold]:
    """The statistics of one step of every head's metrics, in ``g``, and the fold of their sums into the metrics'
    states. ``outputs``/``labels``: the training graph's heads (the outputs before a softmax the loss fuses)."""
    stats: list[Tensor] = []
    plan: list[tuple[list[MetricState], int, int]] = []   # per head: its states, elements, rows
    for h, states, out, y in zip(metrics.heads, metrics.states, outputs, labels):
        if not states:
            continue
        assert y is not None  # metrics apply to labelled heads (resolve_metrics)
        head_stats = _head_stats(g, h, states, out, y)
        stats += head_stats
        plan.append((states, out.nelements(), out.nelements() // h.shape[-1]))

    def fold(values: list[np.ndarray], steps: int) -> None:
        with metrics.lock:
            it = iter(values)
            for states, elements, rows in plan:
                finite = bool(np.isfinite(next(it)).all())
                for st in states:
                    v = next(it)
                    if not finite:
                        st.nonfinite = True
                    else:
                        _fold_one(st, v, steps * elements, steps * rows)
    return stats, fold


def _head_stats(g: TallyGraph, h: HeadSpec, states: Sequence[MetricState], out: Tensor, y: Tensor) -> list[Tensor]:
    """A head's finite check (0 unless a prediction is NaN or infinite) and each metric's statistics."""
    ctx = g.ctx
    classes = h.shape[-1]
    rows = out.nelements() // classes
    # the outputs are copied first: a view of them here would need their memory now (the scheduler's, later)
    o = ggml_reshape_2d(ctx, ggml_cont(ctx, out), classes, rows)
    t = ggml_reshape_2d(ctx, y if ggml_is_contiguous(y) else ggml_cont(ctx, y), classes, rows)
    # the predictions as the model returns them (values) and as probabilities (probs): metrics.predictions
    values = probs = o
    if h.fused:
        values = probs = ggml_soft_max(ctx, o)
    elif h.loss_type_name == "binary_cross_entropy_logits":
        probs = ggml_sigmoid(ctx, o)
    elif h.from_logits:
        probs = ggml_soft_max(ctx, o)
    check = ggml_sum(ctx, ggml_scale(ctx, probs, 0.0))   # inf * 0 and NaN * 0 are NaN
    if values is not probs:
        check = ggml_concat(ctx, check, ggml_sum(ctx, ggml_scale(ctx, values, 0.0)), 0)
    out_stats = [check]
    positive = None
    for st in states:
        kind = st.spec.kind
        if kind in ("mae", "mse", "rmse"):
            err = ggml_sub(ctx, values, t)
            out_stats.append(ggml_sum(ctx, ggml_abs(ctx, err) if kind == "mae" else ggml_sqr(ctx, err)))
            continue
        if kind == "top_k":
            out_stats.append(_top_k_hits(g, probs, t, min(st.spec.k, classes)))
            continue
        if positive is None:
            positive = ggml_step(ctx, ggml_abs(ctx, t))   # a label not 0 is positive
        if kind == "auc":
            assert st.thresholds is not None  # an AUC's state has them
            out_stats.append(_auc_counts(g, probs, positive, st.thresholds))
        else:
            predicted = ggml_step(ctx, ggml_scale_bias(ctx, probs, 1.0, -st.spec.threshold))
            tp = ggml_sum(ctx, ggml_mul(ctx, predicted, positive))
            out_stats.append(_stack(g, [tp, ggml_sum(ctx, predicted), ggml_sum(ctx, positive)]))
    return out_stats


def _stack(g: TallyGraph, scalars: list[Tensor]) -> Tensor:
    out = scalars[0]
    for s in scalars[1:]:
        out = ggml_concat(g.ctx, out, s, 0)
    return out


def _top_k_hits(g: TallyGraph, probs: Tensor, labels: Tensor, k: int) -> Tensor:
    """The rows whose labelled class (the labels' argmax) has fewer than ``k`` classes scoring strictly higher."""
    ctx = g.ctx
    classes = probs.shape[0]
    onehot = ggml_get_rows(ctx, g.constant(np.eye(classes, dtype=np.float32)), ggml_argmax(ctx, labels))
    target = ggml_sum_rows(ctx, ggml_mul(ctx, probs, onehot))          # [1, rows]: the labelled class's score
    higher = ggml_sum_rows(ctx, ggml_step(ctx, ggml_sub(ctx, probs, target)))
    return ggml_sum(ctx, ggml_step(ctx, ggml_scale_bias(ctx, higher, -1.0, float(k))))   # k - higher > 0


def _auc_counts(g: TallyGraph, probs: Tensor, positive: Tensor, thresholds: np.ndarray) -> Tensor:
    """For each threshold, the predictions above it and the positive ones among them, then the positives:
    ``[above (n), positive above (n), positives]``."""
    ctx = g.ctx
    n, elements = len(thresholds), probs.nelements()
    p = ggml_reshape_2d(ctx, probs, elements, 1)
    pos = ggml_reshape_2d(ctx, positive, elements, 1)
    above = ggml_step(ctx, ggml_sub(ctx, ggml_repeat(ctx, p, g.shape((elements, n))),
                                    g.constant(thresholds.reshape(n, 1))))            # [elements, n]
    counts = ggml_reshape_1d(ctx, ggml_sum_rows(ctx, above), n)
    counts_pos = ggml_reshape_1d(ctx, ggml_sum_rows(ctx, ggml_mul(ctx, above, pos)), n)
    return ggml_concat(ctx, ggml_concat(ctx, counts, counts_pos, 0), ggml_sum(ctx, positive), 0)


def _fold_one(st: MetricState, v: np.ndarray, elements: float, rows: float) -> None:
    """Add one metric's device sums over some steps (``elements``/``rows``: the outputs' over those steps)."""
    kind = st.spec.kind
    if kind in ("mae", "mse", "rmse"):
        st.sums += (v[0], elements)
    elif kind == "top_k":
        st.sums += (v[0], rows)
    elif kind == "auc":
        n = st.spec.num_thresholds
        counts, counts_pos, positives = v[:n], v[n:2 * n], v[2 * n]
        # bucket b: the elements above exactly b thresholds (MetricState's layout)
        st.sums[0] += -np.diff(np.concatenate([[positives], counts_pos, [0.0]]))
        st.sums[1] += -np.diff(np.concatenate([[elements - positives], counts - counts_pos, [0.0]]))
    else:
        tp, predicted, positives = v
        if kind in ("tp", "precision", "recall"):
            st.sums += (tp, 0.0 if kind == "tp" else predicted if kind == "precision" else positives)
        else:
            st.sums[0] += {"fp": predicted - tp, "fn": positives - tp,
                           "tn": elements - predicted - positives + tp}[kind]
