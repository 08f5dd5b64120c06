"""Saving and loading models and weights in GGUF."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


def cnn():
    np.random.seed(5)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_2d(m, 4, (3, 3), activation="relu", padding="same", input_shape=(6, 6, 2))
    m = g.ggml_layer_batch_norm(m)
    m = g.ggml_layer_max_pooling_2d(m, (2, 2))
    m = g.ggml_layer_flatten(m)
    m = g.ggml_layer_dropout(m, 0.25)
    m = g.ggml_layer_dense(m, 3, activation="softmax")
    return g.ggml_compile(m, loss="sparse_categorical_crossentropy", backend="cpu", learning_rate=0.01)


def functional():
    np.random.seed(6)
    a = g.ggml_input(shape=(5,), name="a")
    t = g.ggml_input(shape=(4,), dtype="int32", name="tokens")
    e = g.ggml_layer_flatten(g.ggml_layer_embedding(t, 10, 3))
    h = g.ggml_layer_concatenate([g.ggml_layer_dense(a, 4, activation="relu"), e])
    out = g.ggml_layer_dense(h, 2, activation="softmax")
    return g.ggml_compile(g.ggml_model([a, t], out), backend="cpu")


def data(n=12):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 6, 6, 2)).astype(np.float32), rng.integers(0, 3, n)


def test_model_roundtrip_predicts_identically_and_trains_on(tmp_path):
    m = cnn()
    x, y = data()
    g.ggml_fit(m, x, y, epochs=2, batch_size=4, verbose=0)      # batch-norm statistics move too
    path = tmp_path / "model.gguf"
    g.ggml_save_model(m, path)
    loaded = g.ggml_load_model(path, backend="cpu")
    assert [l.name for l in loaded.layers] == [l.name for l in m.layers]
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), g.ggml_predict(m, x))
    assert loaded.compiled.heads[0].loss == "sparse_categorical_crossentropy"
    h = g.ggml_fit(loaded, x, y, epochs=3, batch_size=4, verbose=0)
    assert np.isfinite(h["train_loss"]).all()
    assert not np.array_equal(g.ggml_predict(loaded, x), g.ggml_predict(m, x))


def test_functional_roundtrip(tmp_path):
    m = functional()
    rng = np.random.default_rng(1)
    x = [rng.normal(size=(6, 5)), rng.integers(0, 10, (6, 4))]
    g.ggml_save_model(m, tmp_path / "f.gguf")
    loaded = g.ggml_load_model(tmp_path / "f.gguf", backend="cpu")
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), g.ggml_predict(m, x))


def test_weights_roundtrip_and_architecture_mismatch(tmp_path):
    m = cnn()
    x, y = data()
    path = tmp_path / "w.gguf"
    g.ggml_save_weights(m, path)
    other = cnn()
    g.ggml_fit(other, x, y, epochs=1, batch_size=4, verbose=0)
    assert g.ggml_load_weights(other, path) is other
    np.testing.assert_array_equal(g.ggml_predict(other, x), g.ggml_predict(m, x))
    wrong = g.ggml_model_sequential()
    wrong = g.ggml_layer_conv_2d(wrong, 5, (3, 3), input_shape=(6, 6, 2))
    wrong = g.ggml_compile(g.ggml_layer_dense(g.ggml_layer_flatten(wrong), 3), backend="cpu")
    before = g.ggml_get_weights(wrong)
    with pytest.raises(ValueError, match="conv_2d_1.kernel"):
        g.ggml_load_weights(wrong, path)
    for k, v in g.ggml_get_weights(wrong).items():   # nothing was loaded
        np.testing.assert_array_equal(v, before[k])
    with pytest.raises(ValueError, match="weights-only"):
        g.ggml_load_model(path)


def test_missing_file_and_uncompiled(tmp_path):
    with pytest.raises(FileNotFoundError):
        g.ggml_load_model(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError):
        g.ggml_load_weights(cnn(), tmp_path / "nope.gguf")


def test_files_are_plain_gguf_readable_by_the_gguf_package(tmp_path):
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf)")
    m = cnn()
    path = tmp_path / "model.gguf"
    g.ggml_save_model(m, path)
    reader = gguf.GGUFReader(str(path))
    names = [t.name for t in reader.tensors]
    assert names[:2] == ["conv_2d_1.kernel", "conv_2d_1.bias"]
    kernel = next(t for t in reader.tensors if t.name == "conv_2d_1.kernel")
    keras = g.ggml_get_weights(m)["conv_2d_1.kernel"]            # (rows, cols, in, filters)
    data = np.asarray(kernel.data).reshape(4, 2, 3, 3)             # ggml [KW, KH, Cin, Cout] as numpy
    np.testing.assert_array_equal(data, np.transpose(keras, (3, 2, 0, 1)))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "ggmlpy"
