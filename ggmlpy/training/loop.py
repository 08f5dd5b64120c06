"""The one training loop behind ggml_fit_opt, ggml_fit_opt_multi, ggml_fit_opt_gen and the model layer's fits
(``fit_loop``, over any ``runner.StepRunner``), and ggml-opt's own step (``NativeRunner``).

A ``NativeRunner`` owns the C objects of one fit: the training opt context (on the user's
scheduler) and, when there is validation, a forward-only opt context on a scheduler of
its own. Validation therefore never advances the training context's accumulation
counter, and a run with validation ends with exactly the weights of the same run
without it (ggml-internals §1.6). Per step: ``ggml_opt_alloc`` -> write the batch ->
``ggml_opt_eval``; ggml's result object keeps the per-epoch statistics in C.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .._ffi import lib
from ..compute.placement import is_host_backend, Placement, PlacementRecorder, warn_if_host_ops
from ..compute.staging import Reads, Uploads
from ..compute.threads import restore_threads, split_threads, ThreadTuner, training_step_work
from ..core.args import is_real, weight_decay_arg
from ..core.handle import Handle, InterruptGuard, Lifetime, using
from ..errors import carry_history, GgmlpyWarning, GgmlStateError, GgmlValueError
from ..graph.graph import walk_graph
from ..graph.indices import index_bounds
from ..graph.nodes import ptr_key, tensor_label
from ..graph.objects import Tensor
from ..opt import losses as L
from ..opt import result as R
from ..opt.constants import BUILD_FORWARD, BUILD_GRAD, BUILD_OPT, OPTIMIZER_SGD
from ..opt.context import OptContext
from ..opt.init import opt_init
from ..opt.params import LrUserdata
from .adapters import BatchWriter, Target
from .callbacks import CallbackList, FitState
from .config import EpochPlan, StepHook, StepOptions, TrainingGraph
from .progress import EpochProgress, say, summary_line
from .runner import EpochStats, Feed, opt_result_loss, Owned, Result, run_epoch, StepRunner, Watch


if TYPE_CHECKING:
    import pandas as pd



HISTORY_COLUMNS = ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy"]


def _check_connected(inputs: list[Tensor], outputs: list[Tensor]) -> None:
    """Every input must feed the outputs: data written into an input they do not read would train nothing."""
    reached = {ptr_key(t) for t in walk_graph(o.ptr for o in outputs)}
    for i, t in enumerate(inputs):
        if ptr_key(t.ptr) not in reached:
            raise GgmlValueError(f"the outputs do not depend on inputs[{i}] ({tensor_label(t.ptr)}): training "
                                 "would ignore its data; build the outputs from it (or pass the tensor they read)")


class NativeRunner:
    """ggml-opt's own step (a ``runner.StepRunner``): the C objects of one fit (or of one ``ggml_trainer``), the
    training opt context on the graph's scheduler and, ``with_validation``, a forward-only one on a scheduler of
    its own; the thread split for the graph. ``owned``: more handles the runner frees when it closes (the graph's
    scheduler and contexts, when it was built for the runner). ``close()`` releases them all."""

    def __init__(self, graph: TrainingGraph, step: StepOptions, with_validation: bool = False,
                 owned: Sequence[Owned] = ()) -> None:
        sched, ctx_compute, inputs, outputs = graph.sched, graph.ctx_compute, graph.inputs, graph.outputs
        loss_types, loss_weights, loss_mask_ne0 = graph.loss_types, graph.loss_weights, graph.loss_mask_ne0
        optimizer, opt_period, sample_weighted = step.optimizer, step.period, graph.sample_weighted
        self.graph, self.options = graph, step
        _check_connected(inputs, outputs)
        self._owned: list[Handle] = []
        self._uploads_by: dict[bool, Uploads] = {}   # pinned slots of the training and the validation batches
        self._metrics_read: Reads | None = None        # and of the outputs the compiled metrics read
        self._parity = 0                               # the set of upload slots the last step used
        self._pending: tuple | None = None             # a step submitted and not yet waited for (``drain``)
        self._also_owned: list[Owned] = list(owned)  # freed last, in reverse
        self._threads_before: list = []
        self.guard = InterruptGuard()  # installed by fit_loop: holds Ctrl-C back inside a step
        self.hooks: list[StepHook] = list(step.hooks)
        self.inputs, self.outputs = inputs, outputs
        self.multi = len(outputs) > 1
        # the multi loop reports each head, also a single one
        self.per_head = graph.head_names is not None or self.multi
        self.lr_ud = LrUserdata(weight_decay_arg(step.weight_decay))
        if step.learning_rate is not None:
            self.lr_ud.set(adamw_lr=step.learning_rate, sgd_lr=step.learning_rate)
        if step.adam is not None:
            self.lr_ud.params.adamw.beta1, self.lr_ud.params.adamw.beta2, self.lr_ud.params.adamw.eps = step.adam
        heads_arg = loss_types if self.multi else loss_types[0]
        outputs_arg = outputs if self.multi else outputs[0]
        # side outputs (a model's state updated in the graph) are computed by training steps only
        self.train_ctx: OptContext = opt_init(sched, heads_arg, optimizer, opt_period, ctx_compute, inputs[0],
                                              outputs_arg, BUILD_GRAD if step.gradients_only else BUILD_OPT,
                                              self.lr_ud, loss_mask_ne0, loss_weights, sample_weighted,
                                              list(graph.side_outputs), graph.penalties, step.metrics)
        self._owned.append(self.train_ctx)
        # the compiled metrics summed on the device, read once per epoch (None: their outputs are read every step)
        self.tally = self.train_ctx.tally
        try:
            self.eval_ctx: OptContext | None = None
            if with_validation:
                eval_sched = sched.sibling()  # ggml-opt contexts must not share a scheduler
                self._owned.append(eval_sched)
                self.eval_ctx = opt_init(eval_sched, heads_arg, optimizer, opt_period, ctx_compute, inputs[0],
                                            outputs_arg, BUILD_FORWARD, None, loss_mask_ne0, loss_weights,
                                            sample_weighted, (), graph.penalties)
                self._owned.append(self.eval_ctx)
        except BaseException:
            self.close()  # a half-built trainer must not keep the scheduler busy
            raise
        # The CPU/BLAS thread split for this graph
        self._work = training_step_work(outputs, opt_period)
        self._threads_before = split_threads(sched.backends, self._work)
        self.threads = ThreadTuner(sched.backends)  # on shared cores, one thread may be faster: timed
        self.batch_size = step.batch_size or L.physical_batch(inputs[0])  # samples per step (for samples/s)
        # the first training step on a device is watched (fit_loop puts what it saw in the history's attrs)
        self.watch_first_step = not is_host_backend(sched.backends[0])
        self.placement: Placement | None = None
        self.index_bounds = index_bounds(inputs, outputs)

    @property
    def state(self) -> OptContext:
        """Where the model's optimizer state is read and written: the training opt context."""
        return self.train_ctx

    def split_threads(self) -> list:
        """Give the graph's CPU backends the threads of its step again (a prediction in between may have changed
        them); returns what ``compute.threads.restore_threads`` puts back."""
        return split_threads(self.graph.sched.backends, self._work)

    def opt_ctx(self, train: bool) -> OptContext:
        """The opt context of the training steps, or of the validation steps of a runner made with them."""
        ctx = self.train_ctx if train else self.eval_ctx
        if ctx is None:
            raise GgmlStateError("internal: validation steps on a runner made without them; please report it")
        return ctx

    def _targets(self, train: bool) -> tuple[list[Tensor], list[Tensor], list[bool]]:
        """What a batch writes besides the inputs, on the training or validation context: the heads' labels, the
        heads' sample weights, and which labels are a cross-entropy's."""
        ctx = self.opt_ctx(train)
        labelled = [i for i in range(ctx.n_heads) if ctx.labels(i) is not None]
        labels = [t for t in (ctx.labels(i) for i in labelled) if t is not None]  # all of them
        cross_entropy = [ctx.heads[i].loss_type == L.LOSS_CROSS_ENTROPY for i in labelled]
        heads = ctx.loss.heads if ctx.loss is not None and ctx.loss.composite else []
        return labels, [h.weights for h in heads if h.weights is not None], cross_entropy

    def writer(self, name: str, train: bool) -> BatchWriter:
        labels, weights, cross_entropy = self._targets(train)
        return BatchWriter(name, self.inputs, labels, weights, self.index_bounds, cross_entropy)

    def new_result(self) -> R.OptResult:
        """A result to evaluate steps into (the caller frees it)."""
        return R.OptResult()

    def result_loss(self, result: R.OptResult) -> float:
        """The mean loss of the batches evaluated into ``result``."""
        return opt_result_loss(result)

    def epoch_stats(self, result: R.OptResult, steps: int) -> EpochStats:
        """The statistics of ``steps`` batches evaluated into ``result`` (by the training or validation context:
        the two have the same heads). The training steps' metrics summed on the device since they were last read are
        read and given to ``options.metrics`` here (once per epoch; nothing to do after a validation epoch)."""
        if self.tally is not None:
            self.tally.collect()
        ctx = self.train_ctx
        stats = EpochStats(steps=steps, samples=steps * self.batch_size)
        # a loss built from ggml ops: the result counts each head
        heads = ctx.loss.heads if ctx.loss is not None and ctx.loss.composite else []
        if steps:
            stats.loss = R.ggml_opt_result_loss(result)["loss"]
            stats.accuracy = R.ggml_opt_result_accuracy(result)["accuracy"]
            stats.head_loss = [result.head_loss(i)[0] for i in range(len(heads))]   # mean per batch
            stats.head_accuracy = [R.ggml_opt_result_accuracy_i(result, i + 1)["accuracy"] for i in range(len(heads))]
            if heads:
                ce = [a for a in stats.head_accuracy if not math.isnan(a)]
                stats.accuracy = float(np.mean(ce)) if ce else math.nan
            elif self.per_head:  # one head with ggml's own loss: the head is the whole loss
                stats.head_loss, stats.head_accuracy = [stats.loss], [stats.accuracy]
        else:
            n = len(ctx.heads) if self.per_head else 0
            stats.head_loss = [math.nan] * n
            stats.head_accuracy = [math.nan] * n
        return stats

    def step(self, pairs: list[tuple[Target, np.ndarray]], train: bool, result: R.OptResult,
             watch: Watch | None = None, defer: bool = False, then: Callable[[], None] | None = None) -> None:
        """One physical batch: alloc, write, eval (with the hooks around the eval) on the training or the
        validation opt context, waiting for the device once (``OptContext.eval_submit``/``eval_finish``): the
        batch is uploaded from pinned memory ahead of the step, the outputs the metrics read are read behind it, and
        ``then()`` queues more work before that wait (a graph optimizer's step).

        ``defer``: on a GPU, that wait comes at the start of the next step (or ``drain``), after the host staged the
        next batch: the host's work between two steps (the next batch from the source, its checks and copy) runs
        while the device computes; the loop that defers calls ``drain`` before anything reads what a step computed.
        Ctrl-C waits for the end of the step: an alloc without its eval would leave the opt context unusable.
        ``watch``: a context manager factory given the scheduler, entered around the eval (a
        ``PlacementRecorder``); without one, the first training step on a GPU is watched (not deferred) and ops it
        leaves on the CPU are named in a warning."""
        ctx = self.opt_ctx(train)
        with self.guard.step:
            uploads = self._uploads(train)
            self._parity ^= 1
            staged = [uploads.stage(target.tensor.ptr, arr, self._parity) for target, arr in pairs]
            self.drain()  # the step before: its one wait, its results
            recorder = None
            if watch is None and train and self.watch_first_step:
                recorder = watch = PlacementRecorder
            if train:
                self.watch_first_step = False
            defer = defer and watch is None and not is_host_backend(ctx.sched.backends[0])
            started = self.threads.before_step() if train and not defer else None
            ctx.alloc(train)
            written = {ptr_key(target.tensor.ptr): arr for target, arr in pairs}

            def write(t: Tensor, arr: np.ndarray) -> None:
                staged.append(uploads.stage(t.ptr, arr, self._parity))
                written[ptr_key(t.ptr)] = arr   # a hook's row indices are checked on this array, not read back
            for hook in self.hooks:
                hook.before_eval(train, write)
            tally = self.tally if train else None
            if tally is not None:
                zeros, reads = tally.plan()
                staged += [uploads.stage(t.ptr, arr, self._parity) for t, arr in zeros]
            else:
                reads = self._metric_reads() if train and self.options.metrics is not None else None
            # a deferred step's labels are read after the source made the next batch, which may reuse its arrays
            labels = [np.array(a) if defer else a for a in BatchWriter.labels_of(pairs)] \
                if reads is not None and tally is None else []
            with watch(ctx.sched) if watch is not None else contextlib.nullcontext() as seen:
                # the uploads are queued under the backends' lock, after every check of the step (eval_submit)
                def send() -> None:
                    for one in staged:
                        uploads.send(one)
                ctx.eval_submit(result, reads, then, written, send=send)
                if tally is not None:
                    tally.submitted()
                self._pending = (ctx, train, started, reads, labels, tally)
                if not defer:
                    self.drain()
        if recorder is not None and seen is not None:
            self.placement = seen.placement("a training step")
            warn_if_host_ops(self.placement)

    def drain(self, final: bool = False) -> None:
        """Wait for a deferred step and take its results (the loss, the heads, the metrics' outputs): nothing to do
        when no step is deferred. ``final``: the epoch's last step, behind which the metrics summed on the device are
        read (within its wait). Ctrl-C waits for it."""
        pending = self._pending
        if pending is None:
            return
        ctx, train, started, reads, labels, tally = pending
        with self.guard.step:
            if final and tally is not None and reads is None:
                reads = tally.unread()
                if reads is not None:
                    ctx.read_behind(reads)
                    self._pending = (ctx, train, started, reads, labels, tally)
            ctx.eval_finish()    # interrupted before its wait returned, the step stays pending: drain again
            self._pending = None
            for hook in self.hooks:
                hook.after_eval(train)
            if started is not None:
                self.threads.after_step(started)
            if tally is not None:
                tally.after_wait(reads)
            elif reads is not None and self.options.metrics is not None:
                self.options.metrics.update(reads.values(), labels)

    def _uploads(self, train: bool) -> Uploads:
        """The pinned slots the batches of the training (or validation) steps are uploaded from."""
        uploads = self._uploads_by.get(train)
        if uploads is None:
            labels, weights, _ = self._targets(train)
            hooked = [t for hook in self.hooks for t in hook.written]
            tallied = [self.tally.accumulator] if train and self.tally is not None and self.tally.accumulator else []
            uploads = self._uploads_by[train] = Uploads([*self.inputs, *labels, *weights, *hooked, *tallied],
                                                        self.opt_ctx(train).sched.backends)
        return uploads

    def _metric_reads(self) -> Reads:
        """The reads of the outputs the compiled metrics update from, behind each training step."""
        if self._metrics_read is None:
            self._metrics_read = Reads(self.graph.output_copies, self.train_ctx.sched.backends)
        return self._metrics_read

    def history_attrs(self) -> dict:
        """What the history's ``attrs`` get from this runner (nothing; replicas report their traffic)."""
        return {}

    def keepers(self) -> list[Lifetime]:
        """Every handle the fit needs: the opt contexts and what they depend on (scheduler, contexts of the
        model, their buffers), the results, the contexts of the inputs. Marked in use while it runs."""
        hs: list[Lifetime] = list(self._owned)
        for ctx in (self.train_ctx, self.eval_ctx):
            if ctx is not None:
                hs.extend(ctx.keepers)
        for t in self.inputs:
            hs.extend(t.keepers)
        return hs

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._close()

    def settle(self) -> None:
        """Wait for whatever is still queued on the runner's schedulers (a deferred step whose ``drain`` failed),
        dropping its values: before freeing memory such work may read."""
        for ctx in (self.train_ctx, self.eval_ctx):
            if ctx is not None and ctx.alive and ctx.sched.alive:
                lib.ggml_backend_sched_synchronize(ctx.sched.ptr)

    def _close(self) -> None:
        # the opt contexts first: freeing one waits for a step it still has queued, which reads the pinned slots
        for handle in reversed(self._owned):
            handle.free()
        self._owned.clear()
        for staged in [*self._uploads_by.values(), self._metrics_read]:
            if staged is not None:
                staged.free()
        self._uploads_by.clear()
        self._metrics_read = None
        for other in reversed(self._also_owned):
            other.free()
        self._also_owned.clear()
        restore_threads(self._threads_before)
        self._threads_before = []


