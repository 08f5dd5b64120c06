"""Building models: sequential and functional, shared layers, names, summary, get/pop, freezing, errors."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers import layer_refs as R


def mlp(units=(8, 3), input_shape=(4,)):
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, units[0], activation="relu", input_shape=input_shape)
    return g.ggml_layer_dense(m, units[1], activation="softmax")


def test_sequential_names_shapes_and_summary():
    m = mlp()
    assert [layer.name for layer in m.layers] == ["dense_1", "dense_2"]
    assert m.outputs[0].shape == (3,)
    text = str(m)
    assert "dense_1 (dense)" in text and "(None, 8)" in text and "(None, 3)" in text
    assert "Total params: 67" in text  # 4*8+8 + 8*3+3
    assert "Compiled: no" in text


def test_functions_change_the_model_in_place_and_return_it():
    m = g.ggml_model_sequential()
    same = g.ggml_layer_dense(m, 2, input_shape=(3,))
    assert same is m
    assert g.ggml_compile(m, backend="cpu") is m
    assert g.ggml_freeze_weights(m) is m and g.ggml_unfreeze_weights(m) is m


def test_functional_with_add_concatenate_and_several_inputs_outputs():
    a = g.ggml_input(shape=(5,))
    b = g.ggml_input(shape=(3,))
    h = g.ggml_layer_dense(a, 4, activation="relu")
    s = g.ggml_layer_add([h, g.ggml_layer_dense(a, 4)])
    c = g.ggml_layer_concatenate([s, b])
    assert c.shape == (7,)
    out1 = g.ggml_layer_dense(c, 2, activation="softmax")
    out2 = g.ggml_layer_dense(c, 1)
    m = g.ggml_model(inputs=[a, b], outputs=[out1, out2])
    assert len(m.layers) == 6
    g.ggml_compile(m, loss=["categorical_crossentropy", "mse"], loss_weights=[1.0, 0.5], backend="cpu")
    p = g.ggml_predict(m, [np.ones((7, 5)), np.ones((7, 3))])
    assert isinstance(p, list) and p[0].shape == (7, 2) and p[1].shape == (7, 1)


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


def test_get_and_pop_layer():
    m = mlp()
    assert g.ggml_get_layer(m, 0).name == "dense_1"
    assert g.ggml_get_layer(m, -1).name == "dense_2"
    assert g.ggml_get_layer(m, name="dense_2").units == 3
    with pytest.raises(ValueError, match="no layer named"):
        g.ggml_get_layer(m, name="nope")
    with pytest.raises(ValueError):
        g.ggml_get_layer(m, 5)
    g.ggml_pop_layer(m)
    assert [layer.name for layer in m.layers] == ["dense_1"] and m.outputs[0].shape == (8,)


def test_freezing_keeps_weights_and_trains_the_rest():
    np.random.seed(0)
    m = mlp()
    g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu", learning_rate=0.05)
    g.ggml_freeze_weights(m, 0, 1)
    before = g.ggml_get_weights(m)
    x = np.random.rand(32, 4).astype(np.float32)
    y = np.eye(3)[np.random.randint(0, 3, 32)]
    g.ggml_fit(m, x, y, epochs=2, batch_size=16, verbose=0)
    after = g.ggml_get_weights(m)
    np.testing.assert_array_equal(before["dense_1.weight"], after["dense_1.weight"])
    assert not np.allclose(before["dense_2.weight"], after["dense_2.weight"])
    g.ggml_unfreeze_weights(m)
    g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)
    assert not np.allclose(after["dense_1.weight"], g.ggml_get_weights(m)["dense_1.weight"])
    assert "Trainable params: 67" in str(m)
    g.ggml_freeze_weights(m)
    with pytest.raises(ValueError, match="nothing to train"):
        g.ggml_fit(m, x, y, verbose=0)


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


@pytest.mark.parametrize("call, kind, text", [
    (lambda: g.ggml_layer_dense(g.ggml_model_sequential(), 3, activation="mish", input_shape=(2,)),
     ValueError, "unknown activation"),
    (lambda: g.ggml_layer_dense(g.ggml_model_sequential(), 0, input_shape=(2,)), ValueError, "units"),
    (lambda: g.ggml_apply(g.ggml_input(shape=(2,)), "dense"), TypeError, "layer object"),
    (lambda: g.ggml_layer_conv_2d(g.ggml_model_sequential(), 2, (3, 3), padding="full", input_shape=(5, 5, 1)),
     ValueError, "padding"),
    (lambda: g.ggml_compile(mlp(), loss="poisson"), ValueError, "sparse_categorical_crossentropy"),
    (lambda: g.ggml_compile(mlp(), optimizer="nadam"), ValueError, "'adam', 'adamw', 'sgd', 'rmsprop', 'adagrad'"),
    (lambda: g.ggml_layer_dense(g.ggml_input(shape=(3,), dtype="int32"), 2), TypeError, "embedding"),
    (lambda: g.ggml_model(g.ggml_input(shape=(2,)), g.ggml_layer_dense(g.ggml_input(shape=(2,)), 1)),
     ValueError, "not among the model's inputs"),
])
def test_building_errors(call, kind, text):
    with pytest.raises(kind, match=text):
        call()


def test_first_layer_without_input_shape_names_it():
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 4)
    with pytest.raises(ValueError, match="dense_1.*needs input_shape"):
        g.ggml_compile(m)
    assert "incomplete" in str(m)


def test_uncompiled_model_says_compile():
    m = mlp()
    x = np.zeros((2, 4))
    for call in (lambda: g.ggml_fit(m, x, np.zeros((2, 3))), lambda: g.ggml_predict(m, x),
                 lambda: g.ggml_evaluate(m, x, np.zeros((2, 3))), lambda: g.ggml_save_model(m, "x.gguf"),
                 lambda: g.ggml_trainer(m)):
        with pytest.raises(RuntimeError, match="compile"):
            call()


def test_conv_layer_objects_and_the_conv_op_share_a_name(ctx):
    layer = g.ggml_conv_2d(4, (3, 3), activation="relu")
    assert layer.kind == "conv_2d" and layer.filters == 4
    k = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 3, 3, 1, 2)
    x = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 8, 8, 1, 1)
    assert g.ggml_conv_2d(ctx, k, x).shape == (6, 6, 2, 1)  # the ggml op, as before


def test_an_unconnected_input_is_refused():
    a, b = g.ggml_input(shape=(3,)), g.ggml_input(shape=(2,), name="unused_input")
    with pytest.raises(ValueError, match="'unused_input' is not connected"):
        g.ggml_model([a, b], g.ggml_layer_dense(a, 1))


def test_a_model_in_use_cannot_be_recompiled_from_another_thread():
    """ggml_fit running in one thread; ggml_compile / adding a layer in another is refused (it would free
    the weights under ggml), and the model stays usable."""
    import threading
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,))
    g.ggml_compile(m, loss="mse", backend="cpu")
    started, release = threading.Event(), threading.Event()

    def slow_source():
        for _ in range(4):
            started.set()
            release.wait(10)
            yield np.ones((8, 3)), np.ones((8, 2))

    worker = threading.Thread(target=lambda: g.ggml_fit_generator(m, slow_source, verbose=0))
    worker.start()
    assert started.wait(10)
    try:
        with pytest.raises(RuntimeError, match="in use"):
            g.ggml_compile(m, loss="mae", backend="cpu")
        with pytest.raises(RuntimeError, match="in use"):
            g.ggml_layer_dense(m, 1)
    finally:
        release.set()
        worker.join(10)
    assert [layer.name for layer in m.layers] == ["dense_1"]
    assert g.ggml_predict(m, np.ones((2, 3))).shape == (2, 2)
    g.ggml_compile(m, loss="mae", backend="cpu")   # free again once the fit returned


# ---------------------------------------------------------------- red-team findings (each gave a wrong model)

@pytest.mark.parametrize("layer, shape, ref", [
    (lambda x: g.ggml_layer_conv_2d(x, 3, (2, 2), activation="softmax", padding="same", name="c"), (3, 4, 2),
     lambda x, w: R.softmax(R.conv2d(x, w["c.kernel"], w["c.bias"], padding="same"))),
    (lambda x: g.ggml_layer_conv_1d(x, 3, 2, activation="softmax", name="c"), (5, 2),
     lambda x, w: R.softmax(R.conv1d(x, w["c.kernel"], w["c.bias"]))),
])
def test_softmax_on_a_convolution_is_over_its_channels(layer, shape, ref):
    """ggml's image layout keeps width (steps) fastest: a softmax applied there normalised the wrong axis."""
    np.random.seed(0)
    x = g.ggml_input(shape)
    m = g.ggml_compile(g.ggml_model(x, layer(x)), loss="categorical_crossentropy", backend="cpu")
    data = np.random.default_rng(0).normal(size=(2,) + shape).astype(np.float32)
    w = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}
    p = g.ggml_predict(m, data)
    np.testing.assert_allclose(p, ref(data.astype(np.float64), w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-5)


def test_an_input_listed_twice_is_refused():
    x = g.ggml_input((4,))
    with pytest.raises(ValueError, match="listed twice"):
        g.ggml_model([x, x], g.ggml_layer_dense(x, 3))


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


def test_a_frozen_batch_norm_runs_in_inference_mode():
    """As in Keras: its running statistics stay, and the layers after it see running-statistics outputs."""
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 3, input_shape=(4,), name="d")
    m = g.ggml_layer_batch_norm(m, name="bn")
    m = g.ggml_layer_dense(m, 2, name="out")
    m = g.ggml_compile(m, loss="mse", optimizer="sgd", backend="cpu", learning_rate=0.1)
    rng = np.random.default_rng(0)
    x, y = rng.normal(3, 2, size=(8, 4)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)
    g.ggml_freeze_weights(m, 0, 2)
    before = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}
    tr = g.ggml_trainer(m, batch_size=8)
    tr.step(x, y)
    tr.free()
    after = g.ggml_get_weights(m)
    for k in ("bn.running_mean", "bn.running_var", "bn.gamma", "d.weight"):
        np.testing.assert_array_equal(after[k], before[k].astype(np.float32))
    # the one SGD step on 'out' used the inference-mode features: w' = w - lr * dL/dw with them
    h = R.batch_norm(R.dense(x.astype(np.float64), before["d.weight"], before["d.bias"]), before["bn.gamma"],
                     before["bn.beta"], before["bn.running_mean"], before["bn.running_var"])
    pred = R.dense(h, before["out.weight"], before["out.bias"])
    grad = h.T @ (2 * (pred - y) / pred.size)
    np.testing.assert_allclose(after["out.weight"], before["out.weight"] - 0.1 * grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("build, text", [
    (lambda: g.ggml_layer_layer_norm(g.ggml_input((4,)), eps=1e-300), "float32 holds"),
    (lambda: g.ggml_layer_batch_norm(g.ggml_input((4,)), eps=1e300), "float32 holds"),
    (lambda: g.ggml_layer_dense(g.ggml_input((4,)), 2, use_bias="no"), "use_bias must be True or False"),
    (lambda: g.ggml_layer_dense(g.ggml_input((4,)), 2, input_shape=(5,)), "applied to a node of shape"),
    (lambda: g.ggml_input((2 ** 30, 2 ** 30, 4)), "values per sample"),
    (lambda: g.ggml_input((2 ** 32, 1)), "at most 2\\*\\*31 - 1"),
    (lambda: g.ggml_layer_conv_2d(g.ggml_model_sequential(), 2, 3, strides=2 ** 62, input_shape=(8, 8, 1)),
     "strides must be a positive int \\(at most"),
    (lambda: g.ggml_layer_dense(g.ggml_input((4,)), 2, name="é" * 40), "bytes in UTF-8"),
    (lambda: g.ggml_compile(g.ggml_model(*(lambda t: (t, t))(g.ggml_input((3,), dtype="int32"))), loss="mse",
                            backend="cpu"), "token-id input itself"),
])
def test_values_that_would_make_a_broken_model_are_refused(build, text):
    with pytest.raises((ValueError, TypeError), match=text):
        build()


def test_a_one_step_recurrent_layer_fits_again():
    """Over one step the recurrent kernel is unused (no gradient, no AdamW moments): keeping the optimizer
    state after the fit failed, and every later fit with it."""
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_lstm(m, 2, input_shape=(1, 3))
    m = g.ggml_compile(g.ggml_layer_dense(m, 1), loss="mse", backend="cpu")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 1, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    for _ in range(2):
        h = g.ggml_fit(m, x, y, epochs=2, verbose=0)
        assert np.isfinite(h["train_loss"]).all()
    assert "lstm_1.recurrent_kernel" not in m.runtime.opt_state.state["m"]


# ---------------------------------------------------------------- messages that say what to do

def test_input_shape_with_an_open_size_says_why_and_what_to_give():
    with pytest.raises(g.GgmlValueError, match=r"leaves a size open \(None\).*fixed sizes.*\(64, 4\)"):
        g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(None, 4))


