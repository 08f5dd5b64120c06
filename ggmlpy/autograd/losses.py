"""The losses of ggmlR's autograd engine: ``ag_mse_loss``, ``ag_cross_entropy_loss`` (probabilities) and
``ag_softmax_cross_entropy_loss`` (logits, ggml's fused loss). Each is a lazy 0-d AgTensor; targets get no gradient.
"""
from __future__ import annotations

import numpy as np

from ..errors import GgmlValueError
from ..ops.elementwise import ggml_sqr
from ..ops.linalg import ggml_cross_entropy_loss
from .lazy import Op
from .ops import ag_clamp, ag_log, ag_mean, ag_mul, ag_scale, ag_sub, ag_sum, floating, operand, tensor_arg
from .tensor import AgTensor, result


__all__ = ["ag_mse_loss", "ag_cross_entropy_loss", "ag_softmax_cross_entropy_loss"]


def _pair(pred: AgTensor, target: object, fn: str) -> tuple[AgTensor, AgTensor]:
    """The predictions (floating) and the targets of their shape (data: no gradient)."""
    pred = floating(tensor_arg(pred, fn, "pred"), fn, "pred")
    t = _target(target, pred, fn)
    if t.shape != pred.shape:
        raise GgmlValueError(f"{fn}: target {t.shape} must have pred's shape {pred.shape}")
    return pred, t


def _target(target: object, pred: AgTensor, fn: str) -> AgTensor:
    t = operand(target, pred, fn, "target")
    if t.requires_grad:   # targets get no gradient: use their value
        t = operand(t.numpy(), pred, fn, "target")
    return t


def ag_mse_loss(pred: AgTensor, target: object) -> AgTensor:
    """Mean squared error over all elements: ``mean((pred - target) ** 2)``.

    Arguments:
        pred: the predictions, an AgTensor.
        target: the targets (AgTensor or array) of pred's shape; they get no gradient.

    Value: a lazy 0-d AgTensor.

    Example:
        >>> loss = ag_mse_loss(model(x), y)
    """
    pred, t = _pair(pred, target, "ag_mse_loss")
    return ag_mean(result(_SQR, (ag_sub(pred, t),), pred.shape))


_SQR = Op("sqr", lambda b, xs, attrs: ggml_sqr(b.ctx, xs[0]))


def _samples(pred: AgTensor) -> int:
    return pred.shape[0] if pred.ndim >= 2 else 1


def ag_cross_entropy_loss(pred: AgTensor, target: object) -> AgTensor:
    """Cross-entropy of probabilities: ``-sum(target * log(p)) / N`` with p = pred clamped to [1e-7, 1 - 1e-7].

    Arguments:
        pred: probabilities (N, C) (a softmax's output), an AgTensor.
        target: one-hot (or soft) targets of pred's shape; they get no gradient.

    Value: a lazy 0-d AgTensor. For logits use ag_softmax_cross_entropy_loss (exact for any logit).

    Example:
        >>> loss = ag_cross_entropy_loss(ag_softmax(logits), onehot)
    """
    pred, t = _pair(pred, target, "ag_cross_entropy_loss")
    logp = ag_log(ag_clamp(pred, 1e-7, 1.0 - 1e-7))
    return ag_scale(ag_sum(ag_mul(logp, t)), -1.0 / _samples(pred))


_CE = Op("softmax_cross_entropy", lambda b, xs, attrs: ggml_cross_entropy_loss(b.ctx, xs[0], xs[1]))


def ag_softmax_cross_entropy_loss(logits: AgTensor, target: object) -> AgTensor:
    """Softmax cross-entropy of logits: ``-sum(target * log_softmax(logits)) / N``, gradient
    ``(softmax(logits) - target) / N`` (ggml's fused loss, exact for any logit; that gradient is the loss's own
    where each target row sums to 1, as one-hot rows and probabilities do).

    Arguments:
        logits: raw scores (N, C), an AgTensor.
        target: one-hot (or soft) targets (N, C), or class ids (N,) from 0 to C-1; they get no gradient.

    Value: a lazy 0-d AgTensor.

    Example:
        >>> loss = ag_softmax_cross_entropy_loss(model(x), labels)   # labels: ints (N,)
    """
    fn = "ag_softmax_cross_entropy_loss"
    logits = floating(tensor_arg(logits, fn, "logits"), fn, "logits")
    if logits.ndim != 2:
        raise GgmlValueError(f"{fn}: logits must be (N, C), got shape {logits.shape}")
    n, c = logits.shape
    ids = target.numpy() if isinstance(target, AgTensor) and target.dtype == "i32" else target
    if not isinstance(ids, AgTensor):
        arr = np.asarray(ids)
        if arr.shape == (n,) and arr.dtype.kind in "iu":
            if arr.size and (arr.min() < 0 or arr.max() >= c):
                raise GgmlValueError(f"{fn}: class ids must be 0 to {c - 1}, got {arr.min()} to {arr.max()}")
            onehot = np.zeros((n, c), np.float32)
            onehot[np.arange(n), arr] = 1.0
            ids = onehot
    t = _target(ids, logits, fn)
    if t.shape != logits.shape:
        raise GgmlValueError(f"{fn}: target must be one-hot {logits.shape} or class ids ({n},), got {t.shape}")
    return result(_CE, (logits, t), ())