def _warn(message: str) -> None:
    warnings.warn(message, GgmlpyWarning, stacklevel=4)


@dataclass
class _FitRun:
    """One run of the loop: what it reads (the runner, feeds, plan), the results its epochs evaluate into, and what
    it builds (the history)."""
    runner: StepRunner
    train_feed: Feed
    val_feed: Feed | None
    plan: EpochPlan
    source_name: str
    before_epoch: Callable[[int], None] | None
    validate: Callable[[], EpochStats] | None
    cbs: CallbackList
    state: FitState
    columns: list[str]
    train_result: Result | None = None
    val_result: Result | None = None
    rows: list[dict] = field(default_factory=list)
    head_rows: list[dict] = field(default_factory=list)
    extra_columns: list[str] = field(default_factory=list)   # what callbacks logged, in order of first appearance

    def begin_epoch(self, epoch: int) -> EpochProgress | None:
        """The epoch's progress bar, once the callbacks began it; None when one of them stopped the fit."""
        self.state.epoch = epoch
        if self.before_epoch is not None:
            self.before_epoch(epoch)
        self.cbs.run("on_epoch_begin", epoch, {}, self.state)
        if self.state.stop:
            return None
        return EpochProgress(epoch, self.state.nepoch, self.plan.steps_per_epoch, self.plan.silent or not self.plan.bar)

    def end_epoch(self, epoch: int, train: EpochStats, seconds: float) -> bool:
        """After the epoch's training steps: the checks on them, the validation, the history's row and the
        callbacks; False when the fit ends here."""
        plan, source_name = self.plan, self.source_name
        steps_per_epoch, stream = plan.steps_per_epoch, plan.stream
        if stream and train.steps == 0:
            _warn(f"Epoch {epoch}: the {source_name} returned None on the first step (no batch), so training "
                  f"stops after {epoch - plan.initial_epoch - 1} epoch(s). A finite source is exhausted: ask for "
                  "fewer epochs, or make it restart (reset its state before returning None, or pass a generator "
                  "function or a list)")
            return False
        if train.steps and not math.isfinite(train.loss):
            message = (f"Epoch {epoch}: the training loss is {train.loss} (not finite); the weights are probably "
                       f"NaN/inf now. {NONFINITE_CAUSES} The history of the completed epochs is in this exception's "
                       ".history")
            if plan.on_nonfinite == "raise":
                raise GgmlValueError(message)
            _warn(message.replace("this exception's .history", "the returned history"))
        if stream and steps_per_epoch is not None and train.steps < steps_per_epoch:
            _warn(f"Epoch {epoch}: the {source_name} ended after {train.steps} of {steps_per_epoch} requested "
                  "batches; the epoch was closed early (drop steps_per_epoch to run until the source ends)")
        self.record(epoch, train, self.validation(epoch, len(train.head_loss)), seconds)
        return not self.state.stop

    def validation(self, epoch: int, n_heads: int) -> EpochStats:
        """The epoch's validation statistics (NaN without validation data)."""
        validation_steps = self.plan.validation_steps
        if self.validate is not None:
            return self.validate()
        if self.val_feed is None or self.val_result is None:
            return EpochStats(head_loss=[math.nan] * n_heads, head_accuracy=[math.nan] * n_heads)
        val = run_epoch(self.runner, self.val_feed, validation_steps, False, self.val_result)
        if val.steps == 0 and not self.state.warned_no_validation:
            self.state.warned_no_validation = True
            _warn(f"Epoch {epoch}: the validation_generator gave no batch, so val_loss and val_accuracy are "
                  "NaN (an exhausted iterator? pass a generator function or a list to validate every epoch)")
        if self.plan.stream and validation_steps is not None and 0 < val.steps < validation_steps:
            _warn(f"Epoch {epoch}: the validation_generator ended after {val.steps} of {validation_steps} "
                  "requested batches")
        return val

    def record(self, epoch: int, train: EpochStats, val: EpochStats, seconds: float) -> None:
        """The epoch's row of the history, its summary line and the callbacks' on_epoch_end."""
        head_names = self.runner.graph.head_names
        logs = {"train_loss": train.loss, "train_accuracy": train.accuracy,
                "val_loss": val.loss, "val_accuracy": val.accuracy}
        for name in metric_names(self.runner):
            logs[f"train_{name}"] = train.metrics.get(name, math.nan)
            logs[f"val_{name}"] = val.metrics.get(name, math.nan)
        if self.plan.stream:
            logs["steps"] = train.steps
        if head_names:
            for name, tl, ta, vl, va in zip(head_names, train.head_loss, train.head_accuracy, val.head_loss,
                                            val.head_accuracy):
                logs.update({f"train_{name}_loss": tl, f"train_{name}_accuracy": ta,
                             f"val_{name}_loss": vl, f"val_{name}_accuracy": va})
            self.head_rows.append({"loss": train.head_loss, "accuracy": train.head_accuracy,
                                   "val_loss": val.head_loss, "val_accuracy": val.head_accuracy})
        row = {"epoch": epoch, **{c: logs[c] for c in self.columns if c != "epoch"}}
        self.rows.append(row)   # recorded before the callbacks: one that raises cannot lose the epoch
        say(summary_line(epoch, self.state.nepoch, logs, seconds, train.samples), self.plan.silent)
        added: dict = {}
        try:
            self.cbs.run("on_epoch_end", epoch, logs, self.state, added)
        finally:  # values the callbacks logged under new keys join the row, also when one raised
            new = {k: v for k, v in added.items() if k not in row}
            row.update(new)
            self.extra_columns.extend(k for k in new if k not in self.extra_columns)



