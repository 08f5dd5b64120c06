"""Attention for the autograd engine: ``ag_flash_attention`` (the fused core: ggml's ``flash_attn_ext`` and its
backward pass, patches/0056-0058, so the score matrix is never held) and the ``ag_multihead_attention`` layer.

Heads are contiguous blocks of the features: head ``h`` of a ``(seq, d)`` tensor is its columns
``h*d/n_heads ... (h+1)*d/n_heads - 1``. A leading batch axis ``(B, seq, d)`` is allowed.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.args import is_real, positive_int_arg
from ..errors import GgmlTypeError, GgmlValueError
from ..graph.objects import Tensor
from ..ops.attention import ggml_flash_attn_ext
from ..ops.layout import ggml_permute, ggml_reshape_3d, ggml_reshape_4d
from .lazy import Builder, Op
from .nn import Dropout, Module
from .ops import ag_add, ag_matmul, ag_reshape, ag_softmax, ag_transpose, floating, linear, operand, tensor_arg
from .tensor import ag_param, AgTensor, result


__all__ = ["ag_flash_attention", "ag_multihead_attention"]


def _lower_flash(b: Builder, xs: list[Tensor], attrs: tuple) -> Tensor:
    heads, scale, batch, tq, tk, d, dv, causal = attrs
    q, k, v = xs[:3]
    mask = xs[3] if len(xs) > 3 else None

    def split(t: Tensor, steps: int, width: int) -> Tensor:   # [width, steps, B] -> [width/H, steps, H, B]
        return ggml_permute(b.ctx, ggml_reshape_4d(b.ctx, t, width // heads, heads, steps, batch), 0, 2, 1, 3)
    if causal:   # -inf above the diagonal: query i sees keys 0..i
        mask = b.constant(np.triu(np.full((tq, tk), -np.inf, dtype=np.float16), 1))
    out = ggml_flash_attn_ext(b.ctx, split(q, tq, d), split(k, tk, d), split(v, tk, dv), mask, scale)
    return ggml_reshape_3d(b.ctx, out, dv, tq, batch)   # [dv/H, H, Tq, B]: the heads' outputs side by side


_FLASH = Op("flash_attention", _lower_flash)


def _additive_mask(mask: object, tq: int, tk: int, like: AgTensor, fn: str) -> AgTensor:
    """A (seq_q, seq_kv) mask as an f16 input: a boolean one (True attends) becomes 0 / -inf."""
    arr = mask.numpy() if isinstance(mask, AgTensor) else np.asarray(mask)
    if arr.shape != (tq, tk):
        raise GgmlValueError(f"{fn}: mask must have shape (seq_q, seq_kv) = {(tq, tk)}, got {arr.shape}")
    if arr.dtype == bool:
        add = np.where(arr, 0.0, -np.inf)
    elif arr.dtype.kind in "iuf":
        add = arr.astype(np.float64)
    else:
        raise GgmlTypeError(f"{fn}: mask must be boolean (True attends) or additive numbers, got {arr.dtype}")
    t = AgTensor(like.engine, (tq, tk), "f16")
    t.host = add.astype(np.float16)
    return t


def ag_flash_attention(q: AgTensor, k: AgTensor, v: AgTensor, n_heads: int, scale: float | None = None,
                       mask: object = None, causal: bool = False) -> AgTensor:
    """Multi-head attention's core, fused: ``softmax(scale * Q_h K_h^T + mask) V_h`` for each head, the heads'
    outputs side by side. Neither the forward nor the backward pass holds the ``seq_q x seq_kv`` scores.

    Arguments:
        q: queries ``(seq_q, d)`` (or ``(B, seq_q, d)``), d a multiple of n_heads.
        k: keys ``(seq_kv, d)`` (batch like q).
        v: values ``(seq_kv, d_v)``, d_v a multiple of n_heads.
        n_heads: the number of heads.
        scale: the scores' factor; None: ``1 / sqrt(d / n_heads)``.
        mask: None, or ``(seq_q, seq_kv)``: boolean (True attends) or additive (0 / -inf); data, no gradient.
        causal: query i attends keys 0..i (with a mask: ValueError).

    Value: a lazy AgTensor ``(seq_q, d_v)`` (``(B, seq_q, d_v)``).

    Example:
        >>> out = ag_flash_attention(q, k, v, n_heads=4, causal=True)
    """
    fn = "ag_flash_attention"
    q = floating(tensor_arg(q, fn, "q"), fn, "q")
    k, v = floating(operand(k, q, fn, "k"), fn, "k"), floating(operand(v, q, fn, "v"), fn, "v")
    heads = positive_int_arg(fn, "n_heads", n_heads)
    if q.ndim not in (2, 3) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise GgmlValueError(f"{fn}: q, k, v must all be (seq, d) or (B, seq, d), got {q.shape}, {k.shape}, {v.shape}")
    batch = q.shape[0] if q.ndim == 3 else 1
    if q.ndim == 3 and (k.shape[0] != batch or v.shape[0] != batch):
        raise GgmlValueError(f"{fn}: q, k, v must have the same batch, got {q.shape}, {k.shape}, {v.shape}")
    (tq, d), (tk, dk), (tv, dv) = q.shape[-2:], k.shape[-2:], v.shape[-2:]
    if dk != d or tv != tk:
        raise GgmlValueError(f"{fn}: k must be (seq_kv, {d}) and v (seq_kv, d_v) with one seq_kv, got k {k.shape} "
                             f"and v {v.shape}")
    if d % heads or dv % heads:
        raise GgmlValueError(f"{fn}: d ({d}) and d_v ({dv}) must be multiples of n_heads ({heads})")
    if scale is None:
        scale = 1.0 / math.sqrt(d // heads)
    if not is_real(scale) or not math.isfinite(float(scale)):
        raise GgmlValueError(f"{fn}: scale must be a finite number or None, got {scale!r}")
    if mask is not None and causal:
        raise GgmlValueError(f"{fn}: give a mask or causal=True, not both (a causal mask can be part of the mask)")
    ins = (q, k, v) + ((_additive_mask(mask, tq, tk, q, fn),) if mask is not None else ())
    attrs = (heads, float(scale), batch, tq, tk, d, dv, bool(causal))
    return result(_FLASH, ins, q.shape[:-1] + (dv,), attrs)


class MultiheadAttention(Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float, bias: bool, device: str | None) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.bias = d_model, n_heads, bias
        limit = math.sqrt(6.0 / (2 * d_model))
        self.W_q, self.W_k, self.W_v, self.W_o = (ag_param(np.random.uniform(-limit, limit, (d_model, d_model)),
                                                           device) for _ in range(4))
        self.b_o = ag_param(np.zeros(d_model), device) if bias else None
        self.dropout = Dropout(dropout)

    def _own(self) -> dict[str, AgTensor]:
        own = {"W_q": self.W_q, "W_k": self.W_k, "W_v": self.W_v, "W_o": self.W_o}
        return {**own, "b_o": self.b_o} if self.b_o is not None else own

    def children(self) -> list[Module]:
        return [self.dropout]

    def __call__(self, x: AgTensor, k: AgTensor | None = None, v: AgTensor | None = None,
                 causal_mask: bool = False) -> AgTensor:
        return self.forward(x, k, v, causal_mask)

    def forward(self, x: AgTensor, k: AgTensor | None = None, v: AgTensor | None = None,
                causal_mask: bool = False) -> AgTensor:
        fn = "ag_multihead_attention"
        q_in = tensor_arg(x, fn, "q")
        k_in = q_in if k is None else tensor_arg(k, fn, "k")
        v_in = k_in if v is None else tensor_arg(v, fn, "v")
        for what, t in (("q", q_in), ("k", k_in), ("v", v_in)):
            if t.ndim != 2 or t.shape[1] != self.d_model:
                raise GgmlValueError(f"{fn}: {what} must be (seq, {self.d_model}), got {t.shape}")
        q, kk, vv = (linear(t, w, None, fn) for t, w in ((q_in, self.W_q), (k_in, self.W_k), (v_in, self.W_v)))
        if self.training and self.dropout.rate > 0:
            heads = self._unfused(q, kk, vv, bool(causal_mask))   # dropout on the attention weights
        else:
            heads = ag_flash_attention(q, kk, vv, self.n_heads, causal=bool(causal_mask))
        return linear(heads, self.W_o, self.b_o, fn)

    def _unfused(self, q: AgTensor, k: AgTensor, v: AgTensor, causal: bool) -> AgTensor:
        h, dh = self.n_heads, self.d_model // self.n_heads
        tq, tk = q.shape[0], k.shape[0]

        def split(t: AgTensor, steps: int) -> AgTensor:   # (steps, d) -> (heads, steps, dh)
            return ag_transpose(ag_reshape(t, (steps, h, dh)), 0, 1)
        scores = ag_matmul(split(q, tq), ag_transpose(split(k, tk))) * (1.0 / math.sqrt(dh))
        if causal:
            scores = ag_add(scores, np.triu(np.full((tq, tk), -1e9, dtype=np.float32), 1))
        weights = self.dropout(ag_softmax(scores))
        return ag_reshape(ag_transpose(ag_matmul(weights, split(v, tk)), 0, 1), (tq, self.d_model))

    def __repr__(self) -> str:
        return f"ag_multihead_attention({self.d_model}, {self.n_heads}, dropout={self.dropout.rate})"


def ag_multihead_attention(d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                           device: str | None = None) -> MultiheadAttention:
    """Multi-head attention: ``Q = q @ W_q.T`` (K, V alike), the heads' attention (``ag_flash_attention``, scale
    ``1 / sqrt(d_model / n_heads)``), then ``concat @ W_o.T + b_o``.

    In training with ``dropout > 0`` the scores are computed and dropped out explicitly (the fused kernel has no
    dropout); otherwise the fused core runs.

    Arguments:
        d_model: the features of q, k, v and the output; a multiple of n_heads.
        n_heads: the number of heads.
        dropout: the attention weights' dropout rate in training, in [0, 1).
        bias: learn the output bias ``b_o`` (zeros).
        device: where the parameters live; None: the default.

    Value: a layer; ``layer(q, k=None, v=None, causal_mask=False)`` on ``(seq, d_model)`` tensors (k defaults to
    q, v to k) returns ``(seq_q, d_model)``; parameters ``W_q, W_k, W_v, W_o`` (d, d) and ``b_o``.

    Example:
        >>> attn = ag_multihead_attention(64, 4)
        >>> y = attn(x, causal_mask=True)
    """
    fn = "ag_multihead_attention"
    d, h = positive_int_arg(fn, "d_model", d_model), positive_int_arg(fn, "n_heads", n_heads)
    if d % h:
        raise GgmlValueError(f"{fn}: d_model ({d}) must be a multiple of n_heads ({h})")
    if not is_real(dropout) or not 0.0 <= float(dropout) < 1.0:
        raise GgmlValueError(f"{fn}: dropout must be in [0, 1), got {dropout!r}")
    return MultiheadAttention(d, h, float(dropout), bool(bias), device)
