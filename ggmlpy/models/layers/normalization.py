"""The normalisation layers: batch and layer normalisation, and Keras' ``Normalization`` with its ``adapt``.

Batch normalisation, in training, normalises each channel (the last axis of a sample) with the batch's mean and
biased variance, taken over the batch and every other axis, then scales by ``gamma`` and shifts by ``beta``. Each
training step also updates the running statistics from the batch's as in Keras, ``running = momentum * running +
(1 - momentum) * batch``, inside the graph (copied into the layer's state on its device; no trip to the host).
``ggml_predict``/``ggml_evaluate`` use the running statistics.

``Normalization`` standardises features with a mean and a variance learned from data (not by the optimizer),
``(x - mean) / max(sqrt(variance), 1e-7)``. ``ggml_layer_adapt(layer, data)`` computes them in float64 from
arrays or from an iterable of batches (one pass, merged batch by batch, so data larger than memory adapts too)
and writes them into every compiled model holding the layer, or keeps them for the model that compiles it next."""
from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from ...core.args import FLOAT32_MAX, is_real, positive_float32_arg
from ...errors import GgmlInUseError, GgmlTypeError, GgmlValueError
from ...ops.elementwise import (
    ggml_add,
    ggml_clamp,
    ggml_cont,
    ggml_div,
    ggml_mul,
    ggml_norm,
    ggml_scale,
    ggml_scale_bias,
    ggml_sqr,
    ggml_sqrt,
    ggml_sub,
)
from ...ops.layout import ggml_cpy, ggml_reshape, ggml_reshape_1d, ggml_reshape_2d, ggml_transpose
from ...ops.reduce import ggml_repeat, ggml_sum_rows
from ...training.adapters import is_batch_sequence, Source
from .layer import Layer, LayerOptions
from .weight import Weight


if TYPE_CHECKING:
    from typing_extensions import Unpack


def eps_or_epsilon(kind: str, eps: object, epsilon: object) -> object:
    """``eps``, or Keras' ``epsilon`` when given (both given: an error, unless they agree)."""
    if epsilon is None:
        return eps
    if eps != 1e-5 and eps != epsilon:
        raise GgmlValueError(f"{kind}: epsilon is Keras' name for eps; give one of the two, got eps={eps!r} and "
                             f"epsilon={epsilon!r}")
    return epsilon


