"""``ggml_fit``, ``ggml_fit_generator``, ``ggml_evaluate``, ``ggml_predict``, ``ggml_predict_classes``.

Training goes through ``training.fit.fit_streamed``, the loop behind ``ggml_fit_opt_gen``: arrays
become a generator of full batches, a user's generator keeps its own kind (callable, generator
function, re-iterable or iterator) and each of its batches is checked and converted on the way.
Validation, evaluation and prediction run the inference graph (dropout off, batch norm on its
running statistics) over every sample, a last partial batch included.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ...compute.sched import Scheduler
from ...core.args import c_int_arg, is_real
from ...errors import GgmlpyWarning, GgmlTypeError, GgmlValueError
from ...training.adapters import BatchSequence, check_ends, is_batch_sequence, Source
from ...training.config import Callback, EpochPlan
from ...training.fit import fit_streamed, ggml_fit_opt
from ...training.loop import check_nonfinite, EpochStats, HISTORY_COLUMNS
from ...training.runner import StepRunner
from ..layers.regularizers import weight_penalty
from ..network.model import Model
from ..network.parameters import ModelWeights
from . import inputs as D
from .compile import CompileConfig, compiled
from .graphs import input_shapes_of, InputShapes
from .metrics import Tally
from .predict import predict_arrays
from .runtime import model_in_use
from .snapshot import Snapshot
from .training_runner import sized_runner, training_runner


if TYPE_CHECKING:
    import pandas as pd

    from .predict import AnyPredictor


def _verbose(verbose: object) -> bool:
    """Whether to stay silent: verbose 0 (or False); 1, 2, True and Keras' "auto" show progress (2: a fit's
    summary line per epoch without the bar, nothing in ``ggml_predict``/``ggml_evaluate``)."""
    if isinstance(verbose, str) and verbose == "auto":
        return False
    if verbose not in (0, 1, 2, True, False) or isinstance(verbose, float):
        raise GgmlValueError(f"verbose must be 0, 1, 2 or 'auto', got {verbose!r}")
    return not verbose


def _bar(verbose: object, what: str) -> str | None:
    """The progress bar's name for ``ggml_predict``/``ggml_evaluate`` (Keras' verbose=1 or "auto"), or None."""
    silent = _verbose(verbose)
    return None if silent or verbose == 2 else what


# ---------------------------------------------------------------- prediction

@contextlib.contextmanager
def _predicting(model: Model | Snapshot, fn: str) -> Iterator[tuple[Model, AnyPredictor]]:
    """(model, predictor) of a trainer's snapshot (it has its own weights), or of a compiled model with its
    runtime marked in use for the block."""
    if isinstance(model, Snapshot):
        yield model.model, model.predictor()
        return
    compiled(model, fn)
    with model_in_use(model) as runtime:
        yield model, runtime.predictor


def ggml_predict(model: Model | Snapshot, x: D.ModelData | BatchSequence, batch_size: int = 32,
                 verbose: int | str = 0) -> np.ndarray | list[np.ndarray]:
    """Run the model forward on every sample of ``x``.

    Arguments:
        model: a compiled model, or a snapshot from ``ggml_trainer(...).snapshot()``.
        x: ``(N, *input_shape)`` (a list of arrays for several inputs, or a dict by input layer name), any N; or
            a Keras ``PyDataset``-like object (``__len__``, ``__getitem__``) whose items are ``x`` or
            ``(x, y[, sample_weight])``: the outputs of its batches in order.
        batch_size: samples per forward pass; the last partial batch is padded internally.
        verbose: 0 (the default; False) is silent; 1 (True) or ``"auto"`` (Keras' default) show a progress bar
            over the batches, on stderr when it is a terminal (no bar in a log file or a pipe); 2 is silent too
            (Keras prints no bar then).

    Value: ``(N, *output_shape)`` float32 (a list for several outputs): probabilities for a softmax
    or sigmoid last layer. Dropout is off and batch norm uses its running statistics.

    Example:
        >>> probs = g.ggml_predict(model, x_test)          # (N, classes)
    """
    batch_size = c_int_arg(None, "batch_size", batch_size, 1)
    bar = _bar(verbose, "predict")
    with _predicting(model, "ggml_predict") as (model_, predictor):
        if is_batch_sequence(x):  # Keras' predict(PyDataset): each batch's x (an item is x, (x,) or (x, y[, w]))
            if len(x) == 0:
                raise GgmlValueError("ggml_predict: the PyDataset-like x has no batches (len(x) == 0)")
            parts = [predict_arrays(model_, predictor, D.model_inputs(model_, _batch_x(x[i]), f"x[{i}]",
                                                                      allow_empty=True), batch_size, None)
                     for i in range(len(x))]
            outs = [np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]
        else:
            outs = predict_arrays(model_, predictor, D.model_inputs(model_, x, allow_empty=True), batch_size, bar)
    return outs[0] if len(outs) == 1 else outs


def _batch_x(item: object) -> object:
    if isinstance(item, tuple) and 1 <= len(item) <= 3:
        return item[0]
    if isinstance(item, dict) and "x" in item and set(item) <= {"x", "y", "sample_weight"}:
        return item["x"]
    return item


def ggml_predict_classes(model: Model | Snapshot, x: D.ModelData | BatchSequence, batch_size: int = 32) -> np.ndarray:
    """0-based class ids: the argmax over the last axis of each prediction, or ``p > 0.5`` where that axis
    has one (sigmoid) unit; ``(N,)`` for ``(N, classes)`` outputs, ``(N, steps)`` for a sequence's,
    ``(N, H, W)`` for per-pixel classes.

    Example:
        >>> ids = g.ggml_predict_classes(model, x_test)
    """
    if not isinstance(model, Snapshot):
        compiled(model, "ggml_predict_classes")
    model_ = model.model if isinstance(model, Snapshot) else model
    if len(model_.graph()[1]) != 1:
        raise GgmlValueError("ggml_predict_classes needs a model with one output; use ggml_predict")
    p = ggml_predict(model, x, batch_size)
    assert isinstance(p, np.ndarray)  # one output (checked above)
    if p.shape[-1] == 1:
        return (p[..., 0] > 0.5).astype(np.int64)
    return p.argmax(axis=-1).astype(np.int64)


def _evaluate_arrays(model: Model, cfg: CompileConfig, predictor: AnyPredictor, xs: list[np.ndarray],
                     ys: list[np.ndarray],
                     w: np.ndarray | None, batch_size: int, tally: Tally | None = None,
                     progress: str | None = None) -> Tally:
    tally = tally or Tally(cfg.heads, cfg.head_metrics, weight_penalty(model.runtime.params))
    outs = predict_arrays(model, predictor, xs, batch_size, progress)
    tally.add(outs, ys, w)
    return tally


def _batches(x: object) -> bool:
    """Whether ``x`` is a source of ``(x, y[, w])`` batches: a PyDataset-like object, a generator (function), an
    iterator, or a list of tuples."""
    return is_batch_sequence(x) or inspect.isgeneratorfunction(x) or isinstance(x, Iterator) or \
        isinstance(x, list) and bool(x) and all(isinstance(b, tuple) for b in x)


def ggml_evaluate(model: Model, x: D.ModelData | BatchSequence, y: D.ModelData | None = None, batch_size: int = 32,
                  sample_weight: npt.ArrayLike | None = None, verbose: int | str = 0,
                  return_dict: bool = True) -> dict | list | float:
    """Loss and accuracy of the model on every sample of ``(x, y)`` (inference mode).

    Arguments:
        model: a compiled model. x, y: as for ``ggml_fit``; or, without y as Keras takes them, a source of
        ``(x, y[, w])`` batches of any sizes, read one at a time: a PyDataset-like object, a generator (function),
        an iterator or a list of such tuples. batch_size: samples per forward pass (the
        last partial batch counts fully). sample_weight: optional per-sample loss weights.
        verbose: 0 (the default; False) is silent; 1 (True) or ``"auto"`` show a progress bar over the batches,
            on stderr when it is a terminal (no bar in a log file or a pipe); 2 is silent too.
        return_dict: True (the default, ggmlR's form) returns the dict below; False returns Keras' form:
            the loss alone for a model compiled without metrics, else ``[loss, accuracy]``, and for a
            multi-output model ``[loss, <output>_loss..., <output>_accuracy...]`` (the accuracies only with
            metrics), in the order of the outputs; the other compiled metrics follow in their order.

    Value: ``{"loss": ..., "accuracy": ..., "n_samples": N}``; accuracy is NaN for regression losses;
    a multi-output model adds ``"<output>_loss"`` / ``"<output>_accuracy"`` per output. Each metric of
    ``ggml_compile(metrics=)`` beyond accuracy adds its key (``"auc"``, ``"mae"``; ``"<output>_auc"`` for a
    multi-output model). The loss is the one training minimises (computed in float64 from the predictions).

    Example:
        >>> g.ggml_evaluate(model, x_test, y_test)["accuracy"]
        >>> loss, acc = g.ggml_evaluate(model, x_test, y_test, return_dict=False)   # as Keras
    """
    cfg = compiled(model, "ggml_evaluate")
    if not isinstance(return_dict, bool):
        raise GgmlValueError(f"return_dict must be True or False, got {return_dict!r}")
    bar = _bar(verbose, "evaluate")
    batch_size = c_int_arg(None, "batch_size", batch_size, 1)
    if y is None and _batches(x):  # Keras' evaluate(PyDataset, generator): batch by batch, any sizes
        if sample_weight is not None:
            raise GgmlValueError("ggml_evaluate: sample_weight cannot be used with a source of batches as x (its "
                                 "batches bring their own)")
        with model_in_use(model):
            tally = _evaluate_source(model, cfg, Source(x, "x"), None, batch_size, "x")
    else:
        if callable(x):
            raise GgmlTypeError(f"ggml_evaluate: x is a function ({type(x).__name__}); give arrays x and y, or a "
                                "source of (x, y) batches: a generator function (a def with yield), a generator or "
                                "iterator of batches, a list of them or a PyDataset")
        xs = D.model_inputs(model, x)
        ys = D.model_targets(model, cfg, y, xs)
        w = D.sample_weights(cfg, ys, xs[0].shape[0], sample_weight, None)
        with model_in_use(model) as runtime:
            tally = _evaluate_arrays(model, cfg, runtime.predictor, xs, ys, w, batch_size, progress=bar)
    result = {"loss": tally.total_loss(), "accuracy": tally.accuracy(), "n_samples": tally.n}
    if len(cfg.heads) > 1:
        for h, head_loss, a in zip(cfg.heads, tally.head_losses(), tally.head_accuracies()):
            result[f"{h.name}_loss"], result[f"{h.name}_accuracy"] = head_loss, a
    metrics = tally.metrics.results()
    result.update(metrics)
    if return_dict:
        return result
    if len(cfg.heads) == 1:
        values = [result["loss"]] + ([result["accuracy"]] if cfg.metrics else [])
    else:
        values = [result["loss"]] + [result[f"{h.name}_loss"] for h in cfg.heads] + \
            ([result[f"{h.name}_accuracy"] for h in cfg.heads] if cfg.metrics else [])
    values += list(metrics.values())
    return values[0] if len(values) == 1 else values


def _stats(tally: Tally) -> EpochStats:
    return EpochStats(steps=0, samples=tally.n, loss=tally.total_loss(), accuracy=tally.accuracy(),
                      head_loss=tally.head_losses(), head_accuracy=tally.head_accuracies(),
                      metrics=tally.metrics.results())


# ---------------------------------------------------------------- training

def runner_factory(model: Model, cfg: CompileConfig, batch: int, *, sample_weighted: bool,
                   nbatch_logical: int | None = None, input_shapes: InputShapes = None) -> Callable[[], StepRunner]:
    """What makes a fit's step runner for ``batch`` samples (of ``input_shapes``: ``input_shapes_of``) that
    ``fit_streamed`` calls (and closes the runner), once the model is known to have weights to train and
    ``nbatch_logical`` to be a multiple of the batch."""
    if not model.runtime.params.mark_trainable():
        raise GgmlValueError(nothing_to_train(model))
    period = 1
    if nbatch_logical is not None:
        logical = c_int_arg(None, "nbatch_logical", nbatch_logical, 1)
        if logical % batch:
            raise GgmlValueError(f"nbatch_logical ({logical}) must be a multiple of the batch size ({batch})")
        period = max(1, logical // batch)
    if input_shapes is None:
        return lambda: training_runner(model, cfg, batch, period, sample_weighted)[0]
    return lambda: sized_runner(model, cfg, batch, period, sample_weighted, input_shapes)


def fit_model(model: Model, x: D.ModelData | None = None, y: D.ModelData | None = None, epochs: int = 1,
              batch_size: int = 32, validation_split: float = 0.0, validation_data: tuple | None = None,
              class_weight: dict | None = None, sample_weight: npt.ArrayLike | None = None, verbose: int = 1,
              callbacks: Sequence[Callback] | None = None,
              shuffle: bool = True, initial_epoch: int = 0, nbatch_logical: int | None = None,
              on_nonfinite: str = "raise", steps_per_epoch: int | None = None) -> pd.DataFrame:
    """Train a compiled model on arrays (``ggml_fit(sched, ...)`` is ggmlR's low-level ``ggml_fit_opt``).

    Arguments:
        model: a compiled model.
        x: ``(N, *input_shape)`` sample-major, channels last (for several inputs a list in the model's input
            order, or Keras' dict ``{input layer name: array}``); or, with y None, a Keras ``PyDataset``-like
            object (``__len__``, ``__getitem__`` giving ``(x, y[, sample_weight])`` batches): it trains as
            ``ggml_fit_generator``'s source, a shorter last batch completed with rows of itself drawn at random.
        y: ``(N, units)`` (one-hot for categorical cross-entropy), ``(N,)`` 0-based class ids for
            ``sparse_categorical_crossentropy`` (for several outputs a list, or a dict by output layer name).
        epochs: passes over the data. batch_size: samples per step; a batch_size larger than the training
            samples trains on batches of all of them (as Keras does).
        validation_split: the last fraction of the samples (taken before shuffling) validates instead of
            training. validation_data: ``(x_val, y_val)`` or ``(x_val, y_val, sample_weight_val)``.
        class_weight: ``{class id: weight}`` scales each sample's loss by its class's weight.
        sample_weight: ``(N,)`` per-sample loss weights.
        verbose: Keras' values, printed to stderr: 1 (the default; True) or ``"auto"`` show a progress bar over
            the batches (only when stderr is a terminal: none in a log file or a pipe) and a summary line per
            epoch (losses, accuracies, seconds, samples/s); 2 prints the summary line per epoch only, never a
            bar (Keras' one line per epoch, for logs); 0 (False) prints nothing. Callbacks' own messages
            (early stopping, a checkpoint with its ``verbose=1``) are theirs.
        callbacks: ggmlR callbacks (``ggml_callback_early_stopping``, the LR schedules, dicts or objects
            with ``on_epoch_begin``/``on_epoch_end``); a value a callback puts in ``logs`` under a new key
            reaches the later callbacks and becomes a history column (Keras' way of adding a metric).
        shuffle: reshuffle the training samples every epoch (numpy's global random state seeds it).
        initial_epoch: the number of the first epoch minus one (continuing a fit): epochs
            ``initial_epoch + 1 .. initial_epoch + epochs`` run (ggmlR's contract: ``epochs`` more). Keras'
            ``fit(epochs=E, initial_epoch=I)`` runs up to epoch E: write ``epochs=E - I, initial_epoch=I``.
        nbatch_logical: accumulate gradients over this many samples (a multiple of ``batch_size``) per
            optimizer step.
        on_nonfinite: a NaN/inf training loss stops training with a ValueError ("raise", the default; the
            exception carries the history of the completed epochs as ``.history``) or only warns ("warn").
        steps_per_epoch: batches per epoch (default None: one pass over the data). As in Keras 3, an epoch
            then takes the next ``steps_per_epoch`` batches of the current pass, which continues across
            epochs; when the pass runs out its epoch ends early and the next epoch starts a new
            (reshuffled) pass. More than one pass's batches is an error.

    Every sample trains in every epoch: when N is not a multiple of ``batch_size`` the last batch is
    completed with samples drawn at random from the rest (a few count twice in that step). Validation
    uses the inference graph over every validation sample.

    The optimizer's state (AdamW's moments and step count) belongs to the compiled model, as in Keras:
    a second ``ggml_fit`` (or ``ggml_fit_generator``, or a ``ggml_trainer``) continues where the first
    stopped, also after an exception or Ctrl-C; ``ggml_compile`` starts it afresh, and
    ``ggml_save_model(..., include_optimizer=True)`` saves it. With ``nbatch_logical``, a fit that ends
    inside a logical batch drops that batch's accumulated gradients (with a warning).

    Value: the history DataFrame of ``ggml_fit_opt``: ``epoch, train_loss, train_accuracy, val_loss,
    val_accuracy`` (NaN where not computed), then ``train_<metric>, val_<metric>`` for each metric compiled
    beyond accuracy (``train_auc``, ``val_auc``); multi-output models add per-output frames in ``attrs``. On a GPU
    the first training step is watched: ``history.attrs["placement"]`` says where it ran (as
    ``ggml_model_placement``), and a warning names any op it left on the CPU.

    Example:
        >>> history = g.ggml_fit(model, x, y, epochs=10, batch_size=32, validation_split=0.2)
    """
    cfg = compiled(model, "ggml_fit")
    epochs = c_int_arg(None, "epochs", epochs, 0)
    initial_epoch = c_int_arg(None, "initial_epoch", initial_epoch, 0)
    batch_size = c_int_arg(None, "batch_size", batch_size, 1)
    if not isinstance(shuffle, bool):
        raise GgmlValueError(f"shuffle must be True or False, got {shuffle!r}")
    if y is None and is_batch_sequence(x):  # Keras' fit(PyDataset): its batches, as ggml_fit_generator takes them
        given = [k for k, v in (("validation_split", validation_split), ("class_weight", class_weight),
                                ("sample_weight", sample_weight)) if v not in (None, 0, 0.0)]
        if given:
            raise GgmlValueError(f"ggml_fit: {', '.join(given)} cannot be used with a PyDataset-like x (its batches "
                                 "bring their own sample weights; give validation_data for validation)")
        return _fit_generator(model, x, steps_per_epoch=steps_per_epoch, epochs=epochs, initial_epoch=initial_epoch,
                              validation_data=validation_data, callbacks=callbacks, verbose=verbose,
                              nbatch_logical=nbatch_logical, on_nonfinite=on_nonfinite)
    if x is None or y is None:
        raise GgmlValueError("ggml_fit needs x and y arrays, or a PyDataset-like x (use ggml_fit_generator for "
                             "other sources of batches)")
    xs = D.model_inputs(model, x, finite=True)
    n = xs[0].shape[0]
    ys = D.model_targets(model, cfg, y, xs)
    w = D.sample_weights(cfg, ys, n, sample_weight, class_weight)
    if not is_real(validation_split) or not 0 <= validation_split < 1:
        raise GgmlValueError(f"validation_split must be a number in [0, 1), got {validation_split!r}")
    val = None
    if validation_data is not None:
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
            raise GgmlValueError("validation_data must be (x_val, y_val) or (x_val, y_val, sample_weight_val)")
        vx = D.model_inputs(model, validation_data[0], "validation_data x", finite=True)
        vy = D.model_targets(model, cfg, validation_data[1], vx, "validation_data y")
        vw = D.sample_weights(cfg, vy, vx[0].shape[0], validation_data[2] if len(validation_data) == 3 else None,
                              None, "validation_data sample_weight")
        val = (vx, vy, vw)
    elif validation_split:
        n_val = int(math.floor(n * validation_split))
        if n_val < 1 or n_val >= n:
            raise GgmlValueError(f"validation_split={validation_split} of {n} samples leaves "
                                 f"{n_val} for validation and {n - n_val} for training; both need at least one")
        cut = n - n_val
        val = ([a[cut:] for a in xs], [a[cut:] for a in ys], None if w is None else w[cut:])
        xs, ys, w = [a[:cut] for a in xs], [a[:cut] for a in ys], None if w is None else w[:cut]
        n = cut
    batch = min(batch_size, n)
    rng = np.random.default_rng(np.random.randint(0, 2 ** 31))
    batches = D.training_batches(cfg.heads, xs, ys, w, batch, shuffle, rng)
    if steps_per_epoch is not None:
        steps_per_epoch = c_int_arg(None, "steps_per_epoch", steps_per_epoch, 1)
        per_pass = -(-n // batch)
        if steps_per_epoch > per_pass:
            raise GgmlValueError(f"steps_per_epoch={steps_per_epoch}, but the {n} training samples give "
                                 f"{per_pass} batches of {batch} per pass; use steps_per_epoch <= {per_pass} (or "
                                 "None for one pass per epoch), or a smaller batch_size")
        batches = D.continuing_passes(batches, per_pass, steps_per_epoch)
    source = Source(batches, "x/y")

    validate = None
    if val is not None:
        vx, vy, vw = val

        def validate_arrays() -> EpochStats:  # the inference graph over every validation sample
            return _stats(_evaluate_arrays(model, cfg, model.runtime.predictor, vx, vy, vw, batch))
        validate = validate_arrays
    plan = EpochPlan(epochs, initial_epoch, steps_per_epoch, callbacks=callbacks, silent=_verbose(verbose),
                     bar=verbose != 2, stream=False, on_nonfinite=check_nonfinite(on_nonfinite), model=model,
                     weights=ModelWeights(model))
    make_runner = runner_factory(model, cfg, batch, sample_weighted=w is not None, nbatch_logical=nbatch_logical,
                                 input_shapes=input_shapes_of(model, xs))
    return fit_streamed(make_runner, plan, source, validate=validate, opt_state=model.runtime.opt_state)


@functools.wraps(fit_model)
def ggml_fit(model: Any, *args: Any, **kwargs: Any) -> pd.DataFrame:
    if isinstance(model, Scheduler):  # ggmlR's dispatch: ggml_fit(sched, ctx_compute, inputs, outputs, dataset, ...)
        return ggml_fit_opt(model, *args, **kwargs)
    compiled(model, "ggml_fit")
    with model_in_use(model, training=True):
        return fit_model(model, *args, **kwargs)


ggml_fit.__name__ = ggml_fit.__qualname__ = "ggml_fit"  # its errors name it (functools.wraps took fit_model's)


def nothing_to_train(model: Model) -> str:
    if any(p.trainable for layer in model.layers for p in (layer.params or [])):
        return "nothing to train: every layer with weights is frozen (ggml_unfreeze_weights)"
    return "nothing to train: the model has no layer with trainable weights"


class _BatchConverter:
    """Checks and converts each sample-major batch of a generator into ggml layout."""

    def __init__(self, model: Model, cfg: CompileConfig, what: str, batch: int | None, weighted: bool | None,
                 last: Callable[[], bool] | None = None) -> None:
        self.model, self.cfg, self.what, self.batch, self.weighted = model, cfg, what, batch, weighted
        self.last = last   # whether the batch being converted is a PyDataset's last, which is completed if shorter
        self.rng = np.random.default_rng(np.random.randint(0, 2 ** 31))

    def arrays(self, batch: object) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None]:
        x, y, sw = D.split_batch(batch, self.what)
        xs = D.model_inputs(self.model, x, f"{self.what} x", finite=True)
        n = xs[0].shape[0]
        short = self.batch is not None and n < self.batch and self.last is not None and self.last()
        if self.batch is not None and n != self.batch and not short:
            if self.last is not None:   # a PyDataset: only its last batch may be shorter
                raise GgmlValueError(f"{self.what}: a batch of {n} samples before the PyDataset's last batch, where "
                                     f"the first had {self.batch}: only the last batch may have fewer (Keras' rule, "
                                     f"completed here); give every other batch {self.batch} samples")
            raise GgmlValueError(f"{self.what}: a batch of {n} samples; the first batch had {self.batch} and "
                                 "every training batch must have that many (drop or pad the last one, or use "
                                 "ggml_fit, which handles a last partial batch)")
        ys = D.model_targets(self.model, self.cfg, y, xs, f"{self.what} y")
        w = D.sample_weights(self.cfg, ys, n, sw, None, f"{self.what} sample_weight")
        if short:  # a PyDataset's last batch (Keras' ceil(N / batch)): completed as ggml_fit completes its last
            # partial batch, here with rows of this batch drawn at random (they count twice in this one step)
            rows = np.concatenate([np.arange(n), self.rng.integers(0, n, self.batch - n)])
            xs, ys = [a[rows] for a in xs], [a[rows] for a in ys]
            w = None if w is None else w[rows]
        if self.weighted is None:  # validation: weights or not, batch by batch
            return xs, ys, w
        if self.weighted and w is None:
            w = np.ones(n, dtype=np.float32)
        elif not self.weighted and w is not None:
            raise GgmlValueError(f"{self.what}: a batch has sample weights but the first batch had none; give "
                                 "every batch weights or none")
        return xs, ys, w

    def __call__(self, batch: object) -> dict:
        xs, ys, w = self.arrays(batch)
        return D.feed_dict(self.cfg.heads, xs, ys, w)


def ggml_fit_generator(model: Model, generator: object, steps_per_epoch: int | None = None, epochs: int = 1,
                       initial_epoch: int = 0, validation_data: object = None, validation_steps: int | None = None,
                       callbacks: Sequence[Callback] | None = None, verbose: int = 1, prefetch: int = 0,
                       nbatch_logical: int | None = None, on_nonfinite: str = "raise") -> pd.DataFrame:
    """Train a compiled model from a stream of sample-major batches, one batch in memory at a time.

    Arguments:
        model: a compiled model.
        generator: ``ggml_fit_opt_gen``'s source kinds: a function returning one batch or None (ends
            the epoch), a generator function (called once per epoch), a re-iterable such as a list or a
            DataLoader (iterated once per epoch), an iterator (consumed across epochs), or an object with
            Keras' ``PyDataset`` protocol (``__len__``, ``__getitem__``, ``on_epoch_end``). A batch is
            ``(x, y)`` or ``(x, y, sample_weight)`` in the user's orientation (as for ``ggml_fit``). The
            batch size is the first batch's; a later batch of another size is a ValueError, except a shorter
            last batch of a PyDataset (Keras' ``ceil(N / batch)`` batches), completed to the batch size with
            rows of itself drawn at random.
        steps_per_epoch: batches per epoch (default: until the source ends the epoch).
        epochs, initial_epoch, callbacks: as for ``ggml_fit``.
        verbose: as for ``ggml_fit``: 1 (the default; True) or ``"auto"`` a progress bar (on a terminal) and a
            summary line per epoch, 2 the summary line only, 0 (False) nothing.
        validation_data: ``(x_val, y_val)`` arrays, or a source of batches of the same kinds (any batch
            size); validation runs the inference graph. validation_steps: batches per validation, from the
            source's beginning each epoch where it can start again (an iterator continues where it was).
        prefetch: read up to this many batches ahead in a background thread while ggml computes.
        nbatch_logical: samples per optimizer step (gradient accumulation), a multiple of the batch size.
        on_nonfinite: "raise" (default) or "warn" on a NaN/inf training loss, as for ``ggml_fit``.

    Value: the history DataFrame of ``ggml_fit_opt_gen`` (with the ``steps`` column).

    Example:
        >>> def batches():                      # a new pass (and augmentation) every epoch
        ...     for i in range(0, len(x) - 63, 64):  # whole batches of 64 (ggml_fit pads a last partial one)
        ...         yield augment(x[i:i + 64]), y[i:i + 64]
        >>> g.ggml_fit_generator(model, batches, epochs=5)
    """
    compiled(model, "ggml_fit_generator")
    _check_batch_source(generator)
    with model_in_use(model, training=True):  # from the first batch on: no compile/free/freeze meanwhile
        return _fit_generator(model, generator, steps_per_epoch=steps_per_epoch, epochs=epochs,
                              initial_epoch=initial_epoch, validation_data=validation_data,
                              validation_steps=validation_steps, callbacks=callbacks, verbose=verbose,
                              prefetch=prefetch, nbatch_logical=nbatch_logical, on_nonfinite=on_nonfinite)


def _check_batch_source(source: object) -> None:
    """Arrays in memory given where a source of batches is expected: each would be read as one batch (its rows
    as the (x, y) pair), so say which function takes arrays."""
    def is_array(v: object) -> bool:
        return isinstance(v, np.ndarray) or type(v).__name__ in ("DataFrame", "Series")
    arrays = is_array(source) or (isinstance(source, (tuple, list)) and 2 <= len(source) <= 3
                                  and all(is_array(v) for v in source))
    if arrays:
        given = type(source).__name__ if is_array(source) else f"a {type(source).__name__} of arrays (x, y)"
        raise GgmlTypeError(f"ggml_fit_generator: expected a source of batches (a generator function, a function "
                            f"returning one batch, an iterator or a list of (x, y) batches), got {given}; for "
                            "arrays in memory use ggml_fit(model, x, y, batch_size=...), which batches them itself")


def _fit_generator(model: Model, generator: object, *, steps_per_epoch: int | None, epochs: int, initial_epoch: int,
                   validation_data: object, validation_steps: int | None = None, callbacks: object,
                   verbose: int | bool, prefetch: int = 0, nbatch_logical: int | None,
                   on_nonfinite: str) -> pd.DataFrame:
    """The streamed fit of ``ggml_fit_generator`` and of ``ggml_fit`` on a PyDataset-like x, every setting by
    keyword."""
    import pandas as pd  # the history's type
    cfg = model.compiled
    epochs = c_int_arg(None, "epochs", epochs, 0)
    initial_epoch = c_int_arg(None, "initial_epoch", initial_epoch, 0)
    prefetch = c_int_arg(None, "prefetch", prefetch, 0)
    for name, v in (("steps_per_epoch", steps_per_epoch), ("validation_steps", validation_steps)):
        if v is not None:
            c_int_arg(None, name, v, 1)
    source = Source(generator, "generator")
    check_ends(source, steps_per_epoch, "steps_per_epoch")
    first = source.peek() if epochs > 0 else None
    if first is None:
        if epochs > 0:
            warnings.warn("the generator gave no batch: nothing was trained", GgmlpyWarning, stacklevel=2)
        from ...training.history import History  # pandas: imported when a fit ends
        return History({c: pd.Series(dtype=float) for c in HISTORY_COLUMNS + ["steps"]})
    probe = _BatchConverter(model, cfg, "generator", None, None)
    xs, _, w = probe.arrays(first)
    batch = xs[0].shape[0]
    source.transform = _BatchConverter(model, cfg, "x (a PyDataset)" if is_batch_sequence(generator) else "generator",
                                       batch, w is not None,
                                       last=(lambda: source.served_last) if is_batch_sequence(generator) else None)
    validate = _validation(model, cfg, validation_data, validation_steps, batch)
    plan = EpochPlan(epochs, initial_epoch, steps_per_epoch, callbacks=callbacks, silent=_verbose(verbose),
                     bar=verbose != 2, prefetch=prefetch, stream=True, on_nonfinite=check_nonfinite(on_nonfinite),
                     model=model, weights=ModelWeights(model))
    make_runner = runner_factory(model, cfg, batch, sample_weighted=w is not None, nbatch_logical=nbatch_logical,
                                 input_shapes=input_shapes_of(model, xs))
    return fit_streamed(make_runner, plan, source, validate=validate, opt_state=model.runtime.opt_state)


def _validation(model: Model, cfg: CompileConfig, validation_data: object, steps: int | None,
                batch: int) -> Callable[[], EpochStats] | None:
    if validation_data is None:
        return None
    # a tuple is (x, y[, w]) arrays, as for ggml_fit (lists of arrays for several inputs or outputs); a list
    # of arrays too, while a list of batches is a re-iterable source
    if isinstance(validation_data, tuple) and len(validation_data) in (2, 3) or \
            isinstance(validation_data, list) and len(validation_data) in (2, 3) and \
            all(isinstance(v, np.ndarray) or v is None for v in validation_data):
        vx = D.model_inputs(model, validation_data[0], "validation_data x", finite=True)
        vy = D.model_targets(model, cfg, validation_data[1], vx, "validation_data y")
        vw = D.sample_weights(cfg, vy, vx[0].shape[0], validation_data[2] if len(validation_data) == 3 else None,
                              None, "validation_data sample_weight")
        return lambda: _stats(_evaluate_arrays(model, cfg, model.runtime.predictor, vx, vy, vw, batch))
    source = Source(validation_data, "validation_data", restart=True)
    check_ends(source, steps, "validation_steps")
    return lambda: _stats(_evaluate_source(model, cfg, source, steps, batch, "validation_data"))


def _evaluate_source(model: Model, cfg: CompileConfig, source: Source, steps: int | None, batch: int,
                     what: str) -> Tally:
    """The inference graph over one epoch of a source of ``(x, y[, w])`` batches of any sizes."""
    convert = _BatchConverter(model, cfg, what, None, None)
    tally = Tally(cfg.heads, cfg.head_metrics, weight_penalty(model.runtime.params))
    source.start_epoch()
    k = 0
    while steps is None or k < steps:
        b = source.next_batch()
        if b is None:
            break
        xs, ys, w = convert.arrays(b)
        _evaluate_arrays(model, cfg, model.runtime.predictor, xs, ys, w, batch, tally)
        k += 1
    if k == 0:
        warnings.warn(f"{what} gave no batch: the loss is NaN", GgmlpyWarning, stacklevel=3)
    return tally
