"""ggml's own C loops: ``ggml_opt_epoch`` and ``ggml_opt_fit``.

They run entirely in C (the baseline our Python loop is measured against). Their
preconditions, asserted in C, are checked here first.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

from . import losses as L
from ._ffi import ffi, lib
from ._handle import unwrap
from .context import Context, Tensor, as_tensor, ggml_graph_overhead, ggml_init, ggml_tensor_overhead
from .dataset import Dataset
from .errors import GgmlpyWarning, GgmlStateError, GgmlValueError, expect
from .opt import OPTIMIZER_ADAMW, OptContext, OptResult, check_optimizer, check_trainable
from .sched import Scheduler

_epoch_callbacks: list[Callable | None] = [None, None]


@ffi.def_extern()
def _ggmlpy_epoch_cb(train, opt_ctx, dataset, result, ibatch, ibatch_max, t_start_us):  # noqa: ARG001
    fn = _epoch_callbacks[0 if train else 1]
    if fn is None:
        return
    try:
        fn(bool(train), int(ibatch), int(ibatch_max), int(t_start_us), _epoch_callbacks_result[0 if train else 1])
    except Exception as exc:  # noqa: BLE001 - never raise into C; ggmlR turns errors into warnings
        warnings.warn(f"the ggml_opt_epoch callback raised {type(exc).__name__}: {exc}", GgmlpyWarning, stacklevel=1)
    except BaseException as exc:  # noqa: BLE001 - Ctrl-C / SystemExit: no more callbacks, re-raised after C returns
        _interrupted[0] = exc
        _epoch_callbacks[:] = [None, None]


_epoch_callbacks_result: list[Any] = [None, None]
_interrupted: list[BaseException | None] = [None]


def _callback_ptr(cb: Any, slot: int, result: Any) -> Any:
    if cb is True:
        return lib.ggml_opt_epoch_callback_progress_bar
    if cb is False or cb is None:
        return ffi.NULL
    if not callable(cb):
        raise GgmlValueError(f"epoch callbacks must be True, False or a function, got {cb!r}")
    _epoch_callbacks[slot] = cb
    _epoch_callbacks_result[slot] = result
    return lib._ggmlpy_epoch_cb


def ggml_opt_epoch(opt_ctx: OptContext, dataset: Dataset, result_train: OptResult | None = None,
                   result_eval: OptResult | None = None, idata_split: int = -1, callback_train: Any = True,
                   callback_eval: Any = True) -> None:
    """One pass over an in-memory dataset with ggml's C loop: the first datapoints train, the rest evaluate.

    Batch after batch, the datapoints before ``idata_split`` are trained on (forward, backward and,
    every ``opt_period`` batches, an optimizer step) and the rest are only evaluated. The batch size is
    that of the context's inputs. The loop runs in C; it supports ggml's own losses only (mean, sum,
    cross_entropy, mse: ``ggml_fit_opt`` handles the others) and an opt context with static graphs.
    Shuffling is up to the caller (``ggml_opt_dataset_shuffle``).

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
            ``f(train, ibatch, ibatch_max, t_start_us, result)``.

    Value: None; read the results. Raises GgmlValueError / GgmlStateError for the mismatches above
    before ggml is called.

    Example:
        >>> tr, ev = ggml_opt_result_init(), ggml_opt_result_init()
        >>> ggml_opt_epoch(fit["opt_ctx"], ds, tr, ev, idata_split=50000)
        >>> ggml_opt_result_loss(ev)["loss"], ggml_opt_result_accuracy(ev)["accuracy"]
    """
    fn = "ggml_opt_epoch"
    opt = unwrap(opt_ctx, OptContext, f"{fn}(opt_ctx)")
    ds = unwrap(dataset, Dataset, f"{fn}(dataset)")
    if not opt_ctx.static:
        raise GgmlStateError(f"{fn} needs an opt context with static graphs (ctx_compute, inputs, outputs)")
    if opt_ctx.loss.composite:
        raise GgmlValueError(f"{fn} runs ggml's C loop, which only feeds ggml's own losses (mean, sum, "
                             "cross_entropy, mse); use ggml_fit_opt for the others")
    inputs = opt_ctx.inputs
    batch = L.physical_batch(inputs)
    per_point = inputs.nelements() // batch
    expect(per_point == dataset.ne_datapoint, f"{fn}: the inputs hold {per_point} values per datapoint, the dataset "
                                              f"{dataset.ne_datapoint}")
    expect(dataset.ndata % batch == 0, f"{fn}: ndata ({dataset.ndata}) must be a multiple of the batch size ({batch})")
    expect(isinstance(idata_split, int), f"{fn}: idata_split must be an int, got {idata_split!r}")
    if idata_split >= 0:
        expect(idata_split % batch == 0 and idata_split <= dataset.ndata,
               f"{fn}: idata_split must be a multiple of the batch size ({batch}) and <= ndata, got {idata_split}")
    has_labels = dataset.ne_label > 0
    if has_labels != (opt_ctx.heads[0].loss_type in L.LABELLED_LOSSES):
        raise GgmlValueError(f"{fn}: the dataset {'has' if has_labels else 'has no'} labels but the loss "
                             f"{L.LOSS_NAMES[opt_ctx.heads[0].loss_type]} {'does not use' if has_labels else 'needs'} them")
    if has_labels:
        expect(dataset.ne_label * batch == opt_ctx.heads[0].outputs.nelements(),
               f"{fn}: the outputs hold {opt_ctx.heads[0].outputs.nelements() // batch} values per datapoint, "
               f"the dataset's labels {dataset.ne_label}")
    if (idata_split < 0 or idata_split > 0) and opt_ctx.build_type != 30:
        raise GgmlStateError(f"{fn}: a forward-only context cannot train; pass idata_split=0")
    res_t = unwrap(result_train, OptResult, "result_train") if result_train is not None else ffi.NULL
    res_e = unwrap(result_eval, OptResult, "result_eval") if result_eval is not None else ffi.NULL
    for r in (result_train, result_eval):
        if r is not None:
            r.check_batch(opt_ctx)
    opt_ctx.lr_ud.validate()
    cb_t = _callback_ptr(callback_train, 0, result_train)
    cb_e = _callback_ptr(callback_eval, 1, result_eval)
    _interrupted[0] = None
    try:
        lib.ggml_opt_epoch(opt, ds, res_t, res_e, idata_split, cb_t, cb_e)
    finally:
        _epoch_callbacks[:] = [None, None]
        _epoch_callbacks_result[:] = [None, None]
        n_batches = dataset.ndata // batch
        opt_ctx._opt_i = (opt_ctx._opt_i + n_batches) % opt_ctx.opt_period
    interrupted, _interrupted[0] = _interrupted[0], None
    if interrupted is not None:  # a KeyboardInterrupt inside a callback is not swallowed: it stops the caller
        raise interrupted


def ggml_opt_fit(sched: Scheduler, ctx_compute: Context, inputs: Tensor, outputs: Tensor, dataset: Dataset,
                 loss_type: int = L.LOSS_MSE, optimizer: int = OPTIMIZER_ADAMW, nepoch: int = 1,
                 nbatch_logical: int = 32, val_split: float = 0.0, silent: bool = False) -> None:
    """ggml's own training loop, entirely in C: ``nepoch`` epochs over an in-memory dataset.

    It builds its own opt context with ggml's default optimizer parameters (AdamW lr 1e-3: no way to
    change the learning rate), shuffles the whole dataset once and the training part every epoch,
    and prints ggml's progress bars unless ``silent``. It returns nothing: no history, no callbacks.
    ``ggml_fit_opt`` is the full-featured Python loop with the same arguments plus callbacks, learning
    rate, weight decay and a history.

    Arguments:
        sched: the Scheduler to train on; it must not serve a live opt context.
        ctx_compute: the Context holding the model graph.
        inputs: the allocated input Tensor ``[ne_datapoint, batch]``; its ne[1] is the physical batch.
        outputs: the output Tensor (it must depend on at least one ``ggml_set_param`` tensor).
        dataset: a Dataset matching inputs (and outputs, for labels); ``ndata`` a multiple of
            ``nbatch_logical``.
        loss_type: ggml's own losses only: ``ggml_opt_loss_type_mse()`` (the default), ``..._mean()``,
            ``..._sum()`` or ``..._cross_entropy()`` (on logits).
        optimizer: ``ggml_opt_optimizer_type_adamw()`` (the default) or ``..._sgd()``.
        nepoch: the number of epochs (an int >= 1, default 1).
        nbatch_logical: datapoints per optimizer step, a multiple of the physical batch (default 32);
            gradients of ``nbatch_logical / batch`` batches are accumulated.
        val_split: the fraction in [0, 1) of the logical batches, at the end of the shuffled data, used
            for validation instead of training (default 0).
        silent: True suppresses ggml's progress output (default False).

    Value: None. Raises GgmlValueError / GgmlStateError when a requirement above does not hold
    (ggml would abort).

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
    expect(isinstance(nepoch, int) and nepoch >= 1, f"{fn}: nepoch must be an int >= 1, got {nepoch!r}")
    batch = int(x.ptr.ne[1])
    expect(isinstance(nbatch_logical, int) and nbatch_logical >= 1 and nbatch_logical % batch == 0,
           f"{fn}: nbatch_logical must be a positive multiple of the physical batch ({batch}), got {nbatch_logical!r}")
    expect(dataset.ndata % nbatch_logical == 0,
           f"{fn}: ndata ({dataset.ndata}) must be a multiple of nbatch_logical ({nbatch_logical})")
    expect(isinstance(val_split, (int, float)) and 0 <= val_split < 1, f"{fn}: val_split must be in [0, 1), got {val_split!r}")
    expect(x.nelements() // batch == dataset.ne_datapoint,
           f"{fn}: inputs hold {x.nelements() // batch} values per datapoint, the dataset {dataset.ne_datapoint}")
    expect(x.ptr.data != ffi.NULL, f"{fn}: inputs must be allocated (ggml_backend_alloc_ctx_tensors)", GgmlStateError)
    if (dataset.ne_label > 0) != (loss_type in L.LABELLED_LOSSES):
        raise GgmlValueError(f"{fn}: labels are needed exactly for cross_entropy and mse")
    if dataset.ne_label > 0:
        expect(dataset.ne_label * batch == out.nelements(),
               f"{fn}: outputs hold {out.nelements() // batch} values per datapoint, the labels {dataset.ne_label}")
    check_trainable([out], accumulating=nbatch_logical > batch)
    if any(o.alive for o in sched._opt_users):
        raise GgmlStateError(f"{fn}: this scheduler serves a live opt context; ggml-opt contexts must not share one")
    # ggml_opt_fit builds its graphs in ctx_compute and never returns that memory: use a private context.
    graphs = ggml_init(3 * ggml_graph_overhead(2048, True) + 6 * 2048 * ggml_tensor_overhead(), no_alloc=True)
    try:
        lib.ggml_opt_fit(s, graphs.ptr, x.ptr, out.ptr, ds, loss_type, optimizer,
                         lib.ggml_opt_get_default_optimizer_params, nepoch, nbatch_logical, float(val_split),
                         bool(silent))
    finally:
        lib.ggml_backend_sched_reset(s)
        graphs.free()
