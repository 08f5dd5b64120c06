"""Keras' ``CSVLogger``: each epoch's logged values appended to a CSV file as training goes."""
from __future__ import annotations

import csv
import math
import os
import weakref

from ..errors import GgmlTypeError, GgmlValueError


def ggml_callback_csv_logger(path: str | os.PathLike[str], separator: str = ",", append: bool = False) -> _CsvLogger:
    """Write each epoch's logged values to a CSV file as training goes (Keras' ``CSVLogger``).

    The file gets a header row ``epoch`` plus the keys logged after the first epoch (``train_loss``,
    ``train_accuracy``, ``val_loss``, ``val_accuracy``, per-output keys, ...), then one row per epoch with the
    epoch number as the history counts it (from 1, ggmlR's convention). Each row is flushed when its epoch
    ends, so a fit that is interrupted or crashes keeps the epochs it finished. A value missing in a later
    epoch is written as an empty field; keys that first appear later are not added (as Keras does). Keras'
    ``CSVLogger`` names the same values without the ``train_`` prefix (``loss``, ``accuracy``, ``val_loss``,
    ``mae``) and counts epochs from 0: its row ``epoch=e`` is this file's ``epoch=e+1`` (``history.history`` of
    ``ggml_fit`` has Keras' names).

    Arguments:
        path: the file to write (a str or ``os.PathLike``); its folder must exist.
        separator: the field separator (one character, default ``","``).
        append: False (the default) starts the file anew at the first epoch of the fit; True adds the rows of
            this fit after the existing ones (the header only when the file is empty or missing).

    Value: a callback object with ``on_epoch_begin``/``on_epoch_end`` for the ``callbacks`` list.

    Example:
        >>> hist = g.ggml_fit(model, x, y, epochs=10, callbacks=[g.ggml_callback_csv_logger("training.csv")])
        >>> import pandas as pd; pd.read_csv("training.csv").tail(1)
    """
    return _CsvLogger(path, separator, append)


class _CsvLogger:
    records_every_epoch = True  # runs after a callback before it stopped the fit (CallbackList.run)

    def __init__(self, path: object, separator: str, append: bool) -> None:
        fn = "ggml_callback_csv_logger"
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise GgmlTypeError(f"{fn}: path must be a file name (str or os.PathLike), got {path!r}")
        if not isinstance(separator, str) or len(separator) != 1 or separator in "\r\n\"":
            raise GgmlValueError(f"{fn}: separator must be one character other than a quote or a newline, got "
                                 f"{separator!r}")
        if not isinstance(append, bool):
            raise GgmlTypeError(f"{fn}: append must be True or False, got {append!r}")
        folder = os.path.dirname(os.path.abspath(os.fspath(path)))
        if not os.path.isdir(folder):
            raise GgmlValueError(f"{fn}: the folder {folder!r} does not exist; create it first")
        self.path, self.separator, self.append = os.fspath(path), separator, append
        self.keys: list[str] | None = None
        # which fit the file belongs to (each fit passes its own state): a weak reference, or the id of a dict
        self._fit: weakref.ref[object] | int | None = None

    def _same_fit(self, state: object) -> bool:
        if isinstance(self._fit, weakref.ref):
            current = self._fit()
            return current is not None and current is state
        return self._fit is not None and self._fit == id(state)

    def on_epoch_begin(self, epoch: int, logs: dict, state: object) -> None:
        if self._same_fit(state):
            return
        try:  # a new fit (an early stop or an interrupt ended the last one, or it ran to its end)
            self._fit = weakref.ref(state)
        except TypeError:  # a state without weak references (a dict): told apart by id
            self._fit = id(state)
        self.keys = None
        if not self.append:
            open(self.path, "w", encoding="utf-8").close()

    def on_epoch_end(self, epoch: int, logs: dict, state: object) -> None:
        self.on_epoch_begin(epoch, logs, state)  # a no-op unless the fit's first call is this one
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter=self.separator)
            if self.keys is None:
                self.keys = [k for k in logs if k != "epoch"]
                if f.tell() == 0:
                    writer.writerow(["epoch"] + self.keys)
            writer.writerow([epoch] + [_csv_value(logs.get(k)) for k in self.keys])
            f.flush()


def _csv_value(v: object) -> object:
    if v is None:
        return ""
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return v
