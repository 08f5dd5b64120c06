"""Keras' preprocessing layers that belong in the model, computed on the model's device: ``Rescaling`` (pixel values
to [0, 1], in training and inference), and the augmentations ``RandomFlip``, ``RandomTranslation``, ``RandomZoom``
and ``RandomRotation`` (each training step transforms each image anew; predict and evaluate leave images as they
are).

A flip is a reflection padding (``ggml_pad_reflect_1d`` of ``W - 1`` positions before each row, whose first ``W``
values are the row reversed), chosen per sample by a mask of 0 and 1 that the step's dropout seeds draw
(``x + m (flip(x) - x)``). ggml has no backward pass for the padding, so a flip goes where Keras puts it: on the
inputs, before any layer with weights (elsewhere the fit refuses the graph, naming the op).

A translation and a zoom are separable: along each axis, output position ``o`` reads the input at
``scale (o - c) + c - shift`` (``c`` the axis' centre; a translation has ``scale`` 1, a zoom ``shift`` 0), which
with the interpolation and the fill mode folded in is one matrix per image and axis (``axis_maps``). The host draws
each step's values and writes the matrices before the step (a step hook); the device applies them with one batched
``ggml_mul_mat`` per axis, which has a backward pass: these two may sit anywhere in the model.

A rotation is not separable: each output pixel reads the input around the point Keras' rotation matrix gives,
from 4 pixels (bilinear) or 1 (nearest) after the fill mode has brought each back inside (``rotation_taps``). The
host writes each step, for every pixel of the batch, each tap's row index and weight (and with ``"constant"`` the
fill term); the device, with the batch's pixels as rows of ``C`` channels (``[C, W, H, N]``), gathers each tap's
rows (``ggml_get_rows``, whose backward pass scatters the gradient back) and sums them weighted: a rotation may
sit anywhere in the model too.
"""
from __future__ import annotations

from typing import Callable, TYPE_CHECKING

import numpy as np

from ...core.args import is_real
from ...errors import GgmlTypeError, GgmlValueError
from ...graph.introspect import ggml_is_contiguous
from ...graph.objects import Tensor
from ...graph.tensor import ggml_set_name
from ...ops.elementwise import ggml_add, ggml_cont, ggml_mul, ggml_scale, ggml_scale_bias, ggml_sub
from ...ops.layout import ggml_get_rows, ggml_permute, ggml_reshape_2d, ggml_reshape_4d, ggml_view_4d
from ...ops.linalg import ggml_mul_mat
from ...ops.resize import ggml_pad_reflect_1d
from .layer import Builder, Layer, LayerOptions, NATURAL, SPATIAL


if TYPE_CHECKING:
    from typing_extensions import Unpack