class BatchNorm(Layer):
    """Batch normalisation over the last axis (features or channels): batch statistics in training, running
    statistics (``momentum``, as Keras) in predict/evaluate, learned ``gamma``/``beta``. A frozen batch norm
    (``trainable=False``, ``ggml_freeze_weights``) runs in inference mode while the rest trains, as in Keras:
    it normalises with its running statistics and leaves them unchanged.

    Example:
        >>> model = g.ggml_layer_batch_norm(model)
    """
    kind = "batch_norm"
    gamma = Weight(initializer="ones")
    beta = Weight(initializer="zeros")
    running_mean = Weight(initializer="zeros", trainable=False)
    running_var = Weight(initializer="ones", trainable=False)

    NOT_SAVED = ("epsilon",)   # Keras' name for eps, kept as eps

    def __init__(self, eps: float = 1e-5, momentum: float = 0.99, epsilon: float | None = None,
                 **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if not is_real(momentum) or not 0 <= momentum <= 1:
            raise GgmlValueError(f"batch_norm momentum must be in [0, 1], got {momentum!r}")
        self.eps = positive_float32_arg("batch_norm eps", eps_or_epsilon("batch_norm", eps, epsilon),
                                        "; the usual value is 1e-5")
        self.momentum = float(momentum)

    def make_params(self, shapes):
        c = shapes[0][-1]
        return [self.gamma.spec((c,)), self.beta.spec((c,)), self.running_mean.spec((c,)),
                self.running_var.spec((c,))]

    def forward(self, g, xs, shapes):
        if not self.trainable:
            return self.predict_forward(g, xs, shapes)
        c = shapes[0][-1]
        rows = int(np.prod(shapes[0][:-1])) * g.batch   # values per channel
        ctx = g.ctx
        x = ggml_reshape_2d(ctx, xs[0], c, rows)

        def channel_mean(t):  # [C, rows] -> [C, 1]; sum_rows works along ne[0], so transpose first
            m = ggml_scale(ctx, ggml_sum_rows(ctx, ggml_cont(ctx, ggml_transpose(ctx, t))), 1 / rows)
            return m

        mean = channel_mean(x)                                          # [1, C]
        centered = ggml_sub(ctx, x, ggml_repeat(ctx, ggml_reshape_2d(ctx, mean, c, 1), x))
        var = channel_mean(ggml_sqr(ctx, centered))                 # biased, as Keras
        std = ggml_sqrt(ctx, ggml_scale_bias(ctx, ggml_reshape_2d(ctx, var, c, 1), 1.0, self.eps))
        normed = ggml_div(ctx, centered, ggml_repeat(ctx, std, centered))
        y = ggml_add(ctx, ggml_mul(ctx, normed, g.param(self, self.gamma)), g.param(self, self.beta))
        # after each step the running statistics take the batch's in, on the device (Keras' update):
        # running = momentum * running + (1 - momentum) * batch
        for weight, batch in ((self.running_mean, mean), (self.running_var, var)):
            running = g.param(self, weight)
            new = ggml_add(ctx, ggml_scale(ctx, running, self.momentum),
                               ggml_scale(ctx, ggml_reshape_1d(ctx, batch, c), 1.0 - self.momentum))
            g.side_output(ggml_cpy(ctx, new, running))
        return ggml_reshape(ctx, y, xs[0])

    def predict_forward(self, g, xs, shapes):
        ctx = g.ctx
        inv_std = ggml_sqrt(ctx, ggml_scale_bias(ctx, g.param(self, self.running_var), 1.0, self.eps))
        scale = ggml_div(ctx, g.param(self, self.gamma), inv_std)
        centered = ggml_sub(ctx, xs[0], g.param(self, self.running_mean))
        return ggml_add(ctx, ggml_mul(ctx, centered, scale), g.param(self, self.beta))


class LayerNorm(Layer):
    """Layer normalisation: each position normalised over its last axis (mean 0, biased variance 1, as
    Keras), then scaled by a learned ``gamma`` and shifted by ``beta``; the same in training and inference.

    Example:
        >>> x = g.ggml_layer_layer_norm(x)
    """
    kind = "layer_norm"
    gamma = Weight(initializer="ones")
    beta = Weight(initializer="zeros")
    mask_support = "propagate"  # each position on its own

    NOT_SAVED = ("epsilon",)   # Keras' name for eps, kept as eps

    def __init__(self, eps: float = 1e-5, epsilon: float | None = None, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.eps = positive_float32_arg("layer_norm eps", eps_or_epsilon("layer_norm", eps, epsilon),
                                        "; the usual value is 1e-5")

    def make_params(self, shapes):
        c = shapes[0][-1]
        return [self.gamma.spec((c,)), self.beta.spec((c,))]

    def forward(self, g, xs, shapes):
        ctx = g.ctx
        normed = ggml_norm(ctx, xs[0], self.eps)     # over ne[0]: the last axis of a sample
        return ggml_add(ctx, ggml_mul(ctx, normed, g.param(self, self.gamma)), g.param(self, self.beta))


if TYPE_CHECKING:
    from typing_extensions import Unpack


EPSILON = 1e-7  # Keras' backend epsilon: the smallest standard deviation divided by


class Normalization(Layer):
    """Keras' Normalization: each feature standardised, ``(x - mean) / max(sqrt(variance), 1e-7)``, with the
    mean and variance of data set by ``ggml_layer_adapt(layer, data)`` (or given as ``mean=``/``variance=``);
    they are saved with the model and not trained. ``axis=None``: one mean and variance for all values. Before
    any adapt they are 0 and 1 (the layer passes values through).

    Example:
        >>> norm = g.ggml_normalization()
        >>> g.ggml_layer_adapt(norm, x_train)
        >>> h = g.ggml_apply(g.ggml_input(shape=(4,)), norm)
    """
    kind = "normalization"
    # the statistics, state rather than trained weights (the attributes mean and variance hold the arguments)
    mean_state = Weight("mean", initializer="given", trainable=False)
    variance_state = Weight("variance", initializer="given", trainable=False)
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
        return [self.mean_state.spec((c,), value=np.asarray(mean, np.float32)),
                self.variance_state.spec((c,), value=np.asarray(var, np.float32))]

    def forward(self, g, xs, shapes):
        ctx = g.ctx
        std = ggml_clamp(ctx, ggml_sqrt(ctx, g.param(self, self.variance_state)), EPSILON, FLOAT32_MAX)
        return ggml_div(ctx, ggml_sub(ctx, xs[0], g.param(self, self.mean_state)), std)


def _statistic(value: Any, what: str) -> list[float]:
    arr = np.asarray(value, dtype=np.float64).reshape(-1) if not isinstance(value, str) else None
    if arr is None or arr.size == 0 or not np.all(np.isfinite(arr)) or np.abs(arr).max() > FLOAT32_MAX:
        raise GgmlValueError(f"normalization {what} must be finite numbers (one per feature, or one), "
                             f"got {value!r:.80}")
    return [float(v) for v in arr]


def is_array_like(data: object) -> bool:
    """An array of samples (numpy, a DataFrame, anything with ``__array__``), not a source of batches."""
    return isinstance(data, np.ndarray) or hasattr(data, "__array__") and not is_batch_sequence(data)


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
    if is_array_like(data):
        data = np.asarray(data)    # an array, a DataFrame, a nested list of numbers
        step = batch_size or max(1, len(data))
        for i in range(0, len(data), step):
            add(data[i:i + step])
    else:   # batches: a generator (function), a list of batches, an iterator, a PyDataset, as a fit reads them
        try:
            source = Source(data, f"{fn}: data")
        except GgmlTypeError:
            raise GgmlTypeError(f"{fn}: data must be an array of samples or a source of batches (a generator, a list "
                                f"of batches, a PyDataset), got {type(data).__name__}") from None
        try:
            source.start_epoch()
            while (batch := source.next_batch()) is not None:
                add(batch)
        finally:
            source.close()
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
        store.write(owner, layer.mean_state.name, mean)
        store.write(owner, layer.variance_state.name, var)
    for spec in list(layer.params or []) + (list(owner.params or []) if owner is not layer else []):
        # a store made later (a compile) starts from them
        spec.value = np.asarray(mean if spec.name == layer.mean_state.name else var, np.float32)
    layer.__dict__["_adapted"] = (mean, var)
    layer.__dict__.pop("_kept_values", None)  # older values the layer carried: the adapted ones replace them
