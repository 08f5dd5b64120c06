"""ggml's own loops, ``ggml_opt_epoch`` and ``ggml_opt_fit``, run batch by batch from Python.

They do exactly what ggml's C functions of these names do (same batch order, ggml's dataset shuffle
with the opt context's generator, same callbacks with the same arguments, ggml's progress bar: the
same losses and weights, tests/opt/test_loops.py compares them with the C functions), but
each batch is one ``ggml_opt_alloc`` -> ``ggml_opt_dataset_get_batch`` -> ``ggml_opt_eval`` step
called from Python, so Ctrl-C stops them between two batches (the C loop ran to its end), an error
in a callback can stop them, and the objects they use are marked in use (a callback that frees the
opt context, the scheduler, the dataset or a result gets an error instead of freeing memory under
ggml). Their preconditions, asserted in C, are checked here first.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .._ffi import ffi, lib
from ..compute.checks import check_opt_heads
from ..compute.sched import Scheduler
from ..core.args import is_int
from ..core.handle import InterruptGuard, unwrap, using
from ..core.types import type_name
from ..errors import expect, GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.objects import as_tensor, Context, Tensor
from . import losses as L
from .constants import BUILD_OPT, check_optimizer, OPTIMIZER_ADAMW
from .context import check_trainable, OptContext
from .dataset import check_distribution_rows, Dataset
from .init import opt_init
from .params import LrUserdata, OptimizerParams
from .result import OptResult


if TYPE_CHECKING:
    # f(train, ibatch, ibatch_max, t_start_us, result), called after each batch (ggml's epoch callback)
    EpochCallback = Callable[[bool, int, int, int, OptResult | None], object]


@ffi.def_extern()
def _ggmlpy_epoch_cb(train, opt_ctx, dataset, result, ibatch, ibatch_max, t_start_us):  # noqa: ARG001
    """Declared for ggml's C ``ggml_opt_epoch``; the loops here call Python callbacks directly."""


def _now_us() -> int:
    """ggml_time_us(): ggml's clock (CLOCK_MONOTONIC), which its progress bar measures elapsed time on."""
    if hasattr(time, "clock_gettime_ns") and hasattr(time, "CLOCK_MONOTONIC"):
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return time.monotonic_ns() // 1000


def _callback(cb: object) -> EpochCallback | bool | None:
    if cb is True or cb is False or cb is None or callable(cb):
        return cb or None
    raise GgmlValueError(f"epoch callbacks must be True (ggml's progress bar), False/None (nothing) or a function "
                         f"f(train, ibatch, ibatch_max, t_start_us, result), got {cb!r}")


def _call(cb: EpochCallback | bool, train: bool, opt: OptContext, dataset: Dataset, result: OptResult | None,
          ibatch: int, ibatch_max: int, t_start_us: int) -> None:
    if isinstance(cb, bool):  # True, ggml's progress bar (False means no callback: never called)
        assert result is not None  # the bar always gets one (_run_epoch)
        lib.ggml_opt_epoch_callback_progress_bar(train, opt.ptr, dataset.ptr, result.ptr, ibatch, ibatch_max,
                                                 t_start_us)
        return
    # an exception stops the epoch once the batch's compute has returned, as a KeyboardInterrupt does (ggmlR
    # only warns, and training went on past a broken callback); the batches done stay trained and recorded
    cb(train, ibatch, ibatch_max, t_start_us, result)


