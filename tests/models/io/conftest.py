"""The digits MLP the quantization and adapter tests share: 64-128-64-10, trained on the first 1,400 of
scikit-learn's 1,797 digits (the rest held out), on the CPU, once per session."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


@pytest.fixture(scope="session")
def digits_mlp():
    """(model, x, y): the trained model, every digit's pixels in [0, 1] and its label (int32)."""
    sk = pytest.importorskip("sklearn.datasets", reason="the digits come with scikit-learn")
    digits = sk.load_digits()
    x, y = (digits.data / 16).astype(np.float32), digits.target.astype(np.int32)
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 128, activation="relu", input_shape=64)
    m = g.ggml_layer_dense(m, 64, activation="relu")
    m = g.ggml_layer_dense(m, 10, activation="softmax")
    m = g.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend="cpu")
    g.ggml_fit(m, x[:1400], y[:1400], epochs=15, batch_size=32, verbose=0)
    return m, x, y
