"""ggmlR's callback protocol and its four built-in callbacks.

A callback is a dict with optional ``"on_epoch_begin"`` / ``"on_epoch_end"`` entries, or
any object with methods of those names, called as ``f(epoch, logs, state)``. Callbacks
run in list order; as soon as one sets ``state.stop`` the rest of that phase is skipped (but for the
recorders, the CSV logger and the model checkpoint, which still record that epoch). A value a callback logs
under a new key reaches the later callbacks and the history (Keras' rule); the measured values cannot be
changed by a callback.
"""
from __future__ import annotations

import copy
import difflib
import functools
import inspect
import math
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.args import FLOAT32_MAX, float_arg, int_arg, is_real, learning_rate_arg, LR_FLOOR
from ..errors import GgmlpyWarning, GgmlTypeError, GgmlValueError
from ..opt.params import LrUserdata
from .config import Callback, ModelWeights


PHASES = ("on_epoch_begin", "on_epoch_end")


class BuiltinCallback(dict):
    """A built-in callback: the dict of hooks ggmlR's protocol takes, whose closures hold its state (best value,
    wait, captured rate). The same object reused for another fit keeps that state (ggmlR's rule); a deep copy or a
    pickle (scikit-learn's ``clone``, a process pool) makes it again from its arguments, so the copy starts fresh."""

    def __init__(self, hooks: dict, factory: Callable, args: tuple, kwargs: dict) -> None:
        super().__init__(hooks)
        self._remake = (factory, args, kwargs)

    def __deepcopy__(self, memo: dict) -> BuiltinCallback:
        factory, args, kwargs = self._remake
        return factory(*copy.deepcopy(args, memo), **copy.deepcopy(kwargs, memo))

    def __reduce__(self) -> tuple:
        return (_remake, self._remake)


def _remake(factory: Callable, args: tuple, kwargs: dict) -> BuiltinCallback:
    return factory(*args, **kwargs)


def remakeable(factory: Callable[..., dict]) -> Callable[..., BuiltinCallback]:
    """Make a built-in's dict a ``BuiltinCallback`` that remembers how it was made."""
    @functools.wraps(factory)
    def make(*args: object, **kwargs: object) -> BuiltinCallback:
        return BuiltinCallback(factory(*args, **kwargs), make, args, kwargs)
    return make


@dataclass
class FitState:
    """The one mutable object a fit shares with its callbacks, the ``state`` of ``f(epoch, logs, state)``.

    Fields: ``lr_ud``, the optimizer's parameters for the coming steps (``lr_ud.adamw`` and ``lr_ud.sgd`` are
    the learning rates, ``lr_ud.set(adamw_lr=, sgd_lr=)`` or ``ggml_opt_set_lr(state.lr_ud, ...)`` changes
    them); ``nepoch``, the number of the fit's last epoch; ``epoch``, the current one (from 1); ``stop``, set
    it True to end training after this phase; ``optimizer``, ``"adamw"`` or ``"sgd"`` (which of ``lr_ud``'s rates the
    optimizer reads: ``"sgd"`` also for SGD with momentum, RMSprop and Adagrad); in a model-layer fit
    (``ggml_fit``, ``ggml_fit_generator``) ``model``, the model being trained, and ``weights``, its weights as
    ``weights.get()`` copies and ``weights.set(copy)`` restores them (None in the low-level fits)."""
    lr_ud: LrUserdata
    nepoch: int
    stop: bool = False
    epoch: int = 0
    optimizer: str = "adamw"   # which rate the schedules report
    warned_no_validation: bool = False
    model: object = None       # the model of a model-layer fit (ggml_fit, ggml_fit_generator), else None
    weights: ModelWeights | None = None  # that model's weights for callbacks: get() -> snapshot, set(snapshot)


_MISSING = object()


def state_get(state: object, name: str, default: object = _MISSING) -> Any:  # whatever the state holds
    """A field of the state a callback is given: a fit's FitState, or one the caller built (an object with
    attributes or a dict, as ggmlR's tests build a list), where ``optimizer`` and ``stop`` may be absent."""
    value = state.get(name, default) if isinstance(state, dict) else getattr(state, name, default)
    if value is _MISSING:
        raise GgmlTypeError(f"the callback's state has no {name!r}: give it {name} (a fit passes a FitState with "
                            "lr_ud, the LrUserdata of ggml_opt_get_lr/ggml_opt_set_lr, and nepoch)")
    return value


