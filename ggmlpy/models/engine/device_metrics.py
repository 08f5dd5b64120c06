"""The compiled metrics of the training steps computed in the training graph: each step's sums (absolute and squared
errors, counts of predictions above a threshold, top-k hits, AUC's counts per threshold) summed on the device
(``opt.tallies``) and folded into each ``MetricState``'s float64 sums once per epoch, instead of each step's outputs
read back and counted on the host.

The formulas are those of ``MetricState.add`` (Keras'), on the same predictions: the probabilities are the softmax
(or sigmoid) of a head's outputs as ``metrics.predictions`` makes them, here in F32 on the device. Counts are exact
(F32 integers below 2**24: ``DeviceTally`` reads them before), error sums agree with float64 to F32's rounding (errors
whose squares pass F32's range, about 1.8e19, give inf, as in Keras' F32 metrics, where float64 gives their value), and
a NaN or infinite prediction makes the epoch's values NaN, as on the host. Where a metric's intermediate tensors
would take more device memory than ``BUDGET_BYTES`` (an AUC over a large output, top-k over many classes), the fit
reads the outputs every step as before (``device_bytes``).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, TYPE_CHECKING

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


class _Spec(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def threshold(self) -> float: ...
    @property
    def k(self) -> int: ...
    @property
    def num_thresholds(self) -> int: ...


class MetricState(Protocol):
    """What the device's sums are folded into (``metrics.MetricState``): its spec, its float64 sums, whether a
    prediction was not finite, and an AUC's thresholds."""
    sums: np.ndarray
    nonfinite: bool
    thresholds: np.ndarray | None

    @property
    def spec(self) -> _Spec: ...


BUDGET_BYTES = 64 << 20   # device memory the metrics of one head may take for their intermediate tensors


def device_bytes(h: HeadSpec, states: Sequence[MetricState], batch: int, shape: tuple[int, ...]) -> int:
    """The device memory a head's metrics take for a batch of ``batch`` samples of ``shape`` (the head's, its
    variable sizes fixed by the data: their largest tensors)."""
    elements = batch * math.prod(shape)
    total = 0
    for st in states:
        if st.spec.kind == "auc":      # predictions against every threshold: four [elements, thresholds] tensors
            total += 4 * 4 * elements * st.spec.num_thresholds
        elif st.spec.kind == "top_k":  # an identity matrix the labels' classes pick rows of
            total += 4 * h.shape[-1] ** 2 + 4 * 4 * elements
        else:
            total += 4 * 4 * elements
    return total


def graph_nodes(head_states: Sequence[Sequence[MetricState]]) -> int:
    """A bound on the nodes and leafs the statistics of these metrics add to a training graph (for its scheduler's
    size): per head its predictions and finite check, per metric its statistics (an AUC's, the most: a dozen), and
    the accumulator's concatenation, add and copy."""
    heads = sum(1 for states in head_states if states)
    metrics = sum(len(states) for states in head_states)
    return 12 * heads + 24 * metrics + 8


