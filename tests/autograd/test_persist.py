"""ag_save_model / ag_load_model: GGUF round trips by name (parameters and batch-norm statistics), the builder
stored in the file, clear errors for another architecture, and a model-layer model's weights in an ag_sequential
(its file and the live model), predicting what the model layer predicts."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.autograd import builders


def test_a_saved_module_loads_back_by_name(tmp_path):
    np.random.seed(0)
    m = builders.small_mlp()
    x = np.random.randn(8, 4)
    m(g.ag_tensor(x)).numpy()                  # a training forward: batch norm's running statistics move
    path = g.ag_save_model(m, tmp_path / "m.gguf", model_fn=builders.small_mlp)
    back = g.ag_load_model(path)
    assert not back.training
    for (name, a), (_, b) in zip(m.state().items(), back.state().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    g.ag_eval(m)
    np.testing.assert_allclose(back(g.ag_tensor(x)).numpy(), m(g.ag_tensor(x)).numpy(), rtol=1e-6)


def test_loading_refuses_another_architecture_and_an_unnamed_builder(tmp_path):
    m = builders.small_mlp()
    g.ag_save_model(m, tmp_path / "m.gguf")
    with pytest.raises(g.GgmlValueError, match="pass model_fn"):
        g.ag_load_model(tmp_path / "m.gguf")
    with pytest.raises(g.GgmlValueError, match="layer1_W|lacks|another architecture"):
        g.ag_load_model(tmp_path / "m.gguf", model_fn=builders.dense_pair)
    with pytest.raises(g.GgmlValueError, match="cannot be imported"):
        g.ag_save_model(m, tmp_path / "x.gguf", model_fn=lambda: builders.small_mlp())


@pytest.mark.parametrize("source", ["file", "model"])
def test_a_model_layer_models_weights_load_into_an_ag_sequential(tmp_path, source):
    np.random.seed(1)
    model = g.ggml_model_sequential()
    model = g.ggml_layer_dense(model, 5, activation="relu", input_shape=4)
    model = g.ggml_layer_dense(model, 3)
    model = g.ggml_compile(model, optimizer="adam", loss="mse")
    x = np.random.randn(6, 4).astype(np.float32)
    g.ggml_fit(model, x, np.random.randn(6, 3).astype(np.float32), epochs=2, batch_size=6, verbose=0)
    if source == "file":
        g.ggml_save_model(model, tmp_path / "m.gguf")
        ag = g.ag_load_model(tmp_path / "m.gguf", model_fn=builders.dense_pair)
    else:
        ag = g.ag_load_model(model, model_fn=builders.dense_pair)
    np.testing.assert_allclose(ag(g.ag_tensor(x)).numpy(), g.ggml_predict(model, x), rtol=1e-5, atol=1e-6)


def test_a_quantized_model_layer_file_loads_decoded_and_adapters_are_refused(tmp_path):
    np.random.seed(2)
    model = g.ggml_model_sequential()
    model = g.ggml_layer_dense(model, 32, activation="relu", input_shape=32)
    model = g.ggml_layer_dense(model, 3)
    model = g.ggml_compile(model, optimizer="adam", loss="mse", backend="cpu")
    x = np.random.randn(6, 32).astype(np.float32)
    g.ggml_save_model(model, tmp_path / "q.gguf", quantize="q8_0")
    ag = g.ag_load_model(tmp_path / "q.gguf", model_fn=builders.dense_pair_32)
    decoded = g.ggml_load_model(tmp_path / "q.gguf", backend="cpu", dequantize=True)   # F32 products
    np.testing.assert_allclose(ag(g.ag_tensor(x)).numpy(), g.ggml_predict(decoded, x), rtol=1e-5, atol=1e-6)
    g.ggml_add_lora(model, rank=2)
    with pytest.raises(g.GgmlValueError, match="merge them"):
        g.ag_load_model(model, model_fn=builders.dense_pair_32)
