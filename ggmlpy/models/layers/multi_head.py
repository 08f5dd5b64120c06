"""Multi-head attention (Keras' ``MultiHeadAttention``): self-attention over one input, or cross-attention of a
query sequence over a value (and key) sequence, with an optional attention mask input.

A sample is ``(steps, dim)``: the ggml tensor ``[D, T, N]``. Per head ``h`` the layer computes
``softmax(q_h k_h^T / sqrt(key_dim) + mask) v_h`` and projects the heads' outputs back to the query's ``dim``
values per step. The softmax is ggml's fused ``soft_max_ext`` (scale and mask in one op); the mask is a
constant (-inf above the diagonal when ``causal``) or made from the mask input (Keras' rule: ``-1e9`` where
it is 0), so nothing here needs a backward pass ggml lacks. Cost per sample: ``O(steps^2 * heads * key_dim)`` for the
scores on top of the ``O(steps * dim * heads * key_dim)`` projections.

Where the model's device computes it (``fused.device_computes_attention``: the CPU; a GPU whose ggml kernels take the
size), attention without a mask input and without dropout in training is ggml's fused ``flash_attn_ext``, trained
through its backward op (patches/0056): the scores are recomputed a query row at a time and the ``steps x steps``
matrices are never held, so attention's memory per step grows linearly in the steps. With a mask input the layer
keeps the softmax form: Keras' ``-1e9`` gives a query whose keys are all hidden an even mean of the values, which an
F16 mask cannot say.

Weights in the user's (Keras') orientation: ``query_kernel``/``key_kernel``/``value_kernel``
(dim, heads, key_dim), ``query_bias``/``key_bias``/``value_bias`` (heads, key_dim),
``output_kernel`` (heads, key_dim, dim), ``output_bias`` (dim,).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TYPE_CHECKING

import numpy as np

from ...core.args import is_real, positive_int_arg
from ...errors import GgmlValueError
from ...graph.objects import Tensor
from ...ops.attention import ggml_flash_attn_ext
from ...ops.elementwise import ggml_add, ggml_cont, ggml_mul, ggml_scale_bias, ggml_soft_max_ext
from ...ops.layout import ggml_permute, ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d
from ...ops.linalg import ggml_mul_mat
from . import fused
from .layer import Builder, Layer, LayerOptions
from .weight import BoundWeight, Weight


if TYPE_CHECKING:
    from typing_extensions import Unpack


MASK_NEGATIVE = -1e9  # Keras' softmax mask: added to the scores a mask of 0 hides


class MultiHeadAttention(Layer):
    """Keras' MultiHeadAttention: ``num_heads`` heads of ``key_dim`` values each, scaled dot-product softmax,
    an output projection back to the query's dim. On one node: self-attention over a sequence (steps, dim). On
    a list: cross-attention, ``[query, value]`` (key = value) or ``[query, value, key]`` (the value and key
    sequences of their own length and dim), with ``attention_mask=True`` a last node (query steps, value
    steps) of 1 (attend) and 0 (hide); ``causal=True`` hides later steps. The output has the query's steps
    and dim.

    Without a mask input (and without dropout while training) the layer computes fused attention where the
    model's device has the kernels (ggml's ``flash_attn_ext`` and its backward pass: the CPU, Vulkan, CUDA):
    the ``steps x steps`` scores are never held, so its memory per step grows linearly with the sequence (16x
    less than the softmax form at 1024 steps). With a mask input it computes the scores and a softmax, as
    Keras does (a query whose keys are all hidden averages the values evenly).

    Example:
        >>> x = g.ggml_layer_multi_head_attention(x, num_heads=4, key_dim=16, causal=True)
        >>> y = g.ggml_layer_multi_head_attention([decoder, encoder, pad_mask], num_heads=2, key_dim=8,
        ...                                       attention_mask=True)
    """
    kind = "multi_head_attention"
    many_inputs = "either"
    # ggml [D, K, H] is numpy (H, K, D); Keras' (D, H, K) is that with axes (2, 0, 1)
    query_kernel = Weight(user_axes=(2, 0, 1), quantizable="product")
    query_bias = Weight(initializer="zeros")
    key_kernel = Weight(user_axes=(2, 0, 1), quantizable="product")
    key_bias = Weight(initializer="zeros")
    value_kernel = Weight(user_axes=(2, 0, 1), quantizable="product")
    value_bias = Weight(initializer="zeros")
    output_kernel = Weight(user_axes=(1, 2, 0), quantizable="product")
    output_bias = Weight(initializer="zeros")
    ARG_DOCS = {"attention_mask": "True: the last input node is a mask (query steps, value steps): 1 where a query "
                                  "may attend to a value step, 0 where not (Keras' attention_mask).",
                "dropout": "the fraction of the attention weights (after the softmax) dropped in training, in "
                           "[0, 1) (Keras' dropout); off in inference."}

    def __init__(self, num_heads: int, key_dim: int, causal: bool = False, attention_mask: bool = False,
                 dropout: float = 0.0, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.num_heads = positive_int_arg(None, "num_heads", num_heads)
        self.key_dim = positive_int_arg(None, "key_dim", key_dim)
        for name, value in (("causal", causal), ("attention_mask", attention_mask)):
            if not isinstance(value, bool):
                raise GgmlValueError(f"{name} must be True or False, got {value!r}")
        self.causal, self.attention_mask = causal, attention_mask
        if not is_real(dropout) or not 0 <= dropout < 1:
            raise GgmlValueError(f"multi_head_attention dropout must be a rate in [0, 1), got {dropout!r}")
        self.dropout = float(dropout)

    def dropout_seeds(self) -> int:
        return 1 if self.dropout > 0 else 0

    def _roles(self, shapes: list) -> tuple:
        """(query, value, key, mask) shapes of the inputs (key = value when not given; mask None)."""
        n = len(shapes) - self.attention_mask
        if not 1 <= n <= 3:
            raise GgmlValueError(f"multi_head_attention '{self.name}' takes a node (self-attention) or [query, value] "
                                 f"or [query, value, key]{' and a mask node last' if self.attention_mask else ''}, "
                                 f"got {len(shapes)} nodes")
        q = shapes[0]
        v = shapes[1] if n > 1 else q
        k = shapes[2] if n > 2 else v
        mask = shapes[-1] if self.attention_mask else None
        for role, s in (("query", q), ("value", v), ("key", k)):
            if len(s) != 2:
                raise GgmlValueError(f"multi_head_attention '{self.name}': the {role} must be a sequence (steps, dim), "
                                     f"got samples of shape {s}")
        if k[0] != v[0]:
            raise GgmlValueError(f"multi_head_attention '{self.name}': key and value need the same steps, got {k[0]} "
                                 f"and {v[0]}")
        if mask is not None and tuple(mask) != (q[0], v[0]):
            raise GgmlValueError(f"multi_head_attention '{self.name}': the attention mask must have shape (query "
                                 f"steps, value steps) = {(q[0], v[0])}, got {tuple(mask)}")
        if self.causal and q[0] != v[0]:
            raise GgmlValueError(f"multi_head_attention '{self.name}': causal=True needs as many query as value steps "
                                 f"(got {q[0]} and {v[0]}); give an attention mask instead")
        return q, v, k, mask

    def output_shape(self, shapes):
        return self._roles(shapes)[0]

    def make_params(self, shapes):
        q, v, key, _ = self._roles(shapes)
        h, k = self.num_heads, self.key_dim
        specs = []
        for (kernel, bias), dim in zip(self._projections(), (q[1], key[1], v[1])):
            specs += [kernel.spec((dim, k, h), (dim, h * k)), bias.spec((k, h))]
        return specs + [self.output_kernel.spec((k, h, q[1]), (h * k, q[1])), self.output_bias.spec((q[1],))]

    def _projections(self) -> tuple[tuple[BoundWeight, BoundWeight], ...]:
        """The (kernel, bias) of the query, key and value projections."""
        return ((self.query_kernel, self.query_bias), (self.key_kernel, self.key_bias),
                (self.value_kernel, self.value_bias))

    def graph_tensors(self, shapes):
        return 64

    def _project(self, g: Builder, x2: Any, role: int, steps: int) -> Any:
        """``x W + b`` for query/key/value (``role`` 0, 1, 2): ``[D, T*N]`` -> ``[K, T, H, N]`` (each head's rows
        together)."""
        ctx, h, k = g.ctx, self.num_heads, self.key_dim
        kernel, bias = self._projections()[role]
        y = ggml_add(ctx, g.product(self, kernel, x2, (x2.shape[0], h * k)),
                     ggml_reshape_1d(ctx, g.param(self, bias), h * k))
        y = ggml_reshape_4d(ctx, y, k, h, steps, g.batch)
        return y

    def forward(self, g, xs, shapes):
        (tq, dim), (tv, _), _, mask_shape = self._roles(shapes)
        n_seq = len(xs) - self.attention_mask
        ctx, h, k, n = g.ctx, self.num_heads, self.key_dim, g.batch

        def flat(t: Tensor, shape: tuple[int, ...]) -> Tensor:
            return ggml_reshape_2d(ctx, t, shape[1], shape[0] * n)
        xq = flat(xs[0], shapes[0])
        xv = flat(xs[1], shapes[1]) if n_seq > 1 else xq
        xk = flat(xs[2], shapes[2]) if n_seq > 2 else xv

        def per_head(t: Tensor) -> Tensor:  # [K, H, T, N] -> [K, T, H, N]
            return ggml_cont(ctx, ggml_permute(ctx, t, 0, 2, 1, 3))
        if self._fused(g, tq, tv):
            out = self._flash(g, xq, xk, xv, tq, tv)
        else:
            out = self._softmax_attention(g, xs, xq, xk, xv, tq, tv, per_head)
        y = g.product(self, self.output_kernel, ggml_reshape_2d(ctx, out, h * k, tq * n), (h * k, dim))
        y = ggml_add(ctx, y, g.param(self, self.output_bias))
        return ggml_reshape_3d(ctx, y, dim, tq, n)

    def _fused(self, g: Builder, tq: int, tv: int) -> bool:
        """Whether this graph takes ggml's fused attention: no mask input, no dropout while training, and the
        model's device computes it at this size (forward, and backward when training)."""
        if self.attention_mask or (self.dropout and g.training):
            return False
        return fused.device_computes_attention(g.params.backend.device, self.key_dim, tq, tv, self.num_heads,
                                               g.batch, self.causal, g.training)

    def _flash(self, g: Builder, xq: Tensor, xk: Tensor, xv: Tensor, tq: int, tv: int) -> Tensor:
        """Fused attention: ``[K, H, Tq, N]``, the heads' outputs side by side per query step."""
        ctx = g.ctx

        def per_head(t: Tensor) -> Tensor:  # [K, H, T, N] -> a view [K, T, H, N] (rows stay contiguous)
            return ggml_permute(ctx, t, 0, 2, 1, 3)
        q = per_head(self._project(g, xq, 0, tq))
        key = per_head(self._project(g, xk, 1, tv))
        v = per_head(self._project(g, xv, 2, tv))
        mask = None
        if self.causal:   # ggml's fused attention reads an F16 mask: -inf above the diagonal
            mask = g.constant(np.triu(np.full((tq, tv), -np.inf, dtype=np.float16), 1))
        return ggml_flash_attn_ext(ctx, q, key, v, mask, 1.0 / math.sqrt(self.key_dim))

    def _softmax_attention(self, g: Builder, xs: list, xq: Tensor, xk: Tensor, xv: Tensor, tq: int, tv: int,
                           per_head: Callable[[Tensor], Tensor]) -> Tensor:
        """Attention from its parts (the scores, a softmax with the mask, dropout, the product with the values):
        ``[K, H, Tq, N]``."""
        ctx, k, n = g.ctx, self.key_dim, g.batch
        q = per_head(self._project(g, xq, 0, tq))
        key = per_head(self._project(g, xk, 1, tv))
        # values with the steps fastest, [T, K, H, N], so that the product below sums over the steps
        v = ggml_cont(ctx, ggml_permute(ctx, self._project(g, xv, 2, tv), 1, 2, 0, 3))
        scores = ggml_mul_mat(ctx, key, q)                                   # [Tv keys, Tq queries, H, N]
        mask = None
        if self.attention_mask:  # [Tv, Tq, N] of 1/0 -> 0 / -1e9, one per sample, the same for every head
            keep = xs[-1]
            if self.causal:  # Keras joins both masks into one (a query whose keys are all hidden sees them evenly)
                keep = ggml_mul(ctx, keep, g.constant(np.tril(np.ones((tq, tv), np.float32))))
            mask = ggml_reshape_4d(ctx, ggml_scale_bias(ctx, keep, -MASK_NEGATIVE, MASK_NEGATIVE), tv, tq, 1, n)
        elif self.causal:   # numpy (queries, keys): a query sees its own step and the ones before
            mask = g.constant(np.triu(np.full((tq, tv), -np.inf, dtype=np.float32), 1))
        att = ggml_soft_max_ext(ctx, scores, mask, 1.0 / math.sqrt(k), 0.0)
        if self.dropout and g.training:
            att = g.dropout(att, self.dropout)
        out = ggml_mul_mat(ctx, v, att)                                      # [K, Tq queries, H, N]
        return ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3))       # [K, H, Tq, N]