def state_set(state: object, name: str, value: object) -> None:
    if isinstance(state, dict):
        state[name] = value
    else:
        setattr(state, name, value)


def _hook(cb: object, phase: str) -> Callable[..., object] | None:
    fn = cb.get(phase) if isinstance(cb, dict) else getattr(cb, phase, None)
    return fn if callable(fn) else None


class CallbackList:
    def __init__(self, callbacks: Sequence[Callback] | Callback | None) -> None:
        if callbacks is None:
            callbacks = []
        if isinstance(callbacks, dict) or any(hasattr(callbacks, p) for p in PHASES):
            callbacks = [callbacks]  # a single callback given bare
        if not isinstance(callbacks, (list, tuple)):
            raise GgmlTypeError(f"callbacks must be a list of callbacks, got {type(callbacks).__name__}")
        for i, cb in enumerate(callbacks):
            if not isinstance(cb, dict) and not any(hasattr(cb, p) for p in PHASES):
                raise GgmlTypeError(f"callbacks[{i}] must be a dict with 'on_epoch_begin'/'on_epoch_end' or an "
                                    f"object with those methods, got {type(cb).__name__}")
            _check_hooks(cb, i)
        self.callbacks = list(callbacks)

    def run(self, phase: str, epoch: int, logs: dict, state: FitState, added: dict | None = None) -> dict:
        """Call every callback's ``phase`` hook in list order; returns ``added``, filled in place with the values
        the callbacks put under new keys (Keras' rule: a metric a callback adds reaches the later callbacks and
        the history). Each callback gets its own dict, so overwriting or deleting a measured value reaches
        neither the later callbacks nor the history."""
        added = {} if added is None else added
        stopped = False
        for cb in self.callbacks:
            # ggmlR's rule: once one sets state.stop, the rest of the phase is skipped; ggmlpy's recorders (the CSV
            # logger, the checkpoint) still record the epoch, or the epoch the fit stopped at would be lost
            if stopped and not getattr(cb, "records_every_epoch", False):
                continue
            fn = _hook(cb, phase)
            if fn is not None:
                given = {**logs, **added}
                try:
                    fn(epoch, given, state)
                finally:  # what a callback added before it raised is kept too
                    _collect_additions(given, logs, added)
            stopped = stopped or bool(state.stop)
        return added


def _collect_additions(given: dict, logs: dict, added: dict) -> None:
    """The entries of ``given`` under keys the fit did not log (str keys only: they become history columns)."""
    for key, value in given.items():
        if key in logs:
            continue
        if not isinstance(key, str):
            warnings.warn(f"a callback added logs[{key!r}]: only str keys reach the history and the later callbacks",
                          GgmlpyWarning, stacklevel=4)
            continue
        added[key] = value


def _takes_three(hook: Callable) -> bool:
    """Whether ``hook(epoch, logs, state)`` binds (True when the signature cannot be read: a builtin)."""
    try:
        sig = inspect.signature(hook)
    except (TypeError, ValueError):
        return True
    try:
        sig.bind(0, {}, None)
    except TypeError:
        return False
    return True