def _run_epoch(opt: OptContext, dataset: Dataset, result_train: OptResult | None, result_eval: OptResult | None,
               idata_split: int, callback_train: EpochCallback | bool | None,
               callback_eval: EpochCallback | bool | None, batch: int) -> None:
    """ggml_opt_epoch (ggml-opt.cpp) step by step: the batches before ``idata_split`` train, the rest evaluate;
    each callback runs after its batch. ``opt`` is marked running by the caller."""
    inputs, labels = opt.inputs, opt.labels(0)
    assert inputs is not None  # static graphs (checked by the caller)
    ds_ptr, in_ptr = dataset.ptr, inputs.ptr
    lab_ptr = labels.ptr if labels is not None else ffi.NULL
    nbatches = dataset.ndata // batch
    ibatch_split = (dataset.ndata if idata_split < 0 else idata_split) // batch
    # ggml's progress bar reads the result: it gets one even where the caller records nothing
    bars = [OptResult() if cb is True and r is None else None
            for cb, r in ((callback_train, result_train), (callback_eval, result_eval))]
    try:
        with using([h for h in bars if h is not None], "ggml_opt_epoch"), InterruptGuard() as guard:
            for train, first, stop, cb, result in (
                    (True, 0, ibatch_split, callback_train, result_train if bars[0] is None else bars[0]),
                    (False, ibatch_split, nbatches, callback_eval, result_eval if bars[1] is None else bars[1])):
                t_start = _now_us()
                for ibatch in range(first, stop):
                    with guard.step:  # Ctrl-C lands between two batches, never inside one
                        opt.alloc(train)
                        lib.ggml_opt_dataset_get_batch(ds_ptr, in_ptr, lab_ptr, ibatch)
                        opt.eval(result)
                    if cb is not None:
                        _call(cb, train, opt, dataset, result, ibatch + 1 - first, stop - first, t_start)
    finally:
        for h in bars:
            if h is not None:
                h.free()


def _check_epoch_data(fn: str, opt_ctx: OptContext, dataset: Dataset, batch: int) -> None:
    """What ggml_opt_dataset_get_batch asserts about the batch tensors (it would abort)."""
    inputs = opt_ctx.inputs
    assert inputs is not None  # static graphs (checked by the caller)
    if inputs.type != dataset.data.type:
        raise GgmlTypeError(f"{fn}: the dataset holds {type_name(dataset.data.type).upper()} data, the inputs tensor "
                            f"is {type_name(inputs.type).upper()}; create them with the same type")
    if not lib.ggml_is_contiguous(inputs.ptr):
        raise GgmlValueError(f"{fn}: the inputs tensor must be contiguous (ggml copies whole batches into it)")
    if batch % dataset.ndata_shard:
        raise GgmlValueError(f"{fn}: the batch size ({batch}) must be a multiple of the dataset's shard size "
                             f"ndata_shard ({dataset.ndata_shard}): ggml copies whole shards")
    labels = opt_ctx.labels(0)
    if labels is not None and dataset.labels is not None and labels.type != dataset.labels.type:
        raise GgmlTypeError(f"{fn}: the dataset's labels are {type_name(dataset.labels.type).upper()}, the "
                            f"outputs (and so the labels tensor) {type_name(labels.type).upper()}; create the "
                            "dataset with type_label of the outputs' type")


