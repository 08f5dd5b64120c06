"""A model's weights (models/network/parameters.py): drawn from numpy's global seed, kept across compiles, snapshots,
popped and moved layers and models that share layers (one set of weights per layer, the last trained counts),
never inherited by a new layer; host copies only for layers no live model holds."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers import layer_refs as R
from tests.helpers.models import mlp


def test_a_shared_layer_object_shares_its_weights():
    enc = g.ggml_dense(3, activation="relu")
    x1, x2 = g.ggml_input(shape=(4,)), g.ggml_input(shape=(4,))
    a, b = g.ggml_apply(x1, enc), g.ggml_apply(x2, enc)
    m = g.ggml_model([x1, x2], g.ggml_layer_add([a, b]))
    g.ggml_compile(m, loss="mse", backend="cpu")
    assert sum(1 for k in g.ggml_get_weights(m) if k.startswith(enc.name)) == 2  # one weight + one bias
    x = np.random.default_rng(0).normal(size=(5, 4))
    same = g.ggml_predict(m, [x, x])
    w = g.ggml_get_weights(m)
    ref = 2 * np.maximum(x @ w[f"{enc.name}.weight"] + w[f"{enc.name}.bias"], 0)
    np.testing.assert_allclose(same, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="built for input shape"):
        g.ggml_apply(g.ggml_input(shape=(6,)), enc)


def test_compile_draws_weights_from_numpy_global_seed():
    np.random.seed(7)
    a = g.ggml_get_weights(g.ggml_compile(mlp(), backend="cpu"))
    np.random.seed(7)
    b = g.ggml_get_weights(g.ggml_compile(mlp(), backend="cpu"))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    limit = np.sqrt(6 / (4 + 8))  # Glorot uniform
    assert np.abs(a["dense_1.weight"]).max() <= limit and np.abs(a["dense_1.weight"]).max() > 0.5 * limit
    assert not a["dense_1.bias"].any()


def test_recompiling_keeps_the_weights():
    m = g.ggml_compile(mlp(), backend="cpu")
    w = g.ggml_get_weights(m)
    g.ggml_compile(m, optimizer="sgd", backend="cpu")
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_array_equal(v, w[k])


def test_recompiling_and_snapshots_keep_a_one_unit_layers_weights():
    """A one-unit dense layer's kernel (n, 1) comes back from ggml as (n,); compiling again took that for a
    reshaped layer and drew the kernel afresh, and so did a trainer's snapshot (found by review)."""
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 4, activation="relu", input_shape=(3,))
    m = g.ggml_layer_dense(m, 1)
    m = g.ggml_compile(m, loss="mse", backend="cpu")
    w = g.ggml_get_weights(m)
    g.ggml_compile(m, optimizer="sgd", loss="mse", backend="cpu")
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_array_equal(v, w[k])
    with g.ggml_trainer(m, batch_size=2) as t:
        snap = t.snapshot()
        x = np.ones((2, 3), np.float32)
        np.testing.assert_array_equal(g.ggml_predict(snap, x), g.ggml_predict(m, x))
        g.ggml_snapshot_free(snap)


def test_a_new_layer_never_inherits_a_removed_layers_weights():
    """Kept weights were matched by name: after ggml_pop_layer, a new head named 'dense_2' again got the trained
    head's weights (transfer learning's 'replace the head' silently kept it)."""
    np.random.seed(0)
    m = g.ggml_compile(mlp(), backend="cpu")
    body = g.ggml_get_weights(m)
    g.ggml_pop_layer(m)
    g.ggml_layer_dense(m, 3, activation="softmax")
    g.ggml_compile(m, backend="cpu")
    after = g.ggml_get_weights(m)
    np.testing.assert_array_equal(after["dense_1.weight"], body["dense_1.weight"])   # kept: the same layer
    assert not np.array_equal(after["dense_2.weight"], body["dense_2.weight"])         # fresh: a new layer


def test_a_sub_model_of_trained_layers_starts_from_their_weights():
    """The Keras encoder pattern: a model built from layers another compiled model trained."""
    np.random.seed(0)
    x = g.ggml_input((4,))
    enc = g.ggml_layer_dense(x, 2, name="enc")
    auto = g.ggml_compile(g.ggml_model(x, g.ggml_layer_dense(enc, 4, name="dec")), loss="mse", backend="cpu")
    data = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    g.ggml_fit(auto, data, data, epochs=3, verbose=0)
    encoder = g.ggml_compile(g.ggml_model(x, enc), loss="mse", backend="cpu")
    trained = g.ggml_get_weights(auto)
    np.testing.assert_array_equal(g.ggml_get_weights(encoder)["enc.weight"], trained["enc.weight"])
    w = {k: v.astype(np.float64) for k, v in trained.items()}
    np.testing.assert_allclose(g.ggml_predict(encoder, data), R.dense(data, w["enc.weight"], w["enc.bias"]),
                               rtol=1e-5, atol=1e-6)


