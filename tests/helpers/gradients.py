"""Central finite differences in numpy float64, against which ggml's gradients are checked, and the numpy
references that several gradient tests share."""
from __future__ import annotations

import numpy as np


def f64(a):
    return np.asarray(a, dtype=np.float64)


def fd_grad(f, x, r, h=1e-5):
    """Central differences of sum(f(x) * r) in float64."""
    x = f64(x)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (np.sum(f(xp) * r) - np.sum(f(xm) * r)) / (2 * h)
    return g


def pool2d(X, op, k, s):
    """Max (``op == "max"``) or average pooling of the last two axes of ``X``: ``k`` x ``k`` windows, stride ``s``."""
    *lead, H, W = X.shape
    OH, OW = (H - k) // s + 1, (W - k) // s + 1
    out = np.zeros((*lead, OH, OW))
    for oh in range(OH):
        for ow in range(OW):
            win = X[..., oh * s:oh * s + k, ow * s:ow * s + k]
            out[..., oh, ow] = win.max(axis=(-1, -2)) if op == "max" else win.mean(axis=(-1, -2))
    return out
