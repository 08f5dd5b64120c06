"""ggmlR's fit functions: arguments checked and turned into feeds, then ``loop.fit_loop``.

- ``ggml_fit_opt_gen``: batches streamed from a generator (one batch in memory at a time).
- ``ggml_fit_opt`` / ``ggml_fit_opt_multi`` / ``ggml_opt_fit_multi``: an in-memory dataset.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, ExitStack
from dataclasses import dataclass, replace
from typing import Protocol, TYPE_CHECKING

import numpy as np

from .._ffi import ffi
from ..compute.sched import Scheduler
from ..core.args import c_int_arg, is_real, learning_rate_arg, list_arg, weight_decay_arg
from ..core.handle import unwrap
from ..core.types import type_name
from ..errors import carry_history, GgmlpyWarning, GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.indices import check_indices
from ..graph.nodes import ptr_key
from ..graph.objects import as_tensor, Context, Tensor
from ..opt import losses as L
from ..opt.constants import check_optimizer, OPTIMIZER_ADAMW
from ..opt.context import OptContext
from ..opt.dataset import check_distribution_rows, datapoints_of, Dataset
from ..opt.graph_optimizer import GraphOptimizer
from ..opt.init import resolve_labels_offs
from .adapters import BatchWriter, check_ends, Source, Target
from .config import Callback, EpochPlan, StepOptions, TrainingGraph
from .loop import check_nonfinite, fit_loop, NativeRunner
from .prefetch import BatchFeed
from .runner import EpochStats, StepRunner


if TYPE_CHECKING:
    import pandas as pd


def _tensors(value: object, name: str) -> list[Tensor]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise GgmlValueError(f"{name}: expected at least one tensor")
    return [as_tensor(t, f"{name}[{i}]") for i, t in enumerate(items)]


def _opt_period(nbatch_logical: int | None, physical: int) -> int:
    if nbatch_logical is None:
        return 1
    logical = max(c_int_arg(None, "nbatch_logical", nbatch_logical, 1), physical)
    if logical % physical:
        warnings.warn(f"nbatch_logical ({logical}) is not a multiple of the physical batch ({physical}); the "
                      f"optimizer steps every {logical // physical} batches", GgmlpyWarning, stacklevel=3)
    return max(1, logical // physical)


def _check_common(sched: object, ctx_compute: object, optimizer: object, epochs_name: str, epochs: object,
                  callbacks: object, silent: object) -> None:
    unwrap(sched, Scheduler, "sched")
    unwrap(ctx_compute, Context, "ctx_compute")
    check_optimizer(optimizer)
    c_int_arg(None, epochs_name, epochs, 0)  # epoch numbers reach ggml as C ints
    if not isinstance(silent, bool):
        raise GgmlValueError(f"silent must be True or False, got {silent!r}")
    if callbacks is not None and not isinstance(callbacks, (list, tuple, dict)) and \
            not any(hasattr(callbacks, p) for p in ("on_epoch_begin", "on_epoch_end")):
        raise GgmlTypeError(f"callbacks must be a list of callbacks, got {type(callbacks).__name__}")


def ggml_fit_opt_gen(sched: Scheduler, ctx_compute: Context, inputs: Tensor | Sequence[Tensor], outputs: Tensor,
                     generator: object, steps_per_epoch: int | None = None, epochs: int = 1, initial_epoch: int = 0,
                     validation_generator: object = None, validation_steps: int | None = None,
                     loss_type: int = L.LOSS_MSE, optimizer: int = OPTIMIZER_ADAMW,
                     nbatch_logical: int | None = None, callbacks: Sequence[Callback] | None = None,
                     silent: bool = False, loss_mask_ne0: int | None = None, weight_decay: float = 0,
                     prefetch: int = 0, learning_rate: float | None = None, on_nonfinite: str = "raise") \
        -> pd.DataFrame:
    """Train from a generator, one batch at a time: the streaming counterpart of ``ggml_fit_opt``.

    Instead of a dataset holding every sample, batches are pulled from a source, so only the current
    batch is in memory: data larger than RAM, augmentation that differs per epoch, and generated
    sources (simulators, RL rollouts) that have no fixed dataset.

    The source contract. ``generator`` (and ``validation_generator``) may be
    (1) a callable of no arguments returning one batch per call and None to end the epoch (ggmlR's
    contract: a finite one must reset itself before returning None, so the next call starts over);
    (2) a generator function, called once per epoch; (3) a re-iterable such as a list of batches or a
    ``torch.utils.data.DataLoader``, iterated once per epoch; (4) a one-shot iterator, consumed
    across epochs; or (5) an object with Keras' ``PyDataset`` protocol: ``len(obj)`` batches ``obj[0]``,
    ``obj[1]``, ... per epoch, each epoch from batch 0, and ``on_epoch_end()`` (``on_epoch_begin()``) after
    (before) every epoch. A batch is ``(x, y)``, or ``{"inputs": [x1, ...], "labels": [y1, ...], "weights": w}``
    (a bare array stands for a one-element list; ``"weights"`` for weighted MSE); for loss types
    without labels (mean, sum) ``x`` or ``(x,)``. Each element is an array already in ggml layout holding
    exactly one physical batch: for a tensor ``[F, N]`` an ``(N, F)`` array (or 1-D of ``F * N``
    values). An epoch whose first request yields no batch warns and stops training; one that ends
    before ``steps_per_epoch`` warns and is closed early. Validation runs forward only on its own
    opt context after each epoch and never changes training. An exception from the generator
    propagates unchanged after every C resource of the fit is released.

    Arguments:
        sched: the Scheduler to train on (``ggml_backend_sched_new``); it must not serve another live
            opt context.
        ctx_compute: [glossary]
        inputs: the input Tensor of the graph (allocated), or a list of them for several inputs:
            ``inputs[i]`` receives the batch's ``i``-th input.
        outputs: the output Tensor the loss is computed from.
        generator: the training source (see above).
        steps_per_epoch: batches per epoch (a positive int), or None (the default) to run each epoch
            until the source ends. Needed for an endless source; with it the next epoch continues the
            same source. A source that certainly never ends (a ``while True:`` generator without
            break/return/raise, ``itertools.cycle``/``count``/``repeat``) is refused without it
            (GgmlValueError); any other first epoch that runs a minute without ending warns once.
        epochs: the number of epochs to run (an int >= 0, default 1).
        initial_epoch: the number of epochs already done (default 0): epochs are numbered
            ``initial_epoch + 1 .. initial_epoch + epochs`` in the history, callbacks and schedules.
            It does not restore optimizer state (a warm restart, as in Keras).
        validation_generator: an optional source of validation batches, same contract (default None).
        validation_steps: validation batches per epoch, or None (the default: until that source ends). Each
            epoch validates from the source's beginning where it can start again (a list or other
            re-iterable, a generator function, a PyDataset: Keras' rule); an iterator continues where it was.
        loss_type: a loss type constant (default ``ggml_opt_loss_type_mse()``). Cross-entropy takes
            logits (no softmax at the end of the graph); binary cross-entropy takes probabilities
            (a sigmoid at the end); MSE, MAE, Huber take any outputs.
        optimizer: [glossary]
        nbatch_logical: samples per optimizer step, for gradient accumulation: None (the default)
            steps after every batch; a multiple of the physical batch steps every
            ``nbatch_logical // batch`` batches (the count carries across epochs; a non-multiple warns).
        loss_mask_ne0: for weighted MSE, the width of each weight row: 1 (one weight per sample; the
            default when None) or the outputs' ne[0] (one per element, a mask).
        callbacks: a list of callbacks (default None: none): dicts with ``"on_epoch_begin"`` /
            ``"on_epoch_end"`` functions or objects with those methods, each called as
            ``f(epoch, logs, state)``; a value put in ``logs`` under a new key reaches the later callbacks
            and the history (Keras' way of adding a metric); ``state.stop = True`` stops training,
            ``state.lr_ud`` is the handle for ``ggml_opt_set_lr``. Built-ins: ``ggml_callback_early_stopping``,
            ``ggml_schedule_step_decay``, ``ggml_schedule_cosine_decay``, ``ggml_schedule_reduce_on_plateau``.
        silent: [glossary]
        weight_decay: [glossary]
        learning_rate: the starting learning rate of the optimizer, a number > 0 (default None: ggml's
            1e-3); schedules and ``ggml_opt_set_lr`` change it later.
        on_nonfinite: what a NaN/inf training loss does at the end of an epoch: ``"raise"`` (the default)
            stops with a GgmlValueError naming the usual causes; ``"warn"`` only warns and trains on.
        prefetch: read up to this many batches ahead in a background thread (default 0: none), to
            overlap a slow source with training. The thread is a daemon, stopped and joined when training
            ends; on an error or Ctrl-C a source it is inside is abandoned (stopped at its next Python
            instruction; one blocked in a C call ends its thread as soon as the call returns).

    Value: a pandas DataFrame, one row per completed epoch, columns ``epoch, train_loss,
    train_accuracy, val_loss, val_accuracy, steps`` (NaN where not computed; accuracy for
    cross-entropy only). An exception raised during training (Ctrl-C included) carries the rows of the
    completed epochs as its ``.history``; the trained weights stay in the model's tensors.

    Example:
        >>> def batches():                               # a generator function: one call per epoch
        ...     for i in range(0, len(x_train) - 31, 32):     # whole batches: x holds exactly 32 samples
        ...         yield x_train[i:i + 32], y_train[i:i + 32]
        >>> hist = ggml_fit_opt_gen(sched, ctx, x, logits, batches, epochs=5,
        ...                         loss_type=ggml_opt_loss_type_cross_entropy(), learning_rate=1e-3)
    """
    _check_common(sched, ctx_compute, optimizer, "epochs", epochs, callbacks, silent)
    ins = _tensors(inputs, "inputs")
    for i, t in enumerate(ins):
        if any(t.ptr == u.ptr for u in ins[:i]):
            raise GgmlValueError(f"inputs[{i}] is inputs[{[u.ptr for u in ins].index(t.ptr)}] again: each input of a "
                                 "batch is written into its own tensor, so one would overwrite the other; list each "
                                 "input tensor once")
    if isinstance(outputs, (list, tuple)):
        raise GgmlTypeError("ggml_fit_opt_gen trains one output tensor (as ggmlR's does); several heads train with "
                            "ggml_fit_opt_multi (a dataset), or streamed with ggml_fit_generator on a multi-output "
                            "model of the model layer")
    out = as_tensor(outputs, "outputs")
    L.check_loss_type(loss_type)
    steps_per_epoch = None if steps_per_epoch is None else c_int_arg(None, "steps_per_epoch", steps_per_epoch, 1)
    validation_steps = None if validation_steps is None else c_int_arg(None, "validation_steps", validation_steps, 1)
    initial_epoch = c_int_arg(None, "initial_epoch", initial_epoch, 0)
    prefetch = c_int_arg(None, "prefetch", prefetch, 0)
    weight_decay_arg(weight_decay)
    check_nonfinite(on_nonfinite)
    train_source = Source(generator, "generator")
    val_source = Source(validation_generator, "validation_generator", restart=True) \
        if validation_generator is not None else None
    for i, t in enumerate(ins):
        if t.ptr.data == ffi.NULL:
            raise GgmlStateError(f"inputs[{i}] is not allocated: allocate its context with "
                                 "ggml_backend_alloc_ctx_tensors before training")
    period = _opt_period(nbatch_logical, L.physical_batch(ins[0]))
    if loss_type == L.LOSS_WEIGHTED_MSE and loss_mask_ne0 is None:
        loss_mask_ne0 = 1
    graph = TrainingGraph(sched, ctx_compute, ins, [out], [loss_type], loss_mask_ne0=loss_mask_ne0)
    rate = None if learning_rate is None else learning_rate_arg("learning_rate", learning_rate)
    step = StepOptions(optimizer, period, weight_decay, rate)
    plan = EpochPlan(epochs, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                     validation_steps=validation_steps, callbacks=callbacks, silent=silent, prefetch=prefetch,
                     on_nonfinite=on_nonfinite)
    return fit_streamed(lambda: NativeRunner(graph, step, with_validation=val_source is not None), plan, train_source,
                        val_source)


class KeptState(Protocol):
    """The model layer's optimizer state, held for a whole fit: ``begin(who, fn)`` and ``end(lease)`` (one
    training session at a time), ``restore(ctx)`` before the first step, ``keep(ctx)`` after the last one."""
    def begin(self, who: str, fn: str | None = None) -> object: ...
    def end(self, lease: object) -> None: ...
    def restore(self, opt_ctx: OptContext | GraphOptimizer) -> None: ...
    def keep(self, opt_ctx: OptContext | GraphOptimizer) -> None: ...


def fit_streamed(make_runner: Callable[[], StepRunner], plan: EpochPlan, train_source: Source,
                 val_source: Source | None = None, *, validate: Callable[[], EpochStats] | None = None,
                 opt_state: KeptState | None = None) -> pd.DataFrame:
    """The streaming fit behind ``ggml_fit_opt_gen`` and the model layer's ``ggml_fit``/``ggml_fit_generator``:
    arguments already checked; ``make_runner()`` makes the fit's ``runner.StepRunner`` (ggml-opt's step for the
    low-level functions; the model layer's for a compiled model), whose steps the one loop feeds from the sources,
    and every C resource is released on the way out. ``validate`` replaces ``val_source`` (the model layer
    validates on its inference graph; see ``training.config`` for the graph, step and epoch options).
    ``opt_state`` (the model layer's optimizer state) is held for the whole fit (``begin``/``end``: a second
    training run on the same model is refused), gets ``restore(runner.state)`` before the first step and
    ``keep(runner.state)`` after the last one, also when training ends in an exception."""
    check_ends(train_source, plan.steps_per_epoch, "steps_per_epoch")
    if val_source is not None:
        check_ends(val_source, plan.validation_steps, "validation_steps")
    history = None
    try:
        # unwound last to first: the feeds (their prefetch threads) stop, the optimizer state is kept, the runner
        # frees its C objects, the fit lets the model go; each also when one before it failed
        with ExitStack() as cleanup:
            if opt_state is not None:  # one training run per model at a time
                cleanup.callback(opt_state.end, opt_state.begin("a ggml_fit under way", "ggml_fit"))
            runner = make_runner()
            cleanup.callback(runner.close)
            if opt_state is not None:
                opt_state.restore(runner.state)
                cleanup.callback(opt_state.keep, runner.state)  # what the completed steps did
            train_feed = cleanup.enter_context(closing(BatchFeed(train_source, runner.writer(train_source.name, True),
                                                                 plan.prefetch)))
            val_feed = None if val_source is None else cleanup.enter_context(closing(BatchFeed(
                val_source, runner.writer(val_source.name, False), plan.prefetch)))
            history = fit_loop(runner, train_feed, val_feed, plan, source_name=train_source.name, validate=validate)
            return history
    except BaseException as exc:  # a cleanup that fails after the loop (a lost RPC server, -W error): keep the epochs
        carried = history
        cause: BaseException | None = exc.__context__
        while carried is None and cause is not None:   # several cleanups may fail in turn: the loop's is deepest
            carried, cause = getattr(cause, "history", None), cause.__context__
        if carried is not None and getattr(exc, "history", None) is None:
            carry_history(exc, carried)
        raise


# ---------------------------------------------------------------- the dataset path

class DatasetFeed:
    """Batches of a dataset's rows [start, stop), written straight from its host memory."""

    def __init__(self, dataset: Dataset, writer: BatchWriter, start: int, stop: int, batch: int,
                 labels_offs: list[int]) -> None:
        self.ds, self.writer, self.start, self.batch = dataset, writer, start, batch
        self.n_batches = (stop - start) // batch
        self.labels_offs = labels_offs

    def epoch(self, limit: int | None) -> Iterator[list[tuple[Target, np.ndarray]]]:
        data, labels = self.ds.rows(self.ds.data), self.ds.rows(self.ds.labels)
        weights = self.ds.rows(self.ds.sample_weights)
        w = self.writer
        for i in range(self.n_batches if limit is None else min(limit, self.n_batches)):
            rows = slice(self.start + i * self.batch, self.start + (i + 1) * self.batch)
            pairs = [(w.inputs[0], data[rows].reshape(-1))]
            for target, off in zip(w.labels, self.labels_offs):
                assert labels is not None  # the writer has label targets for a dataset with labels
                width = target.count // self.batch
                pairs.append((target, _columns(labels, rows, off, width, target)))
            for target in w.weights:
                assert weights is not None  # and weight targets for one with sample weights
                pairs.append((target, _columns(weights, rows, 0, target.count // self.batch, target)))
            yield pairs

    def close(self) -> None:
        pass


def _columns(host: np.ndarray, rows: slice, off: int, width: int, target: Target) -> np.ndarray:
    block = host[rows, off:off + width]
    return np.ascontiguousarray(block, dtype=target.dtype).reshape(-1)


@dataclass(frozen=True)
class DatasetUse:
    """How a dataset fit reads its dataset: the logical batch, the validation split, shuffling, and where
    each head's labels start."""
    nbatch_logical: int
    val_split: float
    shuffle: bool
    shuffle_all: bool
    labels_offs: Sequence[int] | None = None


def _dataset_fit(graph: TrainingGraph, step: StepOptions, plan: EpochPlan, dataset: Dataset,
                 use: DatasetUse) -> pd.DataFrame:
    """The in-memory dataset path of ``ggml_fit_opt``/``ggml_fit_opt_multi``: ``graph.inputs`` is the one
    inputs tensor; ``step.period`` is worked out here from the dataset and ``use.nbatch_logical``."""
    inputs, loss_types, head_names = graph.inputs, graph.loss_types, graph.head_names
    val_split, shuffle, shuffle_all, labels_offs = use.val_split, use.shuffle, use.shuffle_all, use.labels_offs
    unwrap(dataset, Dataset, "dataset")
    ds = dataset
    x = as_tensor(inputs[0], "inputs")
    if not is_real(val_split) or not 0 <= val_split < 1:
        raise GgmlValueError(f"val_split must be a number in [0, 1), got {val_split!r}")
    if x.type != ds.data.type:
        raise GgmlTypeError(f"the dataset holds {type_name(ds.data.type)} data, the inputs tensor is "
                            f"{type_name(x.type)}; they must match")
    physical = datapoints_of(x, ds.ne_datapoint, "the inputs tensor")
    ndata = ds.ndata
    if ndata % physical:
        raise GgmlValueError(f"the dataset's {ndata} datapoints are not a multiple of the physical batch {physical}")
    logical = max(c_int_arg(None, "nbatch_logical", use.nbatch_logical, 1), physical)
    period = max(1, logical // physical)
    n_logical = ndata // logical
    idata_split = min(math.floor((1 - val_split) * n_logical) * period * physical, ndata)
    if idata_split == 0:
        raise GgmlValueError(f"no training batch: the dataset's {ndata} datapoints make {n_logical} logical batches "
                             f"of {logical} (nbatch_logical), and val_split={val_split} leaves none of them for "
                             "training; lower nbatch_logical or val_split, or add data")
    needs_labels = any(t in L.LABELLED_LOSSES for t in loss_types)
    if needs_labels and ds.labels is None:
        raise GgmlValueError("the loss needs labels but the dataset has none (ne_label = 0)")
    if loss_types == [L.LOSS_CROSS_ENTROPY]:
        check_distribution_rows(ds, "ggml_fit_opt")
    graph = replace(graph, inputs=[x], loss_mask_ne0=_weight_width(ds, loss_types))
    runner = NativeRunner(graph, replace(step, period=period), with_validation=val_split > 0)
    try:
        bound = runner.index_bounds.get(ptr_key(x.ptr))
        if bound is not None:  # row indices for ggml_get_rows: check the whole dataset once
            check_indices(ds.rows(ds.data), bound, "the dataset's data")
        offs = resolve_labels_offs(runner.train_ctx.heads, labels_offs)
        widths = [h.outputs.nelements() // physical for h in runner.train_ctx.heads
                  if h.loss_type in L.LABELLED_LOSSES]
        labelled_offs = [o for o, h in zip(offs, runner.train_ctx.heads) if h.loss_type in L.LABELLED_LOSSES]
        if head_names is None and widths and widths[0] != ds.ne_label:  # one head: the labels are its outputs
            raise GgmlValueError(f"the outputs hold {widths[0]} values per datapoint, the dataset's labels "
                                 f"{ds.ne_label} (ne_label); a label per output value is needed: build the dataset "
                                 f"with ne_label={widths[0]}, or the model with outputs of {ds.ne_label} per datapoint")
        for o, w in zip(labelled_offs, widths):
            if o + w > ds.ne_label:
                raise GgmlValueError(f"head labels [{o}, {o + w}) fall outside the dataset's {ds.ne_label} label "
                                     "columns; check labels_offs")
        train_feed = DatasetFeed(ds, runner.writer("dataset", True), 0, idata_split, physical, labelled_offs)
        val_feed = DatasetFeed(ds, runner.writer("dataset", False), idata_split, ndata, physical, labelled_offs) \
            if val_split > 0 else None
        rng = runner.train_ctx.rng
        if shuffle_all and logical < ndata:
            ds.shuffle(rng, -1)

        def before_epoch(epoch: int) -> None:
            if shuffle and logical < idata_split:
                ds.shuffle(rng, idata_split - idata_split % ds.ndata_shard)

        return fit_loop(runner, train_feed, val_feed, replace(plan, stream=False), source_name="dataset",
                        before_epoch=before_epoch)
    finally:
        runner.close()


def _weight_width(ds: Dataset, loss_types: list[int]) -> int | None:
    if L.LOSS_WEIGHTED_MSE not in loss_types:
        return None
    return ds.weights(ds.sample_weights.shape[0] if ds.sample_weights is not None else 1).shape[0]


def ggml_fit_opt(sched: Scheduler, ctx_compute: Context, inputs: Tensor, outputs: Tensor, dataset: Dataset,
                 loss_type: int = L.LOSS_MSE, optimizer: int = OPTIMIZER_ADAMW, nepoch: int = 10,
                 nbatch_logical: int = 32, val_split: float = 0, shuffle: bool = True, shuffle_all: bool | None = None,
                 callbacks: Sequence[Callback] | None = None, silent: bool = False, weight_decay: float = 0,
                 learning_rate: float | None = None, on_nonfinite: str = "raise") -> pd.DataFrame:
    """Train on an in-memory dataset (``ggml_opt_dataset_init``), with callbacks and a history.

    The full-featured Python counterpart of ggml's C loop ``ggml_opt_fit``. The physical batch is the
    inputs tensor's element count over ``ne_datapoint``; ``ndata`` must be a multiple of it. The last
    ``val_split`` of the logical batches of the (once shuffled) data validates instead of training,
    forward only, on an opt context of its own: validation never changes the weights. For data that
    does not fit in memory use ``ggml_fit_opt_gen``.

    Arguments:
        sched: the Scheduler to train on; it must not serve another live opt context.
        ctx_compute: [glossary]
        inputs: the allocated input Tensor; its type must be the dataset's data type.
        outputs: the output Tensor the loss is computed from.
        dataset: a Dataset with the data (and labels, for losses that need them).
        loss_type: a loss type constant (default ``ggml_opt_loss_type_mse()``). Cross-entropy takes
            logits (no softmax at the end of the graph); binary cross-entropy takes probabilities;
            weighted MSE reads ``ggml_opt_dataset_weights``.
        optimizer: [glossary]
        nepoch: the number of epochs (an int >= 0, default 10).
        nbatch_logical: samples per optimizer step (default 32; raised to the physical batch when
            smaller): gradients of ``nbatch_logical // batch`` batches are accumulated per step.
        val_split: [glossary]
        shuffle: reshuffle the training part before every epoch (default True).
        shuffle_all: shuffle the whole dataset once before training, so the validation part is a random
            sample (default None: the value of ``shuffle``).
        callbacks: a list of callbacks (default None: none): dicts with ``"on_epoch_begin"`` /
            ``"on_epoch_end"`` functions or objects with those methods, each called as
            ``f(epoch, logs, state)``; a value put in ``logs`` under a new key reaches the later callbacks
            and the history (Keras' way of adding a metric); ``state.stop = True`` stops training,
            ``state.lr_ud`` is the handle for ``ggml_opt_set_lr``. Built-ins: ``ggml_callback_early_stopping``,
            ``ggml_schedule_step_decay``, ``ggml_schedule_cosine_decay``, ``ggml_schedule_reduce_on_plateau``.
        silent: [glossary]
        weight_decay: [glossary]
        learning_rate: the starting learning rate of the optimizer, a number > 0 (default None: ggml's
            1e-3); schedules and ``ggml_opt_set_lr`` change it later.
        on_nonfinite: what a NaN/inf training loss does at the end of an epoch: ``"raise"`` (the default)
            stops with a GgmlValueError naming the usual causes; ``"warn"`` only warns and trains on.

    Value: a pandas DataFrame, one row per completed epoch, columns ``epoch, train_loss,
    train_accuracy, val_loss, val_accuracy`` (NaN where not computed; accuracy for cross-entropy
    only). An exception raised during training carries the completed rows as its ``.history``.

    Example:
        >>> ds = ggml_opt_dataset_init(GGML_TYPE_F32, GGML_TYPE_F32, 784, 10, 60000)
        >>> hist = ggml_fit_opt(sched, ctx, x, logits, ds, ggml_opt_loss_type_cross_entropy(),
        ...                     nepoch=5, nbatch_logical=64, val_split=0.1)
    """
    _check_common(sched, ctx_compute, optimizer, "nepoch", nepoch, callbacks, silent)
    L.check_loss_type(loss_type)
    check_nonfinite(on_nonfinite)
    graph = TrainingGraph(sched, ctx_compute, [inputs], [as_tensor(outputs, "outputs")], [loss_type])
    rate = None if learning_rate is None else learning_rate_arg("learning_rate", learning_rate)
    step = StepOptions(optimizer, weight_decay=weight_decay, learning_rate=rate)
    plan = EpochPlan(nepoch, callbacks=callbacks, silent=silent, stream=False, on_nonfinite=on_nonfinite)
    use = DatasetUse(nbatch_logical, val_split, bool(shuffle), bool(shuffle if shuffle_all is None else shuffle_all))
    return _dataset_fit(graph, step, plan, dataset, use)


def ggml_fit_opt_multi(sched: Scheduler, ctx_compute: Context, inputs: Tensor, outputs: Sequence[Tensor],
                       dataset: Dataset, loss_types: int | Sequence[int], loss_weights: Sequence[float] | None = None,
                       labels_offs: Sequence[int] | None = None, head_names: Sequence[str] | None = None,
                       optimizer: int = OPTIMIZER_ADAMW, nepoch: int = 10, nbatch_logical: int = 32,
                       val_split: float = 0, shuffle: bool = True, shuffle_all: bool | None = None,
                       callbacks: Sequence[Callback] | None = None, silent: bool = False,
                       weight_decay: float = 0, learning_rate: float | None = None,
                       on_nonfinite: str = "raise") -> pd.DataFrame:
    """Train several output heads on one in-memory dataset, with callbacks and a history.

    The total loss is ``sum_i loss_weights[i] * loss_i``, each head's loss a mean over its output
    elements. Each label row of the dataset holds the heads' labels side by side; ``labels_offs`` says
    where each head's columns start. Otherwise as ``ggml_fit_opt`` (validation split, shuffling,
    gradient accumulation).

    Arguments:
        sched: the Scheduler to train on.
        ctx_compute: [glossary]
        inputs: the allocated input Tensor.
        outputs: a list of output Tensors, one per head, all with the same batch size.
        dataset: a Dataset whose label rows hold every head's labels.
        loss_types: one loss type constant per head (SUM cannot be mixed with the others).
        loss_weights: one weight (a number >= 0) per head, or None (the default: all 1).
        labels_offs: the 0-based label column where each head's labels start, or None (the default:
            heads back to back in the order of ``outputs``).
        head_names: distinct non-empty names, one per head, or None (``head_1``, ``head_2``, ...);
            they name the per-head columns and callback log keys.
        optimizer: [glossary]
        nepoch: the number of epochs (default 10).
        nbatch_logical: samples per optimizer step (default 32).
        val_split: [glossary]
        shuffle: reshuffle the training part before every epoch (default True).
        shuffle_all: shuffle the whole dataset once first (default None: the value of ``shuffle``).
        callbacks: a list of callbacks (default None: none): dicts with ``"on_epoch_begin"`` /
            ``"on_epoch_end"`` functions or objects with those methods, each called as
            ``f(epoch, logs, state)``; a value put in ``logs`` under a new key reaches the later callbacks
            and the history (Keras' way of adding a metric); ``state.stop = True`` stops training,
            ``state.lr_ud`` is the handle for ``ggml_opt_set_lr``. Built-ins: ``ggml_callback_early_stopping``,
            ``ggml_schedule_step_decay``, ``ggml_schedule_cosine_decay``, ``ggml_schedule_reduce_on_plateau``.
        silent: [glossary]
        weight_decay: [glossary]
        learning_rate: the starting learning rate of the optimizer, a number > 0 (default None: ggml's
            1e-3); schedules and ``ggml_opt_set_lr`` change it later.
        on_nonfinite: what a NaN/inf training loss does at the end of an epoch: ``"raise"`` (the default)
            stops with a GgmlValueError naming the usual causes; ``"warn"`` only warns and trains on.

    Value: the history DataFrame of ``ggml_fit_opt`` (total loss; accuracy averaged over the
    cross-entropy heads). Its ``attrs`` hold ``head_loss``, ``head_accuracy``, ``val_head_loss``,
    ``val_head_accuracy`` (DataFrames, one column per head) and ``head_names``; callbacks see
    ``train_<head>_loss``, ``val_<head>_accuracy`` etc.

    Example:
        >>> hist = ggml_fit_opt_multi(sched, ctx, x, [logits, box], ds,
        ...     [ggml_opt_loss_type_cross_entropy(), ggml_opt_loss_type_mse()], [1.0, 0.5],
        ...     head_names=["cls", "box"], nepoch=5)
        >>> hist.attrs["head_loss"]
    """
    _check_common(sched, ctx_compute, optimizer, "nepoch", nepoch, callbacks, silent)
    outs = _tensors(outputs, "outputs")
    n = len(outs)
    given: list[object] = list(loss_types) if isinstance(loss_types, (list, tuple)) else [loss_types]
    weights = [1.0] * n if loss_weights is None else list_arg("ggml_fit_opt_multi", "loss_weights", loss_weights,
                                                              "numbers, one per head")
    for name, values in (("loss_types", given), ("loss_weights", weights)):
        if len(values) != n:
            raise GgmlValueError(f"{name} has {len(values)} entries, expected {n} (one per head)")
    types = [L.check_loss_type(t, f"loss_types[{i}]") for i, t in enumerate(given)]
    names = [f"head_{i + 1}" for i in range(n)] if head_names is None else \
        list_arg("ggml_fit_opt_multi", "head_names", head_names, "str, one per head")
    if len(names) != n or any(not isinstance(x, str) or not x for x in names) or len(set(names)) != n:
        raise GgmlValueError(f"head_names must be {n} distinct non-empty strings, got {head_names!r}")
    check_nonfinite(on_nonfinite)
    graph = TrainingGraph(sched, ctx_compute, [inputs], outs, types, weights, head_names=names)
    rate = None if learning_rate is None else learning_rate_arg("learning_rate", learning_rate)
    step = StepOptions(optimizer, weight_decay=weight_decay, learning_rate=rate)
    plan = EpochPlan(nepoch, callbacks=callbacks, silent=silent, stream=False, on_nonfinite=on_nonfinite)
    use = DatasetUse(nbatch_logical, val_split, bool(shuffle), bool(shuffle if shuffle_all is None else shuffle_all),
                     labels_offs)
    return _dataset_fit(graph, step, plan, dataset, use)


def ggml_opt_fit_multi(sched: Scheduler, ctx_compute: Context, inputs: Tensor, outputs: Sequence[Tensor],
                       dataset: Dataset, loss_types: int | Sequence[int], loss_weights: Sequence[float] | None = None,
                       labels_offs: Sequence[int] | None = None, optimizer: int = OPTIMIZER_ADAMW, nepoch: int = 1,
                       nbatch_logical: int = 32, val_split: float = 0, silent: bool = False) -> dict:
    """ggmlR's thin multi-head wrapper of ``ggml_fit_opt_multi``: no callbacks, one initial shuffle.

    The dataset is shuffled once before training, not between epochs; there are no callbacks,
    learning-rate or weight-decay settings (AdamW lr 1e-3).

    Arguments:
        sched: the Scheduler to train on.
        ctx_compute: [glossary]
        inputs: the allocated input Tensor.
        outputs: a list of output Tensors, one per head.
        dataset: a Dataset whose label rows hold every head's labels side by side.
        loss_types: one loss type constant per head.
        loss_weights: one weight per head, or None (the default: all 1).
        labels_offs: the 0-based label column where each head's labels start, or None (back to back).
        optimizer: [glossary]
        nepoch: the number of epochs (default 1).
        nbatch_logical: samples per optimizer step (default 32).
        val_split: [glossary]
        silent: True suppresses progress output (default False).

    Value: a dict of numpy arrays: ``train_loss``, ``train_accuracy``, ``val_loss``, ``val_accuracy``
    (one value per epoch) and ``head_loss``, ``head_accuracy`` (epochs x heads).

    Example:
        >>> r = ggml_opt_fit_multi(sched, ctx, x, [logits, box], ds,
        ...     [ggml_opt_loss_type_cross_entropy(), ggml_opt_loss_type_mse()], nepoch=3)
        >>> r["head_loss"][-1]
    """
    h = ggml_fit_opt_multi(sched, ctx_compute, inputs, outputs, dataset, loss_types, loss_weights, labels_offs,
                           None, optimizer, nepoch, nbatch_logical, val_split, shuffle=False, shuffle_all=True,
                           silent=silent)
    return {"train_loss": h["train_loss"].to_numpy(), "train_accuracy": h["train_accuracy"].to_numpy(),
            "val_loss": h["val_loss"].to_numpy(), "val_accuracy": h["val_accuracy"].to_numpy(),
            "head_loss": h.attrs["head_loss"].to_numpy(), "head_accuracy": h.attrs["head_accuracy"].to_numpy()}