def _trained_mlp():
    np.random.seed(0)
    m = g.ggml_compile(mlp(), backend="cpu", learning_rate=0.05)
    x = np.random.rand(32, 4).astype(np.float32)
    g.ggml_fit(m, x, np.eye(3)[np.random.randint(0, 3, 32)], epochs=2, batch_size=16, verbose=0)
    return m


def test_a_popped_layer_added_back_after_a_compile_keeps_its_weights():
    """Keras keeps weights in the layer: pop the head, compile the body, add the head back."""
    m = _trained_mlp()
    trained = g.ggml_get_weights(m)
    head = g.ggml_get_layer(m, -1)
    g.ggml_pop_layer(m)
    g.ggml_compile(m, loss="mse", backend="cpu")
    m.add(head)
    g.ggml_compile(m, backend="cpu")
    after = g.ggml_get_weights(m)
    assert sorted(after) == sorted(trained)
    for k in trained:
        np.testing.assert_array_equal(after[k], trained[k])


def test_a_popped_layer_moved_to_another_model_keeps_its_weights():
    m = _trained_mlp()
    trained = g.ggml_get_weights(m)
    head = g.ggml_get_layer(m, -1)
    g.ggml_pop_layer(m)
    g.ggml_compile(m, loss="mse", backend="cpu")   # the store that held the head is freed here
    other = g.ggml_model_sequential()
    g.ggml_layer_dense(other, 8, input_shape=(4,), name="fresh")
    other.add(head)
    g.ggml_compile(other, backend="cpu")
    w = g.ggml_get_weights(other)
    np.testing.assert_array_equal(w["dense_2.weight"], trained["dense_2.weight"])
    np.testing.assert_array_equal(w["dense_2.bias"], trained["dense_2.bias"])
    assert not np.array_equal(w["fresh.weight"], trained["dense_1.weight"])


def test_recompiling_leaves_no_host_copy_with_layers_a_live_model_holds():
    """Host copies go with layers no live store holds (a popped layer), not with every layer at each compile."""
    m = _trained_mlp()
    g.ggml_compile(m, backend="cpu")
    assert all("_kept_values" not in layer.__dict__ for layer in m.layers)
    head = g.ggml_get_layer(m, -1)
    g.ggml_pop_layer(m)
    g.ggml_compile(m, loss="mse", backend="cpu")
    assert "_kept_values" in head.__dict__ and "_kept_values" not in m.layers[0].__dict__


def _two_layers():
    return g.ggml_dense(8, activation="relu", name="shared_a"), g.ggml_dense(2, name="shared_b")


def _on(layers):
    x = g.ggml_input((4,))
    return g.ggml_model(x, g.ggml_apply(g.ggml_apply(x, layers[0]), layers[1]))


def test_a_layer_shared_by_models_is_one_set_of_weights_the_last_trained_counts():
    """As in Keras: a model compiled, another sharing its layers trained, dropped: a third starts from the
    trained values, and the first one compiled again too (it used to take the untrained ones)."""
    import gc
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = rng.normal(size=(64, 2)).astype(np.float32)
    layers = _two_layers()
    first = g.ggml_compile(_on(layers), loss="mse", backend="cpu")
    trained = g.ggml_compile(_on(layers), loss="mse", backend="cpu")
    g.ggml_fit(trained, x, y, epochs=3, batch_size=16, verbose=0)
    values = g.ggml_get_weights(trained)
    del trained
    gc.collect()                                   # dropped, not compiled again: its layers keep the values
    third = g.ggml_compile(_on(layers), loss="mse", backend="cpu")
    g.ggml_compile(first, loss="mse", backend="cpu")
    for model in (third, first):
        for k, v in values.items():
            np.testing.assert_array_equal(g.ggml_get_weights(model)[k], v)


def test_an_uncompiled_sub_model_of_trained_layers_pickles_trained():
    import pickle
    rng = np.random.default_rng(0)
    x = g.ggml_input((4,))
    h = g.ggml_layer_dense(x, 8, name="features")
    full = g.ggml_compile(g.ggml_model(x, g.ggml_layer_dense(h, 2, name="head")), loss="mse", backend="cpu")
    g.ggml_fit(full, rng.normal(size=(32, 4)).astype(np.float32), rng.normal(size=(32, 2)).astype(np.float32),
               epochs=2, batch_size=8, verbose=0)
    copy = pickle.loads(pickle.dumps(g.ggml_model(x, h)))
    g.ggml_compile(copy, loss="mse", backend="cpu")
    np.testing.assert_array_equal(g.ggml_get_weights(copy)["features.weight"],
                                  g.ggml_get_weights(full)["features.weight"])
