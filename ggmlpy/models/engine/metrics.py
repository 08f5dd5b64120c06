"""The metrics of predictions, in float64 numpy: losses and accuracy for ``ggml_evaluate`` and validation
(``Tally``, from ``heads``' per-sample losses), the training steps' metrics, and Keras' metrics beyond them.

Each loss is the mean over samples of the per-sample loss (times its weight), element-wise losses averaging over
the output's elements too; probabilities are kept inside [1e-7, 1 - 1e-7] before a log.

Keras' metrics are streaming: a state that ``update`` adds a batch to and ``result`` reads, so an epoch of any
length is summed in constant memory (AUC keeps Keras' confusion counts at fixed thresholds, not the scores). The
formulas are Keras' (``keras.metrics``): thresholded metrics count ``prediction > threshold`` against ``label !=
0`` over every element of the output, AUC interpolates between ``num_thresholds`` thresholds (trapezoids for ROC,
Davis and Goadrich's interpolation for PR). Metrics are unweighted (Keras' ``metrics``; sample weights weigh the
loss only)."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.args import is_int, is_real
from ...errors import GgmlTypeError, GgmlValueError
from ...graph.objects import Tensor
from ...opt.tallies import Fold, TallyGraph
from . import device_metrics
from .heads import correct, HeadSpec, per_sample_loss, predictions


AUC_EPSILON = 1e-7  # Keras' thresholds start just below 0 and end just above 1


@dataclass(frozen=True)
class MetricSpec:
    """A metric requested in ``ggml_compile``: its log name, what it computes and its settings.
    ``needs``: the heads it applies to ("any", "classification" or "categorical")."""
    name: str
    kind: str
    needs: str = "any"
    threshold: float = 0.5
    k: int = 5
    num_thresholds: int = 200
    curve: str = "ROC"

    def state(self) -> MetricState:
        return MetricState(self)


# Keras' metric strings (keras.metrics.get) and the kinds they compute; the accuracy family is ggml-opt's own
_BY_NAME = {
    "mae": "mae", "mean_absolute_error": "mae", "mse": "mse", "mean_squared_error": "mse",
    "rmse": "rmse", "root_mean_squared_error": "rmse",
    "precision": "precision", "recall": "recall", "auc": "auc",
    "true_positives": "tp", "false_positives": "fp", "true_negatives": "tn", "false_negatives": "fn",
    "top_k_categorical_accuracy": "top_k", "sparse_top_k_categorical_accuracy": "top_k",
}
ACCURACY_NAMES = ("accuracy", "acc", "categorical_accuracy", "sparse_categorical_accuracy", "binary_accuracy")
_NEEDS = {"mae": "any", "mse": "any", "rmse": "any", "top_k": "categorical"}


def metric_spec(metric: Any) -> MetricSpec | None:
    """The spec of one entry of ``metrics=``: None for the accuracy family (reported by ggml-opt itself)."""
    if isinstance(metric, MetricSpec):
        return metric
    if isinstance(metric, dict):   # as saved with a model
        return spec_from_dict(metric)
    if not isinstance(metric, str):
        raise GgmlTypeError(f"a metric is a name such as 'auc' or a ggml_metric_*() object, got "
                            f"{type(metric).__name__}")
    name = metric.lower()
    if name in ACCURACY_NAMES:
        return None
    if name not in _BY_NAME:
        raise GgmlValueError(f"unknown metric {metric!r}; expected one of {', '.join(ACCURACY_NAMES)}, "
                             f"{', '.join(_BY_NAME)} or a ggml_metric_*() object")
    kind = _BY_NAME[name]
    return MetricSpec(name, kind, _NEEDS.get(kind, "classification"))


def _name(name: Any, default: str) -> str:
    if name is None:
        return default
    if not isinstance(name, str) or not name.isidentifier():
        raise GgmlValueError(f"a metric's name is the key it is logged under: an identifier such as 'auc_pr', "
                             f"got {name!r}")
    return name


def ggml_metric_auc(num_thresholds: int = 200, curve: str = "ROC", name: str | None = None) -> MetricSpec:
    """The area under the ROC or the precision-recall curve, as Keras' ``AUC``.

    Predictions (probabilities: a softmax or sigmoid output, or the softmax of a logits output) are
    compared with ``num_thresholds`` thresholds evenly spaced over [0, 1]; the true and false positives at
    each are summed over the epoch and the curve through them is integrated (trapezoids for ROC, Davis and
    Goadrich's interpolation for PR), so it streams in constant memory. Every element of the output counts
    as one yes/no prediction (Keras' ``multi_label=False``): for a softmax head, each class of each sample.

    Arguments:
        num_thresholds: thresholds (> 1); more thresholds approximate the exact area more closely.
        curve: ``"ROC"`` or ``"PR"``.
        name: the key it is logged under (default ``"auc"``).

    Value: a metric for ``ggml_compile(metrics=[...])``.

    Example:
        >>> g.ggml_compile(model, loss="binary_crossentropy", metrics=[g.ggml_metric_auc(curve="PR", name="auc_pr")])
    """
    if not is_int(num_thresholds) or isinstance(num_thresholds, bool) or not 1 < num_thresholds <= 100_000:
        raise GgmlValueError(f"ggml_metric_auc: num_thresholds must be an integer in (1, 100000], got "
                             f"{num_thresholds!r}")
    if not isinstance(curve, str) or curve.upper() not in ("ROC", "PR"):
        raise GgmlValueError(f"ggml_metric_auc: curve must be 'ROC' or 'PR', got {curve!r}")
    return MetricSpec(_name(name, "auc"), "auc", "classification", num_thresholds=int(num_thresholds),
                      curve=curve.upper())


def _thresholded(fn: str, kind: str, threshold: Any, name: Any) -> MetricSpec:
    if not is_real(threshold) or not 0 <= threshold <= 1:
        raise GgmlValueError(f"{fn}: threshold must be a number in [0, 1] (a probability), got {threshold!r}")
    return MetricSpec(_name(name, kind), kind, "classification", threshold=float(threshold))


def ggml_metric_precision(threshold: float = 0.5, name: str | None = None) -> MetricSpec:
    """Precision, as Keras' ``Precision``: true positives / predicted positives, where an element is
    predicted positive when its probability is above ``threshold`` and is positive when its label is not 0
    (every class of a softmax head counts); 0 when nothing was predicted positive.

    Arguments:
        threshold: a probability in [0, 1] (default 0.5); an element is predicted positive when its
            probability is strictly above it (Keras' rule). A logits head is compared after its sigmoid/softmax.
        name: the key it is logged under, an identifier (default ``"precision"``, as the string
            ``metrics=["precision"]``): ``train_<name>``/``val_<name>`` in the history, ``<name>`` in
            ``ggml_evaluate``, prefixed by the output's name (``<output>_<name>``) in a multi-output model.

    Value: a metric for ``ggml_compile(metrics=[...])``.

    Example:
        >>> g.ggml_compile(model, loss="binary_crossentropy", metrics=[g.ggml_metric_precision(0.8)])
    """
    return _thresholded("ggml_metric_precision", "precision", threshold, name)


def ggml_metric_recall(threshold: float = 0.5, name: str | None = None) -> MetricSpec:
    """Recall, as Keras' ``Recall``: true positives / positive labels (labels not 0), with
    ``ggml_metric_precision``'s threshold rule; 0 when no label was positive.

    Arguments:
        threshold: a probability in [0, 1] (default 0.5); an element is predicted positive when its
            probability is strictly above it (Keras' rule). A logits head is compared after its sigmoid/softmax.
        name: the key it is logged under, an identifier (default ``"recall"``, as the string
            ``metrics=["recall"]``): ``train_<name>``/``val_<name>`` in the history, ``<name>`` in
            ``ggml_evaluate``, prefixed by the output's name (``<output>_<name>``) in a multi-output model.

    Value: a metric for ``ggml_compile(metrics=[...])``.

    Example:
        >>> g.ggml_compile(model, loss="binary_crossentropy", metrics=["precision", g.ggml_metric_recall(0.3)])
    """
    return _thresholded("ggml_metric_recall", "recall", threshold, name)


def ggml_metric_top_k_accuracy(k: int = 5, name: str | None = None) -> MetricSpec:
    """The share of samples (of positions, for a sequence output) whose class is among the ``k`` highest
    predictions, as Keras' ``TopKCategoricalAccuracy`` (one-hot labels) and
    ``SparseTopKCategoricalAccuracy`` (class ids): both label forms work here. Cross-entropy heads only.

    Arguments:
        k: how many of the highest predictions count as a hit, an integer >= 1 (default 5, Keras'); a sample
            is a hit when fewer than ``k`` classes score strictly higher than its class (Keras' ``in_top_k``).
        name: the key it is logged under, an identifier (default ``"top_k_categorical_accuracy"``; the
            strings ``"top_k_categorical_accuracy"`` and ``"sparse_top_k_categorical_accuracy"`` give k=5
            under their own names): ``train_<name>``/``val_<name>`` in the history, ``<name>`` in
            ``ggml_evaluate``, ``<output>_<name>`` in a multi-output model.

    Value: a metric for ``ggml_compile(metrics=[...])``.

    Example:
        >>> g.ggml_compile(model, loss="sparse_categorical_crossentropy", metrics=[g.ggml_metric_top_k_accuracy(3)])
    """
    if not is_int(k) or isinstance(k, bool) or k < 1:
        raise GgmlValueError(f"ggml_metric_top_k_accuracy: k must be an integer >= 1, got {k!r}")
    return MetricSpec(_name(name, "top_k_categorical_accuracy"), "top_k", "categorical", k=int(k))


class HeadBatch:
    """One head's batch in the forms its metrics read, each made once whatever the number of metrics: the
    predictions as probabilities and as the model returns them, the labels, and (on first use) the flat float64
    probabilities, the positive labels and the errors."""

    def __init__(self, probs: np.ndarray, values: np.ndarray, labels: np.ndarray, classes: int) -> None:
        self.probs, self.values, self.labels, self.classes = probs, values, labels, classes
        self.finite = bool(np.isfinite(probs).all()) and (values is probs or bool(np.isfinite(values).all()))
        self._flat: np.ndarray | None = None
        self._positive: np.ndarray | None = None
        self._errors: np.ndarray | None = None

    @property
    def flat_probs(self) -> np.ndarray:
        if self._flat is None:
            self._flat = self.probs.astype(np.float64).ravel()
        return self._flat

    @property
    def positive(self) -> np.ndarray:
        if self._positive is None:
            self._positive = self.labels.ravel() != 0
        return self._positive

    def errors(self) -> np.ndarray:
        if self._errors is None:
            self._errors = self.values.astype(np.float64).ravel() - self.labels.astype(np.float64).ravel()
        return self._errors


@dataclass
class MetricState:
    """One metric's sums over the batches of an epoch."""
    spec: MetricSpec
    sums: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.reset()
        n = self.spec.num_thresholds
        self.thresholds = np.array([-AUC_EPSILON, *[(i + 1) / (n - 1) for i in range(n - 2)], 1 + AUC_EPSILON]) \
            if self.spec.kind == "auc" else None

    def reset(self) -> None:
        # auc: positives and negatives per bucket (bucket i: above thresholds[:i]); otherwise two running sums
        self.sums = np.zeros((2, self.spec.num_thresholds + 1) if self.spec.kind == "auc" else 2)
        self.nonfinite = False  # a NaN/inf prediction makes the epoch's value NaN (a diverged model is not "best")

    def update(self, probs: np.ndarray, values: np.ndarray, labels: np.ndarray, classes: int) -> None:
        """Add a batch: ``probs`` the predictions as probabilities, ``values`` as the model returns them,
        ``labels`` in the same layout (one-hot rows for a cross-entropy head), ``classes`` the last axis."""
        self.add(HeadBatch(probs, values, labels, classes))

    def add(self, b: HeadBatch) -> None:
        """Add a prepared batch (``HeadBatch``: shared by the metrics of one head)."""
        kind = self.spec.kind
        if not b.finite:
            self.nonfinite = True
            return
        if kind in ("mae", "mse", "rmse"):
            err = b.errors()
            self.sums += (np.abs(err).sum() if kind == "mae" else (err * err).sum(), err.size)
            return
        if kind == "top_k":
            p, t = b.probs.reshape(-1, b.classes), b.labels.reshape(-1, b.classes)
            target = t.argmax(axis=1)
            # in the top k: fewer than k classes score strictly higher than the target (Keras' in_top_k)
            higher = (p > p[np.arange(len(p)), target][:, None]).sum(axis=1)
            self.sums += ((higher < min(self.spec.k, b.classes)).sum(), len(p))
            return
        positive, p = b.positive, b.flat_probs
        if kind == "auc":
            assert self.thresholds is not None  # made for an AUC (__post_init__)
            bucket = np.searchsorted(self.thresholds, p, side="left")  # thresholds strictly below p
            size = self.spec.num_thresholds + 1
            self.sums[0] += np.bincount(bucket[positive], minlength=size)
            self.sums[1] += np.bincount(bucket[~positive], minlength=size)
            return
        predicted = p > self.spec.threshold
        if kind in ("tp", "precision", "recall"):
            tp = np.count_nonzero(predicted & positive)
            self.sums += (tp, 0 if kind == "tp" else np.count_nonzero(predicted if kind == "precision" else positive))
        else:
            hit = {"fp": predicted & ~positive, "tn": ~predicted & ~positive, "fn": ~predicted & positive}[kind]
            self.sums[0] += np.count_nonzero(hit)

    def result(self) -> float:
        kind = self.spec.kind
        if self.nonfinite:
            return float("nan")
        if kind == "auc":
            return self._auc()
        a, b = self.sums
        if kind in ("tp", "fp", "tn", "fn"):
            return float(a)
        if kind in ("precision", "recall"):
            return float(a / b) if b else 0.0
        if not b:
            return float("nan")
        return float(np.sqrt(a / b)) if kind == "rmse" else float(a / b)

    def _auc(self) -> float:
        pos, neg = self.sums
        # counts at each threshold: the elements in the buckets above it
        tp = pos[::-1].cumsum()[::-1][1:]
        fp = neg[::-1].cumsum()[::-1][1:]
        fn, tn = pos.sum() - tp, neg.sum() - fp
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.spec.curve == "ROC":
                tpr = np.where(tp + fn > 0, tp / (tp + fn), 0.0)
                fpr = np.where(fp + tn > 0, fp / (fp + tn), 0.0)
                return float(((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2).sum())
            # precision-recall: precision interpolated as tp = intercept + slope * p between thresholds
            p = tp + fp
            dtp, dp = tp[:-1] - tp[1:], p[:-1] - p[1:]
            slope = np.where(dp > 0, dtp / np.maximum(dp, 1e-300), 0.0)
            intercept = tp[1:] - slope * p[1:]
            both = (p[:-1] > 0) & (p[1:] > 0)
            ratio = np.where(both, p[:-1] / np.where(both, p[1:], 1.0), 1.0)
            area = slope * (dtp + intercept * np.log(ratio))
            positives = tp[1:] + fn[1:]
            return float(np.where(positives > 0, area / np.where(positives > 0, positives, 1.0), 0.0).sum())


def _applies(spec: MetricSpec, head: Any) -> bool:
    if spec.needs == "classification":   # a custom loss's outputs are taken as probabilities, as Keras takes them
        return head.classification or head.custom is not None
    return spec.needs != "categorical" or head.loss_type_name == "cross_entropy"


_SPEC_FACTORIES = {"auc": lambda d: ggml_metric_auc(d.get("num_thresholds", 200), d.get("curve", "ROC"), d["name"]),
                   "precision": lambda d: ggml_metric_precision(d.get("threshold", 0.5), d["name"]),
                   "recall": lambda d: ggml_metric_recall(d.get("threshold", 0.5), d["name"]),
                   "top_k": lambda d: ggml_metric_top_k_accuracy(d.get("k", 5), d["name"])}


def spec_from_dict(d: Any) -> MetricSpec:
    """A metric saved with a model (``spec_to_dict``), checked as ``ggml_metric_*()`` checks its arguments."""
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or d.get("kind") not in _BY_NAME.values():
        raise GgmlValueError(f"a saved metric is a dict with 'name' and 'kind', got {d!r}")
    if d["kind"] in _SPEC_FACTORIES:
        return _SPEC_FACTORIES[d["kind"]](d)
    return MetricSpec(_name(d["name"], d["kind"]), d["kind"], _NEEDS.get(d["kind"], "classification"),
                      threshold=_thresholded("a saved metric", d["kind"], d.get("threshold", 0.5), None).threshold)


def spec_to_dict(spec: MetricSpec) -> dict:
    return {"name": spec.name, "kind": spec.kind, "threshold": spec.threshold, "k": spec.k,
            "num_thresholds": spec.num_thresholds, "curve": spec.curve}


def resolve_metrics(metrics: Any, heads: list, output_names: list[str]) -> tuple[bool, list[list[MetricSpec]]]:
    """``ggml_compile``'s ``metrics=``: whether accuracy is reported, and each head's other metrics.

    The forms are Keras': a list of metrics for every output (each applies to the outputs it can: precision to
    classification heads, MAE to any), a list of lists in output order, or a dict {output name: metrics}
    naming some outputs. A metric that fits none of its outputs is an error, not a column of NaN."""
    if metrics is None:
        return False, [[] for _ in heads]
    if isinstance(metrics, dict):
        unknown = [k for k in metrics if k not in output_names]
        if unknown:
            raise GgmlValueError(f"metrics as a dict is keyed by the names of the model's output layers "
                                 f"{output_names}; got keys {unknown} that name no output")
        per_output = [metrics.get(name, []) for name in output_names]
    elif isinstance(metrics, (list, tuple)) and metrics and all(isinstance(m, (list, tuple)) for m in metrics):
        if len(metrics) != len(heads):
            raise GgmlValueError(f"metrics as a list of lists has one list per output: the model has {len(heads)} "
                                 f"outputs, got {len(metrics)} lists")
        per_output = list(metrics)
    elif isinstance(metrics, (str, MetricSpec, list, tuple)):
        per_output = None
    else:
        raise GgmlTypeError(f"metrics must be a list of names or ggml_metric_*() objects (or a dict by output name), "
                            f"got {type(metrics).__name__}")
    shared = [metrics] if isinstance(metrics, (str, MetricSpec)) else metrics
    lists = [shared] * len(heads) if per_output is None else \
        [[m] if isinstance(m, (str, MetricSpec)) else list(m) for m in per_output]
    accuracy, result = False, []
    for head, entries in zip(heads, lists):
        specs: list[MetricSpec] = []
        for entry in entries:
            spec = metric_spec(entry)
            if spec is None:
                accuracy = True
            elif spec.name in [s.name for s in specs]:
                raise GgmlValueError(f"two metrics of output '{head.name}' are logged as '{spec.name}'; give one "
                                     "another name (ggml_metric_*(..., name=))")
            elif _applies(spec, head):
                specs.append(spec)
            elif per_output is not None:
                raise GgmlValueError(_misfit(spec, [head]))
        result.append(specs)
    if per_output is None:
        for entry in shared:
            spec = metric_spec(entry)
            if spec is not None and not any(_applies(spec, h) for h in heads):
                raise GgmlValueError(_misfit(spec, heads))
    _check_log_names(heads, result)
    return accuracy, result


def _check_log_names(heads: list, specs: list[list[MetricSpec]]) -> None:
    """Each metric's log key is its own: not the loss's, the accuracy's or another output's metric's."""
    multi = len(heads) > 1
    taken = {"loss", "accuracy", "steps", "epoch", "lr", "learning_rate"} | \
        ({f"{h.name}_{k}" for h in heads for k in ("loss", "accuracy")} if multi else set())
    for head, head_specs in zip(heads, specs):
        for spec in head_specs:
            key = f"{head.name}_{spec.name}" if multi else spec.name
            if key in taken or spec.name.startswith(("train_", "val_")):
                raise GgmlValueError(f"metric '{spec.name}' of output '{head.name}' would be logged as '{key}', "
                                     "which another value of the fit already uses (or looks like: train_/val_ "
                                     "prefix the logged values); give it another name "
                                     "(ggml_metric_*(..., name=))")
            taken.add(key)


def _misfit(spec: MetricSpec, heads: list) -> str:
    what = "a classification loss (a cross-entropy) or a custom loss (its outputs taken as probabilities)" \
        if spec.needs == "classification" else \
        "a categorical cross-entropy (one class per sample)"
    losses = ", ".join(f"'{h.name}' ({h.loss})" for h in heads)
    return f"metric '{spec.name}' needs an output trained with {what}; {losses} is not"


class HeadMetrics:
    """The compiled metrics of every head (``CompileConfig.head_metrics``) summed over an epoch: ``update`` adds a
    batch of outputs read from the device, ``results`` gives them by log name (``<output>_<metric>`` for a
    multi-output model). ``device``: the training steps sum them on the device instead (``device_stats``, see
    ``device_metrics``). Thread-safe: data-parallel replicas add their shards of a step at once."""

    def __init__(self, heads: list[HeadSpec], specs: list[list[MetricSpec]], graph_outputs: bool = False,
                 device: bool = False) -> None:
        self.heads, self.graph_outputs, self.device = heads, graph_outputs, device
        self.states = [[spec.state() for spec in head_specs] for head_specs in specs]
        multi = len(heads) > 1
        self.names = [f"{h.name}_{st.spec.name}" if multi else st.spec.name
                      for h, states in zip(heads, self.states) for st in states]
        self.lock = threading.Lock()
        self.generation = 0   # counts the resets: sums kept on a device restart with it

    def reset(self) -> None:
        with self.lock:
            for states in self.states:
                for st in states:
                    st.reset()
            self.generation += 1

    def update(self, outs: list[np.ndarray], labels: list[np.ndarray]) -> None:
        with self.lock:
            for h, states, out, y in zip(self.heads, self.states, outs, labels):
                if states:
                    values, probs = predictions(h, out, self.graph_outputs)
                    batch = HeadBatch(probs, values, y, h.shape[-1])
                    for st in states:
                        st.add(batch)

    def device_stats(self, g: TallyGraph, outputs: Sequence[Tensor],
                     labels: Sequence[Tensor | None]) -> tuple[list[Tensor], Fold] | None:
        """The statistics a training step adds on the device (``opt.tallies.TallySource``), or None where they are
        read from the outputs on the host (``device`` False)."""
        return device_metrics.build(self.heads, self.states, self.lock, g, outputs, labels) if self.device else None

    def graph_nodes(self) -> int:
        """A bound on the nodes the statistics add to a training graph summed on the device (0 on the host)."""
        return device_metrics.graph_nodes(self.states) if self.device else 0

    def device_fits(self, batch: int, shapes: Sequence[tuple[int, ...]]) -> bool:
        """Whether the metrics of a ``batch``-sample step fit ``device_metrics.BUDGET_BYTES`` on the device, with
        outputs of ``shapes`` (one sample's, per head)."""
        return all(device_metrics.device_bytes(h, states, batch, shape) <= device_metrics.BUDGET_BYTES
                   for h, states, shape in zip(self.heads, self.states, shapes) if states)

    def results(self) -> dict[str, float]:
        values = [st.result() for states in self.states for st in states]
        return dict(zip(self.names, values))


class Tally:
    """Sums over batches of the per-head losses, correct counts and compiled metrics, and their means."""

    def __init__(self, heads: list[HeadSpec], metrics: list[list[MetricSpec]] | None = None,
                 penalty: float = 0.0) -> None:
        self.heads = heads
        self.penalty = penalty  # the regularizers' penalty of the weights evaluated (added to the total, as Keras)
        self.loss = np.zeros(len(heads))
        self.correct = np.zeros(len(heads))
        self.predictions = np.zeros(len(heads))   # what ``correct`` counts among (positions, values)
        self.n = 0
        self.metrics = HeadMetrics(heads, metrics or [[] for _ in heads])

    def add(self, outs: list[np.ndarray], ys: list[np.ndarray], w: np.ndarray | None = None) -> None:
        for i, (h, o, y) in enumerate(zip(self.heads, outs, ys)):
            losses = per_sample_loss(h, o, y)
            self.loss[i] += float((losses if w is None else losses * w).sum())
            c = correct(h, o, y)
            if c is not None:
                self.correct[i] += float(c.sum())
                self.predictions[i] += c.size
        self.metrics.update(outs, ys)
        self.n += outs[0].shape[0]

    def head_losses(self) -> list[float]:
        return list(self.loss / self.n) if self.n else [float("nan")] * len(self.heads)

    def head_accuracies(self) -> list[float]:
        return [self.correct[i] / self.predictions[i] if self.predictions[i] and h.classification else float("nan")
                for i, h in enumerate(self.heads)]

    def total_loss(self) -> float:
        return float(sum(h.weight * head_loss for h, head_loss in zip(self.heads, self.head_losses())) + self.penalty)

    def accuracy(self) -> float:
        acc = [a for a in self.head_accuracies() if not np.isnan(a)]
        return float(np.mean(acc)) if acc else float("nan")
