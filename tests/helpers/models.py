"""Small data sets and models that several model-layer tests share."""
from __future__ import annotations

import numpy as np

import ggmlpy as g


def blobs(n=240, seed=0, classes=3, features=4):
    """``n`` samples of ``features`` floats around ``classes`` Gaussian centres, and their class ids."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(classes, features))
    ids = rng.integers(0, classes, n)
    return (centers[ids] + rng.normal(size=(n, features))).astype(np.float32), ids


def classifier(loss="categorical_crossentropy", backend="cpu", lr=0.02, **kw):
    """A compiled MLP for ``blobs``: 4 features, 16 relu units, 3 softmax classes."""
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 16, activation="relu", input_shape=(4,))
    m = g.ggml_layer_dense(m, 3, activation="softmax")
    return g.ggml_compile(m, loss=loss, backend=backend, learning_rate=lr, **kw)


def mlp(units=(8, 3), input_shape=(4,)):
    """An uncompiled sequential MLP: dense relu, then dense softmax (``units``), named dense_1 and dense_2."""
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, units[0], activation="relu", input_shape=input_shape)
    return g.ggml_layer_dense(m, units[1], activation="softmax")
