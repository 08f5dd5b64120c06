"""Keras' preprocessing helpers (models/io/preprocessing.py) against Keras' documented examples and a plain
Python reference."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


SEQUENCES = [[1], [2, 3], [4, 5, 6]]


@pytest.mark.parametrize("kwargs, expected", [   # the examples of Keras' pad_sequences documentation
    ({}, [[0, 0, 1], [0, 2, 3], [4, 5, 6]]),
    ({"value": -1}, [[-1, -1, 1], [-1, 2, 3], [4, 5, 6]]),
    ({"padding": "post"}, [[1, 0, 0], [2, 3, 0], [4, 5, 6]]),
    ({"maxlen": 2}, [[0, 1], [2, 3], [5, 6]]),
])
def test_pad_sequences_gives_keras_documented_results(kwargs, expected):
    out = g.ggml_pad_sequences(SEQUENCES, **kwargs)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, expected)


def _reference_pad(seqs, maxlen, padding, truncating, value):
    rows = []
    for s in seqs:
        s = list(s)
        s = s[-maxlen:] if truncating == "pre" else s[:maxlen]
        pad = [value] * (maxlen - len(s))
        rows.append(pad + s if padding == "pre" else s + pad)
    return np.array(rows, dtype=np.float64)


@pytest.mark.parametrize("padding", ["pre", "post"])
@pytest.mark.parametrize("truncating", ["pre", "post"])
def test_pad_sequences_matches_a_plain_reference(padding, truncating):
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(1, 50, rng.integers(0, 9))) for _ in range(40)]
    out = g.ggml_pad_sequences(seqs, maxlen=5, padding=padding, truncating=truncating, value=-2, dtype="float64")
    np.testing.assert_array_equal(out, _reference_pad(seqs, 5, padding, truncating, -2))


def test_pad_sequences_of_feature_vectors_and_bad_input():
    out = g.ggml_pad_sequences([np.ones((2, 3)), np.ones((1, 3))], dtype="float32")
    assert out.shape == (2, 2, 3) and out[1, 0].tolist() == [0, 0, 0]
    with pytest.raises(g.GgmlValueError, match="items of shape"):
        g.ggml_pad_sequences([np.ones((2, 3)), np.ones((1, 4))])
    with pytest.raises(g.GgmlValueError, match="padding must be 'pre' or 'post'"):
        g.ggml_pad_sequences(SEQUENCES, padding="middle")
    with pytest.raises(g.GgmlValueError, match="maxlen must be a positive int"):
        g.ggml_pad_sequences(SEQUENCES, maxlen=0)
    with pytest.raises(g.GgmlTypeError, match=r"sequences\[1\] is a str"):
        g.ggml_pad_sequences([[1], "ab"])


def test_to_categorical_matches_numpy_eye():
    y = np.random.default_rng(0).integers(0, 7, 50)
    np.testing.assert_array_equal(g.ggml_to_categorical(y), np.eye(7, dtype=np.float32)[y])
    np.testing.assert_array_equal(g.ggml_to_categorical(y.reshape(-1, 1), num_classes=9), np.eye(9)[y])
    tokens = y.reshape(5, 10)
    assert g.ggml_to_categorical(tokens, num_classes=7).shape == (5, 10, 7)
    np.testing.assert_array_equal(g.ggml_to_categorical([0, 1, 2, 3], num_classes=4), np.eye(4))  # Keras' docs


@pytest.mark.parametrize("y, num_classes, text", [
    ([0, 3], 3, "holds the id 3, but num_classes is 3"),
    ([-1, 0], None, "must be >= 0"),
    ([0.5, 1], None, "integer class ids"),
    ([0, 1], 0, "num_classes must be a positive int"),
])
def test_to_categorical_refuses_ids_it_cannot_encode(y, num_classes, text):
    with pytest.raises(g.GgmlValueError, match=text):
        g.ggml_to_categorical(y, num_classes)


def test_one_hot_labels_train_a_model_as_sparse_ids_do():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    ids = rng.integers(0, 3, 48)

    def fit(loss, y):
        np.random.seed(0)
        m = g.ggml_model_sequential()
        g.ggml_layer_dense(m, 3, activation="softmax", input_shape=(4,))
        g.ggml_compile(m, loss=loss, backend="cpu")
        return g.ggml_fit(m, x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)["train_loss"]
    np.testing.assert_allclose(fit("categorical_crossentropy", g.ggml_to_categorical(ids)),
                               fit("sparse_categorical_crossentropy", ids), rtol=1e-5)