@pytest.mark.parametrize("name, text", [("cpu ", "spaces around the name; did you mean 'cpu'"),
                                        ("gpu", "no backend or device is named 'gpu'; choose one of")])
def test_a_mistyped_backend_name_is_named_with_the_choices(name, text):
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,))
    with pytest.raises(g.BackendUnavailableError, match=text):
        g.ggml_compile(m, loss="mse", backend=name)


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


@pytest.mark.parametrize("attr, value", [("activation", None), ("units", 5), ("use_bias", False),
                                         ("input_shape", (9,))])
def test_a_layers_arguments_are_fixed_once_it_is_made(attr, value):
    """Changed after construction they were applied to some cached graphs and not others: predictions then
    depended on the batch size."""
    m = g.ggml_compile(mlp(), backend="cpu")
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    before = g.ggml_predict(m, x, batch_size=5)
    layer = m.layers[0]
    old = getattr(layer, attr)
    with pytest.raises(g.GgmlStateError, match=f"{attr} cannot change after the layer is made.*make a new layer"):
        setattr(layer, attr, value)
    assert getattr(layer, attr) == old
    with pytest.raises(g.GgmlStateError):
        delattr(layer, attr)
    np.testing.assert_array_equal(g.ggml_predict(m, x, batch_size=2), before)


