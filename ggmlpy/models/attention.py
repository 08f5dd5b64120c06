"""Multi-head self-attention (Keras' ``MultiHeadAttention`` with query = key = value = the input).

A sample is ``(steps, dim)``: the ggml tensor ``[D, T, N]``. Per head ``h`` the layer computes
``softmax(q_h k_h^T / sqrt(key_dim) + mask) v_h`` and projects the heads' outputs back to ``dim``
values per step. The softmax is ggml's fused ``soft_max_ext`` (scale and mask in one op), and the
mask is a constant tensor (0, or -inf above the diagonal when ``causal``), so nothing here needs a
backward pass ggml lacks. Cost per sample: ``O(steps^2 * heads * key_dim)`` for the scores on top of
the ``O(steps * dim * heads * key_dim)`` projections.

Weights in the user's (Keras') orientation: ``query_kernel``/``key_kernel``/``value_kernel``
(dim, heads, key_dim), ``query_bias``/``key_bias``/``value_bias`` (heads, key_dim),
``output_kernel`` (heads, key_dim, dim), ``output_bias`` (dim,).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import GgmlValueError
from ..ops.elementwise import ggml_add, ggml_cont, ggml_soft_max_ext
from ..ops.layout import ggml_permute, ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d
from ..ops.linalg import ggml_mul_mat
from .layers import Layer, ParamSpec, positive_int


class MultiHeadAttention(Layer):
    kind = "multi_head_attention"

    def __init__(self, num_heads: int, key_dim: int, causal: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.num_heads = positive_int(num_heads, "num_heads")
        self.key_dim = positive_int(key_dim, "key_dim")
        if not isinstance(causal, bool):
            raise GgmlValueError(f"causal must be True or False, got {causal!r}")
        self.causal = causal

    def config(self) -> dict:
        return {"num_heads": self.num_heads, "key_dim": self.key_dim, "causal": self.causal}

    def output_shape(self, shapes):
        if len(shapes[0]) != 2:
            raise GgmlValueError(f"multi_head_attention '{self.name}' takes sequences of shape (steps, dim), got "
                                 f"samples of shape {shapes[0]}")
        return shapes[0]

    def make_params(self, shapes):
        dim, h, k = shapes[0][1], self.num_heads, self.key_dim
        # ggml [D, K, H] is numpy (H, K, D); Keras' (D, H, K) is that with axes (2, 0, 1)
        specs = []
        for name in ("query", "key", "value"):
            specs += [ParamSpec(f"{name}_kernel", (dim, k, h), "glorot", (dim, h * k), user_axes=(2, 0, 1)),
                      ParamSpec(f"{name}_bias", (k, h), "zeros")]
        return specs + [ParamSpec("output_kernel", (k, h, dim), "glorot", (h * k, dim), user_axes=(1, 2, 0)),
                        ParamSpec("output_bias", (dim,), "zeros")]

    def graph_tensors(self, shapes):
        return 64

    def _project(self, g: Any, x2: Any, name: str, steps: int) -> Any:
        """``x W + b`` for query/key/value: ``[D, T*N]`` -> ``[K, T, H, N]`` (each head's rows together)."""
        ctx, h, k = g.ctx, self.num_heads, self.key_dim
        w = ggml_reshape_2d(ctx, g.param(self, f"{name}_kernel"), x2.shape[0], h * k)
        y = ggml_add(ctx, ggml_mul_mat(ctx, w, x2), ggml_reshape_1d(ctx, g.param(self, f"{name}_bias"),
                                                                                 h * k))
        y = ggml_reshape_4d(ctx, y, k, h, steps, g.batch)
        return y

    def forward(self, g, xs, shapes):
        steps, dim = shapes[0]
        ctx, h, k, n = g.ctx, self.num_heads, self.key_dim, g.batch
        x2 = ggml_reshape_2d(ctx, xs[0], dim, steps * n)
        per_head = lambda t: ggml_cont(ctx, ggml_permute(ctx, t, 0, 2, 1, 3))   # [K, H, T, N] -> [K, T, H, N]
        q = per_head(self._project(g, x2, "query", steps))
        key = per_head(self._project(g, x2, "key", steps))
        # values with the steps fastest, [T, K, H, N], so that the product below sums over the steps
        v = ggml_cont(ctx, ggml_permute(ctx, self._project(g, x2, "value", steps), 1, 2, 0, 3))
        scores = ggml_mul_mat(ctx, key, q)                                   # [T keys, T queries, H, N]
        mask = None
        if self.causal:   # numpy (queries, keys): a query sees its own step and the ones before
            mask = g.constant(np.triu(np.full((steps, steps), -np.inf, dtype=np.float32), 1))
        att = ggml_soft_max_ext(ctx, scores, mask, 1.0 / math.sqrt(k), 0.0)
        out = ggml_mul_mat(ctx, v, att)                                      # [K, T queries, H, N]
        out = ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3))        # [K, H, T, N]
        wo = ggml_reshape_2d(ctx, g.param(self, "output_kernel"), h * k, dim)
        y = ggml_mul_mat(ctx, wo, ggml_reshape_2d(ctx, out, h * k, steps * n))
        y = ggml_add(ctx, y, g.param(self, "output_bias"))
        return ggml_reshape_3d(ctx, y, dim, steps, n)