def fit_loop(runner: StepRunner, train_feed: Feed, val_feed: Feed | None, plan: EpochPlan, *,
             source_name: str = "generator", before_epoch: Callable[[int], None] | None = None,
             validate: Callable[[], EpochStats] | None = None) -> pd.DataFrame:
    """Run the epochs; returns the history (one row per completed epoch). ``validate`` (instead of
    ``val_feed``) computes the validation statistics itself (the model layer's inference graph).

    Nothing is lost on the way out: an exception (a Ctrl-C, a failing generator or callback, a
    non-finite loss) leaves with the history of the completed epochs as its ``history`` attribute."""
    check_nonfinite(plan.on_nonfinite)
    state = FitState(lr_ud=runner.lr_ud, nepoch=plan.initial_epoch + plan.epochs,
                     optimizer="sgd" if runner.state.optimizer == OPTIMIZER_SGD else "adamw",
                     model=plan.model, weights=plan.weights)
    names = metric_names(runner)
    run = _FitRun(runner, train_feed, val_feed, plan, source_name, before_epoch, validate,
                  CallbackList(plan.callbacks), state, HISTORY_COLUMNS + [f"{split}_{name}" for name in names
                                                                          for split in ("train", "val")]
                  + (["steps"] if plan.stream else []))
    head_names = runner.graph.head_names
    try:
        run.train_result = runner.new_result()
        run.val_result = runner.new_result() if val_feed is not None else None
        # while it runs, nothing it needs can be freed: not from a callback, a generator (also one running in
        # the prefetch thread) or another thread
        with using(runner.keepers(), "a fit (ggml_fit_opt*, ggml_fit*)"), runner.guard:
            for epoch in range(plan.initial_epoch + 1, plan.initial_epoch + plan.epochs + 1):
                progress = run.begin_epoch(epoch)
                if progress is None:
                    break
                try:
                    train = run_epoch(runner, train_feed, plan.steps_per_epoch, True, run.train_result, progress)
                finally:
                    seconds = progress.close()
                if not run.end_epoch(epoch, train, seconds):
                    break
    except BaseException as exc:
        # the completed epochs go with the error; when the runner cannot say where it ran or its extras (a lost
        # RPC server answers nothing more), the rows alone
        for extras in (lambda: (runner.placement, runner.history_attrs()), lambda: (None, {})):
            try:
                placement, attrs = extras()
                carry_history(exc, _history(run.rows, run.head_rows, run.columns, head_names, placement, attrs,
                                            run.extra_columns))
                break
            except Exception:  # noqa: BLE001 - never mask the original error
                continue
        raise
    finally:
        for result in (run.train_result, run.val_result):
            if result is not None:
                result.free()
    return _history(run.rows, run.head_rows, run.columns, head_names, runner.placement, runner.history_attrs(),
                    run.extra_columns)