def test_trainable_takes_booleans_only_and_names_are_given_once():
    layer = mlp().layers[0]
    with pytest.raises(g.GgmlTypeError, match="trainable must be True or False, got 'no'"):
        layer.trainable = "no"
    layer.trainable = np.bool_(False)
    assert layer.trainable is False
    with pytest.raises(g.GgmlStateError, match="named already"):
        layer.name = "other"
    with pytest.raises(g.GgmlStateError, match="make a new layer"):
        layer.made_up = 1


def test_nodes_cannot_be_edited_into_a_cycle():
    x = g.ggml_input((4,))
    h = g.ggml_layer_dense(x, 3)
    out = g.ggml_layer_dense(h, 2)
    with pytest.raises(g.GgmlStateError, match="a node cannot be changed"):
        h.inputs = (out,)
    with pytest.raises(AttributeError):
        h.inputs.append(out)    # a tuple
    assert g.ggml_model(x, out).layers[0].name == h.layer.name


def test_reusing_a_sequential_models_layers_beside_new_ones_needs_no_names():
    """Keras' transfer-learning pattern: a trained sequential's layers (named per model, 'dense_1') and new
    layers made outside it (named from a session-wide count) used to collide."""
    base = g.ggml_compile(mlp(), backend="cpu")
    x = g.ggml_input((4,))
    out = g.ggml_layer_dense(g.ggml_apply(x, base.layers[0]), 2)
    model = g.ggml_model(x, out)
    names = [layer.name for layer in model.layers]
    assert names[0] == base.layers[0].name and len(set(names)) == 2
    g.ggml_compile(model, loss="mse", backend="cpu")
    np.testing.assert_array_equal(g.ggml_get_weights(model)[f"{names[0]}.weight"],
                                  g.ggml_get_weights(base)[f"{names[0]}.weight"])


