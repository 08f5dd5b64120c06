"""Builders of ag_* models that ag_save_model can name (importable functions), for tests/autograd/test_persist.py."""
from __future__ import annotations

import ggmlpy as g


def small_mlp():
    return g.ag_sequential(g.ag_linear(4, 5, "relu"), g.ag_batch_norm(5), g.ag_linear(5, 3))


def dense_pair():
    return g.ag_sequential(g.ag_linear(4, 5, "relu"), g.ag_linear(5, 3))


def dense_pair_32():
    """Two dense layers whose kernels' rows (32 inputs each) are whole q8_0 blocks."""
    return g.ag_sequential(g.ag_linear(32, 32, "relu"), g.ag_linear(32, 3))