def ggml_opt_epoch(opt_ctx: OptContext, dataset: Dataset, result_train: OptResult | None = None,
                   result_eval: OptResult | None = None, idata_split: int = -1,
                   callback_train: EpochCallback | bool | None = True,
                   callback_eval: EpochCallback | bool | None = True) -> None:
    """One pass over an in-memory dataset, as ggml's C loop: the first datapoints train, the rest evaluate.

    Batch after batch, the datapoints before ``idata_split`` are trained on (forward, backward and,
    every ``opt_period`` batches, an optimizer step) and the rest are only evaluated. The batch size is
    that of the context's inputs. It supports ggml's own losses only (mean, sum, cross_entropy, mse:
    ``ggml_fit_opt`` handles the others) and an opt context with static graphs. Shuffling is up to the
    caller (``ggml_opt_dataset_shuffle``). Each batch is one ``ggml_opt_alloc`` / ``ggml_opt_eval`` step
    run from Python with ggml's semantics, so Ctrl-C (a KeyboardInterrupt) stops the epoch between two
    batches; the batches done so far stay trained and recorded in the results. While it runs, the opt
    context, its scheduler, the dataset and the results are in use: a callback (or another thread)
    that frees one of them, or calls ``ggml_opt_alloc``/``ggml_opt_eval`` on the context, gets a
    GgmlInUseError.

    Arguments:
        opt_ctx: an opt context with static graphs (``ggml_opt_init_for_fit(..., ctx_compute=...)``).
        dataset: a Dataset whose ``ne_datapoint`` matches the inputs and whose ``ndata`` is a multiple
            of the batch size; it has labels exactly when the loss needs them.
        result_train: an OptResult collecting the training batches, or None (the default).
        result_eval: an OptResult collecting the evaluation batches, or None (the default).
        idata_split: the first datapoint that is evaluated instead of trained on: a multiple of the
            batch size, at most ``ndata``; negative (the default, -1) trains on everything, 0 only
            evaluates (the only choice for a FORWARD context).
        callback_train, callback_eval: called after each training / evaluation batch: True (the
            default) shows ggml's progress bar, False or None nothing, a function is called as
            ``f(train, ibatch, ibatch_max, t_start_us, result)``; an exception it raises (a
            KeyboardInterrupt too) stops the epoch after that batch and leaves ``ggml_opt_epoch``
            (ggmlR only warns and goes on).

    Value: None; read the results. Raises GgmlValueError / GgmlStateError for the mismatches above
    before ggml is called.

    Example:
        >>> tr, ev = ggml_opt_result_init(), ggml_opt_result_init()
        >>> ggml_opt_epoch(fit["opt_ctx"], ds, tr, ev, idata_split=50000)
        >>> ggml_opt_result_loss(ev)["loss"], ggml_opt_result_accuracy(ev)["accuracy"]
    """
    fn = "ggml_opt_epoch"
    unwrap(opt_ctx, OptContext, f"{fn}(opt_ctx)")
    unwrap(dataset, Dataset, f"{fn}(dataset)")
    loss, inputs = opt_ctx.loss, opt_ctx.inputs
    if not opt_ctx.static or loss is None or inputs is None:  # static graphs have both
        raise GgmlStateError(f"{fn} needs an opt context with static graphs (ctx_compute, inputs, outputs)")
    if loss.composite:
        raise GgmlValueError(f"{fn} runs ggml's C loop, which only feeds ggml's own losses (mean, sum, "
                             "cross_entropy, mse); use ggml_fit_opt for the others")
    batch = L.physical_batch(inputs)
    per_point = inputs.nelements() // batch
    expect(per_point == dataset.ne_datapoint, f"{fn}: the inputs hold {per_point} values per datapoint, the dataset "
                                              f"{dataset.ne_datapoint}")
    expect(dataset.ndata % batch == 0, f"{fn}: ndata ({dataset.ndata}) must be a multiple of the batch size ({batch})")
    expect(is_int(idata_split), f"{fn}: idata_split must be an int, got {idata_split!r}")
    if idata_split >= 0:
        expect(idata_split % batch == 0 and idata_split <= dataset.ndata,
               f"{fn}: idata_split must be a multiple of the batch size ({batch}) and <= ndata, got {idata_split}")
    has_labels = dataset.ne_label > 0
    if has_labels != (opt_ctx.heads[0].loss_type in L.LABELLED_LOSSES):
        raise GgmlValueError(f"{fn}: the dataset {'has' if has_labels else 'has no'} labels but the loss "
                             f"{L.LOSS_NAMES[opt_ctx.heads[0].loss_type]} "
                             f"{'does not use' if has_labels else 'needs'} them")
    if has_labels:
        expect(dataset.ne_label * batch == opt_ctx.heads[0].outputs.nelements(),
               f"{fn}: the outputs hold {opt_ctx.heads[0].outputs.nelements() // batch} values per datapoint, "
               f"the dataset's labels {dataset.ne_label}")
    if (idata_split < 0 or idata_split > 0) and opt_ctx.build_type != 30:
        raise GgmlStateError(f"{fn}: a forward-only context cannot train; pass idata_split=0")
    for name, r in (("result_train", result_train), ("result_eval", result_eval)):
        if r is not None:
            unwrap(r, OptResult, name)
    for r in (result_train, result_eval):
        if r is not None:
            opt_ctx.check_result(r)
    opt_ctx.lr_ud.validate()
    _check_epoch_data(fn, opt_ctx, dataset, batch)
    cb_t, cb_e = _callback(callback_train), _callback(callback_eval)
    opt_ctx.refuse_if_running(fn)
    if opt_ctx.pending_alloc is not None:
        raise GgmlStateError(f"{fn}: a ggml_opt_alloc is pending on this opt context; call ggml_opt_eval first")
    with opt_ctx.running(fn), using([dataset, result_train, result_eval], fn):
        _run_epoch(opt_ctx, dataset, result_train, result_eval, idata_split, cb_t, cb_e, batch)


