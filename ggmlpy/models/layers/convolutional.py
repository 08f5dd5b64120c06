"""Convolution and pooling layers.

They read and write ggml's image layout (``SPATIAL``): an image sample ``(H, W, C)`` is the tensor
``[W, H, C, N]`` and a sequence sample ``(steps, C)`` is ``[steps, C, N]``, which is what
``ggml_conv_2d``, ``ggml_conv_1d`` and ``ggml_pool_2d`` take. Consecutive conv/pool layers therefore
pass tensors along without copies; the graph builder converts at the borders.

``padding="same"`` follows Keras: the output has ``ceil(size / stride)`` positions and the padding
is split with the extra position at the end. ggml pads symmetrically, so the extra position is a
zero row/column joined on with ``ggml_concat`` (differentiable through patches/0006).

The convolutions are im2col + mul_mat in float32: ggml's own ``ggml_conv_2d``/``ggml_conv_1d`` build a
float16 im2col, which rounds every input value to half precision (errors of ~1e-3 where Keras computes in
float32). The permutes between layouts are differentiable with contiguous gradients (patches/0007).
"""
from __future__ import annotations

import math
from typing import Any, TYPE_CHECKING

from ...core.args import bool_arg, int_pair_arg, positive_int_arg
from ...core.types import GGML_TYPE_F32
from ...errors import GgmlValueError
from ...graph.introspect import ggml_is_contiguous
from ...graph.objects import Tensor
from ...ops.conv import ggml_conv_2d_tiled, ggml_im2col, GGML_OP_POOL_MAX, ggml_pool_2d
from ...ops.elementwise import ggml_add, ggml_cont, ggml_relu, ggml_scale
from ...ops.layout import ggml_permute, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d, ggml_view_4d
from ...ops.linalg import ggml_mul_mat
from ...ops.reduce import ggml_concat, ggml_repeat, ggml_sum_rows
from . import fused
from .activations import check_activation
from .initializers import check_initializer
from .layer import activate, Builder, Layer, LayerOptions, NATURAL, SPATIAL
from .weight import Weight


if TYPE_CHECKING:
    from typing_extensions import Unpack


def _dilation(rates: tuple, strides: tuple) -> tuple:
    """Keras' rule: a dilation above 1 and a stride above 1 do not go together."""
    if any(r > 1 for r in rates) and any(s > 1 for s in strides):
        raise GgmlValueError(f"dilation_rate {rates if len(rates) > 1 else rates[0]} and strides "
                             f"{strides if len(strides) > 1 else strides[0]}: a dilation above 1 needs strides of 1 "
                             "(as in Keras)")
    return rates


def padding_arg(padding: Any) -> str:
    """'valid' or 'same', in any case (Keras lowers it: "SAME" is "same")."""
    if not isinstance(padding, str) or padding.lower() not in ("valid", "same"):
        raise GgmlValueError(f"padding must be 'valid' or 'same', got {padding!r}")
    return padding.lower()


def _out_and_pad(size: int, k: int, s: int, padding: str, layer: Layer) -> tuple[int, int, int]:
    """(output size, symmetric padding, extra zero positions at the end) along one axis."""
    if padding == "valid":
        if size < k:
            pooling = hasattr(layer, "pool_size")
            raise GgmlValueError(f"layer '{layer.name}': a {'window' if pooling else 'kernel'} of {k} does not fit an "
                                 f"input of {size} (padding='valid'); use padding='same' or a smaller "
                                 f"{'pool_size' if pooling else 'kernel'}")
        return (size - k) // s + 1, 0, 0
    out = math.ceil(size / s)
    total = max((out - 1) * s + k - size, 0)
    left = total // 2
    return out, left, total - 2 * left


def pooled_size(size: int, k: int, s: int, layer: Any) -> int:
    """Positions of a window of ``k`` with stride ``s`` over ``size`` without padding (an error when none)."""
    return _out_and_pad(size, k, s, "valid", layer)[0]


