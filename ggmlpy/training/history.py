"""A fit's history: a pandas DataFrame with ggmlR's columns (``epoch``, ``train_loss``, ``val_loss``, ...), one row
per epoch, that also offers Keras' view of it (``History.history``). Imported when a fit ends (pandas is slow to
import)."""
from __future__ import annotations

import math

import pandas as pd


class History(pd.DataFrame):
    """What ``ggml_fit`` returns: one row per epoch; ``history.history`` is Keras' ``History.history`` dict."""

    @property
    def _constructor(self) -> type[History]:   # pandas' protocol: slices and copies stay histories
        return History

    def __getitem__(self, key: object) -> pd.Series | pd.DataFrame:
        try:
            return super().__getitem__(key)
        except KeyError:
            # Keras' key of a column ("loss" for "train_loss"): say where it is
            if isinstance(key, str) and f"train_{key}" in self.columns:
                raise KeyError(f"{key!r}: the history's columns are ggmlR's ('train_{key}', 'val_...'); Keras' keys "
                               f"are in history.history (history.history[{key!r}])") from None
            raise

    @property
    def history(self) -> dict[str, list[float]]:
        """Keras' ``History.history``: each value's list over the epochs under Keras' key: ``loss``, ``accuracy``,
        each compiled metric by its name, ``<output>_loss`` for a multi-output model, the same with ``val_`` for
        validation, and what callbacks logged (``learning_rate``); values never computed (no validation data) are
        left out, as Keras has no key for them.

        Example:
            >>> h = g.ggml_fit(model, x, y, epochs=3, validation_split=0.2, verbose=0)
            >>> h.history["loss"], h.history["val_accuracy"]
        """
        out: dict[str, list[float]] = {}
        for column in self.columns:
            if column in ("epoch", "steps"):
                continue
            key = column[len("train_"):] if column.startswith("train_") else column
            values = [float(v) if isinstance(v, (int, float)) else v for v in self[column]]
            if all(isinstance(v, float) and math.isnan(v) for v in values):
                continue
            out[key] = values
        return out