def _check_hooks(cb: object, i: int) -> None:
    """A hook that would never be called is an error in a dict (a typo such as 'on_epoch_ends') and a
    warning on an object (Keras callbacks have hooks ggmlpy does not call); a hook must be callable."""
    names = list(cb) if isinstance(cb, dict) else [n for n in dir(cb) if n.startswith("on_")]
    for name in names:
        if name in PHASES:
            hook = cb[name] if isinstance(cb, dict) else getattr(cb, name)
            if hook is not None and not callable(hook):  # None: no hook (R's NULL)
                raise GgmlTypeError(f"callbacks[{i}]['{name}'] must be a function f(epoch, logs, state), got "
                                    f"{type(cb[name] if isinstance(cb, dict) else getattr(cb, name)).__name__}")
            if hook is not None and not _takes_three(hook):
                raise GgmlTypeError(f"callbacks[{i}]['{name}'] is called as f(epoch, logs, state), but its signature "
                                    f"is {name}{inspect.signature(hook)}; add the missing parameters (or *args)")
            continue
        near = difflib.get_close_matches(str(name), PHASES, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        message = (f"callbacks[{i}] has a hook '{name}' that is never called{hint}; the fit functions call "
                   f"{' and '.join(PHASES)}")
        if isinstance(cb, dict):
            raise GgmlValueError(message)
        warnings.warn(message, GgmlpyWarning, stacklevel=5)


# Keras' names for the logged values: its short names, and its accuracy metrics' names (ggmlpy logs every one of
# them as train_accuracy / val_accuracy)
_KERAS_ACCURACIES = ("acc", "categorical_accuracy", "sparse_categorical_accuracy", "binary_accuracy")
MONITOR_ALIASES = {"loss": "train_loss", "accuracy": "train_accuracy",
                   **{name: "train_accuracy" for name in _KERAS_ACCURACIES},
                   **{f"val_{name}": "val_accuracy" for name in _KERAS_ACCURACIES}}


def monitor_key(monitor: object) -> str:
    if not isinstance(monitor, str) or not monitor:
        raise GgmlValueError(f"monitor must be the name of a logged value such as 'val_loss', got {monitor!r}")
    return MONITOR_ALIASES.get(monitor, monitor)


def monitor_mode(monitor: str, mode: str) -> str:
    if mode not in ("auto", "min", "max"):
        raise GgmlValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
    if mode == "auto":
        return "min" if any(word in monitor for word in LOWER_IS_BETTER) else "max"
    return mode


# what mode "auto" minimises: losses, errors and false counts (Keras' metrics' directions); the rest is maximised
LOWER_IS_BETTER = ("loss", "mae", "mse", "rmse", "error", "false_positives", "false_negatives", "hinge",
                   "divergence")


def monitored_value(logs: dict, monitor: str) -> float | None:
    if monitor not in logs and not monitor.startswith(("train_", "val_")):
        monitor = f"train_{monitor}"  # Keras' name of a training metric ("auc"): ggmlpy logs "train_auc"
    value = logs.get(monitor)
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


class Improvement:
    def __init__(self, monitor: str, min_delta: float, mode: str) -> None:
        self.monitor, self.min_delta, self.mode = monitor, float(min_delta), monitor_mode(monitor, mode)
        self.best = math.inf if self.mode == "min" else -math.inf
        self.wait = 0

    def update(self, value: float) -> bool:
        better = value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        if better:
            self.best, self.wait = value, 0
        else:
            self.wait += 1
        return better


def _say(message: str) -> None:
    if sys.stderr is not None and not getattr(sys.stderr, "closed", False):
        try:
            print(message, file=sys.stderr)
        except (OSError, ValueError):  # a message is never worth stopping a fit for
            pass


def _on_stall(monitor: str, patience: int, min_delta: float, mode: str, act: Callable, fn: str,
              watch: Callable | None = None) -> dict:
    """An on_epoch_end callback that calls ``act(epoch, state, tracker)`` once ``monitor`` has not improved
    by more than ``min_delta`` for ``patience`` epochs (epochs where it is missing or NaN do not count), then
    ``watch(epoch, state, improved)`` after every epoch."""
    monitor = monitor_key(monitor)
    patience = int_arg(fn, "patience", patience, 0)
    min_delta = float_arg(fn, "min_delta", min_delta, finite=True)
    if min_delta < 0:
        raise GgmlValueError(f"{fn}: min_delta must be >= 0 (the smallest change that counts as an improvement), "
                             f"got {min_delta}")
    tracker = Improvement(monitor, min_delta, mode)
    warned: list = []

    def on_epoch_end(epoch: int, logs: dict, state: FitState) -> None:
        value = monitored_value(logs, monitor)
        improved = False
        if value is None:
            if not warned:
                warned.append(True)
                have = ", ".join(k for k, v in logs.items() if not (isinstance(v, float) and math.isnan(v)))
                warnings.warn(f"Epoch {epoch}: the callback monitors '{monitor}', which this fit does not log "
                              f"(logged: {have}); it cannot act until it is (no validation data?)",
                              GgmlpyWarning, stacklevel=4)
        else:
            improved = tracker.update(value)
            if tracker.wait >= patience:  # ggmlR's rule: with patience 0 it acts every epoch, improving or not
                act(epoch, state, tracker)
        if watch is not None:
            watch(epoch, state, improved)

    return {"on_epoch_end": on_epoch_end}


@remakeable
def ggml_callback_early_stopping(monitor: str = "val_loss", patience: int = 5, min_delta: float = 0,
                                 mode: str = "auto", restore_best_weights: bool = False) -> dict:
    """Early stopping: end training when a monitored value stops improving.

    After every epoch the value of ``monitor`` is compared with the best seen so far; once it has not
    improved by more than ``min_delta`` for ``patience`` epochs in a row, training stops (with a
    message) after that epoch. The weights are those of the last epoch unless ``restore_best_weights``.

    Arguments:
        monitor: the log key to watch: ``"val_loss"`` (the default), ``"val_accuracy"``, ``"train_loss"``,
            ``"train_accuracy"``, a compiled metric (``"val_auc"``; Keras' ``"auc"`` is ``"train_auc"``) or a
            per-head key such as ``"val_<head>_loss"``. Epochs where it is
            missing or NaN (e.g. no validation data for ``val_*``) do not count.
        patience: epochs without improvement before stopping (default 5).
        min_delta: the smallest change that counts as an improvement (default 0).
        mode: ``"min"`` (lower is better), ``"max"``, or ``"auto"`` (the default: ``"min"`` for losses and
            errors, keys containing "loss", "mae", "mse", "rmse", "error", "false_positives" or
            "false_negatives", else ``"max"``).
        restore_best_weights: True (Keras' option) keeps a copy of the weights of the best epoch so far and
            writes it back when this callback stops training or the fit ends its last epoch, so the model
            leaves the fit with the weights of its best epoch (the optimizer's moments stay those of the last
            step, as in Keras). Only for the model layer's fits (``ggml_fit``, ``ggml_fit_generator``); a copy
            costs one read of the weights per improving epoch. False (the default): the last epoch's weights.

    Value: a callback dict ``{"on_epoch_end": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> hist = ggml_fit_opt(sched, ctx, x, out, ds, nepoch=100, val_split=0.2,
        ...                     callbacks=[ggml_callback_early_stopping("val_loss", patience=3)])
        >>> hist = g.ggml_fit(model, x, y, epochs=50, validation_split=0.2,
        ...                   callbacks=[g.ggml_callback_early_stopping(patience=3, restore_best_weights=True)])
    """
    fn = "ggml_callback_early_stopping"
    if not isinstance(restore_best_weights, bool):
        raise GgmlTypeError(f"{fn}: restore_best_weights must be True or False, got {restore_best_weights!r}")

    def stop(epoch: int, state: FitState, tracker: Improvement) -> None:
        _say(f"Early stopping at epoch {epoch}: {monitor} has not improved for {tracker.wait} epochs "
             f"(best {tracker.best:.6g})")
        state_set(state, "stop", True)

    best: dict = {}

    def keep_best(epoch: int, state: FitState, improved: bool) -> None:
        weights = state_get(state, "weights", None)
        if weights is None:
            raise GgmlValueError(f"{fn}: restore_best_weights=True needs a fit of the model layer (ggml_fit, "
                                 "ggml_fit_generator); a low-level fit has no model whose weights it could restore")
        if improved:
            best["weights"], best["epoch"] = weights.get(), epoch
        if "weights" in best and (state_get(state, "stop", False) or epoch >= state_get(state, "nepoch")):
            weights.set(best["weights"])
            _say(f"Restored the weights of epoch {best['epoch']}, the best {monitor}")

    return _on_stall(monitor, patience, min_delta, mode, stop, fn, keep_best if restore_best_weights else None)


def _set_lr(state: FitState, adamw: float, sgd: float) -> float:
    """Set both optimizers' learning rates (kept above 0); returns the one of the fit's optimizer."""
    adamw = learning_rate_arg("the scheduled learning rate", adamw, schedule=True)
    sgd = learning_rate_arg("the scheduled learning rate", sgd, schedule=True)
    state_get(state, "lr_ud").set(adamw_lr=adamw, sgd_lr=sgd)
    return sgd if state_get(state, "optimizer", "adamw") == "sgd" else adamw


def _scale_lr(state: FitState, factor: float, floor: float = LR_FLOOR) -> float:
    lr = state_get(state, "lr_ud").get()
    return _set_lr(state, max(lr["adamw"] * factor, floor), max(lr["sgd"] * factor, floor))


@remakeable
def ggml_schedule_step_decay(step_size: int = 10, gamma: float = 0.1) -> dict:
    """Step decay of the learning rate: multiply it by ``gamma`` every ``step_size`` epochs.

    At the start of epochs ``step_size + 1``, ``2 * step_size + 1``, ... the learning rate (of both optimizers) is
    multiplied by ``gamma`` (and kept above 0).

    Arguments:
        step_size: epochs between two decays (an int >= 1, default 10).
        gamma: the factor applied at each decay (default 0.1).

    Value: a callback dict ``{"on_epoch_begin": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> cb = ggml_schedule_step_decay(step_size=5, gamma=0.5)     # halve every 5 epochs
        >>> ggml_fit_opt_gen(sched, ctx, x, out, gen, epochs=20, callbacks=[cb])
    """
    step_size = int_arg("ggml_schedule_step_decay", "step_size", step_size, 1)
    gamma = float_arg("ggml_schedule_step_decay", "gamma", gamma, finite=True)
    if gamma <= 0:
        raise GgmlValueError(f"ggml_schedule_step_decay: gamma must be > 0 (it multiplies the learning rate), "
                             f"got {gamma}")

    def on_epoch_begin(epoch: int, logs: dict, state: FitState) -> None:
        if epoch > 1 and (epoch - 1) % step_size == 0:
            lr = _scale_lr(state, gamma)
            _say(f"Epoch {epoch}: LR reduced to {lr:.6g}")

    return {"on_epoch_begin": on_epoch_begin}


@remakeable
def ggml_schedule_cosine_decay(eta_min: float = 0, T_max: int | None = None) -> dict:  # noqa: N803 - ggmlR's name
    """Cosine annealing of the learning rate from its starting value down to ``eta_min``.

    At the start of each epoch the learning rate (of both optimizers) is set to
    ``eta_min + (eta_max - eta_min) * (1 + cos(pi * (epoch - 1) / T_max)) / 2``, where ``eta_max`` is
    the rate in effect when the first epoch begins (``learning_rate`` of the fit, ggml's 1e-3 by default).

    Arguments:
        eta_min: the final learning rate (default 0; clamped to a tiny positive value, since ggml
            cannot step with 0).
        T_max: the number of epochs of the half cosine, or None (the default: the fit's last epoch
            number, ``initial_epoch + epochs``). The formula goes on past it, as PyTorch's
            ``CosineAnnealingLR``: the rate rises again over the next ``T_max`` epochs.

    Value: a callback dict ``{"on_epoch_begin": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> hist = ggml_fit_opt(sched, ctx, x, out, ds, nepoch=30, learning_rate=1e-3,
        ...                     callbacks=[ggml_schedule_cosine_decay(eta_min=1e-5)])
    """
    if T_max is not None:
        T_max = int_arg("ggml_schedule_cosine_decay", "T_max", T_max, 1)  # noqa: N806 - ggmlR's name
    if not is_real(eta_min) or not 0 <= eta_min <= FLOAT32_MAX:
        raise GgmlValueError(f"eta_min must be a finite number >= 0 that float32 holds (the learning rate ggml "
                             f"keeps, at most {FLOAT32_MAX:.4g}), got {eta_min!r}")
    captured: dict = {}

    def on_epoch_begin(epoch: int, logs: dict, state: FitState) -> None:
        if "eta_max" not in captured:
            captured.update(state_get(state, "lr_ud").get())
            captured["eta_max"] = True
        t_max = T_max if T_max is not None else state_get(state, "nepoch")
        c = 0.5 * (1 + math.cos(math.pi * (epoch - 1) / t_max))
        _set_lr(state, eta_min + (captured["adamw"] - eta_min) * c, eta_min + (captured["sgd"] - eta_min) * c)

    return {"on_epoch_begin": on_epoch_begin}


@remakeable
def ggml_schedule_reduce_on_plateau(monitor: str = "val_loss", factor: float = 0.5, patience: int = 5,
                                    min_lr: float = 1e-7, min_delta: float = 1e-4, mode: str = "auto") -> dict:
    """Reduce the learning rate when a monitored value stops improving.

    Once ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs, the (AdamW)
    learning rate is multiplied by ``factor`` (not below ``min_lr``) and the count starts over (no
    cooldown; the best value is kept).

    Arguments:
        monitor: the log key to watch: ``"val_loss"`` (the default), ``"val_accuracy"``, ``"train_loss"``,
            ``"train_accuracy"``, a compiled metric (``"val_auc"``; Keras' ``"auc"`` is ``"train_auc"``) or a
            per-head key such as ``"val_<head>_loss"``. Epochs where it is
            missing or NaN (e.g. no validation data for ``val_*``) do not count.
        factor: the factor applied at each reduction (default 0.5).
        patience: epochs without improvement before a reduction (default 5).
        min_lr: the learning rate never goes below this (default 1e-7).
        min_delta: the smallest change that counts as an improvement (default 1e-4).
        mode: ``"min"`` (lower is better), ``"max"``, or ``"auto"`` (the default: ``"min"`` for losses and
            errors, keys containing "loss", "mae", "mse", "rmse", "error", "false_positives" or
            "false_negatives", else ``"max"``).

    Value: a callback dict ``{"on_epoch_end": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> cb = ggml_schedule_reduce_on_plateau("val_loss", factor=0.2, patience=2)
    """
    fn = "ggml_schedule_reduce_on_plateau"
    factor = float_arg(fn, "factor", factor, finite=True)
    if not 0 < factor < 1:
        raise GgmlValueError(f"{fn}: factor must be in (0, 1) (it multiplies the learning rate), got {factor}")
    min_lr = float_arg(fn, "min_lr", min_lr, finite=True)
    if min_lr < 0:
        raise GgmlValueError(f"{fn}: min_lr must be >= 0, got {min_lr}")

    def reduce(epoch: int, state: FitState, tracker: Improvement) -> None:
        lr = _scale_lr(state, factor, min_lr)
        _say(f"Epoch {epoch}: {monitor} plateaued, LR reduced to {lr:.6g}")
        tracker.wait = 0  # best is kept; no cooldown (ggmlR's rule)

    return _on_stall(monitor, patience, min_delta, mode, reduce, fn)


@remakeable
def ggml_schedule_learning_rate(schedule: Callable[[int, float], float], verbose: int = 0) -> dict:
    """A learning rate from a function of the epoch and the current rate (Keras' ``LearningRateScheduler``).

    At the start of every epoch ``schedule(epoch_index, lr)`` is called with the epoch's index counted from 0
    (Keras' convention: the fit's first epoch is 0, or ``initial_epoch`` when it continues one) and the learning
    rate in effect (of the fit's optimizer); the rate it returns is set for both optimizers from that epoch on.

    Arguments:
        schedule: a function ``f(epoch_index, lr) -> new_lr``; the new rate must be a finite number > 0 that
            float32 holds (ggml cannot step with 0; return a tiny rate to pause).
        verbose: 1 prints the new rate at each epoch (to stderr), 0 (the default) is silent.

    Value: a callback dict ``{"on_epoch_begin": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> def halve_after_ten(epoch, lr):
        ...     return lr if epoch < 10 else lr * 0.5
        >>> hist = g.ggml_fit(model, x, y, epochs=20, callbacks=[g.ggml_schedule_learning_rate(halve_after_ten)])
    """
    fn = "ggml_schedule_learning_rate"
    if not callable(schedule):
        raise GgmlTypeError(f"{fn}: schedule must be a function f(epoch_index, lr) -> new_lr, got "
                            f"{type(schedule).__name__}")
    try:
        inspect.signature(schedule).bind(0, 1e-3)
    except TypeError:
        raise GgmlTypeError(f"{fn}: schedule is called as f(epoch_index, lr), but its signature is "
                            f"{inspect.signature(schedule)}; give it both parameters (Keras' form)") from None
    except ValueError:  # a builtin whose signature cannot be read: its call will tell
        pass
    verbose = int_arg(fn, "verbose", verbose, 0)

    def on_epoch_begin(epoch: int, logs: dict, state: FitState) -> None:
        rates = state_get(state, "lr_ud").get()
        current = rates["sgd"] if state_get(state, "optimizer", "adamw") == "sgd" else rates["adamw"]
        new = schedule(epoch - 1, current)
        if not is_real(new) or not 0 < float(new) <= FLOAT32_MAX:
            raise GgmlValueError(f"{fn}: schedule({epoch - 1}, {current:.6g}) returned {new!r}; it must return the "
                                 "new learning rate, a finite number > 0 (return a tiny rate to pause training)")
        lr = _set_lr(state, float(new), float(new))
        if verbose:
            _say(f"Epoch {epoch}: learning rate set to {lr:.6g}")

    return {"on_epoch_begin": on_epoch_begin}