def _conv_2d_f32(g: Builder, layer: Layer, x, s0: int, s1: int, p0: int, p1: int, d0: int = 1, d1: int = 1):
    """``ggml_conv_2d`` of ``layer``'s kernel ``[KW, KH, Cin, Cout]`` with a float32 im2col: data ``[W, H, Cin, N]``
    -> ``[OW, OH, Cout, N]``, a permuted view: the caller's next op (the bias ADD, or ``_contiguous``) writes it
    out in that order, so no extra pass copies it. Under mixed precision (``g.half_products``) the product's
    first operand is the kernel's half cast (``g.product_weight``), its result ``[Cout, ...]`` copied into the
    layout (channels are the rows there: the view's rows would not be contiguous)."""
    ctx = g.ctx
    kernel = g.param(layer, "kernel")
    kw, kh, cin, cout = kernel.shape[:4]
    cols = ggml_im2col(ctx, kernel, x, s0, s1, p0, p1, d0, d1, True, GGML_TYPE_F32)  # [Cin*KH*KW, OW, OH, N]
    k, ow, oh, n = cols.shape[:4]
    cols = ggml_reshape_2d(ctx, cols, k, ow * oh * n)
    if g.half_products:
        y = ggml_mul_mat(ctx, g.product_weight(layer, "kernel", (k, cout)), cols)   # [Cout, OW*OH*N]
        return ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, y, cout, ow, oh, n), 2, 0, 1, 3))
    y = ggml_mul_mat(ctx, cols, ggml_reshape_2d(ctx, kernel, k, cout))       # [OW*OH*N, Cout]
    y = ggml_reshape_4d(ctx, y, ow, oh, n, cout)
    return ggml_permute(ctx, y, 0, 1, 3, 2)                                 # [OW, OH, Cout, N]


def _conv_1d_f32(g: Builder, layer: Layer, x, s0: int, p0: int, d0: int = 1):
    """``ggml_conv_1d`` of ``layer``'s kernel ``[K, Cin, Cout]`` with a float32 im2col: data ``[L, Cin, N]`` ->
    ``[OL, Cout, N]``, a permuted view as for ``_conv_2d_f32`` (and its half products)."""
    ctx = g.ctx
    kernel = g.param(layer, "kernel")
    kk, cin, cout = kernel.shape[:3]
    cols = ggml_im2col(ctx, kernel, x, s0, 0, p0, 0, d0, 0, False, GGML_TYPE_F32)  # [Cin*K, OL, N]
    k, ol, n = cols.shape[:3]
    cols = ggml_reshape_2d(ctx, cols, k, ol * n)
    if g.half_products:
        y = ggml_mul_mat(ctx, g.product_weight(layer, "kernel", (k, cout)), cols)   # [Cout, OL*N]
        return ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, y, cout, ol, n), 1, 0, 2, 3))
    y = ggml_mul_mat(ctx, cols, ggml_reshape_2d(ctx, kernel, k, cout))       # [OL*N, Cout]
    y = ggml_reshape_3d(ctx, y, ol, n, cout)
    return ggml_permute(ctx, y, 0, 2, 1, 3)                                  # [OL, Cout, N]


def _dense(g: Builder, x: Any) -> Any:
    return x if ggml_is_contiguous(x) else ggml_cont(g.ctx, x)


