"""``ggml_trainer``: a training context stepped by hand (reinforcement learning, custom loops), and
snapshots: frozen copies of a model's weights that predict like a model (DQN target networks).
"""
from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

import numpy as np

from ..compute.placement import Placement, PlacementRecorder
from ..compute.threads import restore_threads
from ..core.args import is_int, learning_rate_arg
from ..core.handle import interpreter_exiting
from ..errors import GgmlStateError, GgmlTypeError, GgmlValueError
from ..training.loop import NONFINITE_CAUSES
from ..training.runner import StepRunner
from .engine import inputs as D
from .engine.compile import compiled
from .engine.graphs import input_shapes_of, InputShapes
from .engine.metrics import Tally
from .engine.predict import predict_arrays
from .engine.runtime import model_in_use
from .engine.snapshot import Snapshot
from .engine.training_runner import sized_runner, training_runner
from .io.saving import save_model
from .layers.regularizers import weight_penalty
from .network.model import Model


def _one_at_a_time(method: Callable) -> Callable:
    """Calls on one trainer from several threads take turns: a step is an alloc, a write and an eval of one
    opt context, which ggml cannot interleave (and a free waits for the step under way)."""
    @functools.wraps(method)
    def locked(self: ModelTrainer, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class ModelTrainer:
    """The object ``ggml_trainer`` returns; see there."""

    def __init__(self, model: Model, batch_size: int = 32, nbatch_logical: int | None = None) -> None:
        self._lock = threading.RLock()
        self._freed = True  # until everything is made
        cfg = compiled(model, "ggml_trainer")
        if not is_int(batch_size) or batch_size < 1:
            raise GgmlValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.batch_size = int(batch_size)
        period = 1
        if nbatch_logical is not None:
            if not is_int(nbatch_logical) or \
                    nbatch_logical < batch_size or nbatch_logical % batch_size:
                raise GgmlValueError(f"nbatch_logical must be a multiple of batch_size ({batch_size}), got "
                                     f"{nbatch_logical!r}")
            period = int(nbatch_logical) // self.batch_size
        self._model, self._cfg = model, cfg
        params = self._params = model.runtime.params
        if not params.mark_trainable():
            raise GgmlValueError("nothing to train: every layer with weights is frozen")
        self._owned: list[Any] = []
        self._period = period
        self._opt_state = model.runtime.opt_state  # continue the model's optimizer (a fit's, a loaded file's)
        self._lease: object | None = None  # the optimizer is taken at the first step (OptimizerState.begin)
        # a model with variable sizes (None) gets its runner at the first step, whose batch gives the sizes: a runner
        # per size (``sized_runner``), the optimizer's state moving to the one of each batch
        self._runner: StepRunner | None = None
        self._lr: float | None = None   # a learning rate set before a variable model's first step
        self.train_nodes = 0
        if not model.variable:
            self._make_runner(None)
        self._steps = 0
        self._freed = False
        model.runtime.add_trainer(self)

    def _make_runner(self, shapes: InputShapes) -> None:
        """The runner of the steps: for batches of ``shapes`` where the model has variable sizes."""
        try:
            if shapes is None:
                self._runner, self.train_nodes = training_runner(self._model, self._cfg, self.batch_size,
                                                                 self._period)
            else:
                self._runner = sized_runner(self._model, self._cfg, self.batch_size, self._period, False, shapes)
            self._owned.insert(0, self._runner)
            self._writer: Any = self._runner.writer("step", True)
            self._result = self._runner.new_result()
            self._owned.insert(0, self._result)
            self._opt_state.restore(self._runner.state)
            if self._lr is not None:
                self._runner.lr_ud.set(adamw_lr=self._lr, sgd_lr=self._lr)
        except BaseException:
            self._free_owned()
            raise

    def _started(self, fn: str) -> StepRunner:
        """The runner, which a model with variable sizes has from its first step on."""
        if self._runner is None:
            raise GgmlStateError(f"trainer.{fn}: the model has variable sizes (None), and its training graph is made "
                                 "at the first step, for that batch's sizes; call trainer.step first")
        return self._runner

    @property
    def alive(self) -> bool:
        """Whether the trainer has not been freed."""
        return not self._freed

    def _live(self, fn: str) -> None:
        if self._freed:
            raise GgmlStateError(f"trainer.{fn}: this trainer has been freed")
        compiled(self._model, f"trainer.{fn}")
        if self._model.runtime.params is not self._params:
            raise GgmlStateError(f"trainer.{fn}: the model was compiled again (or changed) after this trainer was "
                                 "made; make a new trainer")

    def _batch(self, x: Any, y: Any, fn: str) -> tuple[list, list]:
        xs = D.model_inputs(self._model, x, f"trainer.{fn}: x", finite=True)
        n = xs[0].shape[0]
        if n != self.batch_size:
            raise GgmlValueError(f"trainer.{fn}: the trainer takes batches of exactly {self.batch_size} samples, got "
                                 f"{n} (make a trainer with batch_size={n}, or use ggml_predict/ggml_evaluate)")
        return xs, D.model_targets(self._model, self._cfg, y, xs, f"trainer.{fn}: y")

    @_one_at_a_time
    def step(self, x: Any, y: Any) -> float:
        """One forward and backward pass on exactly ``batch_size`` samples (the optimizer steps every
        ``nbatch_logical / batch_size`` calls); returns this batch's loss."""
        return self._step(x, y)

    def _step(self, x: Any, y: Any, watch: Any = None) -> float:
        self._live("step")
        xs, ys = self._batch(x, y, "step")
        if self._runner is None:   # a variable model's first step
            self._make_runner(input_shapes_of(self._model, xs))
        runner = self._started("step")
        pairs = self._writer.parse(D.feed_dict(self._cfg.heads, xs, ys, None))
        if self._lease is None:  # the first step: take the optimizer, continuing from where it is now
            self._lease = self._opt_state.begin("a ggml_trainer (from its first step until trainer.free())",
                                                "trainer.step", owner=self)
            self._opt_state.restore(runner.state)
        self._result.reset()
        with model_in_use(self._model):
            before = runner.split_threads()  # as a fit's steps (a predict may have reset them)
            try:
                runner.step(pairs, True, self._result, watch)
            finally:
                restore_threads(before)
                self._model.runtime.replicas_in_step()
        self._steps += 1
        loss = float(runner.result_loss(self._result))
        if not np.isfinite(loss):
            raise GgmlValueError(f"trainer.step: the loss of this batch is {loss} (not finite); the weights are "
                                 f"probably NaN/inf now. {NONFINITE_CAUSES}")
        return loss

    @_one_at_a_time
    def eval(self, x: Any, y: Any) -> float:
        """The loss on exactly ``batch_size`` samples in inference mode, without a backward pass; changes
        nothing (not the weights, not the accumulation of ``step``)."""
        self._live("eval")
        xs, ys = self._batch(x, y, "eval")
        tally = Tally(self._cfg.heads, penalty=weight_penalty(self._model.runtime.params))
        with model_in_use(self._model):
            tally.add(predict_arrays(self._model, self._model.runtime.predictor, xs, self.batch_size), ys)
        return tally.total_loss()

    @_one_at_a_time
    def model(self) -> Model:
        """The trained model (the trainer trains its weights in place)."""
        self._live("model")
        return self._model

    @_one_at_a_time
    def set_lr(self, lr: float) -> None:
        """Set the learning rate from the next optimizer step on."""
        self._live("set_lr")
        lr = learning_rate_arg("trainer.set_lr: lr", lr)
        self._lr = lr
        if self._runner is not None:
            self._runner.lr_ud.set(adamw_lr=lr, sgd_lr=lr)

    @_one_at_a_time
    def get_lr(self) -> float:
        self._live("get_lr")
        pending = self._lr if self._lr is not None else self._cfg.learning_rate
        if self._runner is None and pending is not None:   # a variable model before its first step
            return pending
        return self._started("get_lr").lr_ud.get()["adamw" if self._cfg.optimizer_spec.name == "adamw" else "sgd"]

    @_one_at_a_time
    def n_steps(self) -> int:
        """How many times ``step`` ran."""
        self._live("n_steps")
        return self._steps

    @_one_at_a_time
    def snapshot(self) -> Snapshot:
        """A frozen copy of the current weights (free it with ``ggml_snapshot_free``)."""
        self._live("snapshot")
        with model_in_use(self._model):
            return Snapshot(self._model, self._model.runtime.params.copy())

    @_one_at_a_time
    def restore(self, snapshot: Snapshot) -> None:
        """Put a snapshot's weights back into the model (the optimizer's state is kept)."""
        self._live("restore")
        if not isinstance(snapshot, Snapshot):
            raise GgmlTypeError(f"trainer.restore: expected a snapshot, got {type(snapshot).__name__}")
        if snapshot.model is not self._model:
            raise GgmlValueError("trainer.restore: the snapshot was taken of another model")
        params = self._model.runtime.params
        with model_in_use(self._model):
            for layer, spec in params.specs:  # a snapshot holds the same layers' weights
                params.write(layer, spec.name, snapshot.params.value(layer, spec.name))

    @_one_at_a_time
    def optimizer_state(self) -> dict:
        """The optimizer's state now (``ggml_opt_get_state``'s dict: AdamW's moments per trainable weight and
        the step count). Inside a logical batch (``nbatch_logical``) it is the state of the last optimizer
        step."""
        self._live("optimizer_state")
        return self._opt_state.read(self._started("optimizer_state").state)

    @_one_at_a_time
    def save(self, path: Any, include_optimizer: bool = True) -> None:
        """Save the model as ``ggml_save_model`` does, by default with the optimizer's state: a trainer made
        from ``ggml_load_model(path)`` continues exactly where this one is. Refused (RuntimeError) inside a
        logical batch when the optimizer state is included: its accumulated gradients cannot be saved."""
        self._live("save")
        state = None
        if include_optimizer:
            ctx = self._started("save").state
            if ctx.pending_batches:
                raise GgmlStateError(f"trainer.save: {ctx.pending_batches} of the {ctx.opt_period} batches of a "
                                     "logical batch (nbatch_logical) are accumulated but not applied; save after the "
                                     "step that completes it, or with include_optimizer=False")
            state = self.optimizer_state()
        with model_in_use(self._model):
            save_model(self._model, path, include_optimizer, state, "trainer.save")

    @_one_at_a_time
    def free(self) -> None:
        """Release the trainer's ggml objects (the model stays, with the optimizer's state for the next fit or
        trainer). Idempotent; from another thread it waits for a step under way."""
        if self._freed:
            return
        try:
            if self._lease is not None and self._runner is not None and self._model.runtime is not None \
                    and self._model.runtime.opt_state is self._opt_state:
                self._opt_state.keep(self._runner.state)  # warns inside a logical batch, as a fit does
        finally:
            self._release()
            self._free_owned()
        self._freed = True

    def discard(self) -> None:
        """Free the trainer's ggml objects without handing its optimizer state back to the model (a trainer
        made only to look at a step, ``ggml_model_placement``). Idempotent."""
        with self._lock:
            if not self._freed:
                self._release()
                self._free_owned()
                self._freed = True

    def _release(self) -> None:
        if getattr(self, "_lease", None) is not None:
            self._opt_state.end(self._lease)
            self._lease = None

    def _free_owned(self) -> None:
        self._runner = None
        for h in self._owned:  # its result first, then the runner (which frees what it runs on)
            h.close()
        self._owned.clear()

    def __del__(self) -> None:
        # Dropped without free(): its optimizer steps still belong to the model (free() hands them back), and
        # its ggml objects go now instead of leaking until their finalizers run in no particular order.
        if getattr(self, "_freed", True) or interpreter_exiting():
            return
        try:
            self.free()
        except Exception:  # noqa: BLE001 - nothing may leave a finalizer; the model's state stays as it was
            pass

    def __enter__(self) -> ModelTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"{self._steps} steps"
        return f"<ggml_trainer of '{self._model.name}' batch_size={self.batch_size} ({state})>"


def watched_steps(model: Model, batch_size: int, x: list, y: list, watcher: Any, steps: int = 1,
                  timed: int = 0) -> tuple[list, float | None]:
    """``steps`` training steps of ``model`` on ``(x, y)``, each inside ``watcher(sched)`` (a
    ``PlacementRecorder``, a ``NodeTimer``), then ``timed`` plain steps. Returns the watchers and the best plain
    step's seconds (None when ``timed`` is 0). The weights (batch-norm statistics included) are put back
    afterwards and the model's optimizer state is left as it was."""
    params = model.runtime.params
    kept = params.values_by_layer()
    trainer = ModelTrainer(model, batch_size)
    try:
        watchers: list = []

        def watch(sched: Any) -> Any:
            watchers.append(watcher(sched))
            return watchers[-1]
        best = None
        with trainer._lock:
            for _ in range(steps):
                trainer._step(x, y, watch)
            for _ in range(timed):
                t = time.perf_counter()
                trainer._step(x, y)
                best = min(best or float("inf"), time.perf_counter() - t)
        return watchers, best
    finally:
        trainer.discard()
        for layer, values in kept.values():
            for name, value in values.items():
                params.write(layer, name, value)


def step_placement(model: Model, batch_size: int, x: list, y: list) -> Placement:
    """Where one training step of ``model`` on ``(x, y)`` runs: a trainer's step watched by a
    ``PlacementRecorder`` (``watched_steps``)."""
    recorders, _ = watched_steps(model, batch_size, x, y, PlacementRecorder)
    placement = recorders[0].placement(f"training step of '{model.name}', batch {batch_size}")
    placement.notes = list(model.runtime.graph_notes)
    return placement


def ggml_trainer(model: Model, batch_size: int = 32, nbatch_logical: int | None = None) -> ModelTrainer:
    """A training context you step yourself, for loops ``ggml_fit`` does not fit (reinforcement learning
    from a replay buffer, curricula, custom schedules).

    Arguments:
        model: a compiled model (its optimizer, losses and learning rate apply).
        batch_size: every ``step``/``eval`` takes exactly this many samples.
        nbatch_logical: samples per optimizer step; gradients accumulate inside ggml's opt context over
            ``nbatch_logical / batch_size`` steps (the weights change only on the last of them).

    Value: a trainer with ``step(x, y)`` (forward + backward, returns the batch's loss), ``eval(x, y)``
    (loss in inference mode, changes nothing), ``model()``, ``set_lr(lr)``, ``get_lr()``, ``n_steps()``,
    ``snapshot()`` (a frozen copy of the weights that ``ggml_predict`` takes), ``restore(snapshot)``,
    ``save(path, include_optimizer=True)`` (``ggml_save_model`` with the optimizer's state),
    ``optimizer_state()`` and ``free()`` (idempotent; every method afterwards raises "has been freed").
    It is a context manager.

    The trainer continues the model's optimizer state (AdamW's moments and step count): the state a
    previous ``ggml_fit`` or trainer left, or the one ``ggml_load_model`` read from a file saved with
    ``include_optimizer=True`` — so ``ggml_trainer(ggml_load_model(path))`` resumes a saved trainer on
    the same trajectory. ``free()`` hands the state back to the model (the last trainer freed wins);
    a freshly compiled model starts from zero moments.

    Example:
        >>> with g.ggml_trainer(model, batch_size=32) as tr:
        ...     target = tr.snapshot()
        ...     for i in range(1000):
        ...         loss = tr.step(*replay.sample(32))
        ...         if i % 100 == 0:
        ...             g.ggml_snapshot_free(target)
        ...             target = tr.snapshot()
        ...     tr.save("checkpoint.gguf")                      # weights + AdamW state
        >>> tr = g.ggml_trainer(g.ggml_load_model("checkpoint.gguf"), batch_size=32)   # resumes exactly
    """
    return ModelTrainer(model, batch_size, nbatch_logical)
