"""Losses, accuracy and the compiled metrics of predictions, in float64 numpy, for ``ggml_evaluate``,
validation and the training steps' metrics.

The definitions are those the training graph optimises (``ggmlpy/losses.py``): each loss is the
mean over samples of the per-sample loss (times its weight), element-wise losses averaging over
the output's elements too; probabilities are kept inside [1e-7, 1 - 1e-7] before a log.
"""
from __future__ import annotations

import threading

import numpy as np

from ..opt.custom_loss import evaluate_custom_loss
from .compile import HeadSpec
from .keras_metrics import HeadBatch, MetricSpec


EPS = 1e-7
HUBER_DELTA = 1.0


def per_sample_loss(h: HeadSpec, out: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The loss of each sample, shape (N,). ``out`` is what ``ggml_predict`` returns."""
    if h.custom is not None:  # its own function, on the CPU
        return evaluate_custom_loss(h.custom, out, y)
    n = out.shape[0]
    o: np.ndarray = out.reshape(n, -1).astype(np.float64)  # [n, values], or [n, rows, units] below
    t: np.ndarray = y.reshape(n, -1).astype(np.float64)
    if h.loss_type_name == "cross_entropy":   # per position of a sequence output, then their mean
        o, t = o.reshape(n, -1, h.shape[-1]), t.reshape(n, -1, h.shape[-1])
        if h.from_logits:
            z = o - o.max(axis=2, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=2, keepdims=True))
        else:
            logp = np.log(np.clip(o, EPS, 1.0))
        return -(t * logp).sum(axis=2).mean(axis=1)
    if h.loss_type_name == "binary_cross_entropy_logits":  # Keras' stable form on logits
        return (np.maximum(o, 0) - o * t + np.log1p(np.exp(-np.abs(o)))).mean(axis=1)
    if h.loss_type_name == "binary_cross_entropy":
        p = o * (1 - 2 * EPS) + EPS
        q = (1 - o) * (1 - 2 * EPS) + EPS
        with np.errstate(invalid="ignore", divide="ignore"):  # outputs outside [0, 1] (no sigmoid): NaN, as trained
            return -(t * np.log(p) + (1 - t) * np.log(q)).mean(axis=1)
    if h.loss_type_name == "kl_divergence":  # per row (last axis), then the mean over a sample's rows
        units = h.shape[-1]
        o, t = o.reshape(n, -1, units), t.reshape(n, -1, units)
        p, yq = o * (1 - 2 * EPS) + EPS, t * (1 - 2 * EPS) + EPS
        with np.errstate(invalid="ignore", divide="ignore"):  # outputs outside [0, 1]: NaN, as trained
            return (t * (np.log(yq) - np.log(p))).sum(axis=2).mean(axis=1)
    if h.loss_type_name == "cosine_similarity":   # per row (last axis), then the mean over a sample's rows
        units = h.shape[-1]
        o, t = o.reshape(n, -1, units), t.reshape(n, -1, units)
        on = o / np.sqrt((o * o).sum(axis=2, keepdims=True) + 1e-12)
        tn = t / np.sqrt((t * t).sum(axis=2, keepdims=True) + 1e-12)
        return -(on * tn).sum(axis=2).mean(axis=1)
    if h.loss_type_name in ("hinge", "squared_hinge"):
        margin = np.maximum(1 - t * o, 0)
        return (margin if h.loss_type_name == "hinge" else margin * margin).mean(axis=1)
    err = o - t
    if h.loss_type_name == "mae":
        return np.abs(err).mean(axis=1)
    if h.loss_type_name == "huber":
        a = np.abs(err)
        c = np.minimum(a, HUBER_DELTA)
        return (0.5 * c * c + HUBER_DELTA * (a - c)).mean(axis=1)
    return (err * err).mean(axis=1)


def correct(h: HeadSpec, out: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Per-sample 0/1 correctness for classification heads, None otherwise."""
    n = out.shape[0]
    if h.loss_type_name == "cross_entropy":   # the share of a sample's positions classified right
        o, t = out.reshape(n, -1, h.shape[-1]), y.reshape(n, -1, h.shape[-1])
        return (o.argmax(axis=2) == t.argmax(axis=2)).mean(axis=1)
    if h.loss_type_name in ("binary_cross_entropy", "binary_cross_entropy_logits"):
        threshold = 0.0 if h.loss_type_name == "binary_cross_entropy_logits" else 0.5  # a logit of 0 is p = 0.5
        return ((out.reshape(n, -1) > threshold) == (y.reshape(n, -1) > 0.5)).mean(axis=1)
    return None


def softmax_rows(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    z = rows - rows.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def predictions(h: HeadSpec, out: np.ndarray, graph_output: bool) -> tuple[np.ndarray, np.ndarray]:
    """A head's outputs as ``ggml_predict`` returns them and as probabilities, the two forms metrics read.
    ``graph_output``: ``out`` comes from a training graph, which leaves a final softmax to the fused loss."""
    if h.fused and graph_output:
        probs = softmax_rows(out.reshape(-1, h.shape[-1]))
        return probs, probs
    if h.loss_type_name == "binary_cross_entropy_logits":
        return out, 1.0 / (1.0 + np.exp(-out.astype(np.float64)))
    if h.from_logits:
        return out, softmax_rows(out.reshape(-1, h.shape[-1]))
    return out, out


class HeadMetrics:
    """The compiled metrics of every head (``CompileConfig.head_metrics``) summed over an epoch: ``update`` adds a
    batch, ``results`` gives them by log name (``<output>_<metric>`` for a multi-output model). Thread-safe:
    data-parallel replicas add their shards of a step at once."""

    def __init__(self, heads: list[HeadSpec], specs: list[list[MetricSpec]], graph_outputs: bool = False) -> None:
        self.heads, self.graph_outputs = heads, graph_outputs
        self.states = [[spec.state() for spec in head_specs] for head_specs in specs]
        multi = len(heads) > 1
        self.names = [f"{h.name}_{st.spec.name}" if multi else st.spec.name
                      for h, states in zip(heads, self.states) for st in states]
        self._lock = threading.Lock()

    def reset(self) -> None:
        for states in self.states:
            for st in states:
                st.reset()

    def update(self, outs: list[np.ndarray], labels: list[np.ndarray]) -> None:
        with self._lock:
            for h, states, out, y in zip(self.heads, self.states, outs, labels):
                if states:
                    values, probs = predictions(h, out, self.graph_outputs)
                    batch = HeadBatch(probs, values, y, h.shape[-1])
                    for st in states:
                        st.add(batch)

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
        self.n = 0
        self.metrics = HeadMetrics(heads, metrics or [[] for _ in heads])

    def add(self, outs: list[np.ndarray], ys: list[np.ndarray], w: np.ndarray | None = None) -> None:
        for i, (h, o, y) in enumerate(zip(self.heads, outs, ys)):
            losses = per_sample_loss(h, o, y)
            self.loss[i] += float((losses if w is None else losses * w).sum())
            c = correct(h, o, y)
            if c is not None:
                self.correct[i] += float(c.sum())
        self.metrics.update(outs, ys)
        self.n += outs[0].shape[0]

    def head_losses(self) -> list[float]:
        return list(self.loss / self.n) if self.n else [float("nan")] * len(self.heads)

    def head_accuracies(self) -> list[float]:
        return [self.correct[i] / self.n if self.n and h.classification else float("nan")
                for i, h in enumerate(self.heads)]

    def total_loss(self) -> float:
        return float(sum(h.weight * head_loss for h, head_loss in zip(self.heads, self.head_losses())) + self.penalty)

    def accuracy(self) -> float:
        acc = [a for a in self.head_accuracies() if not np.isnan(a)]
        return float(np.mean(acc)) if acc else float("nan")