def build(heads: Sequence[HeadSpec], head_states: Sequence[Sequence[MetricState]], lock: AbstractContextManager,
          g: TallyGraph, outputs: Sequence[Tensor], labels: Sequence[Tensor | None]) -> tuple[list[Tensor], Fold]:
    """The statistics of one step of the metrics of each head (``head_states``), in ``g``, and the fold of their
    sums into those states (under ``lock``). ``outputs``/``labels``: the training graph's heads (the outputs before a
    softmax the loss fuses)."""
    tensors: list[Tensor] = []
    plan: list[tuple[list[int], list[tuple[MetricState, list[int]]], int, int]] = []
    for h, states, out, y in zip(heads, head_states, outputs, labels):
        if not states:
            continue
        assert y is not None  # metrics apply to labelled heads (resolve_metrics)
        head = _HeadStats(g, tensors, h, out, y)
        plan.append((head.check(), [(st, head.of(st)) for st in states], out.nelements(),
                     out.nelements() // h.shape[-1]))

    def fold(values: list[np.ndarray], steps: int) -> None:
        def gather(idx: list[int]) -> np.ndarray:
            return np.concatenate([values[i] for i in idx])
        with lock:
            for check, parts, elements, rows in plan:
                finite = bool(np.isfinite(gather(check)).all())
                for st, idx in parts:
                    if not finite:
                        st.nonfinite = True
                    else:
                        _fold_one(st, gather(idx), steps * elements, steps * rows)
    return tensors, fold


class _HeadStats:
    """One head's statistics, appended to ``tensors`` as they are asked for, each built once (metrics sharing a
    threshold share its counts); the methods give their indices."""

    def __init__(self, g: TallyGraph, tensors: list[Tensor], h: HeadSpec, out: Tensor, y: Tensor) -> None:
        self.g, self.ctx, self.tensors = g, g.ctx, tensors
        self._index: dict[tuple, int] = {}
        self._above: dict[float, Tensor] = {}
        ctx = g.ctx
        self.classes = classes = h.shape[-1]
        rows = out.nelements() // classes
        # the outputs are copied first: a view of them here would need their memory now (the scheduler's, later)
        o = ggml_reshape_2d(ctx, ggml_cont(ctx, out), classes, rows)
        self.labels = ggml_reshape_2d(ctx, y if ggml_is_contiguous(y) else ggml_cont(ctx, y), classes, rows)
        # the predictions as the model returns them (values) and as probabilities (probs): heads.predictions
        self.values = self.probs = o
        if h.fused:
            self.values = self.probs = ggml_soft_max(ctx, o)
        elif h.loss_type_name == "binary_cross_entropy_logits":
            self.probs = ggml_sigmoid(ctx, o)
        elif h.from_logits:
            self.probs = ggml_soft_max(ctx, o)

    @functools.cached_property
    def positive(self) -> Tensor:
        """1 where a label is not 0 (positive), else 0."""
        return ggml_step(self.ctx, ggml_abs(self.ctx, self.labels))

    def _stat(self, key: tuple, build: Callable[..., Tensor], *args: object) -> int:
        if key not in self._index:
            self._index[key] = len(self.tensors)
            self.tensors.append(build(*args))
        return self._index[key]

    def check(self) -> list[int]:
        """0 unless a prediction is NaN or infinite (inf * 0 and NaN * 0 are NaN)."""
        xs = [self.probs] if self.values is self.probs else [self.probs, self.values]
        return [self._stat(("check", i), lambda x: ggml_sum(self.ctx, ggml_scale(self.ctx, x, 0.0)), x)
                for i, x in enumerate(xs)]

    def of(self, st: MetricState) -> list[int]:
        """The statistics of one metric, in ``_fold_one``'s order."""
        ctx, spec = self.ctx, st.spec
        if spec.kind in ("mae", "mse", "rmse"):
            square = spec.kind != "mae"
            return [self._stat(("error", square), lambda sq: ggml_sum(ctx, (ggml_sqr if sq else ggml_abs)(
                ctx, ggml_sub(ctx, self.values, self.labels))), square)]
        if spec.kind == "top_k":
            k = min(spec.k, self.classes)
            return [self._stat(("top", k), _top_k_hits, self.g, self.probs, self.labels, k)]
        positives = self._stat(("positives",), ggml_sum, ctx, self.positive)
        if spec.kind == "auc":
            assert st.thresholds is not None  # an AUC's state has them
            return [self._stat(("auc", spec.num_thresholds), _auc_counts, self.g, self.probs, self.positive,
                               st.thresholds), positives]
        above = self._above.get(spec.threshold)
        if above is None:
            above = self._above[spec.threshold] = ggml_step(ctx, ggml_scale_bias(ctx, self.probs, 1.0,
                                                                                 -spec.threshold))
        return [self._stat(("tp", spec.threshold), lambda a: ggml_sum(ctx, ggml_mul(ctx, a, self.positive)), above),
                self._stat(("predicted", spec.threshold), ggml_sum, ctx, above), positives]


def _top_k_hits(g: TallyGraph, probs: Tensor, labels: Tensor, k: int) -> Tensor:
    """The rows whose labelled class (the labels' argmax) has fewer than ``k`` classes scoring strictly higher."""
    ctx = g.ctx
    classes = probs.shape[0]
    onehot = ggml_get_rows(ctx, g.constant(np.eye(classes, dtype=np.float32)), ggml_argmax(ctx, labels))
    target = ggml_sum_rows(ctx, ggml_mul(ctx, probs, onehot))          # [1, rows]: the labelled class's score
    higher = ggml_sum_rows(ctx, ggml_step(ctx, ggml_sub(ctx, probs, target)))
    return ggml_sum(ctx, ggml_step(ctx, ggml_scale_bias(ctx, higher, -1.0, float(k))))   # k - higher > 0


def _auc_counts(g: TallyGraph, probs: Tensor, positive: Tensor, thresholds: np.ndarray) -> Tensor:
    """For each threshold, the predictions above it and the positive ones among them: ``[above (n), positive
    above (n)]``."""
    ctx = g.ctx
    n, elements = len(thresholds), probs.nelements()
    p = ggml_reshape_2d(ctx, probs, elements, 1)
    pos = ggml_reshape_2d(ctx, positive, elements, 1)
    above = ggml_step(ctx, ggml_sub(ctx, ggml_repeat(ctx, p, g.shape((elements, n))),
                                    g.constant(thresholds.reshape(n, 1))))            # [elements, n]
    counts = ggml_reshape_1d(ctx, ggml_sum_rows(ctx, above), n)
    counts_pos = ggml_reshape_1d(ctx, ggml_sum_rows(ctx, ggml_mul(ctx, above, pos)), n)
    return ggml_concat(ctx, counts, counts_pos, 0)


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
