"""Results of ggml-opt evaluations (ggml_opt_result_*): per-batch losses, predictions and accuracy
accumulated in C, with the invariants ggml asserts checked in Python first."""
from __future__ import annotations

from typing import Any

import numpy as np

from ._ffi import ffi, lib
from ._handle import Handle, free_handle, unwrap
from .errors import GgmlValueError

class OptResult(Handle):
    kind = "opt result"

    def __init__(self) -> None:
        super().__init__(lib.ggml_opt_result_init(), lib.ggml_opt_result_free)
        self._batch: int | None = None
        self._kind: tuple | None = None

    def check_batch(self, opt: Any) -> None:
        """ggml asserts that a result only ever sees one batch size, loss kind and period."""
        out = opt.loss.opt_outputs if opt.static else opt.heads[0].outputs
        batch = int(out.ptr.ne[1])
        kind = (opt.loss.ggml_loss_type if opt.static else opt.heads[0].loss_type, opt.opt_period)
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


def ggml_opt_result_init() -> OptResult:
    return OptResult()


def _res(result: Any, fn: str) -> Any:
    return unwrap(result, OptResult, f"{fn}(result)")


def ggml_opt_result_free(result: OptResult) -> None:
    free_handle(result, OptResult, "ggml_opt_result_free(result)")


def ggml_opt_result_reset(result: OptResult) -> None:
    _res(result, "ggml_opt_result_reset")
    result.reset()


def ggml_opt_result_ndata(result: OptResult) -> int:
    out = ffi.new("int64_t *")
    lib.ggml_opt_result_ndata(_res(result, "ggml_opt_result_ndata"), out)
    return int(out[0])


def ggml_opt_result_loss(result: OptResult) -> dict:
    loss, unc = ffi.new("double *"), ffi.new("double *")
    lib.ggml_opt_result_loss(_res(result, "ggml_opt_result_loss"), loss, unc)
    return {"loss": float(loss[0]), "uncertainty": float(unc[0])}


def ggml_opt_result_accuracy(result: OptResult) -> dict:
    acc, unc = ffi.new("double *"), ffi.new("double *")
    lib.ggml_opt_result_accuracy(_res(result, "ggml_opt_result_accuracy"), acc, unc)
    return {"accuracy": float(acc[0]), "uncertainty": float(unc[0])}


def ggml_opt_result_pred(result: OptResult) -> np.ndarray:
    n = ggml_opt_result_ndata(result)
    out = np.zeros(n, dtype=np.int32)
    if n:
        lib.ggml_opt_result_pred(result.ptr, ffi.from_buffer(out))
    return out
