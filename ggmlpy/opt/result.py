"""Results of ggml-opt evaluations (ggml_opt_result_*): per-batch losses, predictions and accuracy
accumulated in C, with the invariants ggml asserts checked in Python first.
"""
from __future__ import annotations

import math

import numpy as np

from .._ffi import CData, ffi, lib
from ..core.args import is_int
from ..core.handle import free_handle, Handle, unwrap
from ..errors import GgmlValueError
from .losses import Head, LOSS_CROSS_ENTROPY, LOSS_SUM


class OptResult(Handle):
    kind = "opt result"

    def __init__(self) -> None:
        super().__init__(lib.ggml_opt_result_init(), lib.ggml_opt_result_free)
        self._batch: int | None = None
        self._kind: tuple[int, int] | None = None
        # heads of a loss built from ggml ops (several heads, weights): per head, its loss of every batch and
        # its correct predictions so far (None: not a cross-entropy head); empty for a loss ggml computes
        self._head_losses: list[list[float]] = []
        self._head_correct: list[float | None] = []
        self._head_sum: list[bool] = []

    def record_heads(self, heads: list[Head], values: list[np.ndarray]) -> None:
        """After an eval of a loss graph built from ggml ops: each head's loss and correct predictions, ``values``
        as read after the step (each head's value, then its correct count where it has one)."""
        if not self._head_losses:
            self._head_losses = [[] for _ in heads]
            self._head_correct = [0 if h.ncorrect is not None else None for h in heads]
            self._head_sum = [h.loss_type == LOSS_SUM for h in heads]
        it = iter(values)
        for i, h in enumerate(heads):
            self._head_losses[i].append(float(next(it)[0]))
            if h.ncorrect is not None:
                correct, count = self._head_correct[i], float(next(it)[0])
                if correct is not None:
                    self._head_correct[i] = correct + count

    def check_batch(self, batch: int, kind: tuple[int, int]) -> None:
        """ggml asserts that a result only ever sees one batch size, loss kind and period (``kind``: the loss type
        ggml records and the opt period; ``OptContext.check_result`` passes them)."""
        if self._batch is not None and batch != self._batch:
            raise GgmlValueError(f"a result accumulates batches of one size: it holds batches of {self._batch}, "
                                 f"this eval has {batch}; use another result or ggml_opt_result_reset")
        if self._kind is not None and kind != self._kind:
            raise GgmlValueError("this result was filled by a context with another loss kind or opt_period; "
                                 "reset it first")
        self._batch, self._kind = batch, kind

    def reset(self) -> None:
        lib.ggml_opt_result_reset(self.ptr)
        self._batch = None
        self._head_losses, self._head_correct, self._head_sum = [], [], []

    def head_loss(self, i: int) -> tuple[float, float]:
        """(mean, standard error) of head ``i``'s per-batch losses (0-based head; NaN error below 2 batches)."""
        losses = np.asarray(self._head_losses[i], dtype=np.float64)
        n = losses.size
        if n == 0:
            return 0.0, math.nan
        mean = float(losses.mean())
        return mean, (float(np.sqrt(((losses - mean) ** 2).sum() / (n * (n - 1)))) if n > 1 else math.nan)

    def head_accuracy(self, i: int, ndata: int) -> tuple[float, float]:
        correct = self._head_correct[i]
        if correct is None or ndata == 0:
            return math.nan, math.nan
        acc = correct / ndata
        return acc, (math.sqrt(acc * (1 - acc) / (ndata - 1)) if ndata > 1 else math.nan)


def ggml_opt_result_init() -> OptResult:
    """A new, empty result: accumulates the losses, predictions and accuracy of evaluated batches.

    Pass it to ``ggml_opt_eval`` or ``ggml_opt_epoch`` (``result_train``/``result_eval``); read it with
    ``ggml_opt_result_loss``, ``ggml_opt_result_accuracy``, ``ggml_opt_result_ndata`` and
    ``ggml_opt_result_pred``. One result only accumulates batches of one size, one loss kind and one
    ``opt_period`` (another raises GgmlValueError: use ``ggml_opt_result_reset`` or a second result).

    Value: an OptResult handle (a context manager; freed with ``ggml_opt_result_free``).

    Example:
        >>> res = ggml_opt_result_init()
        >>> ggml_opt_epoch(opt_ctx, ds, res, None, -1, False, False)
        >>> ggml_opt_result_loss(res)["loss"]
    """
    return OptResult()