def ggml_opt_fit(sched: Scheduler, ctx_compute: Context, inputs: Tensor, outputs: Tensor, dataset: Dataset,
                 loss_type: int = L.LOSS_MSE, optimizer: int = OPTIMIZER_ADAMW, nepoch: int = 1,
                 nbatch_logical: int = 32, val_split: float = 0.0, silent: bool = False,
                 get_opt_pars: Callable[[int], object] | None = None) -> None:
    """ggml's own training loop: ``nepoch`` epochs over an in-memory dataset, exactly as ggml's C function.

    It builds its own opt context with ggml's default optimizer parameters (AdamW lr 1e-3) unless
    ``get_opt_pars`` supplies others, shuffles the whole dataset once and the training part every epoch (with
    ggml's generator), and prints ggml's progress bars unless ``silent``. It returns nothing: no
    history, no callbacks. It runs batch by batch from Python with ggml's semantics (the same losses and
    weights as the C function), so Ctrl-C stops it between two batches; the trained weights of the
    completed batches stay in place.
    ``ggml_fit_opt`` is the full-featured Python loop with the same arguments plus callbacks, learning
    rate, weight decay and a history.

    Arguments:
        sched: the Scheduler to train on; it must not serve a live opt context.
        ctx_compute: [glossary]
        inputs: the allocated input Tensor ``[ne_datapoint, batch]``; its ne[1] is the physical batch.
        outputs: the output Tensor (it must depend on at least one ``ggml_set_param`` tensor).
        dataset: a Dataset matching inputs (and outputs, for labels); ``ndata`` a multiple of
            ``nbatch_logical``.
        loss_type: ggml's own losses only: ``ggml_opt_loss_type_mse()`` (the default), ``..._mean()``,
            ``..._sum()`` or ``..._cross_entropy()`` (on logits).
        optimizer: [glossary]
        nepoch: the number of epochs (an int >= 1, default 1).
        nbatch_logical: datapoints per optimizer step, a multiple of the physical batch (default 32);
            gradients of ``nbatch_logical / batch`` batches are accumulated.
        val_split: the fraction in [0, 1) of the logical batches, at the end of the shuffled data, used
            for validation instead of training (default 0).
        silent: True suppresses ggml's progress output (default False).
        get_opt_pars: the optimizer hyper-parameters, ggml's ``get_opt_pars`` argument (ggmlR has none):
            None (the default: ggml's defaults), an OptimizerParams (``ggml_opt_get_default_optimizer_params()``
            with fields changed) used at every step, or a function ``f(epoch)`` called before every optimizer
            step with the 1-based epoch number, as ggml calls its callback, returning an OptimizerParams or a
            dict ``{"adamw": {"alpha": ...}, "sgd": {...}}`` (fields left out keep ggml's defaults). A
            learning-rate schedule per epoch: ``lambda epoch: {"sgd": {"alpha": 0.1 * 0.9 ** epoch}}``.

    Value: None. Raises GgmlValueError / GgmlStateError when a requirement above does not hold
    (ggml would abort), and whatever ``get_opt_pars`` raises (training stops; everything is released).

    Example:
        >>> ggml_opt_fit(sched, ctx, x, logits, ds, ggml_opt_loss_type_cross_entropy(), nepoch=5,
        ...              nbatch_logical=64, val_split=0.1)
    """
    fn = "ggml_opt_fit"
    s = unwrap(sched, Scheduler, f"{fn}(sched)")
    unwrap(ctx_compute, Context, f"{fn}(ctx_compute)")
    ds = unwrap(dataset, Dataset, f"{fn}(dataset)")
    x, out = as_tensor(inputs, f"{fn}(inputs)"), as_tensor(outputs, f"{fn}(outputs)")
    L.check_loss_type(loss_type)
    if loss_type not in L.BUILTIN_LOSSES:
        raise GgmlValueError(f"{fn} is ggml's C loop and knows only mean, sum, cross_entropy and mse; use "
                             "ggml_fit_opt for the other losses")
    check_optimizer(optimizer)
    expect(is_int(nepoch) and nepoch >= 1, f"{fn}: nepoch must be an int >= 1, got {nepoch!r}")
    batch = int(x.ptr.ne[1])
    expect(is_int(nbatch_logical) and nbatch_logical >= 1 and nbatch_logical % batch == 0,
           f"{fn}: nbatch_logical must be a positive multiple of the physical batch ({batch}), got {nbatch_logical!r}")
    expect(dataset.ndata % nbatch_logical == 0,
           f"{fn}: ndata ({dataset.ndata}) must be a multiple of nbatch_logical ({nbatch_logical})")
    expect(isinstance(val_split, (int, float)) and 0 <= val_split < 1,
           f"{fn}: val_split must be in [0, 1), got {val_split!r}")
    expect(x.nelements() // batch == dataset.ne_datapoint,
           f"{fn}: inputs hold {x.nelements() // batch} values per datapoint, the dataset {dataset.ne_datapoint}")
    expect(x.ptr.data != ffi.NULL, f"{fn}: inputs must be allocated (ggml_backend_alloc_ctx_tensors)", GgmlStateError)
    if (dataset.ne_label > 0) != (loss_type in L.LABELLED_LOSSES):
        raise GgmlValueError(f"{fn}: labels are needed exactly for cross_entropy and mse")
    if dataset.ne_label > 0:
        expect(dataset.ne_label * batch == out.nelements(),
               f"{fn}: outputs hold {out.nelements() // batch} values per datapoint, the labels {dataset.ne_label}")
    check_opt_heads([L.Head(int(loss_type), out)], fn, True)
    if int(loss_type) == L.LOSS_CROSS_ENTROPY and dataset.labels is not None:
        check_distribution_rows(dataset, fn)
    check_trainable([out], accumulating=nbatch_logical > batch)
    expect(batch % dataset.ndata_shard == 0, f"{fn}: the physical batch ({batch}) must be a multiple of the "
                                             f"dataset's shard size ndata_shard ({dataset.ndata_shard})")
    if get_opt_pars is not None and not callable(get_opt_pars) and not isinstance(get_opt_pars, OptimizerParams):
        raise GgmlTypeError(f"{fn}: get_opt_pars must be None, an OptimizerParams or a function f(epoch) returning "
                            f"the optimizer parameters, got {get_opt_pars!r:.80}")
    # ggml_opt_fit (ggml-opt.cpp), step by step. The split is computed in float, as ggml does.
    ndata = dataset.ndata
    opt_period = nbatch_logical // batch
    nbatches_logical = ndata // nbatch_logical
    ibatch_split = int((np.float32(1.0) - np.float32(val_split)) * np.float32(nbatches_logical)) * opt_period
    idata_split = ibatch_split * batch
    t_start = _now_us()
    # its own opt context (parameters from get_opt_pars, else ggml's defaults), freed on return as in C; the
    # check that the scheduler serves no other opt context and the build are one step (a lock: no thread can slip
    # in between)
    epoch_now = [1]  # what ggml's callback receives (a pointer to the epoch, 1-based)
    lr_ud = LrUserdata()
    if isinstance(get_opt_pars, OptimizerParams):
        lr_ud.params[0] = get_opt_pars.c_struct[0]
        lr_ud.validate()
    elif get_opt_pars is not None:
        lr_ud.provider = lambda: get_opt_pars(epoch_now[0])
    opt = opt_init(sched, int(loss_type), optimizer, opt_period, ctx_compute, x, out, BUILD_OPT, lr_ud)
    results = [OptResult(), OptResult()]
    try:
        _check_epoch_data(fn, opt, dataset, batch)
        progress = None if silent else True
        with opt.running(fn), using([sched, dataset, *results], fn):
            if nbatch_logical < ndata:
                lib.ggml_opt_dataset_shuffle(opt.ptr, ds, -1)  # all data (train + validation), ggml's generator
            for epoch in range(1, nepoch + 1):
                epoch_now[0] = epoch
                if nbatch_logical < idata_split:
                    lib.ggml_opt_dataset_shuffle(opt.ptr, ds, idata_split)
                for r in results:
                    r.reset()
                if not silent:
                    _stderr(f"{fn}: epoch {epoch:04d}/{nepoch:04d}:\n")
                _run_epoch(opt, dataset, results[0], results[1], idata_split, progress, progress, batch)
                if not silent:
                    _stderr("\n")
        if not silent:
            total = (_now_us() - t_start) // 1000000
            _stderr(f"{fn}: training took {total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}\n")
    finally:
        for h in (*results, opt):
            h.free()
        sched.release()
        lib.ggml_backend_sched_reset(s)


def _stderr(text: str) -> None:
    """Where ggml's C loop prints (its progress bar writes to C's unbuffered stderr): flushed at once."""
    sys.stderr.write(text)
    sys.stderr.flush()