def test_two_sequential_models_layers_together_are_told_to_take_names():
    a, b = mlp(), mlp()
    x = g.ggml_input((4,))
    with pytest.raises(g.GgmlValueError, match="named 'dense_1'.*name the layers when making them"):
        g.ggml_model(x, g.ggml_layer_concatenate([g.ggml_apply(x, a.layers[0]), g.ggml_apply(x, b.layers[0])]))


def test_recompiling_leaves_no_host_copy_with_layers_a_live_model_holds():
    """Host copies go with layers no live store holds (a popped layer), not with every layer at each compile."""
    m = _trained_mlp()
    g.ggml_compile(m, backend="cpu")
    assert all("_kept_values" not in layer.__dict__ for layer in m.layers)
    head = g.ggml_get_layer(m, -1)
    g.ggml_pop_layer(m)
    g.ggml_compile(m, loss="mse", backend="cpu")
    assert "_kept_values" in head.__dict__ and "_kept_values" not in m.layers[0].__dict__


def test_layers_of_a_loaded_or_unpickled_model_beside_new_ones_need_no_names(tmp_path):
    """A loaded model keeps its names ('dense_1'): new layers made outside it skip the names live layers have."""
    import pickle
    base = g.ggml_compile(mlp(), backend="cpu")
    g.ggml_save_model(base, str(tmp_path / "m.gguf"))
    del base
    for source in (g.ggml_load_model(str(tmp_path / "m.gguf"), backend="cpu"),
                   pickle.loads(pickle.dumps(g.ggml_compile(mlp(), backend="cpu")))):
        x = g.ggml_input((4,))
        model = g.ggml_model(x, g.ggml_layer_dense(g.ggml_apply(x, source.layers[0]), 2))
        names = [layer.name for layer in model.layers]
        assert names[0] == "dense_1" and len(set(names)) == 2


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


