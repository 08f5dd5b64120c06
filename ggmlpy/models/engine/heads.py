"""A model output and its loss (``HeadSpec``), and what the host computes from a head's predictions: each sample's
loss and correctness (``ggml_evaluate``, validation) and the predictions as probabilities (the metrics').

The losses' definitions are those the training graph optimises (``ggmlpy/opt/losses.py``), in float64 numpy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...opt import losses as L
from ...opt.custom_loss import CustomLoss, evaluate_custom_loss


EPS = 1e-7
HUBER_DELTA = 1.0


@dataclass
class HeadSpec:
    """One model output and its loss."""
    name: str            # the output layer's name
    loss: str            # canonical loss name
    loss_type: int       # ggml-opt / ggmlpy loss type used in training (a custom loss: CustomLoss, with its fn)
    sparse: bool         # labels are class ids (made one-hot before they reach ggml)
    from_logits: bool    # cross-entropy on the raw outputs (no softmax/sigmoid at the end of the model)
    fused: bool          # the final softmax is left out of the training graph: ggml's loss applies it
    shape: tuple         # one sample's output shape
    weight: float = 1.0
    default_loss: bool = False   # ggml_compile was given no loss: its default (errors about labels say so)

    @property
    def custom(self) -> Any:
        """The custom loss (``CustomLoss``: its function and name), or None."""
        return self.loss_type if isinstance(self.loss_type, CustomLoss) else None

    @property
    def loss_type_name(self) -> str:
        return L.LOSS_NAMES[self.loss_type]

    @property
    def token_level(self) -> bool:
        """A cross-entropy over every position of a sequence output (steps, classes): one distribution per
        position, trained as ``steps`` rows of classes (per-token loss and accuracy, as Keras)."""
        return self.loss_type == L.LOSS_CROSS_ENTROPY and len(self.shape) > 1

    @property
    def classification(self) -> bool:
        return self.loss_type == L.LOSS_CROSS_ENTROPY or self.loss_type in L.BINARY_LOSSES


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
    """0/1 correctness of each prediction of a classification head (None for another head): each position's class
    (a cross-entropy: one per sample, or per step of a sequence) or each value's side of the threshold (a binary
    cross-entropy). Accuracy is their mean over every prediction, as Keras' accuracy metrics average them (so
    sequences of different lengths weigh by their steps)."""
    if h.loss_type_name == "cross_entropy":
        o, t = out.reshape(-1, h.shape[-1]), y.reshape(-1, h.shape[-1])
        return o.argmax(axis=1) == t.argmax(axis=1)
    if h.loss_type_name in ("binary_cross_entropy", "binary_cross_entropy_logits"):
        threshold = 0.0 if h.loss_type_name == "binary_cross_entropy_logits" else 0.5  # a logit of 0 is p = 0.5
        return (out.reshape(-1) > threshold) == (y.reshape(-1) > 0.5)
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
