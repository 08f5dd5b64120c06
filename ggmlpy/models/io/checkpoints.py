"""Callbacks that need the model itself: saving it while it trains (Keras' ``ModelCheckpoint``).

They follow the callback protocol of ``training/callbacks.py`` and take the model from the state a model-layer
fit (``ggml_fit``, ``ggml_fit_generator``) passes; the low-level fits have no model to save.
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any

from ...errors import GgmlpyWarning, GgmlTypeError, GgmlValueError
from ...training.callbacks import Improvement, monitor_key, monitored_value, state_get
from .saving import ggml_save_model, ggml_save_weights


def ggml_callback_model_checkpoint(path: Any, monitor: str = "val_loss", save_best_only: bool = False,
                                   save_weights_only: bool = False, mode: str = "auto", verbose: int = 0) -> Any:
    """Save the model at the end of every epoch, or of every epoch that improves ``monitor`` (Keras'
    ``ModelCheckpoint``).

    Each save is a GGUF file written whole to a temporary name and then renamed, so an interrupted save never
    leaves a truncated checkpoint in place of the last good one. ``path`` may be a pattern that Python's
    ``str.format`` fills with the epoch number (from 1, as the history counts) and the logged values, in
    ggmlpy's names (``{val_loss}``, ``{train_accuracy}``) or Keras' (``{loss}``, ``{accuracy}``): one file per
    epoch, e.g. ``"ckpt-{epoch:02d}-{val_loss:.3f}.gguf"``. Without a pattern the file is overwritten.

    Arguments:
        path: the file to write (str or ``os.PathLike``), or a pattern as above; its folder must exist.
        monitor: the logged value that decides what is best (``"val_loss"``, the default, ``"val_accuracy"``,
            ``"train_loss"``, Keras' ``"loss"``/``"accuracy"``, a per-output key). Only used with
            ``save_best_only``; epochs where it is missing or NaN are not saved then (with a warning once).
        save_best_only: False (the default) saves after every epoch; True only after an epoch whose ``monitor``
            is better than every earlier one of this callback.
        save_weights_only: False (the default) saves the whole model as ``ggml_save_model`` does (architecture,
            compile settings, weights: ``ggml_load_model`` gives it back, a warm restart without the
            optimizer's moments); True saves the weights as ``ggml_save_weights`` (``ggml_load_weights``).
        mode: ``"min"``, ``"max"`` or ``"auto"`` (the default: ``"min"`` for a loss or an error such as MAE).
        verbose: 1 prints a line per save (to stderr), 0 (the default) is silent.

    Value: a callback object for the ``callbacks`` list of ``ggml_fit`` and ``ggml_fit_generator``.

    Example:
        >>> best = g.ggml_callback_model_checkpoint("best.gguf", monitor="val_loss", save_best_only=True)
        >>> hist = g.ggml_fit(model, x, y, epochs=20, validation_split=0.2, callbacks=[best])
        >>> model = g.ggml_load_model("best.gguf")
    """
    return _ModelCheckpoint(path, monitor, save_best_only, save_weights_only, mode, verbose)


class _ModelCheckpoint:
    fn = "ggml_callback_model_checkpoint"
    records_every_epoch = True  # saves the epoch a callback before it stopped the fit at (CallbackList.run)

    def __init__(self, path: Any, monitor: str, save_best_only: bool, save_weights_only: bool, mode: str,
                 verbose: int) -> None:
        fn = self.fn
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise GgmlTypeError(f"{fn}: path must be a file name or pattern (str or os.PathLike), got {path!r}")
        for name, flag in (("save_best_only", save_best_only), ("save_weights_only", save_weights_only)):
            if not isinstance(flag, bool):
                raise GgmlTypeError(f"{fn}: {name} must be True or False, got {flag!r}")
        if verbose not in (0, 1) or isinstance(verbose, bool):
            raise GgmlValueError(f"{fn}: verbose must be 0 or 1, got {verbose!r}")
        self.path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(self.path))
        if "{" not in folder and not os.path.isdir(folder):
            raise GgmlValueError(f"{fn}: the folder {folder!r} does not exist; create it first")
        self.monitor = monitor_key(monitor)
        self.tracker = Improvement(self.monitor, 0.0, mode)
        self.save_best_only, self.save_weights_only, self.verbose = save_best_only, save_weights_only, verbose
        self.warned = False

    def on_epoch_end(self, epoch: int, logs: dict, state: Any) -> None:
        model = state_get(state, "model", None)
        if model is None:
            raise GgmlValueError(f"{self.fn} needs a fit of the model layer (ggml_fit, ggml_fit_generator); a "
                                 "low-level fit has no model to save")
        if self.save_best_only:
            value = monitored_value(logs, self.monitor)
            if value is None:
                if not self.warned:
                    self.warned = True
                    warnings.warn(f"Epoch {epoch}: {self.fn} monitors '{self.monitor}', which this fit does not log "
                                  "(no validation data?); it saves nothing until it is", GgmlpyWarning, stacklevel=4)
                return
            if not self.tracker.update(value):
                return
        target = self._target(epoch, logs)
        if self.save_weights_only:
            ggml_save_weights(model, target)
        else:
            ggml_save_model(model, target)
        if self.verbose:
            print(f"Epoch {epoch}: saved the model to {target}", file=sys.stderr)

    def _target(self, epoch: int, logs: dict) -> str:
        if "{" not in self.path:
            return self.path
        values = {k: (math.nan if v is None else v) for k, v in logs.items()}
        # Keras' names of the training values: "loss", "accuracy", "auc" for ggmlpy's "train_loss", ...
        values.update({k[len("train_"):]: v for k, v in list(values.items()) if k.startswith("train_")})
        try:
            return self.path.format(epoch=epoch, **values)
        except (KeyError, IndexError, ValueError) as exc:
            raise GgmlValueError(f"{self.fn}: the path pattern {self.path!r} cannot be filled ({exc!r}); it may use "
                                 f"{{epoch}} and the logged values {sorted(set(values) | {'epoch'})}") from None
