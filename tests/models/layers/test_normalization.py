"""Keras' Normalization layer and ggml_layer_adapt: float64 statistics (numpy's, Keras' where installed), from
arrays or streamed batches, written into compiled models, kept out of training, saved; on the CPU and Vulkan."""
from __future__ import annotations

import os

import numpy as np
import pytest

import ggmlpy as g


def _data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 4)) * [1, 10, 0.1, 3] + [5, -2, 0, 1]).astype(np.float32)


def _model(norm, backend="cpu"):
    inp = g.ggml_input(shape=(4,))
    np.random.seed(0)
    m = g.ggml_model(inp, g.ggml_layer_dense(g.ggml_apply(inp, norm), 2, name="o"))
    return g.ggml_compile(m, loss="mse", metrics=[], backend=backend)


@pytest.fixture
def backend(each_device):
    return each_device


def test_adapted_statistics_standardise_as_numpy_says(backend):
    x = _data()
    norm = g.ggml_layer_adapt(g.ggml_normalization(name="norm"), x)
    m = _model(norm, backend)
    w = g.ggml_get_weights(m)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(w["norm.mean"], x64.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(w["norm.variance"], x64.var(axis=0), rtol=1e-6)
    z = (x64 - x64.mean(axis=0)) / np.sqrt(x64.var(axis=0))
    want = z @ w["o.weight"] + w["o.bias"]
    np.testing.assert_allclose(g.ggml_predict(m, x), want, rtol=1e-4, atol=1e-5)
    y = np.random.default_rng(1).normal(size=(len(x), 2)).astype(np.float32)
    g.ggml_fit(m, x, y, epochs=2, batch_size=32, verbose=0)
    after = g.ggml_get_weights(m)
    np.testing.assert_array_equal(after["norm.mean"], w["norm.mean"])  # state, not trained
    np.testing.assert_array_equal(after["norm.variance"], w["norm.variance"])


def test_streamed_batches_adapt_to_the_same_statistics():
    x = _data(n=257)
    whole = g.ggml_layer_adapt(g.ggml_normalization(), x).__dict__["_adapted"]
    class PyDataset:   # Keras' protocol (len and items, no __iter__): its docstring takes it, it was refused
        def __len__(self):
            return 26

        def __getitem__(self, i):
            return x[i * 10:(i + 1) * 10], None

        def on_epoch_end(self):
            pass
    pd = pytest.importorskip("pandas")
    for data, kw in ((x, {"batch_size": 10}), ([x[i:i + 50] for i in range(0, 257, 50)], {}),
                     (((x[i:i + 7], None) for i in range(0, 257, 7)), {}),  # (x, y) batches of a generator
                     (PyDataset(), {}), (pd.DataFrame(x), {})):
        got = g.ggml_layer_adapt(g.ggml_normalization(), data, **kw).__dict__["_adapted"]
        np.testing.assert_allclose(got[0], whole[0], rtol=1e-12)
        np.testing.assert_allclose(got[1], whole[1], rtol=1e-10)


def test_statistics_match_keras():
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: numpy's check above runs")
    x = _data()
    kn = keras.layers.Normalization()
    kn.adapt(x)
    m = _model(g.ggml_layer_adapt(g.ggml_normalization(name="norm"), x))
    w = g.ggml_get_weights(m)
    np.testing.assert_allclose(w["norm.mean"], np.asarray(kn.mean).ravel(), rtol=1e-5)
    np.testing.assert_allclose(w["norm.variance"], np.asarray(kn.variance).ravel(), rtol=1e-5)
    inp = g.ggml_input(shape=(4,))
    only = g.ggml_compile(g.ggml_model(inp, g.ggml_apply(inp, g.ggml_layer_adapt(g.ggml_normalization(), x))),
                          loss="mse", backend="cpu")
    np.testing.assert_allclose(g.ggml_predict(only, x), np.asarray(kn(x)), rtol=1e-5, atol=1e-5)


def test_adapting_a_compiled_model_changes_its_weights_and_saving_keeps_them(tmp_path):
    x = _data()
    norm = g.ggml_normalization(name="norm")
    m = _model(norm)
    np.testing.assert_array_equal(g.ggml_get_weights(m)["norm.variance"], np.ones(4))  # unadapted: 0 and 1
    g.ggml_layer_adapt(norm, x)
    np.testing.assert_allclose(g.ggml_get_weights(m)["norm.mean"], x.astype(np.float64).mean(axis=0), rtol=1e-6)
    g.ggml_save_model(m, tmp_path / "m.gguf")
    loaded = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu")
    np.testing.assert_allclose(g.ggml_predict(loaded, x), g.ggml_predict(m, x), rtol=1e-6)
    again = _model(norm)  # a later compile starts from the adapted values
    np.testing.assert_allclose(g.ggml_get_weights(again)["norm.mean"], g.ggml_get_weights(m)["norm.mean"])


def test_given_statistics_and_one_pair_for_all_values():
    x = _data()
    inp = g.ggml_input(shape=(4,))
    m = g.ggml_compile(g.ggml_model(inp, g.ggml_apply(inp, g.ggml_normalization(mean=[1.0], variance=[4.0]))),
                       loss="mse", backend="cpu")
    np.testing.assert_allclose(g.ggml_predict(m, x), (x - 1.0) / 2.0, rtol=1e-6)
    flat = g.ggml_layer_adapt(g.ggml_normalization(axis=None), x).__dict__["_adapted"]
    np.testing.assert_allclose(flat[0], [x.astype(np.float64).mean()], rtol=1e-9)


def test_adapt_is_refused_with_the_fix():
    x = _data()
    with pytest.raises(g.GgmlTypeError, match="expected a normalization layer"):
        g.ggml_layer_adapt(g.ggml_dense(3), x)
    with pytest.raises(g.GgmlValueError, match="the data has no samples"):
        g.ggml_layer_adapt(g.ggml_normalization(), x[:0])
    with pytest.raises(g.GgmlValueError, match="finite numbers"):
        g.ggml_layer_adapt(g.ggml_normalization(), np.full((3, 4), np.nan))
    norm = g.ggml_normalization(name="n4")
    _model(norm)
    with pytest.raises(g.GgmlValueError, match="normalises 4 features, the data has 3"):
        g.ggml_layer_adapt(norm, x[:, :3])
    with pytest.raises(g.GgmlValueError, match="its mean and variance have 3 values but its input has 4"):
        _model(g.ggml_layer_adapt(g.ggml_normalization(), x[:, :3]))
    with pytest.raises(g.GgmlValueError, match="give both mean and variance"):
        g.ggml_normalization(mean=[0.0])
    with pytest.raises(g.GgmlValueError, match="axis must be -1"):
        g.ggml_normalization(axis=0)

    def adapt_in_a_fit(epoch, logs, state):
        g.ggml_layer_adapt(trained, x)
    trained = g.ggml_normalization()
    m = _model(trained)
    with pytest.raises(g.GgmlInUseError, match="is training; adapt it before or after the fit"):
        g.ggml_fit(m, x, np.zeros((len(x), 2), np.float32), epochs=1, verbose=0,
                   callbacks=[{"on_epoch_end": adapt_in_a_fit}])


def test_epsilon_is_taken_as_keras_names_it(tmp_path):
    """Keras' LayerNormalization / BatchNormalization take epsilon=, which was refused where ggmlR says eps=."""
    inp = g.ggml_input(shape=(4,))
    out = g.ggml_layer_batch_norm(g.ggml_layer_layer_norm(inp, epsilon=1e-3, name="ln"), epsilon=2e-3, name="bn")
    m = g.ggml_compile(g.ggml_model(inp, out), loss="mse", backend="cpu")
    assert (g.ggml_get_layer(m, name="ln").eps, g.ggml_get_layer(m, name="bn").eps) == (1e-3, 2e-3)
    g.ggml_save_model(m, tmp_path / "m.gguf")
    back = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu")
    assert (g.ggml_get_layer(back, name="ln").eps, g.ggml_get_layer(back, name="bn").eps) == (1e-3, 2e-3)
    with pytest.raises(g.GgmlValueError, match="epsilon is Keras' name for eps; give one of the two"):
        g.ggml_layer_norm(eps=1e-4, epsilon=1e-3)
