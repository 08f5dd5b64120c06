"""Keras' MultiHeadAttention beyond self-attention: a query sequence attending over a value (and key) sequence
of other lengths and dimensions, and an attention-mask input; against a float64 numpy reference and Keras 3
where installed, on the CPU and Vulkan; saved and loaded; misuse refused.
Gradients (finite differences of the references, and Vulkan's against the CPU's): test_sequence_layers.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers import layer_refs as R


N, TQ, TV, DQ, DV, DK = 6, 4, 5, 3, 2, 4


@pytest.fixture
def backend(each_device):
    return each_device


def _reference(q, v, k, w, mask=None, causal=False):
    """Keras' MultiHeadAttention(q, v, k, attention_mask=mask) in float64 (tests/helpers/layer_refs.py)."""
    return R.multi_head_attention(q, w, "att", causal, value=v, key=k, mask=mask)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(N, TQ, DQ)).astype(np.float32)
    v = rng.normal(size=(N, TV, DV)).astype(np.float32)
    k = rng.normal(size=(N, TV, DK)).astype(np.float32)
    mask = (rng.random((N, TQ, TV)) > 0.4).astype(np.float32)
    mask[:, :, 0] = 1.0
    return q, v, k, mask


def _model(backend, with_key, with_mask, causal=False):
    np.random.seed(1)
    tq = TV if causal else TQ
    nodes = [g.ggml_input(shape=(tq, DQ)), g.ggml_input(shape=(TV, DV))]
    if with_key:
        nodes.append(g.ggml_input(shape=(TV, DK)))
    if with_mask:
        nodes.append(g.ggml_input(shape=(tq, TV)))
    out = g.ggml_layer_multi_head_attention(nodes, num_heads=2, key_dim=3, causal=causal, attention_mask=with_mask,
                                            name="att")
    return g.ggml_compile(g.ggml_model(nodes, out), optimizer="sgd", loss="mse", metrics=[], backend=backend,
                          learning_rate=0.1)


@pytest.mark.parametrize("with_key", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_cross_attention_follows_the_reference(with_key, with_mask, backend):
    q, v, k, mask = _data()
    m = _model(backend, with_key, with_mask)
    w = g.ggml_get_weights(m)
    x = [q, v] + ([k] if with_key else []) + ([mask] if with_mask else [])
    want = _reference(q, v, k if with_key else v, w, mask if with_mask else None)
    np.testing.assert_allclose(g.ggml_predict(m, x), want, rtol=1e-5, atol=1e-6)
    h = g.ggml_fit(m, x, np.zeros((N, TQ, DQ), np.float32), epochs=3, batch_size=3, verbose=0)
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]


def test_a_mask_and_causal_together():
    q, v, _, mask = _data()
    m = _model("cpu", False, True, causal=True)
    qq = np.random.default_rng(3).normal(size=(N, TV, DQ)).astype(np.float32)
    full = np.ones((N, TV, TV), np.float32)
    full[:, 2, 1] = 0.0
    want = _reference(qq, v, v, g.ggml_get_weights(m), full, causal=True)
    np.testing.assert_allclose(g.ggml_predict(m, [qq, v, full]), want, rtol=1e-5, atol=1e-6)


def test_cross_attention_trains_as_keras(tmp_path):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: the numpy reference "
                                               "above and test_sequence_layers.py's gradient checks still run")
    q, v, k, mask = _data(5)
    y = np.random.default_rng(6).normal(size=(N, TQ, DQ)).astype(np.float32)
    m = _model("cpu", True, True)
    w = g.ggml_get_weights(m)
    iq, iv, ik, im = keras.Input((TQ, DQ)), keras.Input((TV, DV)), keras.Input((TV, DK)), keras.Input((TQ, TV))
    km = keras.Model([iq, iv, ik, im], keras.layers.MultiHeadAttention(2, 3)(iq, iv, ik, attention_mask=im))
    km.set_weights(list(w.values()))
    km.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    kx = [q, v, k, mask.astype(bool)]
    np.testing.assert_allclose(g.ggml_predict(m, [q, v, k, mask]), km.predict(kx, verbose=0), rtol=1e-5, atol=1e-6)
    kh = km.fit(kx, y, batch_size=3, epochs=3, shuffle=False, verbose=0).history
    h = g.ggml_fit(m, [q, v, k, mask], y, batch_size=3, epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(h["train_loss"], kh["loss"], rtol=1e-5)
    for got, want in zip(g.ggml_get_weights(m).values(), km.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    g.ggml_save_model(m, tmp_path / "m.gguf")
    loaded = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu")
    np.testing.assert_allclose(g.ggml_predict(loaded, [q, v, k, mask]), g.ggml_predict(m, [q, v, k, mask]), rtol=1e-6)


@pytest.mark.parametrize("make, with_mask, match", [
    (lambda q, v, m: [q, g.ggml_input(shape=(TV + 1, DV)), g.ggml_input(shape=(TV, DK))], False,
     "key and value need the same steps"),
    (lambda q, v, m: [q, v, g.ggml_input(shape=(TV, TQ))], True, r"the attention mask must have shape \(query steps"),
    (lambda q, v, m: [q, v, v, v, m], True, "takes a node .* got 5 nodes"),
])
def test_misuse_is_refused_with_the_fix(make, with_mask, match):
    q, v, m = g.ggml_input(shape=(TQ, DQ)), g.ggml_input(shape=(TV, DV)), g.ggml_input(shape=(TQ, TV))
    with pytest.raises(g.GgmlValueError, match=match):
        g.ggml_layer_multi_head_attention(make(q, v, m), num_heads=2, key_dim=3, attention_mask=with_mask)
    with pytest.raises(g.GgmlValueError, match="causal=True needs as many query as value steps"):
        g.ggml_layer_multi_head_attention([q, v], num_heads=2, key_dim=3, causal=True)


def test_attention_dropout_drops_weights_in_training_only(backend):
    """Keras' MultiHeadAttention(dropout=): a DROPOUT of the attention weights in the training graph (on the model's
    device), none in inference, where the model predicts as the same weights without dropout."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 6, 4)).astype(np.float32)
    y = rng.normal(size=(8, 6, 4)).astype(np.float32)

    def model(rate):
        np.random.seed(1)
        inp = g.ggml_input((6, 4))
        out = g.ggml_layer_multi_head_attention(inp, 2, 2, dropout=rate, name="mha")
        return g.ggml_compile(g.ggml_model(inp, out), optimizer="sgd", loss="mse", metrics=[], backend=backend,
                              learning_rate=0.1)
    with_dropout, without = model(0.5), model(0.0)
    assert g.ggml_model_placement(with_dropout, batch_size=8).op_counts().get("DROPOUT") == 2   # and its backward
    assert "DROPOUT" not in g.ggml_model_placement(without, batch_size=8).op_counts()
    assert "DROPOUT" not in g.ggml_model_placement(with_dropout, batch_size=8, training=False).op_counts()
    np.testing.assert_allclose(g.ggml_predict(with_dropout, x), g.ggml_predict(without, x), rtol=1e-6, atol=1e-7)
    h_drop = g.ggml_fit(with_dropout, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    h_none = g.ggml_fit(without, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    assert np.all(np.isfinite(h_drop["train_loss"]))
    assert not np.allclose(h_drop["train_loss"], h_none["train_loss"], rtol=1e-4)   # the weights were dropped
    with pytest.raises(ValueError, match=r"dropout must be a rate in \[0, 1\)"):
        g.ggml_layer_multi_head_attention(g.ggml_input((6, 4)), 2, 2, dropout=1.0)