NONFINITE_CAUSES = ("Usual causes: a learning rate too high, NaN/inf in the data, binary cross-entropy on outputs "
                    "outside [0, 1] (end the model in a sigmoid), log of 0 in a custom loss, products beyond F16's "
                    "range (65504) in a model compiled with precision='f16' (normalise the inputs, or use 'bf16').")


def check_nonfinite(on_nonfinite: object) -> str:
    if on_nonfinite not in ("raise", "warn"):
        raise GgmlValueError(f"on_nonfinite must be 'raise' or 'warn', got {on_nonfinite!r}")
    return on_nonfinite


def metric_names(runner: StepRunner) -> list[str]:
    """The log names of the training steps' metrics (``StepOptions.metrics``), in order."""
    return runner.options.metrics.names if runner.options.metrics is not None else []


def _history(rows: list[dict], head_rows: list[dict], columns: list[str], head_names: list[str] | None,
             placement: Placement | None = None, attrs: dict | None = None,
             extra_columns: Sequence[str] = ()) -> pd.DataFrame:
    import pandas as pd  # imported here: pandas makes `import ggmlpy` twice as slow

    from .history import History
    # one column array each, with explicit dtypes, also for a zero-row history (pandas would make them object), and
    # the frame made once (a column assigned at a time took 5-14 ms per fit)
    data: dict[str, object] = {c: np.array([r.get(c) for r in rows], dtype=int if c in ("epoch", "steps") else float)
                               for c in columns}
    for c in extra_columns:  # a callback's numbers are floats (NaN in the epochs it did not log them); else as given
        values = [r.get(c) for r in rows]
        data[c] = np.array(values, dtype=float) if all(v is None or is_real(v) for v in values) else values
    history = History(data, columns=list(columns) + list(extra_columns))
    if head_names is not None:
        for key, attr in (("loss", "head_loss"), ("accuracy", "head_accuracy"), ("val_loss", "val_head_loss"),
                          ("val_accuracy", "val_head_accuracy")):
            history.attrs[attr] = pd.DataFrame([r[key] for r in head_rows], columns=head_names, dtype=float)
        history.attrs["head_names"] = list(head_names)
    if placement is not None:  # where the first training step on a device ran (ggmlpy.placement.Placement)
        history.attrs["placement"] = placement
    history.attrs.update(attrs or {})  # what the runner reports (data-parallel replicas: their traffic)
    return history