def test_swish_is_keras_name_for_silu():
    def model(activation):
        np.random.seed(0)
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, 4, activation=activation, input_shape=(3,), name="d")
        return g.ggml_compile(m, loss="mse", backend="cpu")
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_array_equal(g.ggml_predict(model("swish"), x), g.ggml_predict(model("silu"), x))
    m = model("swish")
    w = g.ggml_get_weights(m)
    kernel, bias = w["d.weight"], w["d.bias"]  # (inputs, units), as Keras' kernel
    z = x.astype(np.float64) @ kernel + bias
    np.testing.assert_allclose(g.ggml_predict(m, x), z / (1 + np.exp(-z)), rtol=1e-5, atol=1e-6)



def test_every_layer_docstring_lists_each_argument_once():
    """issue 26: layers without an __init__ of their own listed name, trainable and input_shape twice."""
    import re
    for fn_name in [n for n in dir(g) if n.startswith("ggml_layer_")]:
        doc = getattr(g, fn_name).__doc__ or ""
        params = __import__("inspect").signature(getattr(g, fn_name)).parameters
        if "Arguments:" not in doc or "model_or_node" not in params:
            continue  # not a layer (ggml_layer_adapt sets a layer's statistics)
        listed = re.findall(r"^    (\w+): ", doc.split("Arguments:")[1].split("Value:")[0], re.M)
        assert len(listed) == len(set(listed)), (fn_name, listed)
        assert {"name", "trainable", "input_shape"} <= set(listed), fn_name


