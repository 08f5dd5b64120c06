"""A float64 numpy reference of attention and of its gradients, against which ggml's fused attention (forward and
FLASH_ATTN_BACK, patches/0056-0058) is checked on every backend."""
from __future__ import annotations

import numpy as np


def attention(q, k, v, mask, scale):
    """(out [B, H, N, Dv], P [B, H, N, M]) of softmax(scale q k^T + mask) v per head, in float64: q [B, H, N, D],
    k [B, Hkv, M, D], v [B, Hkv, M, Dv] (query head h reads kv head h // (H / Hkv)), mask additive (-inf hides a
    key) broadcastable to [B, H, N, M], or None. A row whose keys are all hidden gets P = 0 (ggml's forward: 0)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    ke, ve = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = scale * q @ ke.swapaxes(-1, -2)
    if mask is not None:
        s = s + mask
    smax = np.max(s, axis=-1, keepdims=True)
    seen = np.isfinite(smax)
    e = np.where(seen, np.exp(s - np.where(seen, smax, 0.0)), 0.0)
    tot = e.sum(-1, keepdims=True)
    p = e / np.where(tot > 0, tot, 1.0)
    return p @ ve, p


def attention_grads(q, k, v, do, mask, scale):
    """Gradients of sum(attention(q, k, v) * dO) with respect to q, k and v (shapes as ``attention``'s), for
    do [B, H, N, Dv]. Per head: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K,
    dK = scale dS^T Q; a kv head sums over its query heads."""
    q, k, v, do = (np.asarray(a, np.float64) for a in (q, k, v, do))
    rep = q.shape[1] // k.shape[1]
    ke, ve = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    _, p = attention(q, k, v, mask, scale)
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ ve.swapaxes(-1, -2)
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
    dq = scale * ds @ ke
    dk = scale * ds.swapaxes(-1, -2) @ q

    def fold(a):   # [B, H, ...] -> [B, Hkv, ...], the query heads of a group summed
        return a.reshape(a.shape[0], k.shape[1], rep, *a.shape[2:]).sum(axis=2)
    return dq, fold(dk), fold(dv)
