"""Keras' preprocessing helpers that ports reach for first: one-hot labels (``ggml_to_categorical``) and
padded sequences (``ggml_pad_sequences``), with Keras' semantics, in numpy.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...backend.transfer import as_numeric
from ...core.args import is_int
from ...errors import GgmlTypeError, GgmlValueError


_PAD_SIDES = ("pre", "post")


def ggml_to_categorical(y: Any, num_classes: int | None = None, dtype: str = "float32") -> np.ndarray:
    """One-hot rows from integer class ids, as Keras' ``to_categorical``.

    Arguments:
        y: class ids, integers in ``[0, num_classes)`` (an array, a list, a pandas Series). A trailing axis of
            size 1 is dropped first, so ``(N,)`` and ``(N, 1)`` both give ``(N, num_classes)``; other shapes
            gain a last axis (``(N, T)`` token ids give ``(N, T, num_classes)``).
        num_classes: the number of classes (default: the largest id + 1).
        dtype: the result's numpy dtype (default "float32", what the losses take).

    Value: an array of ``y``'s shape plus a last axis of ``num_classes``, with a 1 at each id.

    Example:
        >>> g.ggml_to_categorical([0, 2, 1], num_classes=3)
        array([[1., 0., 0.], [0., 0., 1.], [0., 1., 0.]], dtype=float32)
    """
    ids = as_numeric(y, "ggml_to_categorical: y")
    if ids.size and (not np.all(np.isfinite(ids)) or np.any(ids != np.round(ids))):
        raise GgmlValueError("ggml_to_categorical: y must hold integer class ids, got non-integral values; "
                             "for labels that are already probabilities, use them as they are")
    ids = ids.astype(np.int64)
    if ids.ndim > 1 and ids.shape[-1] == 1:
        ids = ids.reshape(ids.shape[:-1])
    if ids.size and ids.min() < 0:
        raise GgmlValueError(f"ggml_to_categorical: class ids must be >= 0, got {int(ids.min())}")
    if num_classes is None:
        num_classes = int(ids.max()) + 1 if ids.size else 0
    elif not is_int(num_classes) or num_classes < 1:
        raise GgmlValueError(f"ggml_to_categorical: num_classes must be a positive int, got {num_classes!r}")
    elif ids.size and ids.max() >= num_classes:
        raise GgmlValueError(f"ggml_to_categorical: y holds the id {int(ids.max())}, but num_classes is "
                             f"{num_classes} (ids go from 0 to num_classes - 1)")
    out = np.zeros(ids.shape + (int(num_classes),), dtype=np.dtype(dtype))
    np.put_along_axis(out, ids[..., None], 1, axis=-1)
    return out


def ggml_pad_sequences(sequences: Any, maxlen: int | None = None, dtype: str = "int32", padding: str = "pre",
                       truncating: str = "pre", value: float = 0.0) -> np.ndarray:
    """Sequences of different lengths as one array of equal-length rows, as Keras' ``pad_sequences``.

    Arguments:
        sequences: a list of sequences (lists or 1-D arrays of numbers, or of equal-shaped feature vectors).
        maxlen: the length of every row (default: the longest sequence's).
        dtype: the result's numpy dtype (default "int32", token ids).
        padding: "pre" (the default: values go before the sequence, as in Keras) or "post".
        truncating: sequences longer than ``maxlen`` lose their beginning ("pre", the default) or their end
            ("post").
        value: the padding value (default 0).

    Value: an array ``(len(sequences), maxlen)`` (plus the feature axes of the items, if any).

    Example:
        >>> g.ggml_pad_sequences([[1, 2, 3], [4]], maxlen=2)
        array([[2, 3], [0, 4]], dtype=int32)
    """
    fn = "ggml_pad_sequences"
    if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__len__"):
        raise GgmlTypeError(f"{fn}: expected a list of sequences, got {type(sequences).__name__}")
    for name, side in (("padding", padding), ("truncating", truncating)):
        if side not in _PAD_SIDES:
            raise GgmlValueError(f"{fn}: {name} must be 'pre' or 'post', got {side!r}")
    rows = []
    for i, seq in enumerate(sequences):
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__len__"):
            raise GgmlTypeError(f"{fn}: sequences[{i}] is a {type(seq).__name__}; each sequence is a list or an "
                                "array of numbers")
        arr = as_numeric(seq, f"{fn}: sequences[{i}]") if len(seq) else np.zeros((0,))
        rows.append(arr.reshape((len(seq),) + arr.shape[1:]))
    feature = next((r.shape[1:] for r in rows if len(r)), ())
    for i, r in enumerate(rows):
        if len(r) and r.shape[1:] != feature:
            raise GgmlValueError(f"{fn}: sequences[{i}] has items of shape {r.shape[1:]}, the others {feature}")
    if maxlen is None:
        maxlen = max((len(r) for r in rows), default=0)
    elif not is_int(maxlen) or maxlen < 1:
        raise GgmlValueError(f"{fn}: maxlen must be a positive int or None, got {maxlen!r}")
    out = np.full((len(rows), int(maxlen)) + feature, value, dtype=np.dtype(dtype))
    for i, r in enumerate(rows):
        if not len(r):
            continue
        r = r[-maxlen:] if truncating == "pre" else r[:maxlen]
        if padding == "post":
            out[i, :len(r)] = r
        else:
            out[i, maxlen - len(r):] = r
    return out