class Rescaling(Layer):
    """Every value times ``scale`` plus ``offset`` (Keras' ``Rescaling``), in training and inference: pixel values
    0-255 to [0, 1] with ``scale=1/255``, to [-1, 1] with ``scale=1/127.5, offset=-1``.

    Example:
        >>> model = g.ggml_layer_rescaling(model, 1 / 255, input_shape=(28, 28, 1))
    """
    kind = "rescaling"
    mask_support = "propagate"

    def __init__(self, scale: float, offset: float = 0.0, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        for name, value in (("scale", scale), ("offset", offset)):
            if not is_real(value) or not np.isfinite(value):
                raise GgmlValueError(f"rescaling {name} must be a finite number, got {value!r}")
        self.scale, self.offset = float(scale), float(offset)

    def forward(self, g, xs, shapes):
        return ggml_scale_bias(g.ctx, xs[0], self.scale, self.offset)


MODES = ("horizontal", "vertical", "horizontal_and_vertical")


class RandomFlip(Layer):
    """Images (H, W, C) flipped at random in training (Keras' ``RandomFlip``): left-right (``"horizontal"``),
    upside down (``"vertical"``) or each of the two (``"horizontal_and_vertical"``, the default), each with
    probability 1/2 per image, drawn anew every step on the model's device; unchanged in predict and evaluate.
    Put it on the inputs, before the layers with weights (ggml has no backward pass for the flip).

    Example:
        >>> model = g.ggml_layer_random_flip(model, "horizontal", input_shape=(32, 32, 3))
    """
    kind = "random_flip"
    layout = SPATIAL

    def __init__(self, mode: str = "horizontal_and_vertical", **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if mode not in MODES:
            raise GgmlValueError(f"random_flip mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    def output_shape(self, shapes):
        if len(shapes[0]) != 3:
            raise GgmlValueError(f"random_flip '{self.name}' takes image samples (height, width, channels), got "
                                 f"shape {shapes[0]}")
        return shapes[0]

    def _axes(self) -> list[int]:
        """The ggml axes flipped: 0 (W, left-right), 1 (H, upside down)."""
        return [axis for axis, word in ((0, "horizontal"), (1, "vertical")) if word in self.mode]

    def forward(self, g, xs, shapes):
        x = xs[0]                                              # [W, H, C, N]
        for axis in self._axes():
            if x.shape[axis] > 1:
                x = _maybe(g, x, _flipped(g, x, axis, self.name or self.kind))
        return x

    def predict_forward(self, g, xs, shapes):
        return xs[0]

    def dropout_seeds(self) -> int:
        return len(self._axes())


def _flipped(g: Builder, x: Tensor, axis: int, layer: str) -> Tensor:
    """``x`` reversed along ggml axis 0 or 1 (the padding named after ``layer``: an error about its missing
    backward pass then says where the flip is and where it belongs)."""
    ctx = g.ctx
    rows = ggml_cont(ctx, x if axis == 0 else ggml_permute(ctx, x, 1, 0, 2, 3))   # the axis first
    n = rows.shape[0]
    padded = ggml_pad_reflect_1d(ctx, rows, n - 1, 0)        # [x_{n-1} .. x_1, x_0 .. x_{n-1}]
    ggml_set_name(padded, f"{layer[:24]}: put it before the weights")
    nb = [int(padded.ptr.nb[i]) for i in range(4)]
    _, ne1, ne2, ne3 = rows.shape
    first = ggml_cont(ctx, ggml_view_4d(ctx, padded, n, ne1, ne2, ne3, nb[1], nb[2], nb[3], 0))
    return first if axis == 0 else ggml_cont(ctx, ggml_permute(ctx, first, 1, 0, 2, 3))


def _maybe(g: Builder, x: Tensor, flipped: Tensor) -> Tensor:
    """``flipped`` for about half of the samples (drawn every step), ``x`` for the others."""
    ctx = g.ctx
    ones = g.constant(np.ones((g.batch, 1, 1, 1), dtype=np.float32))    # [1, 1, 1, N]
    pick = ggml_scale(ctx, g.dropout(ones, 0.5), 0.5)                    # 0 or 1 per sample
    return ggml_add(ctx, x, ggml_mul(ctx, ggml_sub(ctx, flipped, x), pick))


# ---------------------------------------------------------------- RandomTranslation, RandomZoom

FILL_MODES = ("reflect", "wrap", "constant", "nearest")
INTERPOLATIONS = ("bilinear", "nearest")


class _RandomResample(Layer, abstract=True):
    """What RandomTranslation, RandomZoom and RandomRotation share: the checks of their arguments and of their
    input, and inference, which leaves the images alone."""
    ARG_DOCS = {
        "fill_mode": "how points outside the image are filled: 'reflect' (d c b a | a b c d | d c b a), 'wrap' "
                     "(a b c d | a b c d | a b c d), 'constant' (fill_value) or 'nearest' (a a a a | a b c d | "
                     "d d d d).",
        "interpolation": "'bilinear' or 'nearest'.",
        "fill_value": "the value of the points outside the image with fill_mode='constant'.",
    }

    def _options(self, fill_mode: str, interpolation: str, fill_value: float) -> None:
        if fill_mode not in FILL_MODES:
            raise GgmlValueError(f"{self.kind} fill_mode must be one of {FILL_MODES}, got {fill_mode!r}")
        if interpolation not in INTERPOLATIONS:
            raise GgmlValueError(f"{self.kind} interpolation must be one of {INTERPOLATIONS}, got "
                                 f"{interpolation!r}")
        if not is_real(fill_value) or not np.isfinite(fill_value):
            raise GgmlValueError(f"{self.kind} fill_value must be a finite number, got {fill_value!r}")
        self.fill_mode, self.interpolation, self.fill_value = fill_mode, interpolation, float(fill_value)

    def output_shape(self, shapes):
        if len(shapes[0]) != 3:
            raise GgmlValueError(f"{self.kind} '{self.name}' takes image samples (height, width, channels), got "
                                 f"shape {shapes[0]}; reshape the samples to images first (ggml_layer_reshape)")
        return shapes[0]

    def predict_forward(self, g, xs, shapes):
        return xs[0]


class _SeparableResample(_RandomResample, abstract=True):
    """RandomTranslation and RandomZoom: the per-axis resampling of the images, whose values each subclass draws
    (``draw``)."""
    layout = SPATIAL

    def draw(self, rng: np.random.Generator, n: int, h: int, w: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """This step's ``(scale, shift)`` of each image (arrays of ``n``) for the height, then the width."""
        raise NotImplementedError

    def moves(self) -> tuple[bool, bool]:
        """Whether the height and the width can change at all (a range of (0, 0) leaves an axis alone)."""
        raise NotImplementedError

    def forward(self, g, xs, shapes):
        x = xs[0]                                               # [W, H, C, N]
        h, w, _ = shapes[0]
        constant = self.fill_mode == "constant"
        name = (self.name or self.kind)[:40]
        axes = []   # (ggml axis, its size, its matrices, the constant term)
        for axis, size, moves, word in zip((1, 0), (h, w), self.moves(), ("rows", "cols")):
            if moves:
                maps = g.step_input((size, size, 1, g.batch), f"{name}.{word}")
                fill = g.step_input((size, 1, 1, g.batch), f"{name}.{word}_fill") if constant else None
                axes.append((axis, size, maps, fill))
        for axis, _, maps, fill in axes:
            x = _resample(g, x, axis, maps, fill)
        if axes:
            g.on_train_step(_StepMaps(self, np.random.default_rng(np.random.randint(0, 2 ** 31)), g.batch, h, w,
                                      axes))
        return x


class RandomTranslation(_SeparableResample):
    """Images (H, W, C) shifted at random in training (Keras' ``RandomTranslation``): each image by its own
    fractions of its height and width, drawn every step from ``height_factor`` and ``width_factor`` (a float
    ``f``: from [-f, f]; a pair: from [lower, upper]; each in [-1, 1]); a positive height shift moves the image
    down, a positive width shift to the right, by a fractional number of pixels (``interpolation``). The
    uncovered part is filled as ``fill_mode`` says. Unchanged in predict and evaluate. The shift has a backward
    pass: the layer may sit anywhere in the model.

    Example:
        >>> model = g.ggml_layer_random_translation(model, 0.1, 0.1, input_shape=(32, 32, 3))
    """
    kind = "random_translation"
    ARG_DOCS = {**_RandomResample.ARG_DOCS,
                "height_factor": "the vertical shift, a fraction of the height: a float f (from -f to f) or a pair "
                                 "(lower, upper), each in [-1, 1]; positive moves the image down.",
                "width_factor": "the horizontal shift, a fraction of the width, as height_factor; positive moves "
                                "the image right."}

    def __init__(self, height_factor: float | tuple[float, float], width_factor: float | tuple[float, float],
                 fill_mode: str = "reflect", interpolation: str = "bilinear", fill_value: float = 0.0,
                 **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.height_factor, self._height = _factor(height_factor, self.kind, "height_factor")
        self.width_factor, self._width = _factor(width_factor, self.kind, "width_factor")
        self._options(fill_mode, interpolation, fill_value)

    def moves(self):
        return self._height != (0.0, 0.0), self._width != (0.0, 0.0)

    def draw(self, rng, n, h, w):
        ones = np.ones(n)
        return [(ones, rng.uniform(*self._height, n) * h), (ones, rng.uniform(*self._width, n) * w)]


class RandomZoom(_SeparableResample):
    """Images (H, W, C) zoomed at random in training (Keras' ``RandomZoom``): each image by its own factors,
    drawn every step from ``height_factor`` and ``width_factor`` (a float ``f``: from [-f, f]; a pair: from
    [lower, upper]; each in [-1, 1]), about the image's centre. As in Keras a positive factor zooms out (0.2:
    the image shrinks to 1/1.2 of its size, ``fill_mode`` filling the border) and a negative one zooms in;
    ``width_factor=None`` zooms the width as the height (the aspect ratio kept). Unchanged in predict and
    evaluate. The zoom has a backward pass: the layer may sit anywhere in the model.

    Example:
        >>> model = g.ggml_layer_random_zoom(model, (-0.2, 0.2), input_shape=(32, 32, 3))
    """
    kind = "random_zoom"
    ARG_DOCS = {**_RandomResample.ARG_DOCS,
                "height_factor": "the vertical zoom: a float f (from -f to f) or a pair (lower, upper), each in "
                                 "[-1, 1]; positive zooms out, negative in.",
                "width_factor": "the horizontal zoom, as height_factor; None: the height's zoom (the aspect ratio "
                                "kept)."}

    def __init__(self, height_factor: float | tuple[float, float],
                 width_factor: float | tuple[float, float] | None = None, fill_mode: str = "reflect",
                 interpolation: str = "bilinear", fill_value: float = 0.0, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.height_factor, self._height = _factor(height_factor, self.kind, "height_factor")
        self.width_factor: float | tuple[float, float] | None = None
        self._width: tuple[float, float] | None = None   # None: the height's zoom
        if width_factor is not None:
            self.width_factor, self._width = _factor(width_factor, self.kind, "width_factor")
        self._options(fill_mode, interpolation, fill_value)

    def moves(self):
        height = self._height != (0.0, 0.0)
        return height, height if self._width is None else self._width != (0.0, 0.0)

    def draw(self, rng, n, h, w):
        zeros = np.zeros(n)
        height = 1 + rng.uniform(*self._height, n)
        width = height if self._width is None else 1 + rng.uniform(*self._width, n)
        return [(height, zeros), (width, zeros)]


class RandomRotation(_RandomResample):
    """Images (H, W, C) rotated at random in training (Keras' ``RandomRotation``): each image about its centre by
    its own angle, drawn every step from ``factor``, a fraction of a full turn (a float ``f``: from [-f, f]; a
    pair: from [lower, upper]; each in [-1, 1]); positive angles turn the image counter-clockwise, negative ones
    clockwise. The corners the turned image leaves uncovered are filled as ``fill_mode`` says, and the pixels
    between the input's are read by ``interpolation``. Unchanged in predict and evaluate. The rotation has a
    backward pass: the layer may sit anywhere in the model.

    Example:
        >>> model = g.ggml_layer_random_rotation(model, 0.1, fill_mode="constant", input_shape=(32, 32, 3))
    """
    kind = "random_rotation"
    layout = NATURAL   # [C, W, H, N]: each pixel's channels one row, read by ggml_get_rows
    ARG_DOCS = {**_RandomResample.ARG_DOCS,
                "factor": "the angle, a fraction of a full turn (2 pi): a float f (from -f to f) or a pair (lower, "
                          "upper), each in [-1, 1]; positive turns the image counter-clockwise."}

    def __init__(self, factor: float | tuple[float, float], fill_mode: str = "reflect",
                 interpolation: str = "bilinear", fill_value: float = 0.0, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.factor, self._range = _factor(factor, self.kind, "factor", "a full turn (2 pi)")
        self._options(fill_mode, interpolation, fill_value)

    def graph_tensors(self, shapes):
        return 64

    def forward(self, g, xs, shapes):
        x = xs[0]                                               # [C, W, H, N]
        if self._range == (0.0, 0.0):
            return x
        h, w, c = shapes[0]
        m = w * h * g.batch                                     # the batch's pixels
        name = (self.name or self.kind)[:40]
        taps = [(g.step_input((m,), f"{name}.rows{t}", "int32"), g.step_input((1, m), f"{name}.weights{t}"))
                for t in range(1 if self.interpolation == "nearest" else 4)]
        fill = g.step_input((1, m), f"{name}.fill") if self.fill_mode == "constant" else None
        g.on_train_step(_StepTaps(self, np.random.default_rng(np.random.randint(0, 2 ** 31)), g.batch, h, w, taps,
                                  fill))
        return ggml_reshape_4d(g.ctx, _gathered(g, x, c, m, taps, fill), c, w, h, g.batch)


def _gathered(g: Builder, x: Tensor, c: int, m: int, taps: list[tuple[Tensor, Tensor]], fill: Tensor | None
              ) -> Tensor:
    """The ``m`` pixels of ``x`` (``[C, W, H, N]``, each pixel's channels a row) read through ``taps``, each
    (row indices [m] I32, weights [1, m]): the sum over the taps of the rows they pick times their weights, plus
    ``fill`` ([1, m]) where there is one. Value: ``[C, m]``."""
    ctx = g.ctx
    rows = ggml_reshape_2d(ctx, x if ggml_is_contiguous(x) else ggml_cont(ctx, x), c, m)
    out = None
    for index, weight in taps:
        term = ggml_mul(ctx, ggml_get_rows(ctx, rows, index), weight)
        out = term if out is None else ggml_add(ctx, out, term)
    assert out is not None
    return out if fill is None else ggml_add(ctx, out, fill)


def _factor(value: object, kind: str, name: str, unit: str = "the image's size"
            ) -> tuple[float | tuple[float, float], tuple[float, float]]:
    """A factor argument as kept (a float, or a pair) and the range it draws from, (lower, upper); ``unit``: what
    it is a fraction of, for the messages."""
    fix = "give a float f in [-1, 1] (the range [-|f|, |f|]) or a pair (lower, upper), -1 <= lower <= upper <= 1"
    if is_real(value):
        f = float(value)
        if not -1 <= f <= 1:
            raise GgmlValueError(f"{kind} {name} is a fraction of {unit}, in [-1, 1]; got {value!r}: {fix}")
        return f, (-abs(f), abs(f))
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(is_real(v) for v in value):
        raise GgmlTypeError(f"{kind} {name} must be a number or a pair (lower, upper) of numbers, got {value!r}: "
                            f"{fix}")
    lower, upper = float(value[0]), float(value[1])
    if not -1 <= lower <= upper <= 1:
        raise GgmlValueError(f"{kind} {name} must be a pair (lower, upper) with -1 <= lower <= upper <= 1 "
                             f"(fractions of {unit}), got {value!r}: {fix}")
    return (lower, upper), (lower, upper)


def interpolation_taps(src: np.ndarray, interpolation: str) -> tuple[np.ndarray, np.ndarray]:
    """The pixels an interpolation reads along one axis at coordinates ``src`` (pixel ``i`` at ``i``), and their
    weights: int64 and float64 arrays of ``src``'s shape plus an axis of taps (bilinear: ``floor(s)`` and
    ``floor(s) + 1``, weighted by distance; nearest: the pixel ``floor(s + 0.5)``, weight 1)."""
    if interpolation == "nearest":
        return np.floor(src + 0.5).astype(np.int64)[..., None], np.ones(src.shape + (1,))
    low = np.floor(src)
    frac = src - low
    return np.stack([low, low + 1], -1).astype(np.int64), np.stack([1 - frac, frac], -1)


def fold_taps(index: np.ndarray, size: int, fill_mode: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Pixel indices along an axis of ``size`` pixels, those outside it brought back inside as ``fill_mode``
    says: reflect (d c b a | a b c d | d c b a), wrap (a b c d | a b c d) or nearest (a a | a b c d | d d); with
    "constant" they are clipped, and the second value says which were inside (the caller gives the others a
    weight of 0 and ``fill_value`` their weight). Value: ``(index, inside)``, ``inside`` None but with "constant".
    """
    if fill_mode == "reflect":        # period 2 size, the second half reversed
        index = index % (2 * size)
        return np.where(index >= size, 2 * size - 1 - index, index), None
    if fill_mode == "wrap":
        return index % size, None
    inside = None if fill_mode == "nearest" else (index >= 0) & (index < size)
    return np.clip(index, 0, size - 1), inside


def axis_maps(size: int, scale: np.ndarray, shift: np.ndarray, fill_mode: str, interpolation: str,
              fill_value: float) -> tuple[np.ndarray, np.ndarray | None]:
    """The matrices that resample one axis of ``size`` pixels, one per image: output position ``o`` reads the
    input at ``s = scale (o - c) + c - shift`` (``c = (size - 1) / 2``), interpolated (bilinear: the two pixels
    around ``s``, weighted by distance; nearest: the pixel ``floor(s + 0.5)``) after each pixel read outside the
    axis is brought back inside as ``fill_mode`` says (reflect, wrap, nearest). With ``"constant"`` the pixels
    outside weigh 0 and the second array, ``fill_value`` times the weight they had, is added.

    Pixel ``i`` sits at coordinate ``i`` (its centre), as in Keras' affine transforms and scipy.ndimage.

    Value: ``(maps, fill)``: float32 arrays ``(n, 1, size, size)`` (``maps[k, 0, o, i]``: the weight of input
    pixel ``i`` in output position ``o`` of image ``k``: ggml's ``[i, o, 1, k]``) and ``(n, 1, 1, size)``, or None
    (a fill mode other than "constant").
    """
    n = len(scale)
    center = (size - 1) / 2
    src = np.asarray(scale, np.float64)[:, None] * (np.arange(size) - center) + center - \
        np.asarray(shift, np.float64)[:, None]                                  # (n, size)
    index, weight = interpolation_taps(src, interpolation)                       # (n, size, taps)
    index, inside = fold_taps(index, size, fill_mode)
    fill = None
    if inside is not None:            # constant: the pixels outside weigh nothing; fill_value takes their weight
        weight = np.where(inside, weight, 0.0)
        fill = (fill_value * (1 - weight.sum(-1))).astype(np.float32).reshape(n, 1, 1, size)
    maps = np.zeros((n, size, size))
    images, outs = np.indices(index.shape)[:2]
    np.add.at(maps, (images, outs, index), weight)
    return maps.astype(np.float32).reshape(n, 1, size, size), fill


def _resample(g: Builder, x: Tensor, axis: int, maps: Tensor, fill: Tensor | None) -> Tensor:
    """``x`` ([W, H, C, N]) resampled along ggml axis 0 (the width) or 1 (the height) by each image's matrix
    (``maps`` [size, size, 1, N]: one ``ggml_mul_mat``, broadcast over the other axes), plus the constant term
    (``fill`` [size, 1, 1, N]) where there is one."""
    ctx = g.ctx
    rows = ggml_cont(ctx, ggml_permute(ctx, x, 1, 0, 2, 3)) if axis == 1 else x    # the axis first
    if int(rows.ptr.nb[0]) != 4:
        rows = ggml_cont(ctx, rows)
    out = ggml_mul_mat(ctx, maps, rows)
    if fill is not None:
        out = ggml_add(ctx, out, fill)
    return out if axis == 0 else ggml_cont(ctx, ggml_permute(ctx, out, 1, 0, 2, 3))


class _StepMaps:
    """The step hook of one graph's RandomTranslation or RandomZoom: before each training step it draws the
    step's values (``layer.draw``, from this graph's generator) and writes each axis' matrices for the graph's
    batch; before a step that does not train, the identity."""

    def __init__(self, layer: _SeparableResample, rng: np.random.Generator, batch: int, h: int, w: int,
                 axes: list[tuple[int, int, Tensor, Tensor | None]]) -> None:
        self.layer, self.rng, self.batch, self.h, self.w, self.axes = layer, rng, batch, h, w, axes

    @property
    def written(self) -> list[Tensor]:
        return [t for _, _, maps, fill in self.axes for t in (maps, fill) if t is not None]

    def before_eval(self, train: bool, write: Callable[[Tensor, np.ndarray], None]) -> None:
        layer, n = self.layer, self.batch
        drawn = layer.draw(self.rng, n, self.h, self.w) if train else [(np.ones(n), np.zeros(n))] * 2
        for axis, size, maps, fill in self.axes:
            scale, shift = drawn[1 - axis]    # drawn: the height's (ggml axis 1), then the width's (axis 0)
            m, f = axis_maps(size, scale, shift, layer.fill_mode, layer.interpolation, layer.fill_value)
            write(maps, m)
            if fill is not None and f is not None:
                write(fill, f)

    def after_eval(self, train: bool) -> None:
        pass


def rotation_taps(h: int, w: int, angle: np.ndarray, fill_mode: str, interpolation: str, fill_value: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """What rotates a batch of ``len(angle)`` images of ``h`` x ``w`` pixels, image ``k`` by ``angle[k]``
    (radians, counter-clockwise) about its centre: output pixel ``(y, x)`` reads the input at Keras' rotation
    matrix, ``x_in = cos (x - cx) - sin (y - cy) + cx`` and ``y_in = sin (x - cx) + cos (y - cy) + cy`` (``cx =
    (w - 1) / 2``, ``cy = (h - 1) / 2``), interpolated from the pixels around it (bilinear: 4, nearest: 1) after
    each is brought inside as ``fill_mode`` says, per axis (``interpolation_taps``, ``fold_taps``).

    Value: ``(rows, weights, fill)``: int32 and float32 arrays ``(taps, n h w)`` (for output pixel ``p = (k h + y)
    w + x`` of the batch, the row ``(k h + y_in) w + x_in`` that tap reads and its weight), and with "constant"
    the float32 ``(n h w,)`` term ``fill_value (1 - sum of the weights)`` (the weight of the taps outside), else
    None."""
    n = len(angle)
    cos = np.cos(np.asarray(angle, np.float64))[:, None, None]
    sin = np.sin(np.asarray(angle, np.float64))[:, None, None]
    cy, cx = (h - 1) / 2, (w - 1) / 2
    dy, dx = np.meshgrid(np.arange(h) - cy, np.arange(w) - cx, indexing="ij")       # (h, w)
    iy, wy = interpolation_taps(sin * dx + cos * dy + cy, interpolation)            # (n, h, w, t)
    ix, wx = interpolation_taps(cos * dx - sin * dy + cx, interpolation)
    iy, in_y = fold_taps(iy, h, fill_mode)
    ix, in_x = fold_taps(ix, w, fill_mode)
    # the taps first ((t, n, h, w): each tap's values are one array of the batch's pixels), in int32 and float32
    def first(a: np.ndarray, dtype: type) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(a, -1, 0), dtype)
    iy, ix = first((iy + h * np.arange(n)[:, None, None, None]) * w, np.int32), first(ix, np.int32)
    wy, wx = first(wy, np.float32), first(wx, np.float32)
    taps = len(iy) * len(ix)
    rows = (iy[:, None] + ix[None, :]).reshape(taps, n * h * w)                  # (t, t, n, h, w): all pairs
    weights = (wy[:, None] * wx[None, :]).reshape(taps, n * h * w)
    fill = None
    if in_y is not None and in_x is not None:
        inside = first(in_y, np.bool_)[:, None] & first(in_x, np.bool_)[None, :]
        weights = np.where(inside.reshape(taps, n * h * w), weights, np.float32(0))
        fill = (fill_value * (1 - weights.sum(0, dtype=np.float64))).astype(np.float32)
    return rows, weights, fill


class _StepTaps:
    """The step hook of one graph's RandomRotation: before each training step it draws each image's angle (from
    this graph's generator) and writes the taps of the graph's batch; before a step that does not train, those
    of the angle 0 (the identity)."""

    def __init__(self, layer: RandomRotation, rng: np.random.Generator, batch: int, h: int, w: int,
                 taps: list[tuple[Tensor, Tensor]], fill: Tensor | None) -> None:
        self.layer, self.rng, self.batch, self.h, self.w, self.taps, self.fill = layer, rng, batch, h, w, taps, fill

    @property
    def written(self) -> list[Tensor]:
        return [t for tap in self.taps for t in tap] + ([self.fill] if self.fill is not None else [])

    def before_eval(self, train: bool, write: Callable[[Tensor, np.ndarray], None]) -> None:
        layer, n = self.layer, self.batch
        angle = self.rng.uniform(*layer._range, n) * 2 * np.pi if train else np.zeros(n)
        rows, weights, fill = rotation_taps(self.h, self.w, angle, layer.fill_mode, layer.interpolation,
                                            layer.fill_value)
        for (index, weight), r, wt in zip(self.taps, rows, weights):
            write(index, r)
            write(weight, wt)
        if self.fill is not None and fill is not None:
            write(self.fill, fill)

    def after_eval(self, train: bool) -> None:
        pass
