"""ggmlR's callback protocol and its four built-in callbacks.

A callback is a dict with optional ``"on_epoch_begin"`` / ``"on_epoch_end"`` entries, or
any object with methods of those names, called as ``f(epoch, logs, state)``. Callbacks
run in list order; as soon as one sets ``state.stop`` the rest of that phase is skipped.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import GgmlTypeError, GgmlValueError
from ..opt import LR_FLOOR, LrUserdata

PHASES = ("on_epoch_begin", "on_epoch_end")


@dataclass
class FitState:
    """The one mutable object a fit shares with its callbacks."""
    lr_ud: LrUserdata
    nepoch: int
    stop: bool = False
    epoch: int = 0


def _hook(cb: Any, phase: str) -> Callable | None:
    fn = cb.get(phase) if isinstance(cb, dict) else getattr(cb, phase, None)
    return fn if callable(fn) else None


class CallbackList:
    def __init__(self, callbacks: Sequence[Any] | None) -> None:
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
        self.callbacks = list(callbacks)

    def run(self, phase: str, epoch: int, logs: dict, state: FitState) -> None:
        for cb in self.callbacks:
            fn = _hook(cb, phase)
            if fn is not None:
                fn(epoch, dict(logs), state)  # a fresh dict: mutating it never reaches the history
            if state.stop:
                return


def _mode(monitor: str, mode: str) -> str:
    if mode not in ("auto", "min", "max"):
        raise GgmlValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
    if mode == "auto":
        return "min" if "loss" in monitor else "max"
    return mode


def _monitored(logs: dict, monitor: str) -> float | None:
    value = logs.get(monitor)
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


class _Improvement:
    def __init__(self, monitor: str, min_delta: float, mode: str) -> None:
        self.monitor, self.min_delta, self.mode = monitor, float(min_delta), _mode(monitor, mode)
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
    print(message, file=sys.stderr)


def _on_stall(monitor: str, patience: int, min_delta: float, mode: str, act: Callable) -> dict:
    """An on_epoch_end callback that calls ``act(epoch, state, tracker)`` once ``monitor`` has not improved
    by more than ``min_delta`` for ``patience`` epochs (epochs where it is missing or NaN do not count)."""
    tracker = _Improvement(monitor, min_delta, mode)

    def on_epoch_end(epoch: int, logs: dict, state: FitState) -> None:
        value = _monitored(logs, monitor)
        if value is None:
            return
        tracker.update(value)
        if tracker.wait >= patience:
            act(epoch, state, tracker)

    return {"on_epoch_end": on_epoch_end}


def ggml_callback_early_stopping(monitor: str = "val_loss", patience: int = 5, min_delta: float = 0,
                                 mode: str = "auto") -> dict:
    """Early stopping: end training when a monitored value stops improving.

    After every epoch the value of ``monitor`` is compared with the best seen so far; once it has not
    improved by more than ``min_delta`` for ``patience`` epochs in a row, training stops (with a
    message) after that epoch. The weights are those of the last epoch (no restore of the best).

    Arguments:
        monitor: the log key to watch: ``"val_loss"`` (the default), ``"val_accuracy"``, ``"train_loss"``,
            ``"train_accuracy"`` or a per-head key such as ``"val_<head>_loss"``. Epochs where it is
            missing or NaN (e.g. no validation data for ``val_*``) do not count.
        patience: epochs without improvement before stopping (default 5).
        min_delta: the smallest change that counts as an improvement (default 0).
        mode: ``"min"`` (lower is better), ``"max"``, or ``"auto"`` (the default: ``"min"`` when the key
            contains "loss", else ``"max"``).

    Value: a callback dict ``{"on_epoch_end": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> hist = ggml_fit_opt(sched, ctx, x, out, ds, nepoch=100, val_split=0.2,
        ...                     callbacks=[ggml_callback_early_stopping("val_loss", patience=3)])
    """
    def stop(epoch: int, state: FitState, tracker: _Improvement) -> None:
        _say(f"Early stopping at epoch {epoch}: {monitor} has not improved for {tracker.wait} epochs "
             f"(best {tracker.best:.6g})")
        state.stop = True

    return _on_stall(monitor, patience, min_delta, mode, stop)


def _set_adamw_lr(state: FitState, lr: float) -> float:
    lr = max(float(lr), LR_FLOOR)
    state.lr_ud.set(adamw_lr=lr)
    return lr


def ggml_schedule_step_decay(step_size: int = 10, gamma: float = 0.1) -> dict:
    """Step decay of the learning rate: multiply it by ``gamma`` every ``step_size`` epochs.

    At the start of epochs ``step_size + 1``, ``2 * step_size + 1``, ... the (AdamW) learning rate is
    multiplied by ``gamma`` (and kept above 0).

    Arguments:
        step_size: epochs between two decays (an int >= 1, default 10).
        gamma: the factor applied at each decay (default 0.1).

    Value: a callback dict ``{"on_epoch_begin": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> cb = ggml_schedule_step_decay(step_size=5, gamma=0.5)     # halve every 5 epochs
        >>> ggml_fit_opt_gen(sched, ctx, x, out, gen, epochs=20, callbacks=[cb])
    """
    if not isinstance(step_size, int) or step_size < 1:
        raise GgmlValueError(f"step_size must be an int >= 1, got {step_size!r}")

    def on_epoch_begin(epoch: int, logs: dict, state: FitState) -> None:
        if epoch > 1 and (epoch - 1) % step_size == 0:
            lr = _set_adamw_lr(state, state.lr_ud.get()["adamw"] * gamma)
            _say(f"Epoch {epoch}: LR reduced to {lr:.6g}")

    return {"on_epoch_begin": on_epoch_begin}


def ggml_schedule_cosine_decay(eta_min: float = 0, T_max: int | None = None) -> dict:  # noqa: N803 - ggmlR's name
    """Cosine annealing of the learning rate from its starting value down to ``eta_min``.

    At the start of each epoch the (AdamW) learning rate is set to
    ``eta_min + (eta_max - eta_min) * (1 + cos(pi * (epoch - 1) / T_max)) / 2``, where ``eta_max`` is
    the rate in effect when the first epoch begins (``learning_rate`` of the fit, ggml's 1e-3 by default).

    Arguments:
        eta_min: the final learning rate (default 0; clamped to a tiny positive value, since ggml
            cannot step with 0).
        T_max: the number of epochs of the half cosine, or None (the default: the fit's last epoch
            number, ``initial_epoch + epochs``).

    Value: a callback dict ``{"on_epoch_begin": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> hist = ggml_fit_opt(sched, ctx, x, out, ds, nepoch=30, learning_rate=1e-3,
        ...                     callbacks=[ggml_schedule_cosine_decay(eta_min=1e-5)])
    """
    captured: dict = {}

    def on_epoch_begin(epoch: int, logs: dict, state: FitState) -> None:
        if "eta_max" not in captured:
            captured["eta_max"] = state.lr_ud.get()["adamw"]
        t_max = T_max if T_max is not None else state.nepoch
        eta_max = captured["eta_max"]
        _set_adamw_lr(state, eta_min + 0.5 * (eta_max - eta_min) * (1 + math.cos(math.pi * (epoch - 1) / t_max)))

    return {"on_epoch_begin": on_epoch_begin}


def ggml_schedule_reduce_on_plateau(monitor: str = "val_loss", factor: float = 0.5, patience: int = 5,
                                    min_lr: float = 1e-7, min_delta: float = 1e-4, mode: str = "auto") -> dict:
    """Reduce the learning rate when a monitored value stops improving.

    Once ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs, the (AdamW)
    learning rate is multiplied by ``factor`` (not below ``min_lr``) and the count starts over (no
    cooldown; the best value is kept).

    Arguments:
        monitor: the log key to watch: ``"val_loss"`` (the default), ``"val_accuracy"``, ``"train_loss"``,
            ``"train_accuracy"`` or a per-head key such as ``"val_<head>_loss"``. Epochs where it is
            missing or NaN (e.g. no validation data for ``val_*``) do not count.
        factor: the factor applied at each reduction (default 0.5).
        patience: epochs without improvement before a reduction (default 5).
        min_lr: the learning rate never goes below this (default 1e-7).
        min_delta: the smallest change that counts as an improvement (default 1e-4).
        mode: ``"min"`` (lower is better), ``"max"``, or ``"auto"`` (the default: ``"min"`` when the key
            contains "loss", else ``"max"``).

    Value: a callback dict ``{"on_epoch_end": f}`` for the ``callbacks`` list of the fit functions.

    Example:
        >>> cb = ggml_schedule_reduce_on_plateau("val_loss", factor=0.2, patience=2)
    """
    def reduce(epoch: int, state: FitState, tracker: _Improvement) -> None:
        lr = _set_adamw_lr(state, max(state.lr_ud.get()["adamw"] * factor, min_lr))
        _say(f"Epoch {epoch}: {monitor} plateaued, LR reduced to {lr:.6g}")
        tracker.wait = 0  # best is kept; no cooldown (ggmlR's rule)

    return _on_stall(monitor, patience, min_delta, mode, reduce)