def _res(result: object, fn: str) -> CData:
    return unwrap(result, OptResult, f"{fn}(result)")


def ggml_opt_result_free(result: OptResult) -> None:
    """Free a result. Idempotent; using it afterwards raises GgmlStateError.

    Arguments:
        result: an OptResult.

    Value: None.

    Example:
        >>> ggml_opt_result_free(res)
    """
    free_handle(result, OptResult, "ggml_opt_result_free(result)")


def ggml_opt_result_reset(result: OptResult) -> None:
    """Empty a result (losses, predictions, counts), e.g. at the start of each epoch.

    After a reset the result accepts batches of any size again.

    Arguments:
        result: an OptResult.

    Value: None.

    Example:
        >>> ggml_opt_result_reset(res)
    """
    _res(result, "ggml_opt_result_reset")
    result.reset()


def ggml_opt_result_ndata(result: OptResult) -> int:
    """The number of datapoints evaluated into a result so far.

    Arguments:
        result: an OptResult.

    Value: an int.

    Example:
        >>> ggml_opt_result_ndata(res)
    """
    out = ffi.new("int64_t *")
    lib.ggml_opt_result_ndata(_res(result, "ggml_opt_result_ndata"), out)
    return int(out[0])


def ggml_opt_result_loss(result: OptResult) -> dict:
    """The loss accumulated in a result, with its uncertainty.

    For per-datapoint losses (all but SUM) the mean of the per-batch losses; for SUM their total.
    The uncertainty is the standard error of that mean over the batches (NaN with fewer than two
    batches); an empty result gives loss 0.0.

    Arguments:
        result: an OptResult.

    Value: a dict ``{"loss": float, "uncertainty": float}``.

    Example:
        >>> ggml_opt_result_loss(res)
        {'loss': 0.3121, 'uncertainty': 0.0042}
    """
    loss, unc = ffi.new("double *"), ffi.new("double *")
    lib.ggml_opt_result_loss(_res(result, "ggml_opt_result_loss"), loss, unc)
    return {"loss": float(loss[0]), "uncertainty": float(unc[0])}


def ggml_opt_result_accuracy(result: OptResult) -> dict:
    """The fraction of correctly classified datapoints in a result, with its uncertainty.

    Only cross-entropy contexts count correct predictions (argmax of the outputs against argmax of
    the labels); for other loss types the accuracy is NaN. The uncertainty is the binomial standard
    error ``sqrt(acc (1 - acc) / (ndata - 1))`` (NaN below two datapoints).

    Arguments:
        result: an OptResult.

    Value: a dict ``{"accuracy": float, "uncertainty": float}``.

    Example:
        >>> ggml_opt_result_accuracy(res)["accuracy"]
        0.9712
    """
    acc, unc = ffi.new("double *"), ffi.new("double *")
    lib.ggml_opt_result_accuracy(_res(result, "ggml_opt_result_accuracy"), acc, unc)
    return {"accuracy": float(acc[0]), "uncertainty": float(unc[0])}


