"""Keras' ``Normalization`` preprocessing layer and its ``adapt``: features standardised with a mean and a
variance learned from data (not by the optimizer), ``(x - mean) / max(sqrt(variance), 1e-7)``.

``ggml_layer_adapt(layer, data)`` computes them in float64 from arrays or from an iterable of batches (one
pass, merged batch by batch, so data larger than memory adapts too) and writes them into every compiled model
holding the layer, or keeps them for the model that compiles it next.
"""
from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from ..core.args import FLOAT32_MAX
from ..errors import GgmlInUseError, GgmlTypeError, GgmlValueError
from ..ops.elementwise import ggml_clamp, ggml_div, ggml_sqrt, ggml_sub
from .layers import Layer, LayerOptions, ParamSpec


if TYPE_CHECKING:
    from typing_extensions import Unpack


EPSILON = 1e-7  # Keras' backend epsilon: the smallest standard deviation divided by


class Normalization(Layer):
    """Standardise each feature (the last axis, Keras' ``axis=-1``; ``axis=None``: one mean and variance for
    all values) with a mean and variance set by ``ggml_layer_adapt(layer, data)`` or given here:
    ``(x - mean) / max(sqrt(variance), 1e-7)``. Its two weights are state, not trained, saved with the model;
    before any adapt they are 0 and 1 (the layer passes values through)."""
    kind = "normalization"
    ARG_DOCS = {"axis": "-1: a mean and variance per feature (the last axis); None: one pair for all values."}

    def __init__(self, axis: int | None = -1, mean: np.typing.ArrayLike | None = None,
                 variance: np.typing.ArrayLike | None = None, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if axis is not None and (isinstance(axis, bool) or axis != -1):
            raise GgmlValueError(f"normalization axis must be -1 (each feature of the last axis) or None (all values "
                                 f"together), got {axis!r}")
        self.axis = axis
        if (mean is None) != (variance is None):
            raise GgmlValueError("normalization: give both mean and variance, or neither (then ggml_layer_adapt sets "
                                 "them)")
        self.mean = None if mean is None else _statistic(mean, "mean")
        self.variance = None if variance is None else _statistic(variance, "variance")
        if self.mean is not None and self.variance is not None:  # both or neither (checked above)
            if len(self.mean) != len(self.variance):
                raise GgmlValueError(f"normalization: mean has {len(self.mean)} values, variance {len(self.variance)}")
            if min(self.variance) < 0:
                raise GgmlValueError("normalization: variance must be >= 0")

    def config(self) -> dict:
        return {"axis": self.axis, "mean": self.mean, "variance": self.variance}

    def features(self, shape: tuple) -> int:
        return 1 if self.axis is None else shape[-1]

    def make_params(self, shapes):
        c = self.features(shapes[0])
        adapted = self.__dict__.get("_adapted")
        mean, var = adapted if adapted is not None else (self.mean, self.variance)
        if mean is None:
            mean, var = np.zeros(c), np.ones(c)
        mean, var = np.broadcast_to(np.asarray(mean, np.float64), (c,)) if len(mean) == 1 else np.asarray(mean), \
            np.broadcast_to(np.asarray(var, np.float64), (c,)) if len(var) == 1 else np.asarray(var)
        if len(mean) != c:
            raise GgmlValueError(f"normalization '{self.name}': its mean and variance have {len(mean)} values but its "
                                 f"input has {c} features (shape {shapes[0]}); adapt it to data of this input")
        return [ParamSpec("mean", (c,), "given", trainable=False, value=np.asarray(mean, np.float32)),
                ParamSpec("variance", (c,), "given", trainable=False, value=np.asarray(var, np.float32))]

    def forward(self, g, xs, shapes):
        ctx = g.ctx
        std = ggml_clamp(ctx, ggml_sqrt(ctx, g.param(self, "variance")), EPSILON, FLOAT32_MAX)
        return ggml_div(ctx, ggml_sub(ctx, xs[0], g.param(self, "mean")), std)


def _statistic(value: Any, what: str) -> list[float]:
    arr = np.asarray(value, dtype=np.float64).reshape(-1) if not isinstance(value, str) else None
    if arr is None or arr.size == 0 or not np.all(np.isfinite(arr)) or np.abs(arr).max() > FLOAT32_MAX:
        raise GgmlValueError(f"normalization {what} must be finite numbers (one per feature, or one), "
                             f"got {value!r:.80}")
    return [float(v) for v in arr]


class _Moments:
    """Count, mean and sum of squared deviations per feature, merged batch by batch (Chan et al.'s update:
    exact in float64 whatever the batches' sizes and offsets)."""

    def __init__(self) -> None:
        self.n = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None

    def add(self, rows: np.ndarray) -> None:
        n_b = rows.shape[0]
        if n_b == 0:
            return
        mean_b = rows.mean(axis=0)
        m2_b = ((rows - mean_b) ** 2).sum(axis=0)
        if self.mean is None:
            self.n, self.mean, self.m2 = n_b, mean_b, m2_b
            return
        if mean_b.shape != self.mean.shape:
            raise GgmlValueError(f"ggml_layer_adapt: a batch has {mean_b.shape[0]} features, the first had "
                                 f"{self.mean.shape[0]}")
        n = self.n + n_b
        assert self.m2 is not None  # set with the mean
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta * delta * (self.n * n_b / n)
        self.n = n


def ggml_layer_adapt(layer: Any, data: Any, batch_size: int | None = None) -> Any:
    """Set a normalization layer's mean and variance from data (Keras' ``layer.adapt(data)``).

    The statistics are taken over every axis but the features' (the last; all of them for ``axis=None``), in
    float64, the variance biased (population) as Keras'. The layer may be in compiled models already: their
    weights change at once (not while one of them trains), and a model compiled later starts from them.

    Arguments:
        layer: a normalization layer object (``ggml_normalization()``, or one from ``ggml_get_layer``).
        data: an array ``(N, ..., features)`` of samples, or an iterable of such arrays (batches: a generator,
            a list, a PyDataset-like object's items as ``x`` or ``(x, y)``), read once.
        batch_size: for an array, how many samples are read at a time (default all at once).

    Value: the layer.

    Example:
        >>> norm = g.ggml_normalization()
        >>> g.ggml_layer_adapt(norm, x_train)
        >>> h = g.ggml_apply(g.ggml_input(shape=(4,)), norm)
    """
    fn = "ggml_layer_adapt"
    if not isinstance(layer, Normalization):
        raise GgmlTypeError(f"{fn}: expected a normalization layer (ggml_normalization()), got "
                            f"{getattr(layer, 'kind', type(layer).__name__)}")
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
        raise GgmlValueError(f"{fn}: batch_size must be an int >= 1 or None, got {batch_size!r}")
    moments = _Moments()

    def add(values: Any) -> None:
        if isinstance(values, tuple) and values:  # (x, y) batches: the inputs
            values = values[0]
        arr = np.asarray(values)
        if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
            raise GgmlTypeError(f"{fn}: data must be numbers, got {arr.dtype}")
        arr = arr.astype(np.float64)
        if arr.ndim < 1 or not np.all(np.isfinite(arr)):
            raise GgmlValueError(f"{fn}: data must be finite numbers with a samples axis, got shape {arr.shape}")
        moments.add(arr.reshape(-1, 1) if layer.axis is None else arr.reshape(-1, arr.shape[-1]))
    if isinstance(data, np.ndarray):
        step = batch_size or max(1, len(data))
        for i in range(0, len(data), step):
            add(data[i:i + step])
    elif hasattr(data, "__iter__") and not isinstance(data, (str, bytes, dict)):
        for batch in data:
            add(batch)
    else:
        raise GgmlTypeError(f"{fn}: data must be an array of samples or an iterable of batches, got "
                            f"{type(data).__name__}")
    if moments.n == 0 or moments.mean is None or moments.m2 is None:  # all three go together
        raise GgmlValueError(f"{fn}: the data has no samples")
    mean, var = moments.mean, moments.m2 / moments.n
    if layer.params is not None and layer.params[0].ne[0] != mean.shape[0]:
        raise GgmlValueError(f"{fn}: layer '{layer.name}' normalises {layer.params[0].ne[0]} features, the data has "
                             f"{mean.shape[0]}")
    _write_statistics(layer, mean, var, fn)
    return layer


def _write_statistics(layer: Normalization, mean: np.ndarray, var: np.ndarray, fn: str) -> None:
    """Into every live store holding the layer (the models compiled with it), and into the layer for the next."""
    wrapper = layer.__dict__.get("_wrapper")
    owner = (wrapper() if wrapper is not None else None) or layer   # a wrapper holds its inner layer's weights
    stores = [r() for r in owner.__dict__.get("_param_stores", [])]
    stores = [s for s in stores if s is not None and s.alive]
    if any(s.fits_running for s in stores):
        raise GgmlInUseError(f"{fn}: a model holding layer '{layer.name}' is training; adapt it before or after "
                             "the fit")
    for store in stores:
        store.write(owner, "mean", mean)
        store.write(owner, "variance", var)
    for spec in list(layer.params or []) + (list(owner.params or []) if owner is not layer else []):
        # a store made later (a compile) starts from them
        spec.value = np.asarray(mean if spec.name == "mean" else var, np.float32)
    layer.__dict__["_adapted"] = (mean, var)
    layer.__dict__.pop("_kept_values", None)  # older values the layer carried: the adapted ones replace them