def test_a_sequential_model_refuses_an_impossible_layer_when_it_is_added():
    """Not at compile: token ids after the first layer, normalization statistics of another size."""
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 4, input_shape=(4,))
    with pytest.raises(TypeError, match=r"reads int32 token ids"):
        g.ggml_layer_embedding(m, 10, 3)
    with pytest.raises(ValueError, match=r"mean and variance have 3 values but its input has 4 features"):
        g.ggml_layer_normalization(m, mean=[0, 0, 0], variance=[1, 1, 1])
    assert [layer.kind for layer in m.layers] == ["dense"]   # neither was added
    g.ggml_layer_normalization(m, mean=[0, 0, 0, 0], variance=[1, 1, 1, 1])
    assert [layer.kind for layer in m.layers] == ["dense", "normalization"]


def _image_model():
    m = g.ggml_model_sequential()
    return g.ggml_layer_conv_2d(m, 4, (3, 3), activation="relu", input_shape=(5, 5, 2))   # out (3, 3, 4)


def _flat_model():
    return g.ggml_layer_flatten(_image_model())   # out (36,)


def _dense_model():
    return g.ggml_layer_dense(g.ggml_model_sequential(), 8, activation="tanh", input_shape=(5, 5, 2))  # (5, 5, 8)


def _vector_model():
    return g.ggml_layer_dense(g.ggml_model_sequential(), 8, activation="tanh", input_shape=(6,))   # out (8,)


@pytest.mark.parametrize("base, bad, text", [
    (_image_model, lambda m: g.ggml_layer_conv_2d(m, 4, (5, 5)),
     r"a kernel of 5 does not fit an input of 3 \(padding='valid'\)"),
    (g.ggml_model_sequential, lambda m: g.ggml_layer_conv_2d(m, 4, (7, 7), input_shape=(5, 5, 2)),
     r"a kernel of 7 does not fit an input of 5"),
    (_flat_model, lambda m: g.ggml_layer_conv_2d(m, 4, (3, 3)),
     r"conv_2d 'conv_2d_2' takes image samples \(height, width, channels\), got shape \(36,\)"),
    (_vector_model, lambda m: g.ggml_layer_conv_2d(m, 4, (3, 3)),
     r"conv_2d 'conv_2d_1' takes image samples \(height, width, channels\), got shape \(8,\)"),
    (_flat_model, lambda m: g.ggml_layer_max_pooling_2d(m, (2, 2)),
     r"max_pooling_2d 'max_pooling_2d_1' takes image samples \(height, width, channels\), got shape \(36,\)"),
    (_vector_model, lambda m: g.ggml_layer_max_pooling_2d(m, (2, 2)),
     r"takes image samples \(height, width, channels\), got shape \(8,\)"),
    (_image_model, lambda m: g.ggml_layer_max_pooling_2d(m, (4, 4)), r"a window of 4 does not fit an input of 3"),
    (_dense_model, lambda m: g.ggml_layer_conv_2d(m, 4, (3, 3), padding="valid", dilation_rate=3),
     r"does not fit an input of 5"),
])
def test_a_shape_mismatch_is_refused_when_the_layer_is_added_and_leaves_the_model_usable(base, bad, text):
    """Keras refuses such a layer when it is added (its build fails), saying what it expected and what it got;
    the model is left as it was: the same layers and output shape, and a valid layer then added compiles."""
    m = base()
    before = [(layer.name, layer.kind) for layer in m.layers]
    shape = m.outputs[0].shape if m.layers else None
    with pytest.raises(ValueError, match=text):
        bad(m)
    assert [(layer.name, layer.kind) for layer in m.layers] == before
    if m.layers:
        assert m.outputs[0].shape == shape
    else:   # the refused first layer: the model is still empty
        m = g.ggml_layer_conv_2d(m, 4, (3, 3), input_shape=(5, 5, 2))
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 3, activation="softmax") if len(m.outputs[0].shape) > 1 \
        else g.ggml_layer_dense(m, 3, activation="softmax")
    g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu")
    x = np.random.default_rng(0).normal(size=(2,) + tuple(m.layers[0].input_shape)).astype(np.float32)
    p = g.ggml_predict(m, x)
    assert p.shape == (2, 3) and np.allclose(p.sum(axis=1), 1, atol=1e-5)