def ggml_opt_result_pred(result: OptResult) -> np.ndarray:
    """The predicted class (argmax of the outputs) of every datapoint evaluated into a result.

    Recorded by contexts with ggml's cross-entropy loss, in evaluation order (datapoint by datapoint,
    batch after batch); other losses record none, and asking for them raises GgmlValueError.

    Arguments:
        result: an OptResult.

    Value: a 1-D int32 numpy array of length ``ggml_opt_result_ndata(result)``.

    Example:
        >>> classes = ggml_opt_result_pred(res)
    """
    n = ggml_opt_result_ndata(result)
    kind = result._kind
    if n and kind is not None and kind[0] != LOSS_CROSS_ENTROPY:
        # ggml records predictions for its own cross-entropy only; it returned zeros for the others
        raise GgmlValueError(f"ggml_opt_result_pred: this result holds {n} datapoints evaluated with another loss "
                             "than ggml's cross-entropy, which records no predictions; compute them from "
                             "ggml_opt_outputs(opt_ctx) after each eval (the argmax of each column)")
    out = np.zeros(n, dtype=np.int32)
    if n:
        lib.ggml_opt_result_pred(result.ptr, ffi.from_buffer("int32_t[]", out))  # typed: C takes int32_t *
    return out


def _ihead(result: OptResult, ihead: object, fn: str) -> int:
    n = ggml_opt_result_n_loss(result)
    if not is_int(ihead) or not 1 <= ihead <= max(n, 1):
        raise GgmlValueError(f"{fn}: ihead must be an int in [1, {max(n, 1)}] (1-based: the result holds {n} "
                             f"head(s)), got {ihead!r}")
    return int(ihead) - 1


def ggml_opt_result_n_loss(result: OptResult) -> int:
    """The number of heads (losses) whose values a result holds: 0 until something was evaluated into it,
    then 1 for a single-loss context and the number of heads for a multi-head one (``ggml_opt_init_for_fit_multi``).

    Arguments:
        result: an OptResult.

    Value: an int >= 0.

    Example:
        >>> [ggml_opt_result_loss_i(res, i)["loss"] for i in range(1, ggml_opt_result_n_loss(res) + 1)]
    """
    r = _res(result, "ggml_opt_result_n_loss")
    if result._head_losses:
        return len(result._head_losses)
    out = ffi.new("int64_t *")
    lib.ggml_opt_result_ndata(r, out)
    return 1 if out[0] > 0 else 0


def ggml_opt_result_loss_i(result: OptResult, ihead: int) -> dict:
    """The loss of head ``ihead`` (1-based) accumulated in a result, before its head weight, with its uncertainty.

    As ``ggml_opt_result_loss`` for the total: the mean of the head's per-batch losses (their total for SUM) and
    the standard error of that mean over the batches (NaN with fewer than two). For a single-loss context,
    head 1 is the whole loss.

    Arguments:
        result: an OptResult.
        ihead: the head number, **1-based**, in ``[1, ggml_opt_result_n_loss(result)]`` (else GgmlValueError).

    Value: a dict ``{"loss": float, "uncertainty": float}``.

    Example:
        >>> ggml_opt_result_loss_i(res, 2)["loss"]
    """
    i = _ihead(result, ihead, "ggml_opt_result_loss_i")
    if not result._head_losses:
        return ggml_opt_result_loss(result)
    loss, unc = result.head_loss(i)
    n = len(result._head_losses[i])
    return {"loss": loss * n, "uncertainty": unc * n} if result._head_sum[i] else {"loss": loss, "uncertainty": unc}


def ggml_opt_result_accuracy_i(result: OptResult, ihead: int) -> dict:
    """The accuracy of head ``ihead`` (1-based) accumulated in a result, with its binomial standard error.

    Cross-entropy heads count their correct predictions (argmax of the outputs against argmax of the labels);
    other heads have accuracy NaN (ggmlR's NA). For a single-loss context, head 1 is ``ggml_opt_result_accuracy``.

    Arguments:
        result: an OptResult.
        ihead: the head number, **1-based**, in ``[1, ggml_opt_result_n_loss(result)]`` (else GgmlValueError).

    Value: a dict ``{"accuracy": float, "uncertainty": float}``.

    Example:
        >>> ggml_opt_result_accuracy_i(res, 1)["accuracy"]
    """
    i = _ihead(result, ihead, "ggml_opt_result_accuracy_i")
    if not result._head_losses:
        return ggml_opt_result_accuracy(result)
    acc, unc = result.head_accuracy(i, ggml_opt_result_ndata(result))
    return {"accuracy": acc, "uncertainty": unc}