def pad_axis(g: Builder, x: Tensor, dim: int, before: int, after: int, edge: bool) -> Tensor:
    """``x`` with ``before``/``after`` positions added along ggml axis ``dim``: zeros, or (``edge``) copies of the
    first and last position. A max over a window is the same with edge copies as without the padded positions
    (a window that reaches into the padding also holds the position copied)."""
    def block(at: int, n: int) -> Tensor:
        ne = list(x.shape)
        ne[dim] = n
        if not edge:
            return g.zeros(tuple(ne))
        one = list(x.shape)
        one[dim] = 1
        nb = [int(x.ptr.nb[i]) for i in range(4)]
        view = ggml_cont(g.ctx, ggml_view_4d(g.ctx, x, one[0], one[1], one[2], one[3], nb[1], nb[2], nb[3],
                                             at * nb[dim]))
        return view if n == 1 else ggml_repeat(g.ctx, view, g.shape_target(tuple(ne)))
    out = x
    if before:
        out = ggml_concat(g.ctx, block(0, before), out, dim)
    if after:
        out = ggml_concat(g.ctx, out, block(x.shape[dim] - 1, after), dim)
    return out


class Convolution(Layer, abstract=True):
    """What the convolutions share: a kernel and a bias, and the activation per output channel."""
    layout = SPATIAL
    kernel = Weight(initializer_arg="kernel_initializer", regularizer="kernel_regularizer")
    bias = Weight(initializer_arg="bias_initializer", regularizer="bias_regularizer", when="use_bias")

    def _set_common(self, filters: Any, padding: Any, activation: Any, use_bias: Any, kernel_initializer: Any,
                    bias_initializer: Any) -> None:
        """The arguments every convolution takes, checked."""
        self.filters = positive_int_arg(None, "filters", filters)
        self.padding = padding_arg(padding)
        self.activation = check_activation(activation)
        self.use_bias = bool_arg(None, "use_bias", use_bias)
        self.kernel_initializer = check_initializer(kernel_initializer, "kernel_initializer")
        self.bias_initializer = check_initializer(bias_initializer, "bias_initializer")

    @property
    def out_layout(self) -> str | None:  # type: ignore[override]  # a property over Layer's class attribute: per object
        # softmax normalises over the channels, which ggml's image/sequence layout does not keep on its fastest
        # axis: that activation runs in the user's layout (channels last), and the layer returns that layout
        return NATURAL if self.activation == "softmax" else None

    @staticmethod
    def _add_bias(g: Builder, y: Any, bias: Any) -> Any:
        """The convolution's permuted product made contiguous: by the per-channel bias ADD (broadcast over the
        other axes), which reads the view as it is, or by a copy when there is no bias."""
        return ggml_add(g.ctx, y, bias) if bias is not None else ggml_cont(g.ctx, y)

    def _tiles(self, g: Builder, taps: int) -> bool:
        """Whether this convolution takes the CPU's tiled kernel (patches/0036: no im2col matrix of the whole
        batch, no layout copy): where the model's device computes it, unless its products are in half precision
        and wide enough for the half product's 32 x 32 tiles (``taps``: kernel positions x input channels, the
        depth of each sum, and 32 filters or more); elsewhere (a GPU) im2col + mul_mat, all on the device. A thin
        convolution stays F32 there: the half product would waste most of each tile (the placement report says
        so)."""
        if not fused.device_computes(g.params.backend.device, "conv_2d_tiled"):
            return False
        if g.half_products and taps >= 32 and self.filters >= 32:
            return False
        if g.half_products:
            g.note(f"{self.kind} '{self.name}' computes in F32 (the CPU's tiled convolution): {self.filters} filters "
                   f"of {taps} taps are too thin for half-precision product tiles")
        return True

    def _tiled(self, g: Builder, x: Any, kernel: Any, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Any:
        """The convolution and its bias as the tiled op, on images ``x`` ``[W, H, Cin, N]`` (made contiguous) and a
        kernel ``[KW, KH, Cin, Cout]``."""
        bias = g.param(self, self.bias) if self.use_bias else None
        return ggml_conv_2d_tiled(g.ctx, kernel, _dense(g, x), bias, s0, s1, p0, p1, d0, d1)

    def _activate(self, g: Builder, y: Any, shapes: list) -> Any:
        if self.activation == "softmax":
            y = g.convert(y, self.output_shape(shapes), SPATIAL, NATURAL)
        return activate(g, y, self.activation)


class Conv2D(Convolution):
    """2-D convolution of channels-last images (H, W, C): ``filters`` output channels,
    ``kernel_size=(rows, cols)``, ``strides``, ``padding`` 'valid' or 'same' (as Keras), a bias, then
    ``activation``.

    Example:
        >>> model = g.ggml_layer_conv_2d(model, 16, (3, 3), activation='relu', input_shape=(28, 28, 1))
    """
    kind = "conv_2d"

    def __init__(self, filters: int, kernel_size: Any, activation: str | None = None, strides: Any = (1, 1),
                 padding: str = "valid", use_bias: bool = True, dilation_rate: Any = (1, 1),
                 kernel_initializer: str = "glorot_uniform", bias_initializer: str = "zeros",
                 **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self._set_common(filters, padding, activation, use_bias, kernel_initializer, bias_initializer)
        self.kernel_size = int_pair_arg(None, "kernel_size", kernel_size)
        self.strides = int_pair_arg(None, "strides", strides)
        self.dilation_rate = _dilation(int_pair_arg(None, "dilation_rate", dilation_rate), self.strides)

    def _geometry(self, shape):
        if len(shape) != 3:
            raise GgmlValueError(f"conv_2d '{self.name}' takes image samples (height, width, channels), got shape "
                                 f"{shape}")
        (kh, kw), (sh, sw), (dh, dw) = self.kernel_size, self.strides, self.dilation_rate
        oh, ph, eh = _out_and_pad(shape[0], dh * (kh - 1) + 1, sh, self.padding, self)   # the dilated extent
        ow, pw, ew = _out_and_pad(shape[1], dw * (kw - 1) + 1, sw, self.padding, self)
        return (oh, ow), (ph, pw), (eh, ew)

    def output_shape(self, shapes):
        (oh, ow), _, _ = self._geometry(shapes[0])
        return (oh, ow, self.filters)

    def make_params(self, shapes):
        (kh, kw), cin = self.kernel_size, shapes[0][2]
        fans = (kh * kw * cin, kh * kw * self.filters)
        return [self.kernel.spec((kw, kh, cin, self.filters), fans, user_axes=(2, 3, 1, 0)),
                self.bias.spec((self.filters,), (self.filters, self.filters))]

    def forward(self, g, xs, shapes):
        _, (ph, pw), (eh, ew) = self._geometry(shapes[0])
        x = pad_axis(g, pad_axis(g, xs[0], 0, 0, ew, edge=False), 1, 0, eh, edge=False)
        (sh, sw) = self.strides
        (dh, dw) = self.dilation_rate
        kernel = g.param(self, self.kernel)
        if self._tiles(g, kernel.shape[0] * kernel.shape[1] * kernel.shape[2]):
            return self._activate(g, self._tiled(g, x, kernel, sw, sh, pw, ph, dw, dh), shapes)
        y = _conv_2d_f32(g, self, x, sw, sh, pw, ph, dw, dh)
        bias = ggml_reshape_4d(g.ctx, g.param(self, self.bias), 1, 1, self.filters, 1) if self.use_bias else None
        return self._activate(g, self._add_bias(g, y, bias), shapes)


class Conv1D(Convolution):
    """1-D convolution of sequences (steps, channels): ``filters`` output channels, ``kernel_size``,
    ``strides``, ``padding`` 'valid', 'same' or 'causal', a bias, then ``activation``.

    Example:
        >>> model = g.ggml_layer_conv_1d(model, 8, 3, activation='relu', input_shape=(100, 2))
    """
    kind = "conv_1d"
    ARG_DOCS = {"padding": "'valid' (no padding: the output shrinks), 'same' (as Keras: ceil(steps / stride) "
                           "positions) or 'causal' (Keras': zeros before the first step only, so step t sees steps "
                           "<= t; dilated convolutions over time)."}

    def __init__(self, filters: int, kernel_size: int, activation: str | None = None, strides: int = 1,
                 padding: str = "valid", use_bias: bool = True, dilation_rate: int = 1,
                 kernel_initializer: str = "glorot_uniform", bias_initializer: str = "zeros",
                 **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        causal = isinstance(padding, str) and padding.lower() == "causal"   # Keras' Conv1D: zeros before the first
        # step only, an output per input step
        self._set_common(filters, "valid" if causal else padding, activation, use_bias, kernel_initializer,
                         bias_initializer)
        self.padding = "causal" if causal else self.padding
        self.kernel_size = positive_int_arg(None, "kernel_size", kernel_size)
        self.strides = positive_int_arg(None, "strides", strides)
        self.dilation_rate = _dilation((positive_int_arg(None, "dilation_rate", dilation_rate),), (self.strides,))[0]

    def _geometry(self, shape):
        """(output steps, symmetric padding, zeros after the last step, zeros before the first)."""
        if len(shape) != 2:
            raise GgmlValueError(f"conv_1d '{self.name}' takes sequence samples (steps, channels), got shape {shape}")
        span = self.dilation_rate * (self.kernel_size - 1) + 1
        if self.padding == "causal":
            return (shape[0] - 1) // self.strides + 1, 0, 0, span - 1
        return (*_out_and_pad(shape[0], span, self.strides, self.padding, self), 0)

    def output_shape(self, shapes):
        return (self._geometry(shapes[0])[0], self.filters)

    def make_params(self, shapes):
        k, cin = self.kernel_size, shapes[0][1]
        return [self.kernel.spec((k, cin, self.filters), (k * cin, k * self.filters), user_axes=(2, 1, 0)),
                self.bias.spec((self.filters,), (self.filters, self.filters))]

    def forward(self, g, xs, shapes):
        _, pad, extra, before = self._geometry(shapes[0])
        x = pad_axis(g, xs[0], 0, before, extra, edge=False)
        kernel = g.param(self, self.kernel)
        if self._tiles(g, kernel.shape[0] * kernel.shape[1]):   # sequences as one-row images [L, 1, Cin, N]
            (k, cin, cout), (steps, _, n) = kernel.shape[:3], x.shape[:3]
            y = self._tiled(g, ggml_reshape_4d(g.ctx, _dense(g, x), steps, 1, cin, n),
                            ggml_reshape_4d(g.ctx, kernel, k, 1, cin, cout), self.strides, 1, pad, 0,
                            self.dilation_rate, 1)
            return self._activate(g, ggml_reshape_3d(g.ctx, y, y.shape[0], cout, n), shapes)
        y = _conv_1d_f32(g, self, x, self.strides, pad, self.dilation_rate)
        bias = ggml_reshape_3d(g.ctx, g.param(self, self.bias), 1, self.filters, 1) if self.use_bias else None
        return self._activate(g, self._add_bias(g, y, bias), shapes)


def same_padding(size: int, k: int, s: int) -> tuple[int, int, int]:
    """Keras' ``padding='same'`` of a window ``k`` with stride ``s`` over ``size``: (output size, positions added
    before, positions added after)."""
    out = math.ceil(size / s)
    total = max((out - 1) * s + k - size, 0)
    return out, total // 2, total - total // 2


class Pooling2D(Layer, abstract=True):
    """What the 2-D poolings share: ``pool_size=(rows, cols)`` windows, ``strides`` (default: the pool size),
    ``padding`` (Keras': ``"valid"``, windows inside the image; ``"same"``, ``ceil(size / stride)`` outputs,
    the windows at the edges over fewer positions)."""
    layout = SPATIAL
    edge_padding = True   # max: padded with edge copies; average: with zeros, then rescaled

    def __init__(self, pool_size: Any = (2, 2), strides: Any = None, padding: str = "valid",
                 **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.pool_size = int_pair_arg(None, "pool_size", pool_size)
        self.strides = int_pair_arg(None, "strides", strides) if strides is not None else self.pool_size
        self.padding = padding_arg(padding)

    def output_shape(self, shapes):
        shape = shapes[0]
        if len(shape) != 3:
            raise GgmlValueError(f"{self.kind} '{self.name}' takes image samples (height, width, channels), "
                                 f"got shape {shape}")
        (kh, kw), (sh, sw) = self.pool_size, self.strides
        if self.padding == "same":
            return (same_padding(shape[0], kh, sh)[0], same_padding(shape[1], kw, sw)[0], shape[2])
        return (pooled_size(shape[0], kh, sh, self), pooled_size(shape[1], kw, sw, self), shape[2])

    def padded(self, g: Builder, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """``x`` ([W, H, C, N]) padded for ``padding='same'`` (as it is for 'valid')."""
        if self.padding != "same":
            return x
        (kh, kw), (sh, sw) = self.pool_size, self.strides
        x = pad_axis(g, x, 0, *same_padding(shape[1], kw, sw)[1:], edge=self.edge_padding)
        return pad_axis(g, x, 1, *same_padding(shape[0], kh, sh)[1:], edge=self.edge_padding)


class MaxPooling2D(Pooling2D):
    """2-D max pooling over ``pool_size=(rows, cols)`` windows with ``strides`` (default: the pool size) and
    ``padding`` ``"valid"`` (the default) or ``"same"`` (Keras').

    Example:
        >>> model = g.ggml_layer_max_pooling_2d(model, (2, 2))
    """
    kind = "max_pooling_2d"

    def forward(self, g, xs, shapes):
        (kh, kw), (sh, sw) = self.pool_size, self.strides
        pre = g.relu_input(xs[0])
        if pre is not None:
            # max(relu(x)) == relu(max(x)), gradients included (relu is non-decreasing and its step is 0 where
            # a window's maximum is <= 0): the relu and its backward then run on the pooled, smaller tensor
            pre = self.padded(g, pre, shapes[0])
            return ggml_relu(g.ctx, ggml_pool_2d(g.ctx, pre, GGML_OP_POOL_MAX, kw, kh, sw, sh, 0, 0))
        x = self.padded(g, xs[0], shapes[0])
        return ggml_pool_2d(g.ctx, x, GGML_OP_POOL_MAX, kw, kh, sw, sh, 0, 0)


class _GlobalPooling2D(Layer, abstract=True):
    layout = SPATIAL
    out_layout = NATURAL  # a (C,) sample is [C, N] in both layouts

    def output_shape(self, shapes):
        if len(shapes[0]) != 3:
            raise GgmlValueError(f"{self.kind} '{self.name}' takes image samples (height, width, channels), got "
                                 f"shape {shapes[0]}")
        return (shapes[0][2],)


class GlobalAveragePooling2D(_GlobalPooling2D):
    """The mean of each channel over the image: (H, W, C) becomes (C,).

    Example:
        >>> model = g.ggml_layer_global_average_pooling_2d(model)
    """
    kind = "global_average_pooling_2d"

    def forward(self, g, xs, shapes):
        h, w, c = shapes[0]
        rows = ggml_reshape_3d(g.ctx, xs[0], w * h, c, g.batch)
        mean = ggml_scale(g.ctx, ggml_sum_rows(g.ctx, rows), 1.0 / (w * h))
        return ggml_reshape_2d(g.ctx, mean, c, g.batch)


class GlobalMaxPooling2D(_GlobalPooling2D):
    """The maximum of each channel over the image: (H, W, C) becomes (C,).

    Example:
        >>> model = g.ggml_layer_global_max_pooling_2d(model)
    """
    kind = "global_max_pooling_2d"

    def forward(self, g, xs, shapes):
        h, w, c = shapes[0]
        pooled = ggml_pool_2d(g.ctx, xs[0], GGML_OP_POOL_MAX, w, h, w, h, 0, 0)
        return ggml_reshape_2d(g.ctx, pooled, c, g.batch)
